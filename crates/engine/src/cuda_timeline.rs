//! One conversation on either compute backend, for every front end: [`CudaTimeline`] (a
//! CUDA session and its last logits row) and [`AnySession`] (a CPU session, a CUDA model
//! session, or the one forward pass over the CUDA contract ops) as
//! [`Timeline`]s, and [`ScoreSession`] as the scorer's [`LogitsSource`]. `ferrite run`,
//! `ferrite score` and the serving engine all drive CUDA through this one adapter; it must
//! never choose a backend (that is the caller's) nor sample a token other than the host
//! sampler's.
//!
//! On CUDA the token is picked on the device where that gives the host sampler's token
//! exactly: plain greedy decoding (one id back per step, not the logits row), and greedy
//! with log-probabilities, a top-k cut of at most `ferrite_cuda::TOPK_MAX`, or a top-p or
//! min-p cut without top-k, all without penalties (the best candidates back, sampled by
//! `Sampler::sample_candidates`; a top-p/min-p cut reaching past them copies that step's
//! row back); other settings copy the row back. `FERRITE_CUDA_HOST_SAMPLING=1` turns the
//! device paths off (for comparisons); [`sampling_where`] names the choice for the backend
//! line.

use ferrite_cuda::{CudaError, CudaModel, CudaOps, CudaSession, TOPK_MAX};
use ferrite_model::{ModelError, Session, SessionState};

use crate::generate::{GenerateError, Timeline};
use crate::sampler::{Candidates, SampleError, Sampled};
use crate::score::{LogitsSource, ScoreError};

/// Set to `1`, CUDA decoding copies the logits back and samples on the host.
const HOST_SAMPLING_ENV: &str = "FERRITE_CUDA_HOST_SAMPLING";

/// Where CUDA decoding picks its tokens when the settings allow it: `device`, or `host`
/// under `FERRITE_CUDA_HOST_SAMPLING=1`.
pub fn sampling_where() -> &'static str {
    if host_sampling() { "host" } else { "device" }
}

/// Read once: the decode loop asks every token.
fn host_sampling() -> bool {
    static HOST: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *HOST.get_or_init(|| std::env::var_os(HOST_SAMPLING_ENV).is_some_and(|v| v == "1"))
}

/// A CUDA session and the logits of its last step.
pub struct CudaTimeline<'m> {
    /// The device session.
    pub session: CudaSession<'m>,
    ctx: usize,
    n_vocab: usize,
    logits: Vec<f32>,
}

impl<'m> CudaTimeline<'m> {
    /// A fresh session of `ctx` tokens over `model`.
    pub fn new(model: &'m CudaModel, ctx: usize) -> Result<CudaTimeline<'m>, CudaError> {
        Ok(CudaTimeline {
            session: CudaSession::new(model, ctx)?,
            ctx,
            n_vocab: model.config().n_vocab,
            logits: Vec::new(),
        })
    }

    /// Whether `tokens` fit the session (vocabulary, context), checked before anything
    /// runs so that a failed batched step has advanced no session.
    pub fn check(&self, tokens: &[u32]) -> Result<(), GenerateError> {
        if tokens.is_empty() {
            return Err(GenerateError::NoTokens);
        }
        let cached = self.session.n_past();
        if cached + tokens.len() > self.ctx {
            return Err(GenerateError::ContextFull {
                cached,
                new: tokens.len(),
                ctx: self.ctx,
            });
        }
        match tokens.iter().find(|&&t| t as usize >= self.n_vocab) {
            Some(&token) => Err(GenerateError::TokenOutOfVocab {
                token,
                n_vocab: self.n_vocab,
            }),
            None => Ok(()),
        }
    }
}

impl Timeline for CudaTimeline<'_> {
    fn eval_last(&mut self, tokens: &[u32]) -> Result<&[f32], GenerateError> {
        self.logits = self.session.eval(tokens)?;
        Ok(&self.logits)
    }

