//! Splitting text around special pieces (control and user-defined tokens) before BPE.
//!
//! Matching is leftmost-longest, as Hugging Face's added-token matcher does: scanning from the
//! left, the first position where any piece matches wins, and there the longest piece wins.
//! Control tokens take part only with `parse_special`; user-defined pieces always do.

use std::collections::HashMap;

/// One piece of split text: plain text for BPE, or a whole special token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Segment<'a> {
    /// Text to run through the pre-tokenizer and BPE.
    Text(&'a str),
    /// A special token matched whole.
    Token(u32),
}

/// Leftmost-longest matcher over the special pieces of a vocabulary.
#[derive(Debug, Default)]
pub(crate) struct SpecialMatcher {
    /// Piece text → (id, is control token).
    pieces: HashMap<String, (u32, bool)>,
    /// For each first byte: the distinct lengths of pieces starting with it, longest first.
    lengths: Vec<Vec<usize>>,
}

impl SpecialMatcher {
    /// Build from `(text, id, is_control)` triples; empty pieces are ignored.
    pub(crate) fn new<'a>(items: impl IntoIterator<Item = (&'a str, u32, bool)>) -> Self {
        let mut pieces = HashMap::new();
        let mut lengths = vec![Vec::new(); 256];
        for (text, id, control) in items {
            let Some(&first) = text.as_bytes().first() else {
                continue;
            };
            // Keep the lowest id when a vocabulary repeats a piece.
            pieces.entry(text.to_owned()).or_insert((id, control));
            let lens: &mut Vec<usize> = &mut lengths[usize::from(first)];
            if !lens.contains(&text.len()) {
                lens.push(text.len());
            }
        }
        for lens in &mut lengths {
            lens.sort_unstable_by(|a, b| b.cmp(a));
        }
        Self { pieces, lengths }
    }

    /// The longest special piece starting at byte `pos`, as (id, byte length).
    fn match_at(&self, text: &str, pos: usize, parse_special: bool) -> Option<(u32, usize)> {
        let first = *text.as_bytes().get(pos)?;
        for &len in &self.lengths[usize::from(first)] {
            let end = pos + len;
            if end > text.len() || !text.is_char_boundary(end) {
                continue;
            }
            if let Some(&(id, control)) = self.pieces.get(&text[pos..end])
                && (parse_special || !control)
            {
                return Some((id, len));
            }
        }
        None
    }

    /// Split `text` into plain-text runs and special tokens, in order.
    pub(crate) fn split<'a>(&self, text: &'a str, parse_special: bool) -> Vec<Segment<'a>> {
        let mut out = Vec::new();
        let mut start = 0;
        let mut pos = 0;
        while pos < text.len() {
            if let Some((id, len)) = self.match_at(text, pos, parse_special) {
                if start < pos {
                    out.push(Segment::Text(&text[start..pos]));
                }
                out.push(Segment::Token(id));
                pos += len;
                start = pos;
            } else {
                pos += text[pos..].chars().next().map_or(1, char::len_utf8);
            }
        }
        if start < text.len() {
            out.push(Segment::Text(&text[start..]));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn matcher() -> SpecialMatcher {
        SpecialMatcher::new([
            ("<s>", 1, true),
            ("<start>", 2, true),
            ("  ", 3, false),
            ("   ", 4, false),
        ])
    }

    #[test]
    fn leftmost_longest_and_parse_special_gate() {
        let m = matcher();
        assert_eq!(
            m.split("a<start>b   c", true),
            vec![
                Segment::Text("a"),
                Segment::Token(2),
                Segment::Text("b"),
                Segment::Token(4),
                Segment::Text("c")
            ]
        );
        // Control tokens stay text without parse_special; user-defined pieces still match.
        assert_eq!(
            m.split("<s>  x", false),
            vec![Segment::Text("<s>"), Segment::Token(3), Segment::Text("x")]
        );
        assert_eq!(m.split("", true), vec![]);
        assert_eq!(
            m.split("é<s>", true),
            vec![Segment::Text("é"), Segment::Token(1)]
        );
    }
}
