//! `ferrite gate release` and `ferrite gate compare` as a user runs them: a quick CPU run on
//! SmolLM2 over a held-out-style fixture directory in which one tokenizer line is corrupted
//! must fail exactly that item (the project's own tokenizer test fails on the same line),
//! pass the others it can run, label the rest, and write a receipt that `gate compare`
//! reads. An empty fixture directory and a foreign baseline are refused.

mod common;

use std::path::Path;

use common::{fixture, pull, run, text};
use serde_json::Value;

/// A fixture directory holding SmolLM2's fixtures, two logits cases, and a tokenizer file
/// whose first line expects a wrong id.
fn heldout_dir(dir: &Path) {
    let tok = std::fs::read_to_string(fixture("tokenizer-smollm2-dev.jsonl")).unwrap();
    let mut lines: Vec<String> = tok.lines().map(str::to_owned).collect();
    let mut first: Value = serde_json::from_str(&lines[0]).unwrap();
    let id = first["ids"][0].as_u64().unwrap();
    first["ids"][0] = (id + 1).into();
    lines[0] = first.to_string();
    std::fs::write(
        dir.join("tokenizer-smollm2-heldout.jsonl"),
        lines.join("\n"),
    )
    .unwrap();
    for name in ["chat-smollm2-dev.jsonl", "nll-smollm2.json"] {
        std::fs::copy(fixture(name), dir.join(name)).unwrap();
    }
    let logits = std::fs::read_to_string(fixture("logits-smollm2-dev.jsonl")).unwrap();
    let two: Vec<&str> = logits.lines().take(2).collect();
    std::fs::write(dir.join("logits-smollm2-heldout.jsonl"), two.join("\n")).unwrap();
}

fn item<'a>(receipt: &'a Value, name: &str) -> &'a Value {
    receipt["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["name"] == name)
        .unwrap_or_else(|| panic!("no item {name} in the receipt"))
}

