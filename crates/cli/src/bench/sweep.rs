//! The timed loop of `ferrite bench`: for each batch size and run, walk the frontiers,
//! prefill up to each (extending the previous frontier, or from 0 with `--cold`), then decode
//! a fixed number of tokens; keep the four clocks apart.
//!
//! Batch 1 drives one session of the chosen backend. A batch of B drives B sessions
//! stepped together, and the rates are aggregate over the B sequences: on the CPU and on
//! the CUDA contract pass through [`ferrite_model::Batch`] (every step evaluates one token,
//! or one prefill chunk, of each sequence in a single forward pass); on the CUDA model
//! through [`CudaBatch`], as `serve --backend cuda` decodes (one token of each sequence per
//! step; prompts prefill session by session).
//!
//! Decoding never stops early on an end-of-turn token: every run evaluates exactly the same
//! number of tokens, so runs are comparable. Tokens generated at one frontier are dropped
//! (`truncate`) before the next frontier's prefill, so the KV cache always holds prompt
//! tokens only.

use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use ferrite_cuda::{CudaBatch, CudaSession};
use ferrite_engine::{AnySession, Sampler, SamplerConfig, Timeline};
use ferrite_model::{Batch, Logits, PREFILL_CHUNK, Session, Weights, check_kv_memory};
use indicatif::{ProgressBar, ProgressStyle};

use super::receipt::COLUMNS;
use crate::backend::{CudaLoaded, CudaPath};
use crate::run::Loaded;

/// What to measure.
pub struct Plan {
    /// Context frontiers, increasing.
    pub frontiers: Vec<usize>,
    /// Tokens decoded at each frontier.
    pub gen_tokens: usize,
    /// Timed runs.
    pub runs: usize,
    /// Untimed runs first.
    pub warmup: usize,
    /// Prefill from 0 at every frontier.
    pub cold: bool,
    /// Feed prompt tokens while decoding.
    pub teacher_forced: bool,
}

/// The frontiers from `start` to `max` (inclusive; `max` is appended when the steps skip it).
pub fn frontiers(
    start: usize,
    max: usize,
    mul: Option<usize>,
    incr: Option<usize>,
) -> anyhow::Result<Vec<usize>> {
    if start == 0 || max < start {
        bail!("need 0 < --ctx-start <= --ctx-max (got {start} and {max})");
    }
    let step: Box<dyn Fn(usize) -> usize> = match (mul, incr) {
        (Some(_), Some(_)) => bail!("--step-mul and --step-incr exclude each other"),
        (None, Some(0)) => bail!("--step-incr must be at least 1"),
        (None, Some(k)) => Box::new(move |f| f + k),
        (Some(k), None) if k < 2 => bail!("--step-mul must be at least 2"),
        (Some(k), None) => Box::new(move |f| f.saturating_mul(k)),
        (None, None) => Box::new(|f| f.saturating_mul(2)),
    };
    let mut out = vec![start];
    let mut f = start;
    loop {
        f = step(f);
        if f >= max {
            break;
        }
        out.push(f);
    }
    if *out.last().unwrap_or(&0) != max {
        out.push(max);
    }
    Ok(out)
}

/// One frontier's clocks in one run.
#[derive(Clone, Copy)]
struct Sample {
    ttft: Duration,
    prefill_tps: f64,
    decode_tps: f64,
}

