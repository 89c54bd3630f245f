//! The k-quant super-block formats (256 values): Q2_K, Q3_K, Q4_K, Q5_K, Q6_K and the
//! activation format Q8_K. Block layouts and dequantization.
//!
//! Layouts match ggml-org/ggml `d99724f` `src/ggml-common.h` (`block_q2_K` ...) and
//! `src/ggml-quants.c` (`dequantize_row_q2_K` ...). The f32 operation order follows the
//! fixtures (gguf-py 0.19.0): the sub-block scale is formed first (`d * sc`, `dmin * m`),
//! then applied (`dl * q - ml`), with no FMA.

use crate::block::{cast_blocks, f16_le, impl_block};

/// Q2_K: 256 values, 84 bytes, 2.625 bits per weight. 16 sub-blocks of 16 with 4-bit scale
/// and 4-bit min: `x = (d * sc) * q - (dmin * m)`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct BlockQ2K {
    /// Sub-block `i`: scale in the low nibble of byte `i`, min in the high nibble.
    pub scales: [u8; 16],
    /// 2-bit quants: value `128c + 32j + l` is bits `2j..2j+2` of byte `32c + l`.
    pub qs: [u8; 64],
    /// Super-block scale for the scales, IEEE half.
    pub d: [u8; 2],
    /// Super-block scale for the mins, IEEE half.
    pub dmin: [u8; 2],
}
impl_block!(BlockQ2K, 84);

/// Q3_K: 256 values, 110 bytes, 3.4375 bits per weight. 16 sub-blocks of 16 with 6-bit
/// signed scales: `x = (d * (sc - 32)) * (q - 4 * !hbit)`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct BlockQ3K {
    /// High bit of value `32b + l` is bit `b` of byte `l`; a clear bit subtracts 4.
    pub hmask: [u8; 32],
    /// Low 2 bits, arranged as in Q2_K.
    pub qs: [u8; 64],
    /// 16 scales of 6 bits: low 4 bits of scale `i` in byte `i % 8` (nibble `i / 8`), high
    /// 2 bits in byte `8 + i % 4` at bit `2 * (i / 4)`.
    pub scales: [u8; 12],
    /// Super-block scale, IEEE half.
    pub d: [u8; 2],
}
impl_block!(BlockQ3K, 110);

/// Q4_K: 256 values, 144 bytes, 4.5 bits per weight. 8 sub-blocks of 32 with 6-bit scale
/// and min: `x = (d * sc) * q - (dmin * m)`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct BlockQ4K {
    /// Super-block scale for the scales, IEEE half.
    pub d: [u8; 2],
    /// Super-block scale for the mins, IEEE half.
    pub dmin: [u8; 2],
    /// 8 scales and 8 mins of 6 bits, packed as in [`scale_min_k4`].
    pub scales: [u8; 12],
    /// 4-bit quants: value `64c + l` is the low nibble of byte `32c + l`, value
    /// `64c + 32 + l` its high nibble.
    pub qs: [u8; 128],
}
impl_block!(BlockQ4K, 144);

/// Q5_K: 256 values, 176 bytes, 5.5 bits per weight. As Q4_K plus a fifth bit.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct BlockQ5K {
    /// Super-block scale for the scales, IEEE half.
    pub d: [u8; 2],
    /// Super-block scale for the mins, IEEE half.
    pub dmin: [u8; 2],
    /// 8 scales and 8 mins of 6 bits, packed as in [`scale_min_k4`].
    pub scales: [u8; 12],
    /// Fifth bit of value `32s + l` is bit `s` of byte `l`.
    pub qh: [u8; 32],
    /// Low 4 bits, arranged as in Q4_K.
    pub qs: [u8; 128],
}
impl_block!(BlockQ5K, 176);

