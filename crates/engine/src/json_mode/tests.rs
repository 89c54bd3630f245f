//! JSON mode over a toy vocabulary whose logits prefer prose and an early end: the output
//! must still be one JSON object (serde_json is the oracle), end right after it, and come
//! from the best allowed token at each greedy step.

use super::*;
use crate::sampler::SamplerConfig;

const EOS: u32 = 0;
/// Every byte JSON's structure needs has a token of its own, as in real vocabularies (byte
/// fallback), so no prefix is a dead end; the longer tokens cross several states at once.
const TOKENS: [&str; 16] = [
    "", "{", "}", "\"a\"", ":", "1", "Hello", " ", "\"", "x", "}\n", ",\"b\":[", "]", ",", "[", "-",
];

fn vocab() -> Arc<JsonVocab> {
    Arc::new(JsonVocab::new(
        TOKENS.iter().map(|t| t.as_bytes()),
        vec![EOS],
    ))
}

fn sampler(temperature: f32, seed: u64) -> JsonSampler {
    let cfg = SamplerConfig {
        temperature,
        seed,
        ..SamplerConfig::default()
    };
    JsonSampler::new(
        Sampler::new(cfg).unwrap(),
        vocab(),
        JsonGrammar::any_object(),
    )
}

/// Runs `s` until it emits EOS (returned text, true) or `steps` tokens (false).
fn run(s: &mut JsonSampler, row: impl Fn(usize) -> Vec<f32>, steps: usize) -> (String, bool) {
    let mut text = String::new();
    for step in 0..steps {
        let t = s.next_token(&row(step), &[]).unwrap();
        if t == EOS {
            return (text, true);
        }
        text.push_str(TOKENS[t as usize]);
        assert!(!text.ends_with(' ') || !s.is_complete());
    }
    (text, false)
}

#[test]
fn greedy_takes_the_best_allowed_token_and_ends_after_the_object() {
    // Preference: prose, then the end, then a space, then a key, then the braces.
    let mut row = vec![0.0f32; TOKENS.len()];
    for (id, l) in [
        (6, 9.0),
        (0, 8.0),
        (7, 5.0),
        (3, 4.0),
        (4, 3.5),
        (5, 3.0),
        (1, 2.0),
    ] {
        row[id] = l;
    }
    row[2] = 1.0;
    let mut s = sampler(0.0, 0);
    let (text, ended) = run(&mut s, |_| row.clone(), 200);
    assert!(ended, "{text:?}");
    let run_of_spaces = " ".repeat(crate::json_lex::MAX_WHITESPACE as usize);
    // Spaces up to the bound wherever they are allowed, then the best token allowed next
    // (the value is the string "a", preferred to 1).
    let want = format!("{0}{{{0}\"a\"{0}:{0}\"a\"{0}}}", run_of_spaces);
    assert_eq!(text, want);
    assert!(
        serde_json::from_str::<serde_json::Value>(&text)
            .unwrap()
            .is_object()
    );
}

#[test]
fn sampled_output_stays_a_json_prefix_and_ends_only_when_whole() {
    let mut completed = 0;
    for seed in 0..200u64 {
        let mut s = sampler(1.0, seed);
        let row = |step: usize| -> Vec<f32> {
            (0..TOKENS.len())
                .map(|i| ((i as u64 * 7919 + step as u64 * 104_729 + seed * 31) % 13) as f32 * 0.4)
                .collect()
        };
        let (text, ended) = run(&mut s, row, 300);
        let prefix = SchemaPrefix::new()
            .feed(&JsonSchema::any_object(), text.as_bytes())
            .unwrap_or_else(|| panic!("{text:?}"));
        if ended {
            assert!(prefix.is_complete(), "{text:?}");
            assert!(
                serde_json::from_str::<serde_json::Value>(&text)
                    .unwrap()
                    .is_object()
            );
            completed += 1;
        }
    }
    assert!(
        completed > 100,
        "only {completed} of 200 runs closed their object"
    );
}

#[test]
fn a_vocabulary_that_cannot_open_an_object_is_an_error() {
    let vocab = Arc::new(JsonVocab::new(["", "x", "}"], vec![0]));
    let mut s = JsonSampler::new(
        Sampler::new(SamplerConfig::default()).unwrap(),
        vocab,
        JsonGrammar::any_object(),
    );
    assert_eq!(
        s.next_token(&[0.0, 1.0, 2.0], &[]),
        Err(JsonModeError::NoToken)
    );
}

#[test]
fn the_mask_refuses_exactly_the_tokens_that_cannot_follow() {
    // Oracle: `advance` on every token, over every prefix of two objects and a vocabulary of
    // all bytes, many two-byte pieces, a row longer than the vocabulary, and an
    // end-of-generation token with text.
    let mut tokens: Vec<Vec<u8>> = vec![Vec::new()];
    tokens.extend((0..=255u8).map(|b| vec![b]));
    for a in b" {}[],:\"\\-0159.eEtrufalsn\n" {
        for b in b" {}[],:\"\\-0159.eEtrufalsn\n" {
            tokens.push(vec![*a, *b]);
        }
    }
    tokens.extend([&b"true"[..], b"null}", b"\"key\":", b"\xc3\xa9"].map(<[u8]>::to_vec));
    // An end-of-generation token with text of its own too, allowed only once complete.
    let eog_with_text = tokens.len() as u32 - 3;
    let vocab = JsonVocab::new(&tokens, vec![EOS, eog_with_text]);
    for text in [
        r#"{"a": [1, -2.5e3, "x\"y", {"b": null}], "c": true}"#,
        "{}",
    ] {
        let g = JsonGrammar::any_object();
        let mut prefix = g.start();
        for i in 0..=text.len() {
            let mut row = vec![0.0f32; tokens.len() + 3];
            let allowed = vocab.mask(&g, prefix, &mut row);
            for (id, l) in row.iter().enumerate() {
                let want = id < tokens.len() && vocab.advance(&g, prefix, id as u32).is_some();
                assert_eq!(*l == 0.0, want, "{text:?} after {i} bytes, token {id}");
            }
            assert_eq!(allowed, row.iter().filter(|l| **l == 0.0).count());
            if let Some(&b) = text.as_bytes().get(i) {
                prefix = g.feed(prefix, &[b]).unwrap();
            }
        }
    }
}
