//! Resolving `-m/--model` (a known model name or a path to a `.gguf` file) to a local file.
//!
//! Filled in with `ferrite pull` (issue 2): known names are pulled on first use.

use std::path::PathBuf;

/// The model used when `-m` is not given.
pub const DEFAULT_MODEL: &str = "smollm2-135m-instruct";

/// Resolve a `-m` argument to the path of a verified GGUF file.
pub fn resolve(model: &str) -> anyhow::Result<PathBuf> {
    let path = PathBuf::from(model);
    if path.is_file() {
        return Ok(path);
    }
    anyhow::bail!("model {model:?} is not a file (model registry not implemented yet)")
}
