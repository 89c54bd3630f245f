//! `ferrite gate release`: runs the manifest's items against the requested models and
//! lane, proves each oracle on its planted defect first, prints one line per item and the
//! summary, and writes the receipt.
//!
//! Verdicts are decided here and only here: `failed: oracle did not detect the planted
//! defect` when the planted run passed, `passed` / `failed` from the real run, `blocked:
//! <reason>` for a missing prerequisite (`--require-all` makes it a failure), `static` for
//! items checked by reading. An item this build does not implement is `blocked: not
//! implemented in this build`. The exit code is 1 on any failure. Nothing here may drop an
//! item from the output or the receipt.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Instant;

use super::fixtures::Fixtures;
use super::items::{self, Env, Outcome, Parts, Target};
use super::manifest::{self, Item, Lane};
use super::receipt::{
    self, FixtureRecord, ItemRecord, ModelRecord, NotRequested, PlantedRecord, Receipt, Summary,
};

/// The models a release gate runs against when `-m` is not given.
const DEFAULT_MODELS: [&str; 2] = ["smollm2-135m-instruct", "gemma3-270m"];

/// Arguments of `ferrite gate release`.
#[derive(clap::Args)]
pub struct ReleaseArgs {
    /// Model: a known name or a .gguf path; repeat for several (default: smollm2-135m-instruct
    /// and gemma3-270m).
    #[arg(short = 'm', long = "model")]
    models: Vec<String>,
    /// Which lane's items to run.
    #[arg(long, value_enum, default_value = "cpu")]
    lane: Lane,
    /// Fixture directory (files named as in shared/fixtures); default: the repository's
    /// fixtures/reference.
    #[arg(long)]
    fixtures: Option<PathBuf>,
    /// An earlier gate receipt whose speed figures this run is judged against.
    #[arg(long)]
    baseline: Option<PathBuf>,
    /// Only the items of the quick profile, on fewer cases (CI).
    #[arg(long)]
    quick: bool,
    /// Count a blocked item as failed.
    #[arg(long)]
    require_all: bool,
    /// Where to write the receipt (JSON).
    #[arg(long)]
    receipt: PathBuf,
}

/// Splits off the figures JSON cannot hold (NaN, ±∞), naming them instead of writing a
/// receipt that no reader could parse back.
fn finite(figures: BTreeMap<String, f64>) -> (BTreeMap<String, f64>, Vec<String>) {
    let (ok, bad): (BTreeMap<_, _>, BTreeMap<_, _>) =
        figures.into_iter().partition(|(_, v)| v.is_finite());
    (
        ok,
        bad.into_iter().map(|(k, v)| format!("{k}={v}")).collect(),
    )
}

/// The verdict of an outcome, as the receipt records it.
fn record(item: &Item, target: Option<&Target>, outcome: Outcome, seconds: f64) -> ItemRecord {
    let name = match target {
        Some(t) => format!("{}:{}", item.name, t.tag.unwrap_or(&t.name)),
        None => item.name.clone(),
    };
    let mut r = ItemRecord {
        name,
        item: item.name.clone(),
        model: target.map(|t| t.name.clone()),
        model_sha256: target.and_then(|t| t.sha256.clone()),
        risk: item.risk.clone(),
        oracle: item.oracle.clone(),
        needs: item.needs.clone(),
        verdict: String::new(),
        reason: None,
        detail: String::new(),
        figures: Default::default(),
        nonfinite_figures: Vec::new(),
        counts: Default::default(),
        planted: None,
        seconds,
    };
    match outcome {
        Outcome::Judged { planted, real } => {
            r.planted = Some(PlantedRecord {
                defect: item.planted.clone(),
                detected: !planted.ok,
                detail: planted.detail,
            });
            r.detail = real.detail.clone();
            (r.figures, r.nonfinite_figures) = finite(real.figures);
            r.counts = real.counts;
            if planted.ok {
                r.verdict = "failed".into();
                r.reason = Some("oracle did not detect the planted defect".into());
            } else if real.ok {
                r.verdict = "passed".into();
            } else {
                r.verdict = "failed".into();
                r.reason = Some(real.detail);
            }
        }
        Outcome::Blocked { reason, measured } => {
            r.verdict = "blocked".into();
            r.reason = Some(reason);
            if let Some(m) = measured {
                (r.figures, r.nonfinite_figures) = finite(m.figures);
                r.counts = m.counts;
            }
        }
        Outcome::Static(p) => {
            r.verdict = "static".into();
            r.detail = p.detail.clone();
            r.reason = Some(p.detail);
            r.counts = p.counts;
        }
    }
    r
}

