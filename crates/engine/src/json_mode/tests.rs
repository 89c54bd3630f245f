//! JSON mode over a toy vocabulary whose logits prefer prose and an early end: the output
//! must still be one JSON object (serde_json is the oracle), end right after it, and come
//! from the best allowed token at each greedy step.

use super::*;
use crate::json_schema::JsonSchema;
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
fn a_restarted_chooser_holds_the_next_output_from_its_start() {
    let mut row = vec![0.0f32; TOKENS.len()];
    for (id, l) in [(0, 9.0), (1, 5.0), (2, 4.0)] {
        row[id] = l;
    }
    let mut chooser = Chooser::Held(sampler(0.0, 0));
    let reply = |chooser: &mut Chooser| -> Vec<u32> {
        (0..10)
            .map(|_| chooser.next_token(&row, &[]).unwrap())
            .take_while(|&t| t != EOS)
            .collect()
    };
    assert_eq!(reply(&mut chooser), [1, 2]);
    // Whole already: without a restart only the end may follow.
    assert_eq!(reply(&mut chooser), Vec::<u32>::new());
    chooser.restart();
    assert_eq!(reply(&mut chooser), [1, 2]);
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

/// Markup around a tool call's JSON, for the framed grammar's tests.
const BEFORE: &str = "<tool_call>\n";
const AFTER: &str = "\n</tool_call>";

fn framed() -> JsonGrammar {
    JsonGrammar::framed(Arc::new(JsonSchema::any_object()), BEFORE, AFTER)
}

#[test]
fn the_mask_refuses_exactly_the_tokens_that_cannot_follow() {
    // Oracle: `advance` on every token, over every prefix of two objects (bare, and framed
    // by tool-call markup), with a vocabulary of all bytes, many two-byte pieces, pieces of
    // the markup and pieces across its ends, a row longer than the vocabulary, and an
    // end-of-generation token with text.
    let mut tokens: Vec<Vec<u8>> = vec![Vec::new()];
    tokens.extend((0..=255u8).map(|b| vec![b]));
    for a in b" {}[],:\"\\-0159.eEtrufalsn\n<>/" {
        for b in b" {}[],:\"\\-0159.eEtrufalsn\n<>/" {
            tokens.push(vec![*a, *b]);
        }
    }
    tokens.extend(
        [
            "<tool_call>",
            "<tool_call>\n",
            "<tool",
            "_call>",
            "call>\n{",
            "}\n</",
            "}\n</tool_call>",
            "</tool_call>",
            "\n</tool_call>",
            "\n</tool_call>x",
        ]
        .map(|t| t.as_bytes().to_vec()),
    );
    tokens.extend([&b"true"[..], b"null}", b"\"key\":", b"\xc3\xa9"].map(<[u8]>::to_vec));
    // An end-of-generation token with text of its own too, allowed only once complete.
    let eog_with_text = tokens.len() as u32 - 3;
    let vocab = JsonVocab::new(&tokens, vec![EOS, eog_with_text]);
    let object = r#"{"a": [1, -2.5e3, "x\"y", {"b": null}], "c": true}"#;
    let framed_object = format!("{BEFORE}{object}{AFTER}");
    let cases = [
        (JsonGrammar::any_object(), object.to_string()),
        (JsonGrammar::any_object(), "{}".to_string()),
        (framed(), framed_object),
    ];
    for (g, text) in cases {
        let mut prefix = g.start();
        for i in 0..=text.len() {
            let mut row = vec![0.0f32; tokens.len() + 3];
            let allowed = vocab.mask(&g, prefix, &mut row);
            for (id, l) in row.iter().enumerate() {
                let want = id < tokens.len() && vocab.advance(&g, prefix, id as u32).is_some();
                assert_eq!(*l == 0.0, want, "{text:?} after {i} bytes, token {id}");
            }
            assert_eq!(allowed, row.iter().filter(|l| **l == 0.0).count());
            assert_eq!(
                prefix.is_complete(),
                i == text.len(),
                "{text:?} after {i} bytes"
            );
            if let Some(&b) = text.as_bytes().get(i) {
                prefix = g.feed(prefix, &[b]).unwrap();
            }
        }
    }
}

#[test]
fn framed_output_is_the_markup_around_one_value_and_nothing_else() {
    let g = framed();
    let whole = |text: &str| {
        g.feed(g.start(), text.as_bytes())
            .is_some_and(|s| s.is_complete())
    };
    let call = r#"{"name": "f", "arguments": {}}"#;
    assert!(whole(&format!("{BEFORE}{call}{AFTER}")));
    // Across the ends in one piece, and the JSON's leading whitespace.
    assert!(whole(&format!("{BEFORE} {call}{AFTER}")));
    let split = format!("{BEFORE}{call}{AFTER}");
    for cut in 0..split.len() {
        let s = g.feed(g.start(), &split.as_bytes()[..cut]).unwrap();
        assert!(!s.is_complete());
        assert!(g.feed(s, &split.as_bytes()[cut..]).unwrap().is_complete());
    }
    for text in [
        call.to_string(),
        format!("x{BEFORE}{call}{AFTER}"),
        format!("{BEFORE}{call} {AFTER}"),
        format!("{BEFORE}{call}{AFTER}\n"),
        format!("{BEFORE}{call}{call}{AFTER}"),
        format!("{BEFORE}[1]{AFTER}"),
        format!("<tool_call>{call}{AFTER}"),
    ] {
        assert!(
            g.feed(g.start(), text.as_bytes())
                .is_none_or(|s| !s.is_complete()),
            "{text:?}"
        );
    }
    // A framed sampler ends right after the markup, through the end-of-generation token.
    let vocab = Arc::new(JsonVocab::new(
        ["", "<tool_call>\n", "{}", "\n</tool_call>", "{", "}", "hi"],
        vec![EOS],
    ));
    let mut s = JsonSampler::new(Sampler::new(SamplerConfig::default()).unwrap(), vocab, g);
    let prefer_hi_then_eos = [5.0, 0.0, 1.0, 0.5, 0.0, 0.0, 9.0];
    let picked: Vec<u32> = (0..4)
        .map(|_| s.next_token(&prefer_hi_then_eos, &[]).unwrap())
        .collect();
    assert_eq!(picked, [1, 2, 3, EOS]);
}
