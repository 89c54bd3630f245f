//! SentencePiece-style BPE (`tokenizer.ggml.model = llama`, e.g. Gemma 3): spaces become `▁`,
//! the text starts as single characters, and the adjacent pair whose concatenation is a piece
//! with the highest score is merged first (leftmost on equal scores). Characters left without a
//! piece fall back to `<0xNN>` byte tokens.
//!
//! Like [`crate::bytelevel`], merging uses a heap of candidate pairs over a linked list, so long
//! runs without user-defined pieces stay O(n log n).

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use std::sync::Arc;

use ferrite_gguf::Strings;

use crate::pieces::PieceIndex;
use crate::spec::TokenType;

/// The SentencePiece word-boundary marker that stands for a space.
pub(crate) const SPACE_MARK: char = '▁';

/// A score-driven BPE model.
#[derive(Debug)]
pub(crate) struct SpmBpe {
    /// Pieces BPE may produce (normal, user-defined, unused) → id.
    pieces: PieceIndex,
    scores: Vec<f32>,
    /// `<0xNN>` token of each byte.
    byte_ids: [Option<u32>; 256],
    unk_id: Option<u32>,
    add_space_prefix: bool,
}

/// A merge candidate: two adjacent symbols whose concatenation is a piece.
#[derive(PartialEq)]
struct Candidate {
    score: f32,
    left: usize,
    /// Byte length of the merged text, to detect stale entries.
    len: usize,
}

impl Eq for Candidate {}

impl Ord for Candidate {
    fn cmp(&self, other: &Self) -> Ordering {
        // Highest score first; on equal scores the leftmost pair first.
        self.score
            .total_cmp(&other.score)
            .then_with(|| other.left.cmp(&self.left))
    }
}

impl PartialOrd for Candidate {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// A symbol: a byte range of the normalized text plus list links.
#[derive(Clone, Copy)]
struct Sym {
    start: usize,
    end: usize,
    prev: usize,
    next: usize,
}

const NONE: usize = usize::MAX;

impl SpmBpe {
    /// Build from the vocabulary; `scores` and `types` have one entry per token.
    pub(crate) fn new(
        tokens: &Arc<Strings>,
        scores: Vec<f32>,
        types: &[TokenType],
        unk_id: Option<u32>,
        add_space_prefix: bool,
    ) -> Self {
        let pieces = PieceIndex::new(tokens, |id| {
            matches!(
                types.get(id),
                Some(TokenType::Normal | TokenType::UserDefined | TokenType::Unused)
            )
        });
        let mut byte_ids = [None; 256];
        for (i, (tok, ty)) in tokens.iter().zip(types).enumerate() {
            if *ty == TokenType::Byte
                && let Some(b) = parse_byte_piece(tok)
            {
                byte_ids[usize::from(b)].get_or_insert(i as u32);
            }
        }
        Self {
            pieces,
            scores,
            byte_ids,
            unk_id,
            add_space_prefix,
        }
    }

    /// Encode one run of plain text; `first` says whether it starts the whole input (where the
    /// space prefix, if configured, goes).
    pub(crate) fn encode(&self, text: &str, first: bool, out: &mut Vec<u32>) {
        let mut norm = String::with_capacity(text.len() + 3);
        if first && self.add_space_prefix {
            norm.push(SPACE_MARK);
        }
        for c in text.chars() {
            norm.push(if c == ' ' { SPACE_MARK } else { c });
        }
        let mut syms: Vec<Sym> = Vec::with_capacity(norm.len());
        for (i, c) in norm.char_indices() {
            let n = syms.len();
            syms.push(Sym {
                start: i,
                end: i + c.len_utf8(),
                prev: if n == 0 { NONE } else { n - 1 },
                next: n + 1,
            });
        }
        let Some(last) = syms.last_mut() else {
            return;
        };
        last.next = NONE;
        let mut heap = BinaryHeap::new();
        for i in 0..syms.len().saturating_sub(1) {
            self.push_candidate(&norm, &syms, i, &mut heap);
        }
        while let Some(cand) = heap.pop() {
            let left = syms[cand.left];
            if left.end == left.start || left.next == NONE {
                continue;
            }
            let right = syms[left.next];
            if right.end - left.start != cand.len {
                continue;
            }
            let right_index = left.next;
            syms[cand.left].end = right.end;
            syms[cand.left].next = right.next;
            syms[right_index].end = syms[right_index].start; // mark dead
            if right.next != NONE {
                syms[right.next].prev = cand.left;
                self.push_candidate(&norm, &syms, cand.left, &mut heap);
            }
            if left.prev != NONE {
                self.push_candidate(&norm, &syms, left.prev, &mut heap);
            }
        }
        let mut i = 0;
        while i != NONE {
            let s = syms[i];
            let piece = &norm[s.start..s.end];
            if let Some(id) = self.pieces.get(piece) {
                out.push(id);
            } else {
                for b in piece.bytes() {
                    if let Some(id) = self.byte_ids[usize::from(b)].or(self.unk_id) {
                        out.push(id);
                    }
                }
            }
            i = s.next;
        }
    }

    fn push_candidate(&self, norm: &str, syms: &[Sym], i: usize, heap: &mut BinaryHeap<Candidate>) {
        let left = syms[i];
        if left.next == NONE {
            return;
        }
        let right = syms[left.next];
        if let Some(id) = self.pieces.get(&norm[left.start..right.end]) {
            let score = self.scores.get(id as usize).copied().unwrap_or(f32::MIN);
            heap.push(Candidate {
                score,
                left: i,
                len: right.end - left.start,
            });
        }
    }
}

/// The byte of a `<0xNN>` piece.
pub(crate) fn parse_byte_piece(piece: &str) -> Option<u8> {
    let hex = piece.strip_prefix("<0x")?.strip_suffix('>')?;
    if hex.len() != 2 {
        return None;
    }
    u8::from_str_radix(hex, 16).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn toy(add_space_prefix: bool) -> SpmBpe {
        let mut tokens: Vec<String> = ["▁", "a", "b", "ab", "▁a", "▁ab", "bb"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let mut scores = vec![-1.0, -2.0, -3.0, -4.0, -5.0, -6.0, -4.0];
        let mut types = vec![TokenType::Normal; tokens.len()];
        for b in 0..=255u8 {
            tokens.push(format!("<0x{b:02X}>"));
            scores.push(0.0);
            types.push(TokenType::Byte);
        }
        SpmBpe::new(
            &Arc::new(tokens.iter().collect()),
            scores,
            &types,
            None,
            add_space_prefix,
        )
    }

    #[test]
    fn highest_score_first_leftmost_on_ties() {
        let m = toy(false);
        let mut out = Vec::new();
        // "abb": "ab" (-4) and "bb" (-4) tie: the leftmost pair merges first.
        m.encode("abb", true, &mut out);
        assert_eq!(out, vec![3, 2]);
        out.clear();
        m.encode(" ab", true, &mut out);
        assert_eq!(out, vec![5]);
    }

    #[test]
    fn byte_fallback_and_space_prefix() {
        let m = toy(true);
        let mut out = Vec::new();
        m.encode("é", true, &mut out);
        assert_eq!(out, vec![0, 7 + 0xC3, 7 + 0xA9]);
        out.clear();
        m.encode("a", false, &mut out);
        assert_eq!(out, vec![1]);
        assert_eq!(parse_byte_piece("<0x0A>"), Some(10));
        assert_eq!(parse_byte_piece("<0x0>"), None);
    }
}
