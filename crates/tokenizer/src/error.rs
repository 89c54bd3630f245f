//! The crate's error type: everything that can go wrong building a tokenizer from metadata,
//! decoding ids, or rendering a chat template.

/// Errors returned by this crate.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TokenizerError {
    /// A required `tokenizer.ggml.*` metadata key is missing or has the wrong type.
    #[error("tokenizer metadata: {key}: {reason}")]
    Metadata {
        /// The metadata key.
        key: String,
        /// What was wrong with it.
        reason: String,
    },
    /// `tokenizer.ggml.model` names a tokenizer family this crate does not implement.
    #[error("unsupported tokenizer model {0:?} (supported: gpt2, llama)")]
    UnsupportedModel(String),
    /// `tokenizer.ggml.pre` names a pre-tokenizer this crate does not implement.
    #[error(
        "unsupported pre-tokenizer {0:?} (supported: smollm, llama-bpe, llama3, qwen2, gpt-2, default)"
    )]
    UnsupportedPreTokenizer(String),
    /// Two metadata arrays that must have one entry per token have different lengths.
    #[error("tokenizer metadata: {what} has {got} entries, expected {expected} (one per token)")]
    LengthMismatch {
        /// Which array.
        what: &'static str,
        /// Its length.
        got: usize,
        /// The vocabulary size.
        expected: usize,
    },
    /// A merge rule is malformed or refers to a piece missing from the vocabulary.
    #[error("merge #{index} {merge:?}: {reason}")]
    BadMerge {
        /// Position of the merge in `tokenizer.ggml.merges`.
        index: usize,
        /// The merge text.
        merge: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// A token id (in metadata or passed to decode) is outside the vocabulary.
    #[error("token id {id} is outside the vocabulary ({vocab_size} tokens)")]
    BadTokenId {
        /// The offending id.
        id: u32,
        /// The vocabulary size.
        vocab_size: usize,
    },
    /// The model carries no chat template, so it cannot be used for chat.
    #[error(
        "this model has no chat template (tokenizer.chat_template is absent): it is a base model; use plain text prompts"
    )]
    NoChatTemplate,
    /// The chat template failed to parse or render.
    #[error("chat template error{}: {message}", line.map(|l| format!(" at template line {l}")).unwrap_or_default())]
    Template {
        /// 1-based line of the template where the error happened, when known.
        line: Option<usize>,
        /// The renderer's message (includes `raise_exception` text).
        message: String,
    },
    /// The GGUF metadata could not be read (missing key, wrong type, ...).
    #[error(transparent)]
    Gguf(#[from] ferrite_gguf::GgufError),
}

/// Result alias for this crate.
pub type Result<T> = std::result::Result<T, TokenizerError>;
