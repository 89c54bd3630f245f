//! The sampler's fast paths (argmax for greedy, integer sort keys for the filters, the
//! token without log-probabilities) against the straightforward sampler they replaced,
//! kept here as the oracle: same settings, seed and logits must give the same token, the
//! same log-probabilities and the same random stream, call after call.

use crate::rng::Rng;
use crate::sampler::{Sampled, Sampler, SamplerConfig, log_sum_exp, raw_logprobs};

fn by_logit_desc(a: &(u32, f32), b: &(u32, f32)) -> std::cmp::Ordering {
    b.1.total_cmp(&a.1).then(a.0.cmp(&b.0))
}

/// The sampler before its fast paths: every candidate listed, sorted with the comparator.
struct Reference {
    cfg: SamplerConfig,
    rng: Rng,
}

impl Reference {
    fn sample(&mut self, logits: &[f32], history: &[u32]) -> Sampled {
        let c = self.cfg.clone();
        let mut cand: Vec<(u32, f32)> = logits
            .iter()
            .enumerate()
            .map(|(i, &l)| (i as u32, l))
            .collect();
        for &(id, bias) in &c.logit_bias {
            if let Some(entry) = cand.get_mut(id as usize) {
                entry.1 += bias;
            }
        }
        if c.repeat_penalty != 1.0 || c.frequency_penalty != 0.0 || c.presence_penalty != 0.0 {
            let start = if c.penalty_last_n == 0 {
                0
            } else {
                history.len().saturating_sub(c.penalty_last_n)
            };
            let mut window = history[start..].to_vec();
            window.sort_unstable();
            for run in window.chunk_by(|a, b| a == b) {
                let Some(entry) = cand.get_mut(run[0] as usize) else {
                    continue;
                };
                let l = &mut entry.1;
                *l = if *l > 0.0 {
                    *l / c.repeat_penalty
                } else {
                    *l * c.repeat_penalty
                };
                *l -= run.len() as f32 * c.frequency_penalty + c.presence_penalty;
            }
        }
        let token = if c.temperature <= 0.0 {
            cand.iter()
                .copied()
                .min_by(by_logit_desc)
                .map_or(0, |x| x.0)
        } else {
            // Without top-k, top-p's mass is the whole row's, summed in id order.
            let row: Vec<f32> = cand.iter().map(|x| x.1).collect();
            if c.top_k > 0 && c.top_k < cand.len() {
                cand.select_nth_unstable_by(c.top_k - 1, by_logit_desc);
                cand.truncate(c.top_k);
            }
            cand.sort_unstable_by(by_logit_desc);
            let max = cand[0].1;
            let weights = |l: f32| (f64::from(l) - f64::from(max)).exp();
            if c.top_p < 1.0 {
                let total: f64 = if c.top_k == 0 {
                    row.iter().map(|&l| weights(l)).sum()
                } else {
                    cand.iter().map(|x| weights(x.1)).sum()
                };
                let mut acc = 0.0;
                let mut keep = cand.len();
                for (i, x) in cand.iter().enumerate() {
                    acc += weights(x.1) / total;
                    if acc >= f64::from(c.top_p) {
                        keep = i + 1;
                        break;
                    }
                }
                cand.truncate(keep);
            }
            if c.min_p > 0.0 {
                let keep = cand
                    .iter()
                    .take_while(|x| weights(x.1) >= f64::from(c.min_p))
                    .count()
                    .max(1);
                cand.truncate(keep);
            }
            let inv_t = 1.0 / f64::from(c.temperature);
            let tw = |l: f32| ((f64::from(l) - f64::from(max)) * inv_t).exp();
            let total: f64 = cand.iter().map(|x| tw(x.1)).sum();
            let mut r = self.rng.next_f64() * total;
            let mut pick = cand[cand.len() - 1].0;
            for x in cand.iter() {
                r -= tw(x.1);
                if r < 0.0 {
                    pick = x.0;
                    break;
                }
            }
            pick
        };
        let (logprob, top) = raw_logprobs(logits, token, c.n_logprobs);
        assert_eq!(
            logprob.to_bits(),
            ((f64::from(logits[token as usize]) - log_sum_exp(logits)) as f32).to_bits()
        );
        Sampled {
            token,
            logprob,
            top,
        }
    }
}

