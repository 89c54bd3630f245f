//! `ferrite bench --lookup`: prompt-lookup speculation against plain decoding on a repeat
//! workload, in one process and one session type, so the two speeds are comparable.
//!
//! Correctness comes first: every lookup run must give the plain run's tokens, or the
//! bench fails naming the first difference, before any speed is reported. Owns only this
//! comparison; the context sweep and its receipts are untouched.

use std::time::{Duration, Instant};

use anyhow::bail;
use ferrite_engine::speculate::{Lookup, Stats};
use ferrite_engine::{Flow, Sampler, SamplerConfig, generate_with};

use crate::run::Loaded;

/// What to measure.
pub struct Plan {
    /// Tokens generated per run (greedy; no stop token, so every run generates them all).
    pub gen_tokens: usize,
    /// Timed runs of each mode.
    pub runs: usize,
    /// Untimed runs of each mode first.
    pub warmup: usize,
    /// `--draft-max`.
    pub draft_max: usize,
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

/// One run: tokens, decode time (first token to last) and what speculation did.
fn once(
    loaded: &Loaded,
    prompt: &[u32],
    plan: &Plan,
    lookup: bool,
) -> anyhow::Result<(Vec<u32>, Duration, Stats)> {
    let mut session = loaded.session()?;
    let mut sampler = Sampler::new(SamplerConfig {
        max_tokens: plan.gen_tokens,
        ..SamplerConfig::default()
    })?;
    let mut proposer = lookup.then(|| Lookup::new(plan.draft_max)).transpose()?;
    let mut first = None;
    let g = generate_with(
        &mut session,
        &mut sampler,
        proposer
            .as_mut()
            .map(|l| l as &mut dyn ferrite_engine::speculate::Proposer),
        prompt,
        |_| {
            first.get_or_insert_with(Instant::now);
            Flow::Continue
        },
    )?;
    let decode = first.map_or(Duration::ZERO, |t| t.elapsed());
    Ok((g.tokens, decode, g.speculation))
}

/// Median, min and max.
fn stats(mut v: Vec<f64>) -> (f64, f64, f64) {
    v.sort_by(f64::total_cmp);
    (v[v.len() / 2], v[0], v[v.len() - 1])
}

/// Runs the comparison and prints it.
pub fn run(loaded: &Loaded, prompt: &[u32], plan: &Plan) -> anyhow::Result<()> {
    if loaded.cuda.is_some() {
        crate::run::check_cuda_lookup(true)?;
    }
    if prompt.len() + plan.gen_tokens > loaded.ctx {
        bail!(
            "the workload needs {} positions but --ctx is {}",
            prompt.len() + plan.gen_tokens,
            loaded.ctx
        );
    }
    let mut rates = [Vec::new(), Vec::new()];
    let mut spec = Stats::default();
    let mut reference: Option<Vec<u32>> = None;
    for i in 0..plan.warmup + plan.runs {
        for (mode, lookup) in [false, true].into_iter().enumerate() {
            let (tokens, decode, st) = once(loaded, prompt, plan, lookup)?;
            match &reference {
                None => reference = Some(tokens.clone()),
                Some(r) if *r != tokens => {
                    let at = r.iter().zip(&tokens).position(|(a, b)| a != b);
                    bail!("lookup output differs from plain decoding at token {at:?}");
                }
                Some(_) => {}
            }
            if i < plan.warmup {
                continue;
            }
            rates[mode].push(tokens.len().saturating_sub(1) as f64 / decode.as_secs_f64());
            if lookup {
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
    println!("lookup decode tok/s median {fast:.1} min {fast_min:.1} max {fast_max:.1}");
    println!(
        "lookup (draft-max {}): proposed {} accepted {} ({:.1} %), {:.2} tokens per step; \
         speed-up {:.2}x",
        plan.draft_max,
        spec.proposed,
        spec.accepted,
        spec.acceptance() * 100.0,
        spec.tokens_per_step(generated),
        fast / plain
    );
    Ok(())
}
