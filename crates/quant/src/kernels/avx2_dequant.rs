//! AVX2 dequantizers. Each produces exactly the bits of the scalar reference: integer
//! unpacking is exact, and the float steps are the same IEEE operations in the same order
//! (`d * q`, `d * q + m` and `d * q - m` as separate multiply and add, never fused).
//!
//! Values are handled 16 at a time as two 8-lane halves.

use std::arch::x86_64::*;

use super::DequantFn;
use crate::block::{cast_blocks, f16_le};
use crate::kquants::{BlockQ4K, BlockQ5K, BlockQ6K, scale_min_k4};
use crate::legacy::{BlockQ4_0, BlockQ4_1, BlockQ5_0, BlockQ5_1, BlockQ8_0};
use crate::nonlinear::{
    BlockIq4Nl, BlockIq4Xs, BlockMxfp4, KVALUES_IQ4NL, KVALUES_MXFP4, e8m0_to_f32_half,
};
use ferrite_gguf::GgmlType;

/// The AVX2 dequantizer of `ty`, if one exists.
pub(super) fn lookup(ty: GgmlType) -> Option<DequantFn> {
    Some(match ty {
        GgmlType::F16 => f16,
        GgmlType::BF16 => bf16,
        GgmlType::Q4_0 => q4_0,
        GgmlType::Q4_1 => q4_1,
        GgmlType::Q5_0 => q5_0,
        GgmlType::Q5_1 => q5_1,
        GgmlType::Q8_0 => q8_0,
        GgmlType::Q4_K => q4k,
        GgmlType::Q5_K => q5k,
        GgmlType::Q6_K => q6k,
        GgmlType::IQ4_NL => iq4nl,
        GgmlType::IQ4_XS => iq4xs,
        GgmlType::MXFP4 => mxfp4,
        _ => return None,
    })
}

/// Declares safe wrappers around `#[target_feature]` kernels.
macro_rules! wrapper {
    ($($name:ident => $imp:ident),* $(,)?) => {$(
        fn $name(src: &[u8], dst: &mut [f32]) {
            // SAFETY: this wrapper is reachable only through `lookup`, which
            // `kernels::dequant_simd` calls only after checking AVX2/FMA/F16C are present.
            unsafe { $imp(src, dst) }
        }
    )*};
}

wrapper!(
    f16 => f16_imp, bf16 => bf16_imp, q4_0 => q4_0_imp, q4_1 => q4_1_imp, q5_0 => q5_0_imp,
    q5_1 => q5_1_imp, q8_0 => q8_0_imp, q4k => q4k_imp, q5k => q5k_imp, q6k => q6k_imp,
    iq4nl => iq4nl_imp, iq4xs => iq4xs_imp, mxfp4 => mxfp4_imp,
);

/// 16 integer lanes as two 8-lane halves.
type I16x = [__m256i; 2];

/// The float step applied to 16 integer lanes before storing.
#[derive(Clone, Copy)]
enum Step {
    /// `d * q`.
    Scale(f32),
    /// `d * q + m`.
    AddMin(f32, f32),
    /// `d * q - m`.
    SubMin(f32, f32),
}

/// Stores 16 lanes after applying `step`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn put(out: &mut [f32], q: I16x, step: Step) {
    let out = &mut out[..16];
    for (h, qh) in q.into_iter().enumerate() {
        let f = _mm256_cvtepi32_ps(qh);
        let v = match step {
            Step::Scale(d) => _mm256_mul_ps(_mm256_set1_ps(d), f),
            Step::AddMin(d, m) => {
                _mm256_add_ps(_mm256_mul_ps(_mm256_set1_ps(d), f), _mm256_set1_ps(m))
            }
            Step::SubMin(d, m) => {
                _mm256_sub_ps(_mm256_mul_ps(_mm256_set1_ps(d), f), _mm256_set1_ps(m))
            }
        };
        // SAFETY: out has exactly 16 values, so 8h..8h+8 is in bounds.
        unsafe { _mm256_storeu_ps(out.as_mut_ptr().add(8 * h), v) };
    }
}

/// Loads bytes `at..at + 16` of `b`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn load16(b: &[u8], at: usize) -> __m128i {
    let s = &b[at..at + 16];
    // SAFETY: s is exactly 16 readable bytes; the load is unaligned.
    unsafe { _mm_loadu_si128(s.as_ptr().cast()) }
}

