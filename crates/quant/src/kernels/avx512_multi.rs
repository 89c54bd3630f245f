//! AVX-512 fused multi-column matvec: a few weight rows against a few activation columns
//! (one per decoding session), each weight block decoded in registers once per column group
//! and fed to every column's accumulator.
//!
//! Order: each (row, column) output has its own 16-lane accumulator, starting at zero, fed
//! one FMA per consecutive 16-value chunk of `k` (the decoders of the parent module give the
//! chunks of a block in order), then reduced with [`hsum`] — exactly the order of the
//! single-column fused matvec, so every column's result has the same bits as running that
//! column alone. A child module of `avx512_dequant` so the block decoder macros are in scope.

use std::arch::x86_64::*;

use super::super::avx512::{hsum, hsum16};
use super::super::{MatmatFn, prefetch_ahead};
use super::{PF, k4_scales_h, kaffine, load16, load64, nibbles, q6k_scales, splat_f16};
use super::{affine_v, scaled, scaled_v, table_nibbles, with_fifth_bit};
use crate::block::cast_blocks;
use crate::kquants::{BlockQ4K, BlockQ6K};
use crate::legacy::{BlockQ4_0, BlockQ4_1, BlockQ5_0, BlockQ5_1, BlockQ8_0};
use crate::nonlinear::{BlockIq4Nl, BlockMxfp4, KVALUES_IQ4NL, KVALUES_MXFP4, e8m0_to_f32_half};
use ferrite_gguf::GgmlType;

use super::{ChunkBf16, ChunkF16, ChunkF32};

/// The fused multi-column kernel of `ty`, if there is one (formats whose decoder needs more
/// than four vectors at once at a time, Q5_K and IQ4_XS, have none).
pub(in crate::kernels) fn lookup(ty: GgmlType) -> Option<MatmatFn> {
    Some(match ty {
        GgmlType::F32 => f32_mm,
        GgmlType::F16 => f16_mm,
        GgmlType::BF16 => bf16_mm,
        GgmlType::Q4_0 => q4_0_mm,
        GgmlType::Q4_1 => q4_1_mm,
        GgmlType::Q5_0 => q5_0_mm,
        GgmlType::Q5_1 => q5_1_mm,
        GgmlType::Q8_0 => q8_0_mm,
        GgmlType::Q4_K => q4k_mm,
        GgmlType::Q6_K => q6k_mm,
        GgmlType::IQ4_NL => iq4nl_mm,
        GgmlType::MXFP4 => mxfp4_mm,
        _ => return None,
    })
}

