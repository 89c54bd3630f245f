//! Both halves of attention over strided cache rows, for up to [`MAX_TILE`] query heads
//! that share those rows (one grouped-query group): the scores ([`dot_rows`], query·key)
//! and the probability-weighted sums of value rows ([`weighted_rows`]).
//!
//! Why kernels: a group's rows are a strided walk through the KV cache (one head's slice
//! of each position), which at batch sizes above one is read from memory, not cache. Both
//! kernels keep every head's work in registers while the rows stream past once, and fetch
//! rows a fixed distance ahead of use, because the hardware prefetcher does not lock on to
//! these short strided walks (the loads stalled on memory for most of the scores' time).
//!
//! Scores are bit-identical to [`super::dot_tile`] (the canonical order). A value row's
//! contribution is one fused multiply-add per lane, in key order, starting from zero: per
//! element exactly the sequence of `axpy` calls from a zeroed output, so results are the
//! same bits whichever heads are blocked together. Rows may be f32, f16 or [`Q8Block`](super::Q8Block)s
//! (the KV cache's own rows, widened exactly as they are loaded: the bits of the f32 copy).
//! Block rows need strides and head sizes that are multiples of 32 values.

use crate::{QuantError, SimdLevel};

use super::{MAX_TILE, RowElem, check_level, row_values, tile_unchecked};

/// How many rows ahead of use [`dot_rows`] and [`weighted_rows`] fetch (measured: 8 and 12
/// leave loads waiting on memory, 16 to 24 do not).
pub const PREFETCH_ROWS: usize = 16;

/// `out[h * ld + j] = dot(q[h], k[j * stride..][..hd])` for `h < q.len()`, `j < n`:
/// bit-identical to [`super::dot_tile`] (and so [`super::dot_f32`]) on each pair.
#[allow(clippy::too_many_arguments)] // two strided 2-D views and their extents
pub fn dot_rows<X: RowElem>(
    level: SimdLevel,
    q: &[&[f32]],
    k: &[X],
    stride: usize,
    hd: usize,
    n: usize,
    out: &mut [f32],
    ld: usize,
) -> Result<(), QuantError> {
    check_level(level)?;
    if q.is_empty()
        || q.len() > MAX_TILE
        || q.iter().any(|r| r.len() < hd)
        || ld < n
        || out.len() < (q.len() - 1) * ld + n
        || !rows_fit::<X>(n, stride, hd, k)
    {
        return Err(QuantError::BadTile {
            rows: q.len(),
            cols: n,
            k: hd,
        });
    }
    let mut part = [0f32; MAX_TILE * MAX_TILE];
    for j0 in (0..n).step_by(MAX_TILE) {
        let nk = MAX_TILE.min(n - j0);
        prefetch_rows(
            level,
            k,
            stride,
            hd,
            j0 + PREFETCH_ROWS..j0 + PREFETCH_ROWS + nk,
        );
        let ks: [&[X]; MAX_TILE] =
            std::array::from_fn(|i| row(k, (j0 + i.min(nk - 1)) * stride, hd));
        // SAFETY: level is available and the shapes were checked above: 1..=4 queries of
        // at least hd values, nk <= 4 rows of hd values, part holds 16 products.
        unsafe { tile_unchecked(level, q, &ks[..nk], hd, &mut part) };
        for h in 0..q.len() {
            out[h * ld + j0..h * ld + j0 + nk].copy_from_slice(&part[h * nk..(h + 1) * nk]);
        }
    }
    Ok(())
}

/// Whether `n` rows of `hd` values, one every `stride` values, fit in `k`, with rows
/// starting and ending on whole elements.
fn rows_fit<X: RowElem>(n: usize, stride: usize, hd: usize, k: &[X]) -> bool {
    let whole = stride.is_multiple_of(X::VALUES) && hd.is_multiple_of(X::VALUES);
    whole
        && (n == 0
            || (n - 1)
                .checked_mul(stride)
                .and_then(|o| o.checked_add(hd))
                .is_some_and(|e| e <= row_values(k)))
}

/// The `hd` values of `k` from value `at` on (both whole elements).
fn row<X: RowElem>(k: &[X], at: usize, hd: usize) -> &[X] {
    &k[at / X::VALUES..(at + hd) / X::VALUES]
}

