//! The real engine: a dedicated thread owning the model, the thread pool and one session
//! per slot, fed through a channel; [`Engine`] is its [`crate::Backend`] handle.
//!
//! Sessions borrow the model and the pool, so all three live on the engine thread's stack;
//! the HTTP side shares only the tokenizer (for tokenize/render) and the occupancy counters.

mod cpu;
mod cuda;

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::Sender;
use std::time::Instant;

use ferrite_tokenizer::{ChatRequest, ChatTemplate, Tokenizer};
use tokio::sync::mpsc::{UnboundedReceiver, unbounded_channel};

use crate::inference::{
    Backend, BackendError, ChatPrompt, EngineStats, GenEvent, GenRequest, SpecLimits, SubmitError,
};
use crate::prefix;
use crate::scheduler::{Counters, Job};

/// Where the engine runs the model.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum EngineBackend {
    /// CPU sessions on a thread pool, batched through `ferrite_model::Batch`.
    #[default]
    Cpu,
    /// CUDA sessions on device 0, batched through `ferrite_cuda::CudaBatch` (no prefix
    /// cache yet).
    Cuda,
}

/// How to start an [`Engine`].
#[derive(Clone, Debug)]
pub struct EngineConfig {
    /// GGUF file to load.
    pub model_path: PathBuf,
    /// Id reported by `/v1/models` and accepted in `model` fields.
    pub model_id: String,
    /// Other accepted names.
    pub aliases: Vec<String>,
    /// Context length per slot (clamped to the model's training context).
    pub n_ctx: usize,
    /// Number of slots (sequences decoded concurrently).
    pub parallel: usize,
    /// Compute threads of the forward pass.
    pub threads: usize,
    /// Most requests waiting for a slot before new ones get 429.
    pub queue_limit: usize,
    /// Most prompt tokens evaluated per scheduler step, over all slots.
    pub prefill_chunk: usize,
    /// The prefix cache shared by all slots (memory and optionally disk; CPU only).
    pub prefix_cache: prefix::PrefixCacheConfig,
    /// Where the model runs.
    pub backend: EngineBackend,
    /// KV cache element type of every slot (the CUDA backend takes only f16).
    pub kv: ferrite_model::KvType,
    /// Speculate in every slot (`--lookup` or `--draft-model`; the CPU backend, models
    /// without recurrent state); `None`: plain decoding.
    pub speculation: Option<Speculation>,
}

/// How every slot speculates.
#[derive(Clone, Debug, PartialEq)]
pub struct Speculation {
    /// The draft model (`--draft-model`), which must share the served model's vocabulary;
    /// each slot drafts in a session of it of its own. `None`: prompt lookup (`--lookup`).
    pub draft_model: Option<PathBuf>,
    /// Most draft tokens a step (`--draft-max`, 1 to 15).
    pub draft_max: usize,
    /// Fewest draft tokens a verify step takes (`--draft-min`, at most `draft_max`): a
    /// shorter draft is dropped and that step decodes plainly.
    pub draft_min: usize,
    /// The draft model stops drafting before its first token of probability below this
    /// (`--draft-p-min`, 0 to 1; 0: never). Prompt lookup has no probabilities: a positive
    /// value needs `draft_model`.
    pub p_min: f32,
}

impl Speculation {
    /// The bounds every request's speculation gets by default.
    pub fn limits(&self) -> SpecLimits {
        SpecLimits {
            draft_max: self.draft_max,
            draft_min: self.draft_min,
            p_min: self.p_min,
            draft_model: self.draft_model.is_some(),
        }
    }

    /// Why these bounds cannot be served: `--draft-min` above `--draft-max`, or a
    /// `--draft-p-min` out of [0, 1] or without a draft model.
    pub fn check(&self) -> Result<(), EngineError> {
        let fail = |m: String| Err(EngineError::Config(m));
        if self.draft_min > self.draft_max {
            return fail(format!(
                "--draft-min {} is more than --draft-max {}: no draft could be verified",
                self.draft_min, self.draft_max
            ));
        }
        if !(0.0..=1.0).contains(&self.p_min) {
            return fail(format!(
                "--draft-p-min {} is not a probability (0 to 1)",
                self.p_min
            ));
        }
        if self.p_min > 0.0 && self.draft_model.is_none() {
            return fail(format!(
                "--draft-p-min {} needs --draft-model: prompt lookup's guesses carry no \
                 probability to compare",
                self.p_min
            ));
        }
        Ok(())
    }

    /// The flag that asked for it, for errors.
    pub fn flag(&self) -> &'static str {
        if self.draft_model.is_some() {
            "--draft-model"
        } else {
            "--lookup"
        }
    }
}

/// Why the engine could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EngineError {
    /// The model file could not be loaded.
    #[error("loading the model: {0}")]
    Load(String),
    /// The model's tokenizer could not be built.
    #[error("building the tokenizer: {0}")]
    Tokenizer(String),
    /// A setting is invalid (zero slots, zero context, ...).
    #[error("invalid engine setting: {0}")]
    Config(String),
    /// The engine thread could not be started or died while loading.
    #[error("engine thread: {0}")]
    Thread(String),
}

