//! Element-wise and row-wise f32 operations of the forward pass: RMS norm, rotary position
//! embedding (both GGUF layouts), activations and softmax.
//!
//! Every op works in place on row-major f32 buffers and allocates nothing, so a decode step can
//! run them on scratch memory owned by the session. Reductions accumulate in f64: the oracle
//! (transformers in float32) is itself only float32-accurate, and the wider sum keeps our own
//! error well below its noise.

/// Applies RMS normalisation to each `w.len()`-wide row of `x`, scaling by `w`:
/// `y = x / sqrt(mean(x²) + eps) * w`.
///
/// `x.len()` must be a multiple of `w.len()`; a trailing partial row is left untouched.
pub fn rms_norm(x: &mut [f32], w: &[f32], eps: f32) {
    let dim = w.len();
    if dim == 0 {
        return;
    }
    for row in x.chunks_exact_mut(dim) {
        let ss = sum_squares_f64(row);
        let inv = (1.0 / (ss / dim as f64 + f64::from(eps)).sqrt()) as f32;
        for (v, &g) in row.iter_mut().zip(w) {
            *v = *v * inv * g;
        }
    }
}

/// `Σ v²` in f64 over eight interleaved partial sums: a single running f64 sum is one
/// dependent add per element (the compiler may not reorder it), which made the norms a
/// visible share of prefill; eight lanes vectorize and are at least as accurate.
fn sum_squares_f64(row: &[f32]) -> f64 {
    let mut acc = [0.0f64; 8];
    let chunks = row.chunks_exact(8);
    let rest = chunks.remainder();
    for c in chunks {
        for (a, &v) in acc.iter_mut().zip(c) {
            *a += f64::from(v) * f64::from(v);
        }
    }
    for (a, &v) in acc.iter_mut().zip(rest) {
        *a += f64::from(v) * f64::from(v);
    }
    ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]))
}

pub use ferrite_backend::RopeStyle;

/// Rotates every head of one token's row `x` (`n_head × head_dim` values) to position `pos`.
///
/// Pair `i` of a head turns by `pos · base^(-2i/head_dim)`. The angle is computed in f64 and
/// reused across heads, so no scratch memory is needed.
pub fn rope(x: &mut [f32], head_dim: usize, pos: usize, base: f32, style: RopeStyle) {
    rotate(x, head_dim, head_dim, pos, base, style, None);
}

/// [`rope`] of the first `rot_dim` values of each head (partial rotary: the rest pass
/// through, and the frequencies are those of a `rot_dim` head) with per-pair frequency
/// divisors (Llama 3 scaling): pair `i` turns by `pos · base^(-2i/rot_dim) / factors[i]`.
/// Dividing by 1 is exact, so factors of 1 give [`rope`]'s bits.
pub fn rope_scaled(
    x: &mut [f32],
    (head_dim, rot_dim): (usize, usize),
    pos: usize,
    base: f32,
    style: RopeStyle,
    factors: &[f32],
) {
    rotate(x, head_dim, rot_dim, pos, base, style, Some(factors));
}

/// The two members of pair `i` of a `rot_dim` rotation.
fn pair(style: RopeStyle, i: usize, half: usize) -> (usize, usize) {
    match style {
        RopeStyle::Interleaved => (2 * i, 2 * i + 1),
        RopeStyle::HalfSplit => (i, i + half),
    }
}

fn rotate(
    x: &mut [f32],
    head_dim: usize,
    rot_dim: usize,
    pos: usize,
    base: f32,
    style: RopeStyle,
    factors: Option<&[f32]>,
) {
    if rot_dim < 2 || rot_dim > head_dim {
        return;
    }
    let half = rot_dim / 2;
    for i in 0..half {
        let divisor = factors
            .and_then(|f| f.get(i))
            .map_or(1.0, |&f| f64::from(f));
        let inv_freq = f64::from(base).powf(-((2 * i) as f64) / rot_dim as f64) / divisor;
        let angle = pos as f64 * inv_freq;
        let (sin, cos) = (angle.sin() as f32, angle.cos() as f32);
        let (a, b) = pair(style, i, half);
        for head in x.chunks_exact_mut(head_dim) {
            let (x0, x1) = (head[a], head[b]);
            head[a] = x0 * cos - x1 * sin;
            head[b] = x0 * sin + x1 * cos;
        }
    }
}

