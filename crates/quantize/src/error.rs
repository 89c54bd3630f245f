//! [`QuantizeError`]: everything that can stop a quantization run.

use ferrite_gguf::{GgmlType, GgufError};
use ferrite_quant::QuantError;

/// Errors from [`crate::quantize_file`] and the helpers around it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum QuantizeError {
    /// The mix name is not one [`crate::Mix`] knows.
    #[error(
        "unknown quantization type '{name}' (expected one of: q8_0, q4_0, q4_1, q5_0, q5_1, \
         q4_k_m, q5_k_m, q6_k, f16, bf16, f32)"
    )]
    UnknownMix {
        /// The name given.
        name: String,
    },
    /// A tensor is already block-quantized and would have to be requantized.
    #[error(
        "{tensor} is already quantized ({from}); requantizing it to {to} loses precision and \
         needs --allow-requantize"
    )]
    Requantize {
        /// Tensor name.
        tensor: String,
        /// Its type in the input.
        from: GgmlType,
        /// The type the mix wants.
        to: GgmlType,
    },
    /// The input is one shard of a split GGUF; only single-file models are handled.
    #[error("the input is shard {no} of a split GGUF ({count} files); merge it first")]
    SplitInput {
        /// `split.no`.
        no: u64,
        /// `split.count`.
        count: u64,
    },
    /// The directory the output should go to does not exist.
    #[error("output directory {path} does not exist")]
    OutputDir {
        /// The missing directory.
        path: String,
    },
    /// A tensor holds NaN or infinity, which no quantized block can represent.
    #[error("{tensor}: row {row} holds a non-finite value")]
    NonFinite {
        /// Tensor name.
        tensor: String,
        /// Row index (across all dimensions above the first).
        row: u64,
    },
    /// Dequantizing or quantizing a tensor failed (unsupported type, shape).
    #[error("{tensor}: {source}")]
    Quant {
        /// Tensor name.
        tensor: String,
        /// What failed.
        #[source]
        source: QuantError,
    },
    /// Reading the input or building the output GGUF failed.
    #[error(transparent)]
    Gguf(#[from] GgufError),
    /// Writing or renaming the output file failed.
    #[error("{path}: {source}")]
    Io {
        /// The file involved.
        path: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
}

impl From<ferrite_files::FileError> for QuantizeError {
    fn from(e: ferrite_files::FileError) -> QuantizeError {
        QuantizeError::Io {
            path: e.path.display().to_string(),
            source: e.source,
        }
    }
}
