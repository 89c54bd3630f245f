//! AVX-512 block decoders, and the dequantizers and fused matrix-vector kernels built from
//! them.
//!
//! Each format has one decoder that turns a block into 16-lane f32 vectors holding exactly
//! the bits of the scalar reference: integer unpacking is exact, and the float steps are the
//! same IEEE operations in the same order (`d * q`, `d * q + m`, `d * q - m` as separate
//! multiply and add, never fused). The dequantizer stores those vectors; the fused matvec
//! feeds them straight into the canonical-order FMA accumulators, so both paths give the
//! same bits as dequantizing and calling the f32 kernels.

use std::arch::x86_64::*;

use super::{DequantFn, MatvecFn};
use crate::block::cast_blocks;
use crate::kquants::{BlockQ4K, BlockQ5K, BlockQ6K};
use crate::legacy::{BlockQ4_0, BlockQ4_1, BlockQ5_0, BlockQ5_1, BlockQ8_0};
use crate::nonlinear::{
    BlockIq4Nl, BlockIq4Xs, BlockMxfp4, KVALUES_IQ4NL, KVALUES_MXFP4, e8m0_to_f32_half,
};
use ferrite_gguf::GgmlType;

#[macro_use]
#[path = "avx512_lut.rs"]
mod lut;
use lut::{
    byte_lanes, codes16, lookup_q5, splat_f16_pair, table_affine, table_kaffine, table_scaled,
};

#[path = "avx512_lanes.rs"]
mod lanes;
use lanes::{
    affine_v, f16_le, k4_scales_h, kaffine, load16, load64, nibbles, q6k_scales, scaled, scaled_v,
    splat_f16, table_nibbles, with_fifth_bit,
};

/// Prefetch distance of the fused multi-column kernel, and of the single-column one for
/// Q4_K, in bytes. Measured on the 2-core Zen 5 (256 MiB Q4_0/Q4_K/Q6_K, one thread): none
/// 3.0/1.9/2.2 GB/s, 8 KiB 7.8/6.4/3.3-4.3, 16 KiB 7.9-10/3.5-4.7/3.4-4.7 (a busy machine:
/// treat as +-30%).
const PF: usize = 8192;

/// Prefetch distance of the single-column fused matvec (table decoders), in bytes.
/// Measured by thread CPU time (128 MiB, one thread, GB/s for Q8_0/Q4_0/Q4_1/Q5_0/Q4_K/
/// Q6_K): 8 KiB 14.1/20.3/18.6/17.3/18.0/13.0, 12 KiB 17.9/22.3/19.5/18.7/17.2/14.7,
/// 16 KiB 21.2/21.7/19.6/18.3/16.8/14.7, 24 KiB 21.4/21.4/19.5/18.5/16.6/14.5, 32 KiB
/// 20.9/21.2/19.6/18.0/16.4/14.2. So 16 KiB, except Q4_K, which keeps [`PF`].
const PF_MATVEC: usize = 16384;

/// The AVX-512 dequantizer of `ty`, if one exists.
pub(super) fn lookup(ty: GgmlType) -> Option<DequantFn> {
    lookup_both(ty).map(|(d, _)| d)
}

/// The AVX-512 fused matvec of `ty`, if one exists. Rows must hold whole 16-value chunks.
pub(super) fn lookup_matvec(ty: GgmlType) -> Option<MatvecFn> {
    lookup_both(ty).map(|(_, m)| m)
}

