//! The one error type of this crate: every reason a Hugging Face directory cannot be turned
//! into GGUF. Messages name the file, key, tensor or feature involved.

/// Everything that can go wrong converting a model directory.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConvertError {
    /// A file could not be read.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// A required file is absent.
    #[error("{path} not found (a Hugging Face model directory needs it)")]
    MissingFile {
        /// The expected path.
        path: String,
    },
    /// A JSON file does not parse.
    #[error("{path}: invalid JSON: {reason}")]
    Json {
        /// The file.
        path: String,
        /// Parser message.
        reason: String,
    },
    /// `config.json` names an architecture this converter does not handle.
    #[error(
        "unsupported architecture {0:?} (supported: llama, mistral, mixtral, qwen2, qwen3, qwen3_moe)"
    )]
    UnsupportedArchitecture(String),
    /// The configuration uses a feature this converter (or ferrite) does not handle.
    #[error("unsupported feature: {0}")]
    UnsupportedFeature(String),
    /// A configuration key is missing or has the wrong type or an impossible value.
    #[error("config.json: key {key:?}: {reason}")]
    BadConfig {
        /// The key.
        key: String,
        /// What is wrong.
        reason: String,
    },
    /// The tokenizer files cannot be turned into GGUF tokenizer metadata.
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    /// The safetensors weights are malformed.
    #[error(transparent)]
    Safetensors(#[from] ferrite_safetensors::SafetensorsError),
    /// A checkpoint tensor has no GGUF name under this architecture.
    #[error("tensor {0:?} has no GGUF mapping for this architecture")]
    UnmappedTensor(String),
    /// A tensor the architecture needs is absent.
    #[error("tensor {0:?} is missing from the checkpoint")]
    MissingTensor(String),
    /// A tensor's dtype or shape does not fit its role.
    #[error("tensor {tensor:?}: {reason}")]
    BadTensor {
        /// The tensor (checkpoint name).
        tensor: String,
        /// What is wrong.
        reason: String,
    },
    /// Building the GGUF file failed.
    #[error(transparent)]
    Gguf(#[from] ferrite_gguf::GgufError),
    /// Quantizing a tensor failed.
    #[error("tensor {tensor:?}: {source}")]
    Quant {
        /// The tensor (GGUF name).
        tensor: String,
        /// The quantizer's error.
        #[source]
        source: ferrite_quant::QuantError,
    },
}

impl From<ferrite_files::FileError> for ConvertError {
    fn from(e: ferrite_files::FileError) -> ConvertError {
        ConvertError::Io {
            path: e.path.display().to_string(),
            source: e.source,
        }
    }
}
