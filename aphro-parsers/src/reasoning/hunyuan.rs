//! `hunyuan_a13b` reasoning: the full frame `<think>\n…\n</think>\n<answer>\n…[\n</answer>]`.
//! Reasoning and answer are the inner texts without the frame newlines; empty parts are null.
//! Without the leading `<think>\n` (or without `\n</think>\n<answer>\n`) everything is content.
//! Needs the whole frame, so it is a buffered split.

pub fn split(text: &str) -> (Option<String>, Option<String>) {
    const OPEN: &str = "<think>\n";
    const MID: &str = "\n</think>\n<answer>\n";
    let nonempty = |s: &str| (!s.is_empty()).then(|| s.to_string());
    if let Some(rest) = text.strip_prefix(OPEN) {
        // `<think>\n\n</think>` : the reasoning is empty and the mid marker starts right away.
        let (reasoning, after) = if let Some(a) = rest.strip_prefix(MID) {
            ("", Some(a))
        } else if let Some(p) = rest.find(MID) {
            (&rest[..p], Some(&rest[p + MID.len()..]))
        } else if let Some(a) = rest.strip_prefix(&MID[1..]) {
            ("", Some(a))
        } else {
            ("", None)
        };
        if let Some(after) = after {
            let answer = after
                .strip_suffix("\n</answer>")
                .or_else(|| after.strip_suffix("</answer>"))
                .unwrap_or(after);
            return (nonempty(reasoning), nonempty(answer));
        }
    }
    (None, nonempty(text))
}
