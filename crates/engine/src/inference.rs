//! The narrow contract between the HTTP layer and an inference engine.
//!
//! The HTTP layer speaks only in token ids, text and sampling parameters: it renders and
//! tokenizes prompts through [`Backend`], submits a [`GenRequest`] and reads [`GenEvent`]s
//! from the returned channel. Dropping that receiver is the cancellation signal: the engine
//! notices the closed channel at its next step boundary and frees the slot.

use std::sync::Arc;
use std::time::Duration;

use ferrite_grammar::Constraint;

pub use crate::budget::ReasoningBudget;

use tokio::sync::mpsc::UnboundedReceiver;

/// Sampling settings of one generation, already validated by the HTTP layer.
#[derive(Clone, Debug, PartialEq)]
pub struct SamplingParams {
    /// Softmax temperature; 0 means greedy.
    pub temperature: f32,
    /// Keep only the k most likely tokens (0 = off).
    pub top_k: usize,
    /// Nucleus threshold (1 = off).
    pub top_p: f32,
    /// Drop tokens below `min_p` times the best probability (0 = off).
    pub min_p: f32,
    /// OpenAI-style frequency penalty.
    pub frequency_penalty: f32,
    /// OpenAI-style presence penalty.
    pub presence_penalty: f32,
    /// Random seed; a fixed seed and settings give the same tokens.
    pub seed: u64,
    /// Added to these token ids' logits before anything else (OpenAI's `logit_bias`).
    pub logit_bias: Vec<(u32, f32)>,
    /// What the output must be.
    pub format: OutputFormat,
}

/// What a generation's output must be (OpenAI's `response_format`).
#[derive(Clone, Debug, Default, PartialEq)]
pub enum OutputFormat {
    /// Any text.
    #[default]
    Text,
    /// Text of this constraint, then the end of generation: JSON mode, structured outputs,
    /// a regex or Lark grammar, or a forced tool call in the model's markup.
    Held(Arc<Constraint>),
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            frequency_penalty: 0.0,
            presence_penalty: 0.0,
            seed: 0,
            logit_bias: Vec::new(),
            format: OutputFormat::Text,
        }
    }
}

/// One generation job: a tokenized prompt and how to continue it.
#[derive(Clone, Debug)]
pub struct GenRequest {
    /// Prompt token ids (never empty).
    pub prompt: Vec<u32>,
    /// Sampling settings.
    pub sampling: SamplingParams,
    /// Most tokens to generate.
    pub max_tokens: usize,
    /// Stop strings: generation ends before the first occurrence, which is not emitted.
    pub stop: Vec<String>,
    /// Number of alternatives to report per token; `None` reports no logprobs at all.
    pub logprobs: Option<usize>,
    /// Also report the logprob of every prompt token after the first (with `logprobs`
    /// alternatives) as [`GenEvent::PromptLogprobs`]. The whole prompt is then evaluated:
    /// no cached prefix is reused.
    pub prompt_logprobs: bool,
    /// Most tokens of reasoning before the block is closed for the answer; `None`: no limit.
    pub reasoning_budget: Option<ReasoningBudget>,
    /// This request's own bounds on speculation, each defaulting to the server's.
    pub speculative: SpecRequest,
}

/// A request's speculation fields (llama.cpp's `speculative.n_max`, `speculative.n_min`,
/// `speculative.p_min`); `None` takes the server's (`--draft-max`, `--draft-min`,
/// `--draft-p-min`). The HTTP layer refuses values out of the server's bounds; the
/// scheduler caps them again, so a value that got past it can only shorten drafts.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct SpecRequest {
    /// Most draft tokens a step (0: this request decodes plainly).
    pub n_max: Option<usize>,
    /// Fewest draft tokens worth verifying: a shorter draft is dropped and that step
    /// decodes plainly.
    pub n_min: Option<usize>,
    /// A draft model stops drafting before its first token of probability below this.
    pub p_min: Option<f32>,
}

