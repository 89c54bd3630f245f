//! The multi-column matvec: a quantized matrix times a few activation columns (one per
//! session of a decode batch), decoding each weight block once for several columns.
//!
//! Every output keeps the canonical order of the parent module, so column `t` of
//! [`multi_matvec`] has exactly the bits of [`matvec`](super::matvec) on column `t` alone
//! (and of the dequantize-then-GEMM path). AVX-512 uses fused kernels (blocks decoded in
//! registers, a few rows by up to [`MM_COLS`] columns per step); other SIMD cases dequantize
//! a chunk of four rows into a stack buffer once and run every column over it.

use super::{MM_COLS, MatmatFn, ROW_CHUNK, check_level, dequant_fn, matvec, scalar};
use crate::{QuantError, SimdLevel};
use ferrite_gguf::GgmlType;

/// Columns per pass of the chunked path (its accumulators live on the stack).
const CHUNK_COLS: usize = 16;

/// The level's fused multi-column kernel for rows of `k` values of `ty`, if it has one that
/// covers `k` without a partial vector.
fn fused_multi(level: SimdLevel, ty: GgmlType, k: usize) -> Option<MatmatFn> {
    match level {
        #[cfg(target_arch = "x86_64")]
        SimdLevel::Avx512 if k.is_multiple_of(16) && level.is_available() => {
            super::avx512_dequant::multi::lookup(ty)
        }
        _ => None,
    }
}

/// Whether [`multi_matvec`] decodes each weight block once per group of columns at `level`
/// for `ty` with rows of `k` values: always at an available SIMD level for a format it can
/// dequantize (otherwise it runs [`matvec`] column by column). AVX-512 decodes in registers
/// for the common formats (see [`multi_matvec`]).
pub fn has_fused_multi_matvec(level: SimdLevel, ty: GgmlType, k: usize) -> bool {
    level.is_available()
        && (fused_multi(level, ty, k).is_some()
            || (level != SimdLevel::Scalar && dequant_fn(level, ty).is_ok()))
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
    if level != SimdLevel::Scalar {
        let deq = dequant_fn(level, ty)?;
        chunked(level, ty, deq, w, rb, x, k, y);
        return Ok(());
    }
    for (xt, yt) in x.chunks_exact(k).zip(y.chunks_exact_mut(nr)) {
        matvec(level, ty, w, xt, yt)?;
    }
    Ok(())
}

/// The non-fused SIMD path: for each group of four rows, each [`ROW_CHUNK`] of the rows is
/// dequantized once into a stack buffer and multiplied with up to [`CHUNK_COLS`] columns,
/// the accumulators kept as stored lanes between chunks, the `k % width` tail added one
/// product at a time: per output the order of [`super::dot_row`]. Shapes are checked by the
/// caller and `level` is an available SIMD level; `deq` is its (bit-exact) dequantizer.
#[allow(clippy::too_many_arguments)]
fn chunked(
    level: SimdLevel,
    ty: GgmlType,
    deq: super::DequantFn,
    w: &[u8],
    rb: usize,
    x: &[f32],
    k: usize,
    y: &mut [f32],
) {
    let (bs, ts) = (ty.block_size() as usize, ty.type_size() as usize);
    let (width, group) = match level {
        SimdLevel::Avx512 => (16, 4),
        // 16 vector registers: four rows by two columns of accumulators.
        _ => (8, 2),
    };
    let full = k - k % width;
    let nr = w.len() / rb;
    let mut buf = [[0f32; ROW_CHUNK]; 4];
    for (g, rows) in w.chunks(4 * rb).enumerate() {
        let rn = rows.len() / rb;
        for (cb, xs) in x.chunks(CHUNK_COLS * k).enumerate() {
            let cn = xs.len() / k;
            let cols: [&[f32]; CHUNK_COLS] =
                std::array::from_fn(|c| if c < cn { &xs[c * k..(c + 1) * k] } else { &[] });
            let mut lanes = [[[0f32; 16]; 16]; CHUNK_COLS / 2];
            let mut tail = [[0f32; CHUNK_COLS]; 4];
            let mut start = 0;
            while start < k {
                let len = ROW_CHUNK.min(k - start);
                for (b, row) in buf.iter_mut().zip(rows.chunks_exact(rb)) {
                    deq(
                        &row[start / bs * ts..(start + len) / bs * ts],
                        &mut b[..len],
                    );
                }
                let vec_len = full.saturating_sub(start).min(len);
                let ws = buf.each_ref().map(|b| &b[..vec_len]);
                for (q, l) in lanes.iter_mut().enumerate().take(cn.div_ceil(group)) {
                    let c0 = q * group;
                    let xq = |j: usize| &cols[(c0 + j).min(cn - 1)][start..start + vec_len];
                    acc_group(level, group, l, ws, xq);
                }
                for (r, t) in tail.iter_mut().enumerate().take(rn) {
                    for (c, tc) in t.iter_mut().enumerate().take(cn) {
                        let xt = &cols[c][start + vec_len..start + len];
                        *tc = scalar::dot_acc(*tc, &buf[r][vec_len..len], xt);
                    }
                }
                start += len;
            }
            for (r, t) in tail.iter().enumerate().take(rn) {
                for (c, tc) in t.iter().enumerate().take(cn) {
                    let l = &lanes[c / group][4 * r + c % group];
                    let t_idx = cb * CHUNK_COLS + c;
                    y[t_idx * nr + g * 4 + r] = reduce(level, l) + tc;
                }
            }
        }
    }
}

/// Adds four buffered rows times `group` columns (`xq(j)`, padded by repeating the last
/// column, whose extra products are never read) into the stored lanes.
fn acc_group<'a>(
    level: SimdLevel,
    group: usize,
    lanes: &mut [[f32; 16]; 16],
    ws: [&[f32]; 4],
    xq: impl Fn(usize) -> &'a [f32],
) {
    match (level, group) {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `chunked` runs only at an available SIMD level; all slices have the
        // same length, a multiple of the width; at most four columns.
        (SimdLevel::Avx512, _) => unsafe {
            super::avx512::acc_tile::<4>(lanes, ws, [xq(0), xq(1), xq(2), xq(3)])
        },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above, for AVX2.
        (SimdLevel::Avx2, _) => unsafe { super::avx2::acc_tile::<2>(lanes, ws, [xq(0), xq(1)]) },
        _ => {}
    }
}

/// The canonical horizontal reduction of stored lanes at an available SIMD level.
fn reduce(level: SimdLevel, lanes: &[f32; 16]) -> f32 {
    match level {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `chunked` runs only at an available SIMD level.
        SimdLevel::Avx512 => unsafe { super::avx512::reduce_lanes(lanes) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above.
        SimdLevel::Avx2 => unsafe { super::avx2::reduce_lanes(lanes) },
        _ => 0.0,
    }
}
