//! The gate items: what every item returns, what it may read (the [`Env`] of one release
//! run and the [`Target`] model), and the table from manifest names to implementations.
//!
//! Each item runs its oracle twice: first on a planted defect, which the oracle must
//! detect, then for real. An item never decides its own final verdict (the runner does, in
//! `release`), and never reads a test hook: the components a test replaces with defective
//! ones ([`Parts`]) are plain function pointers that the command always sets to the library's.

use std::cell::OnceCell;
use std::collections::BTreeMap;
use std::path::PathBuf;

use ferrite_engine::{SampleError, Sampler};
use ferrite_gguf::GgmlType;
use ferrite_kvstore::{Compat, KvStoreError, Snapshot};
use ferrite_model::Precision;
use ferrite_quant::QuantError;

use super::fixtures::Fixtures;
use super::receipt::Receipt;
use crate::backend::BackendArg;
use crate::run::{KvArg, Loaded, ModelArgs, PrecisionArg};

mod build;
mod constrained;
mod exact;
mod fidelity;
mod gpu;
mod hostile;
mod http;
mod lifecycle;
mod malformed;
mod nonfinite;
mod quant;
mod restart;
mod sampler;
mod speed;
mod text;

/// What one run of an oracle found.
#[derive(Debug, Default)]
pub struct Proof {
    /// The oracle's expectation held.
    pub ok: bool,
    /// One line: what was compared and, on failure, the first difference.
    pub detail: String,
    /// Measured values (bounds' inputs, speeds).
    pub figures: BTreeMap<String, f64>,
    /// Counted things (cases, lines, mutants, panics).
    pub counts: BTreeMap<String, u64>,
}

impl Proof {
    /// A proof with `ok` and `detail` and nothing measured yet.
    pub fn new(ok: bool, detail: impl Into<String>) -> Proof {
        Proof {
            ok,
            detail: detail.into(),
            ..Proof::default()
        }
    }

    /// Adds a figure.
    pub fn figure(mut self, key: &str, value: f64) -> Proof {
        self.figures.insert(key.to_owned(), value);
        self
    }

    /// Adds a count.
    pub fn count(mut self, key: &str, value: usize) -> Proof {
        self.counts.insert(key.to_owned(), value as u64);
        self
    }
}

/// What an item reports to the runner.
#[derive(Debug)]
pub enum Outcome {
    /// The oracle ran on the planted defect, then for real.
    Judged {
        /// The run on the planted defect (`ok` means the defect went unnoticed).
        planted: Proof,
        /// The real run.
        real: Proof,
    },
    /// A prerequisite is missing; `measured` keeps what was measured anyway.
    Blocked {
        /// Why the item could not be judged.
        reason: String,
        /// Figures taken before the missing prerequisite mattered.
        measured: Option<Proof>,
    },
    /// Checked by reading, not by running against a reference.
    Static(Proof),
}

impl Outcome {
    /// Blocked, with nothing measured.
    pub fn blocked(reason: impl Into<String>) -> Outcome {
        Outcome::Blocked {
            reason: reason.into(),
            measured: None,
        }
    }
}

/// A dequantizer: blocks of one type to f32 values.
pub type DequantizeFn = fn(GgmlType, &[u8], &mut [f32]) -> Result<(), QuantError>;

/// The library components whose defects the gate must catch. The command always uses
/// [`Parts::library`]; the gate's own tests put defective versions here.
#[derive(Clone, Copy)]
pub struct Parts {
    /// Draws one token from a logits row.
    pub sample: fn(&mut Sampler, &[f32]) -> Result<u32, SampleError>,
    /// Decodes and validates snapshot bytes.
    pub read_snapshot: fn(&[u8], &Compat) -> Result<Snapshot, KvStoreError>,
    /// Dequantizes blocks of one type.
    pub dequantize: DequantizeFn,
}

impl Parts {
    /// The components as the library provides them.
    pub fn library() -> Parts {
        Parts {
            sample: |s, row| s.sample(row, &[]).map(|x| x.token),
            read_snapshot: |bytes, want| {
                ferrite_kvstore::decode(&mut &bytes[..], bytes.len() as u64, want)
            },
            dequantize: ferrite_quant::dequantize,
        }
    }
}

