//! Vectorized element-wise math of the forward pass: the gated activations (GELU-tanh, SiLU)
//! and softmax, dispatched by [`SimdLevel`]; and the log-sum-exp of a row of logits that
//! sampling and scoring take once per token.
//!
//! Why: libm's `tanhf`/`expf` are scalar calls; in Gemma 3 prefill the GELU alone took ~15 %
//! of the time. The SIMD levels share one exponential, `exp(x) = 2^n · p(r)` with
//! `n = round(x / ln 2)`, `r = x - n ln 2` (two-part ln 2, so `r` is exact to a few ulps)
//! and `p` the degree-7 Taylor polynomial of `e^r` on `|r| ≤ ln2/2` (truncation error
//! below 6e-9, a tenth of an ulp). Both activations are written as `x / (1 + e^{-z})`:
//! GELU-tanh is `0.5·x·(1 + tanh(u)) = x / (1 + e^{-2u})`, which has no cancellation for
//! negative `x` (libm's form loses bits there), and SiLU is the same with `z = x`.
//!
//! Every element is computed by the same instruction sequence wherever it sits in the slice
//! (the tails go through masked or padded vectors), so results do not depend on how a
//! caller splits a slice between threads. The scalar level is the libm formula itself.

use crate::{QuantError, SimdLevel};

use super::check_level;

/// `sqrt(2 / pi)`, the GELU-tanh inner scale.
const SQRT_2_OVER_PI: f32 = 0.797_884_6;
/// The cubic coefficient of GELU-tanh.
const GELU_CUBIC: f32 = 0.044_715;

/// GELU, tanh approximation, with libm (the scalar level's definition).
pub fn gelu_tanh_ref(x: f32) -> f32 {
    0.5 * x * (1.0 + (SQRT_2_OVER_PI * (x + GELU_CUBIC * x * x * x)).tanh())
}

/// SiLU `x · sigmoid(x)` with libm (the scalar level's definition).
pub fn silu_ref(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

/// The gated activation of a feed-forward block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GatedAct {
    /// GELU with the tanh approximation (Gemma).
    GeluTanh,
    /// SiLU / swish (llama).
    Silu,
}