fn lookup_both(ty: GgmlType) -> Option<(DequantFn, MatvecFn)> {
    Some(match ty {
        GgmlType::F32 => (f32_deq, f32_mv),
        GgmlType::F16 => (f16_deq, f16_mv),
        GgmlType::BF16 => (bf16_deq, bf16_mv),
        GgmlType::Q4_0 => (q4_0_deq, q4_0_mv),
        GgmlType::Q4_1 => (q4_1_deq, q4_1_mv),
        GgmlType::Q5_0 => (q5_0_deq, q5_0_mv),
        GgmlType::Q5_1 => (q5_1_deq, q5_1_mv),
        GgmlType::Q8_0 => (q8_0_deq, q8_0_mv),
        GgmlType::Q4_K => (q4k_deq, q4k_mv),
        GgmlType::Q5_K => (q5k_deq, q5k_mv),
        GgmlType::Q6_K => (q6k_deq, q6k_mv),
        GgmlType::IQ4_NL => (iq4nl_deq, iq4nl_mv),
        GgmlType::IQ4_XS => (iq4xs_deq, iq4xs_mv),
        GgmlType::MXFP4 => (mxfp4_deq, mxfp4_mv),
        _ => return None,
    })
}

/// One 16-value chunk of f32 stored little-endian.
#[repr(C)]
struct ChunkF32([u8; 64]);
crate::block::impl_block!(ChunkF32, 64);
/// One 16-value chunk of IEEE halves.
#[repr(C)]
struct ChunkF16([u8; 32]);
crate::block::impl_block!(ChunkF16, 32);
/// One 16-value chunk of bfloat16.
#[repr(C)]
struct ChunkBf16([u8; 32]);
crate::block::impl_block!(ChunkBf16, 32);

/// One block of each of four rows into their accumulators: decode all four blocks, then
/// interleave the four FMA chains chunk by chunk (one row's chain alone is latency-bound).
/// Right for small blocks; `$n = 16` would need 64 registers (see [`block4_q6k`]).
macro_rules! block4_whole {
    ($dec:ident, $n:expr, $blocks:expr, $xs:expr, $acc:expr) => {{
        let [b0, b1, b2, b3] = $blocks;
        let xs: &[f32] = $xs;
        let acc: &mut [__m512; 4] = $acc;
        let mut v = [[_mm512_setzero_ps(); $n]; 4];
        $dec!(b0, &mut v[0]);
        $dec!(b1, &mut v[1]);
        $dec!(b2, &mut v[2]);
        $dec!(b3, &mut v[3]);
        for c in 0..$n {
            // SAFETY: xs holds 16 * $n values, so chunk c is in bounds.
            let xv = unsafe { _mm512_loadu_ps(xs.as_ptr().add(16 * c)) };
            for (a, vr) in acc.iter_mut().zip(&v) {
                *a = _mm512_fmadd_ps(vr[c], xv, *a);
            }
        }
    }};
}

/// [`block4_whole`] for Q6_K, a quarter block (64 values) at a time: decoding four whole
/// 256-value blocks needs 64 vector registers and spilled half of them to the stack on
/// every block. Each quarter decodes exactly as [`dec_q6k`] and the FMAs of each row run in
/// the same chunk order, so the bits are the same. The two halves of each 128-value group
/// are written out so that `half` is a constant in each: as a run-time value (a loop over
/// the quarters) its shift counts were rebuilt and range-checked per quarter and row.
macro_rules! block4_q6k {
    ($dec:ident, $n:expr, $blocks:expr, $xs:expr, $acc:expr) => {{
        let bs: [&BlockQ6K; 4] = $blocks;
        let dl: [[f32; 16]; 4] = std::array::from_fn(|r| q6k_scales(splat_f16(bs[r].d), &bs[r].scales));
        let (xs, acc): (&[f32], &mut [__m512; 4]) = ($xs, $acc);
        for c in 0..2 {
            block4_quarter!(xs, acc, 2 * c, |r| q6k_quarter!(@ bs[r], &dl[r], c, 0));
            block4_quarter!(xs, acc, 2 * c + 1, |r| q6k_quarter!(@ bs[r], &dl[r], c, 1));
        }
    }};
}

