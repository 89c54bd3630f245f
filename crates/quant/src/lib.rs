//! GGML quantized block formats: layouts, dequantization, quantization and dot products.
//!
//! Every format has a `#[repr(C)]` block struct (size asserted at compile time), a permanent
//! scalar reference dequantizer that matches gguf-py bit for bit (the fixtures in
//! `fixtures/reference/quant` are the oracle), and, for the hot formats, vectorized kernels
//! selected at run time by [`SimdLevel`].
//!
//! Key design choice: products keep activations in f32 and dequantize weights exactly, and
//! every level has one *canonical accumulation order* (see [`kernels`]). Dequantization is
//! bit-exact at every level, so a matrix product gives the same bits whether it is computed
//! row by row, tiled, or split over any number of threads.
//!
//! ```
//! use ferrite_gguf::GgmlType;
//! let x: Vec<f32> = (0..64).map(|i| (i as f32 - 32.0) / 8.0).collect();
//! let mut q = vec![0u8; GgmlType::Q8_0.row_bytes(64).unwrap() as usize];
//! ferrite_quant::quantize(GgmlType::Q8_0, &x, &mut q).unwrap();
//! let mut back = vec![0f32; 64];
//! ferrite_quant::dequantize(GgmlType::Q8_0, &q, &mut back).unwrap();
//! assert!((back[5] - x[5]).abs() < 0.02);
//! ```
#![deny(missing_docs)]

mod block;
mod float;
pub mod kernels;
mod kquantize;
mod kquants;
mod legacy;
mod level;
mod nonlinear;
mod q8dot;

pub use ferrite_gguf::GgmlType;
pub use kquants::{BlockQ2K, BlockQ3K, BlockQ4K, BlockQ5K, BlockQ6K, BlockQ8K, scale_min_k4};
pub use legacy::{BlockQ4_0, BlockQ4_1, BlockQ5_0, BlockQ5_1, BlockQ8_0};
pub use level::{SIMD_ENV, SimdLevel, simd_level};
pub use nonlinear::{
    BlockIq4Nl, BlockIq4Xs, BlockMxfp4, BlockTq10, BlockTq20, KVALUES_IQ4NL, KVALUES_MXFP4,
};
pub use q8dot::{activation_type, dot_quantized};

/// Errors from this crate's entry points.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum QuantError {
    /// The format has no implementation of this operation.
    #[error("{op} is not implemented for {ty}")]
    Unsupported {
        /// The element type.
        ty: GgmlType,
        /// The operation asked for.
        op: &'static str,
    },
    /// The value count is not a whole number of blocks.
    #[error("{n} values is not a whole number of {ty} blocks ({block} values each)")]
    PartialBlock {
        /// The element type.
        ty: GgmlType,
        /// Values asked for.
        n: usize,
        /// Values per block.
        block: u64,
    },
    /// The byte buffer does not hold exactly the blocks for the value count.
    #[error("{ty}: {n} values need {expected} bytes, got {got}")]
    ByteLength {
        /// The element type.
        ty: GgmlType,
        /// Values asked for.
        n: usize,
        /// Bytes those values occupy.
        expected: u64,
        /// Bytes given.
        got: usize,
    },
    /// The CPU lacks the instructions of the requested kernel level.
    #[error("SIMD level {level} is not available on this CPU")]
    LevelUnavailable {
        /// The level asked for.
        level: SimdLevel,
    },
    /// A tile request exceeded the kernel's shape limits or its rows were too short.
    #[error("bad tile: {rows} x {cols} rows of at least {k} values")]
    BadTile {
        /// Weight rows given.
        rows: usize,
        /// Activation rows given.
        cols: usize,
        /// Values per row asked for.
        k: usize,
    },
}

/// Checks that `bytes` holds exactly `n` values of `ty`.
pub(crate) fn check_row(ty: GgmlType, bytes: usize, n: usize) -> Result<(), QuantError> {
    let expected = ty.row_bytes(n as u64).ok_or(QuantError::PartialBlock {
        ty,
        n,
        block: ty.block_size(),
    })?;
    if expected != bytes as u64 {
        return Err(QuantError::ByteLength {
            ty,
            n,
            expected,
            got: bytes,
        });
    }
    Ok(())
}

/// Whether [`dequantize`] handles `ty`.
pub fn supports_dequantize(ty: GgmlType) -> bool {
    kernels::dequant_ref(ty).is_some()
}

/// Whether [`quantize`] handles `ty`.
pub fn supports_quantize(ty: GgmlType) -> bool {
    quant_fn(ty).is_some()
}

/// Dequantizes `dst.len()` values of type `ty` from `src` (which must be exactly
/// `ty.row_bytes(dst.len())` bytes) with the kernels of [`simd_level`].
pub fn dequantize(ty: GgmlType, src: &[u8], dst: &mut [f32]) -> Result<(), QuantError> {
    dequantize_with(simd_level(), ty, src, dst)
}

/// [`dequantize`] with the kernels of an explicit level (bit-identical at every level).
pub fn dequantize_with(
    level: SimdLevel,
    ty: GgmlType,
    src: &[u8],
    dst: &mut [f32],
) -> Result<(), QuantError> {
    let f = kernels::dequant_fn(level, ty)?;
    check_row(ty, src.len(), dst.len())?;
    f(src, dst);
    Ok(())
}

/// The scalar reference dequantization (the oracle-matched path).
pub fn dequantize_ref(ty: GgmlType, src: &[u8], dst: &mut [f32]) -> Result<(), QuantError> {
    dequantize_with(SimdLevel::Scalar, ty, src, dst)
}

type QuantFn = fn(&[f32], &mut [u8]);

fn quant_fn(ty: GgmlType) -> Option<QuantFn> {
    use GgmlType as T;
    Some(match ty {
        T::F32 => float::quant_f32,
        T::F16 => float::quant_f16,
        T::BF16 => float::quant_bf16,
        T::Q4_0 => legacy::quant_q4_0,
        T::Q4_1 => legacy::quant_q4_1,
        T::Q5_0 => legacy::quant_q5_0,
        T::Q5_1 => legacy::quant_q5_1,
        T::Q8_0 => legacy::quant_q8_0,
        T::Q4_K => kquantize::quant_q4k,
        T::Q5_K => kquantize::quant_q5k,
        T::Q6_K => kquantize::quant_q6k,
        T::Q8_K => kquantize::quant_q8k,
        _ => return None,
    })
}

/// Quantizes `src` into `dst` (exactly `ty.row_bytes(src.len())` bytes), round to nearest.
pub fn quantize(ty: GgmlType, src: &[f32], dst: &mut [u8]) -> Result<(), QuantError> {
    let f = quant_fn(ty).ok_or(QuantError::Unsupported { ty, op: "quantize" })?;
    check_row(ty, dst.len(), src.len())?;
    f(src, dst);
    Ok(())
}

/// Dot product of one quantized row (`x.len()` values of `ty`) with f32 activations, using
/// [`simd_level`]; see [`kernels::dot_row`].
pub fn dot_row(ty: GgmlType, row: &[u8], x: &[f32]) -> Result<f32, QuantError> {
    kernels::dot_row(simd_level(), ty, row, x)
}
