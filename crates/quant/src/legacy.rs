//! The legacy 32-value block formats: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0.
//!
//! Layouts and dequantization match ggml-org/ggml `d99724f` `src/ggml-common.h`
//! (`block_q4_0` ...) and `src/ggml-quants.c` (`dequantize_row_q4_0` ...). The fixtures in
//! `fixtures/reference/quant` (gguf-py 0.19.0) pin the exact f32 operation order: `d * q`
//! for the symmetric formats, `d * q + m` (two roundings, no FMA) for the ones with a min.
//!
//! Nibble order in every 4-bit format: byte `j` holds value `j` in its low nibble and value
//! `j + 16` in its high nibble.

use crate::block::{cast_blocks, cast_blocks_mut, f16_bytes, f16_le, impl_block, round_i32};

/// Q4_0: 32 values, 18 bytes, 4.5 bits per weight. `x = d * (q - 8)`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct BlockQ4_0 {
    /// Scale, IEEE half.
    pub d: [u8; 2],
    /// 4-bit quants: low nibble = value j, high nibble = value j + 16.
    pub qs: [u8; 16],
}
impl_block!(BlockQ4_0, 18);

/// Q4_1: 32 values, 20 bytes, 5 bits per weight. `x = d * q + m`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct BlockQ4_1 {
    /// Scale, IEEE half.
    pub d: [u8; 2],
    /// Minimum (offset), IEEE half.
    pub m: [u8; 2],
    /// 4-bit quants, nibble order as in Q4_0.
    pub qs: [u8; 16],
}
impl_block!(BlockQ4_1, 20);

/// Q5_0: 32 values, 22 bytes, 5.5 bits per weight. `x = d * (q - 16)`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct BlockQ5_0 {
    /// Scale, IEEE half.
    pub d: [u8; 2],
    /// Fifth bit of value j at bit j (little-endian u32).
    pub qh: [u8; 4],
    /// Low 4 bits, nibble order as in Q4_0.
    pub qs: [u8; 16],
}
impl_block!(BlockQ5_0, 22);

/// Q5_1: 32 values, 24 bytes, 6 bits per weight. `x = d * q + m`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct BlockQ5_1 {
    /// Scale, IEEE half.
    pub d: [u8; 2],
    /// Minimum (offset), IEEE half.
    pub m: [u8; 2],
    /// Fifth bit of value j at bit j (little-endian u32).
    pub qh: [u8; 4],
    /// Low 4 bits, nibble order as in Q4_0.
    pub qs: [u8; 16],
}
impl_block!(BlockQ5_1, 24);

/// Q8_0: 32 values, 34 bytes, 8.5 bits per weight. `x = d * q`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct BlockQ8_0 {
    /// Scale, IEEE half.
    pub d: [u8; 2],
    /// Signed 8-bit quants.
    pub qs: [u8; 32],
}
impl_block!(BlockQ8_0, 34);

/// The 5-bit value `j` of a Q5 block.
#[inline]
fn q5(qs: &[u8; 16], qh: u32, j: usize) -> u8 {
    let lo = if j < 16 {
        qs[j] & 0x0f
    } else {
        qs[j - 16] >> 4
    };
    lo | ((((qh >> j) & 1) as u8) << 4)
}

/// Scalar reference dequantization of Q4_0.
pub(crate) fn dequant_q4_0_ref(src: &[u8], dst: &mut [f32]) {
    for (b, out) in cast_blocks::<BlockQ4_0>(src)
        .iter()
        .zip(dst.chunks_exact_mut(32))
    {
        let d = f16_le(b.d);
        for j in 0..16 {
            out[j] = d * (i32::from(b.qs[j] & 0x0f) - 8) as f32;
            out[j + 16] = d * (i32::from(b.qs[j] >> 4) - 8) as f32;
        }
    }
}

