//! Prefill and batch-1 decode throughput of the model runner (no criterion: one model load,
//! a few timed runs). `cargo bench -p aphro-engine --bench decode` (set `APHRO_ASSETS`;
//! `APHRO_BENCH_DTYPE=float32` for the dequantized path, `RAYON_NUM_THREADS` for threads).

use std::path::PathBuf;
use std::time::Instant;

use aphro_engine::model::{load_flex_runner, ModelDType, ModelLoadConfig};
use aphro_engine::runner::{BatchInput, LogitsWanted, ModelRunner, SeqInput};

fn main() {
    let assets = std::env::var_os("APHRO_ASSETS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../.assets")));
    let path = assets.join("models/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(
        path.exists(),
        "{} missing: run scripts/fetch_assets.py",
        path.display()
    );
    let dtype = match std::env::var("APHRO_BENCH_DTYPE").as_deref() {
        Ok("float32") => ModelDType::Float32,
        _ => ModelDType::Auto,
    };
    let prefill_len: usize = std::env::var("APHRO_BENCH_PREFILL")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(128);
    let decode_len: usize = std::env::var("APHRO_BENCH_DECODE")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(64);
    if std::env::var_os("APHRO_BENCH_KERNELS").is_some() {
        kernels(&path);
        return;
    }
    let block = 16;
    let t0 = Instant::now();
    let mut r = load_flex_runner(&ModelLoadConfig {
        model_path: path,
        dtype,
        // Room for the batch-16 run at long decodes (~46 KiB of K/V per SmolLM2 token).
        cache_bytes: 512 << 20,
        min_cache_tokens: 0,
        block_size: block,
        quiet: false,
        device: aphro_engine::backend::Device::Cpu,
        kv_cache_dtype: Default::default(),
    })
    .expect("model loads");
    eprintln!(
        "loaded ({dtype:?}) in {:.2}s, threads {}",
        t0.elapsed().as_secs_f64(),
        rayon::current_num_threads()
    );
    let table: Vec<u32> = (0..((prefill_len + decode_len).div_ceil(block)) as u32).collect();
    let prompt: Vec<u32> = (0..prefill_len as u32)
        .map(|i| 100 + (i * 37) % 40000)
        .collect();
    let run = |r: &mut dyn ModelRunner, toks: Vec<u32>, start: usize| {
        r.execute(&BatchInput {
            seqs: vec![SeqInput {
                seq_id: 0,
                token_ids: toks,
                start_pos: start,
                block_table: table.clone(),
                logits: LogitsWanted::Last,
            }],
        })
        .expect("step")
        .remove(0)
        .data
    };
    // Warm up.
    run(&mut r, prompt[..8].to_vec(), 0);
    let mut best_prefill = f64::MAX;
    for _ in 0..3 {
        let t = Instant::now();
        run(&mut r, prompt.clone(), 0);
        best_prefill = best_prefill.min(t.elapsed().as_secs_f64());
    }
    let mut tok = 1u32;
    let t = Instant::now();
    for i in 0..decode_len {
        let l = run(&mut r, vec![tok], prefill_len + i);
        tok = l
            .iter()
            .enumerate()
            .fold((0, f32::MIN), |b, (i, &v)| if v > b.1 { (i, v) } else { b })
            .0 as u32;
    }
    let decode = t.elapsed().as_secs_f64();
    // Batched decode: `batch` sequences (16-token prompts) stepping together.
    let batch: usize = std::env::var("APHRO_BENCH_BATCH")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(16);
    let per_seq = (16 + decode_len).div_ceil(block);
    let base = table.len();
    let seq = |i: usize, toks: Vec<u32>, start: usize, want: LogitsWanted| SeqInput {
        seq_id: i as u64 + 1,
        token_ids: toks,
        start_pos: start,
        block_table: ((base + i * per_seq) as u32..(base + (i + 1) * per_seq) as u32).collect(),
        logits: want,
    };
    let seqs: Vec<SeqInput> = (0..batch)
        .map(|i| seq(i, prompt[i..i + 16].to_vec(), 0, LogitsWanted::Last))
        .collect();
    r.execute(&BatchInput { seqs }).expect("batched prefill");
    let t = Instant::now();
    for step in 0..decode_len {
        let seqs: Vec<SeqInput> = (0..batch)
            .map(|i| {
                seq(
                    i,
                    vec![(100 + i + step) as u32],
                    16 + step,
                    LogitsWanted::Last,
                )
            })
            .collect();
        r.execute(&BatchInput { seqs }).expect("batched step");
    }
    let batched = t.elapsed().as_secs_f64();
    println!(
        "{{\"dtype\": \"{dtype:?}\", \"prefill_tokens\": {prefill_len}, \"prefill_tok_s\": {:.1}, \"decode_tokens\": {decode_len}, \"decode_tok_s\": {:.1}, \"batch\": {batch}, \"batch_decode_tok_s\": {:.1}}}",
        prefill_len as f64 / best_prefill,
        decode_len as f64 / decode,
        (batch * decode_len) as f64 / batched
    );
}

