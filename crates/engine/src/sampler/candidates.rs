//! Sampling from a row's best candidates instead of the whole row: what a device backend
//! returns when it selects on the device (a few hundred bytes copied back, not the
//! vocabulary).
//!
//! Exactness is the point: [`Sampler::candidates_needed`] offers this path only where the
//! full-row sampler's result depends on nothing but the `k` best logits, in its own order
//! (largest first, ties to the lower id) and the row's log-sum-exp: greedy, a top-k cut, or
//! a top-p or min-p cut without top-k, all with no biases or penalties (they change the
//! logits before the cut). Then [`Sampler::sample_candidates`] runs the same filters on the same
//! list and advances the random stream the same way, so the token is the one
//! [`Sampler::sample`] picks; the log-probabilities differ only by the rounding of a
//! log-sum-exp summed in another order, and so does top-p's total without top-k (a cut
//! could move only where the running mass lands within that rounding of top_p). A top-p or
//! min-p cut that reaches past the candidates is refused
//! ([`SampleError::CutPastCandidates`], the random stream untouched): the caller samples the
//! full row. It never guesses: any other configuration needs the full row.

use super::{NUCLEUS_CANDIDATES, SampleError, Sampled, Sampler, by_logit_desc, cut};

/// The best logits of one row, as a backend selected them.
#[derive(Debug, Clone, PartialEq)]
pub struct Candidates {
    /// `(id, logit)` of the best ids, largest logit first (`f32::total_cmp`), ties to the
    /// lower id; at least as many as [`Sampler::candidates_needed`] asked for, or the whole
    /// row when it is shorter.
    pub best: Vec<(u32, f32)>,
    /// `log(Σ exp(logit))` over the whole row (non-NaN values), in f64.
    pub lse: f64,
    /// The first NaN logit's index, if any: the row is then refused, as the host refuses it.
    pub first_nan: Option<usize>,
    /// Length of the row.
    pub n_vocab: usize,
}

impl Candidates {
    /// The candidates of a host row: the `k` best of `logits` and its log-sum-exp. The
    /// reference a device selection is checked against.
    pub fn from_row(logits: &[f32], k: usize) -> Candidates {
        let mut best: Vec<(u32, f32)> = logits
            .iter()
            .enumerate()
            .filter(|(_, l)| !l.is_nan())
            .map(|(i, &l)| (i as u32, l))
            .collect();
        let k = k.min(best.len());
        if k > 0 && k < best.len() {
            best.select_nth_unstable_by(k - 1, by_logit_desc);
        }
        best.truncate(k);
        best.sort_unstable_by(by_logit_desc);
        Candidates {
            best,
            lse: super::log_sum_exp(logits),
            first_nan: logits.iter().position(|l| l.is_nan()),
            n_vocab: logits.len(),
        }
    }
}

impl Sampler {
    /// How many best candidates [`Sampler::sample_candidates`] needs to give what
    /// [`Sampler::sample`] gives; `None` when the full row is needed (a bias or a penalty,
    /// or sampling with no cut at all). A top-p or min-p cut without top-k asks for
    /// [`NUCLEUS_CANDIDATES`] and may still need the row (see the module documentation).
    pub fn candidates_needed(&self) -> Option<usize> {
        let c = &self.cfg;
        if self.adjusts() {
            None
        } else if c.temperature <= 0.0 {
            Some(c.n_logprobs.max(1))
        } else if c.top_k > 0 {
            Some(c.top_k.max(c.n_logprobs))
        } else if c.top_p < 1.0 || c.min_p > 0.0 {
            Some(NUCLEUS_CANDIDATES.max(c.n_logprobs))
        } else {
            None
        }
    }

