//! Portable f32 kernels: the reference accumulation order.
//!
//! Canonical order at this level: one f32 accumulator per output, `acc = acc + w[k] * x[k]`
//! for k ascending (separate multiply and add, never fused).

use super::RowElem;

/// Dot product of the first `k` values of `w` and `x`.
#[inline]
pub(crate) fn dot<X: RowElem>(w: &[f32], x: &[X], k: usize) -> f32 {
    let mut acc = 0.0f32;
    for (i, a) in w[..k].iter().enumerate() {
        acc += a * X::value(x, i);
    }
    acc
}

/// `y[i] += a * x[i]` over the first `k` values (separate multiply and add).
#[inline]
pub(crate) fn axpy(a: f32, x: &[f32], y: &mut [f32], k: usize) {
    for (yi, xi) in y[..k].iter_mut().zip(&x[..k]) {
        *yi += a * xi;
    }
}

/// Continues a dot product: `acc` plus the dot of `w` and `x` (same length).
#[inline]
pub(crate) fn dot_acc(acc: f32, w: &[f32], x: &[f32]) -> f32 {
    let mut acc = acc;
    for (a, b) in w.iter().zip(x) {
        acc += a * b;
    }
    acc
}

/// `out[i * x.len() + j] = dot(w[i], x[j])` over the first `k` values.
pub(crate) fn tile<X: RowElem>(w: &[&[f32]], x: &[&[X]], k: usize, out: &mut [f32]) {
    for (i, wr) in w.iter().enumerate() {
        for (j, xr) in x.iter().enumerate() {
            out[i * x.len() + j] = dot(wr, xr, k);
        }
    }
}