/// Runs `$quarter(row, q)` (four vectors: values `64q..64q + 64` of that row's block) for
/// each of `$nq` quarters and four rows, and feeds them to the four accumulators in chunk
/// order.
macro_rules! block4_quarters {
    ($xs:expr, $acc:expr, $nq:expr, |$r:ident, $q:ident| $quarter:expr) => {{
        let (xs, acc): (&[f32], &mut [__m512; 4]) = ($xs, $acc);
        for $q in 0..$nq {
            block4_quarter!(xs, acc, $q, |$r| $quarter);
        }
    }};
}

/// One quarter `$q` of [`block4_quarters`]: `$quarter(row)` gives that row's four vectors
/// of values `64q..64q + 64`, fed to the four accumulators in chunk order. `xs` holds the
/// block's 256 activations.
macro_rules! block4_quarter {
    ($xs:ident, $acc:ident, $q:expr, |$r:ident| $quarter:expr) => {{
        let q: usize = $q;
        let v: [[__m512; 4]; 4] = std::array::from_fn(|$r| $quarter);
        for i in 0..4 {
            let xs = &$xs[16 * (4 * q + i)..16 * (4 * q + i) + 16];
            // SAFETY: xs is exactly 16 values.
            let xv = unsafe { _mm512_loadu_ps(xs.as_ptr()) };
            for (a, vr) in $acc.iter_mut().zip(&v) {
                *a = _mm512_fmadd_ps(vr[i], xv, *a);
            }
        }
    }};
}