/// Runs one item (against `target` when it is per model), catching its errors as failures.
fn run_item(env: &Env, item: &Item, target: Option<&Target>, nobody: &Target) -> ItemRecord {
    let start = Instant::now();
    let outcome = match (items::implementation(&item.name), target) {
        (None, _) => Ok(Outcome::blocked("not implemented in this build")),
        (Some(_), Some(t)) if item.needs.model && t.path.is_err() => Ok(Outcome::blocked(format!(
            "model {} unavailable: {}",
            t.name,
            t.path.as_ref().err().unwrap_or(&String::new())
        ))),
        (Some(f), t) => f(env, t.unwrap_or(nobody)),
    };
    // An error is a failure naming it, not an undetected planted defect.
    let outcome = outcome.unwrap_or_else(|e| Outcome::Judged {
        planted: items::Proof::new(false, "not reached"),
        real: items::Proof::new(false, format!("error: {e:#}")),
    });
    record(item, target, outcome, start.elapsed().as_secs_f64())
}

fn print_item(r: &ItemRecord) {
    let verdict = match &r.reason {
        Some(reason) if r.verdict != "passed" => format!("{}: {reason}", r.verdict),
        _ => r.verdict.clone(),
    };
    println!("{:<28} {verdict}", r.name);
    if r.verdict == "passed" {
        println!("{:<28}   {}", "", r.detail);
    }
}

