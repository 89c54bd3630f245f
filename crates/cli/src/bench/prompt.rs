//! Prompt tokens for a sweep: a file's text or a built-in deterministic text, tokenized once
//! and repeated until the sweep's last frontier plus its decoded tokens are covered.
//!
//! The built-in text is generated from a fixed word list by a fixed xorshift stream, so it
//! is identical on every machine and needs no file that may be missing (a license text under
//! /usr/share is not present everywhere).

use anyhow::bail;
use ferrite_tokenizer::Tokenizer;

/// Words of the built-in text.
const WORDS: [&str; 48] = [
    "the",
    "engine",
    "reads",
    "a",
    "model",
    "file",
    "and",
    "maps",
    "its",
    "weights",
    "into",
    "memory",
    "before",
    "each",
    "layer",
    "turns",
    "tokens",
    "into",
    "keys",
    "values",
    "while",
    "attention",
    "looks",
    "back",
    "over",
    "every",
    "earlier",
    "position",
    "so",
    "that",
    "long",
    "contexts",
    "cost",
    "more",
    "time",
    "per",
    "step",
    "than",
    "short",
    "ones",
    "which",
    "is",
    "why",
    "we",
    "measure",
    "several",
    "frontiers",
    "carefully",
];

/// About 3000 words of deterministic pseudo-prose (sentences of 6 to 17 words).
pub fn builtin_text() -> String {
    let mut s: u64 = 0x2545_f491_4f6c_dd1d;
    let mut next = |n: usize| {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        (s % n as u64) as usize
    };
    let mut out = String::new();
    for _ in 0..250 {
        let len = 6 + next(12);
        for w in 0..len {
            let word = WORDS[next(WORDS.len())];
            if w == 0 {
                let mut c = word.chars();
                if let Some(f) = c.next() {
                    out.extend(f.to_uppercase());
                    out.push_str(c.as_str());
                }
            } else {
                out.push(' ');
                out.push_str(word);
            }
        }
        out.push_str(". ");
    }
    out
}

/// `need` prompt tokens: the model's BOS (when it adds one) followed by the text's tokens,
/// the text repeated as often as needed.
pub fn tokens(tok: &Tokenizer, text: &str, need: usize) -> anyhow::Result<Vec<u32>> {
    let body = tok.encode(text, false, false);
    if body.is_empty() {
        bail!("the prompt text has no tokens");
    }
    let mut out: Vec<u32> = Vec::with_capacity(need);
    if tok.add_bos()
        && let Some(bos) = tok.bos_id()
    {
        out.push(bos);
    }
    while out.len() < need {
        let take = (need - out.len()).min(body.len());
        out.extend_from_slice(&body[..take]);
    }
    out.truncate(need);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtin_text_is_deterministic_and_long() {
        let a = builtin_text();
        assert_eq!(a, builtin_text());
        assert!(a.split_whitespace().count() > 2000);
    }
}
