//! The generation loop: evaluate a prompt, then sample and feed back one token at a time
//! until a stop token, the token limit, the context end or the caller says stop.
//!
//! The loop owns no state of its own: the session keeps the KV cache, the sampler its
//! random stream, and the caller sees every token (with its log-probabilities) through a
//! callback, where it can also decode text and check stop strings.
//!
//! With a [`Proposer`] the same loop speculates: it evaluates the last token and the draft
//! `[last, d1..dk]` in one [`Timeline::eval_all`] call, then picks each position's token in
//! order with the caller's own picker, exactly as the plain loop would, and keeps going
//! while the picked token equals the draft token that was evaluated after it. At the first
//! difference the picked token is emitted and the KV is cut back to the accepted positions.
//! This is exact by construction, at any temperature: row `i` is the logits the plain loop
//! would have seen (the CPU's batched rows are bit-identical to one-token decode), the
//! picker sees the same history and advances its random stream and grammar the same way,
//! and no row past the first difference is ever picked from. So for a seed and settings
//! the tokens are the plain loop's, token for token; the draft decides only how many of
//! them one forward pass yields. (The rejection rule min(1, p/q) is needed only when the
//! emitted token must be decided from the draft's own probabilities; the picked-token rule
//! needs none, and reproduces the plain stream rather than only its distribution.)

use ferrite_model::{ModelError, Outputs, Session, Weights};

use crate::held::{Chooser, HeldError};
use crate::sampler::{Candidates, SampleError, Sampled, Sampler, StopReason, raw_logprobs};
use crate::speculate::{Proposer, Stats};

/// One KV timeline, the one trait every front end drives: [`generate`] (`ferrite run`),
/// the slot scheduler ([`crate::scheduler`]) and scoring wrappers. Appends tokens and
/// returns logits. Implemented by the CPU [`Session`] and by
/// [`crate::cuda_timeline::CudaTimeline`]; tests implement it with toy models.
pub trait Timeline {
    /// Appends `tokens` (at least one) and returns the logits of the last.
    fn eval_last(&mut self, tokens: &[u32]) -> Result<&[f32], GenerateError>;
    /// Tokens held.
    fn n_past(&self) -> usize;
    /// Capacity in tokens.
    fn ctx(&self) -> usize;
    /// Drops everything after the first `n` positions.
    fn truncate(&mut self, n: usize);
    /// The longest prefix of at most `n` held positions a truncation keeps without
    /// recomputing any of it: `n` for K/V caches, a hybrid's nearest recurrent-state
    /// checkpoint. What a reuse may report as cached.
    fn reusable(&self, n: usize) -> usize {
        n.min(self.n_past())
    }
    /// Appends `tokens` and returns the logits after each of them, row after row. The
    /// default evaluates one token at a time; the CPU session does it in one pass.
    fn eval_all(&mut self, tokens: &[u32]) -> Result<Vec<f32>, GenerateError> {
        let mut out = Vec::new();
        for t in tokens {
            out.extend_from_slice(self.eval_last(std::slice::from_ref(t))?);
        }
        Ok(out)
    }
    /// Appends `tokens` and picks the next token greedily where the logits are made (a
    /// device backend), following [`Sampler`]'s greedy rule; `None`, without evaluating
    /// anything, when this timeline cannot (the default): the caller then uses
    /// [`Timeline::eval_last`] and samples on the host. See [`eval_sample`].
    fn eval_greedy(&mut self, tokens: &[u32]) -> Result<Option<Sampled>, GenerateError> {
        let _ = tokens;
        Ok(None)
    }
    /// Appends `tokens` and selects the `k` best logits of the last row where the logits
    /// are made, with the row's log-sum-exp ([`Candidates`]); `None`, without evaluating
    /// anything, when this timeline cannot (the default) or not that many. See
    /// [`eval_sample`].
    fn eval_candidates(
        &mut self,
        tokens: &[u32],
        k: usize,
    ) -> Result<Option<Candidates>, GenerateError> {
        let _ = (tokens, k);
        Ok(None)
    }
    /// The logits row of the last position evaluated, fetched from where it was made: what
    /// [`eval_sample`] samples when the candidates it got from
    /// [`Timeline::eval_candidates`] were too few for the sampler's cut. Only a timeline
    /// that selects candidates needs it (the default refuses).
    fn last_logits(&mut self) -> Result<&[f32], GenerateError> {
        Err(GenerateError::NoRow)
    }
}

