//! Item `sampler`: the sampler against the reference's own distributions. Each step of the
//! logits fixture becomes a row holding the reference's top-20 log-probabilities (everything
//! else far below); greedy must pick the reference's top-1 (either of a near tie), a top-5
//! draw at temperature 1 must stay inside the five best, and two samplers with one seed must
//! draw the same tokens. Runs without a model; the planted defect swaps the top two entries
//! of one row.

use ferrite_engine::score::{LogitsCase, NEAR_TIE};
use ferrite_engine::{Sampler, SamplerConfig};

use super::fidelity::logits_cases;
use super::{Env, Outcome, Proof, Target};

/// The reference top-20 of every step, and the vocabulary the rows need.
fn tops(cases: &[LogitsCase]) -> (Vec<Vec<(u32, f64)>>, usize) {
    let tops: Vec<Vec<(u32, f64)>> = cases
        .iter()
        .flat_map(|c| &c.steps)
        .filter(|s| !s.top.is_empty())
        .map(|s| s.top.clone())
        .collect();
    let n_vocab = tops
        .iter()
        .flat_map(|t| t.iter().map(|&(id, _)| id as usize + 1))
        .max()
        .unwrap_or(0);
    (tops, n_vocab)
}

/// A row holding `top`'s log-probabilities and everything else far below them (built one at
/// a time: a row of Gemma's vocabulary is a megabyte).
fn row(top: &[(u32, f64)], n_vocab: usize) -> Vec<f32> {
    let floor = top.iter().map(|&(_, lp)| lp).fold(f64::INFINITY, f64::min) - 20.0;
    let mut row = vec![floor as f32; n_vocab];
    for &(id, lp) in top {
        row[id as usize] = lp as f32;
    }
    row
}

/// Runs the three checks over the rows of `tops`; `swap` exchanges the values of the top
/// two entries of every row (the planted defect).
fn check(env: &Env, tops: &[Vec<(u32, f64)>], n_vocab: usize, swap: bool) -> anyhow::Result<Proof> {
    let sample = env.parts.sample;
    let mut greedy = Sampler::new(SamplerConfig::default())?;
    let top_k = SamplerConfig {
        temperature: 1.0,
        top_k: 5,
        seed: 7,
        ..SamplerConfig::default()
    };
    let (mut a, mut b) = (Sampler::new(top_k.clone())?, Sampler::new(top_k)?);
    let mut problems = Vec::new();
    for (i, top) in tops.iter().enumerate() {
        let mut row = row(top, n_vocab);
        if swap {
            row.swap(top[0].0 as usize, top[1].0 as usize);
        }
        let row = &row[..];
        let got = sample(&mut greedy, row)?;
        let best = top[0].1;
        let tied = top
            .iter()
            .any(|&(id, lp)| id == got && best - lp < NEAR_TIE);
        if !tied {
            problems.push(format!(
                "step {i}: greedy picked {got}, reference top-1 {}",
                top[0].0
            ));
        }
        let mut sorted: Vec<f32> = top.iter().map(|&(_, lp)| lp as f32).collect();
        sorted.sort_by(|x, y| y.total_cmp(x));
        let fifth = sorted.get(4).copied().unwrap_or(f32::NEG_INFINITY);
        let (x, y) = (sample(&mut a, row)?, sample(&mut b, row)?);
        if row.get(x as usize).is_none_or(|&v| v < fifth) {
            problems.push(format!("step {i}: top-5 draw {x} is outside the five best"));
        }
        if x != y {
            problems.push(format!("step {i}: one seed drew {x} and {y}"));
        }
    }
    let detail = match problems.first() {
        None => format!(
            "{} rows: greedy, top-5 and seeded draws as the reference allows",
            tops.len()
        ),
        Some(p) => format!("{} problems; {p}", problems.len()),
    };
    Ok(Proof::new(problems.is_empty(), detail)
        .count("rows", tops.len())
        .count("problems", problems.len()))
}

/// Item `sampler`.
pub fn run(env: &Env, t: &Target) -> anyhow::Result<Outcome> {
    let cases = match logits_cases(env, t, 8)? {
        Ok(c) => c,
        Err(reason) => return Ok(Outcome::blocked(reason)),
    };
    let (all, n_vocab) = tops(&cases);
    // The planted row: the first step whose top two are not a near tie, with them swapped.
    let Some(clear) = all
        .iter()
        .find(|top| top.len() >= 2 && top[0].1 - top[1].1 > 1e-2)
        .cloned()
    else {
        return Ok(Outcome::blocked(
            "no fixture step with a clear top-1 to swap",
        ));
    };
    let planted = check(env, &[clear], n_vocab, true)?;
    let real = check(env, &all, n_vocab, false)?;
    Ok(Outcome::Judged { planted, real })
}