/// Generates, for one format, the dequantizer and the fused matvec around its decoder
/// `$dec(&block, &mut [__m512; $n])`, plus their safe wrappers.
macro_rules! format_kernels {
    ($block:ty, $n:expr, $dec:ident, $deq:ident, $mv:ident, $reference:path) => {
        format_kernels!($block, $n, $dec, $deq, $mv, $reference, block4_whole);
    };
    ($block:ty, $n:expr, $dec:ident, $deq:ident, $mv:ident, $reference:path, $block4:ident) => {
        format_kernels!($block, $n, $dec, $deq, $mv, $reference, $block4, PF_MATVEC);
    };
    ($block:ty, $n:expr, $dec:ident, $deq:ident, $mv:ident, $reference:path, $block4:ident,
     $pf:expr) => {
        fn $deq(src: &[u8], dst: &mut [f32]) {
            #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
            fn imp(src: &[u8], dst: &mut [f32]) {
                let blocks = cast_blocks::<$block>(src);
                let done = blocks.len().min(dst.len() / (16 * $n));
                for (b, out) in blocks.iter().zip(dst.chunks_exact_mut(16 * $n)) {
                    let mut v = [_mm512_setzero_ps(); $n];
                    $dec!(b, &mut v);
                    for (c, o) in out.chunks_exact_mut(16).enumerate() {
                        // SAFETY: each chunk `o` is exactly 16 writable f32.
                        unsafe { _mm512_storeu_ps(o.as_mut_ptr(), v[c]) };
                    }
                }
                // Only the unblocked float formats can leave a partial chunk.
                let size = std::mem::size_of::<$block>();
                $reference(&src[done * size..], &mut dst[done * 16 * $n..]);
            }
            // SAFETY: reachable only through `lookup`/`lookup_matvec`, which the dispatcher
            // in `kernels` consults only after checking the AVX-512 set is present.
            unsafe { imp(src, dst) }
        }

        fn $mv(rows: &[&[u8]], x: &[f32], out: &mut [f32]) {
            /// Adds one block of one row into its accumulator, chunk by chunk.
            #[inline]
            #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
            fn step(b: &$block, xs: &[f32], acc: __m512) -> __m512 {
                let mut v = [_mm512_setzero_ps(); $n];
                $dec!(b, &mut v);
                let xs = &xs[..16 * $n];
                let mut acc = acc;
                for (c, vc) in v.iter().enumerate() {
                    // SAFETY: xs holds 16 * $n values, so chunk c is in bounds.
                    let xv = unsafe { _mm512_loadu_ps(xs.as_ptr().add(16 * c)) };
                    acc = _mm512_fmadd_ps(*vc, xv, acc);
                }
                acc
            }
            /// Four rows at once (independent FMA chains, shared activation loads).
            #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
            fn four(r: [&[$block]; 4], x: &[f32], nb: usize) -> [f32; 4] {
                let [r0, r1, r2, r3] = r;
                let (r0, r1, r2, r3) = (&r0[..nb], &r1[..nb], &r2[..nb], &r3[..nb]);
                let mut acc = [_mm512_setzero_ps(); 4];
                // The four rows are usually adjacent in memory, and each is short (a few
                // KiB), too short for the hardware prefetcher to lock on to four separate
                // streams: prefetch the linear region a fixed distance ahead of the group's
                // frontier instead. Prefetches never fault, and the pointers are formed
                // with wrapping arithmetic, so running past the end is harmless.
                let size = std::mem::size_of::<$block>();
                let base = r0.as_ptr().cast::<i8>();
                let mut fetched = $pf;
                for bi in 0..nb {
                    let xs = &x[16 * $n * bi..];
                    let frontier = 4 * (bi + 1) * size + $pf;
                    while fetched < frontier {
                        _mm_prefetch::<_MM_HINT_T0>(base.wrapping_add(fetched));
                        fetched += 64;
                    }
                    let blocks = [&r0[bi], &r1[bi], &r2[bi], &r3[bi]];
                    $block4!($dec, $n, blocks, &xs[..16 * $n], &mut acc);
                }
                use super::avx512::hsum;
                [hsum(acc[0]), hsum(acc[1]), hsum(acc[2]), hsum(acc[3])]
            }
            /// One row.
            #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
            fn one(r: &[$block], x: &[f32], nb: usize) -> f32 {
                let mut a = _mm512_setzero_ps();
                for (bi, b) in r[..nb].iter().enumerate() {
                    a = step(b, &x[16 * $n * bi..], a);
                }
                super::avx512::hsum(a)
            }
            let nb = x.len() / (16 * $n);
            fn whole(r: &[u8], nb: usize) -> Option<&[$block]> {
                let b = cast_blocks::<$block>(r);
                if b.len() >= nb { Some(b) } else { None }
            }
            match rows {
                [a, b, c, d] => {
                    if let (Some(a), Some(b), Some(c), Some(d)) =
                        (whole(a, nb), whole(b, nb), whole(c, nb), whole(d, nb))
                    {
                        // SAFETY: only handed out after the AVX-512 check, like the
                        // dequantizer; every row holds at least nb blocks (`whole`).
                        let y = unsafe { four([a, b, c, d], x, nb) };
                        out[..4].copy_from_slice(&y);
                    }
                }
                _ => {
                    for (r, o) in rows.iter().zip(out.iter_mut()) {
                        if let Some(b) = whole(r, nb) {
                            // SAFETY: as above.
                            *o = unsafe { one(b, x, nb) };
                        }
                    }
                }
            }
        }
    };
}

/// Decodes one `ChunkF32` into `[__m512; 1]` (a macro so it always inlines into the
/// kernels: as a function LLVM leaves the larger decoders out of line).
macro_rules! dec_f32 {
    ($b:expr, $v:expr) => {{
        let b: &ChunkF32 = $b;
        let v: &mut [__m512; 1] = $v;
        // SAFETY: the chunk is exactly 64 readable bytes; the load is unaligned.
        v[0] = unsafe { _mm512_loadu_ps(b.0.as_ptr().cast()) };
    }};
}

/// Decodes one `ChunkF16` into `[__m512; 1]` (a macro so it always inlines into the
/// kernels: as a function LLVM leaves the larger decoders out of line).
macro_rules! dec_f16 {
    ($b:expr, $v:expr) => {{
        let b: &ChunkF16 = $b;
        let v: &mut [__m512; 1] = $v;
        // SAFETY: the chunk is exactly 32 readable bytes; the load is unaligned.
        let h = unsafe { _mm256_loadu_si256(b.0.as_ptr().cast()) };
        v[0] = _mm512_cvtph_ps(h);
    }};
}