/// How a server speculates: the defaults and the bounds of every request's
/// [`SpecRequest`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SpecLimits {
    /// Most draft tokens a step (`--draft-max`).
    pub draft_max: usize,
    /// Fewest draft tokens a verify step takes (`--draft-min`, at most `draft_max`).
    pub draft_min: usize,
    /// The draft model's confidence threshold (`--draft-p-min`, 0 to 1).
    pub p_min: f32,
    /// Whether a draft model proposes (else prompt lookup, whose proposals carry no
    /// probability for `p_min` to bound).
    pub draft_model: bool,
}

/// Log-probability of a generated token and its best alternatives.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenLogprob {
    /// Text of the token itself (lossy for partial UTF-8).
    pub token: String,
    /// The token's exact bytes: a byte-level token may hold part of a UTF-8 character,
    /// which only joining the bytes of neighbouring tokens rebuilds.
    pub bytes: Vec<u8>,
    /// Its log-probability.
    pub logprob: f32,
    /// Best alternatives, most likely first.
    pub top: Vec<TopLogprob>,
}

/// One alternative of a [`TokenLogprob`].
#[derive(Clone, Debug, PartialEq)]
pub struct TopLogprob {
    /// Text of the token (lossy for partial UTF-8).
    pub token: String,
    /// The token's exact bytes.
    pub bytes: Vec<u8>,
    /// Its log-probability.
    pub logprob: f32,
}

/// Why a generation ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// End-of-generation token or a stop string.
    Stop,
    /// `max_tokens` reached or the context is full.
    Length,
}

/// Where the reused prompt prefix of a request came from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum CacheSource {
    /// Nothing was reused.
    #[default]
    None,
    /// The KV of a slot or the shared in-memory prefix cache.
    Memory,
    /// A snapshot file of the disk cache (`--kv-disk-dir`).
    Disk,
}

impl CacheSource {
    /// The name used in responses and logs: `none`, `memory` or `disk`.
    pub fn as_str(self) -> &'static str {
        match self {
            CacheSource::None => "none",
            CacheSource::Memory => "memory",
            CacheSource::Disk => "disk",
        }
    }
}

/// Token counts of a finished generation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    /// Prompt length in tokens.
    pub prompt_tokens: usize,
    /// Prompt tokens whose KV was reused from an earlier request.
    pub cached_tokens: usize,
    /// Where those tokens came from.
    pub cache_source: CacheSource,
    /// Generated tokens.
    pub completion_tokens: usize,
}

/// Wall-clock split of a finished generation.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Timings {
    /// Time waiting for a free slot.
    pub queue: Duration,
    /// Time evaluating the uncached prompt suffix.
    pub prefill: Duration,
    /// Time generating tokens after the first.
    pub decode: Duration,
}

/// What an engine reports about a running generation, in order.
#[derive(Clone, Debug, PartialEq)]
pub enum GenEvent {
    /// The request got a slot; sent once, before any token.
    Started {
        /// Prompt tokens whose KV was reused.
        cached_tokens: usize,
    },
    /// Logprobs of prompt tokens `1..`, in order, possibly split over several events (one
    /// per prefill chunk); all arrive before the first [`GenEvent::Token`]. Only sent when
    /// [`GenRequest::prompt_logprobs`] asks for them.
    PromptLogprobs(Vec<TokenLogprob>),
    /// One generated token. `text` is the text released by this token; it may be empty while
    /// a multi-byte character or a possible stop string is held back.
    Token {
        /// Token id.
        id: u32,
        /// Text safe to show now.
        text: String,
        /// Logprobs when requested.
        logprob: Option<TokenLogprob>,
    },
    /// The generation ended; always the last event of a successful run.
    Done {
        /// Why it ended.
        finish: FinishReason,
        /// The stop string that ended it, if any.
        stop_sequence: Option<String>,
        /// Held-back text released at the end (never contains the stop string).
        tail: String,
        /// Token counts.
        usage: Usage,
        /// Timings.
        timings: Timings,
    },
    /// The engine failed; the last event. The message is for logs, not for clients.
    Failed(String),
}

/// Why a request could not be queued.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SubmitError {
    /// The waiting queue is at its bound; the client should retry later.
    #[error("the server is busy: {queued} requests already waiting")]
    QueueFull {
        /// Requests already waiting.
        queued: usize,
    },
    /// The engine has stopped.
    #[error("the engine is not running")]
    Stopped,
}

