//! `ferrite bench` on the default model: a tiny sweep's receipt is complete and sane, and
//! `--compare` passes a receipt against itself, flags a known slowdown and refuses receipts
//! of different models.

mod common;

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

const HEADER_KEYS: [&str; 22] = [
    "ferrite_version",
    "git_commit",
    "date",
    "backend",
    "threads",
    "simd",
    "kv",
    "precision",
    "cpu_model",
    "cpu_cores",
    "model_path",
    "model_sha256",
    "model_arch",
    "model_type_mix",
    "frontiers",
    "mode",
    "decode",
    "prompt",
    "warmup",
    "runs",
    "statistic",
    "flags",
];

const COLUMNS: [&str; 16] = [
    "frontier",
    "batch",
    "prefill_from",
    "prefill_tokens",
    "gen_tokens",
    "runs",
    "load_ms",
    "ttft_ms_median",
    "ttft_ms_min",
    "ttft_ms_max",
    "prefill_tps_median",
    "prefill_tps_min",
    "prefill_tps_max",
    "decode_tps_median",
    "decode_tps_min",
    "decode_tps_max",
];

/// One small sweep per test binary (ctx 32 → 64, 4 decoded tokens, one run), shared by the
/// tests that only read its receipt. Returns the CSV's path and text.
fn receipt() -> &'static (PathBuf, String) {
    static R: OnceLock<(PathBuf, String)> = OnceLock::new();
    R.get_or_init(|| {
        let model = common::pull("smollm2-135m-instruct");
        let csv = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("bench-receipt-{}.csv", std::process::id()));
        let out = common::run(&[
            "bench",
            "-m",
            model.to_str().unwrap(),
            "--ctx-start",
            "32",
            "--ctx-max",
            "64",
            "--gen-tokens",
            "4",
            "--runs",
            "1",
            "--warmup",
            "0",
            "--csv",
            csv.to_str().unwrap(),
        ]);
        assert!(out.status.success(), "{}", common::text(&out));
        let text = std::fs::read_to_string(&csv).unwrap();
        (csv, text)
    })
}

fn header_value<'a>(text: &'a str, key: &str) -> Option<&'a str> {
    text.lines()
        .filter_map(|l| l.strip_prefix("# "))
        .filter_map(|l| l.split_once(": "))
        .find(|(k, _)| *k == key)
        .map(|(_, v)| v)
}

fn data_lines(text: &str) -> Vec<&str> {
    text.lines().filter(|l| !l.starts_with('#')).collect()
}

#[test]
fn tiny_sweep_receipt_is_complete_and_positive() {
    let (_, text) = receipt();
    for key in HEADER_KEYS {
        let v = header_value(text, key).unwrap_or_else(|| panic!("header {key} missing:\n{text}"));
        assert!(!v.is_empty(), "header {key} empty");
    }
    assert_eq!(header_value(text, "backend"), Some("cpu"));
    assert_eq!(header_value(text, "frontiers"), Some("32 64"));
    assert_eq!(header_value(text, "model_sha256").unwrap().len(), 64);
    let lines = data_lines(text);
    assert_eq!(lines[0].split(',').collect::<Vec<_>>(), COLUMNS);
    assert_eq!(lines.len(), 3, "one row per frontier:\n{text}");
    for (line, frontier, from) in [(lines[1], 32.0, 0.0), (lines[2], 64.0, 32.0)] {
        let v: Vec<f64> = line.split(',').map(|c| c.parse().unwrap()).collect();
        assert_eq!(v.len(), COLUMNS.len());
        // Every clock is positive; only prefill_from may be 0 (the first frontier).
        for (c, x) in COLUMNS.iter().zip(&v) {
            if *c != "prefill_from" {
                assert!(x.is_finite() && *x > 0.0, "{c} = {x} in {line}");
            }
        }
        assert_eq!((v[0], v[1], v[2], v[4]), (frontier, 1.0, from, 4.0));
    }
}

