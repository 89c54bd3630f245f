//! The generation loop: evaluate a prompt, then sample and feed back one token at a time
//! until a stop token, the token limit, the context end or the caller says stop.
//!
//! The loop owns no state of its own: the session keeps the KV cache, the sampler its
//! random stream, and the caller sees every token (with its log-probabilities) through a
//! callback, where it can also decode text and check stop strings.

use ferrite_model::{ModelError, Outputs, Session};

use crate::sampler::{SampleError, Sampled, Sampler, StopReason};

/// A timeline that [`generate`] can drive: appends tokens and returns the last one's logits.
/// Implemented by the CPU [`Session`]; other backends implement it through a wrapper.
pub trait Timeline {
    /// Appends `tokens` (at least one) and returns the logits of the last.
    fn eval_last(&mut self, tokens: &[u32]) -> Result<&[f32], GenerateError>;
    /// Tokens held.
    fn n_past(&self) -> usize;
    /// Capacity in tokens.
    fn ctx(&self) -> usize;
}

impl Timeline for Session<'_> {
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
    /// Another backend's forward pass failed.
    #[error("{0}")]
    Backend(String),
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
}

/// Appends `prompt` to `session` (at its current position; call `reset` first for a fresh
/// conversation) and generates. `on_token` sees each generated token before it is fed back.
/// Penalties look at `prompt` followed by the generated tokens.
pub fn generate<T, F>(
    session: &mut T,
    sampler: &mut Sampler,
    prompt: &[u32],
    mut on_token: F,
) -> Result<Generation, GenerateError>
where
    T: Timeline + ?Sized,
    F: FnMut(&Sampled) -> Flow,
{
    let mut history = prompt.to_vec();
    let mut tokens = Vec::new();
    let mut row = session.eval_last(prompt)?;
    loop {
        let s = sampler.sample(row, &history)?;
        if let Some(reason @ StopReason::StopToken(_)) = sampler.stop_reason(s.token, 0) {
            return Ok(Generation {
                tokens,
                finish: Finish::Sampler(reason),
            });
        }
        tokens.push(s.token);
        history.push(s.token);
        if on_token(&s) == Flow::Stop {
            return Ok(Generation {
                tokens,
                finish: Finish::Caller,
            });
        }
        if let Some(reason) = sampler.stop_reason(s.token, tokens.len()) {
            return Ok(Generation {
                tokens,
                finish: Finish::Sampler(reason),
            });
        }
        if session.n_past() >= session.ctx() {
            return Ok(Generation {
                tokens,
                finish: Finish::ContextFull,
            });
        }
        row = session.eval_last(&[s.token])?;
    }
}
