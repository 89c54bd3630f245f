//! Items `logits-default`, `logits-f32`, `nll-default`, `nll-f32` (and the bounds
//! `cuda-fidelity` shares): whole-model fidelity against the transformers fixtures through
//! `ferrite-engine`'s scorer, with the bounds of the project's own tests
//! (crates/cli/tests/score.rs), so a held-out fixture set gets the same verdicts.
//!
//! The planted defect is [`Scaled`]: the same logits rows multiplied by 1.3 (direction kept,
//! magnitude perturbed), which every bound here must notice. Nothing here may loosen a bound
//! for `--quick`; the quick profile scores fewer cases or windows, never more leniently.

use std::path::Path;

use anyhow::Context;
use ferrite_engine::score::{self, LogitsCase, ScoreMode, ScoreSummary};
use ferrite_engine::{LogitsSource, ScoreError};
use ferrite_model::{Precision, Session};
use serde_json::Value;

use super::{Env, GATE_CTX, Outcome, Proof, Target};

/// Factor of the planted perturbation.
const PLANTED_SCALE: f32 = 1.3;

/// A logits source whose rows are `inner`'s multiplied by a factor: the planted defect.
pub struct Scaled<'a, S: ?Sized> {
    /// The real source.
    pub inner: &'a mut S,
    /// The buffer handed out.
    pub out: Vec<f32>,
}

impl<S: LogitsSource + ?Sized> LogitsSource for Scaled<'_, S> {
    fn n_vocab(&self) -> usize {
        self.inner.n_vocab()
    }

    fn reset(&mut self) {
        self.inner.reset();
    }

    fn eval(&mut self, tokens: &[u32], from: usize) -> Result<&[f32], ScoreError> {
        let rows = self.inner.eval(tokens, from)?;
        self.out.clear();
        self.out.extend(rows.iter().map(|&x| x * PLANTED_SCALE));
        Ok(&self.out)
    }
}

/// The acceptance bounds of a precision setting.
#[derive(Clone, Copy)]
pub enum Bounds {
    /// Default precision: top-1 ≥ 0.97, mean |Δ| ≤ 0.08, first token in ≥ 24/25 of cases.
    Default,
    /// f32 weights and cache: top-1 = 1, max |Δ| ≤ 2e-3.
    F32,
}

impl Bounds {
    /// Whether `s` meets the bounds, and a line saying which figure decided.
    pub fn judge(self, s: &ScoreSummary) -> (bool, String) {
        let figures = format!(
            "{} cases: top1 {:.4}, mean |d logprob| {:.5}, max {:.5}, first token {}/{}",
            s.cases,
            s.top1_agreement,
            s.mean_abs_dlogprob,
            s.max_abs_dlogprob,
            s.first_token_match,
            s.cases
        );
        let finite = s.mean_abs_dlogprob.is_finite() && s.max_abs_dlogprob.is_finite();
        let ok = finite
            && s.cases > 0
            && match self {
                Bounds::Default => {
                    s.top1_agreement >= 0.97
                        && s.mean_abs_dlogprob <= 0.08
                        && s.first_token_match * 25 >= s.cases * 24
                }
                Bounds::F32 => s.top1_agreement == 1.0 && s.max_abs_dlogprob <= 2e-3,
            };
        (ok, figures)
    }
}

/// Every case of every `logits-<tag>-*.jsonl` of the target's fixture tag; with `quick`,
/// the first `quick_cases` of them. `Err` is the reason the item is blocked.
pub fn logits_cases(
    env: &Env,
    t: &Target,
    quick_cases: usize,
) -> anyhow::Result<Result<Vec<LogitsCase>, String>> {
    let tag = match t.tag() {
        Ok(tag) => tag,
        Err(reason) => return Ok(Err(reason)),
    };
    let pattern = format!("logits-{tag}-*.jsonl");
    let files = env.fixtures.matching(&pattern);
    if files.is_empty() {
        return Ok(Err(format!(
            "no {pattern} in {}",
            env.fixtures.dir.display()
        )));
    }
    let mut cases = Vec::new();
    for f in &files {
        let text =
            std::fs::read_to_string(f).with_context(|| format!("reading {}", f.display()))?;
        let parsed = score::parse_logits_fixture(&text)
            .with_context(|| format!("parsing {}", f.display()))?;
        anyhow::ensure!(!parsed.is_empty(), "fixture {} has no cases", f.display());
        cases.extend(parsed);
    }
    if env.quick {
        cases.truncate(quick_cases);
    }
    Ok(Ok(cases))
}