/// 16 unsigned bytes widened to i32.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn widen_u8(b: __m128i) -> I16x {
    [
        _mm256_cvtepu8_epi32(b),
        _mm256_cvtepu8_epi32(_mm_srli_si128::<8>(b)),
    ]
}

/// 16 signed bytes widened to i32.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn widen_i8(b: __m128i) -> I16x {
    [
        _mm256_cvtepi8_epi32(b),
        _mm256_cvtepi8_epi32(_mm_srli_si128::<8>(b)),
    ]
}

/// Low and high nibbles of 16 bytes, as bytes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn nibble_bytes(b: __m128i) -> (__m128i, __m128i) {
    let mask = _mm_set1_epi8(0x0f);
    (
        _mm_and_si128(b, mask),
        _mm_and_si128(_mm_srli_epi16::<4>(b), mask),
    )
}

/// Lane-wise `a - k`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn sub_k(a: I16x, k: i32) -> I16x {
    let k = _mm256_set1_epi32(k);
    [_mm256_sub_epi32(a[0], k), _mm256_sub_epi32(a[1], k)]
}

/// Sets bit 4 of lane j where bit j of `bits` (16 bits) is set.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn with_fifth_bit(q: I16x, bits: u32) -> I16x {
    let m = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
    let sixteen = _mm256_set1_epi32(16);
    let mut out = q;
    for (h, o) in out.iter_mut().enumerate() {
        let b = _mm256_set1_epi32(((bits >> (8 * h)) & 0xff) as i32);
        let set = _mm256_cmpeq_epi32(_mm256_and_si256(b, m), m);
        *o = _mm256_or_si256(*o, _mm256_and_si256(set, sixteen));
    }
    out
}

#[target_feature(enable = "avx2,fma,f16c")]
fn f16_imp(src: &[u8], dst: &mut [f32]) {
    let n = dst.len().min(src.len() / 2);
    let n8 = n / 8;
    for c in 0..n8 {
        // SAFETY: values 8c..8c+8 are within both buffers (n bounds both).
        unsafe {
            let h = _mm_loadu_si128(src.as_ptr().add(16 * c).cast());
            _mm256_storeu_ps(dst.as_mut_ptr().add(8 * c), _mm256_cvtph_ps(h));
        }
    }
    crate::float::dequant_f16_ref(&src[16 * n8..2 * n], &mut dst[8 * n8..n]);
}

#[target_feature(enable = "avx2,fma,f16c")]
fn bf16_imp(src: &[u8], dst: &mut [f32]) {
    let n = dst.len().min(src.len() / 2);
    let n8 = n / 8;
    for c in 0..n8 {
        // SAFETY: values 8c..8c+8 are within both buffers (n bounds both).
        unsafe {
            let h = _mm_loadu_si128(src.as_ptr().add(16 * c).cast());
            let w = _mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(h));
            _mm256_storeu_ps(dst.as_mut_ptr().add(8 * c), _mm256_castsi256_ps(w));
        }
    }
    crate::float::dequant_bf16_ref(&src[16 * n8..2 * n], &mut dst[8 * n8..n]);
}

