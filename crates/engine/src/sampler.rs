//! Token sampling: logit biases, penalties, greedy, top-k, top-p, min-p, temperature, seeded
//! draws, stop conditions and log-probabilities.
//!
//! The chain follows llama.cpp's default order: logit biases, penalties, then top-k, top-p
//! and min-p on the untempered distribution, then temperature, then one draw. Everything runs on one thread
//! over the logits alone, so a seed gives the same tokens whatever the thread count of the
//! forward pass. Log-probabilities are always those of the raw logits (before biases, penalties and
//! filters), like the reference fixtures.

use crate::rng::Rng;

mod candidates;
mod cut;
pub use candidates::Candidates;

/// Candidates a top-p or min-p cut without top-k is first tried on: the full-row sampler
/// sorts only this many of the row unless the cut reaches past them, and a device backend
/// selects this many ([`Sampler::candidates_needed`]).
pub const NUCLEUS_CANDIDATES: usize = 256;

/// Sampling errors.
#[derive(Debug, thiserror::Error, PartialEq)]
#[non_exhaustive]
pub enum SampleError {
    /// The logits slice was empty.
    #[error("no logits to sample from")]
    EmptyLogits,
    /// A logit was NaN; sampling from it would be arbitrary.
    #[error("logit {index} is NaN")]
    NanLogit {
        /// Token id of the NaN logit.
        index: usize,
    },
    /// A setting is outside its valid range.
    #[error("invalid sampler setting {name} = {value}")]
    InvalidSetting {
        /// Setting name as in [`SamplerConfig`].
        name: &'static str,
        /// The rejected value.
        value: f64,
    },
    /// [`Sampler::sample_candidates`] was called for settings that need the full row
    /// ([`Sampler::candidates_needed`] is `None`).
    #[error("these sampler settings need the full logits row")]
    CandidatesUnsupported,
    /// A backend returned fewer candidates than the settings need.
    #[error("{have} candidates given, {need} needed")]
    TooFewCandidates {
        /// Candidates given.
        have: usize,
        /// Candidates needed.
        need: usize,
    },
    /// A top-p or min-p cut without top-k reaches past the candidates given: the caller
    /// samples from the full row instead (the random stream has not moved).
    #[error("the top-p/min-p cut reaches past the {have} candidates given")]
    CutPastCandidates {
        /// Candidates given.
        have: usize,
    },
}

/// Sampler settings. [`SamplerConfig::default`] is greedy decoding with no stop token and no
/// token limit; every filter is off at its neutral value.
#[derive(Debug, Clone, PartialEq)]
pub struct SamplerConfig {
    /// Softmax temperature; `<= 0` means greedy (argmax, ties to the lowest id).
    pub temperature: f32,
    /// Keep the `top_k` most likely tokens; 0 disables.
    pub top_k: usize,
    /// Keep the smallest set of most likely tokens whose probability reaches `top_p`;
    /// 1 disables. Must be in (0, 1].
    pub top_p: f32,
    /// Drop tokens whose probability is below `min_p` times the best one's; 0 disables.
    /// Must be in [0, 1].
    pub min_p: f32,
    /// Divides positive (multiplies negative) logits of tokens seen in the penalty window;
    /// 1 disables. Must be > 0.
    pub repeat_penalty: f32,
    /// Subtracted from a token's logit once per occurrence in the penalty window; 0 disables.
    pub frequency_penalty: f32,
    /// Subtracted from a token's logit if it occurs in the penalty window; 0 disables.
    pub presence_penalty: f32,
    /// How many of the most recent history tokens the penalties look at; 0 = all of them.
    pub penalty_last_n: usize,
    /// Seed of the random stream.
    pub seed: u64,
    /// Generation stops after this many tokens; 0 = no limit.
    pub max_tokens: usize,
    /// Token ids that end generation (the stop token itself is reported, not emitted).
    pub stop_ids: Vec<u32>,
    /// Number of top alternatives (by raw log-probability) reported with each token.
    pub n_logprobs: usize,
    /// Added to the logits of these token ids before anything else (OpenAI's and
    /// llama.cpp's `logit_bias`); an id listed twice gets both. Ids past the row are
    /// ignored. Biases must be finite.
    pub logit_bias: Vec<(u32, f32)>,
}

impl Default for SamplerConfig {
    fn default() -> Self {
        SamplerConfig {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            repeat_penalty: 1.0,
            frequency_penalty: 0.0,
            presence_penalty: 0.0,
            penalty_last_n: 64,
            seed: 0,
            max_tokens: 0,
            stop_ids: Vec::new(),
            n_logprobs: 0,
            logit_bias: Vec::new(),
        }
    }
}

