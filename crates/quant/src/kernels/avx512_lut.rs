//! Table decoders of the AVX-512 single-column kernels (the fused matvec and the
//! dequantizer) for the formats whose values, within a block or sub-block, take at most 32
//! distinct values: those values are computed once per (sub-)block, with exactly the scalar
//! reference's float operations on the same integer, then picked per lane with a permute
//! (`vpermps` over 16 entries, `vpermt2ps` over 32), the 4- or 5-bit codes as indices. Same
//! operations on the same inputs, so the same bits as the reference and as the arithmetic
//! decoders of the parent module, which the multi-column kernel keeps (there the table cost
//! is not shared over several columns and measured slower).
//!
//! Also the single-column Q8_0 decoder, which has no table but takes its scale through
//! `splat_f16` (see there why that matters).
//!
//! `vpermps` reads only the low 4 bits of each index lane, so a byte zero-extended to 32
//! bits indexes its low nibble as is, and its high nibble after one shift.

use std::arch::x86_64::*;

/// `base + 0.0, base + 1.0, ..., base + 15.0`: the codes as f32, exact (small integers).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
pub(super) fn codes16(base: f32) -> __m512 {
    _mm512_add_ps(
        _mm512_setr_ps(
            0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 11.0, 12.0, 13.0, 14.0, 15.0,
        ),
        _mm512_set1_ps(base),
    )
}

/// The two IEEE halves of a Q4_1/Q5_1 block header, `d` (low 16 bits of `dm`) and `m`
/// (high 16 bits), each converted to f32 in all 16 lanes: one 128-bit conversion of the
/// pair, then two broadcasts. The same exact conversion as `splat_f16`, in fewer vector
/// operations than two of those (each a 16-bit broadcast and a 512-bit conversion). The
/// caller assembles `dm` from the adjacent header bytes, which compiles to one load (taking
/// the halves as two arrays, LLVM built the word with eight scalar instructions).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
pub(super) fn splat_f16_pair(dm: i32) -> (__m512, __m512) {
    let h = _mm_cvtph_ps(_mm_cvtsi32_si128(dm));
    (
        _mm512_broadcastss_ps(h),
        _mm512_broadcastss_ps(_mm_movehdup_ps(h)),
    )
}

/// Table of `d * c` for the 16 codes `c` of `codes` (lanes of exact small integers).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
pub(super) fn table_scaled(codes: __m512, d: __m512) -> __m512 {
    _mm512_mul_ps(d, codes)
}

/// Table of `d * c + m` (two roundings, as the reference) for the codes of `codes`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
pub(super) fn table_affine(codes: __m512, d: __m512, m: __m512) -> __m512 {
    _mm512_add_ps(table_scaled(codes, d), m)
}

/// Table of `d * c - m` (two roundings): the k-quant affine step.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
pub(super) fn table_kaffine(codes: __m512, d: f32, m: f32) -> __m512 {
    _mm512_sub_ps(table_scaled(codes, _mm512_set1_ps(d)), _mm512_set1_ps(m))
}

/// 16 bytes zero-extended to 32-bit index lanes: the low nibble indexes a 16-entry table
/// as is; `>> 4` gives the high nibble.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
pub(super) fn byte_lanes(b: __m128i) -> __m512i {
    _mm512_cvtepu8_epi32(b)
}

/// The 5-bit indices of a Q5 half block: the low 4 bits of each lane of `nib` (the bits
/// above are cleared: `vpermt2ps` reads five), with bit 4 of lane j from bit j of `qh`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
fn five_bit(nib: __m512i, qh: u16) -> __m512i {
    let n = _mm512_and_si512(nib, _mm512_set1_epi32(0x0f));
    _mm512_mask_or_epi32(n, qh, n, _mm512_set1_epi32(16))
}