    /// Samples from `cand` as [`Sampler::sample`] would from the full row, for a
    /// configuration that [`Sampler::candidates_needed`] accepted with `cand.best` holding
    /// at least that many candidates (or the whole row).
    pub fn sample_candidates(&mut self, cand: &Candidates) -> Result<Sampled, SampleError> {
        if let Some(index) = cand.first_nan {
            return Err(SampleError::NanLogit { index });
        }
        let Some(need) = self.candidates_needed() else {
            return Err(SampleError::CandidatesUnsupported);
        };
        let have = cand.best.len();
        if have == 0 || (have < need && have < cand.n_vocab) {
            return Err(SampleError::TooFewCandidates { have, need });
        }
        let token = if self.cfg.temperature <= 0.0 {
            cand.best[0].0
        } else {
            let c = &self.cfg;
            let kept = if c.top_k > 0 { c.top_k.min(have) } else { have };
            self.cand.clear();
            self.cand.extend_from_slice(&cand.best[..kept]);
            // Top-p's mass: the kept candidates' with top-k, the whole row's without.
            let total = if c.top_k > 0 {
                cut::mass(&self.cand)
            } else {
                (cand.lse - f64::from(cand.best[0].1)).exp()
            };
            let complete = c.top_k > 0 || have >= cand.n_vocab;
            let keep = cut::keep(&self.cand, c.top_p, c.min_p, total, complete)
                .ok_or(SampleError::CutPastCandidates { have })?;
            self.cand.truncate(keep);
            self.draw_kept()
        };
        let logprob = cand
            .best
            .iter()
            .find(|c| c.0 == token)
            .map_or(f32::NEG_INFINITY, |&(_, l)| {
                (f64::from(l) - cand.lse) as f32
            });
        let top = cand.best[..self.cfg.n_logprobs.min(have)]
            .iter()
            .map(|&(i, l)| (i, (f64::from(l) - cand.lse) as f32))
            .collect();
        Ok(Sampled {
            token,
            logprob,
            top,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::SamplerConfig;
    use ferrite_testkit::XorShift;

    /// A row with ties, signed zeros and a spread of magnitudes.
    fn row(seed: u64, n: usize) -> Vec<f32> {
        let mut rng = XorShift(seed | 1);
        (0..n)
            .map(|_| match rng.below(10) {
                0 => 1.5,
                1 => -0.0,
                2 => 0.0,
                _ => rng.below(20_000) as f32 / 1000.0 - 10.0,
            })
            .collect()
    }

    fn configs() -> Vec<SamplerConfig> {
        let base = SamplerConfig {
            seed: 7,
            ..SamplerConfig::default()
        };
        let mut out = vec![
            base.clone(),
            SamplerConfig {
                n_logprobs: 5,
                ..base.clone()
            },
        ];
        for (temperature, top_k, top_p, min_p, n_logprobs) in [
            (1.0, 1, 1.0, 0.0, 0),
            (0.8, 40, 1.0, 0.0, 0),
            (1.0, 40, 0.9, 0.0, 3),
            (1.3, 64, 0.95, 0.05, 0),
            (0.5, 7, 1.0, 0.2, 10),
            (2.0, 256, 0.5, 0.0, 0),
            (0.8, 0, 0.9, 0.0, 0),
            (1.0, 0, 0.2, 0.0, 2),
            (1.1, 0, 1.0, 0.3, 0),
            (0.7, 0, 0.95, 0.05, 0),
            // Cuts that reach past the candidates on the longer rows.
            (1.0, 0, 0.99999, 0.0, 0),
            (1.0, 0, 1.0, 1e-4, 1),
        ] {
            out.push(SamplerConfig {
                temperature,
                top_k,
                top_p,
                min_p,
                n_logprobs,
                ..base.clone()
            });
        }
        out
    }

    /// The oracle: the full-row sampler. Same settings and seed, step after step, the
    /// candidate path gives the same tokens and top ids, and log-probabilities equal to the
    /// bit (the host's candidates share its log-sum-exp). Where a top-p or min-p cut
    /// reaches past the candidates, the refusal leaves the random stream where it was and
    /// the full row, sampled as a backend's caller would, continues the same sequence; both
    /// outcomes must occur.
    #[test]
    fn candidates_sample_like_the_full_row() {
        let (mut from_candidates, mut refused) = (0, 0);
        for cfg in configs() {
            let mut full = Sampler::new(cfg.clone()).unwrap();
            let mut part = Sampler::new(cfg.clone()).unwrap();
            let need = part.candidates_needed().expect("offered");
            for step in 0..60 {
                let logits = row(step * 31 + 5, 300 + step as usize * 7);
                let a = full.sample(&logits, &[]).unwrap();
                let b = match part.sample_candidates(&Candidates::from_row(&logits, need)) {
                    Err(SampleError::CutPastCandidates { have }) => {
                        assert_eq!(have, need, "{cfg:?} step {step}");
                        refused += 1;
                        part.sample(&logits, &[]).unwrap()
                    }
                    b => {
                        from_candidates += 1;
                        b.unwrap()
                    }
                };
                assert_eq!(a, b, "{cfg:?} step {step}");
            }
        }
        assert!(
            from_candidates > 0 && refused > 0,
            "{from_candidates} / {refused}"
        );
    }

    /// A defect planted in the candidate path (the cut's total taken over the candidates
    /// instead of the whole row) changes tokens: the oracle above would see it.
    #[test]
    fn top_p_without_top_k_needs_the_whole_rows_mass() {
        let cfg = SamplerConfig {
            temperature: 1.0,
            top_p: 0.3,
            seed: 11,
            ..SamplerConfig::default()
        };
        // A flat row: the best NUCLEUS_CANDIDATES hold under half of its mass.
        let logits: Vec<f32> = (0..600).map(|i| -(i as f32) * 0.002).collect();
        let need = Sampler::new(cfg.clone())
            .unwrap()
            .candidates_needed()
            .unwrap();
        let good = Candidates::from_row(&logits, need);
        let mut planted = good.clone();
        let max = f64::from(good.best[0].1);
        planted.lse = max
            + good
                .best
                .iter()
                .map(|x| (f64::from(x.1) - max).exp())
                .sum::<f64>()
                .ln();
        let draw = |c: &Candidates| {
            let mut s = Sampler::new(cfg.clone()).unwrap();
            (0..40)
                .map(|_| s.sample_candidates(c).map(|x| x.token))
                .collect::<Vec<_>>()
        };
        let mut full = Sampler::new(cfg.clone()).unwrap();
        let want: Vec<_> = (0..40)
            .map(|_| Ok(full.sample(&logits, &[]).unwrap().token))
            .collect();
        assert_eq!(draw(&good), want);
        assert_ne!(draw(&planted), want);
    }

    #[test]
    fn rows_shorter_than_the_cut_and_nan_rows() {
        let cfg = SamplerConfig {
            temperature: 1.0,
            top_k: 50,
            seed: 3,
            ..SamplerConfig::default()
        };
        let logits = [0.25, 3.0, -1.0];
        let mut full = Sampler::new(cfg.clone()).unwrap();
        let mut part = Sampler::new(cfg).unwrap();
        for _ in 0..20 {
            assert_eq!(
                full.sample(&logits, &[]).unwrap(),
                part.sample_candidates(&Candidates::from_row(&logits, 50))
                    .unwrap()
            );
        }
        let nan = [0.0, f32::NAN, 1.0, f32::NAN];
        assert_eq!(
            part.sample_candidates(&Candidates::from_row(&nan, 50)),
            Err(SampleError::NanLogit { index: 1 })
        );
    }

    #[test]
    fn only_exact_configurations_are_offered() {
        let s = |cfg: SamplerConfig| Sampler::new(cfg).unwrap();
        let greedy = SamplerConfig::default();
        assert_eq!(s(greedy.clone()).candidates_needed(), Some(1));
        let penalized = SamplerConfig {
            frequency_penalty: 0.5,
            ..greedy.clone()
        };
        assert_eq!(s(penalized).candidates_needed(), None);
        let no_cut = SamplerConfig {
            temperature: 1.0,
            ..greedy.clone()
        };
        assert_eq!(s(no_cut).candidates_needed(), None);
        let nucleus = SamplerConfig {
            temperature: 1.0,
            top_p: 0.9,
            n_logprobs: 300,
            ..greedy.clone()
        };
        assert_eq!(s(nucleus).candidates_needed(), Some(300));
        let min_p = SamplerConfig {
            temperature: 1.0,
            min_p: 0.1,
            ..greedy.clone()
        };
        assert_eq!(s(min_p).candidates_needed(), Some(NUCLEUS_CANDIDATES));
        let wide = SamplerConfig {
            temperature: 1.0,
            top_k: 100,
            ..greedy.clone()
        };
        assert_eq!(s(wide).candidates_needed(), Some(100));
        let mut short = s(SamplerConfig {
            temperature: 1.0,
            top_k: 10,
            ..greedy
        });
        let mut cand = Candidates::from_row(&row(1, 100), 10);
        cand.best.truncate(9);
        assert_eq!(
            short.sample_candidates(&cand),
            Err(SampleError::TooFewCandidates { have: 9, need: 10 })
        );
    }

    /// The checker catches a backend whose selection is off by one: the best candidate
    /// missing and the next one in its place.
    #[test]
    fn a_wrong_selection_is_caught_by_the_oracle() {
        let cfg = SamplerConfig {
            temperature: 1.0,
            top_k: 20,
            top_p: 0.7,
            seed: 11,
            ..SamplerConfig::default()
        };
        let mut full = Sampler::new(cfg.clone()).unwrap();
        let mut part = Sampler::new(cfg).unwrap();
        let differs = (0..40).any(|step| {
            let logits = row(step + 100, 500);
            let mut cand = Candidates::from_row(&logits, 21);
            cand.best.remove(0);
            full.sample(&logits, &[]).unwrap() != part.sample_candidates(&cand).unwrap()
        });
        assert!(differs);
    }
}
