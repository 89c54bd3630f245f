//! The error type of this crate: unsupported or malformed models, bad session use, and the
//! errors of the crates underneath (GGUF, dequantization, the backend's ops).

/// Everything that can go wrong loading or running a model.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ModelError {
    /// `general.architecture` names an architecture ferrite does not implement.
    #[error(
        "unsupported architecture {0:?} (supported: llama, gemma3, qwen2, qwen3, qwen3moe; \
         mistral and mixtral are llama)"
    )]
    UnknownArchitecture(String),
    /// The file asks for a feature of a supported architecture that ferrite does not
    /// implement.
    #[error("unsupported feature: {what} (metadata key {key})")]
    Unsupported {
        /// The metadata key or tensor that requests it.
        key: String,
        /// What is not supported.
        what: String,
    },
    /// A metadata key is missing, has the wrong type or an out-of-range value.
    #[error("metadata: {0}")]
    Gguf(#[from] ferrite_gguf::GgufError),
    /// A metadata value is present but unusable.
    #[error("metadata key {key}: {reason}")]
    BadMetadata {
        /// The key.
        key: String,
        /// What is wrong with its value.
        reason: String,
    },
    /// A tensor the architecture needs is absent.
    #[error("missing tensor {0}")]
    MissingTensor(String),
    /// A tensor has the wrong shape for the configuration.
    #[error("tensor {name} has dims {got:?}, expected {expected:?}")]
    TensorShape {
        /// Tensor name.
        name: String,
        /// Dims in GGUF order as found.
        got: Vec<u64>,
        /// Dims in GGUF order as the configuration requires.
        expected: Vec<u64>,
    },
    /// A tensor has a type that no GGUF writer gives it (1-D tensors are F32).
    #[error("tensor {name} has type {got}, expected {expected}")]
    TensorType {
        /// Tensor name.
        name: String,
        /// Its type as found.
        got: ferrite_gguf::GgmlType,
        /// The type it must have.
        expected: ferrite_gguf::GgmlType,
    },
    /// A weight (or a block scale) is NaN or infinite.
    #[error("tensor {name} holds a non-finite value ({value}) at element {index}")]
    NonFiniteWeight {
        /// Tensor name.
        name: String,
        /// Index of the value (for a block scale: of its block's first value).
        index: u64,
        /// The value.
        value: f32,
    },
    /// Dequantizing a tensor failed (unsupported type or bad data).
    #[error("dequantizing {name}: {source}")]
    Quant {
        /// Tensor name.
        name: String,
        /// The underlying error.
        #[source]
        source: ferrite_quant::QuantError,
    },
    /// A backend refused or failed an op.
    #[error(transparent)]
    Backend(#[from] ferrite_backend::BackendError),
    /// The session's context cannot hold the new tokens.
    #[error("context full: {n_past} tokens cached + {n_new} new > context size {ctx}")]
    ContextFull {
        /// Tokens already in the cache.
        n_past: usize,
        /// Tokens passed to this call.
        n_new: usize,
        /// The session's context size.
        ctx: usize,
    },
    /// A token id is not in the vocabulary.
    #[error("token id {token} is outside the vocabulary of {n_vocab}")]
    TokenOutOfRange {
        /// The id.
        token: u32,
        /// Vocabulary size.
        n_vocab: usize,
    },
    /// An argument is out of range (empty input, zero context, bad logits selection).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
}
