//! Per-format parse cost, one-shot and streamed (4-character deltas), on ~1k- and ~16k-character
//! outputs holding several calls. Streaming cost must grow linearly: compare the two sizes.
use aphro_parsers::{Aggregator, ParserConfig, ParserRegistry};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use std::hint::black_box;

/// (bench name, tool parser, reasoning parser, prefix, repeated item, separator, suffix)
type Template = (
    &'static str,
    Option<&'static str>,
    Option<&'static str>,
    &'static str,
    &'static str,
    &'static str,
    &'static str,
);

const TEMPLATES: &[Template] = &[
    ("hermes", Some("hermes"), None, "Let me look that up for you. ", "<tool_call>\n{\"name\": \"search\", \"arguments\": {\"query\": \"rust async traits\", \"limit\": 5}}\n</tool_call>", "\n", ""),
    ("llama3_json", Some("llama3_json"), None, "", "{\"name\": \"search\", \"parameters\": {\"query\": \"rust async traits\", \"limit\": 5}}", "; ", ""),
    ("pythonic", Some("pythonic"), None, "[", "search(query=\"rust async traits\", limit=5, exact=True)", ", ", "]"),
    ("olmo3", Some("olmo3"), None, "<function_calls>", "search(query=\"rust async traits\", limit=5)", "\n", "</function_calls>"),
    ("mistral", Some("mistral"), Some("mistral"), "[THINK]Plan the searches.[/THINK]Sure. ", "[TOOL_CALLS]search{\"query\": \"rust async traits\", \"limit\": 5}", "", ""),
    ("deepseek_v3", Some("deepseek_v3"), None, "Sure. <｜tool▁calls▁begin｜>", "<｜tool▁call▁begin｜>function<｜tool▁sep｜>search\n```json\n{\"query\": \"rust async traits\", \"limit\": 5}\n```<｜tool▁call▁end｜>", "\n", "<｜tool▁calls▁end｜>"),
    ("deepseek_v31", Some("deepseek_v31"), None, "Sure. <｜tool▁calls▁begin｜>", "<｜tool▁call▁begin｜>search<｜tool▁sep｜>{\"query\": \"rust async traits\", \"limit\": 5}<｜tool▁call▁end｜>", "", "<｜tool▁calls▁end｜>"),
    ("glm45", Some("glm45"), Some("glm45"), "<think>Plan the searches.</think>", "<tool_call>search\n<arg_key>query</arg_key>\n<arg_value>rust async traits</arg_value>\n<arg_key>limit</arg_key>\n<arg_value>5</arg_value>\n</tool_call>", "\n", ""),
    ("kimi_k2", Some("kimi_k2"), Some("kimi_k2"), "<think>Plan.</think>Sure. <|tool_calls_section_begin|>", "<|tool_call_begin|>functions.search:0<|tool_call_argument_begin|>{\"query\": \"rust async traits\", \"limit\": 5}<|tool_call_end|>", "", "<|tool_calls_section_end|>"),
    ("minimax_m2", Some("minimax_m2"), Some("minimax_m2"), "<think>Plan.</think><minimax:tool_call>\n", "<invoke name=\"search\">\n<parameter name=\"query\">rust async traits</parameter>\n<parameter name=\"limit\">5</parameter>\n</invoke>", "\n", "\n</minimax:tool_call>"),
    ("qwen3_coder", Some("qwen3_coder"), Some("qwen3"), "<think>\nPlan the searches.\n</think>\n\n", "<tool_call>\n<function=search>\n<parameter=query>\nrust async traits\n</parameter>\n<parameter=limit>\n5\n</parameter>\n</function>\n</tool_call>", "\n", ""),
    ("seed_oss", Some("seed_oss"), Some("seed_oss"), "<seed:think>Plan.</seed:think>", "<seed:tool_call>\n<function=search>\n<parameter=query>\nrust async traits\n</parameter>\n</function>\n</seed:tool_call>", "\n", ""),
    ("jamba", Some("jamba"), None, "<tool_calls>[", "{\"name\": \"search\", \"arguments\": {\"query\": \"rust async traits\", \"limit\": 5}}", ", ", "]</tool_calls>"),
    ("hunyuan_a13b", Some("hunyuan_a13b"), Some("hunyuan_a13b"), "<think>\nPlan.\n</think>\n<answer>\n<tool_calls>[", "{\"name\": \"search\", \"arguments\": {\"query\": \"rust async traits\", \"limit\": 5}}", ", ", "]</tool_calls>"),
    ("internlm", Some("internlm"), None, "Let me look. <|action_start|><|plugin|>\n{\"name\": \"search\", \"parameters\": {\"q\": \"", "rust async traits ", "", "\"}}<|action_end|>"),
    ("xlam", Some("xlam"), None, "```json\n[", "{\"name\": \"search\", \"arguments\": {\"query\": \"rust async traits\", \"limit\": 5}}", ", ", "]\n```"),
    ("phi4_mini_json", Some("phi4_mini_json"), None, "functools[", "{\"name\": \"search\", \"arguments\": {\"query\": \"rust async traits\", \"limit\": 5}}", ", ", "]"),
    ("granite-20b-fc", Some("granite-20b-fc"), None, "Sure. ", "<function_call> {\"name\": \"search\", \"arguments\": {\"query\": \"rust async traits\", \"limit\": 5}}", " ", ""),
    ("granite", Some("granite"), None, "Sure. <|tool_call|>[", "{\"name\": \"search\", \"arguments\": {\"query\": \"rust async traits\", \"limit\": 5}}", ", ", "]"),
    ("step3", Some("step3"), Some("step3"), "Plan.</think>Sure. <｜tool_calls_begin｜>", "<｜tool_call_begin｜>function<｜tool_sep｜><steptml:invoke name=\"search\"><steptml:parameter name=\"query\">rust async traits</steptml:parameter></steptml:invoke><｜tool_call_end｜>", "", "<｜tool_calls_end｜>"),
    ("openai", Some("openai"), Some("openai_gptoss"), "<|channel|>analysis<|message|>Plan the searches.<|end|>", "<|start|>assistant<|channel|>commentary to=functions.search <|constrain|>json<|message|>{\"query\": \"rust async traits\", \"limit\": 5}<|call|>", "", ""),
    ("deepseek_r1", None, Some("deepseek_r1"), "<think>", "Step: consider the next option carefully, then compare. ", "", "</think>The answer is 42."),
    ("granite_reasoning", None, Some("granite"), "Here is my thought process: ", "Step: consider the next option carefully. ", "", "Here is my response: 42."),
];

