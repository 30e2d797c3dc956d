//! Marker search helpers shared by the incremental stages.

/// Earliest full occurrence of any marker in `hay`: `(byte position, marker index)`.
/// Ties go to the longer marker.
pub(crate) fn find_earliest(hay: &str, markers: &[&str]) -> Option<(usize, usize)> {
    let mut best: Option<(usize, usize)> = None;
    for (i, m) in markers.iter().enumerate() {
        if m.is_empty() {
            continue;
        }
        if let Some(p) = hay.find(m) {
            best = match best {
                Some((bp, bi)) if bp < p || (bp == p && markers[bi].len() >= m.len()) => {
                    Some((bp, bi))
                }
                _ => Some((p, i)),
            };
        }
    }
    best
}

/// Length of the longest suffix of `buf` that is a proper, non-empty prefix of some marker
/// (so it might still grow into that marker). Always a char boundary of `buf`.
pub(crate) fn partial_suffix_len(buf: &str, markers: &[&str]) -> usize {
    let max = markers.iter().map(|m| m.len()).max().unwrap_or(0);
    let start = buf.len().saturating_sub(max.saturating_sub(1));
    for k in start..buf.len() {
        if !buf.is_char_boundary(k) {
            continue;
        }
        let tail = &buf[k..];
        if markers
            .iter()
            .any(|m| m.len() > tail.len() && m.starts_with(tail))
        {
            return buf.len() - k;
        }
    }
    0
}

/// Python's `str.isspace` for one character: Unicode `White_Space` plus the information
/// separators U+001C..U+001F, which Python counts as whitespace and Rust does not. vLLM's
/// `.strip()` / `.rstrip()` / `.strip() == ""` checks use this set.
pub(crate) fn is_py_space(c: char) -> bool {
    c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c)
}

/// Python `s.strip()`.
pub(crate) fn py_strip(s: &str) -> &str {
    s.trim_matches(is_py_space)
}

/// Byte length of the trailing whitespace of `s` (what Python `s.rstrip()` removes).
pub(crate) fn trailing_ws_len(s: &str) -> usize {
    s.len() - s.trim_end_matches(is_py_space).len()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partial_suffix() {
        assert_eq!(partial_suffix_len("abc<too", &["<tool_call>"]), 4);
        assert_eq!(partial_suffix_len("abc<tool_call>", &["<tool_call>"]), 0);
        assert_eq!(partial_suffix_len("abc", &["<tool_call>"]), 0);
        assert_eq!(partial_suffix_len("é<", &["<x>"]), 1);
        assert_eq!(
            find_earliest("a</think>b<think>", &["<think>", "</think>"]),
            Some((1, 1))
        );
    }

    #[test]
    fn python_whitespace() {
        // Python: "a \x1f\u3000\n".rstrip() == "a"; " \x1c x\x1d ".strip() == "x".
        assert_eq!(trailing_ws_len("a \u{1f}\u{3000}\n"), 1 + 1 + 3 + 1);
        assert_eq!(py_strip(" \u{1c} x\u{1d} "), "x");
        assert_eq!(py_strip("\u{200b}"), "\u{200b}"); // zero-width space is not whitespace
        assert_eq!(trailing_ws_len("a"), 0);
    }
}