/// Everything one `gate release` run shares between items.
pub struct Env {
    /// The fixture set.
    pub fixtures: Fixtures,
    /// The `--quick` profile.
    pub quick: bool,
    /// The `--baseline` receipt.
    pub baseline: Option<Receipt>,
    /// The components under test.
    pub parts: Parts,
    /// Every distinct backend line a loaded model reported.
    pub backend_lines: std::cell::RefCell<Vec<String>>,
}

impl Env {
    fn note_backend(&self, line: String) {
        let mut lines = self.backend_lines.borrow_mut();
        if !lines.contains(&line) {
            eprintln!("{line}");
            lines.push(line);
        }
    }
}

/// Context size of every session the items open: the longest fixture case and the NLL
/// windows (512 tokens) fit.
pub const GATE_CTX: usize = 1024;

/// One model the gate runs against.
pub struct Target {
    /// `-m` as given.
    pub name: String,
    /// The fixture tag (`smollm2`, `gemma3`) when the file is a known model's.
    pub tag: Option<&'static str>,
    /// The resolved file, or why it could not be resolved.
    pub path: Result<PathBuf, String>,
    /// sha256 of the file, lowercase hex.
    pub sha256: Option<String>,
    cpu: OnceCell<Loaded>,
    cpu_f32: OnceCell<Loaded>,
    cuda: OnceCell<Loaded>,
    server: OnceCell<http::GateServer>,
}

impl Target {
    /// A target for `-m name`; resolving (and pulling a known model) happens here.
    pub fn resolve(name: &str) -> Target {
        let path = crate::models::resolve(name).map_err(|e| format!("{e:#}"));
        let sha256 = path
            .as_ref()
            .ok()
            .and_then(|p| crate::bench::receipt::sha256_file(p).ok());
        let tag = crate::models::KNOWN_MODELS
            .iter()
            .find(|m| m.name == name || sha256.as_deref() == Some(m.sha256))
            .and_then(|m| fixture_tag(m.name));
        Target {
            name: name.to_owned(),
            tag,
            path,
            sha256,
            cpu: OnceCell::new(),
            cpu_f32: OnceCell::new(),
            cuda: OnceCell::new(),
            server: OnceCell::new(),
        }
    }

    /// The target of items that run once, without a model.
    pub fn none() -> Target {
        Target {
            name: String::new(),
            tag: None,
            path: Err("this item takes no model".into()),
            sha256: None,
            cpu: OnceCell::new(),
            cpu_f32: OnceCell::new(),
            cuda: OnceCell::new(),
            server: OnceCell::new(),
        }
    }

    /// The model file, or the reason it is missing as an error.
    pub fn path(&self) -> anyhow::Result<&PathBuf> {
        self.path
            .as_ref()
            .map_err(|e| anyhow::anyhow!("model {} unavailable: {e}", self.name))
    }

    /// The model loaded on the CPU at `precision` (f16 cache by default, f32 with f32).
    pub fn cpu(&self, env: &Env, precision: Precision) -> anyhow::Result<&Loaded> {
        let (cell, p, kv) = match precision {
            Precision::Default => (&self.cpu, PrecisionArg::Default, KvArg::F16),
            Precision::F32 => (&self.cpu_f32, PrecisionArg::F32, KvArg::F32),
        };
        self.load(env, cell, p, kv, BackendArg::Cpu)
    }

    /// The model loaded on the CUDA backend.
    pub fn cuda(&self, env: &Env) -> anyhow::Result<&Loaded> {
        self.load(
            env,
            &self.cuda,
            PrecisionArg::Default,
            KvArg::F16,
            BackendArg::Cuda,
        )
    }