/// Handle on the running engine thread.
pub struct Engine {
    config: EngineConfig,
    n_ctx: usize,
    backend_line: String,
    tokenizer: Arc<Tokenizer>,
    template: Option<ChatTemplate>,
    bos_text: Option<String>,
    jobs: Sender<Job>,
    counters: Arc<Counters>,
    cache_stats: Arc<prefix::CacheStats>,
    thread: std::thread::JoinHandle<()>,
}

impl Engine {
    /// The context length actually used per slot.
    pub fn n_ctx(&self) -> usize {
        self.n_ctx
    }

    /// What runs the model, as `ferrite run` reports it (`backend=cpu threads=…` or
    /// `backend=cuda device=…`).
    pub fn backend_line(&self) -> &str {
        &self.backend_line
    }

    /// Occupancy: the same figures `/metrics` shows.
    pub fn occupancy(&self) -> EngineStats {
        let active = self.counters.active.load(Ordering::SeqCst);
        let inflight = self.counters.inflight.load(Ordering::SeqCst);
        let cache = &self.cache_stats;
        let read = |v: &AtomicU64| v.load(Ordering::Relaxed);
        EngineStats {
            slots_total: self.config.parallel,
            slots_active: active,
            queue_depth: inflight.saturating_sub(active),
            queue_limit: self.config.queue_limit,
            kv_disk_written: read(&cache.written),
            kv_disk_rejected: read(&cache.rejected),
            batched_steps: self.counters.batched_steps.load(Ordering::Relaxed) as u64,
            spec_proposed: self.counters.spec_proposed.load(Ordering::Relaxed) as u64,
            spec_accepted: self.counters.spec_accepted.load(Ordering::Relaxed) as u64,
            prefix_memory_bytes: read(&cache.memory_bytes),
            prefix_memory_budget: read(&cache.memory_budget),
            prefix_memory_entries: read(&cache.memory_entries),
            kv_disk_bytes: read(&cache.disk_bytes),
            kv_disk_budget: read(&cache.disk_budget),
            kv_disk_files: read(&cache.disk_files),
        }
    }
}

impl Backend for Engine {
    fn model_id(&self) -> &str {
        &self.config.model_id
    }

    fn aliases(&self) -> Vec<String> {
        self.config.aliases.clone()
    }

    fn n_ctx(&self) -> usize {
        self.n_ctx
    }

    fn vocab_size(&self) -> usize {
        self.tokenizer.vocab_size()
    }

    fn tokenize(&self, text: &str, add_special: bool, parse_special: bool) -> Vec<u32> {
        // Templates that write the BOS text themselves must not get a second BOS.
        let has_bos = parse_special
            && self
                .bos_text
                .as_deref()
                .is_some_and(|b| !b.is_empty() && text.starts_with(b));
        self.tokenizer
            .encode(text, add_special && !has_bos, parse_special)
    }

    fn detokenize(&self, ids: &[u32]) -> Result<String, BackendError> {
        self.tokenizer
            .decode(ids, true)
            .map_err(|e| BackendError(e.to_string()))
    }

    fn is_control_token(&self, text: &str) -> bool {
        // The grammar's view of the vocabulary (`held::grammar_vocab`): a token with no
        // text bytes is a control token.
        match self.tokenizer.encode(text, false, true)[..] {
            [id] => self.tokenizer.token_bytes(id).is_none_or(<[u8]>::is_empty),
            _ => false,
        }
    }

    fn render_chat(&self, chat: &ChatPrompt) -> Result<String, BackendError> {
        let template = self.template.as_ref().ok_or_else(|| {
            BackendError("this model has no chat template; use /v1/completions".into())
        })?;
        template
            .render(&ChatRequest {
                messages: chat.messages.clone(),
                add_generation_prompt: true,
                tools: chat.tools.clone(),
                extra: chat.kwargs.clone(),
                ..ChatRequest::default()
            })
            .map_err(|e| BackendError(e.to_string()))
    }

    fn submit(&self, req: GenRequest) -> Result<UnboundedReceiver<GenEvent>, SubmitError> {
        let limit = self.config.parallel + self.config.queue_limit;
        let inflight = &self.counters.inflight;
        let mut current = inflight.load(Ordering::SeqCst);
        loop {
            if current >= limit {
                return Err(SubmitError::QueueFull {
                    queued: current.saturating_sub(self.config.parallel),
                });
            }
            match inflight.compare_exchange(
                current,
                current + 1,
                Ordering::SeqCst,
                Ordering::SeqCst,
            ) {
                Ok(_) => break,
                Err(now) => current = now,
            }
        }
        let (tx, rx) = unbounded_channel();
        let job = Job {
            req,
            tx,
            queued_at: Instant::now(),
        };
        if self.jobs.send(job).is_err() {
            inflight.fetch_sub(1, Ordering::SeqCst);
            return Err(SubmitError::Stopped);
        }
        Ok(rx)
    }

    fn stats(&self) -> EngineStats {
        self.occupancy()
    }

    fn healthy(&self) -> bool {
        !self.thread.is_finished()
    }

    fn speculation(&self) -> Option<SpecLimits> {
        self.config.speculation.as_ref().map(Speculation::limits)
    }
}
