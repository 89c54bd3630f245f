//! The multi-column matvec: a quantized matrix times a few activation columns (one per
//! session of a decode batch), decoding each weight block once for several columns.
//!
//! Every output keeps the canonical order of the parent module, so column `t` of
//! [`multi_matvec`] has exactly the bits of [`matvec`](super::matvec) on column `t` alone
//! (and of the dequantize-then-GEMM path). AVX-512 has fused kernels (blocks decoded in
//! registers, a few rows by up to [`MM_COLS`] columns per step) for the common formats;
//! everything else runs [`matvec`] column by column. A shared-decode AVX2 path that
//! dequantized four rows into a stack buffer and ran every column over it was measured
//! slower than the tile GEMM of `ferrite-cpu` (SmolLM2 Q4_1, one thread: 41 vs 37 ms at 8
//! columns, 67 vs 60 ms at 16), so AVX2 batches stay on the GEMM.

use super::{MM_COLS, MatmatFn, check_level, matvec};
use crate::{QuantError, SimdLevel};
use ferrite_gguf::GgmlType;

/// The level's fused multi-column kernel for rows of `k` values of `ty`, if it has one that
/// covers `k` without a partial vector.
fn fused_multi(level: SimdLevel, ty: GgmlType, k: usize) -> Option<MatmatFn> {
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (ty, k); // no fused multi-column kernel off x86-64
    match level {
        #[cfg(target_arch = "x86_64")]
        SimdLevel::Avx512 if k.is_multiple_of(16) && level.is_available() => {
            super::avx512_dequant::multi::lookup(ty)
        }
        _ => None,
    }
}

/// Whether [`multi_matvec`] has a fused kernel at `level` for `ty` with rows of `k` values,
/// decoding each weight block in registers once per group of up to `MM_COLS` (8) columns
/// (otherwise it runs [`matvec`] column by column): AVX-512, `k` a multiple of 16, and
/// F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q6_K, IQ4_NL or MXFP4.
pub fn has_fused_multi_matvec(level: SimdLevel, ty: GgmlType, k: usize) -> bool {
    fused_multi(level, ty, k).is_some()
}

/// `y[t * nr + r] = dot(row r of w, column t of x)` for `n` columns: `x` holds `n` columns
/// of `k = x.len() / n` values back to back, `w` holds `nr = y.len() / n` rows of `k`
/// values of `ty`. Bit-identical to [`matvec`] on each column.
pub fn multi_matvec(
    level: SimdLevel,
    ty: GgmlType,
    w: &[u8],
    x: &[f32],
    n: usize,
    y: &mut [f32],
) -> Result<(), QuantError> {
    check_level(level)?;
    let (k, nr) = (x.len() / n.max(1), y.len() / n.max(1));
    if n == 0 || x.len() != n * k || y.len() != n * nr {
        return Err(QuantError::BadTile {
            rows: nr,
            cols: n,
            k,
        });
    }
    let rb = ty.row_bytes(k as u64).ok_or(QuantError::PartialBlock {
        ty,
        n: k,
        block: ty.block_size(),
    })? as usize;
    if Some(w.len()) != nr.checked_mul(rb) {
        return Err(QuantError::ByteLength {
            ty,
            n: k * nr,
            expected: (rb * nr) as u64,
            got: w.len(),
        });
    }
    if rb == 0 {
        y.fill(0.0);
        return Ok(());
    }
    if let Some(f) = fused_multi(level, ty, k) {
        // Balanced column groups (17 columns: 6 + 6 + 5, not 8 + 8 + 1), so no group is
        // left with a lone latency-bound accumulator chain per row.
        let groups = n.div_ceil(MM_COLS);
        let mut t0 = 0;
        for g in 0..groups {
            let cn = n / groups + usize::from(g < n % groups);
            let mut cs: [&[f32]; MM_COLS] = [&[]; MM_COLS];
            for (slot, col) in cs.iter_mut().zip(x[t0 * k..(t0 + cn) * k].chunks_exact(k)) {
                *slot = col;
            }
            f(w, nr, &cs[..cn], &mut y[t0 * nr..(t0 + cn) * nr], nr);
            t0 += cn;
        }
        return Ok(());
    }
    for (xt, yt) in x.chunks_exact(k).zip(y.chunks_exact_mut(nr)) {
        matvec(level, ty, w, xt, yt)?;
    }
    Ok(())
}