/// The receipt names the commit the binary was built from, recorded by the build script (so
/// a copied binary keeps it): this checkout's HEAD, `-dirty` with uncommitted changes.
#[test]
fn receipt_names_the_build_commit() {
    let (_, text) = receipt();
    let got = header_value(text, "git_commit").expect("git_commit");
    if let Ok(c) = std::env::var("FERRITE_GIT_COMMIT") {
        assert_eq!(got, c.trim());
        return;
    }
    let head = std::process::Command::new("git")
        .args(["-C", env!("CARGO_MANIFEST_DIR"), "rev-parse", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned());
    match head {
        Some(head) => assert!(
            got == head || got == format!("{head}-dirty"),
            "receipt says {got}, HEAD is {head}"
        ),
        None => assert_eq!(got, "unknown"),
    }
}

fn compare(old: &Path, new: &Path, extra: &[&str]) -> std::process::Output {
    let mut args = vec![
        "bench",
        "--compare",
        old.to_str().unwrap(),
        new.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    common::run(&args)
}

/// Scales every decode_tps cell by `factor` (the known-bad mutation of the checker).
fn scale_decode(text: &str, factor: f64) -> String {
    let cols: Vec<&str> = COLUMNS.to_vec();
    let mut out = String::new();
    let mut seen_header = false;
    for line in text.lines() {
        if line.starts_with('#') || !seen_header {
            seen_header |= !line.starts_with('#');
            out.push_str(line);
        } else {
            let cells: Vec<String> = line
                .split(',')
                .zip(&cols)
                .map(|(c, name)| {
                    if name.starts_with("decode_tps") {
                        format!("{:.3}", c.parse::<f64>().unwrap() * factor)
                    } else {
                        c.to_string()
                    }
                })
                .collect();
            out.push_str(&cells.join(","));
        }
        out.push('\n');
    }
    out
}

#[test]
fn compare_with_itself_passes() {
    let (csv, _) = receipt();
    let out = compare(csv, csv, &[]);
    assert!(out.status.success(), "{}", common::text(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("overall: ok"), "{}", common::text(&out));
}

#[test]
fn compare_flags_a_15_percent_decode_slowdown_as_regression() {
    let (csv, text) = receipt();
    let dir = tempfile::tempdir().unwrap();
    let slow = dir.path().join("slow.csv");
    std::fs::write(&slow, scale_decode(text, 0.85)).unwrap();
    let out = compare(csv, &slow, &[]);
    assert_eq!(out.status.code(), Some(1), "{}", common::text(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout
            .lines()
            .any(|l| l.contains("decode_tps_median") && l.ends_with("regression")),
        "{}",
        common::text(&out)
    );
    let out = compare(csv, &slow, &["--allow-regression"]);
    assert!(out.status.success(), "{}", common::text(&out));
    // 7 % slower is only worth a look.
    std::fs::write(&slow, scale_decode(text, 0.93)).unwrap();
    let out = compare(csv, &slow, &[]);
    assert!(out.status.success(), "{}", common::text(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("overall: investigate"));
}

#[test]
fn compare_refuses_a_different_model_hash() {
    let (csv, text) = receipt();
    let sha = header_value(text, "model_sha256").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let other = dir.path().join("other.csv");
    std::fs::write(&other, text.replace(sha, &"0".repeat(64))).unwrap();
    let out = compare(csv, &other, &["--allow-regression"]);
    assert_eq!(out.status.code(), Some(1), "{}", common::text(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("model_sha256 differs"),
        "{}",
        common::text(&out)
    );
}

#[test]
fn cold_teacher_forced_json_prefills_from_zero() {
    let model = common::pull("smollm2-135m-instruct");
    let dir = tempfile::tempdir().unwrap();
    // A prompt far shorter than the sweep: its tokens must be repeated to reach 32 + 2.
    let prompt = dir.path().join("prompt.txt");
    std::fs::write(&prompt, "The quick brown fox jumps over the lazy dog.").unwrap();
    let out = common::run(&[
        "bench",
        "--prompt-file",
        prompt.to_str().unwrap(),
        "-m",
        model.to_str().unwrap(),
        "--ctx-start",
        "16",
        "--ctx-max",
        "32",
        "--step-incr",
        "16",
        "--gen-tokens",
        "2",
        "--runs",
        "1",
        "--warmup",
        "0",
        "--cold",
        "--teacher-forced",
        "--json",
    ]);
    assert!(out.status.success(), "{}", common::text(&out));
    let j: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(j["header"]["mode"], "cold");
    assert_eq!(j["header"]["decode"], "teacher-forced");
    assert_eq!(j["header"]["prompt"], prompt.to_str().unwrap());
    let rows = j["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 2);
    for (row, frontier) in rows.iter().zip([16.0, 32.0]) {
        assert_eq!(row["frontier"], frontier);
        assert_eq!(row["prefill_from"], 0.0);
        assert_eq!(row["prefill_tokens"], frontier);
        assert!(row["decode_tps_median"].as_f64().unwrap() > 0.0);
    }
}

#[test]
fn batch_sizes_each_get_rows_and_zero_is_refused() {
    let model = common::pull("smollm2-135m-instruct");
    // A two-frontier plan of one run each, with the given extra flags.
    let tiny = |extra: &[&str]| {
        let mut args = vec![
            "bench",
            "-m",
            model.to_str().unwrap(),
            "--ctx-start",
            "16",
            "--ctx-max",
            "32",
            "--gen-tokens",
            "3",
            "--runs",
            "1",
            "--warmup",
            "0",
        ];
        args.extend(extra);
        common::run(&args)
    };
    let out = tiny(&["--batch", "1,3", "--teacher-forced", "--json"]);
    assert!(out.status.success(), "{}", common::text(&out));
    let j: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    // The batched rows say how they ran: the backend line describes one session.
    assert_eq!(j["header"]["batched"], "cpu batch, sampling=host", "{j}");
    let rows = j["rows"].as_array().unwrap();
    let keys: Vec<(f64, f64)> = rows
        .iter()
        .map(|r| {
            (
                r["frontier"].as_f64().unwrap(),
                r["batch"].as_f64().unwrap(),
            )
        })
        .collect();
    assert_eq!(keys, [(16.0, 1.0), (32.0, 1.0), (16.0, 3.0), (32.0, 3.0)]);
    for row in rows {
        for k in ["prefill_tps_median", "decode_tps_median", "ttft_ms_median"] {
            let v = row[k].as_f64().unwrap();
            assert!(v.is_finite() && v > 0.0, "{k} = {v}");
        }
    }

    let out = common::run(&["bench", "-m", "/nonexistent.gguf", "--batch", "2,0"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        common::text(&out).contains("--batch needs sizes"),
        "{}",
        common::text(&out)
    );

    // Sequences whose full KV caches exceed any machine's memory are refused with the
    // reason (without the check, allocating this context fails with a different message).
    let out = tiny(&["--ctx", "100000000", "--batch", "1,2"]);
    let text = common::text(&out);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(
        text.contains("--batch 1: ") && text.contains("GB of KV cache when full"),
        "{text}"
    );
}

/// `bench --lookup` checks the outputs before it reports speeds (oracle: its own plain
/// runs; a difference makes it fail), and names acceptance, tokens per step and both
/// speeds. `--draft-max` alone is refused.
#[test]
fn lookup_bench_checks_identity_and_reports_both_speeds() {
    common::pull("smollm2-135m-instruct");
    let out = common::run(&[
        "bench",
        "--lookup",
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
        "lookup decode tok/s median ",
        " tokens per step",
        "accepted ",
    ] {
        assert!(stdout.contains(needle), "missing {needle:?}: {stdout}");
    }
    let out = common::run(&["bench", "--draft-max", "4"]);
    assert!(!out.status.success());
    assert!(
        common::text(&out).contains("--lookup"),
        "{}",
        common::text(&out)
    );
}
