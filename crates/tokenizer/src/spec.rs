//! The plain-data description of a tokenizer (what a GGUF file's `tokenizer.*` metadata holds),
//! kept separate from the GGUF reader so tokenizers can be built from synthetic data in tests.

use ferrite_gguf::Strings;

/// Role of a token in the vocabulary (`tokenizer.ggml.token_type`, llama.cpp numbering).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum TokenType {
    /// An ordinary piece produced by BPE merges (1, and 0 = undefined).
    Normal,
    /// The unknown-token placeholder (2).
    Unknown,
    /// A control token such as `<|im_start|>` or `<bos>` (3): recognised in text only with
    /// `parse_special`, hidden by `decode` unless special tokens are shown.
    Control,
    /// A user-defined piece (4), e.g. Gemma's `<table>` or runs of spaces: always matched whole
    /// before BPE, always shown when decoding.
    UserDefined,
    /// An unused slot (5); never produced by encoding.
    Unused,
    /// A byte-fallback piece `<0xNN>` (6).
    Byte,
}

impl TokenType {
    /// Map llama.cpp's integer code; unknown codes count as normal tokens.
    pub fn from_code(code: i32) -> Self {
        match code {
            2 => Self::Unknown,
            3 => Self::Control,
            4 => Self::UserDefined,
            5 => Self::Unused,
            6 => Self::Byte,
            _ => Self::Normal,
        }
    }
}

/// Everything needed to build a [`crate::Tokenizer`], mirroring the GGUF keys
/// `tokenizer.ggml.*` and `tokenizer.chat_template`.
#[derive(Debug, Clone, Default)]
pub struct TokenizerSpec {
    /// `tokenizer.ggml.model`: `gpt2` (byte-level BPE) or `llama` (SentencePiece-style BPE).
    pub model: String,
    /// `tokenizer.ggml.pre`: pre-tokenizer name (byte-level BPE only).
    pub pre: Option<String>,
    /// `tokenizer.ggml.tokens`: the piece text of every token, indexed by id.
    pub tokens: Strings,
    /// `tokenizer.ggml.scores`: merge priority of every piece (SentencePiece-style BPE).
    pub scores: Option<Vec<f32>>,
    /// `tokenizer.ggml.token_type`: llama.cpp token type codes (see [`TokenType`]).
    pub token_types: Option<Vec<i32>>,
    /// `tokenizer.ggml.merges`: `"left right"` pairs in rank order (byte-level BPE).
    pub merges: Vec<String>,
    /// `tokenizer.ggml.bos_token_id`.
    pub bos_id: Option<u32>,
    /// `tokenizer.ggml.eos_token_id`.
    pub eos_id: Option<u32>,
    /// `tokenizer.ggml.unknown_token_id`.
    pub unk_id: Option<u32>,
    /// `tokenizer.ggml.add_bos_token`; absent means llama.cpp's default (true for `llama`,
    /// false for `gpt2`).
    pub add_bos: Option<bool>,
    /// `tokenizer.ggml.add_eos_token`; absent means false.
    pub add_eos: Option<bool>,
    /// `tokenizer.ggml.add_space_prefix`; absent means llama.cpp's default (true for `llama`,
    /// false for `gpt2`).
    pub add_space_prefix: Option<bool>,
    /// `tokenizer.chat_template` (jinja2 source).
    pub chat_template: Option<String>,
}
