//! A fast non-cryptographic hasher (the Fx multiply-rotate scheme) for the vocabulary and
//! merge tables, which are looked up once or more per input byte.
//!
//! SipHash's flooding resistance buys nothing here: the tables are fixed when the model loads
//! and text only queries them, so a hostile input can at worst hit the longest existing chain.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

const SEED: u64 = 0x51_7c_c1_b7_27_22_0a_95;

/// Fx hasher state.
#[derive(Default, Clone, Copy)]
pub(crate) struct FxHasher {
    hash: u64,
}

impl FxHasher {
    fn add(&mut self, word: u64) {
        self.hash = (self.hash.rotate_left(5) ^ word).wrapping_mul(SEED);
    }
}

impl Hasher for FxHasher {
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            let mut w = [0u8; 8];
            w.copy_from_slice(c);
            self.add(u64::from_le_bytes(w));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut w = [0u8; 8];
            w[..rest.len()].copy_from_slice(rest);
            self.add(u64::from_le_bytes(w));
        }
    }

    fn write_u8(&mut self, i: u8) {
        self.add(u64::from(i));
    }

    fn write_u32(&mut self, i: u32) {
        self.add(u64::from(i));
    }

    fn write_u64(&mut self, i: u64) {
        self.add(i);
    }

    fn write_usize(&mut self, i: usize) {
        self.add(i as u64);
    }

    fn finish(&self) -> u64 {
        // A product's low bits depend only on its factors' low bits, so the raw state's low
        // bits barely vary across pieces that differ only in a few digits (Gemma 3's
        // thousands of `<unusedN>` pieces), and hashbrown picks the bucket from the low bits.
        // Folding the high half down and multiplying once more mixes every bit into every
        // bucket bit. Without it, indexing Gemma 3's vocabulary probed long chains and took
        // 1.2 s of a 2 s load.
        let h = (self.hash ^ (self.hash >> 32)).wrapping_mul(SEED);
        h ^ (h >> 32)
    }
}

/// A `HashMap` using [`FxHasher`].
pub(crate) type FxMap<K, V> = HashMap<K, V, BuildHasherDefault<FxHasher>>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn distinguishes_strings_differing_in_length_or_tail() {
        let mut m: FxMap<String, u32> = FxMap::default();
        for (i, s) in ["a", "a\0", "abcdefgh", "abcdefghi", ""].iter().enumerate() {
            m.insert((*s).to_owned(), i as u32);
        }
        assert_eq!(m.len(), 5);
        assert_eq!(m.get("abcdefghi"), Some(&3));
    }

    /// Pieces that differ only in a few digits must still spread over a table's buckets,
    /// which are picked by the hash's low bits (a 2^19-bucket table for a 262,144-piece
    /// vocabulary).
    #[test]
    fn pieces_differing_in_digits_spread_over_low_bits() {
        let n = 6000;
        let buckets: std::collections::HashSet<u64> = (0..n)
            .map(|i| {
                let mut h = FxHasher::default();
                h.write(format!("<unused{i}>").as_bytes());
                h.finish() & ((1 << 19) - 1)
            })
            .collect();
        // Uniform hashing into 2^19 buckets would leave about 6000 distinct ones.
        assert!(
            buckets.len() > n * 9 / 10,
            "{} buckets for {n} pieces",
            buckets.len()
        );
    }
}
