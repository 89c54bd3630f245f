//! Unblocked float formats: F32 (4 bytes/value, 32 bpw), F16 (2 bytes, 16 bpw, IEEE half)
//! and BF16 (2 bytes, 16 bpw, the top half of an f32). All little-endian.
//!
//! Reference: ggml-org/ggml `d99724f` `src/ggml.c` (`ggml_fp16_to_fp32_row`,
//! `ggml_bf16_to_fp32_row`, `ggml_compute_fp32_to_bf16` for round-to-nearest-even).

/// Scalar reference: little-endian f32 bytes to f32.
pub(crate) fn dequant_f32_ref(src: &[u8], dst: &mut [f32]) {
    for (d, s) in dst.iter_mut().zip(src.chunks_exact(4)) {
        *d = f32::from_le_bytes([s[0], s[1], s[2], s[3]]);
    }
}

/// Scalar reference: IEEE half to f32 (exact).
pub(crate) fn dequant_f16_ref(src: &[u8], dst: &mut [f32]) {
    for (d, s) in dst.iter_mut().zip(src.chunks_exact(2)) {
        *d = crate::block::f16_le([s[0], s[1]]);
    }
}

/// Scalar reference: bfloat16 to f32 (exact: the bits move to the top half).
pub(crate) fn dequant_bf16_ref(src: &[u8], dst: &mut [f32]) {
    for (d, s) in dst.iter_mut().zip(src.chunks_exact(2)) {
        *d = f32::from_bits(u32::from(u16::from_le_bytes([s[0], s[1]])) << 16);
    }
}

/// f32 to little-endian bytes (exact).
pub(crate) fn quant_f32(src: &[f32], dst: &mut [u8]) {
    for (s, d) in src.iter().zip(dst.chunks_exact_mut(4)) {
        d.copy_from_slice(&s.to_le_bytes());
    }
}

/// f32 to IEEE half, round to nearest even.
pub(crate) fn quant_f16(src: &[f32], dst: &mut [u8]) {
    for (s, d) in src.iter().zip(dst.chunks_exact_mut(2)) {
        d.copy_from_slice(&crate::block::f16_bytes(*s));
    }
}

/// f32 to bfloat16, round to nearest even, NaN kept quiet (as ggml does).
pub(crate) fn quant_bf16(src: &[f32], dst: &mut [u8]) {
    for (s, d) in src.iter().zip(dst.chunks_exact_mut(2)) {
        d.copy_from_slice(&f32_to_bf16(*s).to_le_bytes());
    }
}

/// One f32 to bfloat16 bits, round to nearest even.
pub(crate) fn f32_to_bf16(x: f32) -> u16 {
    let u = x.to_bits();
    if (u & 0x7fff_ffff) > 0x7f80_0000 {
        return ((u >> 16) | 64) as u16;
    }
    ((u + (0x7fff + ((u >> 16) & 1))) >> 16) as u16
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bf16_rounds_to_nearest_even_and_keeps_nan() {
        assert_eq!(f32_to_bf16(1.0), 0x3f80);
        // 1 + 2^-8 is exactly halfway between two bf16 values: ties to even (down).
        assert_eq!(f32_to_bf16(f32::from_bits(0x3f80_8000)), 0x3f80);
        assert_eq!(f32_to_bf16(f32::from_bits(0x3f81_8000)), 0x3f82);
        let nan = f32_to_bf16(f32::from_bits(0x7f80_0001));
        assert!(f32::from_bits(u32::from(nan) << 16).is_nan());
    }

    #[test]
    fn half_round_trip_is_exact_for_representable_values() {
        let src = [0.5f32, -2.0, 65504.0, 0.0, -0.0];
        let mut bytes = [0u8; 10];
        quant_f16(&src, &mut bytes);
        let mut back = [0f32; 5];
        dequant_f16_ref(&bytes, &mut back);
        for (a, b) in src.iter().zip(back.iter()) {
            assert_eq!(a.to_bits(), b.to_bits());
        }
    }
}