/// Q6_K: 256 values, 210 bytes, 6.5625 bits per weight. 16 sub-blocks of 16 with signed
/// 8-bit scales: `x = (d * sc) * (q - 32)`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct BlockQ6K {
    /// Low 4 bits: value `128c + 64h + k` is nibble `h` of byte `64c + k`.
    pub ql: [u8; 128],
    /// High 2 bits: value `128c + 32j + l` is bits `2j..2j+2` of byte `32c + l`.
    pub qh: [u8; 64],
    /// Signed 8-bit scale of each 16-value sub-block.
    pub scales: [u8; 16],
    /// Super-block scale, IEEE half.
    pub d: [u8; 2],
}
impl_block!(BlockQ6K, 210);

/// Q8_K: 256 values, 292 bytes, 9.125 bits per weight (activation format for k-quant dot
/// products). `x = d * q`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct BlockQ8K {
    /// Scale, little-endian f32.
    pub d: [u8; 4],
    /// Signed 8-bit quants.
    pub qs: [u8; 256],
    /// Sum of each 16 quants, 16 little-endian i16.
    pub bsums: [u8; 32],
}
impl_block!(BlockQ8K, 292);

/// Scale and min `j` (0..8) of a Q4_K/Q5_K block: bytes 0..4 hold the low 6 bits of
/// scales 0..4, bytes 4..8 those of mins 0..4; scales/mins 4..8 keep their low 4 bits in
/// bytes 8..12 (scale low nibble, min high nibble) and their top 2 bits in the top 2 bits of
/// bytes 0..4 (scales) and 4..8 (mins).
#[inline]
pub fn scale_min_k4(j: usize, s: &[u8; 12]) -> (u8, u8) {
    if j < 4 {
        (s[j] & 63, s[j + 4] & 63)
    } else {
        (
            (s[j + 4] & 0x0f) | ((s[j - 4] >> 6) << 4),
            (s[j + 4] >> 4) | ((s[j] >> 6) << 4),
        )
    }
}

/// The 16 signed scales of a Q3_K block.
#[inline]
pub(crate) fn q3k_scales(s: &[u8; 12]) -> [i8; 16] {
    std::array::from_fn(|i| {
        let lo = (s[i % 8] >> (4 * (i / 8))) & 0x0f;
        let hi = (s[8 + i % 4] >> (2 * (i / 4))) & 0x03;
        ((lo | (hi << 4)) as i8) - 32
    })
}

/// Scalar reference dequantization of Q2_K.
pub(crate) fn dequant_q2k_ref(src: &[u8], dst: &mut [f32]) {
    for (b, out) in cast_blocks::<BlockQ2K>(src)
        .iter()
        .zip(dst.chunks_exact_mut(256))
    {
        let (d, dmin) = (f16_le(b.d), f16_le(b.dmin));
        for (e, o) in out.iter_mut().enumerate() {
            let (c, j, l) = (e / 128, (e % 128) / 32, e % 32);
            let sc = b.scales[e / 16];
            let dl = d * f32::from(sc & 0x0f);
            let ml = dmin * f32::from(sc >> 4);
            let q = (b.qs[32 * c + l] >> (2 * j)) & 3;
            *o = dl * f32::from(q) - ml;
        }
    }
}

/// Scalar reference dequantization of Q3_K.
pub(crate) fn dequant_q3k_ref(src: &[u8], dst: &mut [f32]) {
    for (b, out) in cast_blocks::<BlockQ3K>(src)
        .iter()
        .zip(dst.chunks_exact_mut(256))
    {
        let d = f16_le(b.d);
        let scales = q3k_scales(&b.scales);
        for (e, o) in out.iter_mut().enumerate() {
            let (c, j, l) = (e / 128, (e % 128) / 32, e % 32);
            let lo = i32::from((b.qs[32 * c + l] >> (2 * j)) & 3);
            let hbit = (b.hmask[l] >> (e / 32)) & 1;
            let q = lo - if hbit == 0 { 4 } else { 0 };
            let dl = d * f32::from(scales[e / 16]);
            *o = dl * q as f32;
        }
    }
}