/// The cosines and sines [`rope`] uses at the positions of the rows of one forward pass,
/// computed once per pass and rope base instead of once per layer and per Q/K row (the f64
/// `powf`/`sin`/`cos` were a tenth of Gemma 3's prefill).
#[derive(Debug, Clone, Default)]
pub struct RopeTable {
    base: f32,
    /// Rotated values per head.
    rot_dim: usize,
    rows: usize,
    /// Per row: `rot_dim / 2` cosines then `rot_dim / 2` sines.
    cs: Vec<f32>,
    /// `base^(-2i / rot_dim)` for each pair `i`.
    inv_freq: Vec<f64>,
}

impl RopeTable {
    /// Fills the table with one row per position of `positions`, in order (reusing its
    /// memory), for rotations of `rot_dim` values. Each value is exactly the one [`rope`]
    /// computes.
    pub fn fill(&mut self, rot_dim: usize, base: f32, positions: impl IntoIterator<Item = usize>) {
        let half = rot_dim / 2;
        self.inv_freq.clear();
        self.inv_freq
            .extend((0..half).map(|i| f64::from(base).powf(-((2 * i) as f64) / rot_dim as f64)));
        let inv_freq = &self.inv_freq;
        self.base = base;
        self.rot_dim = rot_dim;
        self.cs.clear();
        self.rows = 0;
        for pos in positions {
            for &f in inv_freq {
                self.cs.push((pos as f64 * f).cos() as f32);
            }
            for &f in inv_freq {
                self.cs.push((pos as f64 * f).sin() as f32);
            }
            self.rows += 1;
        }
    }

    /// Whether the table holds at least `rows` rows of `rot_dim` rotations for `base`.
    pub fn covers(&self, rot_dim: usize, base: f32, rows: usize) -> bool {
        self.base.to_bits() == base.to_bits() && self.rot_dim == rot_dim && self.rows >= rows
    }

    /// [`rope`] of the first rotated values of each `head_dim` head of one token's row `x`
    /// at table position `t` (absolute `pos0 + t`).
    pub fn apply(&self, x: &mut [f32], head_dim: usize, t: usize, style: RopeStyle) {
        let rd = self.rot_dim;
        if rd < 2 || rd > head_dim {
            return;
        }
        let half = rd / 2;
        let Some(row) = self.cs.get(t * 2 * half..(t + 1) * 2 * half) else {
            return;
        };
        let (cos, sin) = row.split_at(half);
        for head in x.chunks_exact_mut(head_dim) {
            for i in 0..half {
                let (a, b) = pair(style, i, half);
                let (x0, x1) = (head[a], head[b]);
                head[a] = x0 * cos[i] - x1 * sin[i];
                head[b] = x0 * sin[i] + x1 * cos[i];
            }
        }
    }
}

/// SiLU (swish): `x · sigmoid(x)`.
pub fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

/// GELU, tanh approximation (Gemma's `gelu_pytorch_tanh`).
pub fn gelu_tanh(x: f32) -> f32 {
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    0.5 * x * (1.0 + (SQRT_2_OVER_PI * (x + 0.044_715 * x * x * x)).tanh())
}

/// gpt-oss's clamped SwiGLU of one gate and up value ([`ferrite_backend::Act::SwigluOai`]).
pub fn swiglu_oai(gate: f32, up: f32) -> f32 {
    use ferrite_backend::Act;
    let limit = Act::SWIGLU_OAI_LIMIT;
    let g = gate.min(limit);
    g / (1.0 + (-Act::SWIGLU_OAI_ALPHA * g).exp()) * (up.clamp(-limit, limit) + 1.0)
}

/// `act(gate) · up` for one pair, the scalar form of each activation.
pub fn gated_scalar(act: ferrite_backend::Act) -> fn(f32, f32) -> f32 {
    use ferrite_backend::Act;
    match act {
        Act::Silu => |g, u| silu(g) * u,
        Act::GeluTanh => |g, u| gelu_tanh(g) * u,
        Act::SwigluOai => swiglu_oai,
        Act::Sigmoid => |g, u| sigmoid(g) * u,
    }
}

