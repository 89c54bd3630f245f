//! Kernel dispatch by [`SimdLevel`]: f32 dot products and tiles, dequantization, and the
//! dot product of a quantized row with f32 activations.
//!
//! Determinism contract: at a given level every output of [`dot_f32`], [`dot_tile`] and
//! [`dot_row`] is computed in the same *canonical order*: one vector accumulator of the
//! level's width per output, fused multiply-adds over consecutive vector-width chunks of
//! `k`, a fixed horizontal reduction, then the remaining `k % width` products added one by
//! one. Dequantization is bit-exact at every level. So, at one level, a matrix product gives
//! the same bits whether it runs as a matvec, a tiled GEMM, on any thread, in any tile.
//!
//! [`q16`] is a second kind of product (16-bit activations, exact integer block sums) with
//! its own, equally shape-independent definition; callers choose it per format and level
//! with [`q16::applies`] and then use it for every token count.

#[cfg(target_arch = "x86_64")]
mod amx_q16;
mod attn;
#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx2_dequant;
#[cfg(target_arch = "x86_64")]
mod avx2_q16;
#[cfg(target_arch = "x86_64")]
pub(crate) mod avx512;
#[cfg(target_arch = "x86_64")]
mod avx512_dequant;
#[cfg(target_arch = "x86_64")]
pub(crate) mod avx512_q16;
mod multi;
#[cfg(target_arch = "aarch64")]
mod neon;
#[cfg(target_arch = "aarch64")]
mod neon_dequant;
pub mod q16;
pub(crate) mod scalar;
mod vmath;

pub use attn::{PREFETCH_ROWS, dot_rows, weighted_rows};
pub use multi::{has_fused_multi_matvec, multi_matvec};
pub use vmath::{
    GatedAct, gated_act, gelu_tanh_ref, log_sum_exp, log_sum_exp_ref, silu_ref, softmax_scaled,
};

use crate::{QuantError, SimdLevel};
use ferrite_gguf::GgmlType;

/// Dequantizes whole blocks: `src` holds `dst.len() / block_size` blocks.
pub type DequantFn = fn(&[u8], &mut [f32]);

/// A fused kernel: `out[r] = dot(row r, x)` for 1..=4 rows of whole blocks.
pub(crate) type MatvecFn = fn(&[&[u8]], &[f32], &mut [f32]);

/// A fused multi-column kernel, `(w, nr, cols, out, stride)`: `out[c * stride + r] =
/// dot(row r of w, cols[c])` for the `nr` rows of whole blocks in `w` and 1..=[`MM_COLS`]
/// activation columns.
pub(crate) type MatmatFn = fn(&[u8], usize, &[&[f32]], &mut [f32], usize);

/// Activation columns per call of a [`MatmatFn`] (at most 16 accumulators: two rows of
/// eight columns, or four rows of up to four).
pub(crate) const MM_COLS: usize = 8;

/// Largest tile [`dot_tile`] accepts in each direction.
pub const MAX_TILE: usize = 4;

/// How a [`RowElem`] lies in memory, which the vector loads follow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ElemKind {
    /// IEEE single precision.
    F32,
    /// IEEE half precision.
    F16,
    /// [`Q8Block`]s.
    Q8,
}

/// Element type of the rows [`dot_tile`] and [`weighted_rows`] read on their `x` / `v` side
/// (attention's keys and values): f32, IEEE half, or [`Q8Block`]s. Narrow rows are widened
/// exactly as they are loaded (a block's values as their f32 products `d · q`), so they
/// give the same bits as their widened f32 copies. Offsets, strides and lengths the kernels
/// take are counted in values.
pub trait RowElem: Copy + Send + Sync + sealed::Sealed + 'static {
    /// The element's layout.
    const KIND: ElemKind;
    /// Values one element holds (32 for a block, else 1).
    const VALUES: usize = 1;
    /// Value `i` of a row of these elements, as f32.
    fn value(row: &[Self], i: usize) -> f32;
}

