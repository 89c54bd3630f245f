//! `ferrite quantize`: a synthetic f32 model quantized with each named mix loads and runs;
//! bad input ends with one `error:` line and exit code 1 and leaves no output file.

mod common;

use std::path::Path;

const TINY: [&str; 12] = [
    "--hidden",
    "256",
    "--layers",
    "2",
    "--heads",
    "4",
    "--kv-heads",
    "2",
    "--ffn",
    "512",
    "--vocab",
    "300",
];

fn synth(out: &Path, ty: &str) {
    let mut args = vec!["synth", "-o", out.to_str().unwrap(), "--type", ty];
    args.extend_from_slice(&TINY);
    let o = common::run(&args);
    assert!(o.status.success(), "{}", common::text(&o));
}

/// Exit code 1 and a single stderr line starting with `error:` that contains `needle`.
fn fails_cleanly(args: &[&str], needle: &str) {
    let o = common::run(args);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{}", common::text(&o));
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "{}", common::text(&o));
    assert!(lines[0].starts_with("error: "), "{}", common::text(&o));
    assert!(
        lines[0].contains(needle),
        "want {needle:?}: {}",
        common::text(&o)
    );
}

#[test]
fn each_mix_writes_a_model_that_runs() {
    let dir = tempfile::tempdir().unwrap();
    let f32_model = dir.path().join("f32.gguf");
    synth(&f32_model, "f32");
    for (ty, file_type) in [("q8_0", 7), ("q4_k_m", 15), ("q5_1", 9), ("bf16", 32)] {
        let out = dir.path().join(format!("{ty}.gguf"));
        let o = common::run(&[
            "quantize",
            f32_model.to_str().unwrap(),
            out.to_str().unwrap(),
            "--type",
            ty,
            "--threads",
            "2",
        ]);
        assert!(o.status.success(), "{}", common::text(&o));
        let stdout = String::from_utf8_lossy(&o.stdout);
        assert!(stdout.starts_with("type"), "table header: {stdout}");
        assert!(
            stdout.lines().last().unwrap().starts_with("total"),
            "{stdout}"
        );
        let g = ferrite_gguf::Gguf::open(&out).unwrap();
        assert_eq!(g.get_u64("general.file_type").unwrap(), file_type);
        let o = common::run(&[
            "run",
            "-m",
            out.to_str().unwrap(),
            "--raw",
            "--max-tokens",
            "3",
            "--temp",
            "0",
            "hello",
        ]);
        assert!(o.status.success(), "{ty}: {}", common::text(&o));
    }
}

#[test]
fn bad_input_is_one_error_line_and_exit_1() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let q8 = d.join("q8.gguf");
    synth(&q8, "q8_0");
    let q8s = q8.to_str().unwrap();
    let out = d.join("out.gguf");
    let outs = out.to_str().unwrap();
    fails_cleanly(
        &["quantize", q8s, outs, "--type", "q3_k_s"],
        "unknown quantization type",
    );
    let missing = d.join("missing.gguf");
    fails_cleanly(
        &[
            "quantize",
            missing.to_str().unwrap(),
            outs,
            "--type",
            "q8_0",
        ],
        "no such file",
    );
    let nodir = d.join("no-such-dir").join("x.gguf");
    fails_cleanly(
        &["quantize", q8s, nodir.to_str().unwrap(), "--type", "q8_0"],
        "does not exist",
    );
    fails_cleanly(
        &["quantize", q8s, outs, "--type", "q4_0"],
        "--allow-requantize",
    );
    assert!(!out.exists(), "a failed run left {outs}");
    let names: Vec<_> = std::fs::read_dir(d)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names.len(), 1, "only the input remains: {names:?}");
    let o = common::run(&[
        "quantize",
        q8s,
        outs,
        "--type",
        "q4_0",
        "--allow-requantize",
    ]);
    assert!(o.status.success(), "{}", common::text(&o));
}