#[test]
fn quick_release_gate_fails_the_corrupted_fixture_and_labels_every_item() {
    let model = pull("smollm2-135m-instruct");
    let dir = tempfile::tempdir().unwrap();
    let fx = dir.path().join("fixtures");
    std::fs::create_dir(&fx).unwrap();
    heldout_dir(&fx);
    let receipt_path = dir.path().join("gate.json");
    let out = run(&[
        "gate",
        "release",
        "--quick",
        "-m",
        model.to_str().unwrap(),
        "--fixtures",
        fx.to_str().unwrap(),
        "--receipt",
        receipt_path.to_str().unwrap(),
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    println!("{}", text(&out));
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let receipt: Value =
        serde_json::from_str(&std::fs::read_to_string(&receipt_path).unwrap()).unwrap();
    assert_eq!(receipt["format"], "ferrite-gate-receipt");
    assert_eq!(receipt["version"], 1);
    assert_eq!(receipt["binary_sha256"].as_str().unwrap().len(), 64);
    assert_eq!(
        receipt["models"][0]["sha256"].as_str().unwrap(),
        "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
    );
    assert!(
        !receipt["machine"]["cpu_flags"]
            .as_array()
            .unwrap()
            .is_empty()
    );
    assert!(
        receipt["backend_lines"][0]
            .as_str()
            .unwrap()
            .starts_with("backend=cpu ")
    );

    let tok = item(&receipt, "tokenizer:smollm2");
    assert_eq!(tok["verdict"], "failed", "{tok}");
    assert!(
        tok["reason"]
            .as_str()
            .unwrap()
            .contains("ids differ at index 0"),
        "{tok}"
    );
    assert_eq!(tok["counts"]["lines_failed"], 1, "{tok}");
    for name in [
        "template:smollm2",
        "quant-dequant",
        "sampler:smollm2",
        "logits-default:smollm2",
        "logits-f32:smollm2",
        "nll-default:smollm2",
        "batched:smollm2",
        "gguf-mutants:smollm2",
        "kv-snapshot:smollm2",
        // The server items, on the real server stack in-process.
        "http-malformed:smollm2",
        "json-nonfinite:smollm2",
        "cancellation:smollm2",
        "structured-output:smollm2",
        "tool-call:smollm2",
    ] {
        let i = item(&receipt, name);
        assert_eq!(i["verdict"], "passed", "{i}");
        assert_eq!(i["planted"]["detected"], true, "{i}");
    }
    assert_eq!(
        item(&receipt, "gguf-mutants:smollm2")["counts"]["panics"],
        0
    );
    assert_eq!(
        item(&receipt, "logits-default:smollm2")["counts"]["cases"],
        2
    );
    let speed = item(&receipt, "speed:smollm2");
    assert_eq!(speed["verdict"], "blocked");
    assert_eq!(speed["reason"], "no --baseline receipt given");
    assert!(speed["figures"]["decode_tps_median"].as_f64().unwrap() > 0.0);
    let malformed = &item(&receipt, "http-malformed:smollm2")["counts"];
    assert_eq!(malformed["endpoints"], 7, "{malformed}");
    assert_eq!(malformed["failed"], 0, "{malformed}");
    assert_eq!(
        item(&receipt, "cancellation:smollm2")["counts"]["phases"],
        5
    );
    assert!(
        item(&receipt, "kv-snapshot:smollm2")["counts"]["restart_cached_tokens"]
            .as_u64()
            .unwrap()
            > 0
    );
    assert!(
        receipt["items"]
            .as_array()
            .unwrap()
            .iter()
            .all(|i| i["reason"] != "not implemented in this build"),
        "an item of the manifest is not implemented"
    );
    assert_eq!(item(&receipt, "build")["verdict"], "static");
    let not_requested = receipt["not_requested"].as_array().unwrap();
    assert!(not_requested.iter().any(|n| n["item"] == "cuda-fidelity"));
    assert!(not_requested.iter().any(|n| n["item"] == "nll-f32"));

    // The summary line counts the receipt's verdicts and ends the output.
    let s = &receipt["summary"];
    let last = stdout.lines().last().unwrap();
    assert_eq!(
        last,
        format!(
            "{} passed, {} failed, {} blocked, {} static",
            s["passed"], s["failed"], s["blocked"], s["static"]
        )
    );
    assert_eq!(s["failed"], 1, "{s}");
    let n = |k: &str| s[k].as_u64().unwrap() as usize;
    assert_eq!(
        n("passed") + n("failed") + n("blocked") + n("static"),
        receipt["items"].as_array().unwrap().len()
    );

    // compare: a receipt against itself changes nothing; a passed item that fails is worse.
    let same = run(&[
        "gate",
        "compare",
        receipt_path.to_str().unwrap(),
        receipt_path.to_str().unwrap(),
    ]);
    assert_eq!(same.status.code(), Some(0), "{}", text(&same));
    let mut worse = receipt.clone();
    let items = worse["items"].as_array_mut().unwrap();
    let kv = items
        .iter_mut()
        .find(|i| i["name"] == "kv-snapshot:smollm2")
        .unwrap();
    kv["verdict"] = "failed".into();
    kv["reason"] = "planted in the test".into();
    let worse_path = dir.path().join("worse.json");
    std::fs::write(&worse_path, worse.to_string()).unwrap();
    let cmp = run(&[
        "gate",
        "compare",
        receipt_path.to_str().unwrap(),
        worse_path.to_str().unwrap(),
    ]);
    assert_eq!(cmp.status.code(), Some(1), "{}", text(&cmp));
    assert!(
        String::from_utf8_lossy(&cmp.stdout)
            .contains("kv-snapshot:smollm2: verdict passed -> failed (planted in the test)"),
        "{}",
        text(&cmp)
    );

    // A bench CSV or any other JSON is not a baseline.
    let bad = dir.path().join("bad.json");
    std::fs::write(&bad, "{\"format\": \"other\"}").unwrap();
    let out = run(&[
        "gate",
        "release",
        "--baseline",
        bad.to_str().unwrap(),
        "--receipt",
        dir.path().join("x.json").to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("is not a version 1 gate receipt"),
        "{}",
        text(&out)
    );
}

#[test]
fn gate_refuses_an_empty_fixture_directory() {
    let dir = tempfile::tempdir().unwrap();
    let out = run(&[
        "gate",
        "release",
        "--fixtures",
        dir.path().to_str().unwrap(),
        "--receipt",
        dir.path().join("r.json").to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("holds no tokenizer-"),
        "{}",
        text(&out)
    );
    assert!(!dir.path().join("r.json").exists());
}