impl RowElem for f32 {
    const KIND: ElemKind = ElemKind::F32;
    #[inline]
    fn value(row: &[f32], i: usize) -> f32 {
        row[i]
    }
}

impl RowElem for half::f16 {
    const KIND: ElemKind = ElemKind::F16;
    #[inline]
    fn value(row: &[half::f16], i: usize) -> f32 {
        row[i].to_f32()
    }
}

/// 32 values as signed bytes with one f32 scale: value `i` is `d · q[i]`, one f32 product
/// (the 8-bit KV cache's block).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Q8Block {
    /// Scale.
    pub d: f32,
    /// Quants.
    pub q: [i8; 32],
}

impl RowElem for Q8Block {
    const KIND: ElemKind = ElemKind::Q8;
    const VALUES: usize = 32;
    #[inline]
    fn value(row: &[Q8Block], i: usize) -> f32 {
        let b = &row[i / 32];
        b.d * f32::from(b.q[i % 32])
    }
}

/// Values in a row of `X`.
#[inline]
pub(crate) fn row_values<X: RowElem>(row: &[X]) -> usize {
    row.len() * X::VALUES
}

/// Adds the products from `from` to `k`, one at a time, to `acc`: the vector levels' tail
/// after their last full vector.
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
#[inline]
#[allow(clippy::needless_range_loop)] // `i` indexes `x` through `X::value`, by value
pub(crate) fn tail<X: RowElem>(acc: f32, w: &[f32], x: &[X], from: usize, k: usize) -> f32 {
    let mut s = acc;
    for i in from..k {
        s += w[i] * X::value(x, i);
    }
    s
}

/// Prefetches the 64-byte lines from `*fetched` up to `frontier` bytes past `base` and
/// moves `*fetched` there: the fused kernels' look-ahead over a group of adjacent rows, which
/// are too short for the hardware prefetcher to follow as separate streams. Prefetches never
/// fault, and the pointers are formed with wrapping arithmetic.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) fn prefetch_ahead(base: *const i8, fetched: &mut usize, frontier: usize) {
    use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
    while *fetched < frontier {
        // SAFETY: SSE is part of every x86_64 CPU; a prefetch reads nothing and cannot
        // fault, whatever the address.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(base.wrapping_add(*fetched)) };
        *fetched += 64;
    }
}

/// The vector loads reinterpret a row's memory by [`RowElem::KIND`], so only the three
/// types above may implement it.
mod sealed {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for half::f16 {}
    impl Sealed for super::Q8Block {}
}

/// Checks that `level` can run here.
pub(crate) fn check_level(level: SimdLevel) -> Result<(), QuantError> {
    if level.is_available() {
        Ok(())
    } else {
        Err(QuantError::LevelUnavailable { level })
    }
}

/// The scalar reference dequantizer of `ty`.
pub(crate) fn dequant_ref(ty: GgmlType) -> Option<DequantFn> {
    use crate::{float::*, kquants::*, legacy::*, nonlinear::*};
    use GgmlType as T;
    Some(match ty {
        T::F32 => dequant_f32_ref,
        T::F16 => dequant_f16_ref,
        T::BF16 => dequant_bf16_ref,
        T::Q4_0 => dequant_q4_0_ref,
        T::Q4_1 => dequant_q4_1_ref,
        T::Q5_0 => dequant_q5_0_ref,
        T::Q5_1 => dequant_q5_1_ref,
        T::Q8_0 => dequant_q8_0_ref,
        T::Q2_K => dequant_q2k_ref,
        T::Q3_K => dequant_q3k_ref,
        T::Q4_K => dequant_q4k_ref,
        T::Q5_K => dequant_q5k_ref,
        T::Q6_K => dequant_q6k_ref,
        T::Q8_K => dequant_q8k_ref,
        T::IQ4_NL => dequant_iq4nl_ref,
        T::IQ4_XS => dequant_iq4xs_ref,
        T::MXFP4 => dequant_mxfp4_ref,
        T::TQ1_0 => dequant_tq1_0_ref,
        T::TQ2_0 => dequant_tq2_0_ref,
        T::Q8_1
        | T::IQ2_XXS
        | T::IQ2_XS
        | T::IQ3_XXS
        | T::IQ1_S
        | T::IQ3_S
        | T::IQ2_S
        | T::I8
        | T::I16
        | T::I32
        | T::I64
        | T::F64
        | T::IQ1_M => return None,
    })
}