/// One sampled token.
#[derive(Debug, Clone, PartialEq)]
pub struct Sampled {
    /// The chosen token id.
    pub token: u32,
    /// Its log-probability under the raw logits.
    pub logprob: f32,
    /// The `n_logprobs` most likely tokens under the raw logits, descending (ties: lower id
    /// first).
    pub top: Vec<(u32, f32)>,
}

/// Why generation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopReason {
    /// A stop token id was sampled.
    StopToken(u32),
    /// `max_tokens` were generated.
    MaxTokens,
}

/// A stateful sampler: settings, random stream and reusable scratch.
#[derive(Debug)]
pub struct Sampler {
    cfg: SamplerConfig,
    rng: Rng,
    cand: Vec<(u32, f32)>,
    /// Sort keys of the candidates ([`desc_key`]), for the filters' ordering.
    keys: Vec<u64>,
    window: Vec<u32>,
}

fn check(name: &'static str, value: f32, ok: bool) -> Result<(), SampleError> {
    if ok && value.is_finite() {
        Ok(())
    } else {
        Err(SampleError::InvalidSetting {
            name,
            value: f64::from(value),
        })
    }
}

/// Orders candidates by descending logit, then ascending id, so ties are deterministic.
fn by_logit_desc(a: &(u32, f32), b: &(u32, f32)) -> std::cmp::Ordering {
    b.1.total_cmp(&a.1).then(a.0.cmp(&b.0))
}

/// A `u64` whose ascending order is [`by_logit_desc`]'s: the logit's `total_cmp` rank
/// inverted in the high half, the id in the low half. Sorting plain integers is several
/// times cheaper than sorting with the comparator, and the order is the same strict total
/// order, so every filter sees the candidates in the same sequence.
fn desc_key((id, l): (u32, f32)) -> u64 {
    let b = l.to_bits();
    // Sign-magnitude to an unsigned rank increasing with `total_cmp`.
    let rank = if b >> 31 == 1 { !b } else { b | 0x8000_0000 };
    (u64::from(!rank) << 32) | u64::from(id)
}

/// The candidate a [`desc_key`] was made from.
fn from_key(key: u64) -> (u32, f32) {
    let rank = !((key >> 32) as u32);
    let b = if rank >> 31 == 1 {
        rank & 0x7fff_ffff
    } else {
        !rank
    };
    (key as u32, f32::from_bits(b))
}

/// The first greatest logit under `total_cmp` (so the lowest id among equals): greedy
/// decoding's choice, found without building the candidate list. The greatest integer key
/// first, then its first position: both passes are branch-free over chunks, which the
/// compiler vectorizes (a compare-and-branch loop over the vocabulary was a fifth of a
/// batch's serial work per step).
pub(crate) fn argmax(logits: &[f32]) -> u32 {
    let best = logits.iter().map(|&l| order_key(l)).max().unwrap_or(0);
    first_where(logits, |l| order_key(l) == best).unwrap_or(0) as u32
}

/// An integer whose order is `f32::total_cmp`'s (the transformation `total_cmp` itself
/// applies).
fn order_key(l: f32) -> i32 {
    let b = l.to_bits() as i32;
    b ^ (((b >> 31) as u32) >> 1) as i32
}

/// The first index whose value satisfies `hit`, testing whole chunks without branching
/// before looking inside the one that holds it.
fn first_where(x: &[f32], hit: impl Fn(f32) -> bool) -> Option<usize> {
    const CHUNK: usize = 64;
    let (i, chunk) = x
        .chunks(CHUNK)
        .enumerate()
        .find(|(_, c)| c.iter().fold(false, |any, &v| any | hit(v)))?;
    chunk.iter().position(|&v| hit(v)).map(|j| i * CHUNK + j)
}

impl Sampler {
    /// A sampler with validated settings.
    pub fn new(cfg: SamplerConfig) -> Result<Sampler, SampleError> {
        check("temperature", cfg.temperature, true)?;
        check("top_p", cfg.top_p, cfg.top_p > 0.0 && cfg.top_p <= 1.0)?;
        check("min_p", cfg.min_p, (0.0..=1.0).contains(&cfg.min_p))?;
        check(
            "repeat_penalty",
            cfg.repeat_penalty,
            cfg.repeat_penalty > 0.0,
        )?;
        check("frequency_penalty", cfg.frequency_penalty, true)?;
        check("presence_penalty", cfg.presence_penalty, true)?;
        for &(_, bias) in &cfg.logit_bias {
            check("logit_bias", bias, true)?;
        }
        let rng = Rng::new(cfg.seed);
        Ok(Sampler {
            cfg,
            rng,
            cand: Vec::new(),
            keys: Vec::new(),
            window: Vec::new(),
        })
    }

    /// The settings.
    pub fn config(&self) -> &SamplerConfig {
        &self.cfg
    }