/// Generates `$mm(w, nr, cols, out, stride)`: `out[c * stride + r] = dot(row r, column c)`
/// for the `nr` rows of whole blocks in `w` and 1..=[`MM_COLS`](super::super::MM_COLS) columns of `16 * $n *
/// blocks` values (a [`MatmatFn`]). A block is decoded as `$units` units of `$n / $units`
/// vectors: `|$b, $u| { prelude } => unit` gives unit `$u` of block `$b` (chunks `$u * V..`),
/// after the prelude (run once per block).
macro_rules! multi_kernel {
    ($mm:ident, $block:ty, $n:expr, $units:expr,
     |$b:ident, $u:ident| { $($prelude:tt)* } => $unit:expr) => {
        fn $mm(w: &[u8], nr: usize, cols: &[&[f32]], out: &mut [f32], stride: usize) {
            /// `R` adjacent rows (`nb` blocks each) by `C` columns, written to
            /// `out[j * stride + r0 + i]`.
            #[inline]
            #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
            fn tile<const R: usize, const C: usize>(
                rows: &[$block],
                x: &[&[f32]; C],
                nb: usize,
                out: &mut [f32],
                stride: usize,
                r0: usize,
            ) {
                const V: usize = $n / $units;
                let r: [&[$block]; R] = std::array::from_fn(|i| &rows[i * nb..(i + 1) * nb]);
                let mut acc = [[_mm512_setzero_ps(); C]; R];
                // Rows of one group are adjacent: prefetch the linear region PF bytes ahead
                // of the group's frontier, as the single-column kernel does. Prefetches
                // never fault; the pointers use wrapping arithmetic.
                let size = std::mem::size_of::<$block>();
                let base = rows.as_ptr().cast::<i8>();
                let mut fetched = PF;
                for bi in 0..nb {
                    prefetch_ahead(base, &mut fetched, R * (bi + 1) * size + PF);
                    if $units == 1 {
                        // Whole-block decoders: every row's block decoded first, so each
                        // column's chunk is loaded once for all R rows (one load per R
                        // FMAs, not per FMA). Each accumulator still takes its chunks in
                        // order.
                        let v: [[__m512; V]; R] = std::array::from_fn(|i| {
                            // SAFETY: every row slice holds nb blocks (sliced above), bi < nb.
                            let $b: &$block = unsafe { r[i].get_unchecked(bi) };
                            $($prelude)*
                            let $u = 0;
                            $unit
                        });
                        for c in 0..V {
                            let off = 16 * ($n * bi + c);
                            for (j, xj) in x.iter().enumerate() {
                                // SAFETY: every column holds 16 * $n * nb values (checked
                                // by `$mm`) and off + 16 <= 16 * $n * nb.
                                let xv = unsafe { _mm512_loadu_ps(xj.as_ptr().add(off)) };
                                for (a, vr) in acc.iter_mut().zip(&v) {
                                    a[j] = _mm512_fmadd_ps(vr[c], xv, a[j]);
                                }
                            }
                        }
                        continue;
                    }
                    for (row, a) in r.iter().zip(acc.iter_mut()) {
                        // SAFETY: every row slice holds nb blocks (sliced above), bi < nb.
                        let $b: &$block = unsafe { row.get_unchecked(bi) };
                        $($prelude)*
                        for $u in 0..$units {
                            let v: [__m512; V] = $unit;
                            for (i, vi) in v.iter().enumerate() {
                                let off = 16 * ($n * bi + V * $u + i);
                                for (aj, xj) in a.iter_mut().zip(x) {
                                    // SAFETY: every column holds 16 * $n * nb values
                                    // (checked by `$mm`) and off + 16 <= 16 * $n * nb.
                                    let xv = unsafe { _mm512_loadu_ps(xj.as_ptr().add(off)) };
                                    *aj = _mm512_fmadd_ps(*vi, xv, *aj);
                                }
                            }
                        }
                    }
                }
                if R * C == 16 {
                    // Sixteen reductions at once, the same bits as sixteen `hsum`s.
                    let flat: [__m512; 16] = std::array::from_fn(|o| acc[o / C][o % C]);
                    let sums = hsum16(&flat);
                    for (o, s) in sums.iter().enumerate() {
                        out[(o % C) * stride + r0 + o / C] = *s;
                    }
                } else {
                    for (i, a) in acc.iter().enumerate() {
                        for (j, aj) in a.iter().enumerate() {
                            out[j * stride + r0 + i] = hsum(*aj);
                        }
                    }
                }
            }
            /// All `nr` rows, `R` at a time, then the rest one by one.
            #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
            fn run<const R: usize, const C: usize>(
                w: &[$block],
                nb: usize,
                nr: usize,
                x: [&[f32]; C],
                out: &mut [f32],
                stride: usize,
            ) {
                let mut r0 = 0;
                while r0 + R <= nr {
                    tile::<R, C>(&w[r0 * nb..(r0 + R) * nb], &x, nb, out, stride, r0);
                    r0 += R;
                }
                while r0 < nr {
                    tile::<1, C>(&w[r0 * nb..(r0 + 1) * nb], &x, nb, out, stride, r0);
                    r0 += 1;
                }
            }
            let Some(k) = cols.first().map(|c| c.len()) else {
                return;
            };
            let nb = k / (16 * $n);
            let blocks = cast_blocks::<$block>(w);
            let fits = cols.len().checked_sub(1).map(|c| c * stride + nr);
            if cols.iter().any(|c| c.len() < 16 * $n * nb)
                || blocks.len() < nr * nb
                || fits.is_none_or(|f| out.len() < f)
                || stride < nr
            {
                return;
            }
            by_cols!(run, blocks, nb, nr, cols, out, stride);
        }
    };
}

