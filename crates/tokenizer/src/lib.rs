//! ferrite-tokenizer: the tokenizers and chat templates of GGUF models, matching Hugging Face.
//!
//! Two tokenizer families are implemented, chosen by `tokenizer.ggml.model`:
//!
//! - `gpt2`: byte-level BPE with ranked merges and a pre-tokenizer chosen by
//!   `tokenizer.ggml.pre` (SmolLM2, Llama 3, Qwen 2, GPT-2).
//! - `llama`: SentencePiece-style BPE driven by piece scores, with `<0xNN>` byte fallback
//!   (Gemma 3).
//!
//! The key design choice is that a [`Tokenizer`] is built from a plain [`TokenizerSpec`], not
//! from a file: the GGUF reader only fills the spec, so every algorithm is testable on tiny
//! synthetic vocabularies. Special tokens are split out first (leftmost-longest, as Hugging
//! Face's added-token matcher), control tokens only when `parse_special` is on.
//!
//! ```
//! use ferrite_tokenizer::{Tokenizer, TokenizerSpec};
//!
//! let spec = TokenizerSpec {
//!     model: "gpt2".into(),
//!     pre: Some("gpt-2".into()),
//!     tokens: ["<|end|>", "h", "i", "hi"].into_iter().collect(),
//!     token_types: Some(vec![3, 1, 1, 1]),
//!     merges: vec!["h i".into()],
//!     ..TokenizerSpec::default()
//! };
//! let tok = Tokenizer::from_spec(spec)?;
//! let ids = tok.encode("hi<|end|>", false, true);
//! assert_eq!(ids, [3, 0]);
//! assert_eq!(tok.decode(&ids, true)?, "hi<|end|>");
//! assert_eq!(tok.decode(&ids, false)?, "hi");
//! # Ok::<(), ferrite_tokenizer::TokenizerError>(())
//! ```

#![deny(missing_docs)]

mod bytelevel;
mod decode;
mod error;
mod gguf;
mod hash;
mod json;
mod pieces;
mod pretok;
mod spec;
mod special;
mod spm;
mod template;
mod time;

pub use decode::StreamDecoder;
pub use error::{Result, TokenizerError};
pub use ferrite_gguf::Strings;
pub use spec::{TokenType, TokenizerSpec};
pub use template::{ChatRequest, ChatTemplate};

use std::sync::Arc;

use bytelevel::ByteLevelBpe;
use decode::TokenBytes;
use pretok::PreTokenizer;
use special::{Segment, SpecialMatcher};
use spm::SpmBpe;

/// The algorithm that encodes plain text.
#[derive(Debug)]
enum Model {
    ByteLevel(Box<ByteLevelBpe>),
    Spm(Box<SpmBpe>),
}

/// A model's tokenizer: encoding, decoding, special tokens and chat template.
#[derive(Debug)]
pub struct Tokenizer {
    model: Model,
    special: SpecialMatcher,
    tokens: Arc<Strings>,
    types: Vec<TokenType>,
    bytes: TokenBytes,
    bos_id: Option<u32>,
    eos_id: Option<u32>,
    add_bos: bool,
    add_eos: bool,
    chat_template: Option<String>,
}

