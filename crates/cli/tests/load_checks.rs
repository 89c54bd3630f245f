//! Load-time refusals seen from the command line (issue 35): `run` clamps `--ctx` to the
//! model's context length as `serve` does, and `--check-weights` on `run`, `score` and
//! `serve` finds a NaN inside a weight matrix, naming the tensor, that the cheap checks of
//! every load leave to it.

mod common;

use ferrite_gguf::{Gguf, GgufWriter, Value};

/// The tiny synth model at `path` rewritten with metadata `key` = `value` and, when given,
/// element `at` of tensor `nan_in` set to NaN.
fn rewritten(path: &std::path::Path, meta: Option<(&str, Value)>, nan_in: Option<(&str, usize)>) {
    let g = Gguf::open(path).unwrap();
    let mut w = GgufWriter::new();
    for (k, v) in g.metadata() {
        let v = match &meta {
            Some((key, new)) if key == k => new.clone(),
            _ => v.clone(),
        };
        w.add_metadata(k.clone(), v).unwrap();
    }
    for t in g.tensors() {
        let mut data = g.tensor_data(t).to_vec();
        if let Some((name, at)) = nan_in
            && name == t.name
        {
            data[4 * at..4 * at + 4].copy_from_slice(&f32::NAN.to_le_bytes());
        }
        w.add_tensor(t.name.clone(), t.ty, &t.dims, data).unwrap();
    }
    let bytes = w.to_bytes().unwrap();
    drop(g);
    std::fs::write(path, bytes).unwrap();
}

const PROMPT: &str = "one two three four five six seven eight nine ten eleven twelve \
    thirteen fourteen fifteen sixteen seventeen eighteen nineteen twenty";

/// Regression: with `context_length` 8, a prompt longer than 8 tokens still ran, because
/// `run` took `--ctx 4096` as given.
#[test]
fn run_clamps_ctx_to_the_model_context_length() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("m.gguf");
    common::tiny_model(&model);
    rewritten(&model, Some(("llama.context_length", Value::U32(8))), None);
    let m = model.to_str().unwrap();
    let out = common::run(&[
        "run",
        "-m",
        m,
        "--backend",
        "cpu",
        "--raw",
        "--max-tokens",
        "2",
        "--ctx",
        "4096",
        "-p",
        PROMPT,
    ]);
    assert_eq!(out.status.code(), Some(1), "{}", common::text(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("but the context holds 8"), "{err}");
}

#[test]
fn check_weights_names_a_non_finite_matrix_value_on_run_score_and_serve() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("m.gguf");
    common::tiny_model(&model);
    let tensor = "blk.0.ffn_up.weight";
    rewritten(&model, None, Some((tensor, 333)));
    let m = model.to_str().unwrap();
    let text = dir.path().join("t.txt");
    std::fs::write(&text, PROMPT).unwrap();
    let want = format!("tensor {tensor} holds a non-finite value (NaN) at element 333");
    for args in [
        vec![
            "run",
            "-m",
            m,
            "--backend",
            "cpu",
            "--raw",
            "--max-tokens",
            "1",
            "-p",
            "hi",
        ],
        vec![
            "score",
            "-m",
            m,
            "--backend",
            "cpu",
            "--text",
            text.to_str().unwrap(),
        ],
        vec!["serve", "-m", m, "--backend", "cpu", "--port", "0"],
    ] {
        let mut checked = args.clone();
        checked.push("--check-weights");
        let out = common::run(&checked);
        assert_eq!(out.status.code(), Some(1), "{}", common::text(&out));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(&want), "{args:?}: {err}");
    }
    // Without the flag the model loads: the cheap checks do not read matrix values.
    let out = common::run(&[
        "run",
        "-m",
        m,
        "--backend",
        "cpu",
        "--raw",
        "--max-tokens",
        "1",
        "-p",
        "hi",
    ]);
    assert!(
        !String::from_utf8_lossy(&out.stderr).contains(&want),
        "{}",
        common::text(&out)
    );
    // A clean model passes the scan and says what it covered.
    common::tiny_model(&model);
    let out = common::run(&[
        "run",
        "-m",
        m,
        "--backend",
        "cpu",
        "--raw",
        "--max-tokens",
        "1",
        "-p",
        "hi",
        "--check-weights",
    ]);
    assert!(out.status.success(), "{}", common::text(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("checked weights: all "),
        "{}",
        common::text(&out)
    );
}
