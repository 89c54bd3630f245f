//! AVX-512 dequantizers. Each produces exactly the bits of the scalar reference: integer
//! unpacking is exact, and the float steps are the same IEEE operations in the same order
//! (`d * q`, `d * q + m` and `d * q - m` as separate multiply and add, never fused).

use std::arch::x86_64::*;

use super::DequantFn;
use crate::block::{cast_blocks, f16_le};
use crate::kquants::{BlockQ4K, BlockQ5K, BlockQ6K, scale_min_k4};
use crate::legacy::{BlockQ4_0, BlockQ4_1, BlockQ5_0, BlockQ5_1, BlockQ8_0};
use crate::nonlinear::{
    BlockIq4Nl, BlockIq4Xs, BlockMxfp4, KVALUES_IQ4NL, KVALUES_MXFP4, e8m0_to_f32_half,
};
use ferrite_gguf::GgmlType;

/// The AVX-512 dequantizer of `ty`, if one exists.
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

/// Declares a safe wrapper around a `#[target_feature]` kernel.
macro_rules! wrapper {
    ($($name:ident => $imp:ident),* $(,)?) => {$(
        fn $name(src: &[u8], dst: &mut [f32]) {
            // SAFETY: this wrapper is reachable only through `lookup`, which
            // `kernels::dequant_simd` calls only after checking the AVX-512 set is present.
            unsafe { $imp(src, dst) }
        }
    )*};
}

wrapper!(
    f16 => f16_imp, bf16 => bf16_imp, q4_0 => q4_0_imp, q4_1 => q4_1_imp, q5_0 => q5_0_imp,
    q5_1 => q5_1_imp, q8_0 => q8_0_imp, q4k => q4k_imp, q5k => q5k_imp, q6k => q6k_imp,
    iq4nl => iq4nl_imp, iq4xs => iq4xs_imp, mxfp4 => mxfp4_imp,
);

/// Stores `d * q` for 16 integer lanes.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
fn put_scaled(out: &mut [f32], q: __m512i, d: f32) {
    let v = _mm512_mul_ps(_mm512_set1_ps(d), _mm512_cvtepi32_ps(q));
    assert!(out.len() >= 16);
    // SAFETY: out holds at least 16 values (asserted).
    unsafe { _mm512_storeu_ps(out.as_mut_ptr(), v) };
}

/// Stores `d * q + m` (two roundings) for 16 integer lanes.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
fn put_affine(out: &mut [f32], q: __m512i, d: f32, m: f32) {
    let v = _mm512_mul_ps(_mm512_set1_ps(d), _mm512_cvtepi32_ps(q));
    let v = _mm512_add_ps(v, _mm512_set1_ps(m));
    assert!(out.len() >= 16);
    // SAFETY: out holds at least 16 values (asserted).
    unsafe { _mm512_storeu_ps(out.as_mut_ptr(), v) };
}

/// Loads 16 bytes.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
fn load16(b: &[u8; 16]) -> __m128i {
    // SAFETY: b is exactly 16 readable bytes; the load is unaligned.
    unsafe { _mm_loadu_si128(b.as_ptr().cast()) }
}

/// Loads bytes `at..at + 16` of `b`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
fn load16_at(b: &[u8], at: usize) -> __m128i {
    let s = &b[at..at + 16];
    // SAFETY: s is exactly 16 readable bytes; the load is unaligned.
    unsafe { _mm_loadu_si128(s.as_ptr().cast()) }
}

/// Low and high nibbles of 16 bytes, each widened to 16 i32 lanes.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
fn nibbles(b: __m128i) -> (__m512i, __m512i) {
    let mask = _mm_set1_epi8(0x0f);
    let lo = _mm_and_si128(b, mask);
    let hi = _mm_and_si128(_mm_srli_epi16::<4>(b), mask);
    (_mm512_cvtepu8_epi32(lo), _mm512_cvtepu8_epi32(hi))
}

