//! GPT-2 style byte-level BPE: every byte of the text maps to one printable character, words
//! from the pre-tokenizer are merged by rank, lowest rank first.
//!
//! Merging uses a binary heap over adjacent pairs plus a linked list of live symbols, so a word
//! of n bytes costs O(n log n) rather than O(n²) rescans; stale heap entries are recognised by
//! comparing the ids they were built from with the symbols now at those positions.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

use ferrite_gguf::Strings;

use crate::error::{Result, TokenizerError};
use crate::hash::FxMap;
use crate::pretok::PreTokenizer;

/// The GPT-2 byte → character table: printable Latin-1 bytes map to themselves, the other 68
/// bytes to U+0100.. in byte order.
pub(crate) fn byte_to_char_table() -> [char; 256] {
    let mut table = ['\0'; 256];
    let mut next = 0x100u32;
    for (b, slot) in table.iter_mut().enumerate() {
        let printable = matches!(b, 0x21..=0x7e | 0xa1..=0xac | 0xae..=0xff);
        let code = if printable {
            b as u32
        } else {
            let c = next;
            next += 1;
            c
        };
        *slot = char::from_u32(code).unwrap_or('\0');
    }
    table
}

/// Inverse of [`byte_to_char_table`].
pub(crate) fn char_to_byte_map() -> HashMap<char, u8> {
    byte_to_char_table()
        .iter()
        .enumerate()
        .map(|(b, &c)| (c, b as u8))
        .collect()
}

/// Bytes a byte-level piece stands for: mapped back through the byte table when every character
/// belongs to it (as Hugging Face's ByteLevel decoder does), else the piece's own UTF-8.
pub(crate) fn piece_bytes(piece: &str, map: &HashMap<char, u8>) -> Vec<u8> {
    piece
        .chars()
        .map(|c| map.get(&c).copied())
        .collect::<Option<Vec<u8>>>()
        .unwrap_or_else(|| piece.as_bytes().to_vec())
}

/// A byte-level BPE model: byte alphabet, merge ranks and pre-tokenizer.
#[derive(Debug)]
pub(crate) struct ByteLevelBpe {
    pre: PreTokenizer,
    /// Token id of each byte's one-character piece; `None` where the vocabulary lacks it (the
    /// byte is then dropped, as the reference tokenizer does).
    byte_ids: [Option<u32>; 256],
    /// (left id, right id) → (rank, merged id).
    merges: FxMap<(u32, u32), (u32, u32)>,
    /// Mapped word → id, consulted first when the pre-tokenizer says merges are ignored for
    /// words already in the vocabulary (Llama 3).
    whole_words: Option<FxMap<String, u32>>,
    byte_chars: [char; 256],
}

impl ByteLevelBpe {
    /// Build from the vocabulary and `"left right"` merges in rank order.
    pub(crate) fn new(pre: PreTokenizer, tokens: &Strings, merges: &[String]) -> Result<Self> {
        let vocab: FxMap<&str, u32> = tokens
            .iter()
            .enumerate()
            .rev() // the lowest id wins for duplicated pieces
            .map(|(i, t)| (t, i as u32))
            .collect();
        let byte_chars = byte_to_char_table();
        let mut byte_ids = [None; 256];
        let mut buf = [0u8; 4];
        for (slot, c) in byte_ids.iter_mut().zip(byte_chars.iter()) {
            *slot = vocab.get(&*c.encode_utf8(&mut buf)).copied();
        }
        let mut merge_map = FxMap::default();
        merge_map.reserve(merges.len());
        for (index, merge) in merges.iter().enumerate() {
            let bad = |reason| TokenizerError::BadMerge {
                index,
                merge: merge.clone(),
                reason,
            };
            let (left, right) = merge.split_once(' ').ok_or_else(|| bad("no space"))?;
            let l = *vocab
                .get(left)
                .ok_or_else(|| bad("left piece not in vocabulary"))?;
            let r = *vocab
                .get(right)
                .ok_or_else(|| bad("right piece not in vocabulary"))?;
            let joined = format!("{left}{right}");
            let m = *vocab
                .get(joined.as_str())
                .ok_or_else(|| bad("merged piece not in vocabulary"))?;
            // Keep the first (best) rank if a merge is listed twice.
            merge_map.entry((l, r)).or_insert((index as u32, m));
        }
        let whole_words = pre.ignores_merges().then(|| {
            vocab
                .iter()
                .map(|(k, &v)| ((*k).to_owned(), v))
                .collect::<FxMap<_, _>>()
        });
        Ok(Self {
            pre,
            byte_ids,
            merges: merge_map,
            whole_words,
            byte_chars,
        })
    }

    /// Encode plain text (no special tokens) and append the ids to `out`.
    pub(crate) fn encode(&self, text: &str, out: &mut Vec<u32>) {
        let mut words = Vec::new();
        self.pre.split(text, &mut words);
        let mut scratch = Scratch::default();
        for word in words {
            self.encode_word(word, out, &mut scratch);
        }
    }

    fn encode_word(&self, word: &str, out: &mut Vec<u32>, scratch: &mut Scratch) {
        if let Some(whole) = &self.whole_words {
            let mapped: String = word
                .bytes()
                .map(|b| self.byte_chars[usize::from(b)])
                .collect();
            if let Some(&id) = whole.get(&mapped) {
                out.push(id);
                return;
            }
        }
        scratch.ids.clear();
        scratch
            .ids
            .extend(word.bytes().filter_map(|b| self.byte_ids[usize::from(b)]));
        merge_by_rank(&mut scratch.ids, &self.merges, &mut scratch.links);
        out.extend_from_slice(&scratch.ids);
    }

