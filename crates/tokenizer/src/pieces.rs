//! [`PieceIndex`]: piece text → token id for a whole vocabulary, with the text stored once.
//!
//! A map keyed by owned strings costs an allocation and a `String` header per token on top of
//! the text (about 60 bytes per token; 25 MiB for Gemma 3's 262,144 pieces). Here the table
//! holds only ids and hashes the pieces' text where it already lives: the tokenizer's own
//! vocabulary, shared through an [`Arc`].

use std::hash::Hasher;
use std::sync::Arc;

use ferrite_gguf::Strings;
use hashbrown::HashTable;

use crate::hash::FxHasher;

/// Exact-text lookup of a subset of a vocabulary's pieces.
pub(crate) struct PieceIndex {
    text: Arc<Strings>,
    table: HashTable<u32>,
}

impl std::fmt::Debug for PieceIndex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PieceIndex")
            .field("pieces", &self.table.len())
            .finish_non_exhaustive()
    }
}

fn hash(piece: &str) -> u64 {
    let mut h = FxHasher::default();
    h.write(piece.as_bytes());
    h.finish()
}

impl PieceIndex {
    /// Indexes the tokens of `vocab` (id = position) that `keep` accepts; for a piece listed
    /// twice the lowest id wins.
    pub(crate) fn new(vocab: &Arc<Strings>, keep: impl Fn(usize) -> bool) -> PieceIndex {
        let text = Arc::clone(vocab);
        let mut table = HashTable::with_capacity(vocab.len());
        for (id, piece) in vocab.iter().enumerate() {
            if !keep(id) {
                continue;
            }
            let h = hash(piece);
            let same = |&other: &u32| text.get(other as usize) == Some(piece);
            if table.find(h, same).is_none() {
                let rehash = |&other: &u32| hash(text.get(other as usize).unwrap_or_default());
                table.insert_unique(h, id as u32, rehash);
            }
        }
        PieceIndex { text, table }
    }

    /// The id of `piece`, if indexed.
    pub(crate) fn get(&self, piece: &str) -> Option<u32> {
        let same = |&id: &u32| self.text.get(id as usize) == Some(piece);
        self.table.find(hash(piece), same).copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_kept_pieces_and_the_lowest_duplicate() {
        let vocab = Arc::new(["a", "b", "ab", "a", "skip"].into_iter().collect());
        let index = PieceIndex::new(&vocab, |id| id != 4);
        assert_eq!(index.get("a"), Some(0));
        assert_eq!(index.get("ab"), Some(2));
        assert_eq!(index.get("skip"), None);
        assert_eq!(index.get("abc"), None);
    }
}
