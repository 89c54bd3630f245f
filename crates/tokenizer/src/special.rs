//! Splitting text around special pieces (control and user-defined tokens) before BPE.
//!
//! Matching is leftmost-longest, as Hugging Face's added-token matcher does: scanning from the
//! left, the first position where any piece matches wins, and there the longest piece wins.
//! Control tokens take part only with `parse_special`; user-defined pieces always do.

use std::collections::HashSet;

use crate::hash::FxMap;

/// One piece of split text: plain text for BPE, or a whole special token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Segment<'a> {
    /// Text to run through the pre-tokenizer and BPE.
    Text(&'a str),
    /// A special token matched whole.
    Token(u32),
}

/// The two bytes at `pos` (a missing second byte reads as 0).
fn prefix2(bytes: &[u8], pos: usize) -> [u8; 2] {
    [
        bytes.get(pos).copied().unwrap_or(0),
        bytes.get(pos + 1).copied().unwrap_or(0),
    ]
}

/// Leftmost-longest matcher over the special pieces of a vocabulary.
#[derive(Debug, Default)]
pub(crate) struct SpecialMatcher {
    /// Piece text → (id, is control token).
    pieces: FxMap<String, (u32, bool)>,
    /// First two bytes of every piece (one byte for one-byte pieces, padded with 0), to reject
    /// most positions with one lookup: a space before a letter cannot start a run of spaces.
    prefixes: HashSet<[u8; 2]>,
    /// For each first byte: the distinct lengths of pieces starting with it, longest first.
    lengths: Vec<Vec<usize>>,
}

impl SpecialMatcher {
    /// Build from `(text, id, is_control)` triples; empty pieces are ignored.
    pub(crate) fn new<'a>(items: impl IntoIterator<Item = (&'a str, u32, bool)>) -> Self {
        let mut pieces = FxMap::default();
        let mut prefixes = HashSet::new();
        let mut lengths = vec![Vec::new(); 256];
        for (text, id, control) in items {
            let Some(&first) = text.as_bytes().first() else {
                continue;
            };
            prefixes.insert(prefix2(text.as_bytes(), 0));
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
        Self {
            pieces,
            prefixes,
            lengths,
        }
    }

    /// The longest special piece starting at byte `pos`, as (id, byte length).
    fn match_at(&self, text: &str, pos: usize, parse_special: bool) -> Option<(u32, usize)> {
        let first = *text.as_bytes().get(pos)?;
        let lens = &self.lengths[usize::from(first)];
        if lens.is_empty() {
            return None;
        }
        // A one-byte piece matches regardless of the next byte; otherwise the first two bytes
        // must begin some piece.
        let has_single = lens.last() == Some(&1);
        if !has_single && !self.prefixes.contains(&prefix2(text.as_bytes(), pos)) {
            return None;
        }
        for &len in lens {
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
