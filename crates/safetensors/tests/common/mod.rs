//! Shared by the integration tests: a builder for (possibly malformed) safetensors bytes and
//! a deterministic PRNG for mutation tests.

#![allow(dead_code)] // Each test binary uses a different subset.

/// Raw file: 8-byte header length, the header text, then `data`.
pub fn file_bytes(header: &str, data: &[u8]) -> Vec<u8> {
    let mut out = (header.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(header.as_bytes());
    out.extend_from_slice(data);
    out
}

/// A valid file: an F32 [2,3] tensor, a BF16 [4] tensor, an F16 scalar and metadata.
pub fn sample() -> Vec<u8> {
    let header = r#"{"__metadata__":{"format":"pt"},"a":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]},"b":{"dtype":"BF16","shape":[4],"data_offsets":[24,32]},"c":{"dtype":"F16","shape":[],"data_offsets":[32,34]}}"#;
    let data: Vec<u8> = (0..34u8).collect();
    file_bytes(header, &data)
}

/// xorshift64*: deterministic, no dependency.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}