/// `1 / (1 + e^-x)`.
pub fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// Adds `b` to every `b.len()`-value row of `x` (whose length is a multiple of it).
pub fn add_rows(x: &mut [f32], b: &[f32]) {
    for row in x.chunks_exact_mut(b.len().max(1)) {
        add_assign(row, b);
    }
}

/// Replaces `x` by its softmax. An empty slice is left alone.
pub fn softmax(x: &mut [f32]) {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0.0f64;
    for v in x.iter_mut() {
        *v = (*v - max).exp();
        sum += f64::from(*v);
    }
    let inv = (1.0 / sum) as f32;
    for v in x.iter_mut() {
        *v *= inv;
    }
}

/// `x += y`, element by element.
pub fn add_assign(x: &mut [f32], y: &[f32]) {
    for (a, &b) in x.iter_mut().zip(y) {
        *a += b;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f32, b: f64, tol: f64) -> bool {
        (f64::from(a) - b).abs() <= tol * (1.0 + b.abs())
    }

    #[test]
    fn rms_norm_matches_f64_formula() {
        let mut x: Vec<f32> = (0..12).map(|i| (i as f32 - 5.5) * 0.37).collect();
        let w: Vec<f32> = (0..6).map(|i| 0.5 + i as f32 * 0.25).collect();
        let orig = x.clone();
        rms_norm(&mut x, &w, 1e-5);
        for r in 0..2 {
            let row = &orig[r * 6..r * 6 + 6];
            let ms: f64 = row.iter().map(|&v| f64::from(v).powi(2)).sum::<f64>() / 6.0;
            for c in 0..6 {
                let want = f64::from(row[c]) / (ms + 1e-5).sqrt() * f64::from(w[c]);
                assert!(close(x[r * 6 + c], want, 1e-6), "{r},{c}");
            }
        }
    }

    #[test]
    fn rms_norm_of_long_odd_rows_matches_f64() {
        // 2 rows of 77: eight partial sums plus a remainder of 5.
        let mut x: Vec<f32> = (0..154)
            .map(|i| ((i * 31 % 17) as f32 - 8.0) * 0.7)
            .collect();
        let w: Vec<f32> = (0..77).map(|i| 1.0 + i as f32 * 0.01).collect();
        let orig = x.clone();
        rms_norm(&mut x, &w, 1e-6);
        for r in 0..2 {
            let row = &orig[r * 77..(r + 1) * 77];
            let ms = row.iter().map(|&v| f64::from(v).powi(2)).sum::<f64>() / 77.0;
            for c in 0..77 {
                let want = f64::from(row[c]) / (ms + 1e-6).sqrt() * f64::from(w[c]);
                assert!(close(x[r * 77 + c], want, 1e-6), "{r},{c}");
            }
        }
    }

    #[test]
    fn rope_rotates_the_documented_pairs() {
        // Two heads of dim 4 at position 3, base 100: naive rotation of each pair.
        let orig: Vec<f32> = (0..8).map(|i| i as f32 + 1.0).collect();
        for style in [RopeStyle::Interleaved, RopeStyle::HalfSplit] {
            let mut x = orig.clone();
            rope(&mut x, 4, 3, 100.0, style);
            for h in 0..2 {
                for i in 0..2 {
                    let th = 3.0 * 100f64.powf(-(2.0 * i as f64) / 4.0);
                    let (a, b) = match style {
                        RopeStyle::Interleaved => (2 * i, 2 * i + 1),
                        RopeStyle::HalfSplit => (i, i + 2),
                    };
                    let (x0, x1) = (f64::from(orig[h * 4 + a]), f64::from(orig[h * 4 + b]));
                    assert!(close(x[h * 4 + a], x0 * th.cos() - x1 * th.sin(), 1e-6));
                    assert!(close(x[h * 4 + b], x0 * th.sin() + x1 * th.cos(), 1e-6));
                }
            }
        }
    }

    #[test]
    fn rope_table_gives_the_bits_of_rope() {
        let orig: Vec<f32> = (0..24).map(|i| (i as f32 - 11.0) * 0.31).collect();
        for style in [RopeStyle::Interleaved, RopeStyle::HalfSplit] {
            let mut table = RopeTable::default();
            table.fill(8, 1e4, 37..42);
            assert!(
                table.covers(8, 1e4, 5) && !table.covers(8, 1e6, 5) && !table.covers(8, 1e4, 6)
            );
            for t in 0..5 {
                let (mut a, mut b) = (orig.clone(), orig.clone());
                rope(&mut a, 8, 37 + t, 1e4, style);
                table.apply(&mut b, 8, t, style);
                assert_eq!(a, b, "{style:?} t={t}");
            }
            // Test of the test: one position off must differ.
            let (mut a, mut b) = (orig.clone(), orig.clone());
            rope(&mut a, 8, 38, 1e4, style);
            table.apply(&mut b, 8, 0, style);
            assert_ne!(a, b);
        }
    }

    #[test]
    fn rope_at_position_zero_is_identity() {
        let orig: Vec<f32> = (0..16).map(|i| i as f32 * 0.1).collect();
        let mut x = orig.clone();
        rope(&mut x, 8, 0, 10000.0, RopeStyle::HalfSplit);
        assert_eq!(x, orig);
    }

    #[test]
    fn activations_match_formulas() {
        for &v in &[-6.0f32, -1.5, -0.1, 0.0, 0.3, 2.0, 7.0] {
            let x = f64::from(v);
            assert!(close(silu(v), x / (1.0 + (-x).exp()), 1e-6));
            let g = 0.5
                * x
                * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x.powi(3))).tanh());
            assert!(close(gelu_tanh(v), g, 1e-6));
        }
    }

    #[test]
    fn softmax_sums_to_one_and_survives_large_logits() {
        let mut x = vec![1000.0f32, 1001.0, 999.0, f32::NEG_INFINITY];
        softmax(&mut x);
        assert!(x.iter().all(|v| v.is_finite()));
        assert!((x.iter().sum::<f32>() - 1.0).abs() < 1e-6);
        assert_eq!(x[3], 0.0);
        let e = [(-1.0f64).exp(), 1.0, (-2.0f64).exp()];
        let s: f64 = e.iter().sum();
        for i in 0..3 {
            assert!(close(x[i], e[i] / s, 1e-6));
        }
    }

    #[test]
    fn rope_scaled_divides_each_pair_frequency() {
        let orig: Vec<f32> = (0..16).map(|i| (i as f32 - 7.5) * 0.3).collect();
        for style in [RopeStyle::Interleaved, RopeStyle::HalfSplit] {
            // Unit factors: exactly plain rope.
            let (mut a, mut b) = (orig.clone(), orig.clone());
            rope(&mut a, 8, 5, 500.0, style);
            rope_scaled(&mut b, (8, 8), 5, 500.0, style, &[1.0; 4]);
            assert_eq!(a, b);
            // Factor f on pair i at position p turns like position p / f.
            let mut c = orig.clone();
            rope_scaled(&mut c, (8, 8), 6, 500.0, style, &[2.0; 4]);
            let mut d = orig.clone();
            rope(&mut d, 8, 3, 500.0, style);
            for (x, y) in c.iter().zip(&d) {
                assert!((x - y).abs() < 1e-6, "{style:?}: {x} vs {y}");
            }
        }
    }

    /// Partial rotary (GLM-4.5): the first `rot_dim` values of each head turn as a head of
    /// that size would; the rest pass through; the table gives the same bits.
    #[test]
    fn partial_rope_turns_the_first_values_of_each_head() {
        let orig: Vec<f32> = (0..32).map(|i| (i as f32 - 15.5) * 0.2).collect();
        for style in [RopeStyle::Interleaved, RopeStyle::HalfSplit] {
            let mut got = orig.clone();
            rope_scaled(&mut got, (16, 8), 7, 1e4, style, &[1.0; 4]);
            let mut want = orig.clone();
            for head in want.chunks_exact_mut(16) {
                rope(&mut head[..8], 8, 7, 1e4, style);
            }
            assert_eq!(got, want, "{style:?}");
            let mut table = RopeTable::default();
            table.fill(8, 1e4, [3, 7]);
            let mut t = orig.clone();
            table.apply(&mut t, 16, 1, style);
            assert_eq!(t, want, "{style:?}");
        }
    }
}