/// Decodes one `ChunkBf16` into `[__m512; 1]` (a macro so it always inlines into the
/// kernels: as a function LLVM leaves the larger decoders out of line).
macro_rules! dec_bf16 {
    ($b:expr, $v:expr) => {{
        let b: &ChunkBf16 = $b;
        let v: &mut [__m512; 1] = $v;
        // SAFETY: the chunk is exactly 32 readable bytes; the load is unaligned.
        let h = unsafe { _mm256_loadu_si256(b.0.as_ptr().cast()) };
        v[0] = _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(h)));
    }};
}

/// Decodes one `BlockQ4_0` into `[__m512; 2]` (a macro so it always inlines into the
/// kernels: as a function LLVM leaves the larger decoders out of line).
macro_rules! dec_q4_0 {
    ($b:expr, $v:expr) => {{
        let b: &BlockQ4_0 = $b;
        let v: &mut [__m512; 2] = $v;
        let d = splat_f16(b.d);
        let eight = _mm512_set1_epi32(8);
        let (lo, hi) = nibbles(load16(&b.qs, 0));
        v[0] = scaled_v(_mm512_sub_epi32(lo, eight), d);
        v[1] = scaled_v(_mm512_sub_epi32(hi, eight), d);
    }};
}

/// Decodes one `BlockQ4_1` into `[__m512; 2]` (a macro so it always inlines into the
/// kernels: as a function LLVM leaves the larger decoders out of line).
macro_rules! dec_q4_1 {
    ($b:expr, $v:expr) => {{
        let b: &BlockQ4_1 = $b;
        let v: &mut [__m512; 2] = $v;
        let (d, m) = (splat_f16(b.d), splat_f16(b.m));
        let (lo, hi) = nibbles(load16(&b.qs, 0));
        v[0] = affine_v(lo, d, m);
        v[1] = affine_v(hi, d, m);
    }};
}

/// Decodes one `BlockQ5_0` into `[__m512; 2]` (a macro so it always inlines into the
/// kernels: as a function LLVM leaves the larger decoders out of line).
macro_rules! dec_q5_0 {
    ($b:expr, $v:expr) => {{
        let b: &BlockQ5_0 = $b;
        let v: &mut [__m512; 2] = $v;
        let d = splat_f16(b.d);
        let qh = u32::from_le_bytes(b.qh);
        let sixteen = _mm512_set1_epi32(16);
        let (lo, hi) = nibbles(load16(&b.qs, 0));
        v[0] = scaled_v(_mm512_sub_epi32(with_fifth_bit(lo, qh as u16), sixteen), d);
        v[1] = scaled_v(
            _mm512_sub_epi32(with_fifth_bit(hi, (qh >> 16) as u16), sixteen),
            d,
        );
    }};
}

/// Decodes one `BlockQ5_1` into `[__m512; 2]` (a macro so it always inlines into the
/// kernels: as a function LLVM leaves the larger decoders out of line).
macro_rules! dec_q5_1 {
    ($b:expr, $v:expr) => {{
        let b: &BlockQ5_1 = $b;
        let v: &mut [__m512; 2] = $v;
        let (d, m) = (splat_f16(b.d), splat_f16(b.m));
        let qh = u32::from_le_bytes(b.qh);
        let (lo, hi) = nibbles(load16(&b.qs, 0));
        v[0] = affine_v(with_fifth_bit(lo, qh as u16), d, m);
        v[1] = affine_v(with_fifth_bit(hi, (qh >> 16) as u16), d, m);
    }};
}

