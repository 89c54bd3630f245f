//! ferrite-engine: one engine for every front end — sampling, the generation loop, the
//! slot scheduler, the prefix cache, the engine thread, and scoring of the forward pass
//! against reference fixtures.
//!
//! The sampler works on one logits row at a time and owns its random stream, so a seed and a
//! configuration always produce the same tokens whatever the forward pass's thread count.
//!
//! Front ends talk to the engine through [`inference`]: the [`Backend`] trait (tokenize,
//! render a chat, submit a [`GenRequest`], read [`GenEvent`]s from a channel whose drop
//! cancels the work). [`Engine`] implements it on a dedicated thread that owns the model
//! and one session per slot, driven by the [`scheduler`] (FIFO queue, chunked prefill,
//! continuous batching, cancellation) with the shared [`prefix`] cache (memory and disk).
//! The engine never sees HTTP or command-line concerns.
//!
//! [`speculate`] holds the proposers of speculative decoding ([`speculate::Lookup`]); the
//! loop verifies their drafts itself ([`generate_with`]) and so stays exact.
//!
//! Deviation from the target architecture (shared/guides/ARCHITECTURE.md): until the CUDA
//! backend implements the backend contract, this crate depends on `ferrite-cuda` and drives
//! `CudaSession`/`CudaBatch` directly beside the CPU `Session`/`Batch`.
//!
//! ```
//! use ferrite_engine::{Sampler, SamplerConfig};
//! let mut s = Sampler::new(SamplerConfig::default()).unwrap();
//! assert_eq!(s.sample(&[0.5, 2.0, 1.0], &[]).unwrap().token, 1);
//! ```

#![deny(missing_docs)]

pub mod budget;
pub mod cuda_timeline;
mod engine_thread;
pub mod generate;
pub mod held;
pub mod inference;
pub mod output;
pub mod prefix;
pub mod rng;
pub mod sampler;
#[cfg(test)]
mod sampler_equiv;
pub mod scheduler;
pub mod score;
pub mod speculate;
pub mod stops;

/// Structured output's constraints and vocabulary (llguidance), for front ends that build
/// an [`OutputFormat`].
pub use ferrite_grammar as grammar;

pub use cuda_timeline::{AnySession, CudaTimeline, ScoreSession, sampling_where};
pub use engine_thread::{Engine, EngineBackend, EngineConfig, EngineError, Speculation};
pub use generate::{
    Finish, Flow, GenerateError, Generation, Picker, Timeline, eval_sample, generate, generate_with,
};
pub use inference::{
    Backend, BackendError, CacheSource, ChatPrompt, EngineStats, FinishReason, GenEvent,
    GenRequest, OutputFormat, ReasoningBudget, SamplingParams, SpecLimits, SpecRequest,
    SubmitError, Timings, TokenLogprob, TopLogprob, Usage,
};
pub use sampler::{
    Candidates, SampleError, Sampled, Sampler, SamplerConfig, StopReason, find_stop_string,
    log_sum_exp, partial_stop_len, raw_logprobs,
};
pub use score::{
    CaseScore, LogitsCase, LogitsSource, Perplexity, ScoreError, ScoreMode, ScoreSummary,
    parse_logits_fixture, perplexity, score_case, summarize,
};
pub use stops::{Scanned, StopScanner};
