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

use super::super::MatmatFn;
use super::super::avx512::hsum;
use super::{PF, f16_le, k4_scales, kaffine, load16, load64, nibbles, scaled};
use super::{affine, table_nibbles, with_fifth_bit};
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

/// Generates `$mm(rows, cols, out)`: `out[c * rows.len() + r] = dot(row r, column c)` for
/// 1..=[`MM_ROWS`](super::super::MM_ROWS) rows of whole blocks and
/// 1..=[`MM_COLS`](super::super::MM_COLS) columns of `16 * $n * blocks` values. A block is
/// decoded as `$units` units of `$n / $units` vectors: `|$b, $u| { prelude } => unit`
/// gives unit `$u` of block `$b` (chunks `$u * V..`), after the prelude (per block).
macro_rules! multi_kernel {
    ($mm:ident, $block:ty, $n:expr, $units:expr,
     |$b:ident, $u:ident| { $($prelude:tt)* } => $unit:expr) => {
        fn $mm(rows: &[&[u8]], cols: &[&[f32]], out: &mut [f32]) {
            /// One tile of `R` rows and `C` columns over `nb` blocks.
            #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
            fn tile<const R: usize, const C: usize>(
                r: [&[$block]; R],
                x: [&[f32]; C],
                nb: usize,
                out: &mut [f32],
            ) {
                const V: usize = $n / $units;
                let r: [&[$block]; R] = r.map(|s| &s[..nb]);
                let x: [&[f32]; C] = x.map(|s| &s[..16 * $n * nb]);
                let mut acc = [[_mm512_setzero_ps(); C]; R];
                // Rows of one group are adjacent: prefetch the linear region PF bytes ahead
                // of the group's frontier, as the single-column kernel does. Prefetches
                // never fault; the pointers use wrapping arithmetic.
                let size = std::mem::size_of::<$block>();
                let base = r[0].as_ptr().cast::<i8>();
                let mut fetched = PF;
                for bi in 0..nb {
                    let frontier = R * (bi + 1) * size + PF;
                    while fetched < frontier {
                        _mm_prefetch::<_MM_HINT_T0>(base.wrapping_add(fetched));
                        fetched += 64;
                    }
                    for (row, a) in r.iter().zip(acc.iter_mut()) {
                        let $b: &$block = &row[bi];
                        $($prelude)*
                        for $u in 0..$units {
                            let v: [__m512; V] = $unit;
                            for (i, vi) in v.iter().enumerate() {
                                let off = 16 * ($n * bi + V * $u + i);
                                for (aj, xj) in a.iter_mut().zip(&x) {
                                    // SAFETY: xj holds 16 * $n * nb values (sliced above)
                                    // and off + 16 <= 16 * $n * nb.
                                    let xv = unsafe { _mm512_loadu_ps(xj.as_ptr().add(off)) };
                                    *aj = _mm512_fmadd_ps(*vi, xv, *aj);
                                }
                            }
                        }
                    }
                }
                for (ri, a) in acc.iter().enumerate() {
                    for (j, aj) in a.iter().enumerate() {
                        out[j * R + ri] = hsum(*aj);
                    }
                }
            }
            let Some(k) = cols.first().map(|c| c.len()) else {
                return;
            };
            let nb = k / (16 * $n);
            if cols.iter().any(|c| c.len() < 16 * $n * nb)
                || out.len() < rows.len() * cols.len()
                || cols.len() > super::super::MM_COLS
            {
                return;
            }
            let mut blocks: [&[$block]; super::super::MM_ROWS] = [&[]; super::super::MM_ROWS];
            for (slot, row) in blocks.iter_mut().zip(rows) {
                let b = cast_blocks::<$block>(row);
                if b.len() < nb {
                    return;
                }
                *slot = b;
            }
            match rows.len() {
                1 => by_cols!(tile, 1, [blocks[0]], cols, nb, out),
                2 => by_cols!(tile, 2, [blocks[0], blocks[1]], cols, nb, out),
                _ => {}
            }
        }
    };
}

/// Calls `$tile::<$r, C>` with `C = $cols.len()` known at compile time (1..=8).
macro_rules! by_cols {
    ($tile:ident, $r:literal, $rows:expr, $cols:expr, $nb:expr, $out:expr) => {
        by_cols!(@ $tile, $r, $rows, $cols, $nb, $out; 1, 2, 3, 4, 5, 6, 7, 8)
    };
    (@ $tile:ident, $r:literal, $rows:expr, $cols:expr, $nb:expr, $out:expr; $($c:literal),*) => {
        match $cols.len() {
            $($c => {
                let x: [&[f32]; $c] = std::array::from_fn(|j| $cols[j]);
                // SAFETY: the lookup that hands out this kernel is consulted only after
                // checking the AVX-512 set is present; every row holds nb blocks and every
                // column 16 * n * nb values (checked by the caller).
                unsafe { $tile::<$r, $c>($rows, x, $nb, $out) }
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
    let sm = k4_scales(f16_le(b.d), f16_le(b.dmin), &b.scales);
} => q4k_quarter!(b, &sm, u));
multi_kernel!(q6k_mm, BlockQ6K, 16, 4, |b, u| {
    let d = f16_le(b.d);
} => q6k_quarter!(b, d, u / 2, u % 2));
