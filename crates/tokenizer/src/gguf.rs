//! Filling a [`TokenizerSpec`] from a GGUF file's `tokenizer.*` metadata.
//!
//! Optional keys may be absent, but a key that is present with the wrong type is an error:
//! silently ignoring it would change tokenization.

use ferrite_gguf::{Gguf, GgufError};

use crate::error::Result;
use crate::spec::TokenizerSpec;

/// `f(key)` when `key` is present, `None` when it is absent.
fn optional<'g, T>(
    gguf: &'g Gguf,
    key: &str,
    f: impl FnOnce(&'g Gguf, &str) -> std::result::Result<T, GgufError>,
) -> Result<Option<T>> {
    if gguf.get(key).is_none() {
        return Ok(None);
    }
    Ok(Some(f(gguf, key)?))
}

fn owned(items: Vec<&str>) -> Vec<String> {
    items.into_iter().map(str::to_owned).collect()
}

impl TokenizerSpec {
    /// Read the tokenizer metadata of a GGUF file.
    pub fn from_gguf(gguf: &Gguf) -> Result<Self> {
        Ok(Self {
            model: gguf.get_str("tokenizer.ggml.model")?.to_owned(),
            pre: optional(gguf, "tokenizer.ggml.pre", Gguf::get_str)?.map(str::to_owned),
            tokens: gguf.get_strings("tokenizer.ggml.tokens")?.clone(),
            scores: optional(gguf, "tokenizer.ggml.scores", Gguf::get_f32_array)?,
            token_types: optional(gguf, "tokenizer.ggml.token_type", Gguf::get_i32_array)?,
            merges: optional(gguf, "tokenizer.ggml.merges", Gguf::get_str_array)?
                .map(owned)
                .unwrap_or_default(),
            bos_id: optional(gguf, "tokenizer.ggml.bos_token_id", Gguf::get_u32)?,
            eos_id: optional(gguf, "tokenizer.ggml.eos_token_id", Gguf::get_u32)?,
            unk_id: optional(gguf, "tokenizer.ggml.unknown_token_id", Gguf::get_u32)?,
            add_bos: optional(gguf, "tokenizer.ggml.add_bos_token", Gguf::get_bool)?,
            add_eos: optional(gguf, "tokenizer.ggml.add_eos_token", Gguf::get_bool)?,
            add_space_prefix: optional(gguf, "tokenizer.ggml.add_space_prefix", Gguf::get_bool)?,
            chat_template: optional(gguf, "tokenizer.chat_template", Gguf::get_str)?
                .map(str::to_owned),
        })
    }
}

#[cfg(test)]
mod tests {
    use ferrite_gguf::{Array, GgufWriter, Value};

    use crate::{Tokenizer, TokenizerError};

    fn strings(items: &[&str]) -> Value {
        Value::Array(Array::String(items.iter().collect()))
    }

    fn file(pre: &str, add_bos: Value) -> ferrite_gguf::Gguf {
        let mut w = GgufWriter::new();
        let entries = [
            ("tokenizer.ggml.model", Value::String("gpt2".into())),
            ("tokenizer.ggml.pre", Value::String(pre.into())),
            ("tokenizer.ggml.tokens", strings(&["<s>", "a", "b", "ab"])),
            (
                "tokenizer.ggml.token_type",
                Value::Array(Array::I32(vec![3, 1, 1, 1])),
            ),
            ("tokenizer.ggml.merges", strings(&["a b"])),
            ("tokenizer.ggml.bos_token_id", Value::U32(0)),
            ("tokenizer.ggml.add_bos_token", add_bos),
        ];
        for (k, v) in entries {
            w.add_metadata(k, v).expect("valid metadata");
        }
        let bytes = w.to_bytes().expect("serialize");
        ferrite_gguf::Gguf::from_bytes(bytes).expect("parse")
    }

    #[test]
    fn builds_from_gguf_metadata() {
        let tok = Tokenizer::from_gguf(&file("gpt-2", Value::Bool(true))).expect("tokenizer");
        assert_eq!(tok.encode("ab<s>", true, true), vec![0, 3, 0]);
        // Without parse_special "<s>" is plain text, and this toy vocabulary has none of its
        // bytes, so they are dropped.
        assert_eq!(tok.encode("ab<s>", false, false), vec![3]);
        assert!(matches!(
            tok.chat_template_renderer(),
            Err(TokenizerError::NoChatTemplate)
        ));
    }

    #[test]
    fn wrong_types_and_unknown_pre_are_errors() {
        assert!(matches!(
            Tokenizer::from_gguf(&file("gpt-2", Value::U8(1))),
            Err(TokenizerError::Gguf(_))
        ));
        assert!(matches!(
            Tokenizer::from_gguf(&file("mystery", Value::Bool(false))),
            Err(TokenizerError::UnsupportedPreTokenizer(_))
        ));
    }
}