impl Tokenizer {
    /// Build a tokenizer from its metadata.
    pub fn from_spec(spec: TokenizerSpec) -> Result<Self> {
        let tokens = Arc::new(spec.tokens);
        let n = tokens.len();
        let types: Vec<TokenType> = match &spec.token_types {
            Some(codes) if codes.len() != n => {
                return Err(TokenizerError::LengthMismatch {
                    what: "tokenizer.ggml.token_type",
                    got: codes.len(),
                    expected: n,
                });
            }
            Some(codes) => codes.iter().map(|&c| TokenType::from_code(c)).collect(),
            None => vec![TokenType::Normal; n],
        };
        for id in [spec.bos_id, spec.eos_id, spec.unk_id]
            .into_iter()
            .flatten()
        {
            if id as usize >= n {
                return Err(TokenizerError::BadTokenId { id, vocab_size: n });
            }
        }
        let is_spm = match spec.model.as_str() {
            "gpt2" => false,
            "llama" => true,
            other => return Err(TokenizerError::UnsupportedModel(other.to_owned())),
        };
        let model = if is_spm {
            let scores = spec
                .scores
                .clone()
                .ok_or_else(|| TokenizerError::Metadata {
                    key: "tokenizer.ggml.scores".into(),
                    reason: "required for a llama (SentencePiece-style) tokenizer".into(),
                })?;
            if scores.len() != n {
                return Err(TokenizerError::LengthMismatch {
                    what: "tokenizer.ggml.scores",
                    got: scores.len(),
                    expected: n,
                });
            }
            Model::Spm(Box::new(SpmBpe::new(
                &tokens,
                scores,
                &types,
                spec.unk_id,
                spec.add_space_prefix.unwrap_or(true),
            )))
        } else {
            // A missing `pre` is llama.cpp's "default"; an unknown one is an error.
            let pre = PreTokenizer::from_name(spec.pre.as_deref().unwrap_or("default"))?;
            Model::ByteLevel(Box::new(ByteLevelBpe::new(pre, &tokens, &spec.merges)?))
        };
        let special = SpecialMatcher::new(
            tokens
                .iter()
                .zip(&types)
                .enumerate()
                .filter(|(_, (_, ty))| matches!(ty, TokenType::Control | TokenType::UserDefined))
                .map(|(i, (t, ty))| (t, i as u32, *ty == TokenType::Control)),
        );
        let bytes = if is_spm {
            TokenBytes::new(tokens.iter().zip(&types).map(|(t, ty)| {
                let b = match (ty, spm::parse_byte_piece(t)) {
                    (TokenType::Byte, Some(b)) => vec![b],
                    _ => t.replace(spm::SPACE_MARK, " ").into_bytes(),
                };
                (b, *ty == TokenType::Control)
            }))
        } else {
            let map = bytelevel::char_to_byte_map();
            TokenBytes::new(
                tokens
                    .iter()
                    .zip(&types)
                    .map(|(t, ty)| (bytelevel::piece_bytes(t, &map), *ty == TokenType::Control)),
            )
        };
        Ok(Self {
            model,
            special,
            bos_id: spec.bos_id,
            eos_id: spec.eos_id,
            add_bos: spec.add_bos.unwrap_or(is_spm),
            add_eos: spec.add_eos.unwrap_or(false),
            chat_template: spec.chat_template,
            tokens,
            types,
            bytes,
        })
    }

    /// Build the tokenizer described by a GGUF file's metadata.
    pub fn from_gguf(gguf: &ferrite_gguf::Gguf) -> Result<Self> {
        Self::from_spec(TokenizerSpec::from_gguf(gguf)?)
    }

    /// Encode `text`. `add_special` adds BOS/EOS as the metadata asks; `parse_special` lets
    /// control-token text (e.g. `<|im_start|>`) become the control token instead of plain text.
    pub fn encode(&self, text: &str, add_special: bool, parse_special: bool) -> Vec<u32> {
        let mut out = Vec::with_capacity(text.len() / 3 + 2);
        if add_special && self.add_bos {
            out.extend(self.bos_id);
        }
        let mut at_start = true;
        for seg in self.special.split(text, parse_special) {
            match seg {
                Segment::Token(id) => out.push(id),
                Segment::Text(t) => match &self.model {
                    Model::ByteLevel(m) => m.encode(t, &mut out),
                    Model::Spm(m) => m.encode(t, at_start, &mut out),
                },
            }
            at_start = false;
        }
        if add_special && self.add_eos {
            out.extend(self.eos_id);
        }
        out
    }

    /// Decode ids to text; control tokens are kept as their text when `show_special`, else
    /// dropped. Invalid UTF-8 becomes U+FFFD as in `String::from_utf8_lossy`.
    pub fn decode(&self, ids: &[u32], show_special: bool) -> Result<String> {
        decode::decode(&self.bytes, ids, show_special)
    }