/// GEMV/GEMM throughput of quantized matrices against the f32 dense matmul (GMAC/s).
/// `APHRO_BENCH_MODEL` picks another GGUF and `APHRO_BENCH_TENSORS` (comma-separated)
/// its tensors; `APHRO_BENCH_TOKENS` the token counts (default `1,128`).
fn kernels(default: &std::path::Path) {
    use aphro_core::gguf::GgmlType;
    use aphro_engine::model::quant::{dense_matmul, q5_0_to_q8_0, QuantMatrix, QuantType};
    let path = std::env::var_os("APHRO_BENCH_MODEL")
        .map(PathBuf::from)
        .unwrap_or_else(|| default.to_path_buf());
    let names =
        std::env::var("APHRO_BENCH_TENSORS").unwrap_or_else(|_| "blk.0.ffn_up.weight".into());
    let tokens: Vec<usize> = std::env::var("APHRO_BENCH_TOKENS")
        .unwrap_or_else(|_| "1,128".into())
        .split(',')
        .map(|t| t.trim().parse().expect("token count"))
        .collect();
    // MACs per measurement (`APHRO_BENCH_GMACS`, default 2).
    let macs = std::env::var("APHRO_BENCH_GMACS")
        .ok()
        .and_then(|v| v.parse::<f64>().ok())
        .unwrap_or(2.0)
        * 1e9;
    let g = aphro_core::gguf::GgufFile::open(&path).expect("gguf");
    for name in names.split(',') {
        let info = g.tensor_info(name.trim()).expect("tensor");
        let (cols, rows) = (info.dims[0] as usize, info.dims[1] as usize);
        let raw = g.tensor_data(info).to_vec();
        let (ty, bytes) = match info.ggml_type {
            GgmlType::Q5_0 => (QuantType::Q8_0, q5_0_to_q8_0(&raw)),
            GgmlType::Q8_0 => (QuantType::Q8_0, raw),
            GgmlType::Q4_0 => (QuantType::Q4_0, raw),
            GgmlType::Q4_1 => (QuantType::Q4_1, raw),
            GgmlType::Q5_1 => (QuantType::Q5_1, raw),
            GgmlType::Q4K => (QuantType::Q4K, raw),
            GgmlType::Q5K => (QuantType::Q5K, raw),
            GgmlType::Q6K => (QuantType::Q6K, raw),
            other => panic!("{name}: no fused kernel for {other}"),
        };
        let q = QuantMatrix::new(ty, rows, cols, bytes).expect("q");
        // `APHRO_BENCH_QUANT_ONLY` skips the f32 comparison (for a profile of the kernels).
        let dense = std::env::var_os("APHRO_BENCH_QUANT_ONLY").is_none();
        let w = if dense { q.dequantize() } else { Vec::new() };
        for &tokens in &tokens {
            let x: Vec<f32> = (0..tokens * cols).map(|i| (i % 13) as f32 * 0.01).collect();
            let iters = (macs / (rows * cols * tokens) as f64).ceil().max(3.0) as usize;
            let t = Instant::now();
            for _ in 0..iters {
                std::hint::black_box(q.matmul(&x, tokens));
            }
            let tq = t.elapsed().as_secs_f64() / iters as f64;
            let t = Instant::now();
            let dense_iters = if dense { iters.div_ceil(4) } else { 0 };
            for _ in 0..dense_iters {
                std::hint::black_box(dense_matmul(&w, rows, cols, &x, tokens));
            }
            let td = t.elapsed().as_secs_f64() / dense_iters.max(1) as f64;
            println!(
                "{name} {rows}x{cols} {ty:?} tokens={tokens}: {:.1} us ({:.1} GMAC/s), f32 {:.1} us ({:.1} GMAC/s)",
                tq * 1e6,
                (rows * cols * tokens) as f64 / tq / 1e9,
                td * 1e6,
                (rows * cols * tokens) as f64 / td / 1e9
            );
        }
    }
}
