//! The release-gate receipt (docs/gate-receipt.md): a versioned JSON record of what ran, on
//! which build, machine, models and fixtures, and what each item found; and `ferrite gate
//! compare OLD.json NEW.json`, which prints what changed between two receipts.
//!
//! The receipt records observations only. It must never hold a verdict the run did not
//! reach, and reading a receipt of another schema version is an error, not a guess.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::Context;
use serde::{Deserialize, Serialize};

use super::fixtures::FixtureFile;
use super::manifest::Needs;

/// The `format` field of every gate receipt.
pub const FORMAT: &str = "ferrite-gate-receipt";
/// The schema version this build writes and reads.
pub const VERSION: u32 = 1;

/// One model the run used.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ModelRecord {
    /// `-m` as given.
    pub name: String,
    /// The resolved file, when it resolved.
    pub path: Option<String>,
    /// sha256 of the file.
    pub sha256: Option<String>,
    /// Fixture tag, when the file is a known model's.
    pub fixture_tag: Option<String>,
    /// Why the model is unavailable, when it is.
    pub unavailable: Option<String>,
}

/// The fixture set.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct FixtureRecord {
    /// The directory searched.
    pub dir: String,
    /// sha256 over every file's name and digest.
    pub set_sha256: String,
    /// Every file found (and repository fallbacks used), with its digest.
    pub files: Vec<FixtureFile>,
}

/// The machine.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Machine {
    /// CPU model name.
    pub cpu_model: String,
    /// CPU feature flags as the kernel lists them.
    pub cpu_flags: Vec<String>,
    /// Logical CPUs available to this process.
    pub cpus: usize,
    /// SIMD level the kernels chose.
    pub simd: String,
    /// GPU name, when a CUDA device answered.
    pub gpu: Option<String>,
    /// CUDA driver version, when a device answered.
    pub driver: Option<String>,
    /// The CUDA probe's answer when no device did.
    pub gpu_probe: Option<String>,
}

/// The planted-defect run of an item.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PlantedRecord {
    /// The defect, as the manifest declares it.
    pub defect: String,
    /// The oracle failed on the defect, as it must.
    pub detected: bool,
    /// What the oracle said.
    pub detail: String,
}

/// One item's result.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ItemRecord {
    /// `<item>` or `<item>:<model>`.
    pub name: String,
    /// The manifest item.
    pub item: String,
    /// `-m` of the model it ran against.
    pub model: Option<String>,
    /// sha256 of that model's file.
    pub model_sha256: Option<String>,
    /// The risk it covers (from the manifest).
    pub risk: String,
    /// Its oracle (from the manifest).
    pub oracle: String,
    /// What it needs (from the manifest).
    pub needs: Needs,
    /// `passed`, `failed`, `blocked` or `static`.
    pub verdict: String,
    /// Why it failed or was blocked; what a static item read.
    pub reason: Option<String>,
    /// The real run's one-line finding.
    pub detail: String,
    /// Measured values.
    pub figures: BTreeMap<String, f64>,
    /// Measured values that were NaN or infinite, as `name=value` (JSON has no such numbers).
    pub nonfinite_figures: Vec<String>,
    /// Counted things.
    pub counts: BTreeMap<String, u64>,
    /// The planted-defect run, for judged items.
    pub planted: Option<PlantedRecord>,
    /// Wall time of the item, planted run included.
    pub seconds: f64,
}

/// Verdict counts.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct Summary {
    /// Items passed.
    pub passed: usize,
    /// Items failed.
    pub failed: usize,
    /// Items blocked.
    pub blocked: usize,
    /// Static items.
    pub r#static: usize,
}

impl std::fmt::Display for Summary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} passed, {} failed, {} blocked, {} static",
            self.passed, self.failed, self.blocked, self.r#static
        )
    }
}

/// A manifest item the run did not request (another lane, or not in `--quick`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct NotRequested {
    /// Item name.
    pub item: String,
    /// Why.
    pub why: String,
}

/// The whole receipt.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Receipt {
    /// Always [`FORMAT`].
    pub format: String,
    /// Schema version ([`VERSION`]).
    pub version: u32,
    /// ferrite's version.
    pub ferrite_version: String,
    /// The commit the binary was built from.
    pub commit: String,
    /// sha256 of the running binary.
    pub binary_sha256: String,
    /// UTC time the run started.
    pub started: String,
    /// The command line.
    pub args: Vec<String>,
    /// Lane requested.
    pub lane: String,
    /// `--quick` given.
    pub quick: bool,
    /// `--require-all` given.
    pub require_all: bool,
    /// The models.
    pub models: Vec<ModelRecord>,
    /// The fixtures.
    pub fixtures: FixtureRecord,
    /// The machine.
    pub machine: Machine,
    /// Every backend line the loaded models reported.
    pub backend_lines: Vec<String>,
    /// One entry per item run.
    pub items: Vec<ItemRecord>,
    /// Manifest items not requested.
    pub not_requested: Vec<NotRequested>,
    /// The counts of `items`' verdicts.
    pub summary: Summary,
}