    /// Whether [`Sampler::sample`] reduces to the largest logit (ties to the lowest id) with
    /// no biases or penalties and no top log-probabilities: what a backend may compute where
    /// the logits are, returning only the token and its log-probability.
    pub fn is_plain_greedy(&self) -> bool {
        self.cfg.temperature <= 0.0 && !self.adjusts() && self.cfg.n_logprobs == 0
    }

    /// Chooses the next token from `logits` (one per vocabulary id). `history` is the token
    /// sequence so far (prompt and generated), used by the penalties.
    pub fn sample(&mut self, logits: &[f32], history: &[u32]) -> Result<Sampled, SampleError> {
        let token = self.next_token(logits, history)?;
        let lse = log_sum_exp(logits);
        let logprob = logits
            .get(token as usize)
            .map_or(f32::NEG_INFINITY, |&l| (f64::from(l) - lse) as f32);
        let top = top_logprobs(logits, lse, self.cfg.n_logprobs, &mut self.cand);
        Ok(Sampled {
            token,
            logprob,
            top,
        })
    }

    /// The token [`Sampler::sample`] would choose (advancing the random stream the same
    /// way), without the log-probabilities: for callers that report none, it saves a pass
    /// of `exp` over the whole vocabulary.
    pub fn next_token(&mut self, logits: &[f32], history: &[u32]) -> Result<u32, SampleError> {
        if logits.is_empty() {
            return Err(SampleError::EmptyLogits);
        }
        if let Some(index) = first_where(logits, f32::is_nan) {
            return Err(SampleError::NanLogit { index });
        }
        if self.cfg.temperature <= 0.0 && !self.adjusts() {
            return Ok(argmax(logits));
        }
        self.cand.clear();
        self.cand
            .extend(logits.iter().enumerate().map(|(i, &l)| (i as u32, l)));
        self.apply_biases();
        self.apply_penalties(history);
        Ok(if self.cfg.temperature <= 0.0 {
            self.cand
                .iter()
                .copied()
                .min_by(by_logit_desc)
                .map_or(0, |c| c.0)
        } else {
            self.draw()
        })
    }

    /// Whether any penalty is on.
    fn penalizes(&self) -> bool {
        let c = &self.cfg;
        c.repeat_penalty != 1.0 || c.frequency_penalty != 0.0 || c.presence_penalty != 0.0
    }

    /// Whether the logits are changed before the filters (biases or penalties): then the
    /// choice depends on the whole row, not only on its best candidates.
    fn adjusts(&self) -> bool {
        !self.cfg.logit_bias.is_empty() || self.penalizes()
    }

    fn apply_biases(&mut self) {
        for &(id, bias) in &self.cfg.logit_bias {
            if let Some(entry) = self.cand.get_mut(id as usize) {
                entry.1 += bias;
            }
        }
    }