fn build(t: &Template, target: usize) -> String {
    let (_, _, _, prefix, item, sep, suffix) = *t;
    let mut s = String::from(prefix);
    let mut first = true;
    while s.len() + suffix.len() < target {
        if !first {
            s.push_str(sep);
        }
        s.push_str(item);
        first = false;
    }
    s.push_str(suffix);
    s
}

fn bench(c: &mut Criterion) {
    let reg = ParserRegistry::new();
    let ctx = ParserConfig::default();
    for t in TEMPLATES {
        let mut g = c.benchmark_group(t.0);
        for (label, size) in [("1k", 1_000usize), ("16k", 16_000)] {
            let text = build(t, size);
            g.throughput(Throughput::Bytes(text.len() as u64));
            g.bench_with_input(BenchmarkId::new("oneshot", label), &text, |b, text| {
                b.iter(|| {
                    let mut p = reg.new_parser(t.1, t.2, &ctx).expect("registered");
                    black_box(aphro_parsers::parse(p.as_mut(), text))
                })
            });
            let cuts: Vec<usize> = (0..=text.len())
                .filter(|i| text.is_char_boundary(*i))
                .step_by(4)
                .collect();
            g.bench_with_input(BenchmarkId::new("stream4", label), &text, |b, text| {
                b.iter(|| {
                    let mut p = reg.new_parser(t.1, t.2, &ctx).expect("registered");
                    let mut agg = Aggregator::new();
                    let mut prev = 0;
                    for &c in &cuts {
                        agg.add(&p.push(&text[prev..c]));
                        prev = c;
                    }
                    agg.add(&p.push(&text[prev..]));
                    agg.add(&p.finish());
                    black_box(agg.into_message())
                })
            });
        }
        g.finish();
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
