//! The declared list of release-gate items (`manifest.json`, compiled into the binary): for
//! each item the risk it covers, its oracle, its planted defect and what it needs.
//!
//! The manifest is the list the gate runs; an item without an implementation in this build
//! is still run and reported `blocked: not implemented in this build`, never left out. This
//! module only parses; it must never decide a verdict.

use serde::{Deserialize, Serialize};

/// The manifest text, as committed.
const MANIFEST: &str = include_str!("manifest.json");

/// Which lane an item belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Lane {
    /// Needs no accelerator.
    Cpu,
    /// Needs a CUDA device.
    Gpu,
    /// Both lanes (only as a request on the command line).
    All,
}

impl Lane {
    /// Whether a request for `self` runs an item of lane `item`.
    pub fn runs(self, item: Lane) -> bool {
        self == Lane::All || self == item
    }

    /// Lower-case name, as in the receipt.
    pub fn name(self) -> &'static str {
        match self {
            Lane::Cpu => "cpu",
            Lane::Gpu => "gpu",
            Lane::All => "all",
        }
    }
}

/// What an item needs to run.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Needs {
    /// A loaded model.
    pub model: bool,
    /// Fixture file patterns (`<model>` is the model's fixture tag).
    pub fixtures: Vec<String>,
    /// `cpu` or `cuda`.
    pub device: String,
    /// Rough wall time on two cores, in seconds (full profile).
    pub time_s: u64,
}

/// One gate item.
#[derive(Debug, Clone, Deserialize)]
pub struct Item {
    /// Unique name; the receipt's `item` field.
    pub name: String,
    /// The lane it runs in.
    pub lane: Lane,
    /// Run once per model (`<item>:<model>` in the receipt) rather than once.
    pub per_model: bool,
    /// Part of the `--quick` profile.
    pub quick: bool,
    /// The failure it would reveal.
    pub risk: String,
    /// How a failure is recognized, and where the expectation comes from.
    pub oracle: String,
    /// The defect the oracle is first run on, and must detect.
    pub planted: String,
    /// Prerequisites.
    pub needs: Needs,
}

/// The parsed manifest.
#[derive(Debug, Deserialize)]
pub struct Manifest {
    /// Manifest schema version.
    pub version: u32,
    /// Items in the order they run.
    pub items: Vec<Item>,
}

/// The compiled-in manifest.
pub fn load() -> anyhow::Result<Manifest> {
    let m: Manifest = serde_json::from_str(MANIFEST)?;
    anyhow::ensure!(
        m.version == 1,
        "gate manifest version {} unknown",
        m.version
    );
    Ok(m)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manifest_parses_with_unique_names_and_items_in_both_lanes() {
        let m = load().unwrap();
        let mut names: Vec<&str> = m.items.iter().map(|i| i.name.as_str()).collect();
        names.sort_unstable();
        let n = names.len();
        names.dedup();
        assert_eq!(names.len(), n, "duplicate item names");
        assert!(m.items.iter().any(|i| i.lane == Lane::Gpu));
        assert!(m.items.iter().all(|i| i.lane != Lane::All));
        for i in &m.items {
            assert!(!i.risk.is_empty() && !i.oracle.is_empty(), "{}", i.name);
            assert!(
                ["cpu", "cuda"].contains(&i.needs.device.as_str()),
                "{}",
                i.name
            );
        }
    }
}
