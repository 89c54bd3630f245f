//! `ferrite inspect` on the two real models, and on damaged copies of one.

mod common;

use std::collections::BTreeMap;

fn totals(json: &serde_json::Value) -> BTreeMap<String, u64> {
    json["totals_by_type"]
        .as_array()
        .expect("totals_by_type array")
        .iter()
        .map(|t| {
            (
                t["type"].as_str().unwrap().to_string(),
                t["tensors"].as_u64().unwrap(),
            )
        })
        .collect()
}

fn inspect_json(model: &str) -> serde_json::Value {
    let out = common::run(&["inspect", model, "--json"]);
    assert!(out.status.success(), "{}", common::text(&out));
    serde_json::from_slice(&out.stdout).expect("inspect --json prints JSON")
}

#[test]
fn smollm2_tensor_census() {
    let path = common::pull("smollm2-135m-instruct");
    let json = inspect_json(path.to_str().unwrap());
    assert_eq!(json["architecture"]["name"], "llama");
    assert_eq!(json["tensors"].as_array().unwrap().len(), 272);
    let want: BTreeMap<String, u64> = [("Q4_1", 210), ("F32", 61), ("Q8_0", 1)]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
    assert_eq!(totals(&json), want);
    assert_eq!(json["architecture"]["layers"], 30);
    assert_eq!(json["architecture"]["vocab"], 49152);
}

#[test]
fn gemma3_tensor_census_and_hash() {
    common::pull("gemma3-270m");
    let out = common::run(&["inspect", "gemma3-270m", "--json", "--hash"]);
    assert!(out.status.success(), "{}", common::text(&out));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["architecture"]["name"], "gemma3");
    assert_eq!(json["tensors"].as_array().unwrap().len(), 236);
    let want: BTreeMap<String, u64> = [
        ("F32", 109),
        ("Q5_0", 81),
        ("Q4_K", 27),
        ("Q8_0", 10),
        ("Q6_K", 9),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    assert_eq!(totals(&json), want);
    assert_eq!(
        json["sha256"],
        "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
    );
}

#[test]
fn text_view_summarizes_long_arrays() {
    let out = common::run(&["inspect", "smollm2-135m-instruct"]);
    assert!(out.status.success(), "{}", common::text(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("[49152 items: \"<|endoftext|>\""),
        "{stdout}"
    );
    assert!(stdout.contains("architecture: llama"));
}

/// Damaged files must fail with exit code 1 and a one-line error, never a panic (101).
#[test]
fn truncated_and_bit_flipped_models_fail_cleanly() {
    let path = common::pull("smollm2-135m-instruct");
    let bytes = std::fs::read(&path).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut cases: Vec<(String, Vec<u8>)> = Vec::new();
    for cut in [0, 3, 8, 24, 1000, 1_785_000, 1_785_700, bytes.len() - 1] {
        cases.push((format!("truncated at {cut}"), bytes[..cut].to_vec()));
    }
    // Flip bits in the magic, the version, the tensor count and a tensor type id.
    for (what, offset) in [("magic", 0usize), ("version", 4), ("tensor count", 15)] {
        let mut damaged = bytes.clone();
        damaged[offset] ^= 0x80;
        cases.push((format!("bit flip in {what}"), damaged));
    }
    for (what, data) in cases {
        let file = dir.path().join("damaged.gguf");
        std::fs::write(&file, &data).unwrap();
        let out = common::run(&["inspect", file.to_str().unwrap()]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{what}: {}", common::text(&out));
        assert_eq!(stderr.trim().lines().count(), 1, "{what}: {stderr}");
        assert!(stderr.starts_with("error: "), "{what}: {stderr}");
    }
}
