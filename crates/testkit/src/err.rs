//! How far a computed f32 vector is from an f64 reference: the one error measure the model
//! and GPU tests share.

/// Error tuple of `got` against `want`: finiteness first, then max abs, max abs relative to
/// the largest |want|, cosine.
#[derive(Debug, Clone, Copy)]
pub struct ErrTuple {
    /// Every value of `got` is finite.
    pub finite: bool,
    /// Largest absolute difference.
    pub max_abs: f64,
    /// `max_abs` over the largest |want|.
    pub max_rel: f64,
    /// Cosine similarity (1 when both are all zeros).
    pub cosine: f64,
}

/// The [`ErrTuple`] of `got` against `want`.
///
/// # Panics
/// When the lengths differ.
pub fn err_tuple(got: &[f32], want: &[f64]) -> ErrTuple {
    assert_eq!(got.len(), want.len(), "lengths differ");
    let finite = got.iter().all(|v| v.is_finite());
    let (mut max_abs, mut max_ref, mut dot, mut ng, mut nw) = (0.0f64, 0.0f64, 0.0, 0.0, 0.0);
    for (&g, &w) in got.iter().zip(want) {
        let g = f64::from(g);
        max_abs = max_abs.max((g - w).abs());
        max_ref = max_ref.max(w.abs());
        dot += g * w;
        ng += g * g;
        nw += w * w;
    }
    let cosine = if ng == 0.0 && nw == 0.0 {
        1.0
    } else {
        dot / (ng.sqrt() * nw.sqrt())
    };
    ErrTuple {
        finite,
        max_abs,
        max_rel: max_abs / max_ref.max(1e-30),
        cosine,
    }
}
