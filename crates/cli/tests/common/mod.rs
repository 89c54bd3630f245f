//! Shared helpers for the CLI integration tests: the built binary, model pulls and fixtures.
//!
//! Real models are fetched once with `ferrite pull` (the same command a user runs) into the
//! normal model cache, so only the first test run downloads anything.

#![allow(dead_code)] // each test binary uses a different subset of these helpers

use std::path::PathBuf;
use std::process::{Command, Output};

/// The `ferrite` binary under test.
pub fn ferrite() -> Command {
    Command::new(env!("CARGO_BIN_EXE_ferrite"))
}

/// Run `ferrite` with `args`, returning its output.
pub fn run(args: &[&str]) -> Output {
    ferrite()
        .args(args)
        .output()
        .expect("spawning the ferrite binary")
}

/// Run `ferrite` with `args` and `input` on its stdin (a pipe, not a terminal).
pub fn run_stdin(args: &[&str], input: &str) -> Output {
    use std::io::Write;
    use std::process::Stdio;
    let mut child = ferrite()
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawning the ferrite binary");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .expect("writing ferrite's stdin");
    child.wait_with_output().expect("waiting for ferrite")
}

/// Writes a tiny random f32 model (one layer, 64 wide, 300 tokens) to `path` with `ferrite
/// synth`: enough for tests of flags and errors that need no real weights.
pub fn tiny_model(path: &std::path::Path) {
    let out = run(&[
        "synth",
        "-o",
        path.to_str().unwrap(),
        "--type",
        "f32",
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
        "--vocab",
        "300",
    ]);
    assert!(out.status.success(), "{}", text(&out));
}

/// Pull a known model with `ferrite pull NAME` and return the path it printed last.
pub fn pull(name: &str) -> PathBuf {
    let out = run(&["pull", name]);
    assert!(
        out.status.success(),
        "ferrite pull {name} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let last = stdout.lines().last().expect("pull printed nothing");
    let path = PathBuf::from(last.trim());
    assert!(
        path.is_absolute() && path.is_file(),
        "bad pull path {path:?}"
    );
    path
}

use ferrite_testkit::fixtures_dir;

/// A fixture file that must exist (a requested fixture that is missing is a failure).
pub fn fixture(name: &str) -> PathBuf {
    let path = fixtures_dir().join(name);
    assert!(path.is_file(), "fixture {} is missing", path.display());
    path
}

/// Stdout and stderr of an output as one string, for assertion messages.
pub fn text(out: &Output) -> String {
    format!(
        "status={:?}\nstdout:\n{}\nstderr:\n{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// New bytes for a tensor (given its name and bytes), or `None` to keep them.
pub type TensorEdit<'a> = dyn Fn(&str, &[u8]) -> Option<Vec<u8>> + 'a;

/// `src` rewritten to `dst` with metadata `extra` (replacing same-named keys) and each
/// tensor's bytes replaced where `edit(name, bytes)` gives new ones; whether anything changed.
pub fn rewrite_gguf(
    src: &std::path::Path,
    dst: &std::path::Path,
    extra: &[(&str, ferrite_gguf::Value)],
    edit: &TensorEdit<'_>,
) -> bool {
    let g = ferrite_gguf::Gguf::open(src).unwrap();
    let mut w = ferrite_gguf::GgufWriter::new();
    for (k, v) in g.metadata() {
        if !extra.iter().any(|(e, _)| e == k) {
            w.add_metadata(k.clone(), v.clone()).unwrap();
        }
    }
    for (k, v) in extra {
        w.add_metadata(*k, v.clone()).unwrap();
    }
    let mut changed = !extra.is_empty();
    for t in g.tensors() {
        let data = g.tensor_data(t);
        let bytes = match edit(&t.name, data) {
            Some(new) => {
                changed = true;
                std::borrow::Cow::Owned(new)
            }
            None => std::borrow::Cow::Borrowed(data),
        };
        w.add_tensor(t.name.clone(), t.ty, &t.dims, bytes).unwrap();
    }
    w.write_file(dst).unwrap();
    changed
}

/// Every model directory (one with a `config.json`) under `$env`, else under the repo's
/// `fixtures/<default>`; a missing or empty directory fails (fixtures are never skipped).
pub fn model_dirs(env: &str, default: &str) -> Vec<PathBuf> {
    let root = match std::env::var_os(env) {
        Some(d) => PathBuf::from(d),
        None => std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../fixtures")
            .join(default),
    };
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(&root)
        .unwrap_or_else(|e| panic!("fixtures {}: {e}", root.display()))
        .map(|e| e.expect("directory entry").path())
        .filter(|p| p.join("config.json").is_file())
        .collect();
    dirs.sort();
    assert!(
        !dirs.is_empty(),
        "no model directories in {}",
        root.display()
    );
    dirs
}

/// The token ids of a fixture's JSON array.
pub fn id_array(v: &serde_json::Value) -> Vec<u32> {
    v.as_array()
        .expect("an array of token ids")
        .iter()
        .map(|x| x.as_u64().expect("a token id") as u32)
        .collect()
}
