//! Pre-tokenizers for byte-level BPE, chosen by `tokenizer.ggml.pre`: they cut text into words
//! that BPE merges never cross.
//!
//! The patterns are the published ones of each model family. An unknown name is an error, never a
//! fallback: a wrong pre-tokenizer silently changes ids on some inputs only.

use fancy_regex::Regex;

use crate::error::{Result, TokenizerError};

/// GPT-2's pattern (also used by SmolLM after digits are split off).
const GPT2: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";
/// Llama 3's pattern: case-insensitive contractions, numbers in groups of up to three.
const LLAMA3: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Qwen 2's pattern: as Llama 3 but single digits.
const QWEN2: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// `gpt-2` and `default`: the GPT-2 pattern.
    Gpt2,
    /// `smollm`: every `\p{N}` character isolated first, then the GPT-2 pattern.
    SmolLm,
    /// `llama-bpe` / `llama3`.
    Llama3,
    /// `qwen2`.
    Qwen2,
}

/// A compiled pre-tokenizer.
#[derive(Debug)]
pub(crate) struct PreTokenizer {
    kind: Kind,
    regex: Regex,
}

impl PreTokenizer {
    /// The pre-tokenizer named by `tokenizer.ggml.pre`.
    pub(crate) fn from_name(name: &str) -> Result<Self> {
        let kind = match name {
            "gpt-2" | "gpt2" | "default" => Kind::Gpt2,
            "smollm" => Kind::SmolLm,
            "llama-bpe" | "llama3" => Kind::Llama3,
            "qwen2" => Kind::Qwen2,
            other => return Err(TokenizerError::UnsupportedPreTokenizer(other.to_owned())),
        };
        let pattern = match kind {
            Kind::Gpt2 | Kind::SmolLm => GPT2,
            Kind::Llama3 => LLAMA3,
            Kind::Qwen2 => QWEN2,
        };
        let regex = Regex::new(pattern).map_err(|e| TokenizerError::Metadata {
            key: "tokenizer.ggml.pre".into(),
            reason: format!("pattern failed to compile: {e}"),
        })?;
        Ok(Self { kind, regex })
    }

    /// Whether a word already in the vocabulary is taken whole without merging (Llama 3's
    /// tokenizer sets `ignore_merges`).
    pub(crate) fn ignores_merges(&self) -> bool {
        self.kind == Kind::Llama3
    }

    /// Append the words of `text` to `out`; together they cover `text` exactly.
    pub(crate) fn split<'a>(&self, text: &'a str, out: &mut Vec<&'a str>) {
        if self.kind != Kind::SmolLm {
            self.split_regex(text, out);
            return;
        }
        let mut start = 0;
        for (i, c) in text.char_indices() {
            if c.is_numeric() {
                if start < i {
                    self.split_regex(&text[start..i], out);
                }
                let end = i + c.len_utf8();
                out.push(&text[i..end]);
                start = end;
            }
        }
        if start < text.len() {
            self.split_regex(&text[start..], out);
        }
    }

    fn split_regex<'a>(&self, text: &'a str, out: &mut Vec<&'a str>) {
        let mut last = 0;
        for m in self.regex.find_iter(text) {
            // The patterns need only bounded backtracking; if the engine still gives up, the
            // rest of the text becomes one word rather than being lost.
            let Ok(m) = m else { break };
            if m.start() > last {
                out.push(&text[last..m.start()]);
            }
            out.push(m.as_str());
            last = m.end();
        }
        if last < text.len() {
            out.push(&text[last..]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(name: &str, text: &str) -> Vec<String> {
        let pre = PreTokenizer::from_name(name).expect("known pre-tokenizer");
        let mut out = Vec::new();
        pre.split(text, &mut out);
        out.into_iter().map(str::to_owned).collect()
    }

    #[test]
    fn gpt2_keeps_one_space_with_the_next_word() {
        assert_eq!(words("gpt-2", "Hi  there!"), ["Hi", " ", " there", "!"]);
        assert_eq!(words("gpt-2", "it's 42"), ["it", "'s", " 42"]);
    }

    #[test]
    fn smollm_isolates_every_number_character() {
        // Matches the original tokenizer (fixtures README caveat 1): "  " stays one word.
        assert_eq!(
            words("smollm", "Total:  42"),
            ["Total", ":", "  ", "4", "2"]
        );
        assert_eq!(words("smollm", " ¾"), [" ", "¾"]);
    }

    #[test]
    fn llama3_groups_digits_by_three() {
        assert_eq!(words("llama-bpe", "12345 ok"), ["123", "45", " ok"]);
        assert_eq!(words("qwen2", "123"), ["1", "2", "3"]);
    }

    #[test]
    fn unknown_pre_tokenizer_is_an_error() {
        assert!(matches!(
            PreTokenizer::from_name("falcon"),
            Err(TokenizerError::UnsupportedPreTokenizer(_))
        ));
    }
}