/// Low and high nibbles of 16 bytes looked up in a 16-entry signed table, widened to i32.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
fn table_nibbles(b: __m128i, table: &[i8; 16]) -> (__m512i, __m512i) {
    // SAFETY: the table is exactly 16 readable bytes.
    let t = unsafe { _mm_loadu_si128(table.as_ptr().cast()) };
    let mask = _mm_set1_epi8(0x0f);
    let lo = _mm_shuffle_epi8(t, _mm_and_si128(b, mask));
    let hi = _mm_shuffle_epi8(t, _mm_and_si128(_mm_srli_epi16::<4>(b), mask));
    (_mm512_cvtepi8_epi32(lo), _mm512_cvtepi8_epi32(hi))
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
fn f16_imp(src: &[u8], dst: &mut [f32]) {
    let n = dst.len().min(src.len() / 2);
    let n16 = n / 16;
    for c in 0..n16 {
        // SAFETY: values 16c..16c+16 are within both buffers (n bounds both).
        unsafe {
            let h = _mm256_loadu_si256(src.as_ptr().add(32 * c).cast());
            _mm512_storeu_ps(dst.as_mut_ptr().add(16 * c), _mm512_cvtph_ps(h));
        }
    }
    crate::float::dequant_f16_ref(&src[32 * n16..2 * n], &mut dst[16 * n16..n]);
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
fn bf16_imp(src: &[u8], dst: &mut [f32]) {
    let n = dst.len().min(src.len() / 2);
    let n16 = n / 16;
    for c in 0..n16 {
        // SAFETY: values 16c..16c+16 are within both buffers (n bounds both).
        unsafe {
            let h = _mm256_loadu_si256(src.as_ptr().add(32 * c).cast());
            let w = _mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(h));
            _mm512_storeu_ps(dst.as_mut_ptr().add(16 * c), _mm512_castsi512_ps(w));
        }
    }
    crate::float::dequant_bf16_ref(&src[32 * n16..2 * n], &mut dst[16 * n16..n]);
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
fn q4_0_imp(src: &[u8], dst: &mut [f32]) {
    let eight = _mm512_set1_epi32(8);
    for (b, out) in cast_blocks::<BlockQ4_0>(src)
        .iter()
        .zip(dst.chunks_exact_mut(32))
    {
        let d = f16_le(b.d);
        let (lo, hi) = nibbles(load16(&b.qs));
        put_scaled(&mut out[..16], _mm512_sub_epi32(lo, eight), d);
        put_scaled(&mut out[16..], _mm512_sub_epi32(hi, eight), d);
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
fn q4_1_imp(src: &[u8], dst: &mut [f32]) {
    for (b, out) in cast_blocks::<BlockQ4_1>(src)
        .iter()
        .zip(dst.chunks_exact_mut(32))
    {
        let (d, m) = (f16_le(b.d), f16_le(b.m));
        let (lo, hi) = nibbles(load16(&b.qs));
        put_affine(&mut out[..16], lo, d, m);
        put_affine(&mut out[16..], hi, d, m);
    }
}

/// Sets bit 4 of lane j where bit j of `qh` (16 bits) is set.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
fn with_fifth_bit(q: __m512i, qh: u16) -> __m512i {
    _mm512_mask_or_epi32(q, qh, q, _mm512_set1_epi32(16))
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
fn q5_0_imp(src: &[u8], dst: &mut [f32]) {
    let sixteen = _mm512_set1_epi32(16);
    for (b, out) in cast_blocks::<BlockQ5_0>(src)
        .iter()
        .zip(dst.chunks_exact_mut(32))
    {
        let d = f16_le(b.d);
        let qh = u32::from_le_bytes(b.qh);
        let (lo, hi) = nibbles(load16(&b.qs));
        let lo = with_fifth_bit(lo, qh as u16);
        let hi = with_fifth_bit(hi, (qh >> 16) as u16);
        put_scaled(&mut out[..16], _mm512_sub_epi32(lo, sixteen), d);
        put_scaled(&mut out[16..], _mm512_sub_epi32(hi, sixteen), d);
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
fn q5_1_imp(src: &[u8], dst: &mut [f32]) {
    for (b, out) in cast_blocks::<BlockQ5_1>(src)
        .iter()
        .zip(dst.chunks_exact_mut(32))
    {
        let (d, m) = (f16_le(b.d), f16_le(b.m));
        let qh = u32::from_le_bytes(b.qh);
        let (lo, hi) = nibbles(load16(&b.qs));
        put_affine(&mut out[..16], with_fifth_bit(lo, qh as u16), d, m);
        put_affine(&mut out[16..], with_fifth_bit(hi, (qh >> 16) as u16), d, m);
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
fn q8_0_imp(src: &[u8], dst: &mut [f32]) {
    for (b, out) in cast_blocks::<BlockQ8_0>(src)
        .iter()
        .zip(dst.chunks_exact_mut(32))
    {
        let d = f16_le(b.d);
        put_scaled(&mut out[..16], _mm512_cvtepi8_epi32(load16_at(&b.qs, 0)), d);
        put_scaled(
            &mut out[16..],
            _mm512_cvtepi8_epi32(load16_at(&b.qs, 16)),
            d,
        );
    }
}

/// Stores `d1 * q - m1` for 16 lanes (the k-quant affine step).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
fn put_kaffine(out: &mut [f32], q: __m512i, d1: f32, m1: f32) {
    let v = _mm512_mul_ps(_mm512_set1_ps(d1), _mm512_cvtepi32_ps(q));
    let v = _mm512_sub_ps(v, _mm512_set1_ps(m1));
    assert!(out.len() >= 16);
    // SAFETY: out holds at least 16 values (asserted).
    unsafe { _mm512_storeu_ps(out.as_mut_ptr(), v) };
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
fn q4k_imp(src: &[u8], dst: &mut [f32]) {
    for (b, out) in cast_blocks::<BlockQ4K>(src)
        .iter()
        .zip(dst.chunks_exact_mut(256))
    {
        let (d, dmin) = (f16_le(b.d), f16_le(b.dmin));
        for c in 0..4 {
            let (sa, ma) = scale_min_k4(2 * c, &b.scales);
            let (sb, mb) = scale_min_k4(2 * c + 1, &b.scales);
            let (da, mma) = (d * f32::from(sa), dmin * f32::from(ma));
            let (db, mmb) = (d * f32::from(sb), dmin * f32::from(mb));
            let o = &mut out[64 * c..64 * c + 64];
            for h in 0..2 {
                let (lo, hi) = nibbles(load16_at(&b.qs, 32 * c + 16 * h));
                put_kaffine(&mut o[16 * h..], lo, da, mma);
                put_kaffine(&mut o[32 + 16 * h..], hi, db, mmb);
            }
        }
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
fn q5k_imp(src: &[u8], dst: &mut [f32]) {
    let one = _mm512_set1_epi32(1);
    for (b, out) in cast_blocks::<BlockQ5K>(src)
        .iter()
        .zip(dst.chunks_exact_mut(256))
    {
        let (d, dmin) = (f16_le(b.d), f16_le(b.dmin));
        let qh = [
            _mm512_cvtepu8_epi32(load16_at(&b.qh, 0)),
            _mm512_cvtepu8_epi32(load16_at(&b.qh, 16)),
        ];
        for c in 0..4 {
            let (sa, ma) = scale_min_k4(2 * c, &b.scales);
            let (sb, mb) = scale_min_k4(2 * c + 1, &b.scales);
            let (da, mma) = (d * f32::from(sa), dmin * f32::from(ma));
            let (db, mmb) = (d * f32::from(sb), dmin * f32::from(mb));
            let sha = _mm512_set1_epi32(2 * c as i32);
            let shb = _mm512_set1_epi32(2 * c as i32 + 1);
            let o = &mut out[64 * c..64 * c + 64];
            for h in 0..2 {
                let (lo, hi) = nibbles(load16_at(&b.qs, 32 * c + 16 * h));
                let ha = _mm512_and_si512(_mm512_srlv_epi32(qh[h], sha), one);
                let hb = _mm512_and_si512(_mm512_srlv_epi32(qh[h], shb), one);
                let lo = _mm512_or_si512(lo, _mm512_slli_epi32::<4>(ha));
                let hi = _mm512_or_si512(hi, _mm512_slli_epi32::<4>(hb));
                put_kaffine(&mut o[16 * h..], lo, da, mma);
                put_kaffine(&mut o[32 + 16 * h..], hi, db, mmb);
            }
        }
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
fn q6k_imp(src: &[u8], dst: &mut [f32]) {
    let mask4 = _mm512_set1_epi32(0x0f);
    let mask2 = _mm512_set1_epi32(0x03);
    let off = _mm512_set1_epi32(32);
    for (b, out) in cast_blocks::<BlockQ6K>(src)
        .iter()
        .zip(dst.chunks_exact_mut(256))
    {
        let d = f16_le(b.d);
        for g in 0..16 {
            // Values 16g..16g+16 share one scale; r0 is their offset in the 128-value half.
            let (c, r0) = (g / 8, (g % 8) * 16);
            let ql = _mm512_cvtepu8_epi32(load16_at(&b.ql, 64 * c + r0 % 64));
            let qh = _mm512_cvtepu8_epi32(load16_at(&b.qh, 32 * c + r0 % 32));
            let lo = _mm512_and_si512(
                _mm512_srlv_epi32(ql, _mm512_set1_epi32(4 * (r0 / 64) as i32)),
                mask4,
            );
            let hi = _mm512_and_si512(
                _mm512_srlv_epi32(qh, _mm512_set1_epi32(2 * (r0 / 32) as i32)),
                mask2,
            );
            let q = _mm512_sub_epi32(_mm512_or_si512(lo, _mm512_slli_epi32::<4>(hi)), off);
            let dl = d * f32::from(b.scales[g] as i8);
            put_scaled(&mut out[16 * g..], q, dl);
        }
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
fn iq4nl_imp(src: &[u8], dst: &mut [f32]) {
    for (b, out) in cast_blocks::<BlockIq4Nl>(src)
        .iter()
        .zip(dst.chunks_exact_mut(32))
    {
        let d = f16_le(b.d);
        let (lo, hi) = table_nibbles(load16(&b.qs), &KVALUES_IQ4NL);
        put_scaled(&mut out[..16], lo, d);
        put_scaled(&mut out[16..], hi, d);
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
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
            let dl = d * f32::from(((lo | (hi << 4)) as i8) - 32);
            let (a, c) = table_nibbles(load16_at(&b.qs, 16 * i), &KVALUES_IQ4NL);
            put_scaled(&mut sub[..16], a, dl);
            put_scaled(&mut sub[16..], c, dl);
        }
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
fn mxfp4_imp(src: &[u8], dst: &mut [f32]) {
    for (b, out) in cast_blocks::<BlockMxfp4>(src)
        .iter()
        .zip(dst.chunks_exact_mut(32))
    {
        let d = e8m0_to_f32_half(b.e[0]);
        let (lo, hi) = table_nibbles(load16(&b.qs), &KVALUES_MXFP4);
        put_scaled(&mut out[..16], lo, d);
        put_scaled(&mut out[16..], hi, d);
    }
}