/// The level's own (vectorized) dequantizer of `ty`, if it has one. Only returned when the
/// CPU supports the level.
pub(crate) fn dequant_simd(level: SimdLevel, ty: GgmlType) -> Option<DequantFn> {
    if !level.is_available() {
        return None;
    }
    match level {
        SimdLevel::Scalar => None,
        #[cfg(target_arch = "x86_64")]
        SimdLevel::Avx2 => avx2::dequant_fn(ty),
        #[cfg(target_arch = "x86_64")]
        SimdLevel::Avx512 => avx512::dequant_fn(ty),
        #[cfg(target_arch = "aarch64")]
        SimdLevel::Neon => neon_dequant::lookup(ty),
        #[cfg(not(target_arch = "x86_64"))]
        _ => None,
    }
}

/// Whether `level` has a vectorized dequantizer for `ty` (otherwise it uses the scalar one,
/// which gives the same bits).
pub fn has_simd_dequantize(level: SimdLevel, ty: GgmlType) -> bool {
    dequant_simd(level, ty).is_some()
}

/// The dequantizer used at `level` for `ty`.
pub fn dequant_fn(level: SimdLevel, ty: GgmlType) -> Result<DequantFn, QuantError> {
    check_level(level)?;
    dequant_simd(level, ty)
        .or_else(|| dequant_ref(ty))
        .ok_or(QuantError::Unsupported {
            ty,
            op: "dequantize",
        })
}