/// Appends `tokens` to `session` and samples the next token: on the timeline itself when
/// the sampler is plain greedy ([`Sampler::is_plain_greedy`]) and the timeline offers
/// [`Timeline::eval_greedy`]; else from the best candidates when the settings depend on no
/// more of the row ([`Sampler::candidates_needed`]) and the timeline selects them
/// ([`Timeline::eval_candidates`]), fetching the row ([`Timeline::last_logits`]) when a
/// top-p or min-p cut reaches past them; else from the host copy of the logits. All give
/// the same token.
pub fn eval_sample<T: Timeline + ?Sized>(
    session: &mut T,
    sampler: &mut Sampler,
    tokens: &[u32],
    history: &[u32],
) -> Result<Sampled, GenerateError> {
    if sampler.is_plain_greedy()
        && let Some(s) = session.eval_greedy(tokens)?
    {
        return Ok(s);
    }
    if let Some(k) = sampler.candidates_needed()
        && let Some(c) = session.eval_candidates(tokens, k)?
    {
        return match sampler.sample_candidates(&c) {
            Err(SampleError::CutPastCandidates { .. }) => {
                Ok(sampler.sample(session.last_logits()?, history)?)
            }
            sampled => Ok(sampled?),
        };
    }
    let row = session.eval_last(tokens)?;
    Ok(sampler.sample(row, history)?)
}

/// How [`generate`] picks each token: a [`Sampler`] (through [`eval_sample`], with the
/// timeline's fast paths), or a [`Chooser`], whose held sampler picks from the host copy of
/// the logits every step.
pub trait Picker {
    /// Appends `tokens` to `session` and picks the next token.
    fn eval_pick<T: Timeline + ?Sized>(
        &mut self,
        session: &mut T,
        tokens: &[u32],
        history: &[u32],
    ) -> Result<Sampled, GenerateError>;

    /// Picks the next token from a host row of logits, as [`Picker::eval_pick`] would from
    /// the same row: a verify step's rows are all on the host.
    fn pick_row(&mut self, row: &[f32], history: &[u32]) -> Result<Sampled, GenerateError>;

    /// Takes `token` as the next one without drawing it (a reasoning budget's close): a
    /// grammar advances over it, the random stream does not, and its log-probabilities
    /// come from the raw `row`.
    fn pick_forced(&mut self, row: &[f32], token: u32) -> Result<Sampled, GenerateError>;

    /// As [`Sampler::stop_reason`].
    fn stop_reason(&self, token: u32, n_generated: usize) -> Option<StopReason>;
}

/// `token`, chosen other than by `sampler`'s draw, with the log-probabilities of the raw
/// `row` that `sampler`'s settings ask for.
fn unsampled(row: &[f32], token: u32, sampler: &Sampler) -> Sampled {
    let (logprob, top) = raw_logprobs(row, token, sampler.config().n_logprobs);
    Sampled {
        token,
        logprob,
        top,
    }
}

impl Picker for Sampler {
    fn eval_pick<T: Timeline + ?Sized>(
        &mut self,
        session: &mut T,
        tokens: &[u32],
        history: &[u32],
    ) -> Result<Sampled, GenerateError> {
        eval_sample(session, self, tokens, history)
    }

    fn pick_row(&mut self, row: &[f32], history: &[u32]) -> Result<Sampled, GenerateError> {
        Ok(self.sample(row, history)?)
    }

    fn pick_forced(&mut self, row: &[f32], token: u32) -> Result<Sampled, GenerateError> {
        Ok(unsampled(row, token, self))
    }

    fn stop_reason(&self, token: u32, n_generated: usize) -> Option<StopReason> {
        Sampler::stop_reason(self, token, n_generated)
    }
}

impl Picker for Chooser {
    fn eval_pick<T: Timeline + ?Sized>(
        &mut self,
        session: &mut T,
        tokens: &[u32],
        history: &[u32],
    ) -> Result<Sampled, GenerateError> {
        if let Chooser::Free(s) = self {
            return s.eval_pick(session, tokens, history);
        }
        let row = session.eval_last(tokens)?;
        self.pick_row(row, history)
    }

    fn pick_row(&mut self, row: &[f32], history: &[u32]) -> Result<Sampled, GenerateError> {
        let held = match self {
            Chooser::Free(s) => return s.pick_row(row, history),
            Chooser::Held(s) => s,
        };
        let token = held.next_token(row, history)?;
        Ok(unsampled(row, token, self.sampler()))
    }