    fn apply_penalties(&mut self, history: &[u32]) {
        if !self.penalizes() {
            return;
        }
        let c = &self.cfg;
        let start = if c.penalty_last_n == 0 {
            0
        } else {
            history.len().saturating_sub(c.penalty_last_n)
        };
        self.window.clear();
        self.window.extend_from_slice(&history[start..]);
        self.window.sort_unstable();
        for run in self.window.chunk_by(|a, b| a == b) {
            let id = run[0] as usize;
            let Some(entry) = self.cand.get_mut(id) else {
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

    /// Filters the candidates (all of the row, in id order) and draws one token. A top-p or
    /// min-p cut without top-k first sorts only the best NUCLEUS_CANDIDATES, and the whole
    /// row only when the cut reaches past them; either way the kept list is the same.
    fn draw(&mut self) -> u32 {
        let SamplerConfig {
            top_k,
            top_p,
            min_p,
            ..
        } = self.cfg;
        let n = self.cand.len();
        let nucleus = top_k == 0 && (top_p < 1.0 || min_p > 0.0);
        // Top-p without top-k is relative to the whole row's mass (summed in id order);
        // with top-k, to the kept candidates' (below).
        let row_mass = (nucleus && top_p < 1.0).then(|| {
            let max = self
                .cand
                .iter()
                .map(|x| x.1)
                .max_by(f32::total_cmp)
                .map_or(0.0, f64::from);
            self.cand
                .iter()
                .map(|x| (f64::from(x.1) - max).exp())
                .sum::<f64>()
        });
        let first = match (top_k, nucleus) {
            (0, true) => NUCLEUS_CANDIDATES.min(n),
            (0, false) => n,
            (k, _) => k.min(n),
        };
        self.keys.clear();
        self.keys.extend(self.cand.iter().copied().map(desc_key));
        self.sort_best(first);
        let total = match row_mass {
            Some(mass) => mass,
            None if top_p < 1.0 => cut::mass(&self.cand),
            None => 1.0,
        };
        let keep = loop {
            let complete = top_k > 0 || self.cand.len() == n;
            match cut::keep(&self.cand, top_p, min_p, total, complete) {
                Some(keep) => break keep,
                None => self.sort_best(n),
            }
        };
        self.cand.truncate(keep);
        self.draw_kept()
    }

    /// Fills `cand` with the best `m` of the sort keys, best first. Keys beyond `m` stay,
    /// so a later call with a larger `m` sorts further.
    fn sort_best(&mut self, m: usize) {
        let keys = &mut self.keys;
        if m > 0 && m < keys.len() {
            keys.select_nth_unstable(m - 1);
        }
        keys[..m].sort_unstable();
        self.cand.clear();
        self.cand.extend(keys[..m].iter().copied().map(from_key));
    }

    /// Draws one of the kept candidates (best first, at least one) with the temperature.
    fn draw_kept(&mut self) -> u32 {
        let cand = &self.cand;
        let max = cand[0].1;
        let inv_t = 1.0 / f64::from(self.cfg.temperature);
        let tw = |l: f32| ((f64::from(l) - f64::from(max)) * inv_t).exp();
        let total: f64 = cand.iter().map(|x| tw(x.1)).sum();
        let mut r = self.rng.next_f64() * total;
        for x in cand.iter() {
            r -= tw(x.1);
            if r < 0.0 {
                return x.0;
            }
        }
        cand[cand.len() - 1].0
    }

    /// Whether generation ends after emitting `token` as the `n_generated`-th token
    /// (counting it). A stop token wins over the limit.
    pub fn stop_reason(&self, token: u32, n_generated: usize) -> Option<StopReason> {
        if self.cfg.stop_ids.contains(&token) {
            Some(StopReason::StopToken(token))
        } else if self.cfg.max_tokens > 0 && n_generated >= self.cfg.max_tokens {
            Some(StopReason::MaxTokens)
        } else {
            None
        }
    }
}

/// Log-softmax of `logits` evaluated at `token`, and the `n_top` largest log-probabilities
/// (descending, ties to the lower id). Sums run in f64.
pub fn raw_logprobs(logits: &[f32], token: u32, n_top: usize) -> (f32, Vec<(u32, f32)>) {
    let lse = log_sum_exp(logits);
    let chosen = logits
        .get(token as usize)
        .map_or(f32::NEG_INFINITY, |&l| (f64::from(l) - lse) as f32);
    (chosen, top_logprobs(logits, lse, n_top, &mut Vec::new()))
}

/// The `n_top` largest log-probabilities given `lse = log_sum_exp(logits)`; `scratch` is
/// reused so a sampling step allocates only the `n_top` result entries.
fn top_logprobs(
    logits: &[f32],
    lse: f64,
    n_top: usize,
    scratch: &mut Vec<(u32, f32)>,
) -> Vec<(u32, f32)> {
    let n = n_top.min(logits.len());
    if n == 0 {
        return Vec::new();
    }
    scratch.clear();
    scratch.extend(logits.iter().enumerate().map(|(i, &l)| (i as u32, l)));
    scratch.select_nth_unstable_by(n - 1, by_logit_desc);
    let top = &mut scratch[..n];
    top.sort_unstable_by(by_logit_desc);
    top.iter()
        .map(|&(i, l)| (i, (f64::from(l) - lse) as f32))
        .collect()
}

/// `log(Σ exp(l))`, stable for large logits: `ferrite_quant::kernels::log_sum_exp` at this
/// machine's SIMD level (the f64 definition at the scalar level; the vector levels take each
/// exponential in f32 and stay within 2e-6 of it, where f64 `exp` over a 262k vocabulary
/// took ~1.9 ms a token).
pub fn log_sum_exp(logits: &[f32]) -> f64 {
    // simd_level() is a level this CPU runs, so the kernel never refuses it; NaN would
    // show if it did.
    ferrite_quant::kernels::log_sum_exp(ferrite_quant::simd_level(), logits).unwrap_or(f64::NAN)
}

/// The earliest occurrence of any stop string in `text`: `(byte offset, index into stops)`.
/// Empty stop strings are ignored. The caller cuts the text at the offset.
pub fn find_stop_string(text: &str, stops: &[String]) -> Option<(usize, usize)> {
    stops
        .iter()
        .enumerate()
        .filter(|(_, s)| !s.is_empty())
        .filter_map(|(i, s)| text.find(s.as_str()).map(|at| (at, i)))
        .min()
}

/// Length in bytes of the longest suffix of `text` that is a proper prefix of some stop
/// string: a streaming caller holds these bytes back until it knows whether a stop string
/// completes. Always ends on a char boundary.
pub fn partial_stop_len(text: &str, stops: &[String]) -> usize {
    let mut best = 0;
    for s in stops {
        for (n, _) in s.char_indices().skip(1) {
            if n > best && text.ends_with(&s[..n]) {
                best = n;
            }
        }
    }
    best
}

#[cfg(test)]
mod tests;