/// `gate[i] = act(gate[i]) * up[i]` over the shorter of the two slices.
pub fn gated_act(
    level: SimdLevel,
    act: GatedAct,
    gate: &mut [f32],
    up: &[f32],
) -> Result<(), QuantError> {
    check_level(level)?;
    let n = gate.len().min(up.len());
    let (gate, up) = (&mut gate[..n], &up[..n]);
    match level {
        SimdLevel::Scalar => {
            let f = match act {
                GatedAct::GeluTanh => gelu_tanh_ref,
                GatedAct::Silu => silu_ref,
            };
            for (g, &u) in gate.iter_mut().zip(up) {
                *g = f(*g) * u;
            }
        }
        #[cfg(target_arch = "x86_64")]
        // SAFETY: check_level proved the CPU has AVX2, FMA and F16C; both slices hold n.
        SimdLevel::Avx2 => unsafe { x86::gated_avx2(act, gate, up) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: check_level proved the CPU has the AVX-512 set; both slices hold n.
        SimdLevel::Avx512 => unsafe { x86::gated_avx512(act, gate, up) },
        #[cfg(not(target_arch = "x86_64"))]
        _ => return gated_act(SimdLevel::Scalar, act, gate, up),
    }
    Ok(())
}

/// Replaces `x` by `softmax(scale · x)`; an empty slice is left alone. A `-inf` entry gets
/// probability 0.
pub fn softmax_scaled(level: SimdLevel, scale: f32, x: &mut [f32]) -> Result<(), QuantError> {
    check_level(level)?;
    if x.is_empty() {
        return Ok(());
    }
    match level {
        SimdLevel::Scalar => softmax_ref(scale, x),
        #[cfg(target_arch = "x86_64")]
        // SAFETY: check_level proved the CPU has AVX2, FMA and F16C.
        SimdLevel::Avx2 => unsafe { x86::softmax_avx2(scale, x) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: check_level proved the CPU has the AVX-512 set.
        SimdLevel::Avx512 => unsafe { x86::softmax_avx512(scale, x) },
        #[cfg(not(target_arch = "x86_64"))]
        _ => softmax_ref(scale, x),
    }
    Ok(())
}

/// `log(Σ exp(x_i))`, stable for large values: the log-partition of a row of logits (a
/// sampler's log-probabilities, a score's NLL). NaN where an entry is NaN, `-inf` for an
/// empty slice.
///
/// The scalar level is the definition in f64 ([`log_sum_exp_ref`]: libm `exp` of each
/// `x_i - max` in f64, summed in f64). The vector levels (AVX-512 runs the AVX2 body) take
/// each `exp(x_i - max)` in f32 with the module's exponential, with `x_i - max` rounded to
/// f32, and sum eight lanes in f32 over chunks of `LSE_CHUNK` (64) values, each chunk's lanes
/// then added in f64. Error against the definition, absolute (it is the log of a sum of
/// terms of at most 1, so each term's relative error is what counts): the exponential's few
/// ulp, the f32 subtraction's `2^-24 · |x_i - max|` weighted by the terms (below
/// `2^-24 · ln n` in the worst case, since the largest term is 1), and the chunk sums'
/// `8 · 2^-24`: under 2e-6 for a 262,144-entry vocabulary; 2.9e-8 measured on the tests'
/// rows (AVX2, Zen 3), against 1.7e-5 when the f32 lane sums ran over the whole row. libm's
/// f64 `exp` over a 262k vocabulary took ~1.9 ms per Gemma 3 token on a 2-core Zen 3.
pub fn log_sum_exp(level: SimdLevel, x: &[f32]) -> Result<f64, QuantError> {
    check_level(level)?;
    Ok(match level {
        SimdLevel::Scalar => log_sum_exp_ref(x),
        #[cfg(target_arch = "x86_64")]
        // SAFETY: check_level proved the CPU has AVX2, FMA and F16C (the AVX-512 set
        // includes them).
        SimdLevel::Avx2 | SimdLevel::Avx512 => unsafe { x86::log_sum_exp_avx2(x) },
        #[cfg(not(target_arch = "x86_64"))]
        _ => log_sum_exp_ref(x),
    })
}

/// Values whose f32 lane sums are added in f64 at a time in [`log_sum_exp`]: eight per lane.
const LSE_CHUNK: usize = 64;

/// [`log_sum_exp`]'s definition: f64 throughout, libm `exp`.
pub fn log_sum_exp_ref(x: &[f32]) -> f64 {
    let max = f64::from(x.iter().copied().fold(f32::NEG_INFINITY, f32::max));
    let s: f64 = x.iter().map(|&l| (f64::from(l) - max).exp()).sum();
    max + s.ln()
}

/// Scalar softmax with libm `exp` and an f64 sum.
fn softmax_ref(scale: f32, x: &mut [f32]) {
    x.iter_mut().for_each(|v| *v *= scale);
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0.0f64;
    for v in x.iter_mut() {
        *v = (*v - max).exp();
        sum += f64::from(*v);
    }
    let inv = (1.0 / sum) as f32;
    x.iter_mut().for_each(|v| *v *= inv);
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    //! The AVX2 and AVX-512 bodies. Each `exp` is the algorithm of the module docs.

    use std::arch::x86_64::*;

    use super::{GELU_CUBIC, GatedAct, SQRT_2_OVER_PI};

    const LOG2E: f32 = std::f32::consts::LOG2_E;
    /// ln 2 split in two: the high part has few mantissa bits, so `n · LN2_HI` is exact.
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    /// Taylor coefficients 1/7! .. 1/2!.
    const C7: f32 = 1.0 / 5040.0;
    const C6: f32 = 1.0 / 720.0;
    const C5: f32 = 1.0 / 120.0;
    const C4: f32 = 1.0 / 24.0;
    const C3: f32 = 1.0 / 6.0;
    const C2: f32 = 0.5;

    macro_rules! exp_poly {
        ($set1:ident, $fma:ident, $r:expr) => {{
            let r = $r;
            let mut p = $fma($set1(C7), r, $set1(C6));
            p = $fma(p, r, $set1(C5));
            p = $fma(p, r, $set1(C4));
            p = $fma(p, r, $set1(C3));
            p = $fma(p, r, $set1(C2));
            p = $fma(p, r, $set1(1.0));
            $fma(p, r, $set1(1.0))
        }};
    }

    /// `e^x` lane-wise (AVX-512): `scalef` applies `2^n` with correct overflow to `inf`
    /// and underflow through the subnormals to 0. NaN propagates (the clamps keep it).
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    fn exp512(x: __m512) -> __m512 {
        // max/min return their second operand when either is NaN, so NaN passes through.
        let x = _mm512_min_ps(
            _mm512_set1_ps(89.0),
            _mm512_max_ps(_mm512_set1_ps(-104.0), x),
        );
        let n = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
            _mm512_mul_ps(x, _mm512_set1_ps(LOG2E)),
        );
        let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(LN2_HI), x);
        let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(LN2_LO), r);
        let p = exp_poly!(_mm512_set1_ps, _mm512_fmadd_ps, r);
        _mm512_scalef_ps(p, n)
    }

    /// `e^x` lane-wise (AVX2). Inputs are clamped to [-87.3, 88.3] so `2^n` is a normal
    /// number built from its exponent bits: results below `e^-87.3` come out as about
    /// 1.2e-38 instead of smaller, which no caller can tell from 0 after its own rounding.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn exp256(x: __m256) -> __m256 {
        let x = _mm256_min_ps(
            _mm256_set1_ps(88.3),
            _mm256_max_ps(_mm256_set1_ps(-87.3), x),
        );
        let n = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
            _mm256_mul_ps(x, _mm256_set1_ps(LOG2E)),
        );
        let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(LN2_HI), x);
        let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(LN2_LO), r);
        let p = exp_poly!(_mm256_set1_ps, _mm256_fmadd_ps, r);
        let bits = _mm256_slli_epi32::<23>(_mm256_add_epi32(
            _mm256_cvtps_epi32(n),
            _mm256_set1_epi32(127),
        ));
        _mm256_mul_ps(p, _mm256_castsi256_ps(bits))
    }

    /// `act(g) * u` lane-wise (AVX-512).
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    fn act512(act: GatedAct, g: __m512, u: __m512) -> __m512 {
        let z = match act {
            GatedAct::GeluTanh => {
                // -2u with u = c (x + a x^3) = c x (1 + a x^2).
                let x2 = _mm512_mul_ps(g, g);
                let inner = _mm512_fmadd_ps(_mm512_set1_ps(GELU_CUBIC), x2, _mm512_set1_ps(1.0));
                _mm512_mul_ps(
                    _mm512_mul_ps(g, _mm512_set1_ps(-2.0 * SQRT_2_OVER_PI)),
                    inner,
                )
            }
            GatedAct::Silu => _mm512_sub_ps(_mm512_setzero_ps(), g),
        };
        let den = _mm512_add_ps(_mm512_set1_ps(1.0), exp512(z));
        _mm512_mul_ps(_mm512_div_ps(g, den), u)
    }

    /// `act(g) * u` lane-wise (AVX2).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn act256(act: GatedAct, g: __m256, u: __m256) -> __m256 {
        let z = match act {
            GatedAct::GeluTanh => {
                let x2 = _mm256_mul_ps(g, g);
                let inner = _mm256_fmadd_ps(_mm256_set1_ps(GELU_CUBIC), x2, _mm256_set1_ps(1.0));
                _mm256_mul_ps(
                    _mm256_mul_ps(g, _mm256_set1_ps(-2.0 * SQRT_2_OVER_PI)),
                    inner,
                )
            }
            GatedAct::Silu => _mm256_sub_ps(_mm256_setzero_ps(), g),
        };
        let den = _mm256_add_ps(_mm256_set1_ps(1.0), exp256(z));
        _mm256_mul_ps(_mm256_div_ps(g, den), u)
    }

    /// Lane mask of the first `n` (< 16) lanes.
    #[inline]
    fn mask16(n: usize) -> __mmask16 {
        ((1u32 << n) - 1) as __mmask16
    }

    /// # Safety
    /// AVX-512 available; `gate.len() == up.len()`.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    pub(super) unsafe fn gated_avx512(act: GatedAct, gate: &mut [f32], up: &[f32]) {
        let n = gate.len();
        let (gp, upp) = (gate.as_mut_ptr(), up.as_ptr());
        let mut i = 0;
        while i + 16 <= n {
            // SAFETY: i + 16 <= n, the length of both slices.
            unsafe {
                let r = act512(act, _mm512_loadu_ps(gp.add(i)), _mm512_loadu_ps(upp.add(i)));
                _mm512_storeu_ps(gp.add(i), r);
            }
            i += 16;
        }
        if i < n {
            let m = mask16(n - i);
            // SAFETY: masked lanes beyond n are neither read nor written.
            unsafe {
                let g = _mm512_maskz_loadu_ps(m, gp.add(i));
                let u = _mm512_maskz_loadu_ps(m, upp.add(i));
                _mm512_mask_storeu_ps(gp.add(i), m, act512(act, g, u));
            }
        }
    }

    /// # Safety
    /// AVX2, FMA and F16C available; `gate.len() == up.len()`.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn gated_avx2(act: GatedAct, gate: &mut [f32], up: &[f32]) {
        let n = gate.len();
        let mut i = 0;
        while i + 8 <= n {
            // SAFETY: i + 8 <= n, the length of both slices.
            unsafe {
                let g = _mm256_loadu_ps(gate.as_ptr().add(i));
                let u = _mm256_loadu_ps(up.as_ptr().add(i));
                _mm256_storeu_ps(gate.as_mut_ptr().add(i), act256(act, g, u));
            }
            i += 8;
        }
        if i < n {
            // The tail goes through a padded vector: the same instructions per element.
            let (mut g, mut u) = ([0f32; 8], [0f32; 8]);
            g[..n - i].copy_from_slice(&gate[i..]);
            u[..n - i].copy_from_slice(&up[i..]);
            // SAFETY: both buffers hold 8 values.
            unsafe {
                let r = act256(
                    act,
                    _mm256_loadu_ps(g.as_ptr()),
                    _mm256_loadu_ps(u.as_ptr()),
                );
                _mm256_storeu_ps(g.as_mut_ptr(), r);
            }
            gate[i..].copy_from_slice(&g[..n - i]);
        }
    }

    /// # Safety
    /// AVX-512 available.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    pub(super) unsafe fn softmax_avx512(scale: f32, x: &mut [f32]) {
        let n = x.len();
        let p = x.as_mut_ptr();
        let sc = _mm512_set1_ps(scale);
        let full = n - n % 16;
        let tail = mask16(n % 16);
        let mut mx = _mm512_set1_ps(f32::NEG_INFINITY);
        let mut i = 0;
        while i < full {
            // SAFETY: i + 16 <= full <= n.
            mx = _mm512_max_ps(mx, _mm512_mul_ps(sc, unsafe { _mm512_loadu_ps(p.add(i)) }));
            i += 16;
        }
        if full < n {
            // SAFETY: masked lanes past n are not read.
            let v = unsafe {
                _mm512_mask_loadu_ps(_mm512_set1_ps(f32::NEG_INFINITY), tail, p.add(full))
            };
            mx = _mm512_max_ps(mx, _mm512_mul_ps(sc, v));
        }
        let mxv = _mm512_set1_ps(_mm512_reduce_max_ps(mx));
        let mut sum = _mm512_setzero_ps();
        i = 0;
        while i < full {
            // SAFETY: i + 16 <= full <= n.
            unsafe {
                let e = exp512(_mm512_fmsub_ps(sc, _mm512_loadu_ps(p.add(i)), mxv));
                _mm512_storeu_ps(p.add(i), e);
                sum = _mm512_add_ps(sum, e);
            }
            i += 16;
        }
        if full < n {
            // SAFETY: masked lanes past n are neither read nor written.
            unsafe {
                let v = _mm512_maskz_loadu_ps(tail, p.add(full));
                let e = _mm512_maskz_mov_ps(tail, exp512(_mm512_fmsub_ps(sc, v, mxv)));
                _mm512_mask_storeu_ps(p.add(full), tail, e);
                sum = _mm512_add_ps(sum, e);
            }
        }
        let inv = _mm512_set1_ps(1.0 / super::super::avx512::hsum(sum));
        i = 0;
        while i < full {
            // SAFETY: i + 16 <= full <= n.
            unsafe { _mm512_storeu_ps(p.add(i), _mm512_mul_ps(inv, _mm512_loadu_ps(p.add(i)))) };
            i += 16;
        }
        if full < n {
            // SAFETY: masked lanes past n are neither read nor written.
            unsafe {
                let v = _mm512_maskz_loadu_ps(tail, p.add(full));
                _mm512_mask_storeu_ps(p.add(full), tail, _mm512_mul_ps(inv, v));
            }
        }
    }

    /// `super::log_sum_exp` at the vector levels (its docs give the order and the bound).
    ///
    /// # Safety
    /// AVX2, FMA and F16C available.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn log_sum_exp_avx2(x: &[f32]) -> f64 {
        let n = x.len();
        let full = n - n % 8;
        let p = x.as_ptr();
        // max_ps returns its second operand when the first is NaN: NaN entries are passed
        // over, as f32::max does.
        let mut mx = _mm256_set1_ps(f32::NEG_INFINITY);
        let mut i = 0;
        while i < full {
            // SAFETY: i + 8 <= full <= n.
            mx = _mm256_max_ps(unsafe { _mm256_loadu_ps(p.add(i)) }, mx);
            i += 8;
        }
        let mut lanes = [0f32; 8];
        // SAFETY: lanes holds 8 values.
        unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), mx) };
        let max = lanes
            .iter()
            .chain(&x[full..])
            .fold(f32::NEG_INFINITY, |m, &v| m.max(v));
        let shift = _mm256_set1_ps(max);
        let mut total = [_mm256_setzero_pd(); 2];
        i = 0;
        while i < full {
            let end = (i + super::LSE_CHUNK).min(full);
            let mut acc = _mm256_setzero_ps();
            while i < end {
                // SAFETY: i + 8 <= end <= full <= n.
                let v = unsafe { _mm256_loadu_ps(p.add(i)) };
                acc = _mm256_add_ps(acc, exp256(_mm256_sub_ps(v, shift)));
                i += 8;
            }
            total[0] = _mm256_add_pd(total[0], _mm256_cvtps_pd(_mm256_castps256_ps128(acc)));
            total[1] = _mm256_add_pd(total[1], _mm256_cvtps_pd(_mm256_extractf128_ps::<1>(acc)));
        }
        let mut sums = [0f64; 8];
        // SAFETY: sums holds 8 values, two vectors of four.
        unsafe {
            _mm256_storeu_pd(sums.as_mut_ptr(), total[0]);
            _mm256_storeu_pd(sums.as_mut_ptr().add(4), total[1]);
        }
        let mut sum: f64 = sums.iter().sum();
        if full < n {
            let mut t = [f32::NEG_INFINITY; 8];
            t[..n - full].copy_from_slice(&x[full..]);
            // SAFETY: t holds 8 values.
            unsafe {
                let e = exp256(_mm256_sub_ps(_mm256_loadu_ps(t.as_ptr()), shift));
                _mm256_storeu_ps(t.as_mut_ptr(), e);
            }
            // -inf padding lanes come out as ~1e-38 from the clamp: add only real lanes.
            sum += t[..n - full].iter().map(|&e| f64::from(e)).sum::<f64>();
        }
        f64::from(max) + sum.ln()
    }

    /// # Safety
    /// AVX2, FMA and F16C available.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn softmax_avx2(scale: f32, x: &mut [f32]) {
        let mx = x.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(scale * v));
        let mxv = _mm256_set1_ps(mx);
        let sc = _mm256_set1_ps(scale);
        let n = x.len();
        let full = n - n % 8;
        let mut sum = _mm256_setzero_ps();
        let mut i = 0;
        while i < full {
            // SAFETY: i + 8 <= full <= n.
            unsafe {
                let e = exp256(_mm256_fmsub_ps(sc, _mm256_loadu_ps(x.as_ptr().add(i)), mxv));
                _mm256_storeu_ps(x.as_mut_ptr().add(i), e);
                sum = _mm256_add_ps(sum, e);
            }
            i += 8;
        }
        let mut lanes = [0f32; 8];
        // SAFETY: lanes holds 8 values.
        unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), sum) };
        let mut total: f32 = lanes.iter().sum();
        if full < n {
            let mut t = [f32::NEG_INFINITY; 8];
            t[..n - full].copy_from_slice(&x[full..]);
            // SAFETY: t holds 8 values.
            unsafe {
                let e = exp256(_mm256_fmsub_ps(sc, _mm256_loadu_ps(t.as_ptr()), mxv));
                _mm256_storeu_ps(t.as_mut_ptr(), e);
            }
            // -inf padding lanes come out as ~1e-38 from the clamp: add only real lanes.
            total += t[..n - full].iter().sum::<f32>();
            x[full..].copy_from_slice(&t[..n - full]);
        }
        let inv = 1.0 / total;
        x.iter_mut().for_each(|v| *v *= inv);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `0.5 x (1 + tanh u)` written as `x / (1 + e^{-2u})`: even f64 loses everything to
    /// cancellation in the first form once `tanh u` rounds to -1.
    fn gelu_f64(x: f64) -> f64 {
        let u = (2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x.powi(3));
        x / (1.0 + (-2.0 * u).exp())
    }

    fn silu_f64(x: f64) -> f64 {
        x / (1.0 + (-x).exp())
    }

    fn levels() -> Vec<SimdLevel> {
        [SimdLevel::Scalar, SimdLevel::Avx2, SimdLevel::Avx512]
            .into_iter()
            .filter(|l| l.is_available())
            .collect()
    }

    /// A dense sweep over [-12, 12] plus values where the clamps and limits act.
    fn inputs() -> Vec<f32> {
        let mut v: Vec<f32> = (-24_000..=24_000).map(|i| i as f32 * 5e-4).collect();
        v.extend([
            -200.0, -90.0, -40.0, -1e-30, 0.0, 1e-30, 40.0, 90.0, 200.0, 1e30,
        ]);
        v
    }

    /// Largest error of `got` against `want` beyond the absolute allowance `floor`, in
    /// units of `1e-7 · |want| · (1 + |z|)`, where `z` is the exponent `e^{-z}` is taken of
    /// (`zs`): `e^z` turns the unavoidable f32 rounding of `z` into a relative error of
    /// `|z|` ulps, libm or not.
    fn worst(got: &[f32], want: &[f64], zs: &[f64], floor: f64) -> f64 {
        got.iter()
            .zip(want)
            .zip(zs)
            .map(|((&g, &w), &z)| {
                assert!(g.is_finite() == w.is_finite(), "{g} vs {w}");
                ((f64::from(g) - w).abs() - floor).max(0.0)
                    / (1e-7 * w.abs() * (1.0 + z.abs()) + 1e-37)
            })
            .fold(0.0, f64::max)
    }

    /// The exponent of each activation's `e^{-z}` at `x`.
    fn exponent(act: GatedAct, x: f32) -> f64 {
        let x = f64::from(x);
        match act {
            GatedAct::GeluTanh => {
                2.0 * (2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x.powi(3))
            }
            GatedAct::Silu => x,
        }
    }

    #[test]
    fn activations_match_f64_within_a_few_ulp_at_every_level() {
        let x = inputs();
        // up = 1 isolates the activation; odd length exercises every tail path.
        let up = vec![1.0f32; x.len()];
        for level in levels() {
            for (act, f) in [
                (GatedAct::GeluTanh, gelu_f64 as fn(f64) -> f64),
                (GatedAct::Silu, silu_f64),
            ] {
                let mut g = x.clone();
                gated_act(level, act, &mut g, &up).unwrap();
                let want: Vec<f64> = x.iter().map(|&v| f(f64::from(v))).collect();
                // libm's tanh form loses bits for negative x (1 + tanh cancels, up to
                // ~4e-7 absolute on this range): the scalar level gets an absolute
                // allowance. The SIMD form has no cancellation; its only allowance is for
                // the clamped far tail (|true value| < 1e-30).
                let floor = if level == SimdLevel::Scalar {
                    1e-6
                } else {
                    1e-30
                };
                let zs: Vec<f64> = x.iter().map(|&v| exponent(act, v)).collect();
                let w = worst(&g, &want, &zs, floor);
                println!("{level} {act:?}: worst error {w:.2} x 1e-7 relative");
                assert!(w < 6.0, "{level} {act:?}: {w}");
            }
        }
    }

    #[test]
    fn simd_activations_stay_close_to_libm_and_multiply_by_up() {
        let x = inputs();
        let up: Vec<f32> = (0..x.len()).map(|i| 0.5 + (i % 7) as f32).collect();
        for level in levels() {
            for act in [GatedAct::GeluTanh, GatedAct::Silu] {
                let mut simd = x.clone();
                gated_act(level, act, &mut simd, &up).unwrap();
                let mut libm = x.clone();
                gated_act(SimdLevel::Scalar, act, &mut libm, &up).unwrap();
                for (i, (&a, &b)) in simd.iter().zip(&libm).enumerate() {
                    let tol = 1e-6 * b.abs() + 1e-6 * up[i];
                    assert!(
                        (a - b).abs() <= tol,
                        "{level} {act:?} at x={}: {a} vs {b}",
                        x[i]
                    );
                }
            }
        }
    }

    #[test]
    fn elements_do_not_depend_on_their_place_in_the_slice() {
        // Thread splits and decode (one row) vs prefill (many rows) cut the slice anywhere:
        // every piece must give the same bits as the whole.
        let x: Vec<f32> = (0..77).map(|i| (i as f32 - 38.0) * 0.173).collect();
        let up: Vec<f32> = (0..77).map(|i| 1.0 + i as f32 * 0.01).collect();
        for level in levels() {
            let mut whole = x.clone();
            gated_act(level, GatedAct::GeluTanh, &mut whole, &up).unwrap();
            for cut in [1, 5, 16, 17, 40] {
                let mut parts = x.clone();
                let (a, b) = parts.split_at_mut(cut);
                gated_act(level, GatedAct::GeluTanh, a, &up[..cut]).unwrap();
                gated_act(level, GatedAct::GeluTanh, b, &up[cut..]).unwrap();
                assert_eq!(parts, whole, "{level} cut {cut}");
            }
        }
    }

    #[test]
    fn nan_propagates() {
        for level in levels() {
            let mut g = [f32::NAN, 1.0];
            gated_act(level, GatedAct::GeluTanh, &mut g, &[1.0, 1.0]).unwrap();
            assert!(g[0].is_nan() && g[1].is_finite(), "{level}");
        }
    }

    #[test]
    fn error_bound_catches_a_planted_defect() {
        // Test of the test: a GELU with the wrong cubic coefficient (0.0447 instead of
        // 0.044715) must fail the bound used above.
        let x = inputs();
        let bad: Vec<f32> = x
            .iter()
            .map(|&v| 0.5 * v * (1.0 + (SQRT_2_OVER_PI * (v + 0.0447 * v * v * v)).tanh()))
            .collect();
        let want: Vec<f64> = x.iter().map(|&v| gelu_f64(f64::from(v))).collect();
        let zs: Vec<f64> = x.iter().map(|&v| exponent(GatedAct::GeluTanh, v)).collect();
        assert!(worst(&bad, &want, &zs, 1e-30) > 6.0);
    }

    fn softmax_f64(scale: f32, x: &[f32]) -> Vec<f64> {
        let s: Vec<f64> = x.iter().map(|&v| f64::from(scale) * f64::from(v)).collect();
        let m = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let z: f64 = s.iter().map(|v| (v - m).exp()).sum();
        s.iter().map(|v| (v - m).exp() / z).collect()
    }

    #[test]
    fn softmax_matches_f64_at_every_level_and_length() {
        for level in levels() {
            for n in [1usize, 2, 7, 16, 17, 33, 100, 515] {
                let x: Vec<f32> = (0..n).map(|i| ((i * 37) % 23) as f32 * 0.9 - 9.0).collect();
                let mut got = x.clone();
                softmax_scaled(level, 0.7, &mut got).unwrap();
                let want = softmax_f64(0.7, &x);
                for (i, (&g, &w)) in got.iter().zip(&want).enumerate() {
                    assert!(
                        (f64::from(g) - w).abs() <= 1e-6 * w + 1e-9,
                        "{level} n={n} i={i}: {g} vs {w}"
                    );
                }
            }
        }
    }

    /// Logit rows: a vocabulary-sized spread, a peaked head, ties, large offsets, short
    /// rows that end in a partial vector and rows with masked (-inf) entries.
    fn lse_rows() -> Vec<Vec<f32>> {
        let mut rng = ferrite_testkit::XorShift(0x1e5e);
        let vocab: Vec<f32> = (0..262_144).map(|_| rng.f32() * 15.0 - 5.0).collect();
        let mut peaked = vocab.clone();
        peaked[1234] = 40.0;
        peaked[262_143] = 39.5;
        let mut rows = vec![
            vocab,
            peaked,
            vec![3.25; 100_003],
            (0..50_000)
                .map(|i| 1000.0 + (i % 97) as f32 * 0.01)
                .collect(),
            (0..70_001).map(|i| -(i as f32) * 1e-3).collect(),
        ];
        for n in 1..=19 {
            rows.push((0..n).map(|i| (i * 7 % 5) as f32 - 2.0).collect());
        }
        let mut masked: Vec<f32> = (0..1000).map(|i| (i % 13) as f32).collect();
        masked[..500].fill(f32::NEG_INFINITY);
        masked[999] = f32::NEG_INFINITY;
        rows.push(masked);
        rows
    }

    /// The bound of `log_sum_exp`'s docs, absolute.
    const LSE_BOUND: f64 = 2e-6;

    #[test]
    fn log_sum_exp_stays_within_its_bound_of_the_f64_definition() {
        for level in levels() {
            let mut worst = 0f64;
            for x in lse_rows() {
                let got = log_sum_exp(level, &x).unwrap();
                let want = log_sum_exp_ref(&x);
                assert!(got.is_finite(), "{level} n={}", x.len());
                worst = worst.max((got - want).abs());
            }
            println!("log_sum_exp [{level}]: max |err| = {worst:.2e}");
            assert!(worst <= LSE_BOUND, "{level}: {worst:e}");
        }
        let x = [1.0f32, 2.0, 3.0];
        let want = (1f64.exp() + 2f64.exp() + 3f64.exp()).ln();
        assert!((log_sum_exp_ref(&x) - want).abs() < 1e-15);
    }

    #[test]
    fn log_sum_exp_bound_catches_a_small_shift() {
        // Test of the test: moving the largest logit of a peaked row by 1e-4 (a logit's f32
        // rounding at 40 is 4e-6) moves the log-partition well past the bound.
        let mut x = lse_rows().swap_remove(1);
        let before = log_sum_exp_ref(&x);
        x[1234] += 1e-4;
        assert!((log_sum_exp_ref(&x) - before).abs() > 10.0 * LSE_BOUND);
    }

    #[test]
    fn log_sum_exp_edge_cases_match_the_definition() {
        for level in levels() {
            assert_eq!(
                log_sum_exp(level, &[]).unwrap(),
                f64::NEG_INFINITY,
                "{level}"
            );
            for n in [3usize, 8, 21] {
                let mut x = vec![0.5f32; n];
                x[n - 1] = f32::NAN;
                assert!(log_sum_exp(level, &x).unwrap().is_nan(), "{level} n={n}");
                x[n - 1] = f32::NEG_INFINITY;
                let got = log_sum_exp(level, &x).unwrap();
                let want = log_sum_exp_ref(&x);
                assert!(
                    (got - want).abs() <= LSE_BOUND,
                    "{level} n={n}: {got} vs {want}"
                );
                x.fill(f32::NEG_INFINITY);
                assert!(
                    log_sum_exp(level, &x).unwrap().is_nan(),
                    "{level} all masked"
                );
                assert!(log_sum_exp_ref(&x).is_nan());
            }
        }
    }

    #[test]
    fn softmax_handles_large_logits_and_masked_entries() {
        for level in levels() {
            let mut x = vec![1000.0f32, 1001.0, 999.0, f32::NEG_INFINITY];
            softmax_scaled(level, 1.0, &mut x).unwrap();
            assert!(x.iter().all(|v| v.is_finite()), "{level}");
            assert!((x.iter().sum::<f32>() - 1.0).abs() < 1e-6, "{level}");
            assert!(x[3] < 1e-30, "{level}: {}", x[3]);
        }
    }
}