/// Scalar reference dequantization of Q4_1.
pub(crate) fn dequant_q4_1_ref(src: &[u8], dst: &mut [f32]) {
    for (b, out) in cast_blocks::<BlockQ4_1>(src)
        .iter()
        .zip(dst.chunks_exact_mut(32))
    {
        let (d, m) = (f16_le(b.d), f16_le(b.m));
        for j in 0..16 {
            out[j] = d * f32::from(b.qs[j] & 0x0f) + m;
            out[j + 16] = d * f32::from(b.qs[j] >> 4) + m;
        }
    }
}

/// Scalar reference dequantization of Q5_0.
pub(crate) fn dequant_q5_0_ref(src: &[u8], dst: &mut [f32]) {
    for (b, out) in cast_blocks::<BlockQ5_0>(src)
        .iter()
        .zip(dst.chunks_exact_mut(32))
    {
        let d = f16_le(b.d);
        let qh = u32::from_le_bytes(b.qh);
        for (j, o) in out.iter_mut().enumerate() {
            *o = d * (i32::from(q5(&b.qs, qh, j)) - 16) as f32;
        }
    }
}

/// Scalar reference dequantization of Q5_1.
pub(crate) fn dequant_q5_1_ref(src: &[u8], dst: &mut [f32]) {
    for (b, out) in cast_blocks::<BlockQ5_1>(src)
        .iter()
        .zip(dst.chunks_exact_mut(32))
    {
        let (d, m) = (f16_le(b.d), f16_le(b.m));
        let qh = u32::from_le_bytes(b.qh);
        for (j, o) in out.iter_mut().enumerate() {
            *o = d * f32::from(q5(&b.qs, qh, j)) + m;
        }
    }
}

/// Scalar reference dequantization of Q8_0.
pub(crate) fn dequant_q8_0_ref(src: &[u8], dst: &mut [f32]) {
    for (b, out) in cast_blocks::<BlockQ8_0>(src)
        .iter()
        .zip(dst.chunks_exact_mut(32))
    {
        let d = f16_le(b.d);
        for (o, &q) in out.iter_mut().zip(b.qs.iter()) {
            *o = f32::from(q as i8) * d;
        }
    }
}

/// The value with the largest magnitude (first one on ties), keeping its sign.
fn signed_absmax(x: &[f32]) -> f32 {
    let mut best = 0.0f32;
    for &v in x {
        if v.abs() > best.abs() {
            best = v;
        }
    }
    best
}

/// Minimum and maximum.
fn min_max(x: &[f32]) -> (f32, f32) {
    x.iter()
        .fold((f32::INFINITY, f32::NEG_INFINITY), |(lo, hi), &v| {
            (lo.min(v), hi.max(v))
        })
}

/// Packs 32 values of 4 bits (or the low 4 bits of 5-bit values) in Q4_0 nibble order.
fn pack_nibbles(q: &[u8; 32]) -> [u8; 16] {
    std::array::from_fn(|j| (q[j] & 0x0f) | ((q[j + 16] & 0x0f) << 4))
}

/// The fifth bits of 32 values, bit j = value j.
fn pack_high_bits(q: &[u8; 32]) -> [u8; 4] {
    let mut h = 0u32;
    for (j, &v) in q.iter().enumerate() {
        h |= u32::from((v >> 4) & 1) << j;
    }
    h.to_le_bytes()
}

/// Round-to-nearest Q4_0 quantization (ggml `quantize_row_q4_0_ref`).
pub(crate) fn quant_q4_0(src: &[f32], dst: &mut [u8]) {
    for (x, b) in src.chunks_exact(32).zip(cast_blocks_mut::<BlockQ4_0>(dst)) {
        let d = signed_absmax(x) / -8.0;
        let id = if d == 0.0 { 0.0 } else { 1.0 / d };
        let q: [u8; 32] = std::array::from_fn(|j| ((x[j] * id + 8.5) as i32).clamp(0, 15) as u8);
        b.d = f16_bytes(d);
        b.qs = pack_nibbles(&q);
    }
}