    fn n_past(&self) -> usize {
        self.session.n_past()
    }

    fn ctx(&self) -> usize {
        self.ctx
    }

    fn truncate(&mut self, n: usize) {
        self.session.truncate(n);
    }

    fn eval_greedy(&mut self, tokens: &[u32]) -> Result<Option<Sampled>, GenerateError> {
        if host_sampling() {
            return Ok(None);
        }
        let g = self.session.eval_greedy(tokens)?;
        // The row stays on the device; no stale host copy outlives the step.
        self.logits.clear();
        if let Some(index) = g.first_nan {
            return Err(SampleError::NanLogit { index }.into());
        }
        Ok(Some(Sampled {
            token: g.token,
            logprob: g.logprob,
            top: Vec::new(),
        }))
    }

    fn last_logits(&mut self) -> Result<&[f32], GenerateError> {
        self.logits = self.session.next_logits()?.ok_or(GenerateError::NoRow)?;
        Ok(&self.logits)
    }

    fn eval_candidates(
        &mut self,
        tokens: &[u32],
        k: usize,
    ) -> Result<Option<Candidates>, GenerateError> {
        if k > TOPK_MAX || host_sampling() {
            return Ok(None);
        }
        let t = self.session.eval_candidates(tokens, k)?;
        self.logits.clear();
        Ok(Some(Candidates {
            best: t.best,
            lse: t.lse,
            first_nan: t.first_nan,
            n_vocab: t.n_vocab,
        }))
    }
}

/// One conversation on whichever backend was chosen.
pub enum AnySession<'m> {
    /// CPU session.
    Cpu(Box<Session<'m>>),
    /// CUDA session of the CUDA model.
    Cuda(Box<CudaTimeline<'m>>),
    /// The one forward pass over the CUDA backend's contract ops, for a model the CUDA
    /// model does not run (the backend line says `pass=contract`): logits come back to the
    /// host and are sampled there.
    Pass(Box<Session<'m, CudaOps>>),
}

/// The refusal of session files on the contract path.
fn no_snapshots() -> GenerateError {
    GenerateError::Model(ModelError::InvalidArgument(
        "session files are not written or read on the CUDA contract path yet".into(),
    ))
}

impl AnySession<'_> {
    /// Forgets every token.
    pub fn reset(&mut self) {
        match self {
            AnySession::Cpu(s) => s.reset(),
            AnySession::Cuda(c) => c.session.reset(),
            AnySession::Pass(s) => s.reset(),
        }
    }

    /// The state of every cached position (for a session file).
    pub fn export_state(&self) -> Result<SessionState, GenerateError> {
        Ok(match self {
            AnySession::Cpu(s) => s.export_state(s.n_past())?,
            AnySession::Cuda(c) => c.session.export_state(c.session.n_past())?,
            AnySession::Pass(_) => return Err(no_snapshots()),
        })
    }

    /// Replaces the session's contents with all of `state`; on error the session is
    /// unchanged.
    pub fn import_state(&mut self, state: &SessionState) -> Result<(), GenerateError> {
        let n = state.n_tokens();
        match self {
            AnySession::Cpu(s) => s.import_state(state, n)?,
            AnySession::Cuda(c) => {
                c.session.import_state(state, n)?;
                // A later `eval_last` overwrites these; until then they mirror the device.
                c.logits = state.logits.clone().unwrap_or_default();
            }
            AnySession::Pass(_) => return Err(no_snapshots()),
        }
        Ok(())
    }
}

impl Timeline for AnySession<'_> {
    fn eval_last(&mut self, tokens: &[u32]) -> Result<&[f32], GenerateError> {
        match self {
            AnySession::Cpu(s) => s.eval_last(tokens),
            AnySession::Cuda(c) => c.eval_last(tokens),
            AnySession::Pass(s) => s.eval_last(tokens),
        }
    }

    fn n_past(&self) -> usize {
        match self {
            AnySession::Cpu(s) => Timeline::n_past(s.as_ref()),
            AnySession::Cuda(c) => c.n_past(),
            AnySession::Pass(s) => Timeline::n_past(s.as_ref()),
        }
    }

    fn ctx(&self) -> usize {
        match self {
            AnySession::Cpu(s) => Timeline::ctx(s.as_ref()),
            AnySession::Cuda(c) => c.ctx,
            AnySession::Pass(s) => Timeline::ctx(s.as_ref()),
        }
    }

    fn truncate(&mut self, n: usize) {
        match self {
            AnySession::Cpu(s) => s.truncate(n),
            AnySession::Cuda(c) => c.session.truncate(n),
            AnySession::Pass(s) => s.truncate(n),
        }
    }

    fn reusable(&self, n: usize) -> usize {
        match self {
            AnySession::Cpu(s) => Timeline::reusable(s.as_ref(), n),
            AnySession::Cuda(c) => n.min(c.n_past()),
            AnySession::Pass(s) => Timeline::reusable(s.as_ref(), n),
        }
    }

    fn eval_all(&mut self, tokens: &[u32]) -> Result<Vec<f32>, GenerateError> {
        match self {
            AnySession::Cpu(s) => s.eval_all(tokens),
            AnySession::Cuda(c) => c.eval_all(tokens),
            AnySession::Pass(s) => s.eval_all(tokens),
        }
    }

    fn eval_greedy(&mut self, tokens: &[u32]) -> Result<Option<Sampled>, GenerateError> {
        match self {
            AnySession::Cpu(_) | AnySession::Pass(_) => Ok(None),
            AnySession::Cuda(c) => c.eval_greedy(tokens),
        }
    }

    fn last_logits(&mut self) -> Result<&[f32], GenerateError> {
        match self {
            // These sessions select no candidates, so they keep no row to fetch.
            AnySession::Cpu(_) | AnySession::Pass(_) => Err(GenerateError::NoRow),
            AnySession::Cuda(c) => c.last_logits(),
        }
    }

    fn eval_candidates(
        &mut self,
        tokens: &[u32],
        k: usize,
    ) -> Result<Option<Candidates>, GenerateError> {
        match self {
            AnySession::Cpu(_) | AnySession::Pass(_) => Ok(None),
            AnySession::Cuda(c) => c.eval_candidates(tokens, k),
        }
    }
}

