//! AVX2 + FMA + F16C kernels (256-bit, 8 f32 lanes).
//!
//! Canonical order at this level: one `__m256` accumulator per output, `acc = fma(w, x, acc)`
//! over consecutive 8-value chunks, reduced by [`hsum`], then the `k % 8` tail products
//! added one at a time.

use std::arch::x86_64::*;

use super::{DequantFn, ElemKind, Q8Block, RowElem, tail};
use ferrite_gguf::GgmlType;

/// The fixed horizontal reduction: halves, then pairs, then the last two lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn hsum(v: __m256) -> f32 {
    let lo = _mm256_castps256_ps128(v);
    let hi = _mm256_extractf128_ps::<1>(v);
    let s = _mm_add_ps(lo, hi);
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_shuffle_ps::<1>(s, s));
    _mm_cvtss_f32(s)
}

/// Values `at..at + 8` of the row at `row` as f32 lanes (narrow rows widened exactly).
///
/// # Safety
/// AVX2/FMA/F16C available; the row holds values `at..at + 8`, and for blocks `at` is a
/// multiple of 8 (the values lie in one block).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn load8<X: RowElem>(row: *const X, at: usize) -> __m256 {
    // SAFETY: the values lie in the row (caller contract); RowElem is sealed to f32, f16 and
    // Q8Block, whose layouts KIND names.
    unsafe {
        let p = row.add(at / X::VALUES);
        match X::KIND {
            ElemKind::F32 => _mm256_loadu_ps(p.cast()),
            ElemKind::F16 => _mm256_cvtph_ps(_mm_loadu_si128(p.cast())),
            ElemKind::Q8 => {
                let b = p.cast::<Q8Block>();
                let q = (&raw const (*b).q).cast::<i8>().add(at % 32);
                let q = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(q.cast())));
                _mm256_mul_ps(_mm256_set1_ps((*b).d), q)
            }
        }
    }
}

/// Dot product of the first `k` values.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C, and `k <= w.len().min(x.len())`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dot(w: &[f32], x: &[f32], k: usize) -> f32 {
    let n8 = k / 8;
    let mut acc = _mm256_setzero_ps();
    for c in 0..n8 {
        // SAFETY: 8 * c + 8 <= k <= len of both slices (caller contract).
        unsafe {
            let a = _mm256_loadu_ps(w.as_ptr().add(8 * c));
            let b = _mm256_loadu_ps(x.as_ptr().add(8 * c));
            acc = _mm256_fmadd_ps(a, b, acc);
        }
    }
    tail(hsum(acc), w, x, 8 * n8, k)
}

/// `y[i] = fma(a, x[i], y[i])` over the first `k` values; the tail uses `mul_add` so every
/// element is rounded once, as in the vector body.
///
/// # Safety
/// The CPU has the features this function enables; `k` is within both slices.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn axpy(a: f32, x: &[f32], y: &mut [f32], k: usize) {
    let n = k / 8;
    let av = _mm256_set1_ps(a);
    for c in 0..n {
        // SAFETY: 8 * c + 8 <= k <= len of both slices (caller contract).
        unsafe {
            let xv = _mm256_loadu_ps(x.as_ptr().add(8 * c));
            let yv = _mm256_loadu_ps(y.as_ptr().add(8 * c));
            _mm256_storeu_ps(y.as_mut_ptr().add(8 * c), _mm256_fmadd_ps(av, xv, yv));
        }
    }
    for i in 8 * n..k {
        y[i] = a.mul_add(x[i], y[i]);
    }
}

/// Register-blocked `R x T` products (see [`tile`]).
///
/// # Safety
/// AVX2/FMA/F16C available; `w.len() == R`, `x.len() == T`, every row has `k` values and
/// `out` has `R * T` slots.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn micro<const R: usize, const T: usize, X: RowElem>(
    w: &[&[f32]],
    x: &[&[X]],
    k: usize,
    out: &mut [f32],
) {
    let n8 = k / 8;
    let mut acc = [[_mm256_setzero_ps(); T]; R];
    for c in 0..n8 {
        let mut xv = [_mm256_setzero_ps(); T];
        for t in 0..T {
            // SAFETY: 8 * c + 8 <= k, within x[t] (caller contract).
            xv[t] = unsafe { load8(x[t].as_ptr(), 8 * c) };
        }
        for r in 0..R {
            // SAFETY: 8 * c + 8 <= k <= w[r].len() (caller contract).
            let wv = unsafe { _mm256_loadu_ps(w[r].as_ptr().add(8 * c)) };
            for t in 0..T {
                acc[r][t] = _mm256_fmadd_ps(wv, xv[t], acc[r][t]);
            }
        }
    }
    for r in 0..R {
        for t in 0..T {
            out[r * T + t] = tail(hsum(acc[r][t]), w[r], x[t], 8 * n8, k);
        }
    }
}