/// Asks for the `hd` values of rows `rows` (those that exist) to be brought into cache, on
/// the vector levels; a hint only, with no effect on results.
fn prefetch_rows<X: RowElem>(
    level: SimdLevel,
    k: &[X],
    stride: usize,
    hd: usize,
    rows: std::ops::Range<usize>,
) {
    #[cfg(target_arch = "x86_64")]
    if level != SimdLevel::Scalar {
        let bytes = hd / X::VALUES * std::mem::size_of::<X>();
        for j in rows {
            let Some(row) = k.get(j * stride / X::VALUES..(j * stride + hd) / X::VALUES) else {
                return;
            };
            let base = row.as_ptr().cast::<i8>();
            for off in (0..bytes).step_by(64) {
                // SAFETY: SSE, which the intrinsic needs, is part of every x86_64 CPU; a
                // prefetch never faults and the address lies inside `row`.
                unsafe {
                    std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
                        base.add(off),
                    )
                };
            }
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (level, k, stride, hd, rows);
}

/// `out[h * hd + d] += Σ_j p[h][j] · v[j * stride + d]` for `h < p.len()`, `d < hd`, over
/// `j < n` where every `p[h]` has `n` values, each key's product fused into the running
/// value in key order (see the module docs). So a sum over keys split into consecutive
/// calls has the bits of one call over all of them, from a zeroed `out`.
pub fn weighted_rows<X: RowElem>(
    level: SimdLevel,
    p: &[&[f32]],
    v: &[X],
    stride: usize,
    hd: usize,
    out: &mut [f32],
) -> Result<(), QuantError> {
    check_level(level)?;
    let n = p.first().map_or(0, |r| r.len());
    if p.is_empty()
        || p.len() > MAX_TILE
        || p.iter().any(|r| r.len() != n)
        || out.len() < p.len() * hd
        || !rows_fit::<X>(n, stride, hd, v)
    {
        return Err(QuantError::BadTile {
            rows: p.len(),
            cols: n,
            k: hd,
        });
    }
    let out = &mut out[..p.len() * hd];
    let done = match level {
        SimdLevel::Scalar => 0,
        #[cfg(target_arch = "x86_64")]
        // SAFETY: check_level proved AVX2/FMA/F16C; shapes checked above.
        SimdLevel::Avx2 => unsafe { x86::weighted_avx2(p, v, stride, hd, out) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: check_level proved the AVX-512 set; shapes checked above.
        SimdLevel::Avx512 => unsafe { x86::weighted_avx512(p, v, stride, hd, out) },
        #[cfg(not(target_arch = "x86_64"))]
        _ => 0,
    };
    // Columns the vector body did not cover: the scalar level adds products separately
    // (its axpy), the SIMD levels fuse them (their axpy tail).
    for (h, ph) in p.iter().enumerate() {
        let o = &mut out[h * hd..(h + 1) * hd];
        for (j, &pj) in ph.iter().enumerate() {
            let row = row(v, j * stride, hd);
            #[allow(clippy::needless_range_loop)] // `d` indexes `row` through `X::value`
            for d in done..hd {
                o[d] = if level == SimdLevel::Scalar {
                    o[d] + pj * X::value(row, d)
                } else {
                    pj.mul_add(X::value(row, d), o[d])
                };
            }
        }
    }
    Ok(())
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    //! Vector bodies: columns in blocks of four vectors, all heads' accumulators for the
    //! block in registers while the keys stream past.

    use std::arch::x86_64::*;

    use super::{PREFETCH_ROWS, RowElem};
    use crate::kernels::avx2::load8;
    use crate::kernels::avx512::load16;

    /// Returns the number of leading columns written (a multiple of 16).
    ///
    /// # Safety
    /// AVX-512 available; `p.len() <= 4`, all `p[h]` of equal length `n`, row `j` of `v`
    /// at `j * stride` holds `hd` values for `j < n`, `out` holds `p.len() * hd` values.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    pub(super) unsafe fn weighted_avx512<X: RowElem>(
        p: &[&[f32]],
        v: &[X],
        stride: usize,
        hd: usize,
        out: &mut [f32],
    ) -> usize {
        macro_rules! go {
            ($($h:literal),*) => {
                match p.len() {
                    // SAFETY: forwarded contract; H equals p.len().
                    $($h => unsafe { block512::<$h, X>(p, v, stride, hd, out) },)*
                    _ => 0,
                }
            };
        }
        go!(1, 2, 3, 4)
    }

    /// # Safety
    /// As [`weighted_avx512`], with `p.len() == H`.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    unsafe fn block512<const H: usize, X: RowElem>(
        p: &[&[f32]],
        v: &[X],
        stride: usize,
        hd: usize,
        out: &mut [f32],
    ) -> usize {
        let full = hd - hd % 16;
        let mut c0 = 0;
        while c0 < full {
            let nv = ((full - c0) / 16).min(4);
            // SAFETY: forwarded contract; columns c0..c0 + 16 nv lie within hd.
            unsafe {
                match nv {
                    4 => cols512::<H, 4, X>(p, v, stride, hd, c0, out),
                    3 => cols512::<H, 3, X>(p, v, stride, hd, c0, out),
                    2 => cols512::<H, 2, X>(p, v, stride, hd, c0, out),
                    _ => cols512::<H, 1, X>(p, v, stride, hd, c0, out),
                }
            }
            c0 += 16 * nv;
        }
        full
    }

    /// Columns `c0..c0 + 16 NV` of every head (constant sizes keep the `H x NV`
    /// accumulators in registers).
    ///
    /// # Safety
    /// As [`block512`], with `c0 + 16 NV <= hd`.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    #[allow(clippy::needless_range_loop)] // j indexes every head's row and the value rows
    unsafe fn cols512<const H: usize, const NV: usize, X: RowElem>(
        p: &[&[f32]],
        v: &[X],
        stride: usize,
        hd: usize,
        c0: usize,
        out: &mut [f32],
    ) {
        let mut acc = [[_mm512_setzero_ps(); NV]; H];
        for (h, a) in acc.iter_mut().enumerate() {
            for (c, x) in a.iter_mut().enumerate() {
                // SAFETY: h * hd + c0 + 16 c + 16 <= h * hd + hd <= out.len().
                *x = unsafe { _mm512_loadu_ps(out.as_ptr().add(h * hd + c0 + 16 * c)) };
            }
        }
        let bytes = (16 * NV).div_ceil(X::VALUES) * std::mem::size_of::<X>();
        for j in 0..p[0].len() {
            let ahead = v
                .as_ptr()
                .wrapping_add(((j + PREFETCH_ROWS) * stride + c0) / X::VALUES)
                .cast::<i8>();
            for off in (0..bytes).step_by(64) {
                // A hint: it never faults, whatever the address (past the last row it is
                // simply wasted).
                _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(off));
            }
            let mut vv = [_mm512_setzero_ps(); NV];
            for (c, x) in vv.iter_mut().enumerate() {
                // SAFETY: j * stride + c0 + 16 c + 16 <= j * stride + hd, within v.
                *x = unsafe { load16(v.as_ptr(), j * stride + c0 + 16 * c) };
            }
            for (h, a) in acc.iter_mut().enumerate() {
                let pv = _mm512_set1_ps(p[h][j]);
                for (x, &w) in a.iter_mut().zip(&vv) {
                    *x = _mm512_fmadd_ps(pv, w, *x);
                }
            }
        }
        for (h, a) in acc.iter().enumerate() {
            for (c, x) in a.iter().enumerate() {
                // SAFETY: h * hd + c0 + 16 c + 16 <= h * hd + hd <= out.len().
                unsafe { _mm512_storeu_ps(out.as_mut_ptr().add(h * hd + c0 + 16 * c), *x) };
            }
        }
    }

    /// Returns the number of leading columns written (a multiple of 8).
    ///
    /// # Safety
    /// AVX2/FMA/F16C available; otherwise as [`weighted_avx512`].
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn weighted_avx2<X: RowElem>(
        p: &[&[f32]],
        v: &[X],
        stride: usize,
        hd: usize,
        out: &mut [f32],
    ) -> usize {
        macro_rules! go {
            ($($h:literal),*) => {
                match p.len() {
                    // SAFETY: forwarded contract; H equals p.len().
                    $($h => unsafe { block256::<$h, X>(p, v, stride, hd, out) },)*
                    _ => 0,
                }
            };
        }
        go!(1, 2, 3, 4)
    }

    /// # Safety
    /// As [`weighted_avx2`], with `p.len() == H`.
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn block256<const H: usize, X: RowElem>(
        p: &[&[f32]],
        v: &[X],
        stride: usize,
        hd: usize,
        out: &mut [f32],
    ) -> usize {
        let full = hd - hd % 8;
        let mut c0 = 0;
        while c0 < full {
            let nv = ((full - c0) / 8).min(2);
            // SAFETY: forwarded contract; columns c0..c0 + 8 nv lie within hd.
            unsafe {
                if nv == 2 {
                    cols256::<H, 2, X>(p, v, stride, hd, c0, out);
                } else {
                    cols256::<H, 1, X>(p, v, stride, hd, c0, out);
                }
            }
            c0 += 8 * nv;
        }
        full
    }

    /// Columns `c0..c0 + 8 NV` of every head.
    ///
    /// # Safety
    /// As [`block256`], with `c0 + 8 NV <= hd`.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    #[allow(clippy::needless_range_loop)] // j indexes every head's row and the value rows
    unsafe fn cols256<const H: usize, const NV: usize, X: RowElem>(
        p: &[&[f32]],
        v: &[X],
        stride: usize,
        hd: usize,
        c0: usize,
        out: &mut [f32],
    ) {
        let mut acc = [[_mm256_setzero_ps(); NV]; H];
        for (h, a) in acc.iter_mut().enumerate() {
            for (c, x) in a.iter_mut().enumerate() {
                // SAFETY: h * hd + c0 + 8 c + 8 <= h * hd + hd <= out.len().
                *x = unsafe { _mm256_loadu_ps(out.as_ptr().add(h * hd + c0 + 8 * c)) };
            }
        }
        for j in 0..p[0].len() {
            let mut vv = [_mm256_setzero_ps(); NV];
            for (c, x) in vv.iter_mut().enumerate() {
                // SAFETY: j * stride + c0 + 8 c + 8 <= j * stride + hd, within v.
                *x = unsafe { load8(v.as_ptr(), j * stride + c0 + 8 * c) };
            }
            for (h, a) in acc.iter_mut().enumerate() {
                let pv = _mm256_set1_ps(p[h][j]);
                for (x, &w) in a.iter_mut().zip(&vv) {
                    *x = _mm256_fmadd_ps(pv, w, *x);
                }
            }
        }
        for (h, a) in acc.iter().enumerate() {
            for (c, x) in a.iter().enumerate() {
                // SAFETY: h * hd + c0 + 8 c + 8 <= h * hd + hd <= out.len().
                unsafe { _mm256_storeu_ps(out.as_mut_ptr().add(h * hd + c0 + 8 * c), *x) };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::tests::blocks;
    use crate::kernels::{Q8Block, axpy, dot_tile};

    fn levels() -> Vec<SimdLevel> {
        [SimdLevel::Scalar, SimdLevel::Avx2, SimdLevel::Avx512]
            .into_iter()
            .filter(|l| l.is_available())
            .collect()
    }

    fn pseudo(n: usize, seed: u32) -> Vec<f32> {
        let mut s = seed.wrapping_mul(2_654_435_761).wrapping_add(7);
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 17;
                s ^= s << 5;
                (s % 20_000) as f32 / 10_000.0 - 1.0
            })
            .collect()
    }

    /// The oracle: one `axpy` per key into a zeroed row, at the same level.
    fn by_axpy(level: SimdLevel, p: &[f32], v: &[f32], stride: usize, hd: usize) -> Vec<f32> {
        let mut o = vec![0.0; hd];
        for (j, &pj) in p.iter().enumerate() {
            axpy(level, pj, &v[j * stride..j * stride + hd], &mut o).unwrap();
        }
        o
    }

    #[test]
    fn equals_one_axpy_per_key_bit_for_bit() {
        // head dims: under one vector, odd, one and several column blocks, Gemma's 256;
        // key counts: 1, odd; head blocks 1..=4; a stride wider than a head (GQA rows).
        for level in levels() {
            for hd in [1usize, 7, 16, 24, 64, 72, 256] {
                for n in [1usize, 5, 33] {
                    for heads in 1..=MAX_TILE {
                        let stride = hd + 3;
                        let v = pseudo(n * stride, hd as u32);
                        let ps: Vec<Vec<f32>> =
                            (0..heads).map(|h| pseudo(n, 100 + h as u32)).collect();
                        let refs: Vec<&[f32]> = ps.iter().map(Vec::as_slice).collect();
                        let mut out = vec![0.0; heads * hd];
                        weighted_rows(level, &refs, &v, stride, hd, &mut out).unwrap();
                        for h in 0..heads {
                            let want = by_axpy(level, &ps[h], &v, stride, hd);
                            assert_eq!(
                                &out[h * hd..(h + 1) * hd],
                                &want[..],
                                "{level} hd={hd} n={n} heads={heads} h={h}"
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn keys_split_over_calls_give_the_bits_of_one_call() {
        // Attention sums a group's values a block of keys at a time, adding into the
        // output: every split must give the single call's bits.
        for level in levels() {
            for hd in [7usize, 64, 72] {
                let (n, heads, stride) = (37, 3, hd + 5);
                let v = pseudo(n * stride, 11);
                let ps: Vec<Vec<f32>> = (0..heads).map(|h| pseudo(n, 50 + h as u32)).collect();
                let refs: Vec<&[f32]> = ps.iter().map(Vec::as_slice).collect();
                let mut whole = vec![0.0; heads * hd];
                weighted_rows(level, &refs, &v, stride, hd, &mut whole).unwrap();
                for block in [1, 5, 16] {
                    let mut split = vec![0.0; heads * hd];
                    for j0 in (0..n).step_by(block) {
                        let nb = block.min(n - j0);
                        let part: Vec<&[f32]> = ps.iter().map(|p| &p[j0..j0 + nb]).collect();
                        let rows = &v[j0 * stride..];
                        weighted_rows(level, &part, rows, stride, hd, &mut split).unwrap();
                    }
                    assert_eq!(split, whole, "{level} hd={hd} block={block}");
                }
            }
        }
    }

    /// Asserts that each score `out[h * ld + j]` has the bits of `dot_tile` of head `h` and
    /// key row `j`, for every row of `rows` (`stride` apart).
    fn same_as_dot_tile<X: RowElem>(
        level: SimdLevel,
        q: &[&[f32]],
        rows: &[X],
        stride: usize,
        out: &[f32],
        ld: usize,
        at: &str,
    ) {
        let hd = q[0].len();
        let mut one = [0f32; 1];
        for (h, head) in q.iter().enumerate() {
            for j in 0..rows.len() / stride {
                let row = &rows[j * stride..][..hd];
                dot_tile(level, &[head], &[row], hd, &mut one).unwrap();
                assert_eq!(out[h * ld + j].to_bits(), one[0].to_bits(), "{at}");
            }
        }
    }

    #[test]
    fn scores_equal_dot_tile_bit_for_bit() {
        // Head dims under one vector, odd, Gemma's 256; key counts across the tile size and
        // the prefetch distance; f32 and half rows; an output stride wider than the keys.
        for level in levels() {
            for hd in [7usize, 16, 64, 72, 256] {
                for n in [1usize, 3, 4, 9, 37] {
                    for heads in 1..=MAX_TILE {
                        let stride = 2 * hd + 3;
                        let k = pseudo(n * stride, hd as u32 + 1);
                        let kh: Vec<half::f16> =
                            k.iter().map(|&x| half::f16::from_f32(x)).collect();
                        // Block rows need a stride of whole blocks.
                        let bstride = 2 * hd + 32;
                        let kq = pseudo(n * bstride, hd as u32 + 2);
                        let kb = (hd % 32 == 0).then(|| blocks(&kq));
                        let kbw: Vec<f32> = kb.as_ref().map_or(Vec::new(), |b| {
                            (0..kq.len()).map(|i| Q8Block::value(b, i)).collect()
                        });
                        let qs: Vec<Vec<f32>> =
                            (0..heads).map(|h| pseudo(hd, 9 + h as u32)).collect();
                        let q: Vec<&[f32]> = qs.iter().map(Vec::as_slice).collect();
                        let ld = n + 2;
                        let (mut a, mut b) =
                            (vec![f32::NAN; heads * ld], vec![f32::NAN; heads * ld]);
                        let mut c = vec![f32::NAN; heads * ld];
                        dot_rows(level, &q, &k, stride, hd, n, &mut a, ld).unwrap();
                        dot_rows(level, &q, &kh, stride, hd, n, &mut b, ld).unwrap();
                        if let Some(kb) = &kb {
                            dot_rows(level, &q, kb, bstride, hd, n, &mut c, ld).unwrap();
                        }
                        let at = format!("{level} {hd} {n}");
                        same_as_dot_tile(level, &q, &k, stride, &a, ld, &at);
                        same_as_dot_tile(level, &q, &kh, stride, &b, ld, &format!("{at} half"));
                        if kb.is_some() {
                            let at = format!("{at} blocks");
                            same_as_dot_tile(level, &q, &kbw, bstride, &c, ld, &at);
                        }
                        for h in 0..heads {
                            // The stride's gap is left alone.
                            assert!(a[h * ld + n..h * ld + ld].iter().all(|x| x.is_nan()));
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn the_score_oracle_sees_a_shifted_row() {
        // Test of the test: scores of the rows one value on from where they start must
        // differ from the true ones.
        let level = crate::simd_level();
        let (hd, n, stride) = (64, 9, 70);
        let k = pseudo(n * stride + 1, 5);
        let q = pseudo(hd, 6);
        let (mut a, mut b) = (vec![0.0; n], vec![0.0; n]);
        dot_rows(level, &[&q], &k, stride, hd, n, &mut a, n).unwrap();
        dot_rows(level, &[&q], &k[1..], stride, hd, n, &mut b, n).unwrap();
        assert_ne!(a, b);
    }

    #[test]
    fn scores_reject_bad_shapes() {
        let k = [0.0f32; 16];
        let q: &[f32] = &[0.5f32; 4];
        let mut out = [0.0f32; 16];
        let level = SimdLevel::Scalar;
        // No heads; too many heads; a query shorter than the head.
        assert!(dot_rows(level, &[], &k, 4, 4, 4, &mut out, 4).is_err());
        assert!(dot_rows(level, &[q; 5], &k, 4, 4, 2, &mut out, 2).is_err());
        assert!(dot_rows(level, &[&q[..3]], &k, 4, 4, 4, &mut out, 4).is_err());
        // Rows past the keys; an output stride under the key count; output too short.
        assert!(dot_rows(level, &[q], &k, 5, 4, 4, &mut out, 4).is_err());
        assert!(dot_rows(level, &[q], &k, 4, 4, 4, &mut out, 3).is_err());
        assert!(dot_rows(level, &[q; 4], &k, 4, 4, 4, &mut out, 5).is_err());
        assert!(dot_rows(level, &[q; 4], &k, 4, 4, 4, &mut out, 4).is_ok());
    }

    #[test]
    fn the_bitwise_oracle_sees_a_dropped_key() {
        // Test of the test: leaving out the last key's contribution must break equality.
        let level = crate::simd_level();
        let (hd, n) = (64, 9);
        let v = pseudo(n * hd, 3);
        let p = pseudo(n, 4);
        let mut out = vec![0.0; hd];
        weighted_rows(level, &[&p[..n - 1]], &v, hd, hd, &mut out).unwrap();
        assert_ne!(out, by_axpy(level, &p, &v, hd, hd));
    }

    /// Narrow value rows (`X`, made from f32 rows by `make`) of the head sizes `hds` give
    /// the bits of their widening at every level, through the vector loads and the scalar
    /// tail; a widening that differs in one value is told apart.
    fn narrow_rows_give_the_bits_of_their_widening<X: RowElem>(
        hds: &[usize],
        make: fn(&[f32]) -> Vec<X>,
    ) {
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        for level in levels() {
            for &hd in hds {
                for heads in 1..=MAX_TILE {
                    let (n, stride) = (9, hd + X::VALUES.max(3));
                    let v = make(&pseudo(n * stride, hd as u32));
                    let mut wide: Vec<f32> = (0..n * stride).map(|i| X::value(&v, i)).collect();
                    let ps: Vec<Vec<f32>> = (0..heads).map(|h| pseudo(n, 7 + h as u32)).collect();
                    let refs: Vec<&[f32]> = ps.iter().map(Vec::as_slice).collect();
                    let (mut a, mut b) = (vec![0.0; heads * hd], vec![0.0; heads * hd]);
                    weighted_rows(level, &refs, &v, stride, hd, &mut a).unwrap();
                    weighted_rows(level, &refs, &wide, stride, hd, &mut b).unwrap();
                    assert_eq!(bits(&a), bits(&b), "{level} hd={hd} heads={heads}");
                    wide[0] += 1.0;
                    weighted_rows(level, &refs, &wide, stride, hd, &mut b).unwrap();
                    assert_ne!(bits(&a), bits(&b), "{level} hd={hd}: the check is blind");
                }
            }
        }
    }

    #[test]
    fn half_rows_give_the_bits_of_their_widening() {
        narrow_rows_give_the_bits_of_their_widening(&[7, 16, 24, 64, 72, 256], |x| {
            x.iter().map(|&v| half::f16::from_f32(v * 40.0)).collect()
        });
    }

    #[test]
    fn block_rows_give_the_bits_of_their_widening() {
        narrow_rows_give_the_bits_of_their_widening(&[32, 64, 96, 256], blocks);
    }

    /// Every quant reaches the sum as its product with the block's scale: one key with
    /// weight 1 over a row of all 256 byte values, at every level.
    #[test]
    fn every_quant_widens_exactly() {
        let q: Vec<i8> = (i8::MIN..=i8::MAX).collect();
        let row: Vec<Q8Block> = q
            .chunks(32)
            .map(|c| Q8Block {
                d: 0.3,
                q: c.try_into().unwrap(),
            })
            .collect();
        for level in levels() {
            let mut out = vec![0.0; 256];
            weighted_rows(level, &[&[1.0]], &row, 256, 256, &mut out).unwrap();
            for (b, o) in q.iter().zip(&out) {
                let want = 0.3 * f32::from(*b);
                let want = if want == 0.0 { 0.0 } else { want };
                assert_eq!(o.to_bits(), want.to_bits(), "{level} {b}");
            }
        }
    }

    /// Block rows must start and end on whole blocks.
    #[test]
    fn block_rows_reject_partial_blocks() {
        let row = vec![Q8Block::default(); 4];
        let mut out = [0.0f32; 64];
        let level = SimdLevel::Scalar;
        assert!(weighted_rows(level, &[&[1.0, 1.0]], &row, 64, 64, &mut out).is_ok());
        assert!(weighted_rows(level, &[&[1.0, 1.0]], &row, 48, 32, &mut out).is_err());
        assert!(weighted_rows(level, &[&[1.0]], &row, 64, 48, &mut out).is_err());
        assert!(dot_rows(level, &[&[0.0; 64]], &row, 48, 32, 2, &mut out, 2).is_err());
    }

    /// Every non-NaN half (zeros, subnormals, infinities) reaches the sum as the f32 `half`
    /// gives it: one key with weight 1 over a row of all of them, at every level, through
    /// the vector loads and a tail. A zero comes out as +0 (0 + ±0), as from an f32 row.
    #[test]
    fn every_half_widens_exactly() {
        let halves: Vec<half::f16> = (0..=u16::MAX)
            .map(half::f16::from_bits)
            .filter(|h| !h.is_nan())
            .collect();
        let hd = halves.len();
        for level in levels() {
            let mut out = vec![0.0; hd];
            weighted_rows(level, &[&[1.0]], &halves, hd, hd, &mut out).unwrap();
            for (h, o) in halves.iter().zip(&out) {
                let want = if h.to_f32() == 0.0 { 0.0 } else { h.to_f32() };
                assert_eq!(o.to_bits(), want.to_bits(), "{level} {:#06x}", h.to_bits());
            }
        }
    }

    #[test]
    fn rejects_bad_shapes() {
        let v = [0.0f32; 8];
        let mut out = [0.0f32; 8];
        let p: &[f32] = &[0.5f32; 2];
        let level = SimdLevel::Scalar;
        assert!(weighted_rows(level, &[], &v, 4, 4, &mut out).is_err());
        assert!(weighted_rows(level, &[p; 5], &v, 4, 4, &mut out).is_err());
        assert!(weighted_rows(level, &[p, &p[..1]], &v, 4, 4, &mut out).is_err());
        assert!(weighted_rows(level, &[p], &v, 5, 4, &mut out).is_err());
        assert!(weighted_rows(level, &[p; 3], &v, 4, 4, &mut out).is_err());
        assert!(weighted_rows(level, &[p], &v, 4, 4, &mut out).is_ok());
    }
}