/// What one batch size's sweep drives: one session, or several stepped together.
enum Lane<'m> {
    One(AnySession<'m>),
    Cpu(Box<Stepped<'m, ferrite_cpu::CpuBackend<'m>>>),
    Pass(Box<Stepped<'m, ferrite_cuda::CudaOps>>),
    Device {
        sessions: Vec<CudaSession<'m>>,
        batch: Box<CudaBatch<'m>>,
    },
}

impl<'m> Lane<'m> {
    fn new(loaded: &'m Loaded, batch: usize) -> anyhow::Result<Lane<'m>> {
        if batch == 1 {
            return Ok(Lane::One(loaded.any_session()?));
        }
        let n = |what: &str| format!("--batch {batch}: {what}");
        Ok(match &loaded.cuda {
            None => Lane::Cpu(Stepped::new(
                (0..batch)
                    .map(|_| loaded.session())
                    .collect::<anyhow::Result<Vec<_>>>()?,
            )?),
            Some(CudaLoaded {
                path: CudaPath::Pass(ops),
                ..
            }) => Lane::Pass(Stepped::new(
                (0..batch)
                    .map(|_| Session::on(&loaded.model, ops.clone(), loaded.ctx, loaded.kv))
                    .collect::<Result<Vec<_>, _>>()
                    .with_context(|| n("contract-pass sessions on the device"))?,
            )?),
            Some(CudaLoaded {
                path: CudaPath::Model(m),
                ..
            }) => Lane::Device {
                sessions: (0..batch)
                    .map(|_| CudaSession::new(m, loaded.ctx))
                    .collect::<Result<Vec<_>, _>>()
                    .with_context(|| n("sessions on the device"))?,
                batch: Box::new(CudaBatch::new(m, batch).with_context(|| n("device batch"))?),
            },
        })
    }

    fn truncate(&mut self, n: usize) {
        match self {
            Lane::One(s) => s.truncate(n),
            Lane::Cpu(s) => s.truncate(n),
            Lane::Pass(s) => s.truncate(n),
            Lane::Device { sessions, .. } => sessions.iter_mut().for_each(|s| s.truncate(n)),
        }
    }

    /// Sequences stepped together.
    fn width(&self) -> usize {
        match self {
            Lane::One(_) => 1,
            Lane::Cpu(s) => s.sessions.len(),
            Lane::Pass(s) => s.sessions.len(),
            Lane::Device { sessions, .. } => sessions.len(),
        }
    }

    /// Evaluates `tokens` in every sequence and samples each one's next token.
    fn eval_sample(&mut self, sampler: &mut Sampler, tokens: &[u32]) -> anyhow::Result<Vec<u32>> {
        match self {
            Lane::One(s) => Ok(vec![
                ferrite_engine::eval_sample(s, sampler, tokens, &[])?.token,
            ]),
            Lane::Cpu(s) => s.eval_sample(sampler, tokens),
            Lane::Pass(s) => s.eval_sample(sampler, tokens),
            Lane::Device { sessions, .. } => sessions
                .iter_mut()
                .map(|s| Ok(sampler.next_token(&s.eval(tokens)?, &[])?))
                .collect(),
        }
    }

    /// Feeds token `feed[i]` to sequence `i` and samples each one's next token.
    fn step(&mut self, sampler: &mut Sampler, feed: &[u32]) -> anyhow::Result<Vec<u32>> {
        match self {
            Lane::One(_) => self.eval_sample(sampler, feed),
            Lane::Cpu(s) => s.step(sampler, feed),
            Lane::Pass(s) => s.step(sampler, feed),
            Lane::Device { sessions, batch } => {
                let mut refs: Vec<&mut CudaSession<'m>> = sessions.iter_mut().collect();
                batch
                    .step(&mut refs, feed)?
                    .iter()
                    .map(|row| Ok(sampler.next_token(row, &[])?))
                    .collect()
            }
        }
    }
}

/// Sessions of one backend stepped together through one [`Batch`].
struct Stepped<'m, B: Weights + Clone> {
    sessions: Vec<Session<'m, B>>,
    batch: Batch<B::Buf, B::Angles>,
}

impl<'m, B: Weights + Clone> Stepped<'m, B> {
    fn new(sessions: Vec<Session<'m, B>>) -> anyhow::Result<Box<Self>> {
        let batch = Batch::new(PREFILL_CHUNK.max(sessions.len()))?;
        Ok(Box::new(Stepped { sessions, batch }))
    }

    fn truncate(&mut self, n: usize) {
        self.sessions.iter_mut().for_each(|s| s.truncate(n));
    }

    /// Evaluates `tokens` in every sequence, each step giving every sequence an equal share
    /// of the batch's rows, and samples each one's next token.
    fn eval_sample(&mut self, sampler: &mut Sampler, tokens: &[u32]) -> anyhow::Result<Vec<u32>> {
        let share = (self.batch.max_rows() / self.sessions.len()).max(1);
        let mut next = Vec::new();
        for piece in tokens.chunks(share) {
            let mut refs: Vec<&mut Session<'m, B>> = self.sessions.iter_mut().collect();
            let inputs = vec![piece; refs.len()];
            next = sample_rows(sampler, self.batch.step(&mut refs, &inputs)?)?;
        }
        Ok(next)
    }

    /// Feeds token `feed[i]` to sequence `i` and samples each one's next token.
    fn step(&mut self, sampler: &mut Sampler, feed: &[u32]) -> anyhow::Result<Vec<u32>> {
        let mut refs: Vec<&mut Session<'m, B>> = self.sessions.iter_mut().collect();
        let inputs: Vec<&[u32]> = feed.chunks(1).collect();
        sample_rows(sampler, self.batch.step(&mut refs, &inputs)?)
    }
}

/// The next token of every sequence of a batched step, one per logits row.
fn sample_rows(sampler: &mut Sampler, logits: Logits<'_>) -> anyhow::Result<Vec<u32>> {
    (0..logits.n_rows())
        .map(|r| {
            let row = logits.row(r).context("batch returned too few rows")?;
            Ok(sampler.next_token(row, &[])?)
        })
        .collect()
}

/// Runs the plan for every batch size; returns one receipt row per (frontier, batch).
pub fn run(
    loaded: &Loaded,
    prompt: &[u32],
    plan: &Plan,
    batches: &[usize],
) -> anyhow::Result<Vec<Vec<f64>>> {
    // Every size is checked before any is measured, so that a run never ends in an error
    // after minutes of measuring. (CUDA sessions keep their caches on the device.)
    for &b in batches.iter().filter(|_| loaded.cuda.is_none()) {
        check_kv_memory(loaded.model.config(), loaded.kv, b, loaded.ctx)
            .with_context(|| format!("--batch {b}"))?;
    }
    let mut rows = Vec::new();
    for &b in batches {
        let mut lane = Lane::new(loaded, b)?;
        rows.extend(run_lane(loaded, &mut lane, prompt, plan)?);
    }
    Ok(rows)
}

fn run_lane(
    loaded: &Loaded,
    lane: &mut Lane<'_>,
    prompt: &[u32],
    plan: &Plan,
) -> anyhow::Result<Vec<Vec<f64>>> {
    let mut sampler = Sampler::new(SamplerConfig::default())?;
    let total = (plan.warmup + plan.runs) * plan.frontiers.len();
    let bar = ProgressBar::new(total as u64);
    bar.set_style(
        ProgressStyle::with_template("{prefix} [{bar:30}] {pos}/{len} {msg} ({elapsed})")
            .context("progress bar template")?
            .progress_chars("=> "),
    );
    let mut samples: Vec<Vec<Sample>> = vec![Vec::new(); plan.frontiers.len()];
    for run in 0..plan.warmup + plan.runs {
        let warm = run < plan.warmup;
        bar.set_prefix(if warm {
            format!("batch {} warmup {}/{}", lane.width(), run + 1, plan.warmup)
        } else {
            format!(
                "batch {} run {}/{}",
                lane.width(),
                run + 1 - plan.warmup,
                plan.runs
            )
        });
        lane.truncate(0);
        let mut prev = 0;
        for (i, &frontier) in plan.frontiers.iter().enumerate() {
            bar.set_message(format!("ctx {frontier}"));
            let from = if plan.cold { 0 } else { prev };
            lane.truncate(from);
            let s = one_frontier(lane, &mut sampler, prompt, from, frontier, plan)?;
            if !warm {
                samples[i].push(s);
            }
            prev = frontier;
            bar.inc(1);
        }
    }
    bar.finish_and_clear();
    let load_ms = loaded.load_time.as_secs_f64() * 1e3;
    let mut prev = 0;
    let mut rows = Vec::new();
    for (&frontier, s) in plan.frontiers.iter().zip(&samples) {
        let from = if plan.cold { 0 } else { prev };
        prev = frontier;
        let stats = |f: &dyn Fn(&Sample) -> f64| -> [f64; 3] {
            let v: Vec<f64> = s.iter().map(f).collect();
            summary(&v)
        };
        let ttft = stats(&|s| s.ttft.as_secs_f64() * 1e3);
        let prefill = stats(&|s| s.prefill_tps);
        let decode = stats(&|s| s.decode_tps);
        let mut row = vec![
            frontier as f64,
            lane.width() as f64,
            from as f64,
            (frontier - from) as f64,
            plan.gen_tokens as f64,
            plan.runs as f64,
            load_ms,
        ];
        row.extend(ttft);
        row.extend(prefill);
        row.extend(decode);
        debug_assert_eq!(row.len(), COLUMNS.len());
        rows.push(row);
    }
    Ok(rows)
}

/// Prefill `prompt[from..frontier]` in every sequence, then decode `gen_tokens` tokens;
/// rates count the tokens of all sequences. The prefill clock includes sampling the first
/// token (as time to first token does).
fn one_frontier(
    lane: &mut Lane<'_>,
    sampler: &mut Sampler,
    prompt: &[u32],
    from: usize,
    frontier: usize,
    plan: &Plan,
) -> anyhow::Result<Sample> {
    let width = lane.width();
    let start = Instant::now();
    let mut next = lane.eval_sample(sampler, &prompt[from..frontier])?;
    let ttft = start.elapsed();
    let decode_start = Instant::now();
    for i in 0..plan.gen_tokens {
        if plan.teacher_forced {
            next.fill(prompt[frontier + i]);
        }
        next = lane.step(sampler, &next)?;
    }
    let decode = decode_start.elapsed();
    Ok(Sample {
        ttft,
        prefill_tps: rate(width * (frontier - from), ttft),
        decode_tps: rate(width * plan.gen_tokens, decode),
    })
}

fn rate(n: usize, d: Duration) -> f64 {
    n as f64 / d.as_secs_f64().max(1e-9)
}

/// Median, min and max (the median of an even count is the mean of the middle two).
fn summary(v: &[f64]) -> [f64; 3] {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let n = s.len();
    if n == 0 {
        return [f64::NAN; 3];
    }
    let median = if n % 2 == 1 {
        s[n / 2]
    } else {
        (s[n / 2 - 1] + s[n / 2]) / 2.0
    };
    [median, s[0], s[n - 1]]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frontiers_step_and_always_end_at_max() {
        assert_eq!(
            frontiers(512, 4096, None, None).unwrap(),
            [512, 1024, 2048, 4096]
        );
        assert_eq!(frontiers(32, 100, Some(3), None).unwrap(), [32, 96, 100]);
        assert_eq!(frontiers(32, 64, None, Some(16)).unwrap(), [32, 48, 64]);
        assert_eq!(frontiers(64, 64, None, None).unwrap(), [64]);
        assert!(frontiers(0, 64, None, None).is_err());
        assert!(frontiers(65, 64, None, None).is_err());
        assert!(frontiers(8, 64, Some(1), None).is_err());
        assert!(frontiers(8, 64, None, Some(0)).is_err());
    }

    #[test]
    fn summary_is_median_min_max() {
        assert_eq!(summary(&[3.0, 1.0, 2.0]), [2.0, 1.0, 3.0]);
        assert_eq!(summary(&[4.0, 1.0, 2.0, 3.0]), [2.5, 1.0, 4.0]);
    }
}