/// `out[i * x.len() + j] = dot(w[i], x[j])` for up to 4 x 4 rows.
///
/// # Safety
/// AVX2/FMA/F16C available; 1..=4 rows each side, all with at least `k` values; `out` has
/// `w.len() * x.len()` slots.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn tile<X: RowElem>(w: &[&[f32]], x: &[&[X]], k: usize, out: &mut [f32]) {
    // 16 ymm registers: 4 rows x 2 tokens of accumulators plus loads fit, 4 x 4 would spill.
    let mut t0 = 0;
    while t0 < x.len() {
        let nt = (x.len() - t0).min(2);
        let xs = &x[t0..t0 + nt];
        let mut part = [0f32; 8];
        // SAFETY: forwarded caller contract; R and T match the slice lengths.
        unsafe {
            match (w.len(), nt) {
                (1, 1) => micro::<1, 1, X>(w, xs, k, &mut part),
                (2, 1) => micro::<2, 1, X>(w, xs, k, &mut part),
                (3, 1) => micro::<3, 1, X>(w, xs, k, &mut part),
                (4, 1) => micro::<4, 1, X>(w, xs, k, &mut part),
                (1, 2) => micro::<1, 2, X>(w, xs, k, &mut part),
                (2, 2) => micro::<2, 2, X>(w, xs, k, &mut part),
                (3, 2) => micro::<3, 2, X>(w, xs, k, &mut part),
                (4, 2) => micro::<4, 2, X>(w, xs, k, &mut part),
                _ => return,
            }
        }
        for r in 0..w.len() {
            for t in 0..nt {
                out[r * x.len() + t0 + t] = part[r * nt + t];
            }
        }
        t0 += nt;
    }
}

/// Adds `w * x` (equal lengths, a multiple of 8) into 8 stored accumulator lanes.
///
/// # Safety
/// AVX2/FMA/F16C available; `w.len() == x.len()`, a multiple of 8.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn acc_lanes(lanes: &mut [f32; 16], w: &[f32], x: &[f32]) {
    // SAFETY: lanes has 16 >= 8 values; chunk bounds follow from the caller contract.
    unsafe {
        let mut acc = _mm256_loadu_ps(lanes.as_ptr());
        for c in 0..w.len() / 8 {
            let a = _mm256_loadu_ps(w.as_ptr().add(8 * c));
            let b = _mm256_loadu_ps(x.as_ptr().add(8 * c));
            acc = _mm256_fmadd_ps(a, b, acc);
        }
        _mm256_storeu_ps(lanes.as_mut_ptr(), acc);
    }
}

/// Four rows at once: adds `w[r] * x` into the stored lanes of row `r` (all lengths equal,
/// a multiple of 8), interleaving the four FMA chains. Same per-row order as
/// [`acc_lanes`].
///
/// # Safety
/// AVX2/FMA/F16C available; every `w[r]` and `x` have the same length, a multiple of 8.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn acc_lanes4(lanes: &mut [[f32; 16]; 4], w: [&[f32]; 4], x: &[f32]) {
    // SAFETY: each lane array has 16 >= 8 values; chunk bounds follow from the contract.
    unsafe {
        let mut a0 = _mm256_loadu_ps(lanes[0].as_ptr());
        let mut a1 = _mm256_loadu_ps(lanes[1].as_ptr());
        let mut a2 = _mm256_loadu_ps(lanes[2].as_ptr());
        let mut a3 = _mm256_loadu_ps(lanes[3].as_ptr());
        for c in 0..x.len() / 8 {
            let xv = _mm256_loadu_ps(x.as_ptr().add(8 * c));
            a0 = _mm256_fmadd_ps(_mm256_loadu_ps(w[0].as_ptr().add(8 * c)), xv, a0);
            a1 = _mm256_fmadd_ps(_mm256_loadu_ps(w[1].as_ptr().add(8 * c)), xv, a1);
            a2 = _mm256_fmadd_ps(_mm256_loadu_ps(w[2].as_ptr().add(8 * c)), xv, a2);
            a3 = _mm256_fmadd_ps(_mm256_loadu_ps(w[3].as_ptr().add(8 * c)), xv, a3);
        }
        _mm256_storeu_ps(lanes[0].as_mut_ptr(), a0);
        _mm256_storeu_ps(lanes[1].as_mut_ptr(), a1);
        _mm256_storeu_ps(lanes[2].as_mut_ptr(), a2);
        _mm256_storeu_ps(lanes[3].as_mut_ptr(), a3);
    }
}

/// [`hsum`] of 8 stored lanes.
///
/// # Safety
/// AVX2/FMA/F16C available.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn reduce_lanes(lanes: &[f32; 16]) -> f32 {
    // SAFETY: lanes has 16 >= 8 values.
    hsum(unsafe { _mm256_loadu_ps(lanes.as_ptr()) })
}

/// The AVX2 dequantizer of `ty`, if there is one.
///
/// The returned safe wrappers execute AVX2 instructions: [`super::dequant_simd`] hands them
/// out only after checking the CPU has this level, and nothing else may call them.
pub(crate) fn dequant_fn(ty: GgmlType) -> Option<DequantFn> {
    super::avx2_dequant::lookup(ty)
}