/// Scores `cases` through `src` and judges them; `planted` first scales the rows.
pub fn score_cases<S: LogitsSource + ?Sized>(
    src: &mut S,
    cases: &[LogitsCase],
    mode: ScoreMode,
    bounds: Bounds,
) -> anyhow::Result<Proof> {
    let mut scores = Vec::with_capacity(cases.len());
    for case in cases {
        scores.push(
            score::score_case(src, case, mode)
                .with_context(|| format!("scoring case {}", case.id))?,
        );
    }
    let s = score::summarize(&scores);
    let (ok, detail) = bounds.judge(&s);
    Ok(Proof::new(ok, detail)
        .figure("top1_agreement", s.top1_agreement)
        .figure("mean_abs_dlogprob", s.mean_abs_dlogprob)
        .figure("max_abs_dlogprob", s.max_abs_dlogprob)
        .figure("nll", s.nll)
        .figure("ref_nll", s.ref_nll)
        .count("cases", s.cases)
        .count("first_token_match", s.first_token_match))
}

/// Runs the planted and the real scoring of `cases` through `src`.
pub fn judged<S: LogitsSource + ?Sized>(
    src: &mut S,
    cases: &[LogitsCase],
    mode: ScoreMode,
    bounds: Bounds,
) -> anyhow::Result<Outcome> {
    let mut scaled = Scaled {
        inner: &mut *src,
        out: Vec::new(),
    };
    let planted = score_cases(&mut scaled, &cases[..1], mode, bounds)?;
    let real = score_cases(src, cases, mode, bounds)?;
    Ok(Outcome::Judged { planted, real })
}

fn logits(env: &Env, t: &Target, precision: Precision, bounds: Bounds) -> anyhow::Result<Outcome> {
    let cases = match logits_cases(env, t, 3)? {
        Ok(c) => c,
        Err(reason) => return Ok(Outcome::blocked(reason)),
    };
    let l = t.cpu(env, precision)?;
    let mut s = Session::new(&l.model, &l.pool, GATE_CTX, l.kv)?;
    judged(&mut s, &cases, ScoreMode::Prefill, bounds)
}

/// Item `logits-default`.
pub fn logits_default(env: &Env, t: &Target) -> anyhow::Result<Outcome> {
    logits(env, t, Precision::Default, Bounds::Default)
}

/// Item `logits-f32`.
pub fn logits_f32(env: &Env, t: &Target) -> anyhow::Result<Outcome> {
    logits(env, t, Precision::F32, Bounds::F32)
}

/// Item `nll-default`.
pub fn nll_default(env: &Env, t: &Target) -> anyhow::Result<Outcome> {
    nll(env, t, Precision::Default)
}

/// Item `nll-f32`.
pub fn nll_f32(env: &Env, t: &Target) -> anyhow::Result<Outcome> {
    nll(env, t, Precision::F32)
}

/// The NLL fixture's fields this item reads.
struct NllFixture {
    window: usize,
    n_tokens: usize,
    n_scored: usize,
    first_ids: Vec<u32>,
    text_sha256: String,
    perplexity: f64,
    first_window_nll: f64,
}

