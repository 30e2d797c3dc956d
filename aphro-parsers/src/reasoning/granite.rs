//! `granite` reasoning (Granite 3.2): plain-text markers `Here is my thought process:` /
//! `Here's my thought process:` then `Here is my response:` / `Here's my response:`. The text
//! between is reasoning, after is content (leading space kept). Without both markers, everything
//! is content. Buffered split.

const THINK: [&str; 2] = ["Here is my thought process:", "Here's my thought process:"];
const RESPONSE: [&str; 2] = ["Here is my response:", "Here's my response:"];

fn find_any(s: &str, pats: &[&str]) -> Option<(usize, usize)> {
    pats.iter()
        .filter_map(|p| s.find(p).map(|i| (i, p.len())))
        .min_by_key(|x| x.0)
}

pub fn split(text: &str) -> (Option<String>, Option<String>) {
    let nonempty = |s: &str| (!s.is_empty()).then(|| s.to_string());
    if let Some((ts, tl)) = find_any(text, &THINK) {
        let after = &text[ts + tl..];
        if let Some((rs, rl)) = find_any(after, &RESPONSE) {
            return (Some(after[..rs].to_string()), nonempty(&after[rs + rl..]));
        }
    }
    (None, nonempty(text))
}
