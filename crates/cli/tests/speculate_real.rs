//! `--draft-model` of `ferrite run` and `ferrite bench` on SmolLM2 (CPU): a Q8_0 copy made
//! here with `ferrite quantize` is the target and the Q4_1 file drafts for it; greedy output
//! against the same command without a draft, token for token. Refusals: a draft of another
//! vocabulary (Gemma 3), `--draft-model` with `--lookup`.
//!
//! The models are pulled as the other CLI tests pull them (`ferrite pull`, cached).

mod common;

use std::path::Path;

/// A raw completion prompt SmolLM2 continues at length.
const PROMPT: &str = "The history of the lighthouse begins in the ancient world, where fires \
were lit on hills to guide ships into harbour. Over the centuries";

/// Tokens generated: a few hundred, as the brief's exactness gate asks, in a few seconds.
const N: &str = "300";

/// `ferrite quantize SOURCE OUT --type q8_0 --allow-requantize`.
fn quantize_q8(source: &Path, out: &Path) {
    let o = common::run(&[
        "quantize",
        source.to_str().unwrap(),
        out.to_str().unwrap(),
        "--type",
        "q8_0",
        "--allow-requantize",
    ]);
    assert!(o.status.success(), "{}", common::text(&o));
}

/// The token ids of a `--dump-logprobs` file, in order.
fn dumped_tokens(path: &Path) -> Vec<u64> {
    std::fs::read_to_string(path)
        .expect("dump written")
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).expect("json line");
            v["token"].as_u64().expect("token id")
        })
        .collect()
}

/// The number after `key` in `text` (`"accepted 12 "` gives 12).
fn count_after(text: &str, key: &str) -> usize {
    let rest = &text[text
        .find(key)
        .unwrap_or_else(|| panic!("no {key:?} in {text}"))
        + key.len()..];
    rest.split_whitespace()
        .next()
        .and_then(|w| w.parse().ok())
        .unwrap_or_else(|| panic!("no count after {key:?} in {text}"))
}

#[test]
fn a_q4_draft_for_a_q8_target_gives_the_plain_output_token_for_token() {
    // Oracle: the same command without `--draft-model`, in the same run (the dumped token
    // ids and the printed text). Acceptance must be high (the draft is the same model less
    // precisely quantized) or the draft was not really in step with the target.
    let source = common::pull("smollm2-135m-instruct");
    let dir = tempfile::tempdir().expect("temp dir");
    let target = dir.path().join("smollm2-q8_0.gguf");
    quantize_q8(&source, &target);
    let (plain_dump, spec_dump) = (
        dir.path().join("plain.jsonl"),
        dir.path().join("spec.jsonl"),
    );
    let base = [
        "run",
        "-m",
        target.to_str().unwrap(),
        "--raw",
        "--temp",
        "0",
        "--max-tokens",
        N,
    ];
    let plain = common::run(
        &[
            &base[..],
            &["--dump-logprobs", plain_dump.to_str().unwrap(), PROMPT],
        ]
        .concat(),
    );
    assert!(plain.status.success(), "{}", common::text(&plain));
    let spec = common::run(
        &[
            &base[..],
            &[
                "--draft-model",
                source.to_str().unwrap(),
                "--draft-max",
                "6",
                "--dump-logprobs",
                spec_dump.to_str().unwrap(),
                PROMPT,
            ],
        ]
        .concat(),
    );
    assert!(spec.status.success(), "{}", common::text(&spec));
    let (a, b) = (dumped_tokens(&plain_dump), dumped_tokens(&spec_dump));
    let first_difference = a.iter().zip(&b).position(|(x, y)| x != y);
    assert_eq!(first_difference, None, "first difference");
    assert_eq!(a, b);
    assert_eq!(spec.stdout, plain.stdout);
    assert!(a.len() >= 100, "only {} tokens generated", a.len());
    let err = String::from_utf8_lossy(&spec.stderr);
    let line = err
        .lines()
        .find(|l| l.starts_with("draft: proposed "))
        .unwrap_or_else(|| panic!("no draft line: {err}"));
    let (proposed, accepted) = (
        count_after(line, "proposed "),
        count_after(line, "accepted "),
    );
    println!("{} tokens identical; {line}", a.len());
    assert!(proposed > 0 && accepted * 2 > proposed, "{line}");
    assert!(!String::from_utf8_lossy(&plain.stderr).contains("draft:"));
}

#[test]
fn a_draft_of_another_vocabulary_or_with_lookup_is_refused() {
    // Oracle: Gemma 3's vocabulary (262k tokens) is not SmolLM2's (49k); the error names
    // both sizes and the flag. `--draft-model` with `--lookup` is refused by the parser.
    let target = common::pull("smollm2-135m-instruct");
    let gemma = common::pull("gemma3-270m");
    let out = common::run(&[
        "run",
        "-m",
        target.to_str().unwrap(),
        "--draft-model",
        gemma.to_str().unwrap(),
        "hi",
    ]);
    assert!(!out.status.success());
    let text = common::text(&out);
    assert!(
        text.contains("--draft-model") && text.contains("share one vocabulary"),
        "{text}"
    );
    assert!(
        text.contains("vocabulary has 262144 tokens, the target's 49152"),
        "{text}"
    );
    let out = common::run(&["run", "--draft-model", "x.gguf", "--lookup", "hi"]);
    assert!(!out.status.success());
    let text = common::text(&out);
    assert!(text.contains("cannot be used with"), "{text}");
    let out = common::run(&["bench", "--draft-model", "x.gguf", "--lookup"]);
    assert!(!out.status.success());
    assert!(common::text(&out).contains("cannot be used with"));
}

#[test]
fn draft_bench_checks_identity_and_reports_acceptance() {
    // Oracle: the bench's own plain runs (a difference fails it); a draft that is the
    // target's own file must have every proposal accepted but for the last step's, which
    // the token limit may cut short.
    let source = common::pull("smollm2-135m-instruct");
    let out = common::run(&[
        "bench",
        "-m",
        source.to_str().unwrap(),
        "--draft-model",
        source.to_str().unwrap(),
        "--gen-tokens",
        "24",
        "--runs",
        "1",
        "--warmup",
        "0",
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", common::text(&out));
    for needle in [
        "outputs identical in every run",
        "plain  decode tok/s median ",
        "draft  decode tok/s median ",
        " tokens per step",
        "off 0 steps",
    ] {
        assert!(stdout.contains(needle), "missing {needle:?}: {stdout}");
    }
    let line = stdout
        .lines()
        .find(|l| l.starts_with("draft (draft-max 8): "))
        .unwrap_or_else(|| panic!("no draft line: {stdout}"));
    let (proposed, accepted) = (
        count_after(line, "proposed "),
        count_after(line, "accepted "),
    );
    assert!(proposed > 0 && accepted + 8 >= proposed, "{line}");
}