#[target_feature(enable = "avx2,fma,f16c")]
fn q4_0_imp(src: &[u8], dst: &mut [f32]) {
    for (b, out) in cast_blocks::<BlockQ4_0>(src)
        .iter()
        .zip(dst.chunks_exact_mut(32))
    {
        let d = f16_le(b.d);
        let (lo, hi) = nibble_bytes(load16(&b.qs, 0));
        put(&mut out[..16], sub_k(widen_u8(lo), 8), Step::Scale(d));
        put(&mut out[16..], sub_k(widen_u8(hi), 8), Step::Scale(d));
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
fn q4_1_imp(src: &[u8], dst: &mut [f32]) {
    for (b, out) in cast_blocks::<BlockQ4_1>(src)
        .iter()
        .zip(dst.chunks_exact_mut(32))
    {
        let step = Step::AddMin(f16_le(b.d), f16_le(b.m));
        let (lo, hi) = nibble_bytes(load16(&b.qs, 0));
        put(&mut out[..16], widen_u8(lo), step);
        put(&mut out[16..], widen_u8(hi), step);
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
fn q5_0_imp(src: &[u8], dst: &mut [f32]) {
    for (b, out) in cast_blocks::<BlockQ5_0>(src)
        .iter()
        .zip(dst.chunks_exact_mut(32))
    {
        let d = f16_le(b.d);
        let qh = u32::from_le_bytes(b.qh);
        let (lo, hi) = nibble_bytes(load16(&b.qs, 0));
        let lo = with_fifth_bit(widen_u8(lo), qh & 0xffff);
        let hi = with_fifth_bit(widen_u8(hi), qh >> 16);
        put(&mut out[..16], sub_k(lo, 16), Step::Scale(d));
        put(&mut out[16..], sub_k(hi, 16), Step::Scale(d));
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
fn q5_1_imp(src: &[u8], dst: &mut [f32]) {
    for (b, out) in cast_blocks::<BlockQ5_1>(src)
        .iter()
        .zip(dst.chunks_exact_mut(32))
    {
        let step = Step::AddMin(f16_le(b.d), f16_le(b.m));
        let qh = u32::from_le_bytes(b.qh);
        let (lo, hi) = nibble_bytes(load16(&b.qs, 0));
        put(
            &mut out[..16],
            with_fifth_bit(widen_u8(lo), qh & 0xffff),
            step,
        );
        put(&mut out[16..], with_fifth_bit(widen_u8(hi), qh >> 16), step);
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
fn q8_0_imp(src: &[u8], dst: &mut [f32]) {
    for (b, out) in cast_blocks::<BlockQ8_0>(src)
        .iter()
        .zip(dst.chunks_exact_mut(32))
    {
        let step = Step::Scale(f16_le(b.d));
        put(&mut out[..16], widen_i8(load16(&b.qs, 0)), step);
        put(&mut out[16..], widen_i8(load16(&b.qs, 16)), step);
    }
}

/// The two affine steps of Q4_K/Q5_K sub-blocks `2c` and `2c + 1`.
#[inline]
fn k_steps(d: f32, dmin: f32, scales: &[u8; 12], c: usize) -> (Step, Step) {
    let (sa, ma) = scale_min_k4(2 * c, scales);
    let (sb, mb) = scale_min_k4(2 * c + 1, scales);
    (
        Step::SubMin(d * f32::from(sa), dmin * f32::from(ma)),
        Step::SubMin(d * f32::from(sb), dmin * f32::from(mb)),
    )
}

#[target_feature(enable = "avx2,fma,f16c")]
fn q4k_imp(src: &[u8], dst: &mut [f32]) {
    for (b, out) in cast_blocks::<BlockQ4K>(src)
        .iter()
        .zip(dst.chunks_exact_mut(256))
    {
        let (d, dmin) = (f16_le(b.d), f16_le(b.dmin));
        for c in 0..4 {
            let (sa, sb) = k_steps(d, dmin, &b.scales, c);
            let o = &mut out[64 * c..64 * c + 64];
            for h in 0..2 {
                let (lo, hi) = nibble_bytes(load16(&b.qs, 32 * c + 16 * h));
                put(&mut o[16 * h..], widen_u8(lo), sa);
                put(&mut o[32 + 16 * h..], widen_u8(hi), sb);
            }
        }
    }
}

/// Bit `s` of each of 16 widened bytes, moved to bit 4.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn bit_to_16(qh: I16x, s: usize) -> I16x {
    let sh = _mm256_set1_epi32(s as i32);
    let one = _mm256_set1_epi32(1);
    qh.map(|v| _mm256_slli_epi32::<4>(_mm256_and_si256(_mm256_srlv_epi32(v, sh), one)))
}

#[target_feature(enable = "avx2,fma,f16c")]
fn q5k_imp(src: &[u8], dst: &mut [f32]) {
    for (b, out) in cast_blocks::<BlockQ5K>(src)
        .iter()
        .zip(dst.chunks_exact_mut(256))
    {
        let (d, dmin) = (f16_le(b.d), f16_le(b.dmin));
        let qh = [widen_u8(load16(&b.qh, 0)), widen_u8(load16(&b.qh, 16))];
        for c in 0..4 {
            let (sa, sb) = k_steps(d, dmin, &b.scales, c);
            let o = &mut out[64 * c..64 * c + 64];
            for h in 0..2 {
                let (lo, hi) = nibble_bytes(load16(&b.qs, 32 * c + 16 * h));
                let (ha, hb) = (bit_to_16(qh[h], 2 * c), bit_to_16(qh[h], 2 * c + 1));
                let (lo, hi) = (widen_u8(lo), widen_u8(hi));
                let lo = [_mm256_or_si256(lo[0], ha[0]), _mm256_or_si256(lo[1], ha[1])];
                let hi = [_mm256_or_si256(hi[0], hb[0]), _mm256_or_si256(hi[1], hb[1])];
                put(&mut o[16 * h..], lo, sa);
                put(&mut o[32 + 16 * h..], hi, sb);
            }
        }
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
fn q6k_imp(src: &[u8], dst: &mut [f32]) {
    let mask4 = _mm256_set1_epi32(0x0f);
    let mask2 = _mm256_set1_epi32(0x03);
    for (b, out) in cast_blocks::<BlockQ6K>(src)
        .iter()
        .zip(dst.chunks_exact_mut(256))
    {
        let d = f16_le(b.d);
        for g in 0..16 {
            // Values 16g..16g+16 share one scale; r0 is their offset in the 128-value half.
            let (c, r0) = (g / 8, (g % 8) * 16);
            let ql = widen_u8(load16(&b.ql, 64 * c + r0 % 64));
            let qh = widen_u8(load16(&b.qh, 32 * c + r0 % 32));
            let shl = _mm256_set1_epi32(4 * (r0 / 64) as i32);
            let shh = _mm256_set1_epi32(2 * (r0 / 32) as i32);
            let mut q = [_mm256_setzero_si256(); 2];
            for h in 0..2 {
                let lo = _mm256_and_si256(_mm256_srlv_epi32(ql[h], shl), mask4);
                let hi = _mm256_and_si256(_mm256_srlv_epi32(qh[h], shh), mask2);
                q[h] = _mm256_or_si256(lo, _mm256_slli_epi32::<4>(hi));
            }
            let dl = d * f32::from(b.scales[g] as i8);
            put(&mut out[16 * g..], sub_k(q, 32), Step::Scale(dl));
        }
    }
}

/// Low and high nibbles of 16 bytes looked up in a 16-entry signed table, widened to i32.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn table_nibbles(b: __m128i, table: &[i8; 16]) -> (I16x, I16x) {
    // SAFETY: the table is exactly 16 readable bytes.
    let t = unsafe { _mm_loadu_si128(table.as_ptr().cast()) };
    let (lo, hi) = nibble_bytes(b);
    (
        widen_i8(_mm_shuffle_epi8(t, lo)),
        widen_i8(_mm_shuffle_epi8(t, hi)),
    )
}

#[target_feature(enable = "avx2,fma,f16c")]
fn iq4nl_imp(src: &[u8], dst: &mut [f32]) {
    for (b, out) in cast_blocks::<BlockIq4Nl>(src)
        .iter()
        .zip(dst.chunks_exact_mut(32))
    {
        let step = Step::Scale(f16_le(b.d));
        let (lo, hi) = table_nibbles(load16(&b.qs, 0), &KVALUES_IQ4NL);
        put(&mut out[..16], lo, step);
        put(&mut out[16..], hi, step);
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
fn iq4xs_imp(src: &[u8], dst: &mut [f32]) {
    for (b, out) in cast_blocks::<BlockIq4Xs>(src)
        .iter()
        .zip(dst.chunks_exact_mut(256))
    {
        let d = f16_le(b.d);
        let sh = u16::from_le_bytes(b.scales_h);
        for (i, sub) in out.chunks_exact_mut(32).enumerate() {
            let lo = (b.scales_l[i / 2] >> (4 * (i % 2))) & 0x0f;
            let hi = ((sh >> (2 * i)) & 3) as u8;
            let step = Step::Scale(d * f32::from(((lo | (hi << 4)) as i8) - 32));
            let (a, c) = table_nibbles(load16(&b.qs, 16 * i), &KVALUES_IQ4NL);
            put(&mut sub[..16], a, step);
            put(&mut sub[16..], c, step);
        }
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
fn mxfp4_imp(src: &[u8], dst: &mut [f32]) {
    for (b, out) in cast_blocks::<BlockMxfp4>(src)
        .iter()
        .zip(dst.chunks_exact_mut(32))
    {
        let step = Step::Scale(e8m0_to_f32_half(b.e[0]));
        let (lo, hi) = table_nibbles(load16(&b.qs, 0), &KVALUES_MXFP4);
        put(&mut out[..16], lo, step);
        put(&mut out[16..], hi, step);
    }
}
