//! Table-driven and ternary formats: IQ4_NL, IQ4_XS, MXFP4, TQ1_0, TQ2_0.
//!
//! Layouts match ggml-org/ggml `d99724f` `src/ggml-common.h` (`block_iq4_nl`,
//! `block_iq4_xs`, `block_mxfp4`, `block_tq1_0`, `block_tq2_0`) and the dequantization in
//! `src/ggml-quants.c`; f32 operation order as in the gguf-py 0.19.0 fixtures.

use crate::block::{cast_blocks, f16_le, impl_block};

/// The IQ4_NL / IQ4_XS non-linear code book (ggml `kvalues_iq4nl`).
pub const KVALUES_IQ4NL: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];

/// MXFP4 e2m1 values, doubled so they are integers (the scale is halved to match).
pub const KVALUES_MXFP4: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

/// IQ4_NL: 32 values, 18 bytes, 4.5 bits per weight. `x = d * KVALUES_IQ4NL[q]`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct BlockIq4Nl {
    /// Scale, IEEE half.
    pub d: [u8; 2],
    /// 4-bit indices: low nibble = value j, high nibble = value j + 16.
    pub qs: [u8; 16],
}
impl_block!(BlockIq4Nl, 18);

/// IQ4_XS: 256 values, 136 bytes, 4.25 bits per weight. 8 sub-blocks of 32 with 6-bit
/// signed scales: `x = (d * (ls - 32)) * KVALUES_IQ4NL[q]`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct BlockIq4Xs {
    /// Scale, IEEE half.
    pub d: [u8; 2],
    /// Top 2 bits of scale `i` at bits `2i..2i+2` (little-endian u16).
    pub scales_h: [u8; 2],
    /// Low 4 bits of scale `i` in nibble `i % 2` of byte `i / 2`.
    pub scales_l: [u8; 4],
    /// Sub-block `i` uses bytes `16i..16i+16`, nibble order as in IQ4_NL.
    pub qs: [u8; 128],
}
impl_block!(BlockIq4Xs, 136);

/// MXFP4: 32 values, 17 bytes, 4.25 bits per weight. `x = 2^(e-128) * KVALUES_MXFP4[q]`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct BlockMxfp4 {
    /// Shared exponent, e8m0.
    pub e: [u8; 1],
    /// 4-bit e2m1 codes: low nibble = value j, high nibble = value j + 16.
    pub qs: [u8; 16],
}
impl_block!(BlockMxfp4, 17);

/// TQ1_0: 256 values, 54 bytes, 1.6875 bits per weight. Ternary digits packed 5 per byte
/// (4 in `qh`) as base-3 fixed-point fractions: `x = d * (trit - 1)`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct BlockTq10 {
    /// Values `32n + m` (n < 5) use byte `m`; values `160 + 16n + m` use byte `32 + m`.
    pub qs: [u8; 48],
    /// Values `240 + 4n + m` use byte `m`.
    pub qh: [u8; 4],
    /// Scale, IEEE half.
    pub d: [u8; 2],
}
impl_block!(BlockTq10, 54);

/// TQ2_0: 256 values, 66 bytes, 2.0625 bits per weight. `x = d * (q - 1)`, q of 2 bits.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct BlockTq20 {
    /// Value `128c + 32j + l` is bits `2j..2j+2` of byte `32c + l`.
    pub qs: [u8; 64],
    /// Scale, IEEE half.
    pub d: [u8; 2],
}
impl_block!(BlockTq20, 66);

/// Half of `2^(e - 127)` as f32 bits (ggml `ggml_e8m0_to_fp32_half`).
#[inline]
pub(crate) fn e8m0_to_f32_half(e: u8) -> f32 {
    let bits = if e < 2 {
        0x0020_0000u32 << e
    } else {
        u32::from(e - 1) << 23
    };
    f32::from_bits(bits)
}