    /// Rank of the merge of `left` and `right`, if any.
    #[cfg(test)]
    pub(crate) fn merge_rank(&self, left: u32, right: u32) -> Option<u32> {
        self.merges.get(&(left, right)).map(|&(rank, _)| rank)
    }

    /// Swap the ranks of two merges (a mutation for tests to prove the comparison notices).
    #[cfg(test)]
    pub(crate) fn swap_ranks(&mut self, a: (u32, u32), b: (u32, u32)) {
        if let (Some(&ra), Some(&rb)) = (self.merges.get(&a), self.merges.get(&b)) {
            self.merges.insert(a, (rb.0, ra.1));
            self.merges.insert(b, (ra.0, rb.1));
        }
    }
}

/// Reusable buffers for [`merge_by_rank`].
#[derive(Default)]
struct Scratch {
    ids: Vec<u32>,
    links: Vec<Link>,
}

/// A live symbol in the merge list.
#[derive(Clone, Copy)]
struct Link {
    id: u32,
    prev: usize,
    next: usize,
    alive: bool,
}

const NONE: usize = usize::MAX;

/// Apply merges to `ids` in place: repeatedly merge the adjacent pair with the lowest rank,
/// leftmost first among equal ranks.
fn merge_by_rank(
    ids: &mut Vec<u32>,
    merges: &FxMap<(u32, u32), (u32, u32)>,
    links: &mut Vec<Link>,
) {
    if ids.len() < 2 {
        return;
    }
    links.clear();
    let n = ids.len();
    links.extend(ids.iter().enumerate().map(|(i, &id)| Link {
        id,
        prev: if i == 0 { NONE } else { i - 1 },
        next: if i + 1 == n { NONE } else { i + 1 },
        alive: true,
    }));
    // (rank, left position, left id, right id); right position is left's `next`.
    let mut heap: BinaryHeap<Reverse<(u32, usize, u32, u32)>> = BinaryHeap::new();
    for i in 0..n - 1 {
        if let Some(&(rank, _)) = merges.get(&(ids[i], ids[i + 1])) {
            heap.push(Reverse((rank, i, ids[i], ids[i + 1])));
        }
    }
    while let Some(Reverse((_, left, lid, rid))) = heap.pop() {
        let l = links[left];
        if !l.alive || l.id != lid || l.next == NONE {
            continue;
        }
        let right = l.next;
        if links[right].id != rid {
            continue;
        }
        let Some(&(_, merged)) = merges.get(&(lid, rid)) else {
            continue;
        };
        let after = links[right].next;
        links[right].alive = false;
        links[left].id = merged;
        links[left].next = after;
        if after != NONE {
            links[after].prev = left;
            if let Some(&(rank, _)) = merges.get(&(merged, links[after].id)) {
                heap.push(Reverse((rank, left, merged, links[after].id)));
            }
        }
        let before = links[left].prev;
        if before != NONE
            && let Some(&(rank, _)) = merges.get(&(links[before].id, merged))
        {
            heap.push(Reverse((rank, before, links[before].id, merged)));
        }
    }
    ids.clear();
    let mut i = 0;
    while i != NONE {
        ids.push(links[i].id);
        i = links[i].next;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_table_is_a_bijection_matching_gpt2() {
        let t = byte_to_char_table();
        assert_eq!(t[b' ' as usize], 'Ġ');
        assert_eq!(t[b'\n' as usize], 'Ċ');
        assert_eq!(t[b'a' as usize], 'a');
        assert_eq!(char_to_byte_map().len(), 256);
    }

    fn toy() -> ByteLevelBpe {
        let tokens: Vec<String> = ["a", "b", "c", "ab", "bc", "abc", "aa", "aaa"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let merges: Vec<String> = ["a b", "b c", "ab c", "a a", "aa a"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        ByteLevelBpe::new(
            PreTokenizer::from_name("gpt-2").expect("known"),
            &tokens.iter().collect(),
            &merges,
        )
        .expect("toy vocabulary")
    }

    #[test]
    fn merges_lowest_rank_first_and_leftmost_on_ties() {
        let bpe = toy();
        let mut out = Vec::new();
        bpe.encode("abc", &mut out);
        assert_eq!(out, vec![5]);
        out.clear();
        // "aaaa": a a (rank 3) merges leftmost first → aa aa; "aa a" needs a single a.
        bpe.encode("aaaa", &mut out);
        assert_eq!(out, vec![6, 6]);
        out.clear();
        bpe.encode("aaa", &mut out);
        assert_eq!(out, vec![7]);
        out.clear();
        // 'd' has no piece: dropped before merging, so its neighbours merge (as in Hugging
        // Face, where an unknown character without an unk token leaves no symbol).
        bpe.encode("adb", &mut out);
        assert_eq!(out, vec![3]);
    }

    #[test]
    fn swapping_two_ranks_changes_the_result() {
        let mut bpe = toy();
        assert_eq!(bpe.merge_rank(0, 1), Some(0));
        // With "b c" before "a b", "abc" becomes a + bc (no "a bc" merge).
        bpe.swap_ranks((0, 1), (1, 2));
        let mut out = Vec::new();
        bpe.encode("abc", &mut out);
        assert_eq!(out, vec![0, 4]);
    }

    #[test]
    fn rejects_merge_with_missing_piece() {
        let tokens = ["a", "b"];
        let err = ByteLevelBpe::new(
            PreTokenizer::from_name("gpt-2").expect("known"),
            &tokens.iter().collect(),
            &["a b".to_string()],
        );
        assert!(matches!(
            err,
            Err(TokenizerError::BadMerge { index: 0, .. })
        ));
    }
}