/// Logits with the awkward cases: exact ties, both zeros, infinities, a peaked head and a
/// long flat tail (like a real vocabulary).
fn logits(n: usize, seed: u64) -> Vec<f32> {
    let mut rng = Rng::new(seed);
    (0..n)
        .map(|i| match rng.next_u64() % 23 {
            0 => 0.0,
            1 => -0.0,
            2 => f32::NEG_INFINITY,
            3 => 4.0,
            4 if i == 97 && seed % 11 == 3 => f32::INFINITY,
            _ => ((rng.next_f64() * 16.0 - 12.0) as f32).max(-30.0),
        })
        .collect()
}

fn settings() -> Vec<SamplerConfig> {
    let base = SamplerConfig::default;
    let mut out = vec![
        base(),
        SamplerConfig {
            repeat_penalty: 1.3,
            frequency_penalty: 0.2,
            presence_penalty: 0.1,
            ..base()
        },
    ];
    for temperature in [0.3, 1.0, 1.7] {
        for (top_k, top_p, min_p) in [
            (0, 1.0, 0.0),
            (40, 1.0, 0.0),
            (0, 0.9, 0.0),
            (0, 1.0, 0.05),
            // Cuts the full-row sampler settles within its first NUCLEUS_CANDIDATES
            // sorted candidates (the two above reach past them on these rows).
            (0, 0.3, 0.0),
            (0, 1.0, 0.6),
            (0, 0.5, 0.3),
            (50, 0.95, 0.02),
            (1, 1.0, 0.0),
        ] {
            out.push(SamplerConfig {
                temperature,
                top_k,
                top_p,
                min_p,
                n_logprobs: 3,
                ..base()
            });
        }
    }
    out.push(SamplerConfig {
        temperature: 0.8,
        top_p: 0.9,
        repeat_penalty: 1.1,
        frequency_penalty: 0.3,
        penalty_last_n: 0,
        ..base()
    });
    // Biases that move the best token away, lift a tail token to the top, repeat an id and
    // name one past the row; greedy and drawn, with and without penalties.
    let biases = vec![
        (97, -100.0),
        (5, 40.0),
        (5, 0.5),
        (2999, 7.0),
        (100_000, 9.0),
    ];
    for temperature in [0.0, 0.9] {
        for frequency_penalty in [0.0, 0.4] {
            out.push(SamplerConfig {
                temperature,
                top_k: 40,
                frequency_penalty,
                n_logprobs: 2,
                logit_bias: biases.clone(),
                ..base()
            });
        }
    }
    out
}

/// Runs every setting over several seeds and rows; returns how many (setting, seed, step)
/// draws were compared.
fn compare(mut fast: impl FnMut(&mut Sampler, &[f32], &[u32]) -> Sampled) -> usize {
    let mut compared = 0;
    for cfg in settings() {
        for seed in [0u64, 1, 7, 12345] {
            let cfg = SamplerConfig {
                seed,
                ..cfg.clone()
            };
            let mut reference = Reference {
                cfg: cfg.clone(),
                rng: Rng::new(seed),
            };
            let mut sampler = Sampler::new(cfg.clone()).unwrap();
            let mut history: Vec<u32> = vec![3, 3, 17, 250, 3];
            for step in 0..6 {
                let row = logits(3000, seed * 31 + step);
                let want = reference.sample(&row, &history);
                let got = fast(&mut sampler, &row, &history);
                assert_eq!(got.token, want.token, "{cfg:?} step {step}");
                assert_eq!(got.logprob.to_bits(), want.logprob.to_bits(), "{cfg:?}");
                let bits = |t: &[(u32, f32)]| -> Vec<(u32, u32)> {
                    t.iter().map(|&(i, l)| (i, l.to_bits())).collect()
                };
                assert_eq!(bits(&got.top), bits(&want.top), "{cfg:?} step {step}");
                history.push(got.token);
                compared += 1;
            }
        }
    }
    compared
}

#[test]
fn fast_sampler_picks_what_the_reference_picks() {
    let n = compare(|s, row, history| s.sample(row, history).unwrap());
    assert!(n >= 400, "only {n} draws compared");
}

#[test]
fn next_token_picks_what_sample_picks() {
    // Tokens only: the log-probabilities come from the reference, the token and the random
    // stream from `next_token`.
    compare(|s, row, history| {
        let token = s.next_token(row, history).unwrap();
        let (logprob, top) = raw_logprobs(row, token, s.config().n_logprobs);
        Sampled {
            token,
            logprob,
            top,
        }
    });
}