/// Calls `$run::<R, C>` with `C = $cols.len()` (1..=[`MM_COLS`](super::super::MM_COLS))
/// and the row count `R` that goes with it. Measured (Zen 5, one thread, Q4_1/Q8_0 rows in
/// L2, ns per row-block for 1/2/4/8/16 columns): 4 rows x up to 4 columns 1.4/1.8/2.3/5.2
/// /10.4; 2 x up to 8: 2.9/2.9/3.4/4.3/8.7; 1 x up to 16: 3.8/4.3/5.3/6.3/10.9. So four
/// rows while the columns fit four accumulators each, then two rows of up to eight.
macro_rules! by_cols {
    ($run:ident, $w:expr, $nb:expr, $nr:expr, $cols:expr, $out:expr, $stride:expr) => {
        by_cols!(@ $run, $w, $nb, $nr, $cols, $out, $stride;
            1 => 4, 2 => 4, 3 => 4, 4 => 4, 5 => 2, 6 => 2, 7 => 2, 8 => 2)
    };
    (@ $run:ident, $w:expr, $nb:expr, $nr:expr, $cols:expr, $out:expr, $stride:expr;
     $($c:literal => $r:literal),*) => {
        match $cols.len() {
            $($c => {
                let x: [&[f32]; $c] = std::array::from_fn(|j| $cols[j]);
                // SAFETY: the lookup that hands out this kernel is consulted only after
                // checking the AVX-512 set is present; every row holds nb blocks and every
                // column 16 * n * nb values, and out has room for every output (checked
                // by the caller).
                unsafe { $run::<$r, $c>($w, $nb, $nr, x, $out, $stride) }
            })*
            _ => {}
        }
    };
}

/// A whole-block decoder as a single unit.
macro_rules! whole_kernel {
    ($mm:ident, $block:ty, $n:expr, $dec:ident) => {
        multi_kernel!($mm, $block, $n, 1, |b, _u| {} => {
            let mut v = [_mm512_setzero_ps(); $n];
            $dec!(b, &mut v);
            v
        });
    };
}

whole_kernel!(f32_mm, ChunkF32, 1, dec_f32);
whole_kernel!(f16_mm, ChunkF16, 1, dec_f16);
whole_kernel!(bf16_mm, ChunkBf16, 1, dec_bf16);
whole_kernel!(q4_0_mm, BlockQ4_0, 2, dec_q4_0);
whole_kernel!(q4_1_mm, BlockQ4_1, 2, dec_q4_1);
whole_kernel!(q5_0_mm, BlockQ5_0, 2, dec_q5_0);
whole_kernel!(q5_1_mm, BlockQ5_1, 2, dec_q5_1);
whole_kernel!(q8_0_mm, BlockQ8_0, 2, dec_q8_0);
whole_kernel!(iq4nl_mm, BlockIq4Nl, 2, dec_iq4nl);
whole_kernel!(mxfp4_mm, BlockMxfp4, 2, dec_mxfp4);
multi_kernel!(q4k_mm, BlockQ4K, 16, 4, |b, u| {
    let sm = k4_scales_h(b.d, b.dmin, &b.scales);
} => q4k_quarter!(b, &sm, u));
multi_kernel!(q6k_mm, BlockQ6K, 16, 4, |b, u| {
    let dl = q6k_scales(splat_f16(b.d), &b.scales);
} => q6k_quarter!(@ b, &dl, u / 2, u % 2));
