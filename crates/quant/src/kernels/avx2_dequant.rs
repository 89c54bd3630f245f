//! AVX2 dequantizers. Each produces exactly the bits of the scalar reference: integer
//! unpacking is exact, and the float steps are the same IEEE operations in the same order
//! (`d * q`, `d * q + m` as separate multiply and add, never fused).

use std::arch::x86_64::*;

use super::DequantFn;
use ferrite_gguf::GgmlType;

/// The AVX2 dequantizer of `ty`, if one exists.
pub(super) fn lookup(ty: GgmlType) -> Option<DequantFn> {
    Some(match ty {
        GgmlType::F16 => f16,
        GgmlType::BF16 => bf16,
        _ => return None,
    })
}

/// Declares a safe wrapper around a `#[target_feature]` kernel.
macro_rules! wrapper {
    ($name:ident, $imp:ident) => {
        fn $name(src: &[u8], dst: &mut [f32]) {
            // SAFETY: this wrapper is reachable only through `lookup`, which
            // `kernels::dequant_simd` calls only after checking AVX2/FMA/F16C are present.
            unsafe { $imp(src, dst) }
        }
    };
}

wrapper!(f16, f16_imp);
wrapper!(bf16, bf16_imp);

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn f16_imp(src: &[u8], dst: &mut [f32]) {
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
unsafe fn bf16_imp(src: &[u8], dst: &mut [f32]) {
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
