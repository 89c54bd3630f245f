//! [`XorShift`]: the deterministic generator the tests and benchmark examples draw random
//! weights, activations and mutations from (xorshift64; no dependency, same sequence on
//! every platform). Not for anything but test data.

/// Xorshift64 state; construct with a non-zero seed: `XorShift(seed)`.
#[derive(Debug, Clone)]
pub struct XorShift(pub u64);

impl XorShift {
    /// Next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// Uniform in [-1, 1), on a grid of 2^-23.
    pub fn f32(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }

    /// Uniform-ish in `0..n` (modulo bias is irrelevant for test data); `n` must be > 0.
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
}