/// A failure of a text operation of the backend (rendering or decoding).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct BackendError(pub String);

/// Load and occupancy figures for `/metrics`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EngineStats {
    /// Number of slots (parallel sequences).
    pub slots_total: usize,
    /// Slots running a request.
    pub slots_active: usize,
    /// Requests waiting for a slot.
    pub queue_depth: usize,
    /// Most requests that may wait for a slot (`--queue`).
    pub queue_limit: usize,
    /// Disk-cache snapshot files written since start.
    pub kv_disk_written: u64,
    /// Disk-cache snapshot files rejected since start (another model or setting, damaged).
    pub kv_disk_rejected: u64,
    /// Steps that evaluated two or more slots in one batched forward pass.
    pub batched_steps: u64,
    /// Draft tokens that speculation (`serve --lookup`) proposed and verified.
    pub spec_proposed: u64,
    /// Draft tokens that verification accepted (each one a token emitted without a
    /// forward pass of its own).
    pub spec_accepted: u64,
    /// Bytes of prefix-cache checkpoints held in memory.
    pub prefix_memory_bytes: u64,
    /// The prefix cache's memory budget (`--kv-mem-space-mb`; 0 when there is none).
    pub prefix_memory_budget: u64,
    /// Prefix-cache checkpoints held in memory.
    pub prefix_memory_entries: u64,
    /// Bytes of the disk cache directory, as its budget counts them.
    pub kv_disk_bytes: u64,
    /// The disk cache's budget (`--kv-disk-space-mb`; 0 when there is none).
    pub kv_disk_budget: u64,
    /// Complete files of the disk cache directory.
    pub kv_disk_files: u64,
}

/// A chat to render into prompt text with the model's template.
#[derive(Clone, Debug, Default)]
pub struct ChatPrompt {
    /// Messages as `{"role": ..., "content": "..."}` objects (content already flattened to text
    /// except for tool calls, which keep their structure).
    pub messages: Vec<serde_json::Value>,
    /// Tool definitions (OpenAI function format), passed to the template.
    pub tools: Option<serde_json::Value>,
    /// Further template variables (`enable_thinking`, `reasoning_effort`, …).
    pub kwargs: serde_json::Map<String, serde_json::Value>,
}

/// An inference engine as seen by the HTTP layer.
pub trait Backend: Send + Sync + 'static {
    /// The id clients use in `model` fields.
    fn model_id(&self) -> &str;
    /// Other names accepted in `model` fields (file name, path).
    fn aliases(&self) -> Vec<String>;
    /// Context length of one slot, in tokens.
    fn n_ctx(&self) -> usize;
    /// Number of token ids (valid ids are below this).
    fn vocab_size(&self) -> usize;
    /// Tokenize text; with `add_special`, add the model's BOS when it wants one and the text
    /// does not already start with it.
    fn tokenize(&self, text: &str, add_special: bool, parse_special: bool) -> Vec<u32>;
    /// Decode token ids to text.
    fn detokenize(&self, ids: &[u32]) -> Result<String, BackendError>;
    /// Whether `text` is one control token of the vocabulary, which a grammar over it must
    /// name as that token and never spell as text: a tool syntax's markers are text in one
    /// model's vocabulary and control tokens in another's.
    fn is_control_token(&self, text: &str) -> bool;
    /// Render a chat with the model's template, adding the assistant generation prompt.
    fn render_chat(&self, chat: &ChatPrompt) -> Result<String, BackendError>;
    /// Queue a generation; events arrive on the returned channel.
    fn submit(&self, req: GenRequest) -> Result<UnboundedReceiver<GenEvent>, SubmitError>;
    /// Current occupancy.
    fn stats(&self) -> EngineStats;
    /// Whether the engine can still serve (false once its thread has died).
    fn healthy(&self) -> bool;
    /// How the engine speculates, else `None`: the defaults and bounds of a request's
    /// `speculative` fields.
    fn speculation(&self) -> Option<SpecLimits> {
        None
    }
}