/// The 32 values of a Q5 block picked from its two 16-entry tables (`t0` for codes 0..16,
/// `t1` for 16..32): the 5-bit codes from the nibbles of `qs` and the bits of `qh`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
pub(super) fn lookup_q5(t0: __m512, t1: __m512, qs: __m128i, qh: [u8; 4]) -> [__m512; 2] {
    let qh = u32::from_le_bytes(qh);
    let x = byte_lanes(qs);
    let lo = five_bit(x, qh as u16);
    let hi = five_bit(_mm512_srli_epi32::<4>(x), (qh >> 16) as u16);
    [
        _mm512_permutex2var_ps(t0, lo, t1),
        _mm512_permutex2var_ps(t0, hi, t1),
    ]
}

/// Table decoder of one `BlockQ4_0` (`d * (c - 8)`) into `[__m512; 2]`.
macro_rules! lut_q4_0 {
    ($b:expr, $v:expr) => {{
        let b: &BlockQ4_0 = $b;
        let v: &mut [__m512; 2] = $v;
        let t = table_scaled(codes16(-8.0), splat_f16(b.d));
        let x = byte_lanes(load16(&b.qs, 0));
        v[0] = _mm512_permutexvar_ps(x, t);
        v[1] = _mm512_permutexvar_ps(_mm512_srli_epi32::<4>(x), t);
    }};
}

/// Table decoder of one `BlockQ4_1` (`d * c + m`) into `[__m512; 2]`.
macro_rules! lut_q4_1 {
    ($b:expr, $v:expr) => {{
        let b: &BlockQ4_1 = $b;
        let v: &mut [__m512; 2] = $v;
        let (d, m) = splat_f16_pair(i32::from_le_bytes([b.d[0], b.d[1], b.m[0], b.m[1]]));
        let t = table_affine(codes16(0.0), d, m);
        let x = byte_lanes(load16(&b.qs, 0));
        v[0] = _mm512_permutexvar_ps(x, t);
        v[1] = _mm512_permutexvar_ps(_mm512_srli_epi32::<4>(x), t);
    }};
}

/// Table decoder of one `BlockIq4Nl` (`d * kvalues[c]`) into `[__m512; 2]`.
macro_rules! lut_iq4nl {
    ($b:expr, $v:expr) => {{
        let b: &BlockIq4Nl = $b;
        let v: &mut [__m512; 2] = $v;
        // SAFETY: the table is exactly 16 readable bytes.
        let kv = unsafe { _mm_loadu_si128(KVALUES_IQ4NL.as_ptr().cast()) };
        let t = table_scaled(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(kv)), splat_f16(b.d));
        let x = byte_lanes(load16(&b.qs, 0));
        v[0] = _mm512_permutexvar_ps(x, t);
        v[1] = _mm512_permutexvar_ps(_mm512_srli_epi32::<4>(x), t);
    }};
}

/// Table decoder of one `BlockQ5_0` (`d * (c - 16)`, 32 codes) into `[__m512; 2]`.
macro_rules! lut_q5_0 {
    ($b:expr, $v:expr) => {{
        let b: &BlockQ5_0 = $b;
        let v: &mut [__m512; 2] = $v;
        let d = splat_f16(b.d);
        let (t0, t1) = (
            table_scaled(codes16(-16.0), d),
            table_scaled(codes16(0.0), d),
        );
        *v = lookup_q5(t0, t1, load16(&b.qs, 0), b.qh);
    }};
}

/// Table decoder of one `BlockQ5_1` (`d * c + m`, 32 codes) into `[__m512; 2]`.
macro_rules! lut_q5_1 {
    ($b:expr, $v:expr) => {{
        let b: &BlockQ5_1 = $b;
        let v: &mut [__m512; 2] = $v;
        let (d, m) = splat_f16_pair(i32::from_le_bytes([b.d[0], b.d[1], b.m[0], b.m[1]]));
        let (t0, t1) = (
            table_affine(codes16(0.0), d, m),
            table_affine(codes16(16.0), d, m),
        );
        *v = lookup_q5(t0, t1, load16(&b.qs, 0), b.qh);
    }};
}

/// Table decoder of one `BlockQ4K` into `[__m512; 16]`.
macro_rules! lut_q4k {
    ($b:expr, $v:expr) => {{
        let b: &BlockQ4K = $b;
        let v: &mut [__m512; 16] = $v;
        let sm = k4_scales_h(b.d, b.dmin, &b.scales);
        for c in 0..4 {
            let q = lut_q4k_quarter!(b, &sm, c);
            v[4 * c..4 * c + 4].copy_from_slice(&q);
        }
    }};
}

