//! AArch64 Advanced SIMD (NEON) f32 kernels (128-bit, 4 f32 lanes): the dot product, the
//! tile, axpy, and the stored-lane accumulator that `dot_row` and the chunked matvec use.
//!
//! Canonical order at this level: one `float32x4_t` accumulator per output,
//! `acc = vfmaq_f32(acc, w, x)` over consecutive 4-value chunks, reduced by [`hsum`], then
//! the `k % 4` tail products added one at a time.
//!
//! This module never chooses a level or a path: `kernels` calls it only at
//! `SimdLevel::Neon`, which exists only on AArch64 (where NEON is part of the target's
//! baseline features). Its functions take slices and check their bounds, so their only
//! safety condition is the `neon` feature they enable. It must never change the order
//! above: every NEON result in the crate is defined by it.

use std::arch::aarch64::*;

use super::{ElemKind, RowElem, tail};

/// The fixed horizontal reduction: the two halves added, then their two lanes.
#[inline]
#[target_feature(enable = "neon")]
pub(crate) fn hsum(v: float32x4_t) -> f32 {
    let h = vadd_f32(vget_low_f32(v), vget_high_f32(v));
    vget_lane_f32::<0>(h) + vget_lane_f32::<1>(h)
}

/// Four f32 values from the start of `v` (at least 4 long).
#[inline]
#[target_feature(enable = "neon")]
fn load(v: &[f32]) -> float32x4_t {
    let v = &v[..4];
    // SAFETY: `v` is exactly 4 readable f32s; the load has no alignment requirement.
    unsafe { vld1q_f32(v.as_ptr()) }
}

/// Values `at..at + 4` of `row` as f32 lanes (narrow rows widened exactly, as
/// [`RowElem::value`] widens them).
#[inline]
#[target_feature(enable = "neon")]
fn load4<X: RowElem>(row: &[X], at: usize) -> float32x4_t {
    match X::KIND {
        ElemKind::F32 => {
            assert!(at + 4 <= row.len());
            // SAFETY: X is f32 (KIND, sealed) and values at..at + 4 lie in the row (asserted).
            unsafe { vld1q_f32(row.as_ptr().cast::<f32>().add(at)) }
        }
        ElemKind::F16 | ElemKind::Q8 => {
            let v: [f32; 4] = std::array::from_fn(|i| X::value(row, at + i));
            load(&v)
        }
    }
}

/// Dot product of the first `k` values of `w` and `x`.
#[target_feature(enable = "neon")]
pub(crate) fn dot<X: RowElem>(w: &[f32], x: &[X], k: usize) -> f32 {
    let n4 = k / 4;
    let mut acc = vdupq_n_f32(0.0);
    for c in 0..n4 {
        acc = vfmaq_f32(acc, load(&w[4 * c..]), load4(x, 4 * c));
    }
    tail(hsum(acc), w, x, 4 * n4, k)
}

/// `y[i] = fma(a, x[i], y[i])` over the first `k` values; the tail uses `mul_add` so every
/// element is rounded once, as in the vector body.
#[target_feature(enable = "neon")]
pub(crate) fn axpy(a: f32, x: &[f32], y: &mut [f32], k: usize) {
    let (x, y) = (&x[..k], &mut y[..k]);
    let av = vdupq_n_f32(a);
    let mut yc = y.chunks_exact_mut(4);
    for (yv, xv) in (&mut yc).zip(x.chunks_exact(4)) {
        let r = vfmaq_f32(load(yv), av, load(xv));
        // SAFETY: `yv` is exactly 4 writable f32s; the store has no alignment requirement.
        unsafe { vst1q_f32(yv.as_mut_ptr(), r) };
    }
    let done = k - k % 4;
    for (yi, xi) in yc.into_remainder().iter_mut().zip(&x[done..]) {
        *yi = a.mul_add(*xi, *yi);
    }
}

/// Register-blocked `R x T` products (see [`tile`]); rows have at least `k` values.
#[target_feature(enable = "neon")]
fn micro<const R: usize, const T: usize, X: RowElem>(
    w: &[&[f32]],
    x: &[&[X]],
    k: usize,
    out: &mut [f32],
) {
    let n4 = k / 4;
    let mut acc = [[vdupq_n_f32(0.0); T]; R];
    for c in 0..n4 {
        let xv: [float32x4_t; T] = std::array::from_fn(|t| load4(x[t], 4 * c));
        for r in 0..R {
            let wv = load(&w[r][4 * c..]);
            for t in 0..T {
                acc[r][t] = vfmaq_f32(acc[r][t], wv, xv[t]);
            }
        }
    }
    for r in 0..R {
        for t in 0..T {
            out[r * T + t] = tail(hsum(acc[r][t]), w[r], x[t], 4 * n4, k);
        }
    }
}

/// `out[i * x.len() + j] = dot(w[i], x[j])` for up to 4 x 4 rows of at least `k` values
/// (32 vector registers hold all 16 accumulators with the loads).
#[target_feature(enable = "neon")]
pub(crate) fn tile<X: RowElem>(w: &[&[f32]], x: &[&[X]], k: usize, out: &mut [f32]) {
    macro_rules! shapes {
        ($(($r:literal, $t:literal)),*) => {
            match (w.len(), x.len()) {
                $(($r, $t) => micro::<$r, $t, X>(w, x, k, out),)*
                _ => {}
            }
        };
    }
    shapes!(
        (1, 1),
        (1, 2),
        (1, 3),
        (1, 4),
        (2, 1),
        (2, 2),
        (2, 3),
        (2, 4),
        (3, 1),
        (3, 2),
        (3, 3),
        (3, 4),
        (4, 1),
        (4, 2),
        (4, 3),
        (4, 4)
    );
}

/// Adds `w * x` (equal lengths, a multiple of 4) into 4 stored accumulator lanes.
#[target_feature(enable = "neon")]
pub(crate) fn acc_lanes(lanes: &mut [f32; 16], w: &[f32], x: &[f32]) {
    let mut acc = load(lanes);
    for (a, b) in w.chunks_exact(4).zip(x.chunks_exact(4)) {
        acc = vfmaq_f32(acc, load(a), load(b));
    }
    // SAFETY: `lanes` has 16 >= 4 writable f32s; the store has no alignment requirement.
    unsafe { vst1q_f32(lanes.as_mut_ptr(), acc) };
}

/// Four rows at once: adds `w[r] * x` into the stored lanes of row `r` (all lengths equal, a
/// multiple of 4), interleaving the four FMA chains. Same per-row order as [`acc_lanes`].
#[target_feature(enable = "neon")]
pub(crate) fn acc_lanes4(lanes: &mut [[f32; 16]; 4], w: [&[f32]; 4], x: &[f32]) {
    let mut acc = lanes.each_ref().map(|l| load(l));
    for (c, xv) in x.chunks_exact(4).enumerate() {
        let xv = load(xv);
        for (a, row) in acc.iter_mut().zip(w) {
            *a = vfmaq_f32(*a, load(&row[4 * c..]), xv);
        }
    }
    for (l, a) in lanes.iter_mut().zip(acc) {
        // SAFETY: `l` has 16 >= 4 writable f32s; the store has no alignment requirement.
        unsafe { vst1q_f32(l.as_mut_ptr(), a) };
    }
}

/// [`hsum`] of 4 stored lanes.
#[target_feature(enable = "neon")]
pub(crate) fn reduce_lanes(lanes: &[f32; 16]) -> f32 {
    hsum(load(lanes))
}
