//! No command writes over a file it reads. Oracle: every output flag pointed at the model
//! (by its own name, another spelling, or a link) ends with exit code 1 and one `error:` line
//! saying the path is the model, and the model file is byte-identical afterwards.
//!
//! Regression: `run --dump-logprobs M` truncated the memory-mapped model under the running
//! process (killed by SIGBUS, leaving an empty file); `run --save-session M`, `bench --csv M`,
//! `quantize M M` and `synth -o M --tokenizer-from M` replaced the model with their output;
//! `score --fixture F --tsv F` replaced the fixture with the scores.

mod common;

/// `None` when `args` end with exit code 1 and a single stderr line starting with `error`
/// that contains `needle`; otherwise what happened.
fn clean_failure(args: &[&str], needle: &str) -> Option<String> {
    let o = common::run(args);
    let stderr = String::from_utf8_lossy(&o.stderr);
    let errors: Vec<&str> = stderr.lines().filter(|l| l.starts_with("error")).collect();
    let clean = o.status.code() == Some(1) && errors.len() == 1 && errors[0].contains(needle);
    (!clean).then(|| {
        format!(
            "{args:?}: want one error with {needle:?}: {}",
            common::text(&o)
        )
    })
}

#[test]
fn no_output_flag_may_name_the_model() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("m.gguf");
    common::tiny_model(&model);
    let original = std::fs::read(&model).unwrap();
    let m = model.to_str().unwrap();
    let other_spelling = dir.path().join(".").join("m.gguf");
    let other = other_spelling.to_str().unwrap();
    let link = dir.path().join("link.gguf");
    std::os::unix::fs::symlink(&model, &link).unwrap();
    let link = link.to_str().unwrap();
    let fixture = dir.path().join("case.jsonl");
    std::fs::write(
        &fixture,
        r#"{"id":"a","prompt_ids":[1,2],"generated_ids":[3],"steps":[{"token":3,"logprob":-1.0,"top":[[3,-1.0]]}]}"#,
    )
    .unwrap();
    let fx = fixture.to_str().unwrap();
    let run = ["run", "-m", m, "--backend", "cpu", "--raw", "-p", "hi"];
    let cases: Vec<Vec<&str>> = vec![
        [&run[..], &["--max-tokens", "2", "--dump-logprobs", m]].concat(),
        [&run[..], &["--max-tokens", "2", "--dump-logprobs", link]].concat(),
        [&run[..], &["--max-tokens", "2", "--save-session", other]].concat(),
        vec![
            "bench",
            "-m",
            m,
            "--backend",
            "cpu",
            "--ctx-start",
            "8",
            "--ctx-max",
            "8",
            "--gen-tokens",
            "1",
            "--runs",
            "1",
            "--warmup",
            "0",
            "--csv",
            m,
        ],
        vec![
            "score",
            "-m",
            m,
            "--backend",
            "cpu",
            "--fixture",
            fx,
            "--tsv",
            m,
        ],
        vec!["quantize", "--type", "q8_0", m, m],
        vec!["quantize", "--type", "q8_0", m, link],
        vec![
            "synth",
            "-o",
            other,
            "--tokenizer-from",
            m,
            "--hidden",
            "64",
            "--layers",
            "1",
            "--heads",
            "4",
            "--kv-heads",
            "2",
            "--ffn",
            "128",
        ],
    ];
    // Every case runs (each on an intact model), so one report lists all that fail.
    let mut failures = Vec::new();
    for args in &cases {
        failures.extend(clean_failure(args, "is the model"));
        if std::fs::read(&model).unwrap() != original {
            failures.push(format!("{args:?} changed the model"));
            std::fs::write(&model, &original).unwrap();
        }
    }
    // The fixture is an input of score too.
    let fixture_bytes = std::fs::read(&fixture).unwrap();
    let args = [
        "score",
        "-m",
        m,
        "--backend",
        "cpu",
        "--fixture",
        fx,
        "--tsv",
        fx,
    ];
    failures.extend(clean_failure(&args, "is the fixture"));
    if std::fs::read(&fixture).unwrap() != fixture_bytes {
        failures.push(format!("{args:?} changed the fixture"));
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
    // A fresh output path still works.
    let tsv = dir.path().join("scores.tsv");
    let o = common::run(&[
        "score",
        "-m",
        m,
        "--backend",
        "cpu",
        "--fixture",
        fx,
        "--tsv",
        tsv.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", common::text(&o));
    assert!(std::fs::read_to_string(&tsv).unwrap().starts_with("id\t"));
}
