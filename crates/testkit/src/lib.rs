//! ferrite-testkit: what the library crates' tests share — finding the real models and the
//! reference fixtures — so every test applies the same skip-or-fail rule.
//!
//! The rule (shared/guides/TESTING.md, "fail closed"): a real model that is absent makes the
//! test print `skipped: <reason>` and return, unless `FERRITE_TEST_MODELS=1` asks for the
//! models, in which case its absence is a failure. Fixtures come from `FERRITE_FIXTURES` when
//! set (a missing directory fails), else from the in-repo copy; the chat template fixtures
//! likewise from `FERRITE_TEMPLATE_FIXTURES`. The CLI tests do not use this:
//! they pull the models with `ferrite pull`.
//!
//! [`CountingAlloc`] and [`measure`] bound what parsers allocate on hostile input;
//! [`XorShift`] is the deterministic generator of test data; [`err_tuple`] measures a result
//! against an f64 reference.
//!
//! ```
//! // `None` (with a printed `skipped:` line) when the file is not in the model cache.
//! let maybe = ferrite_testkit::real_model("no-such-model.gguf");
//! assert!(maybe.is_none());
//! ```

#![deny(missing_docs)]

mod alloc;
mod err;
mod rng;

pub use alloc::{AllocStats, CountingAlloc, measure};
pub use err::{ErrTuple, err_tuple};
pub use rng::XorShift;

use std::path::PathBuf;

/// File name of SmolLM2-135M-Instruct Q4_1 in the model cache.
pub const SMOLLM2: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
/// File name of Gemma 3 270M Q4_K_M in the model cache.
pub const GEMMA3: &str = "gemma-3-270m-q4_k_m.gguf";

/// `$FERRITE_HOME/models/<file>` (default `~/.cache/ferrite/models/<file>`) if it exists.
///
/// # Panics
/// When the file is absent and `FERRITE_TEST_MODELS=1` (a requested model must not skip).
pub fn real_model(file: &str) -> Option<PathBuf> {
    let path = ferrite_files::home().map(|h| h.join("models").join(file));
    if let Some(path) = path.as_ref().filter(|p| p.is_file()) {
        return Some(path.clone());
    }
    let shown = path.map_or_else(|| file.to_string(), |p| p.display().to_string());
    let required = std::env::var("FERRITE_TEST_MODELS").is_ok_and(|v| v == "1");
    assert!(!required, "FERRITE_TEST_MODELS=1 but {shown} is missing");
    println!("skipped: {shown} not found (set FERRITE_HOME or run `ferrite pull`)");
    None
}

/// The reference fixture directory: `FERRITE_FIXTURES` when set, else the in-repo copy.
///
/// # Panics
/// When `FERRITE_FIXTURES` names something that is not a directory.
pub fn fixtures_dir() -> PathBuf {
    fixture_dir("FERRITE_FIXTURES", "reference")
}

/// The chat template fixture directory (`fixtures/templates`: the templates and their
/// reference renders): `FERRITE_TEMPLATE_FIXTURES` when set, else the in-repo copy.
///
/// # Panics
/// When `FERRITE_TEMPLATE_FIXTURES` names something that is not a directory.
pub fn template_fixtures_dir() -> PathBuf {
    fixture_dir("FERRITE_TEMPLATE_FIXTURES", "templates")
}

/// The directory `var` names (it must be one: a requested fixture set that is missing is a
/// failure), else `fixtures/<in_repo>` of this repository.
fn fixture_dir(var: &str, in_repo: &str) -> PathBuf {
    match std::env::var_os(var) {
        Some(dir) => {
            let dir = PathBuf::from(dir);
            assert!(dir.is_dir(), "{var}={} is not a directory", dir.display());
            dir
        }
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../../fixtures")
            .join(in_repo),
    }
}

/// The text the nll fixtures score (the GPL-3 licence): `GPL-3.txt` in the fixture
/// directory, or the in-repo copy when an external fixture set does not carry one.
pub fn nll_text() -> PathBuf {
    let external = fixtures_dir().join("GPL-3.txt");
    if external.is_file() {
        return external;
    }
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/reference/GPL-3.txt")
}

/// The first (by name) `logits-<tag>-*.jsonl` file of the fixture directory.
///
/// # Panics
/// When there is none: a requested fixture that is missing is a failure, not a skip.
pub fn logits_fixture(tag: &str) -> PathBuf {
    let dir = fixtures_dir();
    let prefix = format!("logits-{tag}-");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("fixture dir {}: {e}", dir.display()))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(&prefix) && n.ends_with(".jsonl"))
        })
        .collect();
    files.sort();
    files
        .into_iter()
        .next()
        .unwrap_or_else(|| panic!("no {prefix}*.jsonl in {}", dir.display()))
}