    /// A decoder for streaming output one id at a time.
    pub fn stream_decoder(&self, show_special: bool) -> StreamDecoder<'_> {
        StreamDecoder::new(&self.bytes, show_special)
    }

    /// The bytes token `id` decodes to: empty for a control token, `None` past the
    /// vocabulary. Byte-level pieces may be part of a UTF-8 sequence.
    pub fn token_bytes(&self, id: u32) -> Option<&[u8]> {
        self.bytes.get(id, false).ok()
    }

    /// Every token's bytes in id order, as [`Tokenizer::token_bytes`] gives them (what a
    /// byte grammar over the vocabulary reads).
    pub fn all_token_bytes(&self) -> impl Iterator<Item = &[u8]> + '_ {
        (0..self.vocab_size() as u32).map(|id| self.token_bytes(id).unwrap_or_default())
    }

    /// The piece text of a token as stored in the vocabulary (e.g. `Ġthe`, `▁the`, `<0x0A>`).
    pub fn piece(&self, id: u32) -> Option<&str> {
        self.tokens.get(id as usize)
    }

    /// The type of a token.
    pub fn token_type(&self, id: u32) -> Option<TokenType> {
        self.types.get(id as usize).copied()
    }

    /// The id of a piece, by exact text (a linear scan: meant for looking up a few special
    /// tokens at startup, not for encoding).
    pub fn token_id(&self, piece: &str) -> Option<u32> {
        self.tokens
            .iter()
            .position(|t| t == piece)
            .map(|i| i as u32)
    }

    /// Number of tokens in the vocabulary.
    pub fn vocab_size(&self) -> usize {
        self.tokens.len()
    }

    /// Beginning-of-sequence token, if the model has one.
    pub fn bos_id(&self) -> Option<u32> {
        self.bos_id
    }

    /// End-of-sequence token, if the model has one.
    pub fn eos_id(&self) -> Option<u32> {
        self.eos_id
    }

    /// Tokens that end a generated turn: EOS plus the control tokens that chat formats use as
    /// turn or document ends (`<|im_end|>`, `<end_of_turn>`, `<|eot_id|>`, `<|endoftext|>`,
    /// `<|end|>`, `<|eom_id|>`), as llama.cpp also treats them. Sorted, without duplicates.
    pub fn end_of_generation_ids(&self) -> Vec<u32> {
        const TURN_ENDS: [&str; 6] = [
            "<|im_end|>",
            "<end_of_turn>",
            "<|eot_id|>",
            "<|endoftext|>",
            "<|end|>",
            "<|eom_id|>",
        ];
        let mut ids: Vec<u32> = self
            .tokens
            .iter()
            .zip(&self.types)
            .enumerate()
            .filter(|(_, (t, ty))| **ty == TokenType::Control && TURN_ENDS.contains(t))
            .map(|(i, _)| i as u32)
            .chain(self.eos_id)
            .collect();
        ids.sort_unstable();
        ids.dedup();
        ids
    }

    /// Whether `encode(.., add_special = true, ..)` prepends BOS.
    pub fn add_bos(&self) -> bool {
        self.add_bos
    }

    /// The chat template, parsed, with this vocabulary's BOS/EOS texts; a clear error for a
    /// model without one (a base model).
    pub fn chat_template_renderer(&self) -> Result<ChatTemplate> {
        let source = self
            .chat_template
            .as_deref()
            .ok_or(TokenizerError::NoChatTemplate)?;
        let text = |id: Option<u32>| id.and_then(|i| self.piece(i)).unwrap_or_default();
        ChatTemplate::new(source, text(self.bos_id), text(self.eos_id))
    }

    /// The jinja2 chat template source, if the model has one.
    pub fn chat_template(&self) -> Option<&str> {
        self.chat_template.as_deref()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A byte-level vocabulary with the full byte alphabet, a few merges and two specials.
    fn byte_level() -> Tokenizer {
        let table = bytelevel::byte_to_char_table();
        let mut tokens: Vec<String> = table.iter().map(|c| c.to_string()).collect();
        tokens.extend(["Ġt", "he", "Ġthe", "<|s|>", "<u>"].map(String::from));
        let mut types = vec![1; tokens.len()];
        types[259] = 3;
        types[260] = 4;
        Tokenizer::from_spec(TokenizerSpec {
            model: "gpt2".into(),
            pre: Some("smollm".into()),
            tokens: tokens.iter().collect(),
            token_types: Some(types),
            merges: ["Ġ t", "h e", "Ġt he"].map(String::from).to_vec(),
            ..TokenizerSpec::default()
        })
        .expect("synthetic byte-level tokenizer")
    }

    /// A SentencePiece-style vocabulary: a few pieces, all 256 byte pieces, one control token.
    fn spm() -> Tokenizer {
        let mut tokens: Vec<String> = ["<bos>", "▁", "t", "h", "e", "▁t", "he", "▁the", "  "]
            .map(String::from)
            .to_vec();
        let mut types = vec![3, 1, 1, 1, 1, 1, 1, 1, 4];
        let mut scores = vec![0.0, -1.0, -2.0, -3.0, -4.0, -5.0, -6.0, -7.0, 0.0];
        for b in 0..=255u8 {
            tokens.push(format!("<0x{b:02X}>"));
            types.push(6);
            scores.push(0.0);
        }
        Tokenizer::from_spec(TokenizerSpec {
            model: "llama".into(),
            tokens: tokens.iter().collect(),
            token_types: Some(types),
            scores: Some(scores),
            bos_id: Some(0),
            add_space_prefix: Some(false),
            ..TokenizerSpec::default()
        })
        .expect("synthetic spm tokenizer")
    }

    #[test]
    fn synthetic_vocabularies_encode_as_expected() {
        let bl = byte_level();
        assert_eq!(bl.encode(" the<|s|>", false, true), vec![258, 259]);
        let sp = spm();
        // add_bos defaults to true for llama-style tokenizers.
        assert_eq!(
            sp.encode(" the  x", true, false),
            vec![0, 7, 8, 9 + u32::from(b'x')]
        );
    }

    #[test]
    fn token_bytes_are_what_decoding_gives() {
        let sp = spm();
        assert_eq!(sp.token_bytes(7), Some(&b" the"[..]));
        assert_eq!(sp.token_bytes(9 + u32::from(b'A')), Some(&b"A"[..]));
        // A control token is never text; an id past the vocabulary is nothing.
        assert_eq!(sp.token_bytes(0), Some(&b""[..]));
        assert_eq!(sp.token_bytes(sp.vocab_size() as u32), None);
        let bl = byte_level();
        for id in 0..bl.vocab_size() as u32 {
            let bytes = bl.token_bytes(id).unwrap();
            assert_eq!(
                String::from_utf8_lossy(bytes),
                bl.decode(&[id], false).unwrap()
            );
        }
        let all: Vec<&[u8]> = sp.all_token_bytes().collect();
        assert_eq!(all.len(), sp.vocab_size());
        assert_eq!((all[0], all[7]), (&b""[..], &b" the"[..]));
    }

    /// The server shares one tokenizer and template across request threads.
    #[test]
    fn tokenizer_and_template_are_send_and_sync() {
        fn check<T: Send + Sync>() {}
        check::<Tokenizer>();
        check::<ChatTemplate>();
    }

    #[test]
    fn unknown_model_is_an_error() {
        let err = Tokenizer::from_spec(TokenizerSpec {
            model: "rwkv".into(),
            ..TokenizerSpec::default()
        });
        assert!(matches!(err, Err(TokenizerError::UnsupportedModel(_))));
    }

    proptest! {
        #![proptest_config(ProptestConfig {
            cases: 200,
            failure_persistence: None,
            ..ProptestConfig::default()
        })]

        /// With a complete byte alphabet, byte-level BPE round-trips any Unicode text (the real
        /// SmolLM2 vocabulary lacks 21 bytes; see tests/real_models.rs).
        #[test]
        fn round_trip_arbitrary_unicode(s in "(\\PC|\\s|<\\|s\\|>|<u>| the|[0-9])*", parse in any::<bool>()) {
            for tok in [byte_level(), spm()] {
                let ids = tok.encode(&s, false, parse);
                prop_assert_eq!(tok.decode(&ids, true).expect("decode"), s.clone());
            }
        }

        /// Streaming any id sequence equals the full decode.
        #[test]
        fn stream_matches_decode(ids in prop::collection::vec(0u32..264, 0..24)) {
            let tok = spm();
            for show in [true, false] {
                let mut d = tok.stream_decoder(show);
                let mut out = String::new();
                for &id in &ids {
                    out.push_str(&d.push(id).expect("id"));
                }
                out.push_str(&d.finish());
                prop_assert_eq!(out, tok.decode(&ids, show).expect("decode"));
            }
        }
    }
}