/// Run `ferrite gate release`; returns the exit code.
pub fn run(args: ReleaseArgs) -> anyhow::Result<i32> {
    let started = crate::bench::receipt::utc_now();
    if let Some(b) = &args.baseline {
        crate::outputs::check_not_an_input("--receipt", &args.receipt, &[("baseline", b)])?;
    }
    let manifest = manifest::load()?;
    let fixtures = Fixtures::scan(args.fixtures.as_deref())?;
    let baseline = args.baseline.as_deref().map(receipt::read).transpose()?;
    let names: Vec<String> = if args.models.is_empty() {
        DEFAULT_MODELS.iter().map(|s| (*s).to_owned()).collect()
    } else {
        args.models.clone()
    };
    let env = Env {
        fixtures,
        quick: args.quick,
        baseline,
        parts: Parts::library(),
        backend_lines: Default::default(),
    };
    println!(
        "gate release: lane {}{}, {} models, fixtures {} ({} files)",
        args.lane.name(),
        if args.quick { " (quick)" } else { "" },
        names.len(),
        env.fixtures.dir.display(),
        env.fixtures.files.len()
    );
    let mut not_requested = Vec::new();
    let mut wanted = Vec::new();
    for item in &manifest.items {
        if !args.lane.runs(item.lane) {
            not_requested.push(NotRequested {
                item: item.name.clone(),
                why: format!("lane {} not requested", item.lane.name()),
            });
        } else if args.quick && !item.quick {
            not_requested.push(NotRequested {
                item: item.name.clone(),
                why: "not in the --quick profile".into(),
            });
        } else {
            wanted.push(item);
        }
    }
    let per_model: u64 = wanted
        .iter()
        .filter(|i| i.per_model)
        .map(|i| i.needs.time_s)
        .sum();
    let once: u64 = wanted
        .iter()
        .filter(|i| !i.per_model)
        .map(|i| i.needs.time_s)
        .sum();
    println!(
        "{} items; the manifest estimates {} s on two cores for the full profile",
        wanted.len(),
        once + per_model * names.len() as u64
    );
    let nobody = Target::none();
    let mut records = Vec::new();
    for item in wanted.iter().filter(|i| !i.per_model) {
        let r = run_item(&env, item, None, &nobody);
        print_item(&r);
        records.push(r);
    }
    let mut models = Vec::new();
    for name in &names {
        let target = Target::resolve(name);
        for item in wanted.iter().filter(|i| i.per_model) {
            let r = run_item(&env, item, Some(&target), &nobody);
            print_item(&r);
            records.push(r);
        }
        models.push(ModelRecord {
            name: target.name.clone(),
            path: target.path.as_ref().ok().map(|p| p.display().to_string()),
            sha256: target.sha256.clone(),
            fixture_tag: target.tag.map(str::to_owned),
            unavailable: target.path.as_ref().err().cloned(),
        });
    }
    if args.require_all {
        for r in records.iter_mut().filter(|r| r.verdict == "blocked") {
            r.verdict = "failed".into();
            r.reason = Some(format!(
                "--require-all: blocked: {}",
                r.reason.as_deref().unwrap_or("")
            ));
        }
    }
    for n in &not_requested {
        println!("not requested: {} ({})", n.item, n.why);
    }
    let mut summary = Summary::default();
    for r in &records {
        match r.verdict.as_str() {
            "passed" => summary.passed += 1,
            "blocked" => summary.blocked += 1,
            "static" => summary.r#static += 1,
            _ => summary.failed += 1,
        }
    }
    let mut files = env.fixtures.files.clone();
    files.extend(env.fixtures.fallbacks.borrow().iter().cloned());
    let receipt = Receipt {
        format: receipt::FORMAT.into(),
        version: receipt::VERSION,
        ferrite_version: env!("CARGO_PKG_VERSION").into(),
        commit: crate::bench::receipt::git_commit(),
        binary_sha256: receipt::binary_sha256()?,
        started,
        args: std::env::args().collect(),
        lane: args.lane.name().into(),
        quick: args.quick,
        require_all: args.require_all,
        models,
        fixtures: FixtureRecord {
            dir: env.fixtures.dir.display().to_string(),
            set_sha256: env.fixtures.set_sha256(),
            files,
        },
        machine: receipt::machine(),
        backend_lines: env.backend_lines.borrow().clone(),
        items: records,
        not_requested,
        summary: summary.clone(),
    };
    receipt::write(&args.receipt, &receipt)?;
    println!("receipt: {}", args.receipt.display());
    println!("{summary}");
    Ok(i32::from(summary.failed > 0))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gate::items::Proof;

    fn item() -> Item {
        manifest::load().unwrap().items.remove(0)
    }

    #[test]
    fn an_undetected_planted_defect_fails_the_item_even_when_the_real_run_passes() {
        let outcome = Outcome::Judged {
            planted: Proof::new(true, "defect went unnoticed"),
            real: Proof::new(true, "fine"),
        };
        let r = record(&item(), None, outcome, 0.0);
        assert_eq!(r.verdict, "failed");
        assert_eq!(
            r.reason.as_deref(),
            Some("oracle did not detect the planted defect")
        );
        assert_eq!(r.planted.as_ref().map(|p| p.detected), Some(false));
    }

    #[test]
    fn a_detected_defect_leaves_the_verdict_to_the_real_run() {
        let judged = |real_ok| Outcome::Judged {
            planted: Proof::new(false, "caught"),
            real: Proof::new(real_ok, "the first difference").figure("ratio", f64::NAN),
        };
        let passed = record(&item(), None, judged(true), 0.0);
        assert_eq!((passed.verdict.as_str(), passed.reason), ("passed", None));
        let failed = record(&item(), None, judged(false), 0.0);
        assert_eq!(failed.verdict, "failed");
        assert_eq!(failed.reason.as_deref(), Some("the first difference"));
        // A NaN figure is named, not written where JSON cannot hold it.
        assert!(failed.figures.is_empty());
        assert_eq!(failed.nonfinite_figures, ["ratio=NaN"]);
        let blocked = record(&item(), None, Outcome::blocked("no device"), 0.0);
        assert_eq!(
            (blocked.verdict.as_str(), blocked.reason.as_deref()),
            ("blocked", Some("no device"))
        );
    }
}