/// Round-to-nearest Q4_1 quantization (ggml `quantize_row_q4_1_ref`).
pub(crate) fn quant_q4_1(src: &[f32], dst: &mut [u8]) {
    for (x, b) in src.chunks_exact(32).zip(cast_blocks_mut::<BlockQ4_1>(dst)) {
        let (min, max) = min_max(x);
        let d = (max - min) / 15.0;
        let id = if d == 0.0 { 0.0 } else { 1.0 / d };
        let q: [u8; 32] =
            std::array::from_fn(|j| (((x[j] - min) * id + 0.5) as i32).clamp(0, 15) as u8);
        b.d = f16_bytes(d);
        b.m = f16_bytes(min);
        b.qs = pack_nibbles(&q);
    }
}

/// Round-to-nearest Q5_0 quantization (ggml `quantize_row_q5_0_ref`).
pub(crate) fn quant_q5_0(src: &[f32], dst: &mut [u8]) {
    for (x, b) in src.chunks_exact(32).zip(cast_blocks_mut::<BlockQ5_0>(dst)) {
        let d = signed_absmax(x) / -16.0;
        let id = if d == 0.0 { 0.0 } else { 1.0 / d };
        let q: [u8; 32] = std::array::from_fn(|j| ((x[j] * id + 16.5) as i32).clamp(0, 31) as u8);
        b.d = f16_bytes(d);
        b.qh = pack_high_bits(&q);
        b.qs = pack_nibbles(&q);
    }
}

/// Round-to-nearest Q5_1 quantization (ggml `quantize_row_q5_1_ref`).
pub(crate) fn quant_q5_1(src: &[f32], dst: &mut [u8]) {
    for (x, b) in src.chunks_exact(32).zip(cast_blocks_mut::<BlockQ5_1>(dst)) {
        let (min, max) = min_max(x);
        let d = (max - min) / 31.0;
        let id = if d == 0.0 { 0.0 } else { 1.0 / d };
        let q: [u8; 32] =
            std::array::from_fn(|j| (((x[j] - min) * id + 0.5) as i32).clamp(0, 31) as u8);
        b.d = f16_bytes(d);
        b.m = f16_bytes(min);
        b.qh = pack_high_bits(&q);
        b.qs = pack_nibbles(&q);
    }
}

/// Round-to-nearest Q8_0 quantization (ggml `quantize_row_q8_0_ref`).
pub(crate) fn quant_q8_0(src: &[f32], dst: &mut [u8]) {
    for (x, b) in src.chunks_exact(32).zip(cast_blocks_mut::<BlockQ8_0>(dst)) {
        let amax = x.iter().fold(0.0f32, |a, v| a.max(v.abs()));
        let d = amax / 127.0;
        let id = if d == 0.0 { 0.0 } else { 1.0 / d };
        b.d = f16_bytes(d);
        for (q, &v) in b.qs.iter_mut().zip(x) {
            *q = round_i32(v * id).clamp(-127, 127) as i8 as u8;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn q5_bit_layout_puts_fifth_bit_of_value_j_at_bit_j() {
        let mut q = [0u8; 32];
        q[3] = 0x13; // low nibble 3, fifth bit set
        q[20] = 0x1f;
        let qs = pack_nibbles(&q);
        let qh = u32::from_le_bytes(pack_high_bits(&q));
        assert_eq!(qh, (1 << 3) | (1 << 20));
        assert_eq!(q5(&qs, qh, 3), 0x13);
        assert_eq!(q5(&qs, qh, 20), 0x1f);
        assert_eq!(q5(&qs, qh, 4), 0);
    }

    #[test]
    fn q4_0_extreme_value_maps_to_code_zero() {
        // The value of largest magnitude gets code 0 (it is -8 * d with d = max / -8).
        let mut x = [0.25f32; 32];
        x[7] = -3.0;
        let mut bytes = [0u8; 18];
        quant_q4_0(&x, &mut bytes);
        let mut back = [0f32; 32];
        dequant_q4_0_ref(&bytes, &mut back);
        assert_eq!(back[7], -3.0);
    }
}