/// Decodes one `BlockQ8_0` into `[__m512; 2]` (a macro so it always inlines into the
/// kernels: as a function LLVM leaves the larger decoders out of line).
macro_rules! dec_q8_0 {
    ($b:expr, $v:expr) => {{
        let b: &BlockQ8_0 = $b;
        let v: &mut [__m512; 2] = $v;
        let d = splat_f16(b.d);
        v[0] = scaled_v(_mm512_cvtepi8_epi32(load16(&b.qs, 0)), d);
        v[1] = scaled_v(_mm512_cvtepi8_epi32(load16(&b.qs, 16)), d);
    }};
}

/// Values `64c..64c + 64` of a `BlockQ4K` as four vectors, given its [`k4_scales_h`].
macro_rules! q4k_quarter {
    ($b:expr, $sm:expr, $c:expr) => {{
        let (b, sm, c): (&BlockQ4K, &[f32; 16], usize) = ($b, $sm, $c);
        let (da, mma) = (sm[2 * c], sm[8 + 2 * c]);
        let (db, mmb) = (sm[2 * c + 1], sm[9 + 2 * c]);
        let mut v = [_mm512_setzero_ps(); 4];
        for h in 0..2 {
            let (lo, hi) = nibbles(load16(&b.qs, 32 * c + 16 * h));
            v[h] = kaffine(lo, da, mma);
            v[2 + h] = kaffine(hi, db, mmb);
        }
        v
    }};
}

/// Decodes one `BlockQ5K` into `[__m512; 16]` (a macro so it always inlines into the
/// kernels: as a function LLVM leaves the larger decoders out of line).
macro_rules! dec_q5k {
    ($b:expr, $v:expr) => {{
        let b: &BlockQ5K = $b;
        let v: &mut [__m512; 16] = $v;
        let one = _mm512_set1_epi32(1);
        let qh = [
            _mm512_cvtepu8_epi32(load16(&b.qh, 0)),
            _mm512_cvtepu8_epi32(load16(&b.qh, 16)),
        ];
        let sm = k4_scales_h(b.d, b.dmin, &b.scales);
        for c in 0..4 {
            let (da, mma) = (sm[2 * c], sm[8 + 2 * c]);
            let (db, mmb) = (sm[2 * c + 1], sm[9 + 2 * c]);
            let sha = _mm512_set1_epi32(2 * c as i32);
            let shb = _mm512_set1_epi32(2 * c as i32 + 1);
            for h in 0..2 {
                let (lo, hi) = nibbles(load16(&b.qs, 32 * c + 16 * h));
                let ha = _mm512_and_si512(_mm512_srlv_epi32(qh[h], sha), one);
                let hb = _mm512_and_si512(_mm512_srlv_epi32(qh[h], shb), one);
                let lo = _mm512_or_si512(lo, _mm512_slli_epi32::<4>(ha));
                let hi = _mm512_or_si512(hi, _mm512_slli_epi32::<4>(hb));
                v[4 * c + h] = kaffine(lo, da, mma);
                v[4 * c + 2 + h] = kaffine(hi, db, mmb);
            }
        }
    }};
}

/// Decodes one `BlockQ6K` into `[__m512; 16]` (a macro so it always inlines into the
/// kernels: as a function LLVM leaves the larger decoders out of line).
macro_rules! dec_q6k {
    ($b:expr, $v:expr) => {{
        let b: &BlockQ6K = $b;
        let v: &mut [__m512; 16] = $v;
        let dl = q6k_scales(splat_f16(b.d), &b.scales);
        for c in 0..2 {
            for half in 0..2 {
                let g0 = 8 * c + 4 * half;
                v[g0..g0 + 4].copy_from_slice(&q6k_quarter!(@ b, &dl, c, half));
            }
        }
    }};
}