/// Values `64c..64c + 64` of a `BlockQ4K` as four vectors, given its `k4_scales_h`: one
/// 16-entry table `d1 * c - m1` per 32-value sub-block.
macro_rules! lut_q4k_quarter {
    ($b:expr, $sm:expr, $c:expr) => {{
        let (b, sm, c): (&BlockQ4K, &[f32; 16], usize) = ($b, $sm, $c);
        let codes = codes16(0.0);
        let ta = table_kaffine(codes, sm[2 * c], sm[8 + 2 * c]);
        let tb = table_kaffine(codes, sm[2 * c + 1], sm[9 + 2 * c]);
        let mut v = [_mm512_setzero_ps(); 4];
        for h in 0..2 {
            let x = byte_lanes(load16(&b.qs, 32 * c + 16 * h));
            v[h] = _mm512_permutexvar_ps(x, ta);
            v[2 + h] = _mm512_permutexvar_ps(_mm512_srli_epi32::<4>(x), tb);
        }
        v
    }};
}

/// One block of each of four rows, a quarter block (64 values) at a time (as
/// `block4_q6k`: four whole blocks would need 64 vector registers): each quarter decodes
/// exactly as [`lut_q4k`] and each row's FMAs run in chunk order, so the bits are the same.
macro_rules! block4_lut_q4k {
    ($dec:ident, $n:expr, $blocks:expr, $xs:expr, $acc:expr) => {{
        let bs: [&BlockQ4K; 4] = $blocks;
        let sm: [[f32; 16]; 4] =
            std::array::from_fn(|r| k4_scales_h(bs[r].d, bs[r].dmin, &bs[r].scales));
        block4_quarters!($xs, $acc, 4, |r, c| lut_q4k_quarter!(bs[r], &sm[r], c));
    }};
}

/// Decoder of one `BlockQ8_0` into `[__m512; 2]`: `dec_q8_0` with the scale splat by
/// `splat_f16`.
macro_rules! splat_q8_0 {
    ($b:expr, $v:expr) => {{
        let b: &BlockQ8_0 = $b;
        let v: &mut [__m512; 2] = $v;
        let d = splat_f16(b.d);
        v[0] = _mm512_mul_ps(
            d,
            _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(load16(&b.qs, 0))),
        );
        v[1] = _mm512_mul_ps(
            d,
            _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(load16(&b.qs, 16))),
        );
    }};
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Lane `i` of `v`.
    fn lane(v: __m512, i: usize) -> u32 {
        let mut out = [0f32; 16];
        // SAFETY: out holds 16 writable f32; only called after the AVX-512 check.
        unsafe { _mm512_storeu_ps(out.as_mut_ptr(), v) };
        out[i].to_bits()
    }

    #[test]
    fn splat_f16_pair_converts_every_half_like_splat_f16() {
        if !crate::SimdLevel::Avx512.is_available() {
            println!("skipped: avx512 not available on this CPU");
            return;
        }
        // Every half as `d`, paired with a different half as `m` (zeros, subnormals,
        // infinities and NaNs included), against two separate `splat_f16` conversions.
        for h in 0..=u16::MAX {
            let m = h.rotate_left(7) ^ 0x8001;
            let dm = i32::from(h) | (i32::from(m) << 16);
            // SAFETY: AVX-512 checked above.
            let (d_v, m_v, d_ref, m_ref) = unsafe {
                let (a, b) = splat_f16_pair(dm);
                (
                    a,
                    b,
                    super::super::splat_f16(h.to_le_bytes()),
                    super::super::splat_f16(m.to_le_bytes()),
                )
            };
            for i in [0, 7, 15] {
                assert_eq!(lane(d_v, i), lane(d_ref, i), "d {h:#06x} lane {i}");
                assert_eq!(lane(m_v, i), lane(m_ref, i), "m {m:#06x} lane {i}");
            }
        }
    }
}