/// An [`AnySession`] as the scorer's [`LogitsSource`].
///
/// The CUDA session returns the logits of the last position only, so it serves calls that
/// ask for exactly that row (`from == tokens.len() - 1`: every call of
/// `ScoreMode::Decode`) and refuses the others rather than return a wrong number of rows.
pub struct ScoreSession<'m> {
    /// The session.
    pub session: AnySession<'m>,
    /// Values per logits row.
    pub n_vocab: usize,
}

impl LogitsSource for ScoreSession<'_> {
    fn n_vocab(&self) -> usize {
        self.n_vocab
    }

    fn reset(&mut self) {
        self.session.reset();
    }

    fn eval(&mut self, tokens: &[u32], from: usize) -> Result<&[f32], ScoreError> {
        match &mut self.session {
            AnySession::Cpu(s) => LogitsSource::eval(s.as_mut(), tokens, from),
            AnySession::Pass(s) => LogitsSource::eval(s.as_mut(), tokens, from),
            AnySession::Cuda(c) => {
                if from + 1 != tokens.len() {
                    return Err(ModelError::InvalidArgument(format!(
                        "the CUDA backend returns only the last position's logits, but rows \
                         {from}.. of {} tokens were asked for; score with --mode decode",
                        tokens.len()
                    ))
                    .into());
                }
                c.logits = c.session.eval(tokens).map_err(|e| match e {
                    CudaError::Model(m) => ScoreError::Model(m),
                    other => ScoreError::Backend(format!("CUDA backend: {other}")),
                })?;
                Ok(&c.logits)
            }
        }
    }
}
