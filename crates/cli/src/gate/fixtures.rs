//! The fixture set of a gate run: the directory (`--fixtures DIR`, default the repository's
//! `fixtures/reference`), the files in it that the gate knows by name, and their hashes.
//!
//! Known names are those of shared/fixtures: `tokenizer-<model>-*.jsonl`,
//! `chat-<model>-*.jsonl`, `logits-<model>-*.jsonl`, `nll-<model>.json`, plus the text the
//! NLL fixtures score (`GPL-3.txt`) and the quantization vectors (`quant/`). As in
//! crates/testkit, the text and the quantization vectors fall back to the repository's copy
//! when a held-out set does not carry them. A given directory with none of these files is an
//! error: a gate must never pass by finding nothing.

use std::path::{Path, PathBuf};

use anyhow::Context;
use sha2::{Digest, Sha256};

/// The repository's fixture directory, as the source tree this binary was built from has it.
const REPO_FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../fixtures/reference");

/// One fixture file and its digest.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq, Eq)]
pub struct FixtureFile {
    /// Path relative to the fixture directory (or absolute, for a repository fallback).
    pub name: String,
    /// sha256, lowercase hex.
    pub sha256: String,
}

/// The fixture files of one run.
pub struct Fixtures {
    /// The directory searched.
    pub dir: PathBuf,
    /// The known files found there, sorted by name.
    pub files: Vec<FixtureFile>,
    /// Repository files used because the directory lacked them.
    pub fallbacks: std::cell::RefCell<Vec<FixtureFile>>,
}

/// Whether `name` is one of the per-model fixture names.
fn is_known(name: &str) -> bool {
    let tagged = |prefix: &str, suffix: &str| {
        ["smollm2", "gemma3"].iter().any(|tag| {
            name.strip_prefix(prefix)
                .and_then(|r| r.strip_prefix(tag))
                .is_some_and(|r| r.ends_with(suffix) && (r.starts_with('-') || r == suffix))
        })
    };
    tagged("tokenizer-", ".jsonl")
        || tagged("chat-", ".jsonl")
        || tagged("logits-", ".jsonl")
        || tagged("nll-", ".json")
        || name == "GPL-3.txt"
}

/// sha256 of a file, lowercase hex.
pub fn sha256_hex(path: &Path) -> anyhow::Result<String> {
    crate::bench::receipt::sha256_file(path)
}

impl Fixtures {
    /// Scans `dir` (or the repository's fixtures when `None`).
    pub fn scan(dir: Option<&Path>) -> anyhow::Result<Fixtures> {
        let dir = dir.map_or_else(|| PathBuf::from(REPO_FIXTURES), Path::to_path_buf);
        let entries =
            std::fs::read_dir(&dir).with_context(|| format!("fixture dir {}", dir.display()))?;
        let mut files = Vec::new();
        for e in entries {
            let path = e?.path();
            let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
                continue;
            };
            if path.is_file() && is_known(name) {
                files.push(FixtureFile {
                    name: name.to_owned(),
                    sha256: sha256_hex(&path)?,
                });
            }
        }
        let quant = dir.join("quant/MANIFEST.json");
        if quant.is_file() {
            files.push(FixtureFile {
                name: "quant/MANIFEST.json".into(),
                sha256: sha256_hex(&quant)?,
            });
        }
        files.sort_by(|a, b| a.name.cmp(&b.name));
        anyhow::ensure!(
            files.iter().any(|f| f.name != "GPL-3.txt"),
            "fixture dir {} holds no tokenizer-, chat-, logits- or nll- fixture of smollm2 or \
             gemma3",
            dir.display()
        );
        Ok(Fixtures {
            dir,
            files,
            fallbacks: std::cell::RefCell::new(Vec::new()),
        })
    }

    /// Files named `<prefix>*<suffix>` (one `*` at most in `pattern`), sorted.
    pub fn matching(&self, pattern: &str) -> Vec<PathBuf> {
        let (prefix, suffix) = pattern.split_once('*').unwrap_or((pattern, ""));
        self.files
            .iter()
            .filter(|f| {
                f.name.len() >= prefix.len() + suffix.len()
                    && f.name.starts_with(prefix)
                    && f.name.ends_with(suffix)
                    && (pattern.contains('*') || f.name == pattern)
            })
            .map(|f| self.dir.join(&f.name))
            .collect()
    }

    /// `name` in the fixture directory, else the repository's copy (recorded as a fallback).
    pub fn file_or_repo(&self, name: &str) -> anyhow::Result<PathBuf> {
        let here = self.dir.join(name);
        if here.is_file() {
            return Ok(here);
        }
        let repo = Path::new(REPO_FIXTURES).join(name);
        anyhow::ensure!(
            repo.is_file(),
            "no {name} in {} nor in the repository",
            self.dir.display()
        );
        let file = FixtureFile {
            name: repo.display().to_string(),
            sha256: sha256_hex(&repo)?,
        };
        let mut fallbacks = self.fallbacks.borrow_mut();
        if !fallbacks.contains(&file) {
            fallbacks.push(file);
        }
        Ok(repo)
    }

    /// One digest over every file's name and digest: equal sets, equal hashes.
    pub fn set_sha256(&self) -> String {
        let mut h = Sha256::new();
        for f in self.files.iter().chain(self.fallbacks.borrow().iter()) {
            h.update(format!("{}  {}\n", f.sha256, f.name));
        }
        h.finalize().iter().map(|b| format!("{b:02x}")).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_names_follow_the_shared_fixture_naming() {
        for ok in [
            "tokenizer-smollm2-dev.jsonl",
            "chat-smollm2-heldout.jsonl",
            "logits-gemma3-dev.jsonl",
            "nll-gemma3.json",
            "GPL-3.txt",
        ] {
            assert!(is_known(ok), "{ok}");
        }
        for bad in [
            "tokenizer-llama-dev.jsonl",
            "nll-smollm2x.json",
            "logits-smollm2-dev.json",
            "README.md",
        ] {
            assert!(!is_known(bad), "{bad}");
        }
    }

    #[test]
    fn a_dir_without_known_fixtures_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("GPL-3.txt"), "text").unwrap();
        let err = Fixtures::scan(Some(dir.path())).err().unwrap();
        assert!(err.to_string().contains("holds no"), "{err}");
        std::fs::write(dir.path().join("nll-smollm2.json"), "{}").unwrap();
        let f = Fixtures::scan(Some(dir.path())).unwrap();
        assert_eq!(f.matching("nll-smollm2.json").len(), 1);
        assert!(f.matching("nll-gemma3.json").is_empty());
        assert!(f.matching("logits-smollm2-*.jsonl").is_empty());
    }
}