    fn pick_forced(&mut self, row: &[f32], token: u32) -> Result<Sampled, GenerateError> {
        self.force(token)?;
        Ok(unsampled(row, token, self.sampler()))
    }

    fn stop_reason(&self, token: u32, n_generated: usize) -> Option<StopReason> {
        self.sampler().stop_reason(token, n_generated)
    }
}

impl<B: Weights> Timeline for Session<'_, B> {
    fn eval_last(&mut self, tokens: &[u32]) -> Result<&[f32], GenerateError> {
        self.eval(tokens, Outputs::Last)?
            .last()
            .ok_or(GenerateError::Sample(SampleError::EmptyLogits))
    }

    fn n_past(&self) -> usize {
        Session::n_past(self)
    }

    fn ctx(&self) -> usize {
        Session::ctx(self)
    }

    fn truncate(&mut self, n: usize) {
        Session::truncate(self, n);
    }

    fn reusable(&self, n: usize) -> usize {
        Session::reusable(self, n)
    }

    fn eval_all(&mut self, tokens: &[u32]) -> Result<Vec<f32>, GenerateError> {
        Ok(self.eval(tokens, Outputs::All)?.data.to_vec())
    }
}

/// Errors of [`generate`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GenerateError {
    /// The forward pass failed.
    #[error(transparent)]
    Model(#[from] ModelError),
    /// Sampling failed (NaN logits, ...).
    #[error(transparent)]
    Sample(#[from] SampleError),
    /// The CUDA backend failed.
    #[error("CUDA backend: {0}")]
    Cuda(#[from] ferrite_cuda::CudaError),
    /// Output held to a grammar could not go on.
    #[error(transparent)]
    Held(#[from] HeldError),
    /// An evaluation was asked for no tokens.
    #[error("no tokens to evaluate")]
    NoTokens,
    /// The tokens do not fit the timeline's context.
    #[error("context full: {cached} cached + {new} new > {ctx}")]
    ContextFull {
        /// Tokens already held.
        cached: usize,
        /// Tokens to append.
        new: usize,
        /// Capacity.
        ctx: usize,
    },
    /// A token id is outside the model's vocabulary.
    #[error("token {token} outside a vocabulary of {n_vocab}")]
    TokenOutOfVocab {
        /// The token id.
        token: u32,
        /// Vocabulary size.
        n_vocab: usize,
    },
    /// A batched evaluation got a different number of timelines and inputs.
    #[error("{timelines} timelines but {inputs} inputs")]
    BatchShape {
        /// Timelines given.
        timelines: usize,
        /// Inputs given.
        inputs: usize,
    },
    /// [`Timeline::eval_all`] returned values that are not one whole row per token.
    #[error("{values} logits for {tokens} tokens are not one row per token")]
    Rows {
        /// Logits returned.
        values: usize,
        /// Tokens evaluated.
        tokens: usize,
    },
    /// A logits row was asked of a timeline that keeps none (it selects no candidates on a
    /// device, or nothing was evaluated).
    #[error("this timeline keeps no logits row to fetch")]
    NoRow,
}

/// What the callback of [`generate`] wants next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flow {
    /// Keep generating.
    Continue,
    /// Stop now (for example, a stop string appeared in the decoded text).
    Stop,
}

/// Why [`generate`] returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finish {
    /// The sampler's stop token or token limit ([`StopReason`]).
    Sampler(StopReason),
    /// The callback returned [`Flow::Stop`].
    Caller,
    /// The session's context is full.
    ContextFull,
}

/// Result of [`generate`].
#[derive(Debug, Clone, PartialEq)]
pub struct Generation {
    /// Generated tokens passed to the callback (a stop token is not included).
    pub tokens: Vec<u32>,
    /// Why generation ended.
    pub finish: Finish,
    /// What speculation did (all zero but `steps` without a proposer).
    pub speculation: Stats,
}

/// Appends `prompt` to `session` (at its current position; call `reset` first for a fresh
/// conversation) and generates. `on_token` sees each generated token before it is fed back.
/// Penalties look at `prompt` followed by the generated tokens.
pub fn generate<T, P, F>(
    session: &mut T,
    sampler: &mut P,
    prompt: &[u32],
    on_token: F,
) -> Result<Generation, GenerateError>
where
    T: Timeline + ?Sized,
    P: Picker,
    F: FnMut(&Sampled) -> Flow,
{
    generate_with(session, sampler, None, prompt, on_token)
}

/// [`generate`], speculating with `proposer` when there is one (see the module
/// documentation): the tokens, the callbacks, the picker's state afterwards and the
/// session's contents on return are those of [`generate`]; only the number of forward
/// passes differs.
pub fn generate_with<T, P, F>(
    session: &mut T,
    sampler: &mut P,
    mut proposer: Option<&mut dyn Proposer>,
    prompt: &[u32],
    mut on_token: F,
) -> Result<Generation, GenerateError>
where
    T: Timeline + ?Sized,
    P: Picker,
    F: FnMut(&Sampled) -> Flow,
{
    let mut history = prompt.to_vec();
    let mut tokens = Vec::new();
    let mut stats = Stats::default();
    let mut verify: Option<Verify> = None;
    let mut s = sampler.eval_pick(session, prompt, &history)?;
    let finish = loop {
        if let Some(reason @ StopReason::StopToken(_)) = sampler.stop_reason(s.token, 0) {
            break Finish::Sampler(reason);
        }
        tokens.push(s.token);
        history.push(s.token);
        if on_token(&s) == Flow::Stop {
            break Finish::Caller;
        }
        if let Some(reason) = sampler.stop_reason(s.token, tokens.len()) {
            break Finish::Sampler(reason);
        }
        let held = verify.as_ref().map_or(session.n_past(), Verify::held);
        if held >= session.ctx() {
            break Finish::ContextFull;
        }
        if let Some(v) = verify.as_mut().filter(|v| v.accepts(s.token)) {
            // The picked token is the draft token already evaluated after it: its row is
            // the plain loop's next row.
            v.at += 1;
            stats.accepted += 1;
            s = v.pick(session, sampler, &history)?;
            continue;
        }
        if let Some(v) = verify.take() {
            session.truncate(v.held());
        }
        stats.steps += 1;
        // Room for the draft after the last token, inside the context.
        let room = session.ctx() - session.n_past() - 1;
        let draft = match proposer.as_deref_mut() {
            Some(p) if room > 0 => p.propose(&history, room),
            _ => Vec::new(),
        };
        if draft.is_empty() {
            s = sampler.eval_pick(session, &[s.token], &history)?;
            continue;
        }
        stats.verify_steps += 1;
        stats.proposed += draft.len();
        let mut inputs = Vec::with_capacity(draft.len() + 1);
        inputs.push(s.token);
        inputs.extend_from_slice(&draft);
        let base = session.n_past();
        let rows = session.eval_all(&inputs)?;
        if rows.is_empty() || rows.len() % inputs.len() != 0 {
            session.truncate(base + 1);
            return Err(GenerateError::Rows {
                values: rows.len(),
                tokens: inputs.len(),
            });
        }
        let v = verify.insert(Verify {
            base,
            inputs,
            rows,
            at: 0,
        });
        s = v.pick(session, sampler, &history)?;
    };
    // The session holds what the plain loop's would: nothing after the last token fed.
    if let Some(v) = verify {
        session.truncate(v.held());
    }
    Ok(Generation {
        tokens,
        finish,
        speculation: stats,
    })
}

/// One verify step of [`generate_with`] and of the slot scheduler
/// ([`crate::scheduler`]): `inputs` (`[last, d1..dk]`) were evaluated at positions
/// `base..`, giving `rows` (one per input); the token being emitted was picked from row
/// `at`. The one acceptance rule of speculation: see the module documentation.
pub(crate) struct Verify {
    pub(crate) base: usize,
    pub(crate) inputs: Vec<u32>,
    pub(crate) rows: Vec<f32>,
    pub(crate) at: usize,
}

impl Verify {
    /// Positions the plain loop would hold now: the inputs up to the one row `at` follows.
    pub(crate) fn held(&self) -> usize {
        self.base + self.at + 1
    }

    /// Whether `token`, picked from row `at`, is the draft token evaluated after it.
    pub(crate) fn accepts(&self, token: u32) -> bool {
        self.inputs.get(self.at + 1) == Some(&token)
    }

    /// Row `at`: the logits the plain loop would pick the next token from.
    pub(crate) fn row(&self) -> &[f32] {
        let n_vocab = self.rows.len() / self.inputs.len().max(1);
        &self.rows[self.at * n_vocab..(self.at + 1) * n_vocab]
    }

    /// Picks from row `at`; on failure the session is first cut back to what the plain
    /// loop would hold after the same failure.
    fn pick<T: Timeline + ?Sized, P: Picker>(
        &self,
        session: &mut T,
        sampler: &mut P,
        history: &[u32],
    ) -> Result<Sampled, GenerateError> {
        sampler.pick_row(self.row(), history).inspect_err(|_| {
            session.truncate(self.held());
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::SamplerConfig;

    /// Logits that favour token `(n_past + 1) % 4`; optionally picks greedily itself,
    /// answering a fixed wrong-looking token so the test sees which path ran.
    struct Fake {
        n: usize,
        row: Vec<f32>,
        own_greedy: bool,
        greedy_calls: usize,
        /// Most candidates it selects itself (0: none).
        own_candidates: usize,
        candidate_calls: usize,
    }

    impl Timeline for Fake {
        fn eval_last(&mut self, tokens: &[u32]) -> Result<&[f32], GenerateError> {
            self.n += tokens.len();
            self.row = (0..4)
                .map(|i| if i == self.n % 4 { 1.0 } else { 0.0 })
                .collect();
            Ok(&self.row)
        }
        fn n_past(&self) -> usize {
            self.n
        }
        fn ctx(&self) -> usize {
            64
        }
        fn truncate(&mut self, n: usize) {
            let _ = n;
        }
        fn eval_greedy(&mut self, tokens: &[u32]) -> Result<Option<Sampled>, GenerateError> {
            if !self.own_greedy {
                return Ok(None);
            }
            self.n += tokens.len();
            self.greedy_calls += 1;
            Ok(Some(Sampled {
                token: 3,
                logprob: -0.5,
                top: Vec::new(),
            }))
        }
        fn eval_candidates(
            &mut self,
            tokens: &[u32],
            k: usize,
        ) -> Result<Option<Candidates>, GenerateError> {
            if k > self.own_candidates {
                return Ok(None);
            }
            self.candidate_calls += 1;
            let row = self.eval_last(tokens)?;
            Ok(Some(Candidates::from_row(row, k)))
        }
    }

    fn fake(own_greedy: bool) -> Fake {
        Fake {
            n: 0,
            row: Vec::new(),
            own_greedy,
            greedy_calls: 0,
            own_candidates: 0,
            candidate_calls: 0,
        }
    }

    #[test]
    fn plain_greedy_goes_to_the_timeline_and_anything_else_to_the_host() {
        let mut greedy = Sampler::new(SamplerConfig::default()).unwrap();
        assert!(greedy.is_plain_greedy());
        let mut t = fake(true);
        assert_eq!(
            eval_sample(&mut t, &mut greedy, &[1, 2], &[])
                .unwrap()
                .token,
            3
        );
        assert_eq!((t.greedy_calls, t.n), (1, 2));
        // Without a device pick the host samples: argmax of the fake row.
        let mut h = fake(false);
        assert_eq!(
            eval_sample(&mut h, &mut greedy, &[1, 2], &[])
                .unwrap()
                .token,
            2
        );
        for cfg in [
            SamplerConfig {
                n_logprobs: 2,
                ..SamplerConfig::default()
            },
            SamplerConfig {
                repeat_penalty: 1.1,
                ..SamplerConfig::default()
            },
            SamplerConfig {
                temperature: 0.7,
                ..SamplerConfig::default()
            },
        ] {
            let mut s = Sampler::new(cfg).unwrap();
            assert!(!s.is_plain_greedy());
            let mut t = fake(true);
            eval_sample(&mut t, &mut s, &[1], &[1]).unwrap();
            assert_eq!(t.greedy_calls, 0);
        }
    }

    #[test]
    fn top_k_sampling_goes_to_timeline_candidates_and_gives_the_host_token() {
        let top_k = SamplerConfig {
            temperature: 0.9,
            top_k: 3,
            seed: 5,
            ..SamplerConfig::default()
        };
        let mut host = Sampler::new(top_k.clone()).unwrap();
        let mut dev = Sampler::new(top_k).unwrap();
        let mut h = fake(false);
        let mut d = Fake {
            own_candidates: 8,
            ..fake(false)
        };
        for step in 0..20u32 {
            let a = eval_sample(&mut h, &mut host, &[step], &[]).unwrap();
            let b = eval_sample(&mut d, &mut dev, &[step], &[]).unwrap();
            assert_eq!(a, b);
        }
        assert_eq!(d.candidate_calls, 20);
        // No top-k cut, or a cut wider than the timeline selects: the host samples.
        for cfg in [
            SamplerConfig {
                temperature: 0.9,
                ..SamplerConfig::default()
            },
            SamplerConfig {
                temperature: 0.9,
                top_k: 9,
                ..SamplerConfig::default()
            },
        ] {
            let mut s = Sampler::new(cfg).unwrap();
            let mut t = Fake {
                own_candidates: 8,
                ..fake(false)
            };
            eval_sample(&mut t, &mut s, &[1], &[]).unwrap();
            assert_eq!(t.candidate_calls, 0);
        }
    }

    /// A timeline of flat 600-logit rows that selects up to 256 candidates and counts the
    /// rows fetched after a refused cut.
    struct Flat {
        n: usize,
        row: Vec<f32>,
        fetched: usize,
    }

    impl Timeline for Flat {
        fn eval_last(&mut self, tokens: &[u32]) -> Result<&[f32], GenerateError> {
            self.n += tokens.len();
            let shift = self.n as f32 * 0.01;
            self.row = (0..600).map(|i| -(i as f32) * 0.003 + shift).collect();
            Ok(&self.row)
        }
        fn n_past(&self) -> usize {
            self.n
        }
        fn ctx(&self) -> usize {
            64
        }
        fn truncate(&mut self, n: usize) {
            let _ = n;
        }
        fn eval_candidates(
            &mut self,
            tokens: &[u32],
            k: usize,
        ) -> Result<Option<Candidates>, GenerateError> {
            if k > 256 {
                return Ok(None);
            }
            let row = self.eval_last(tokens)?;
            Ok(Some(Candidates::from_row(row, k)))
        }
        fn last_logits(&mut self) -> Result<&[f32], GenerateError> {
            self.fetched += 1;
            Ok(&self.row)
        }
    }

    #[test]
    fn a_cut_past_the_candidates_samples_the_fetched_row() {
        // top_p 0.3 stays within the best 256 of these rows; 0.9 does not.
        for (top_p, fetches) in [(0.3, 0), (0.9, 10)] {
            let cfg = SamplerConfig {
                temperature: 1.0,
                top_p,
                seed: 9,
                ..SamplerConfig::default()
            };
            let mut host = Sampler::new(cfg.clone()).unwrap();
            let mut dev = Sampler::new(cfg).unwrap();
            let mut d = Flat {
                n: 0,
                row: Vec::new(),
                fetched: 0,
            };
            for step in 0..10u32 {
                let b = eval_sample(&mut d, &mut dev, &[step], &[]).unwrap();
                let a = host.sample(&d.row, &[]).unwrap();
                assert_eq!(a, b, "top_p {top_p} step {step}");
            }
            assert_eq!(d.fetched, fetches, "top_p {top_p}");
        }
    }

    #[test]
    fn a_held_picker_takes_the_host_row_and_ends_with_the_grammar() {
        use ferrite_grammar::{Constraint, Token, Vocab};
        // Token 0 ends generation; the fake row favours 1, 2, 3, 0, 1, ... in turn, and
        // would pick 3 itself (which is never allowed here, "x" starting no object).
        let tokens = ["{", "}", "x"].map(|t| Token::Text(t.as_bytes().to_vec()));
        let mut tokens = tokens.to_vec();
        tokens.insert(0, Token::Special("<eos>".into()));
        let vocab = Vocab::new(tokens, &[0]).unwrap();
        let cfg = SamplerConfig {
            stop_ids: vec![0],
            n_logprobs: 2,
            ..SamplerConfig::default()
        };
        let json = Constraint::json_object();
        let mut held = Chooser::new(Sampler::new(cfg).unwrap(), Some(&json), &vocab).unwrap();
        let mut t = fake(true);
        let mut seen = Vec::new();
        let g = generate(&mut t, &mut held, &[5], |s| {
            seen.push(s.clone());
            Flow::Continue
        })
        .unwrap();
        assert_eq!(g.tokens, [1, 2]);
        assert_eq!(g.finish, Finish::Sampler(StopReason::StopToken(0)));
        assert_eq!(
            t.greedy_calls, 0,
            "a held picker never takes the timeline's pick"
        );
        // Log-probabilities are the raw row's: token 1 was the favourite of the first row.
        let (lp, top) = raw_logprobs(&[0.0, 1.0, 0.0, 0.0], 1, 2);
        assert_eq!((seen[0].logprob, &seen[0].top), (lp, &top));
    }
}
