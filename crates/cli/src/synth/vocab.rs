//! The `tokenizer.*` metadata of a synthetic model: copied from another GGUF, or a minimal
//! byte-level (gpt2-style) BPE vocabulary made up here.
//!
//! The made-up vocabulary is: the 256 byte pieces (in GPT-2's byte-to-character mapping, so
//! every byte string encodes), then `<|endoftext|>` (control; BOS and EOS), then merged pieces
//! of lowercase letters in order of length (`aa`, `ab`, .., `aaa`, ..), each merge joining a
//! piece already present with one more letter, so every merge is valid.

use anyhow::{Context, bail};
use ferrite_gguf::{Array, Gguf, Value};

/// The end-of-text control token of the made-up vocabulary.
const EOT: &str = "<|endoftext|>";

/// GPT-2's byte-to-character table: printable Latin-1 bytes map to themselves, the others to
/// U+0100 upwards in byte order.
fn byte_chars() -> Vec<char> {
    let mut next = 0x100u32;
    (0u32..256)
        .map(|b| {
            let printable = matches!(b, 0x21..=0x7e | 0xa1..=0xac | 0xae..=0xff);
            let code = if printable {
                b
            } else {
                next += 1;
                next - 1
            };
            char::from_u32(code).unwrap_or('?')
        })
        .collect()
}

/// Metadata of a made-up byte-level tokenizer with `vocab` tokens (at least 256).
pub fn synthesize(vocab: usize) -> anyhow::Result<Vec<(String, Value)>> {
    if vocab < 256 {
        bail!("--vocab must be at least 256 (one token per byte), got {vocab}");
    }
    let mut tokens: Vec<String> = byte_chars().iter().map(char::to_string).collect();
    let mut types: Vec<i32> = vec![1; 256];
    let mut merges: Vec<String> = Vec::new();
    let mut meta = Vec::new();
    if vocab > 256 {
        tokens.push(EOT.to_owned());
        types.push(3);
        meta.push(("tokenizer.ggml.bos_token_id".to_owned(), Value::U32(256)));
        meta.push(("tokenizer.ggml.eos_token_id".to_owned(), Value::U32(256)));
    }
    // Breadth-first over lowercase words: all of length n before any of length n + 1.
    let mut level: Vec<String> = ('a'..='z').map(String::from).collect();
    'fill: while tokens.len() < vocab {
        let mut next_level = Vec::with_capacity(level.len() * 26);
        for prefix in &level {
            for c in 'a'..='z' {
                if tokens.len() >= vocab {
                    break 'fill;
                }
                merges.push(format!("{prefix} {c}"));
                let word = format!("{prefix}{c}");
                tokens.push(word.clone());
                types.push(1);
                next_level.push(word);
            }
        }
        level = next_level;
    }
    let strings = |v: Vec<String>| Value::Array(Array::String(v.into_iter().collect()));
    meta.extend([
        (
            "tokenizer.ggml.model".to_owned(),
            Value::String("gpt2".into()),
        ),
        (
            // llama.cpp knows the GPT-2 pre-tokenizer as "gpt-2" and refuses "gpt2".
            "tokenizer.ggml.pre".to_owned(),
            Value::String("gpt-2".into()),
        ),
        ("tokenizer.ggml.tokens".to_owned(), strings(tokens)),
        (
            "tokenizer.ggml.token_type".to_owned(),
            Value::Array(Array::I32(types)),
        ),
        ("tokenizer.ggml.merges".to_owned(), strings(merges)),
        (
            "tokenizer.ggml.add_bos_token".to_owned(),
            Value::Bool(false),
        ),
    ]);
    Ok(meta)
}

/// Every `tokenizer.*` entry of `g`, and its vocabulary size.
pub fn copy_from(g: &Gguf) -> anyhow::Result<(Vec<(String, Value)>, usize)> {
    let vocab = g
        .get_str_array("tokenizer.ggml.tokens")
        .context("the --tokenizer-from model has no tokenizer.ggml.tokens")?
        .len();
    let meta = g
        .metadata()
        .iter()
        .filter(|(k, _)| k.starts_with("tokenizer."))
        .cloned()
        .collect();
    Ok((meta, vocab))
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferrite_gguf::GgufWriter;
    use ferrite_tokenizer::Tokenizer;

    fn tokenizer(vocab: usize) -> Tokenizer {
        let mut w = GgufWriter::new();
        for (k, v) in synthesize(vocab).unwrap() {
            w.add_metadata(k, v).unwrap();
        }
        Tokenizer::from_gguf(&Gguf::from_bytes(w.to_bytes().unwrap()).unwrap()).unwrap()
    }

    #[test]
    fn made_up_vocabulary_loads_and_round_trips_any_bytes() {
        for vocab in [256, 257, 300, 1000] {
            let t = tokenizer(vocab);
            assert_eq!(t.vocab_size(), vocab);
            let text = "hello wörld \u{1F600} abc\n\t";
            let ids = t.encode(text, false, false);
            assert!(ids.iter().all(|&id| (id as usize) < vocab));
            assert_eq!(t.decode(&ids, false).unwrap(), text);
        }
    }

    #[test]
    fn merges_are_used() {
        let t = tokenizer(300);
        // "aa" is the first merged piece (id 257).
        assert_eq!(t.encode("aa", false, false), [257]);
        assert_eq!(t.eos_id(), Some(256));
    }

    #[test]
    fn too_small_vocabulary_is_an_error() {
        assert!(synthesize(255).is_err());
    }
}
