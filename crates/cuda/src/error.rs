//! [`CudaError`]: every failure of the CUDA backend, from a missing driver to a bad tensor.

use ferrite_gguf::GgmlType;

/// Errors of the CUDA backend.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CudaError {
    /// No usable CUDA driver or device (library absent, no device, init failed).
    #[error("no CUDA device: {0}")]
    NoDevice(String),
    /// A CUDA driver call failed after the device was found.
    #[error("CUDA driver error: {0}")]
    Driver(#[from] cudarc::driver::DriverError),
    /// NVRTC is missing or rejected the kernel sources.
    #[error("kernel compilation failed: {0}")]
    Compile(String),
    /// Reading or writing the kernel cache directory failed.
    #[error("kernel cache {path}: {source}")]
    Cache {
        /// The file or directory.
        path: std::path::PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A weight type this backend has no kernel for.
    #[error("{name}: tensor type {ty} is not supported by the CUDA backend")]
    UnsupportedType {
        /// Tensor name.
        name: String,
        /// Its type.
        ty: GgmlType,
    },
    /// A model feature the CUDA forward pass does not implement (it would run, but wrongly).
    #[error("the CUDA backend does not implement {0} yet; use --backend cpu")]
    UnsupportedFeature(&'static str),
    /// A shape the kernels cannot handle or a call with bad arguments.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// A session state that does not fit the session importing it (KV type, layer count,
    /// row width, context, token ids or logits length); the session is left unchanged.
    #[error("session state does not fit this session: {0}")]
    SessionState(#[source] ferrite_model::ModelError),
    /// Reading the model (metadata, tensors, dequantizing norms) failed.
    #[error(transparent)]
    Model(#[from] ferrite_model::ModelError),
}

impl From<ferrite_files::FileError> for CudaError {
    fn from(e: ferrite_files::FileError) -> CudaError {
        CudaError::Cache {
            path: e.path,
            source: e.source,
        }
    }
}