    fn load<'a>(
        &self,
        env: &Env,
        cell: &'a OnceCell<Loaded>,
        precision: PrecisionArg,
        kv: KvArg,
        backend: BackendArg,
    ) -> anyhow::Result<&'a Loaded> {
        if let Some(l) = cell.get() {
            return Ok(l);
        }
        let args = ModelArgs {
            model: self.path()?.to_string_lossy().into_owned(),
            ctx: GATE_CTX,
            threads: None,
            precision,
            kv,
            backend,
            check_weights: false,
        };
        let loaded = Loaded::load(&args)?;
        env.note_backend(loaded.backend_line());
        Ok(cell.get_or_init(|| loaded))
    }

    /// The real server stack over this model, shared by the HTTP items: one slot (so a
    /// second request queues), context 512, prompts prefilled 32 tokens per step, no prefix
    /// cache (every request computes its own prompt).
    pub fn server(&self, env: &Env) -> anyhow::Result<&http::GateServer> {
        if let Some(s) = self.server.get() {
            return Ok(s);
        }
        let s = http::GateServer::start(
            self.path()?,
            http::ServerOpts {
                ctx: 512,
                parallel: 1,
                prefill_chunk: 32,
                kv_mem_bytes: 0,
                kv_disk_dir: None,
            },
        )?;
        // The engine loads the file itself; its backend line is the CPU model's.
        self.cpu(env, Precision::Default)?;
        Ok(self.server.get_or_init(|| s))
    }

    /// Whether the model's file carries a chat template the server can render.
    pub fn has_chat_template(&self, env: &Env) -> anyhow::Result<bool> {
        Ok(self
            .cpu(env, Precision::Default)?
            .tokenizer
            .chat_template_renderer()
            .is_ok())
    }

    /// The fixture tag, or why an item that needs fixtures is blocked without one.
    pub fn tag(&self) -> Result<&'static str, String> {
        self.tag.ok_or_else(|| {
            format!(
                "no reference fixtures for model {} (only smollm2 and gemma3 have them)",
                self.name
            )
        })
    }
}

/// The fixture tag of a known model name.
fn fixture_tag(name: &str) -> Option<&'static str> {
    match name {
        "smollm2-135m-instruct" => Some("smollm2"),
        "gemma3-270m" => Some("gemma3"),
        _ => None,
    }
}

/// An item: reads the environment and one target (ignored by items run once).
pub type ItemFn = fn(&Env, &Target) -> anyhow::Result<Outcome>;

/// The implementation of a manifest item, if this build has one.
pub fn implementation(name: &str) -> Option<ItemFn> {
    Some(match name {
        "build" => build::run,
        "quant-dequant" => quant::run,
        "tokenizer" => text::tokenizer,
        "template" => text::template,
        "sampler" => sampler::run,
        "logits-default" => fidelity::logits_default,
        "logits-f32" => fidelity::logits_f32,
        "nll-default" => fidelity::nll_default,
        "nll-f32" => fidelity::nll_f32,
        "batched" => exact::batched,
        "gguf-mutants" => hostile::run,
        "kv-snapshot" => exact::kv_snapshot,
        "speed" => speed::run,
        "http-malformed" => malformed::run,
        "json-nonfinite" => nonfinite::run,
        "cancellation" => lifecycle::run,
        "structured-output" => constrained::structured,
        "tool-call" => constrained::tool_call,
        "cuda-fidelity" => gpu::fidelity,
        "cuda-batched" => gpu::batched,
        _ => return None,
    })
}

/// The index of the largest value (ties: the lowest index), as the greedy sampler defines it.
pub fn argmax(row: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in row.iter().enumerate() {
        if v > row[best] {
            best = i;
        }
    }
    best as u32
}