/// Values `128c + 64 half..` + 64 of a `BlockQ6K` as four vectors. Whole 64-value groups at
/// byte width (AVX-512BW), widened only at the end: the shifts act on 16-bit words, and the
/// masks drop the bits that cross bytes.
///
/// `q6k_quarter!(b, d, c, half)` computes each sub-block scale `d * scale` as it goes (the
/// multi-column kernel); `q6k_quarter!(@ b, &dl, c, half)` takes all sixteen from
/// [`q6k_scales`] (the single-column kernels).
macro_rules! q6k_quarter {
    ($b:expr, $d:expr, $c:expr, $half:expr) => {{
        let (b, d): (&BlockQ6K, f32) = ($b, $d);
        q6k_quarter!(% b, $c, $half, |g| _mm512_set1_ps(d * f32::from(b.scales[g] as i8)))
    }};
    (@ $b:expr, $dl:expr, $c:expr, $half:expr) => {{
        let dl: &[f32; 16] = $dl;
        q6k_quarter!(% $b, $c, $half, |g| _mm512_set1_ps(dl[g]))
    }};
    (% $b:expr, $c:expr, $half:expr, |$g:ident| $dl:expr) => {{
        let (b, c, half): (&BlockQ6K, usize, usize) = ($b, $c, $half);
        let m4 = _mm512_set1_epi8(0x0f);
        let m2 = _mm512_set1_epi8(0x03);
        let off = _mm512_set1_epi8(32);
        let ql = load64(&b.ql, 64 * c);
        // SAFETY: bytes 32c..32c+32 of the 64-byte qh are in bounds.
        let qh = unsafe { _mm256_loadu_si256(b.qh.as_ptr().add(32 * c).cast()) };
        let qh = _mm512_broadcast_i64x4(qh);
        let lo = if half == 0 {
            ql
        } else {
            _mm512_srli_epi16::<4>(ql)
        };
        let lo = _mm512_and_si512(lo, m4);
        // Values 0..32 of this 64 take qh bits 4*half, values 32..64 bits 4*half+2.
        let sh = _mm512_inserti64x4::<1>(
            _mm512_set1_epi16(4 * half as i16),
            _mm256_set1_epi16(4 * half as i16 + 2),
        );
        let hi = _mm512_and_si512(_mm512_srlv_epi16(qh, sh), m2);
        let q = _mm512_sub_epi8(_mm512_or_si512(lo, _mm512_slli_epi16::<4>(hi)), off);
        let g0 = 8 * c + 4 * half;
        let parts = [
            _mm512_extracti32x4_epi32::<0>(q),
            _mm512_extracti32x4_epi32::<1>(q),
            _mm512_extracti32x4_epi32::<2>(q),
            _mm512_extracti32x4_epi32::<3>(q),
        ];
        let mut v = [_mm512_setzero_ps(); 4];
        for (i, part) in parts.into_iter().enumerate() {
            let $g = g0 + i;
            v[i] = _mm512_mul_ps($dl, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(part)));
        }
        v
    }};
}

/// Decodes one `BlockIq4Nl` into `[__m512; 2]` (a macro so it always inlines into the
/// kernels: as a function LLVM leaves the larger decoders out of line).
macro_rules! dec_iq4nl {
    ($b:expr, $v:expr) => {{
        let b: &BlockIq4Nl = $b;
        let v: &mut [__m512; 2] = $v;
        let d = splat_f16(b.d);
        let (lo, hi) = table_nibbles(load16(&b.qs, 0), &KVALUES_IQ4NL);
        v[0] = scaled_v(lo, d);
        v[1] = scaled_v(hi, d);
    }};
}

