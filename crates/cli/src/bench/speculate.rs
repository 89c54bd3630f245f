//! `ferrite bench --lookup` and `ferrite bench --draft-model`: speculation against plain
//! decoding on a repeat workload, in one process and one session type, so the two speeds
//! are comparable.
//!
//! Correctness comes first: every speculative run must give the plain run's tokens, or the
//! bench fails naming the first difference, before any speed is reported. Owns only this
//! comparison; the context sweep and its receipts are untouched.

use std::time::{Duration, Instant};

use anyhow::bail;
use ferrite_engine::speculate::{AdaptiveStats, Stats};
use ferrite_engine::{Flow, Sampler, SamplerConfig, generate_with};
use ferrite_model::Model;

use crate::run::Loaded;
use crate::run::speculate::Speculator;

/// What to measure.
pub struct Plan<'a> {
    /// Tokens generated per run (greedy; no stop token, so every run generates them all).
    pub gen_tokens: usize,
    /// Timed runs of each mode.
    pub runs: usize,
    /// Untimed runs of each mode first.
    pub warmup: usize,
    /// `--lookup`.
    pub lookup: bool,
    /// `--draft-model`, loaded.
    pub draft: Option<&'a Model>,
    /// `--draft-max`.
    pub draft_max: usize,
}

/// What one speculative run did.
#[derive(Default)]
struct Speculation {
    stats: Stats,
    adaptive: AdaptiveStats,
    failure: Option<String>,
}

/// The workload: a passage of `text` given twice, then its first tokens again, so that the
/// greedy continuation tends to repeat what the context holds.
pub fn repeat_prompt(text_tokens: &[u32]) -> Vec<u32> {
    let passage = &text_tokens[..text_tokens.len().min(160)];
    let mut p = passage.to_vec();
    p.extend_from_slice(passage);
    p.extend_from_slice(&passage[..passage.len().min(8)]);
    p
}

/// One run, speculating when `speculate`: tokens, decode time (first token to last) and
/// what speculation did.
fn once(
    loaded: &Loaded,
    prompt: &[u32],
    plan: &Plan,
    speculate: bool,
) -> anyhow::Result<(Vec<u32>, Duration, Speculation)> {
    let mut session = loaded.session()?;
    let mut sampler = Sampler::new(SamplerConfig {
        max_tokens: plan.gen_tokens,
        ..SamplerConfig::default()
    })?;
    let mut speculator = match speculate {
        true => Speculator::new(loaded, plan.lookup, plan.draft, plan.draft_max)?,
        false => None,
    };
    let mut first = None;
    let g = generate_with(
        &mut session,
        &mut sampler,
        speculator.as_mut().map(Speculator::proposer),
        prompt,
        |_| {
            first.get_or_insert_with(Instant::now);
            Flow::Continue
        },
    )?;
    let decode = first.map_or(Duration::ZERO, |t| t.elapsed());
    let spec = Speculation {
        stats: g.speculation,
        adaptive: speculator
            .as_ref()
            .map(Speculator::adaptive)
            .unwrap_or_default(),
        failure: speculator.as_ref().and_then(Speculator::failure),
    };
    Ok((g.tokens, decode, spec))
}

/// Median, min and max.
fn stats(mut v: Vec<f64>) -> (f64, f64, f64) {
    v.sort_by(f64::total_cmp);
    (v[v.len() / 2], v[0], v[v.len() - 1])
}

/// Runs the comparison and prints it.
pub fn run(loaded: &Loaded, prompt: &[u32], plan: &Plan) -> anyhow::Result<()> {
    let name = if plan.lookup { "lookup" } else { "draft" };
    crate::run::speculate::check_cuda_speculation(loaded.cuda.is_some(), name)?;
    if prompt.len() + plan.gen_tokens > loaded.ctx {
        bail!(
            "the workload needs {} positions but --ctx is {}",
            prompt.len() + plan.gen_tokens,
            loaded.ctx
        );
    }
    let mut rates = [Vec::new(), Vec::new()];
    let mut spec = Speculation::default();
    let mut reference: Option<Vec<u32>> = None;
    for i in 0..plan.warmup + plan.runs {
        for (mode, speculate) in [false, true].into_iter().enumerate() {
            let (tokens, decode, st) = once(loaded, prompt, plan, speculate)?;
            match &reference {
                None => reference = Some(tokens.clone()),
                Some(r) if *r != tokens => {
                    let at = r.iter().zip(&tokens).position(|(a, b)| a != b);
                    bail!("{name} output differs from plain decoding at token {at:?}");
                }
                Some(_) => {}
            }
            if i < plan.warmup {
                continue;
            }
            rates[mode].push(tokens.len().saturating_sub(1) as f64 / decode.as_secs_f64());
            if speculate {
                spec = st;
            }
        }
    }
    let generated = reference.map_or(0, |r| r.len());
    println!(
        "workload: repeat, prompt {} tokens, {generated} generated (greedy), {} timed runs \
         after {} warmup; outputs identical in every run",
        prompt.len(),
        plan.runs,
        plan.warmup
    );
    let (plain, plain_min, plain_max) = stats(rates[0].clone());
    let (fast, fast_min, fast_max) = stats(rates[1].clone());
    println!("plain  decode tok/s median {plain:.1} min {plain_min:.1} max {plain_max:.1}");
    println!("{name:<6} decode tok/s median {fast:.1} min {fast_min:.1} max {fast_max:.1}");
    let (st, ad) = (&spec.stats, &spec.adaptive);
    println!(
        "{name} (draft-max {}): proposed {} accepted {} ({:.1} %), {:.2} tokens per step over \
         {} steps, off {} steps, {} probes, {:.2} tokens asked per asking step; speed-up \
         {:.2}x",
        plan.draft_max,
        st.proposed,
        st.accepted,
        st.acceptance() * 100.0,
        st.tokens_per_step(generated),
        st.steps,
        ad.off_steps,
        ad.probes,
        ad.asked as f64 / ad.asking_steps.max(1) as f64,
        fast / plain
    );
    if let Some(failure) = spec.failure {
        println!("note: {failure}");
    }
    Ok(())
}