/// Scalar reference dequantization of Q4_K.
pub(crate) fn dequant_q4k_ref(src: &[u8], dst: &mut [f32]) {
    for (b, out) in cast_blocks::<BlockQ4K>(src)
        .iter()
        .zip(dst.chunks_exact_mut(256))
    {
        let (d, dmin) = (f16_le(b.d), f16_le(b.dmin));
        for (s, sub) in out.chunks_exact_mut(32).enumerate() {
            let (sc, m) = scale_min_k4(s, &b.scales);
            let (d1, m1) = (d * f32::from(sc), dmin * f32::from(m));
            let (c, shift) = (s / 2, 4 * (s % 2));
            for (l, o) in sub.iter_mut().enumerate() {
                let q = (b.qs[32 * c + l] >> shift) & 0x0f;
                *o = d1 * f32::from(q) - m1;
            }
        }
    }
}

/// Scalar reference dequantization of Q5_K.
pub(crate) fn dequant_q5k_ref(src: &[u8], dst: &mut [f32]) {
    for (b, out) in cast_blocks::<BlockQ5K>(src)
        .iter()
        .zip(dst.chunks_exact_mut(256))
    {
        let (d, dmin) = (f16_le(b.d), f16_le(b.dmin));
        for (s, sub) in out.chunks_exact_mut(32).enumerate() {
            let (sc, m) = scale_min_k4(s, &b.scales);
            let (d1, m1) = (d * f32::from(sc), dmin * f32::from(m));
            let (c, shift) = (s / 2, 4 * (s % 2));
            for (l, o) in sub.iter_mut().enumerate() {
                let q = ((b.qs[32 * c + l] >> shift) & 0x0f) | (((b.qh[l] >> s) & 1) << 4);
                *o = d1 * f32::from(q) - m1;
            }
        }
    }
}

/// Scalar reference dequantization of Q6_K.
pub(crate) fn dequant_q6k_ref(src: &[u8], dst: &mut [f32]) {
    for (b, out) in cast_blocks::<BlockQ6K>(src)
        .iter()
        .zip(dst.chunks_exact_mut(256))
    {
        let d = f16_le(b.d);
        for (e, o) in out.iter_mut().enumerate() {
            let (c, r) = (e / 128, e % 128);
            let lo = (b.ql[64 * c + r % 64] >> (4 * (r / 64))) & 0x0f;
            let hi = (b.qh[32 * c + r % 32] >> (2 * (r / 32))) & 3;
            let q = i32::from(lo | (hi << 4)) - 32;
            let dl = d * f32::from(b.scales[e / 16] as i8);
            *o = dl * q as f32;
        }
    }
}

/// Scalar reference dequantization of Q8_K.
pub(crate) fn dequant_q8k_ref(src: &[u8], dst: &mut [f32]) {
    for (b, out) in cast_blocks::<BlockQ8K>(src)
        .iter()
        .zip(dst.chunks_exact_mut(256))
    {
        let d = f32::from_le_bytes(b.d);
        for (o, &q) in out.iter_mut().zip(b.qs.iter()) {
            *o = d * f32::from(q as i8);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scale_min_k4_unpacks_high_bits_of_upper_half() {
        let mut s = [0u8; 12];
        s[0] = 0b11_000101; // scale 0 = 5, top bits of scale 4 = 3
        s[4] = 0b01_000111; // min 0 = 7, top bits of min 4 = 1
        s[8] = 0x9a; // scale 4 low = 0xa, min 4 low = 0x9
        assert_eq!(scale_min_k4(0, &s), (5, 7));
        assert_eq!(scale_min_k4(4, &s), (0x3a, 0x19));
    }

    #[test]
    fn q3k_scales_are_offset_by_32() {
        let mut s = [0u8; 12];
        s[1] = 0x0f; // scale 1 low bits = 15
        s[9] = 0b0000_0011; // scale 1 high bits = 3
        let sc = q3k_scales(&s);
        assert_eq!(sc[1], 63 - 32);
        assert_eq!(sc[0], -32);
    }
}
