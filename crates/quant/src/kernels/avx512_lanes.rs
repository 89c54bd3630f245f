//! Lane helpers of the AVX-512 block decoders: f16 scales to f32 (one lane or all 16),
//! integer lanes scaled and offset in the reference's order, byte and nibble loads widened
//! to 32-bit lanes, and the K-quants' sub-block scales.
//!
//! Each helper is exact: the same IEEE operations, in the same order, as the scalar
//! reference's step it stands for. This module never decodes a whole block; the decoders
//! in `avx512_dequant` put these steps together.

use std::arch::x86_64::*;

/// IEEE half (little-endian bytes) to f32 with F16C, exact like the scalar path (which
/// goes through the `half` crate and a run-time feature check on every call).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
pub(super) fn f16_le(b: [u8; 2]) -> f32 {
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(
        u16::from_le_bytes(b),
    ))))
}

/// An IEEE half (little-endian bytes) converted to f32 in all 16 lanes: a 16-bit broadcast
/// load and one vector conversion, exact like [`f16_le`]. The single-column kernels use it
/// in their loops: LLVM compiles [`f16_le`] to a `vpinsrw` into lane 0 of whatever register
/// is free, and where that was an accumulator, the false dependency chained every block's
/// decode to the previous block's FMAs (the one-thread Q8_0 matvec ran at half speed).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
pub(super) fn splat_f16(h: [u8; 2]) -> __m512 {
    _mm512_cvtph_ps(_mm256_set1_epi16(i16::from_le_bytes(h)))
}

/// `d * q` for 16 integer lanes.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
pub(super) fn scaled(q: __m512i, d: f32) -> __m512 {
    scaled_v(q, _mm512_set1_ps(d))
}

/// `d * q` for 16 integer lanes, `d` already in every lane (from [`splat_f16`]).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
pub(super) fn scaled_v(q: __m512i, d: __m512) -> __m512 {
    _mm512_mul_ps(d, _mm512_cvtepi32_ps(q))
}

/// `d * q + m` (two roundings) for 16 integer lanes, `d` and `m` in every lane.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
pub(super) fn affine_v(q: __m512i, d: __m512, m: __m512) -> __m512 {
    _mm512_add_ps(scaled_v(q, d), m)
}

/// `d * q - m` (two roundings) for 16 integer lanes: the k-quant affine step.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
pub(super) fn kaffine(q: __m512i, d: f32, m: f32) -> __m512 {
    _mm512_sub_ps(scaled(q, d), _mm512_set1_ps(m))
}

/// Loads bytes `at..at + 16` of `b`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
pub(super) fn load16(b: &[u8], at: usize) -> __m128i {
    let s = &b[at..at + 16];
    // SAFETY: s is exactly 16 readable bytes; the load is unaligned.
    unsafe { _mm_loadu_si128(s.as_ptr().cast()) }
}

/// The 8 sub-block scales and 8 mins of a Q4_K/Q5_K block, already multiplied by its `d`
/// and `dmin` halves (`[d * sc[0..8], dmin * m[0..8]]`, the halves converted by
/// [`splat_f16`]), unpacked with byte shuffles instead of eight scalar
/// [`crate::scale_min_k4`] calls. Same products as the scalar path, so the same bits.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
pub(super) fn k4_scales_h(d: [u8; 2], dmin: [u8; 2], scales: &[u8; 12]) -> [f32; 16] {
    k4_scales_v(
        _mm512_mask_blend_ps(0xff00, splat_f16(d), splat_f16(dmin)),
        scales,
    )
}

/// [`k4_scales_h`] given `d` in lanes 0..8 and `dmin` in lanes 8..16 of `dd`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
fn k4_scales_v(dd: __m512, scales: &[u8; 12]) -> [f32; 16] {
    let mut raw = [0u8; 16];
    raw[..12].copy_from_slice(scales);
    let s = load16(&raw, 0);
    // Lanes 0..8 are scales, 8..16 mins. Low bits come from A, top two bits from B.
    let a = _mm_shuffle_epi8(
        s,
        _mm_setr_epi8(0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 8, 9, 10, 11),
    );
    let b = _mm_shuffle_epi8(
        s,
        _mm_setr_epi8(-1, -1, -1, -1, 0, 1, 2, 3, -1, -1, -1, -1, 4, 5, 6, 7),
    );
    let top = _mm_and_si128(_mm_srli_epi16::<2>(b), _mm_set1_epi8(0x30));
    let low6 = _mm_and_si128(a, _mm_set1_epi8(63));
    let sc_hi = _mm_or_si128(_mm_and_si128(a, _mm_set1_epi8(0x0f)), top);
    let a_hi = _mm_and_si128(_mm_srli_epi16::<4>(a), _mm_set1_epi8(0x0f));
    let m_hi = _mm_or_si128(a_hi, top);
    let r = _mm_mask_blend_epi8(0x00f0, low6, sc_hi);
    let r = _mm_mask_blend_epi8(0xf000, r, m_hi);
    let f = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(r));
    let mut out = [0f32; 16];
    // SAFETY: out holds 16 writable f32.
    unsafe { _mm512_storeu_ps(out.as_mut_ptr(), _mm512_mul_ps(dd, f)) };
    out
}

/// The 16 sub-block scales of a Q6_K block, `d * scale` (the scalar path's product, so the
/// same bits), in one vector multiply instead of sixteen scalar ones and broadcasts.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
pub(super) fn q6k_scales(d: __m512, scales: &[u8; 16]) -> [f32; 16] {
    let sc = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(load16(scales, 0)));
    let mut out = [0f32; 16];
    // SAFETY: out holds 16 writable f32.
    unsafe { _mm512_storeu_ps(out.as_mut_ptr(), _mm512_mul_ps(d, sc)) };
    out
}

/// Loads bytes `at..at + 64` of `b`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
pub(super) fn load64(b: &[u8], at: usize) -> __m512i {
    let s = &b[at..at + 64];
    // SAFETY: s is exactly 64 readable bytes; the load is unaligned.
    unsafe { _mm512_loadu_si512(s.as_ptr().cast()) }
}

/// Low and high nibbles of 16 bytes, each widened to 16 i32 lanes.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
pub(super) fn nibbles(b: __m128i) -> (__m512i, __m512i) {
    let mask = _mm_set1_epi8(0x0f);
    let lo = _mm_and_si128(b, mask);
    let hi = _mm_and_si128(_mm_srli_epi16::<4>(b), mask);
    (_mm512_cvtepu8_epi32(lo), _mm512_cvtepu8_epi32(hi))
}

/// Low and high nibbles of 16 bytes looked up in a 16-entry signed table, widened to i32.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
pub(super) fn table_nibbles(b: __m128i, table: &[i8; 16]) -> (__m512i, __m512i) {
    // SAFETY: the table is exactly 16 readable bytes.
    let t = unsafe { _mm_loadu_si128(table.as_ptr().cast()) };
    let mask = _mm_set1_epi8(0x0f);
    let lo = _mm_shuffle_epi8(t, _mm_and_si128(b, mask));
    let hi = _mm_shuffle_epi8(t, _mm_and_si128(_mm_srli_epi16::<4>(b), mask));
    (_mm512_cvtepi8_epi32(lo), _mm512_cvtepi8_epi32(hi))
}

/// Sets bit 4 of lane j where bit j of `qh` (16 bits) is set.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
pub(super) fn with_fifth_bit(q: __m512i, qh: u16) -> __m512i {
    _mm512_mask_or_epi32(q, qh, q, _mm512_set1_epi32(16))
}