/// Dot product of the first `min(w.len(), x.len())` values, in the level's canonical order.
pub fn dot_f32(level: SimdLevel, w: &[f32], x: &[f32]) -> Result<f32, QuantError> {
    check_level(level)?;
    let k = w.len().min(x.len());
    Ok(match level {
        SimdLevel::Scalar => scalar::dot(w, x, k),
        #[cfg(target_arch = "x86_64")]
        // SAFETY: check_level proved the CPU has AVX2, FMA and F16C; k is within both slices.
        SimdLevel::Avx2 => unsafe { avx2::dot(w, x, k) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: check_level proved the CPU has the AVX-512 set; k is within both slices.
        SimdLevel::Avx512 => unsafe { avx512::dot(w, x, k) },
        #[cfg(target_arch = "aarch64")]
        // SAFETY: check_level proved the CPU has NEON.
        SimdLevel::Neon => unsafe { neon::dot(w, x, k) },
        #[cfg(not(target_arch = "x86_64"))]
        _ => scalar::dot(w, x, k),
    })
}

/// `y[i] += a * x[i]` for the shorter of the two slices, with the kernels of `level`
/// (fused multiply-add on the SIMD levels, so results differ from scalar in the last bit).
pub fn axpy(level: SimdLevel, a: f32, x: &[f32], y: &mut [f32]) -> Result<(), QuantError> {
    check_level(level)?;
    let k = x.len().min(y.len());
    match level {
        SimdLevel::Scalar => scalar::axpy(a, x, y, k),
        #[cfg(target_arch = "x86_64")]
        // SAFETY: check_level proved the CPU has AVX2, FMA and F16C; k is within both slices.
        SimdLevel::Avx2 => unsafe { avx2::axpy(a, x, y, k) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: check_level proved the CPU has the AVX-512 set; k is within both slices.
        SimdLevel::Avx512 => unsafe { avx512::axpy(a, x, y, k) },
        #[cfg(target_arch = "aarch64")]
        // SAFETY: check_level proved the CPU has NEON.
        SimdLevel::Neon => unsafe { neon::axpy(a, x, y, k) },
        #[cfg(not(target_arch = "x86_64"))]
        _ => scalar::axpy(a, x, y, k),
    }
    Ok(())
}

/// `out[i * x.len() + j] = dot(w[i], x[j])` over the first `k` values, for up to
/// [`MAX_TILE`] weight rows and [`MAX_TILE`] activation rows, in the canonical order
/// (bit-identical to [`dot_f32`] on the same rows; half `x` rows give the bits of their f32
/// widening).
pub fn dot_tile<X: RowElem>(
    level: SimdLevel,
    w: &[&[f32]],
    x: &[&[X]],
    k: usize,
    out: &mut [f32],
) -> Result<(), QuantError> {
    check_level(level)?;
    let short = w.iter().any(|r| r.len() < k) || x.iter().any(|r| row_values(r) < k);
    if w.len() > MAX_TILE || x.len() > MAX_TILE || out.len() < w.len() * x.len() || short {
        return Err(QuantError::BadTile {
            rows: w.len(),
            cols: x.len(),
            k,
        });
    }
    // SAFETY: level is available (checked); every row holds at least k values, there are
    // 1..=4 rows each side and out has room for every product (checked above).
    unsafe { tile_unchecked(level, w, x, k, out) };
    Ok(())
}

/// [`dot_tile`] without its checks, for callers that checked the shapes once.
///
/// # Safety
/// `level` is available; `w` and `x` hold 1..=[`MAX_TILE`] rows of at least `k` values;
/// `out` has `w.len() * x.len()` slots.
#[inline]
pub(crate) unsafe fn tile_unchecked<X: RowElem>(
    level: SimdLevel,
    w: &[&[f32]],
    x: &[&[X]],
    k: usize,
    out: &mut [f32],
) {
    match level {
        SimdLevel::Scalar => scalar::tile(w, x, k, out),
        #[cfg(target_arch = "x86_64")]
        // SAFETY: forwarded caller contract.
        SimdLevel::Avx2 => unsafe { avx2::tile(w, x, k, out) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: forwarded caller contract.
        SimdLevel::Avx512 => unsafe { avx512::tile(w, x, k, out) },
        #[cfg(target_arch = "aarch64")]
        // SAFETY: the level is available (caller contract).
        SimdLevel::Neon => unsafe { neon::tile(w, x, k, out) },
        #[cfg(not(target_arch = "x86_64"))]
        _ => scalar::tile(w, x, k, out),
    }
}

/// `out[t * nr + r] = dot(w row r, x row t)` for the `nr = w.len() / k` weight rows and
/// `nt = x.len() / k` activation rows (both row-major, `k` values each): a whole block of
/// [`dot_tile`]s with the level checked once and no per-tile dispatch, bit-identical to
/// [`dot_tile`] and [`dot_f32`] on every pair of rows.
pub fn gemm_f32(
    level: SimdLevel,
    w: &[f32],
    x: &[f32],
    k: usize,
    out: &mut [f32],
) -> Result<(), QuantError> {
    check_level(level)?;
    let (nr, nt) = (w.len() / k.max(1), x.len() / k.max(1));
    if k == 0 || !w.len().is_multiple_of(k) || !x.len().is_multiple_of(k) || out.len() < nr * nt {
        return Err(QuantError::BadTile {
            rows: nr,
            cols: nt,
            k,
        });
    }
    let mut part = [0f32; MAX_TILE * MAX_TILE];
    for (tb, xblock) in x.chunks(MAX_TILE * k).enumerate() {
        let mut xs: [&[f32]; MAX_TILE] = [&[]; MAX_TILE];
        for (slot, row) in xs.iter_mut().zip(xblock.chunks_exact(k)) {
            *slot = row;
        }
        let tn = xblock.len() / k;
        let orows = &mut out[tb * MAX_TILE * nr..(tb * MAX_TILE + tn) * nr];
        for (ib, wblock) in w.chunks(MAX_TILE * k).enumerate() {
            let mut ws: [&[f32]; MAX_TILE] = [&[]; MAX_TILE];
            for (slot, row) in ws.iter_mut().zip(wblock.chunks_exact(k)) {
                *slot = row;
            }
            let rn = wblock.len() / k;
            let (ws, xs) = (&ws[..rn], &xs[..tn]);
            // SAFETY: level checked available; 1..=4 rows each side of exactly k values;
            // part has room for 16 products.
            unsafe { tile_unchecked(level, ws, xs, k, &mut part) };
            let i0 = ib * MAX_TILE;
            for (j, orow) in orows.chunks_exact_mut(nr).enumerate() {
                for (i, v) in orow[i0..i0 + rn].iter_mut().enumerate() {
                    *v = part[i * tn + j];
                }
            }
        }
    }
    Ok(())
}

/// `y[r] = dot(row r of w, x)` for `r in 0..y.len()`, where `w` holds `y.len()` rows of
/// `x.len()` values of type `ty`. Uses the level's fused kernel (weights dequantized in
/// registers, never stored) when it has one; bit-identical to [`dot_row`] on each row.
pub fn matvec(
    level: SimdLevel,
    ty: GgmlType,
    w: &[u8],
    x: &[f32],
    y: &mut [f32],
) -> Result<(), QuantError> {
    check_level(level)?;
    let rb = ty
        .row_bytes(x.len() as u64)
        .ok_or(QuantError::PartialBlock {
            ty,
            n: x.len(),
            block: ty.block_size(),
        })?;
    let rb = rb as usize;
    if Some(w.len()) != y.len().checked_mul(rb) {
        return Err(QuantError::ByteLength {
            ty,
            n: x.len() * y.len(),
            expected: (rb * y.len()) as u64,
            got: w.len(),
        });
    }
    if rb == 0 {
        y.fill(0.0);
        return Ok(());
    }
    match fused_matvec(level, ty, x.len()) {
        Some(f) => {
            for (rows, out) in w.chunks(MAX_TILE * rb).zip(y.chunks_mut(MAX_TILE)) {
                let mut rs: [&[u8]; MAX_TILE] = [&[]; MAX_TILE];
                for (r, chunk) in rs.iter_mut().zip(rows.chunks_exact(rb)) {
                    *r = chunk;
                }
                f(&rs[..out.len()], x, out);
            }
        }
        None => {
            let deq = dequant_fn(level, ty)?;
            let groups = w
                .chunks_exact(MAX_TILE * rb)
                .zip(y.chunks_exact_mut(MAX_TILE));
            for (rows, out) in groups {
                let r: [&[u8]; 4] = std::array::from_fn(|i| &rows[i * rb..(i + 1) * rb]);
                out.copy_from_slice(&matvec4_chunked(level, ty, deq, r, x));
            }
            let done = y.len() - y.len() % MAX_TILE;
            for (row, out) in w[done * rb..].chunks_exact(rb).zip(y[done..].iter_mut()) {
                *out = dot_row(level, ty, row, x)?;
            }
        }
    }
    Ok(())
}

/// Four rows of [`dot_row`] at once: each step dequantizes a chunk of every row into a
/// stack buffer, then runs the four FMA chains interleaved. Per row, exactly the order of
/// [`dot_row`]. Rows hold `x.len()` values of `ty` (checked by the caller).
fn matvec4_chunked(
    level: SimdLevel,
    ty: GgmlType,
    deq: DequantFn,
    rows: [&[u8]; 4],
    x: &[f32],
) -> [f32; 4] {
    let bs = ty.block_size() as usize;
    let ts = ty.type_size() as usize;
    let n = x.len();
    let full = match level {
        SimdLevel::Scalar => 0,
        SimdLevel::Avx2 => n - n % 8,
        SimdLevel::Avx512 => n - n % 16,
        #[cfg(target_arch = "aarch64")]
        SimdLevel::Neon => n - n % 4,
    };
    let mut buf = [[0f32; ROW_CHUNK]; 4];
    let mut lanes = [[0f32; 16]; 4];
    let mut tail = [0f32; 4];
    let mut reduced = false;
    let mut start = 0;
    while start < n {
        let len = ROW_CHUNK.min(n - start);
        for (b, row) in buf.iter_mut().zip(rows) {
            deq(
                &row[start / bs * ts..(start + len) / bs * ts],
                &mut b[..len],
            );
        }
        let xs = &x[start..start + len];
        let vec_len = full.saturating_sub(start).min(len);
        match level {
            SimdLevel::Scalar => {}
            #[cfg(target_arch = "x86_64")]
            // SAFETY: only called by `matvec` after `check_level`; all slices have vec_len
            // values, a multiple of 8.
            SimdLevel::Avx2 => unsafe {
                avx2::acc_lanes4(
                    &mut lanes,
                    buf.each_ref().map(|b| &b[..vec_len]),
                    &xs[..vec_len],
                )
            },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: as above, a multiple of 16.
            SimdLevel::Avx512 => unsafe {
                avx512::acc_lanes4(
                    &mut lanes,
                    buf.each_ref().map(|b| &b[..vec_len]),
                    &xs[..vec_len],
                )
            },
            #[cfg(target_arch = "aarch64")]
            // SAFETY: only called by `matvec` after `check_level` proved NEON.
            SimdLevel::Neon => unsafe {
                neon::acc_lanes4(
                    &mut lanes,
                    buf.each_ref().map(|b| &b[..vec_len]),
                    &xs[..vec_len],
                )
            },
            #[cfg(not(target_arch = "x86_64"))]
            _ => {}
        }
        if level == SimdLevel::Scalar {
            for (t, b) in tail.iter_mut().zip(&buf) {
                *t = scalar::dot_acc(*t, &b[..len], xs);
            }
        } else if vec_len < len {
            // The final partial vector (only the last chunk has one) continues from the
            // reduced lanes, in order, as `dot_f32` does.
            for (r, (t, b)) in tail.iter_mut().zip(&buf).enumerate() {
                let mut acc = RowAcc::new(level);
                acc.lanes = lanes[r];
                *t = scalar::dot_acc(acc.finish(), &b[vec_len..len], &xs[vec_len..]);
            }
            reduced = true;
        }
        start += len;
    }
    if level == SimdLevel::Scalar || reduced {
        return tail;
    }
    std::array::from_fn(|r| {
        let mut acc = RowAcc::new(level);
        acc.lanes = lanes[r];
        acc.finish()
    })
}

/// The level's fused matvec for rows of `k` values of `ty`, if it has one that covers `k`
/// without a partial vector (partial vectors take the generic path).
fn fused_matvec(level: SimdLevel, ty: GgmlType, k: usize) -> Option<MatvecFn> {
    match level {
        #[cfg(target_arch = "x86_64")]
        SimdLevel::Avx512 if k.is_multiple_of(16) && level.is_available() => {
            avx512_dequant::lookup_matvec(ty)
        }
        #[cfg(target_arch = "x86_64")]
        SimdLevel::Avx2 if k.is_multiple_of(8) && level.is_available() => {
            avx2_dequant::lookup_matvec(ty)
        }
        #[cfg(target_arch = "aarch64")]
        SimdLevel::Neon if k.is_multiple_of(4) && level.is_available() => {
            neon_dequant::lookup_matvec(ty)
        }
        _ => None,
    }
}

/// Whether [`matvec`] has a fused kernel for `ty` at `level`.
pub fn has_fused_matvec(level: SimdLevel, ty: GgmlType) -> bool {
    fused_matvec(level, ty, 256).is_some()
}

/// Values dequantized per step of [`dot_row`] (a multiple of every block size).
const ROW_CHUNK: usize = 512;

/// Dot product of one quantized row (`row`, `x.len()` values of type `ty`) with f32
/// activations, dequantizing in registers-sized chunks on the stack; bit-identical to
/// dequantizing the row and calling [`dot_f32`].
pub fn dot_row(level: SimdLevel, ty: GgmlType, row: &[u8], x: &[f32]) -> Result<f32, QuantError> {
    let deq = dequant_fn(level, ty)?;
    crate::check_row(ty, row.len(), x.len())?;
    let bs = ty.block_size() as usize;
    let ts = ty.type_size() as usize;
    let mut buf = [0f32; ROW_CHUNK];
    let n = x.len();
    let full = match level {
        SimdLevel::Scalar => 0,
        SimdLevel::Avx2 => n - n % 8,
        SimdLevel::Avx512 => n - n % 16,
        #[cfg(target_arch = "aarch64")]
        SimdLevel::Neon => n - n % 4,
    };
    let mut acc = RowAcc::new(level);
    let mut tail = 0.0f32;
    let mut reduced = None;
    let mut start = 0;
    while start < n {
        let len = ROW_CHUNK.min(n - start);
        let bytes = &row[start / bs * ts..(start + len) / bs * ts];
        deq(bytes, &mut buf[..len]);
        let xs = &x[start..start + len];
        if level == SimdLevel::Scalar {
            tail = scalar::dot_acc(tail, &buf[..len], xs);
        } else {
            let vec_len = full.saturating_sub(start).min(len);
            acc.add(&buf[..vec_len], &xs[..vec_len]);
            if vec_len < len {
                // The final partial vector (only the last chunk has one) continues from the
                // reduced lanes, in order, as `dot_f32` does.
                reduced = Some(scalar::dot_acc(
                    acc.finish(),
                    &buf[vec_len..len],
                    &xs[vec_len..],
                ));
            }
        }
        start += len;
    }
    Ok(match (level, reduced) {
        (SimdLevel::Scalar, _) => tail,
        (_, Some(s)) => s,
        (_, None) => acc.finish(),
    })
}

/// A running vector accumulator of the level's width, kept as plain lanes between chunks.
struct RowAcc {
    level: SimdLevel,
    lanes: [f32; 16],
}

impl RowAcc {
    fn new(level: SimdLevel) -> Self {
        RowAcc {
            level,
            lanes: [0.0; 16],
        }
    }

    /// Adds the products of `w` and `x` (length a multiple of the width) into the lanes.
    fn add(&mut self, w: &[f32], x: &[f32]) {
        match self.level {
            SimdLevel::Scalar => {}
            #[cfg(target_arch = "x86_64")]
            // SAFETY: RowAcc is only built by dot_row after dequant_fn checked the level is
            // available; w and x have equal lengths, a multiple of 8.
            SimdLevel::Avx2 => unsafe { avx2::acc_lanes(&mut self.lanes, w, x) },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: as above, multiple of 16.
            SimdLevel::Avx512 => unsafe { avx512::acc_lanes(&mut self.lanes, w, x) },
            #[cfg(target_arch = "aarch64")]
            // SAFETY: as above (NEON).
            SimdLevel::Neon => unsafe { neon::acc_lanes(&mut self.lanes, w, x) },
            #[cfg(not(target_arch = "x86_64"))]
            _ => {}
        }
    }

    /// The canonical horizontal reduction of the lanes.
    fn finish(&self) -> f32 {
        match self.level {
            SimdLevel::Scalar => 0.0,
            #[cfg(target_arch = "x86_64")]
            // SAFETY: the level was checked available when this accumulator was built.
            SimdLevel::Avx2 => unsafe { avx2::reduce_lanes(&self.lanes) },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: as above.
            SimdLevel::Avx512 => unsafe { avx512::reduce_lanes(&self.lanes) },
            #[cfg(target_arch = "aarch64")]
            // SAFETY: as above.
            SimdLevel::Neon => unsafe { neon::reduce_lanes(&self.lanes) },
            #[cfg(not(target_arch = "x86_64"))]
            _ => 0.0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pseudo(n: usize, seed: u32) -> Vec<f32> {
        let mut s = seed.wrapping_mul(2_654_435_761).wrapping_add(3);
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 17;
                s ^= s << 5;
                (s % 20_000) as f32 / 10_000.0 - 1.0
            })
            .collect()
    }

    #[test]
    fn gemm_equals_dot_f32_bit_for_bit() {
        // Row and token counts: 1, not multiples of the tile, several tiles; k with and
        // without a tail past the vector width.
        for level in SimdLevel::ALL.into_iter().filter(|l| l.is_available()) {
            for (nr, nt, k) in [(1, 1, 16), (5, 3, 17), (9, 7, 640), (4, 4, 7), (13, 6, 96)] {
                let w = pseudo(nr * k, 1);
                let x = pseudo(nt * k, 2);
                let mut out = vec![f32::NAN; nr * nt];
                gemm_f32(level, &w, &x, k, &mut out).unwrap();
                for t in 0..nt {
                    for r in 0..nr {
                        let want = dot_f32(level, &w[r * k..(r + 1) * k], &x[t * k..(t + 1) * k]);
                        assert_eq!(
                            out[t * nr + r].to_bits(),
                            want.unwrap().to_bits(),
                            "{level} nr={nr} nt={nt} k={k} r={r} t={t}"
                        );
                    }
                }
            }
        }
    }

    /// Narrow `x` rows (`X`, made from f32 rows by `make`) of each length in `ks` give the
    /// bits of their f32 widening in every tile shape, with and without a tail; a widening
    /// that differs in one value is told apart.
    fn narrow_rows_give_the_bits_of_their_widening<X: RowElem>(
        ks: &[usize],
        make: fn(&[f32]) -> Vec<X>,
    ) {
        for level in SimdLevel::ALL.into_iter().filter(|l| l.is_available()) {
            for &k in ks {
                for (nw, nx) in [(1, 1), (4, 1), (1, 4), (3, 2), (4, 4)] {
                    let w = pseudo(nw * k, 5);
                    let x = pseudo(nx * k, k as u32);
                    let h: Vec<Vec<X>> = x.chunks(k).map(make).collect();
                    let mut wide: Vec<f32> = h
                        .iter()
                        .flat_map(|r| (0..k).map(|i| X::value(r, i)))
                        .collect();
                    let ws: Vec<&[f32]> = w.chunks(k).collect();
                    let hs: Vec<&[X]> = h.iter().map(Vec::as_slice).collect();
                    let (mut a, mut b) = ([0f32; 16], [0f32; 16]);
                    dot_tile(level, &ws, &hs, k, &mut a).unwrap();
                    let xs: Vec<&[f32]> = wide.chunks(k).collect();
                    dot_tile(level, &ws, &xs, k, &mut b).unwrap();
                    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                    assert_eq!(bits(&a), bits(&b), "{level} k={k} {nw}x{nx}");
                    wide[0] += 1.0;
                    let xs: Vec<&[f32]> = wide.chunks(k).collect();
                    dot_tile(level, &ws, &xs, k, &mut b).unwrap();
                    assert_ne!(bits(&a), bits(&b), "{level} k={k}: the check is blind");
                }
            }
        }
    }

    /// Blocks of arbitrary scales and quants from `x` (32 values a block): scale the first
    /// value times 3, quants the values times 127.
    pub(crate) fn blocks(x: &[f32]) -> Vec<Q8Block> {
        x.chunks(32)
            .map(|c| Q8Block {
                d: c[0] * 3.0,
                q: std::array::from_fn(|i| (c[i] * 127.0).round() as i8),
            })
            .collect()
    }

    #[test]
    fn dot_tile_of_half_rows_gives_the_bits_of_their_widening() {
        narrow_rows_give_the_bits_of_their_widening(&[7, 16, 64, 72, 256], |x| {
            x.iter().map(|&v| half::f16::from_f32(v * 50.0)).collect()
        });
    }

    #[test]
    fn dot_tile_of_block_rows_gives_the_bits_of_their_widening() {
        narrow_rows_give_the_bits_of_their_widening(&[32, 64, 96, 256], blocks);
    }

    #[test]
    fn gemm_rejects_ragged_operands() {
        let level = SimdLevel::Scalar;
        let mut out = [0f32; 4];
        assert!(gemm_f32(level, &[0.0; 5], &[0.0; 4], 2, &mut out).is_err());
        assert!(gemm_f32(level, &[0.0; 4], &[0.0; 4], 0, &mut out).is_err());
        assert!(gemm_f32(level, &[0.0; 8], &[0.0; 8], 2, &mut out[..3]).is_err());
        assert!(gemm_f32(level, &[0.0; 4], &[0.0; 4], 2, &mut out).is_ok());
    }
}