/// Decodes one `BlockIq4Xs` into `[__m512; 16]` (a macro so it always inlines into the
/// kernels: as a function LLVM leaves the larger decoders out of line).
macro_rules! dec_iq4xs {
    ($b:expr, $v:expr) => {{
        let b: &BlockIq4Xs = $b;
        let v: &mut [__m512; 16] = $v;
        let d = f16_le(b.d);
        let sh = u16::from_le_bytes(b.scales_h);
        for i in 0..8 {
            let lo = (b.scales_l[i / 2] >> (4 * (i % 2))) & 0x0f;
            let hi = ((sh >> (2 * i)) & 3) as u8;
            let dl = d * f32::from(((lo | (hi << 4)) as i8) - 32);
            let (a, c) = table_nibbles(load16(&b.qs, 16 * i), &KVALUES_IQ4NL);
            v[2 * i] = scaled(a, dl);
            v[2 * i + 1] = scaled(c, dl);
        }
    }};
}

/// Decodes one `BlockMxfp4` into `[__m512; 2]` (a macro so it always inlines into the
/// kernels: as a function LLVM leaves the larger decoders out of line).
macro_rules! dec_mxfp4 {
    ($b:expr, $v:expr) => {{
        let b: &BlockMxfp4 = $b;
        let v: &mut [__m512; 2] = $v;
        let d = e8m0_to_f32_half(b.e[0]);
        let (lo, hi) = table_nibbles(load16(&b.qs, 0), &KVALUES_MXFP4);
        v[0] = scaled(lo, d);
        v[1] = scaled(hi, d);
    }};
}

format_kernels!(
    ChunkF32,
    1,
    dec_f32,
    f32_deq,
    f32_mv,
    crate::float::dequant_f32_ref
);
format_kernels!(
    ChunkF16,
    1,
    dec_f16,
    f16_deq,
    f16_mv,
    crate::float::dequant_f16_ref
);
format_kernels!(
    ChunkBf16,
    1,
    dec_bf16,
    bf16_deq,
    bf16_mv,
    crate::float::dequant_bf16_ref
);
format_kernels!(
    BlockQ4_0,
    2,
    lut_q4_0,
    q4_0_deq,
    q4_0_mv,
    crate::legacy::dequant_q4_0_ref
);
format_kernels!(
    BlockQ4_1,
    2,
    lut_q4_1,
    q4_1_deq,
    q4_1_mv,
    crate::legacy::dequant_q4_1_ref
);
format_kernels!(
    BlockQ5_0,
    2,
    lut_q5_0,
    q5_0_deq,
    q5_0_mv,
    crate::legacy::dequant_q5_0_ref
);
format_kernels!(
    BlockQ5_1,
    2,
    lut_q5_1,
    q5_1_deq,
    q5_1_mv,
    crate::legacy::dequant_q5_1_ref
);
format_kernels!(
    BlockQ8_0,
    2,
    splat_q8_0,
    q8_0_deq,
    q8_0_mv,
    crate::legacy::dequant_q8_0_ref
);
format_kernels!(
    BlockQ4K,
    16,
    lut_q4k,
    q4k_deq,
    q4k_mv,
    crate::kquants::dequant_q4k_ref,
    block4_lut_q4k,
    PF
);
format_kernels!(
    BlockQ5K,
    16,
    dec_q5k,
    q5k_deq,
    q5k_mv,
    crate::kquants::dequant_q5k_ref
);
format_kernels!(
    BlockQ6K,
    16,
    dec_q6k,
    q6k_deq,
    q6k_mv,
    crate::kquants::dequant_q6k_ref,
    block4_q6k
);
format_kernels!(
    BlockIq4Nl,
    2,
    lut_iq4nl,
    iq4nl_deq,
    iq4nl_mv,
    crate::nonlinear::dequant_iq4nl_ref
);
format_kernels!(
    BlockIq4Xs,
    16,
    dec_iq4xs,
    iq4xs_deq,
    iq4xs_mv,
    crate::nonlinear::dequant_iq4xs_ref
);
format_kernels!(
    BlockMxfp4,
    2,
    dec_mxfp4,
    mxfp4_deq,
    mxfp4_mv,
    crate::nonlinear::dequant_mxfp4_ref
);

// After the decoder macros, so they are in textual scope there.
#[path = "avx512_multi.rs"]
pub(super) mod multi;
