//! `ferrite gate tokenizer|template` on the real models against the reference fixtures
//! (`FERRITE_FIXTURES` overrides the directory; a missing fixture fails), plus checks that the
//! gates really fail on a wrong expectation and refuse to pass on nothing.

mod common;

use std::path::Path;

use common::{fixture, pull, run, text};

const SMOLLM2: &str = "smollm2-135m-instruct";
const GEMMA3: &str = "gemma3-270m";

/// Run a gate and require exit 0 with a final `N passed, 0 failed` line over `lines` lines.
fn gate_passes(kind: &str, model: &Path, fixture: &Path, lines: usize) {
    let out = run(&[
        "gate",
        kind,
        "-m",
        &model.to_string_lossy(),
        "--fixture",
        &fixture.to_string_lossy(),
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    println!("{stdout}");
    assert!(out.status.success(), "{}", text(&out));
    let last = stdout.lines().last().unwrap_or_default();
    assert_eq!(last, format!("{lines} passed, 0 failed"), "{}", text(&out));
}

fn count_lines(path: &Path) -> usize {
    let body = std::fs::read_to_string(path).expect("reading fixture");
    let n = body.lines().filter(|l| !l.trim().is_empty()).count();
    assert!(n > 0, "fixture {} is empty", path.display());
    n
}

#[test]
fn smollm2_tokenizer_matches_reference() {
    let f = fixture("tokenizer-smollm2-dev.jsonl");
    gate_passes("tokenizer", &pull(SMOLLM2), &f, count_lines(&f));
}

#[test]
fn gemma3_tokenizer_matches_reference() {
    let f = fixture("tokenizer-gemma3-dev.jsonl");
    gate_passes("tokenizer", &pull(GEMMA3), &f, count_lines(&f));
}

#[test]
fn smollm2_chat_template_matches_reference() {
    let f = fixture("chat-smollm2-dev.jsonl");
    gate_passes("template", &pull(SMOLLM2), &f, count_lines(&f));
}

/// Test the test: one changed id in a copy of the fixture must make the gate fail.
#[test]
fn gate_fails_on_a_wrong_id_and_on_an_empty_fixture() {
    let model = pull(SMOLLM2);
    let src = std::fs::read_to_string(fixture("tokenizer-smollm2-dev.jsonl")).expect("fixture");
    let first = src.lines().next().expect("a line");
    let mut line: serde_json::Value = serde_json::from_str(first).expect("json");
    let ids = line["ids"].as_array_mut().expect("ids");
    let bumped = ids[0].as_u64().expect("id") + 1;
    ids[0] = bumped.into();
    let dir = tempfile::tempdir().expect("tempdir");
    let mutated = dir.path().join("mutated.jsonl");
    std::fs::write(&mutated, format!("{line}\n")).expect("write");
    let out = run(&[
        "gate",
        "tokenizer",
        "-m",
        &model.to_string_lossy(),
        "--fixture",
        &mutated.to_string_lossy(),
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        stdout.contains("FAIL dev-tok-000: ids differ at index 0"),
        "{}",
        text(&out)
    );
    assert_eq!(stdout.lines().last(), Some("0 passed, 1 failed"));

    let empty = dir.path().join("empty.jsonl");
    std::fs::write(&empty, "").expect("write");
    let out = run(&[
        "gate",
        "tokenizer",
        "-m",
        &model.to_string_lossy(),
        "--fixture",
        &empty.to_string_lossy(),
    ]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(String::from_utf8_lossy(&out.stderr).contains("has no lines"));

    let missing = dir.path().join("missing.jsonl");
    let out = run(&[
        "gate",
        "tokenizer",
        "-m",
        &model.to_string_lossy(),
        "--fixture",
        &missing.to_string_lossy(),
    ]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
}

/// Gemma 3 270M is a base model: chat use is a clear error, not an empty rendering.
#[test]
fn template_gate_on_a_model_without_template_is_a_clear_error() {
    let out = run(&[
        "gate",
        "template",
        "-m",
        &pull(GEMMA3).to_string_lossy(),
        "--fixture",
        &fixture("chat-smollm2-dev.jsonl").to_string_lossy(),
    ]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("has no chat template"),
        "{}",
        text(&out)
    );
}

#[test]
fn tokenize_prints_ids_and_pieces() {
    let out = run(&[
        "tokenize",
        "-m",
        &pull(SMOLLM2).to_string_lossy(),
        "--special",
        "--json",
        "<|im_start|>Hi 42",
    ]);
    assert!(out.status.success(), "{}", text(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    // Fixtures README: "<|im_start|>" is id 1; caveat 1: " 42" is "Ġ", "4", "2".
    assert_eq!(v["ids"][0], 1);
    assert_eq!(v["pieces"][0], "<|im_start|>");
    assert_eq!(v["ids"].as_array().map(Vec::len), Some(5));
}
