//! Choosing the compute backend for `ferrite run` (`--backend auto|cpu|cuda`) and driving
//! either through one [`Timeline`], so the generation loop is written once.
//!
//! `auto` uses CUDA when a device answers the probe and the CPU otherwise; an explicit
//! `cuda` without a device is an error, never a silent fallback.
//!
//! On CUDA the token is picked on the device where that gives the host sampler's token
//! exactly: plain greedy decoding (one id back per step, not the logits row), and greedy
//! with log-probabilities, a top-k cut of at most `ferrite_cuda::TOPK_MAX`, or a top-p or
//! min-p cut without top-k, all without penalties (the best candidates back, sampled by
//! `Sampler::sample_candidates`; a top-p/min-p cut reaching past them copies that step's
//! row back); other settings copy the row back. `FERRITE_CUDA_HOST_SAMPLING=1` turns the device paths off
//! (for comparisons). `FERRITE_CUDA_ACT=f32|int8|int8x2` chooses what the decode products
//! read (see `ferrite_cuda::Activations`) and `FERRITE_CUDA_PREFILL=dequant|mmq` how prefill
//! multiplies (see `ferrite_cuda::PrefillProducts`); the backend line reports them as `act=`,
//! `prefill=` and `sampling=`.
//!
//! [`ScoreSession`] lets `ferrite score` read logits from either backend; on CUDA only the
//! last position's row exists, which is all the decode mode of the scorer asks for.

use std::sync::Arc;

use anyhow::Context;
use ferrite_cuda::{CudaBackend, CudaError, CudaModel, CudaSession, DeviceInfo, TOPK_MAX};
use ferrite_engine::{
    Candidates, GenerateError, LogitsSource, SampleError, Sampled, ScoreError, Timeline,
};
use ferrite_model::{Model, ModelError, Session, SessionState};

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

/// The parser of every `--threads` flag: 1 to [`ferrite_cpu::MAX_THREADS`], so a count the
/// CPU pool would refuse (or, in `quantize`, that would start a hundred thousand threads) is
/// a usage error before anything loads.
pub fn threads_arg() -> clap::builder::RangedU64ValueParser<usize> {
    clap::builder::RangedU64ValueParser::new().range(1..=ferrite_cpu::MAX_THREADS as u64)
}

/// `--backend` on the command line.
#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum BackendArg {
    /// CUDA when a device is present, else CPU.
    Auto,
    /// The CPU backend.
    Cpu,
    /// The CUDA backend (fails when no device is present).
    Cuda,
}

/// The CUDA side of a loaded model, when CUDA was chosen.
pub struct CudaLoaded {
    /// The device-resident model.
    pub model: CudaModel,
    /// What the probe found.
    pub info: DeviceInfo,
}

/// Loads the CUDA copy of `model` if `arg` asks for it (or allows it and a device exists).
pub fn load_cuda(arg: BackendArg, model: &Model) -> anyhow::Result<Option<CudaLoaded>> {
    let info = match (arg, CudaBackend::probe()) {
        (BackendArg::Cpu, _) | (BackendArg::Auto, Err(_)) => return Ok(None),
        (BackendArg::Cuda, Err(err)) => return Err(err).context("--backend cuda"),
        (_, Ok(info)) => info,
    };
    let backend: Arc<CudaBackend> = CudaBackend::new()?;
    let model = match CudaModel::load(backend, model) {
        Ok(m) => m,
        Err(CudaError::UnsupportedFeature(what)) if arg == BackendArg::Auto => {
            eprintln!("note: the CUDA backend does not implement {what} yet; running on the CPU");
            return Ok(None);
        }
        Err(e) => return Err(e).context("uploading the model to the GPU"),
    };
    Ok(Some(CudaLoaded { model, info }))
}

/// One conversation on whichever backend was chosen.
pub enum AnySession<'m> {
    /// CPU session.
    Cpu(Box<Session<'m>>),
    /// CUDA session.
    Cuda(Box<CudaTimeline<'m>>),
}

/// A CUDA session and the logits of its last step.
pub struct CudaTimeline<'m> {
    /// The device session.
    pub session: CudaSession<'m>,
    /// Capacity in tokens.
    pub ctx: usize,
    /// Last-token logits copied back from the device.
    pub logits: Vec<f32>,
}