/// Whether two logits rows are equal bit for bit.
pub fn same_bits(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

/// The test hooks of the issue: a defect planted in the sampler, the KV snapshot reader or a
/// dequantizer (a component in [`Parts`]) must make the matching item fail, while the
/// library's components pass it. The hooks live here, in tests, not behind a flag.
#[cfg(test)]
mod tests {
    use super::*;

    fn env(parts: Parts) -> Env {
        Env {
            fixtures: Fixtures::scan(None).expect("the repository's fixtures"),
            quick: true,
            baseline: None,
            parts,
            backend_lines: Default::default(),
        }
    }

    /// `(planted detected, real passed)` of a judged outcome.
    fn verdicts(outcome: Outcome) -> (bool, bool) {
        match outcome {
            Outcome::Judged { planted, real } => {
                println!("planted: {}\nreal: {}", planted.detail, real.detail);
                (!planted.ok, real.ok)
            }
            other => panic!("not judged: {other:?}"),
        }
    }

    #[test]
    fn a_sampler_that_picks_the_runner_up_fails_the_sampler_item() {
        let smollm2 = Target::resolve("smollm2-135m-instruct");
        assert_eq!(
            verdicts(sampler::run(&env(Parts::library()), &smollm2).unwrap()),
            (true, true)
        );
        let defective = Parts {
            // Greedy answers the second best: what an off-by-one in the argmax would do.
            sample: |s, row| {
                let best = s.sample(row, &[])?.token as usize;
                let mut masked = row.to_vec();
                masked[best] = f32::NEG_INFINITY;
                Ok(argmax(&masked))
            },
            ..Parts::library()
        };
        assert!(!verdicts(sampler::run(&env(defective), &smollm2).unwrap()).1);
    }

    #[test]
    fn a_dequantizer_off_by_one_bit_fails_the_quant_item() {
        let nobody = Target::none();
        assert_eq!(
            verdicts(quant::run(&env(Parts::library()), &nobody).unwrap()),
            (true, true)
        );
        let defective = Parts {
            // Q6_K values come out one ulp off: a rounding slip in one format.
            dequantize: |ty, src, dst| {
                ferrite_quant::dequantize(ty, src, dst)?;
                if ty == GgmlType::Q6_K {
                    dst[0] = f32::from_bits(dst[0].to_bits() ^ 1);
                }
                Ok(())
            },
            ..Parts::library()
        };
        assert!(!verdicts(quant::run(&env(defective), &nobody).unwrap()).1);
    }

    #[test]
    fn a_snapshot_reader_that_skips_its_checks_fails_the_kv_item() {
        let smollm2 = Target::resolve("smollm2-135m-instruct");
        let e = env(Parts::library());
        assert_eq!(
            verdicts(exact::kv_snapshot(&e, &smollm2).unwrap()),
            (true, true)
        );
        let defective = Parts {
            // Decodes whatever it is given as far as it goes and keeps no checksum: here, a
            // reader that hands back the payload of the first good file it saw.
            read_snapshot: |bytes, want| {
                static GOOD: std::sync::OnceLock<Snapshot> = std::sync::OnceLock::new();
                if let Some(s) = GOOD.get() {
                    return Ok(s.clone());
                }
                let s = ferrite_kvstore::decode(&mut &bytes[..], bytes.len() as u64, want)?;
                Ok(GOOD.get_or_init(|| s).clone())
            },
            ..Parts::library()
        };
        let e = env(defective);
        assert!(!verdicts(exact::kv_snapshot(&e, &smollm2).unwrap()).1);
        // The same item also fails when the reader corrupts what it restores.
        let flipping = Parts {
            read_snapshot: |bytes, want| {
                let mut s = ferrite_kvstore::decode(&mut &bytes[..], bytes.len() as u64, want)?;
                let last = s.state.kv.len() - 1;
                s.state.kv[last] ^= 0x40;
                Ok(s)
            },
            ..Parts::library()
        };
        assert!(!verdicts(exact::kv_snapshot(&env(flipping), &smollm2).unwrap()).1);
    }

    #[test]
    fn every_implemented_item_is_declared_in_the_manifest() {
        let m = crate::gate::manifest::load().unwrap();
        for name in [
            "build",
            "quant-dequant",
            "tokenizer",
            "template",
            "sampler",
            "logits-default",
            "logits-f32",
            "nll-default",
            "nll-f32",
            "batched",
            "gguf-mutants",
            "kv-snapshot",
            "speed",
            "http-malformed",
            "json-nonfinite",
            "cancellation",
            "structured-output",
            "tool-call",
            "cuda-fidelity",
            "cuda-batched",
        ] {
            assert!(implementation(name).is_some(), "{name}");
            assert!(
                m.items.iter().any(|i| i.name == name),
                "{name} not in the manifest"
            );
        }
        let declared = m
            .items
            .iter()
            .filter(|i| implementation(&i.name).is_some())
            .count();
        assert_eq!(
            declared, 20,
            "an implementation the list above does not name"
        );
    }
}