/// The machine this process runs on (CUDA is probed, never required).
pub fn machine() -> Machine {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let cpu_flags = cpuinfo
        .lines()
        .find(|l| l.starts_with("flags"))
        .and_then(|l| l.split_once(':'))
        .map(|(_, v)| v.split_whitespace().map(str::to_owned).collect())
        .unwrap_or_default();
    let (gpu, driver, gpu_probe) = match ferrite_cuda::CudaBackend::probe() {
        Ok(info) => (
            Some(format!(
                "{} (cc {}.{}, {} MiB)",
                info.name,
                info.compute_capability.0,
                info.compute_capability.1,
                info.total_mem >> 20
            )),
            Some(format!(
                "{}.{}",
                info.driver_version / 1000,
                (info.driver_version % 1000) / 10
            )),
            None,
        ),
        Err(e) => (None, None, Some(e.to_string())),
    };
    Machine {
        cpu_model: crate::bench::receipt::cpu_model(),
        cpu_flags,
        cpus: std::thread::available_parallelism().map_or(0, usize::from),
        simd: ferrite_quant::simd_level().to_string(),
        gpu,
        driver,
        gpu_probe,
    }
}

/// sha256 of the running binary.
pub fn binary_sha256() -> anyhow::Result<String> {
    let exe = std::env::current_exe().context("locating the running binary")?;
    crate::bench::receipt::sha256_file(&exe)
}

/// Writes a receipt as pretty JSON.
pub fn write(path: &Path, r: &Receipt) -> anyhow::Result<()> {
    let text = serde_json::to_string_pretty(r)?;
    std::fs::write(path, format!("{text}\n"))
        .with_context(|| format!("writing receipt {}", path.display()))
}

/// Reads a receipt, refusing other formats and versions.
pub fn read(path: &Path) -> anyhow::Result<Receipt> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading receipt {}", path.display()))?;
    let v: serde_json::Value =
        serde_json::from_str(&text).with_context(|| format!("{} is not JSON", path.display()))?;
    let format = v.get("format").and_then(|f| f.as_str()).unwrap_or("");
    let version = v.get("version").and_then(serde_json::Value::as_u64);
    anyhow::ensure!(
        format == FORMAT && version == Some(u64::from(VERSION)),
        "{} is not a version {VERSION} gate receipt (format {format:?}, version {version:?})",
        path.display()
    );
    serde_json::from_value(v).with_context(|| format!("{}: malformed receipt", path.display()))
}

/// Arguments of `ferrite gate compare`.
#[derive(clap::Args)]
pub struct CompareArgs {
    /// The earlier receipt.
    pub old: PathBuf,
    /// The later receipt.
    pub new: PathBuf,
}

/// What changed in one item; `None` when nothing did.
fn item_change(o: &ItemRecord, n: &ItemRecord) -> Vec<String> {
    let mut out = Vec::new();
    if o.verdict != n.verdict || o.reason != n.reason {
        out.push(format!(
            "verdict {} -> {}{}",
            o.verdict,
            n.verdict,
            n.reason
                .as_ref()
                .map(|r| format!(" ({r})"))
                .unwrap_or_default()
        ));
    }
    for (k, nv) in &n.figures {
        match o.figures.get(k) {
            Some(ov) if ov.to_bits() == nv.to_bits() => {}
            Some(ov) => out.push(format!("{k} {ov:.6} -> {nv:.6} (x{:.4})", nv / ov)),
            None => out.push(format!("{k} new {nv:.6}")),
        }
    }
    for (k, nv) in &n.counts {
        if let Some(ov) = o.counts.get(k).filter(|ov| *ov != nv) {
            out.push(format!("{k} {ov} -> {nv}"));
        }
    }
    out
}

/// Prints the changes between two receipts; returns the lines and whether any item that
/// passed in `old` does not pass in `new`.
pub fn changes(old: &Receipt, new: &Receipt) -> (Vec<String>, bool) {
    let mut lines = Vec::new();
    let header = [
        ("commit", &old.commit, &new.commit),
        ("binary_sha256", &old.binary_sha256, &new.binary_sha256),
        ("cpu", &old.machine.cpu_model, &new.machine.cpu_model),
        (
            "fixtures",
            &old.fixtures.set_sha256,
            &new.fixtures.set_sha256,
        ),
        ("lane", &old.lane, &new.lane),
    ];
    for (k, o, n) in header {
        if o != n {
            lines.push(format!("{k}: {o} -> {n}"));
        }
    }
    let gpu = |m: &Machine| m.gpu.clone().unwrap_or_else(|| "none".into());
    if gpu(&old.machine) != gpu(&new.machine) {
        lines.push(format!(
            "gpu: {} -> {}",
            gpu(&old.machine),
            gpu(&new.machine)
        ));
    }
    let mut worse = false;
    for n in &new.items {
        match old.items.iter().find(|o| o.name == n.name) {
            None => lines.push(format!("{}: only in NEW ({})", n.name, n.verdict)),
            Some(o) => {
                worse |= o.verdict == "passed" && n.verdict != "passed";
                for c in item_change(o, n) {
                    lines.push(format!("{}: {c}", n.name));
                }
            }
        }
    }
    for o in &old.items {
        if !new.items.iter().any(|n| n.name == o.name) {
            worse |= o.verdict == "passed";
            lines.push(format!("{}: only in OLD ({})", o.name, o.verdict));
        }
    }
    lines.push(format!("old: {}", old.summary));
    lines.push(format!("new: {}", new.summary));
    (lines, worse)
}

/// Run `ferrite gate compare`; exit code 1 when an item that passed no longer does.
pub fn run_compare(args: &CompareArgs) -> anyhow::Result<i32> {
    let old = read(&args.old)?;
    let new = read(&args.new)?;
    let (lines, worse) = changes(&old, &new);
    for l in &lines {
        println!("{l}");
    }
    Ok(i32::from(worse))
}