impl AnySession<'_> {
    /// Drops every token after the first `n`.
    pub fn truncate(&mut self, n: usize) {
        match self {
            AnySession::Cpu(s) => s.truncate(n),
            AnySession::Cuda(c) => c.session.truncate(n),
        }
    }

    /// Forgets every token.
    pub fn reset(&mut self) {
        match self {
            AnySession::Cpu(s) => s.reset(),
            AnySession::Cuda(c) => c.session.reset(),
        }
    }

    /// The state of every cached position (for a session file).
    pub fn export_state(&self) -> anyhow::Result<SessionState> {
        Ok(match self {
            AnySession::Cpu(s) => s.export_state(s.n_past())?,
            AnySession::Cuda(c) => c.session.export_state(c.session.n_past())?,
        })
    }

    /// Replaces the session's contents with all of `state`; on error the session is
    /// unchanged.
    pub fn import_state(&mut self, state: &SessionState) -> anyhow::Result<()> {
        let n = state.n_tokens();
        match self {
            AnySession::Cpu(s) => s.import_state(state, n)?,
            AnySession::Cuda(c) => {
                c.session.import_state(state, n)?;
                // A later `eval_last` overwrites these; until then they mirror the device.
                c.logits = state.logits.clone().unwrap_or_default();
            }
        }
        Ok(())
    }
}

impl Timeline for AnySession<'_> {
    fn eval_last(&mut self, tokens: &[u32]) -> Result<&[f32], GenerateError> {
        match self {
            AnySession::Cpu(s) => s.eval_last(tokens),
            AnySession::Cuda(c) => {
                c.logits = c
                    .session
                    .eval(tokens)
                    .map_err(|e| GenerateError::Backend(e.to_string()))?;
                Ok(&c.logits)
            }
        }
    }

    fn n_past(&self) -> usize {
        match self {
            AnySession::Cpu(s) => Timeline::n_past(s.as_ref()),
            AnySession::Cuda(c) => c.session.n_past(),
        }
    }

    fn ctx(&self) -> usize {
        match self {
            AnySession::Cpu(s) => Timeline::ctx(s.as_ref()),
            AnySession::Cuda(c) => c.ctx,
        }
    }

    fn eval_greedy(&mut self, tokens: &[u32]) -> Result<Option<Sampled>, GenerateError> {
        let AnySession::Cuda(c) = self else {
            return Ok(None);
        };
        if host_sampling() {
            return Ok(None);
        }
        let g = c
            .session
            .eval_greedy(tokens)
            .map_err(|e| GenerateError::Backend(e.to_string()))?;
        // The row stays on the device; no stale host copy outlives the step.
        c.logits.clear();
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
        match self {
            AnySession::Cpu(_) => Err(GenerateError::Backend(
                "the CPU session selects no candidates, so it keeps no row to fetch".into(),
            )),
            AnySession::Cuda(c) => {
                c.logits = c
                    .session
                    .next_logits()
                    .map_err(|e| GenerateError::Backend(e.to_string()))?
                    .ok_or_else(|| GenerateError::Backend("no logits on the device".into()))?;
                Ok(&c.logits)
            }
        }
    }

    fn eval_candidates(
        &mut self,
        tokens: &[u32],
        k: usize,
    ) -> Result<Option<Candidates>, GenerateError> {
        let AnySession::Cuda(c) = self else {
            return Ok(None);
        };
        if k > TOPK_MAX || host_sampling() {
            return Ok(None);
        }
        let t = c
            .session
            .eval_candidates(tokens, k)
            .map_err(|e| GenerateError::Backend(e.to_string()))?;
        c.logits.clear();
        Ok(Some(Candidates {
            best: t.best,
            lse: t.lse,
            first_nan: t.first_nan,
            n_vocab: t.n_vocab,
        }))
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
    /// Values per logits row (the CUDA session does not expose its model's configuration).
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
