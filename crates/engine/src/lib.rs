//! ferrite-engine: sampling, the generation loop, and scoring of the forward pass against
//! reference fixtures.
//!
//! The sampler works on one logits row at a time and owns its random stream, so a seed and a
//! configuration always produce the same tokens whatever the forward pass's thread count.
//!
//! ```
//! use ferrite_engine::{Sampler, SamplerConfig};
//! let mut s = Sampler::new(SamplerConfig::default()).unwrap();
//! assert_eq!(s.sample(&[0.5, 2.0, 1.0], &[]).unwrap().token, 1);
//! ```

#![deny(missing_docs)]

pub mod generate;
pub mod json_lex;
pub mod json_mode;
pub mod json_schema;
pub mod json_schema_prefix;
pub mod output;
pub mod rng;
pub mod sampler;
#[cfg(test)]
mod sampler_equiv;
pub mod score;

pub use generate::{
    Finish, Flow, GenerateError, Generation, Picker, Timeline, eval_sample, generate,
};
pub use sampler::{
    Candidates, SampleError, Sampled, Sampler, SamplerConfig, StopReason, find_stop_string,
    log_sum_exp, partial_stop_len, raw_logprobs,
};
pub use score::{
    CaseScore, LogitsCase, LogitsSource, Perplexity, ScoreError, ScoreMode, ScoreSummary,
    parse_logits_fixture, perplexity, score_case, summarize,
};