/// Scalar reference dequantization of IQ4_NL.
pub(crate) fn dequant_iq4nl_ref(src: &[u8], dst: &mut [f32]) {
    for (b, out) in cast_blocks::<BlockIq4Nl>(src)
        .iter()
        .zip(dst.chunks_exact_mut(32))
    {
        let d = f16_le(b.d);
        for j in 0..16 {
            out[j] = d * f32::from(KVALUES_IQ4NL[usize::from(b.qs[j] & 0x0f)]);
            out[j + 16] = d * f32::from(KVALUES_IQ4NL[usize::from(b.qs[j] >> 4)]);
        }
    }
}

/// Scalar reference dequantization of IQ4_XS.
pub(crate) fn dequant_iq4xs_ref(src: &[u8], dst: &mut [f32]) {
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
            let qs = &b.qs[16 * i..16 * i + 16];
            for j in 0..16 {
                sub[j] = dl * f32::from(KVALUES_IQ4NL[usize::from(qs[j] & 0x0f)]);
                sub[j + 16] = dl * f32::from(KVALUES_IQ4NL[usize::from(qs[j] >> 4)]);
            }
        }
    }
}

/// Scalar reference dequantization of MXFP4.
pub(crate) fn dequant_mxfp4_ref(src: &[u8], dst: &mut [f32]) {
    for (b, out) in cast_blocks::<BlockMxfp4>(src)
        .iter()
        .zip(dst.chunks_exact_mut(32))
    {
        let d = e8m0_to_f32_half(b.e[0]);
        for j in 0..16 {
            out[j] = d * f32::from(KVALUES_MXFP4[usize::from(b.qs[j] & 0x0f)]);
            out[j + 16] = d * f32::from(KVALUES_MXFP4[usize::from(b.qs[j] >> 4)]);
        }
    }
}

/// Powers of three used to shift the base-3 digits of TQ1_0 into the top of a byte.
const POW3: [u8; 5] = [1, 3, 9, 27, 81];

/// The ternary digit (0..=2) stored in `byte` at position `n`.
#[inline]
fn trit(byte: u8, n: usize) -> i32 {
    ((u16::from(byte.wrapping_mul(POW3[n])) * 3) >> 8) as i32
}

/// Scalar reference dequantization of TQ1_0.
pub(crate) fn dequant_tq1_0_ref(src: &[u8], dst: &mut [f32]) {
    for (b, out) in cast_blocks::<BlockTq10>(src)
        .iter()
        .zip(dst.chunks_exact_mut(256))
    {
        let d = f16_le(b.d);
        for (e, o) in out.iter_mut().enumerate() {
            let t = if e < 160 {
                trit(b.qs[e % 32], e / 32)
            } else if e < 240 {
                trit(b.qs[32 + (e - 160) % 16], (e - 160) / 16)
            } else {
                trit(b.qh[(e - 240) % 4], (e - 240) / 4)
            };
            *o = d * (t - 1) as f32;
        }
    }
}

/// Scalar reference dequantization of TQ2_0.
pub(crate) fn dequant_tq2_0_ref(src: &[u8], dst: &mut [f32]) {
    for (b, out) in cast_blocks::<BlockTq20>(src)
        .iter()
        .zip(dst.chunks_exact_mut(256))
    {
        let d = f16_le(b.d);
        for (e, o) in out.iter_mut().enumerate() {
            let (c, j, l) = (e / 128, (e % 128) / 32, e % 32);
            let q = i32::from((b.qs[32 * c + l] >> (2 * j)) & 3);
            *o = d * (q - 1) as f32;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn e8m0_half_covers_subnormal_and_normal_exponents() {
        assert_eq!(e8m0_to_f32_half(127), 0.5);
        assert_eq!(e8m0_to_f32_half(128), 1.0);
        assert_eq!(e8m0_to_f32_half(1), 2f32.powi(-127));
        assert_eq!(e8m0_to_f32_half(0), 2f32.powi(-128));
    }

    #[test]
    fn tq1_trits_decode_from_fixed_point_base3() {
        // 0.[2,1,0,0,0] in base 3, rounded up to a byte: ceil((2*81 + 27) * 256 / 243).
        let byte = (((2 * 81 + 27) * 256 + 242) / 243) as u8;
        assert_eq!(trit(byte, 0), 2);
        assert_eq!(trit(byte, 1), 1);
        assert_eq!(trit(byte, 2), 0);
    }
}