fn read_nll(path: &Path) -> anyhow::Result<NllFixture> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let v: Value =
        serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
    let num = |key: &str| {
        v.get(key)
            .and_then(Value::as_u64)
            .and_then(|n| usize::try_from(n).ok())
            .with_context(|| format!("{}: no count {key:?}", path.display()))
    };
    let first_window_nll = v
        .get("windows")
        .and_then(|w| w.get(0))
        .and_then(|w| w.get("mean_nll"))
        .and_then(Value::as_f64)
        .with_context(|| format!("{}: no windows[0].mean_nll", path.display()))?;
    Ok(NllFixture {
        window: num("window")?,
        n_tokens: num("n_tokens")?,
        n_scored: num("n_scored_tokens")?,
        first_ids: v
            .get("first_ids")
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(|x| x.as_u64().and_then(|x| u32::try_from(x).ok()))
                    .collect()
            })
            .with_context(|| format!("{}: no first_ids", path.display()))?,
        text_sha256: v
            .get("text_file_sha256")
            .and_then(Value::as_str)
            .with_context(|| format!("{}: no text_file_sha256", path.display()))?
            .to_owned(),
        perplexity: v
            .get("perplexity")
            .and_then(Value::as_f64)
            .with_context(|| format!("{}: no perplexity", path.display()))?,
        first_window_nll,
    })
}

/// Perplexity within 1 % of the reference's (the bound of crates/cli/tests/score.rs).
fn ppl_proof(got: &score::Perplexity, want_ppl: f64, want_tokens: usize) -> Proof {
    let ratio = got.ppl / want_ppl;
    let ok = ratio.is_finite() && (ratio - 1.0).abs() <= 0.01 && got.tokens == want_tokens;
    Proof::new(
        ok,
        format!(
            "perplexity {:.4} vs reference {want_ppl:.4} (ratio {ratio:.5}) over {} tokens \
             (reference {want_tokens})",
            got.ppl, got.tokens
        ),
    )
    .figure("ppl", got.ppl)
    .figure("ref_ppl", want_ppl)
    .figure("ratio", ratio)
    .count("windows", got.windows)
    .count("tokens", got.tokens)
}

fn nll(env: &Env, t: &Target, precision: Precision) -> anyhow::Result<Outcome> {
    let tag = match t.tag() {
        Ok(tag) => tag,
        Err(reason) => return Ok(Outcome::blocked(reason)),
    };
    let name = format!("nll-{tag}.json");
    let Some(path) = env.fixtures.matching(&name).into_iter().next() else {
        return Ok(Outcome::blocked(format!(
            "no {name} in {}",
            env.fixtures.dir.display()
        )));
    };
    let fx = read_nll(&path)?;
    let text_path = env.fixtures.file_or_repo("GPL-3.txt")?;
    let text_sha = super::super::fixtures::sha256_hex(&text_path)?;
    if text_sha != fx.text_sha256 {
        return Ok(Outcome::blocked(format!(
            "{} (sha256 {text_sha}) is not the text {name} scored ({})",
            text_path.display(),
            fx.text_sha256
        )));
    }
    let l = t.cpu(env, precision)?;
    let text = std::fs::read_to_string(&text_path)?;
    let ids = l.tokenizer.encode(&text, true, true);
    // The tokenization is the first thing the reference and we must share.
    if ids.len() != fx.n_tokens || !ids.starts_with(&fx.first_ids) {
        let real = Proof::new(
            false,
            format!(
                "the text tokenizes to {} ids (reference {}), first ids {:?} (reference {:?})",
                ids.len(),
                fx.n_tokens,
                &ids[..ids.len().min(fx.first_ids.len())],
                fx.first_ids
            ),
        );
        let planted = Proof::new(false, "not run: the tokenization already differs");
        return Ok(Outcome::Judged { planted, real });
    }
    anyhow::ensure!(
        fx.window >= 2 && fx.window <= GATE_CTX && ids.len() >= fx.window,
        "{name}: window {} does not fit",
        fx.window
    );
    let mut s = Session::new(&l.model, &l.pool, GATE_CTX, l.kv)?;
    let first = &ids[..fx.window];
    let first_ppl = fx.first_window_nll.exp();
    let mut scaled = Scaled {
        inner: &mut s,
        out: Vec::new(),
    };
    let planted = ppl_proof(
        &score::perplexity(&mut scaled, first, fx.window)?,
        first_ppl,
        fx.window - 1,
    );
    let real = if env.quick {
        ppl_proof(
            &score::perplexity(&mut s, first, fx.window)?,
            first_ppl,
            fx.window - 1,
        )
    } else {
        ppl_proof(
            &score::perplexity(&mut s, &ids, fx.window)?,
            fx.perplexity,
            fx.n_scored,
        )
    };
    Ok(Outcome::Judged { planted, real })
}
