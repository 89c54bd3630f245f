//! The engine thread over the real model: load, build the tokenizer, create one session per
//! slot, then run the scheduler until the [`super::Engine`] handle is dropped. With
//! [`EngineBackend::Cuda`] the sessions live on the GPU (`cuda.rs`).

use std::sync::mpsc::{Receiver, SyncSender, channel, sync_channel};
use std::sync::{Arc, OnceLock};

use ferrite_cpu::ThreadPool;
use ferrite_model::{
    Batch, KvType, LoadOptions, Model, ModelConfig, Session, Weights, check_slot_memory,
    physical_memory, session_bytes,
};
use ferrite_tokenizer::Tokenizer;

use super::{Engine, EngineBackend, EngineConfig, EngineError};
use crate::generate::GenerateError;
use crate::held::{Chooser, HeldError, grammar_vocab};
use crate::inference::{GenRequest, OutputFormat};
use crate::prefix::{CacheStats, PrefixCache};
use crate::scheduler::{BatchEval, Counters, Job, Limits, Picked, RowPicker, Runtime, Scheduler};
use crate::speculate::{Draft, Lookup, Proposer, check_vocab};
use crate::{Sampler, SamplerConfig, raw_logprobs};

/// Continuous batching over real sessions on any backend: every step's slots share one
/// forward pass through a [`Batch`] made once (on the CPU bit-identical to stepping them
/// one by one), speculating slots' verify rows included.
pub(super) struct SessionBatch<Buf = Vec<f32>, Angles = ferrite_cpu::CpuAngles>(
    pub(super) Batch<Buf, Angles>,
);

impl<'m, B: Weights + Clone> BatchEval<Session<'m, B>> for SessionBatch<B::Buf, B::Angles> {
    fn eval_many(
        &mut self,
        seqs: &mut [&mut Session<'m, B>],
        inputs: &[&[u32]],
        tails: &[usize],
    ) -> Result<Vec<Vec<f32>>, GenerateError> {
        let logits = self.0.step_tails(seqs, inputs, tails)?;
        let mut at = 0;
        Ok(tails
            .iter()
            .map(|&t| {
                at += t;
                logits.data[(at - t) * logits.n_vocab..at * logits.n_vocab].to_vec()
            })
            .collect())
    }
}

/// A request's sampler: free, or held to JSON. Log-probabilities cost a pass of `exp` over
/// the whole vocabulary per token, so they are computed only for requests that asked for
/// them, and always from the raw row.
struct RequestSampler {
    chooser: Chooser,
    /// Alternatives to report, when log-probabilities were asked for.
    logprobs: Option<usize>,
}

impl RowPicker for RequestSampler {
    fn pick(&mut self, logits: &[f32], history: &[u32]) -> Result<Picked, GenerateError> {
        let token = self.chooser.next_token(logits, history)?;
        Ok(self.picked(logits, token))
    }

    fn force(&mut self, logits: &[f32], token: u32) -> Result<Picked, GenerateError> {
        self.chooser.force(token)?;
        Ok(self.picked(logits, token))
    }
}

impl RequestSampler {
    /// `token` as chosen from `logits`, with its log-probabilities when asked for.
    fn picked(&self, logits: &[f32], token: u32) -> Picked {
        let (logprob, top) = match self.logprobs {
            Some(n) => {
                let (lp, top) = raw_logprobs(logits, token, n);
                (Some(lp), top)
            }
            None => (None, Vec::new()),
        };
        Picked {
            token,
            logprob,
            top,
        }
    }
}

/// Sampling and decoding over the model's tokenizer.
pub(super) struct ModelRuntime<'t> {
    tokenizer: &'t Tokenizer,
    eog: Vec<u32>,
    /// The vocabulary as the grammar reads it, made on the first held request.
    grammar_vocab: OnceLock<Result<ferrite_grammar::Vocab, ferrite_grammar::GrammarError>>,
}

impl<'t> ModelRuntime<'t> {
    /// The runtime of `tokenizer`'s model.
    pub(super) fn new(tokenizer: &'t Tokenizer) -> ModelRuntime<'t> {
        ModelRuntime {
            eog: tokenizer.end_of_generation_ids(),
            tokenizer,
            grammar_vocab: OnceLock::new(),
        }
    }
}

impl Runtime for ModelRuntime<'_> {
    fn picker(&self, req: &GenRequest) -> Result<Box<dyn RowPicker>, GenerateError> {
        let p = &req.sampling;
        // top_p = 0 keeps only the best token: the same as greedy.
        let greedy = p.top_p <= 0.0;
        let cfg = SamplerConfig {
            temperature: if greedy { 0.0 } else { p.temperature },
            top_k: p.top_k,
            top_p: if greedy { 1.0 } else { p.top_p },
            min_p: p.min_p,
            repeat_penalty: 1.0,
            frequency_penalty: p.frequency_penalty,
            presence_penalty: p.presence_penalty,
            penalty_last_n: 64,
            seed: p.seed,
            max_tokens: 0,
            stop_ids: Vec::new(),
            n_logprobs: req.logprobs.unwrap_or(0),
            logit_bias: p.logit_bias.clone(),
        };
        let sampler = Sampler::new(cfg)?;
        let chooser = match &p.format {
            OutputFormat::Text => Chooser::Free(sampler),
            OutputFormat::Held(c) => {
                let vocab = self
                    .grammar_vocab
                    .get_or_init(|| grammar_vocab(self.tokenizer))
                    .as_ref()
                    .map_err(|e| HeldError::Grammar(e.clone()))?;
                Chooser::new(sampler, Some(c), vocab)?
            }
        };
        Ok(Box::new(RequestSampler {
            chooser,
            logprobs: req.logprobs,
        }))
    }

    fn is_eog(&self, token: u32) -> bool {
        self.eog.contains(&token)
    }

    fn decode(&self, ids: &[u32]) -> String {
        self.tokenizer.decode(ids, false).unwrap_or_default()
    }

    fn token_bytes(&self, id: u32) -> Vec<u8> {
        self.tokenizer
            .token_bytes(id)
            .map(<[u8]>::to_vec)
            .unwrap_or_default()
    }
}

/// What the engine thread reports once loaded: the tokenizer, the context per slot and
/// the backend line.
pub(super) type Ready = Result<(Arc<Tokenizer>, usize, String), EngineError>;

fn engine_thread(
    cfg: EngineConfig,
    ready: SyncSender<Ready>,
    jobs: Receiver<Job>,
    counters: Arc<Counters>,
    cache_stats: Arc<CacheStats>,
) {
    let model = match Model::load(&cfg.model_path, LoadOptions::default()) {
        Ok(m) => m,
        Err(e) => {
            let _ = ready.send(Err(EngineError::Load(format!(
                "{}: {e}",
                cfg.model_path.display()
            ))));
            return;
        }
    };
    let tokenizer = match Tokenizer::from_gguf(model.gguf()) {
        Ok(t) => Arc::new(t),
        Err(e) => {
            let _ = ready.send(Err(EngineError::Tokenizer(e.to_string())));
            return;
        }
    };
    let n_ctx = served_ctx(&model, cfg.n_ctx);
    if cfg.backend == EngineBackend::Cuda {
        if cfg.kv != KvType::F16 {
            let why = format!(
                "the CUDA backend keeps an f16 KV cache, not {}",
                cfg.kv.name()
            );
            let _ = ready.send(Err(EngineError::Config(why)));
            return;
        }
        if let Some(spec) = &cfg.speculation {
            // Its sessions evaluate a draft one token at a time: verifying would be slower
            // than plain decoding.
            let why = format!(
                "{} runs on the CPU backend only; add --backend cpu",
                spec.flag()
            );
            let _ = ready.send(Err(EngineError::Config(why)));
            return;
        }
        return super::cuda::run(&cfg, &model, &tokenizer, n_ctx, ready, &jobs, counters);
    }
    let pool = match ThreadPool::new(cfg.threads.max(1)) {
        Ok(p) => p,
        Err(e) => {
            let _ = ready.send(Err(EngineError::Thread(e.to_string())));
            return;
        }
    };
    let draft = match speculation(&cfg, &model, &tokenizer) {
        Ok(d) => d,
        Err(e) => {
            let _ = ready.send(Err(e));
            return;
        }
    };
    let draft_ctx = draft.as_ref().map_or(0, |d| served_ctx(d, n_ctx));
    let slots = check_slots(
        &cfg,
        model.config(),
        draft.as_ref().map(|d| (d.config(), draft_ctx)),
        n_ctx,
        physical_memory(),
    );
    if let Err(e) = slots {
        let _ = ready.send(Err(e));
        return;
    }
    // Before the server reports ready, so that no request waits for it.
    model.pack_weights(&pool);
    if let Some(d) = &draft {
        d.pack_weights(&pool);
    }
    let sessions: Result<Vec<Session<'_>>, _> = (0..cfg.parallel)
        .map(|_| Session::new(&model, &pool, n_ctx, cfg.kv))
        .collect();
    let sessions = match sessions {
        Ok(s) => s,
        Err(e) => {
            let _ = ready.send(Err(EngineError::Load(format!("creating sessions: {e}"))));
            return;
        }
    };
    let proposers = match proposers(&cfg, draft.as_ref(), &pool, draft_ctx) {
        Ok(p) => p,
        Err(e) => {
            let _ = ready.send(Err(e));
            return;
        }
    };
    let draft_max = cfg.speculation.as_ref().map_or(0, |s| s.draft_max);
    // A step holds at most the prefill budget plus, per slot, one decode token and its
    // draft.
    let batch = match Batch::new(cfg.prefill_chunk.max(1) + cfg.parallel * (1 + draft_max)) {
        Ok(b) => b,
        Err(e) => {
            let _ = ready.send(Err(EngineError::Load(format!("creating the batch: {e}"))));
            return;
        }
    };
    let line = format!(
        "backend=cpu threads={} simd={} {} kv={}",
        pool.n_threads(),
        ferrite_quant::simd_level(),
        model.cpu_kernels(),
        cfg.kv.name()
    );
    // Before the server reports ready, so that `/metrics` shows the cache's budgets from
    // the first request on.
    let cache = prefix_cache(&cfg, &model, n_ctx, cache_stats);
    if ready.send(Ok((tokenizer.clone(), n_ctx, line))).is_err() {
        return;
    }
    let rt = ModelRuntime::new(&tokenizer);
    let mut scheduler = Scheduler::new(&rt, sessions, counters, limits(&cfg, &model, n_ctx))
        .with_batcher(Box::new(SessionBatch(batch)));
    if let Some(spec) = &cfg.speculation {
        scheduler = scheduler.with_proposers(proposers, spec.limits());
    }
    match cache {
        Some(cache) => scheduler.with_prefix_store(Box::new(cache)).run(&jobs),
        None => scheduler.run(&jobs),
    }
}

/// Checks the speculation `cfg` asks for and loads its draft model, when it names one:
/// at `model`'s precision, refused unless its vocabulary is `tokenizer`'s (same tokens,
/// same ids, same logit rows). Speculation is refused for a model with recurrent state:
/// its truncation replays the kept tokens from a checkpoint, so every rejected draft would
/// cost up to a whole prefill.
fn speculation(
    cfg: &EngineConfig,
    model: &Model,
    tokenizer: &Tokenizer,
) -> Result<Option<Model>, EngineError> {
    let Some(spec) = &cfg.speculation else {
        return Ok(None);
    };
    let flag = spec.flag();
    if model.config().state_slots().0 > 0 {
        return Err(EngineError::Config(format!(
            "{flag}: this model keeps recurrent state, which a rejected draft would \
             replay from a checkpoint; serve it without {flag}"
        )));
    }
    Lookup::new(spec.draft_max).map_err(|e| EngineError::Config(format!("--draft-max: {e}")))?;
    spec.check()?;
    let Some(path) = &spec.draft_model else {
        return Ok(None);
    };
    let draft = Model::load(
        path,
        LoadOptions {
            precision: model.precision(),
        },
    )
    .map_err(|e| EngineError::Load(format!("the draft model {}: {e}", path.display())))?;
    let draft_tokenizer = Tokenizer::from_gguf(draft.gguf())
        .map_err(|e| EngineError::Tokenizer(format!("the draft model {}: {e}", path.display())))?;
    check_vocab(
        tokenizer,
        model.config().n_vocab,
        &draft_tokenizer,
        draft.config().n_vocab,
    )
    .map_err(|e| {
        EngineError::Config(format!(
            "--draft-model {} cannot draft for {}: the two models must share one \
             vocabulary: {e}",
            path.display(),
            cfg.model_path.display()
        ))
    })?;
    Ok(Some(draft))
}

/// One proposer a slot for the speculation `cfg` asks for (none without): a session of
/// `draft` at `draft_ctx` positions each, else prompt lookup.
fn proposers<'m>(
    cfg: &EngineConfig,
    draft: Option<&'m Model>,
    pool: &'m ThreadPool,
    draft_ctx: usize,
) -> Result<Vec<Box<dyn Proposer + 'm>>, EngineError> {
    let Some(spec) = &cfg.speculation else {
        return Ok(Vec::new());
    };
    let Some(d) = draft else {
        let lookup = Lookup::new(spec.draft_max)
            .map_err(|e| EngineError::Config(format!("--draft-max: {e}")))?;
        return Ok((0..cfg.parallel)
            .map(|_| Box::new(lookup.clone()) as Box<dyn Proposer>)
            .collect());
    };
    (0..cfg.parallel)
        .map(|_| {
            Session::new(d, pool, draft_ctx, cfg.kv)
                .map(|s| Box::new(Draft::new(s)) as Box<dyn Proposer + 'm>)
                .map_err(|e| EngineError::Load(format!("creating draft sessions: {e}")))
        })
        .collect()
}

/// The context a session of `model` gets when the server asks for `n_ctx`: clamped to
/// the model's training context.
fn served_ctx(model: &Model, n_ctx: usize) -> usize {
    match model.config().ctx_train {
        0 => n_ctx,
        train => n_ctx.min(train),
    }
}

/// Checks that `cfg.parallel` slots of `n_ctx` positions of `target` fit in `memory`
/// bytes, all full, with what each holds beside its cache (see [`slot_extra`]). When only
/// the draft's sessions make them not fit, the refusal says so.
fn check_slots(
    cfg: &EngineConfig,
    target: &ModelConfig,
    draft: Option<(&ModelConfig, usize)>,
    n_ctx: usize,
    memory: Option<usize>,
) -> Result<(), EngineError> {
    let fits = |draft| {
        let beside = slot_extra(cfg, target, draft)?;
        Ok::<_, EngineError>(
            check_slot_memory(target, cfg.kv, (cfg.parallel, n_ctx), beside, memory)
                .map_err(|e| e.to_string()),
        )
    };
    let Err(e) = fits(draft)? else {
        return Ok(());
    };
    let Some((_, draft_ctx)) = draft else {
        return Err(EngineError::Config(format!(
            "{e} (lower --parallel or --ctx)"
        )));
    };
    let hint = if fits(None)?.is_ok() {
        format!(
            "; without the draft model's {} sessions of {draft_ctx} positions they would \
             fit (lower --parallel or --ctx, or use a smaller --draft-model)",
            cfg.parallel
        )
    } else {
        " (lower --parallel or --ctx)".to_string()
    };
    Err(EngineError::Config(format!(
        "{e}, draft sessions and verify rows included{hint}"
    )))
}

/// Bytes each slot holds besides its own KV cache: its session of the draft model when
/// full (`draft`: its config and positions), and the logits of its rows of a step (the
/// pending token's and `--draft-max` draft tokens'), once in the batch and once in the
/// scheduler's copy.
fn slot_extra(
    cfg: &EngineConfig,
    target: &ModelConfig,
    draft: Option<(&ModelConfig, usize)>,
) -> Result<usize, EngineError> {
    let overflow = || EngineError::Config("the slots' memory overflows".into());
    let rows = 1 + cfg.speculation.as_ref().map_or(0, |s| s.draft_max);
    let logits = rows
        .checked_mul(target.n_vocab)
        .and_then(|n| n.checked_mul(2 * std::mem::size_of::<f32>()))
        .ok_or_else(overflow)?;
    let Some((d, draft_ctx)) = draft else {
        return Ok(logits);
    };
    session_bytes(d, cfg.kv, draft_ctx)
        .map_err(|e| EngineError::Config(format!("--draft-model: {e}")))?
        .and_then(|b| b.checked_add(logits))
        .ok_or_else(overflow)
}

/// The scheduler's limits for `model`: a hybrid's chunks stop on its checkpoints.
pub(super) fn limits(cfg: &EngineConfig, model: &Model, n_ctx: usize) -> Limits {
    Limits {
        n_ctx,
        prefill_chunk: cfg.prefill_chunk,
        checkpoint_every: (model.config().state_slots().0 > 0)
            .then_some(ferrite_model::CHECKPOINT_EVERY),
    }
}

/// The shared prefix cache, or `None` when both its memory and disk parts are off. A disk
/// directory that cannot be used is reported and the server runs without it.
fn prefix_cache(
    cfg: &EngineConfig,
    model: &Model,
    n_ctx: usize,
    stats: Arc<CacheStats>,
) -> Option<PrefixCache> {
    let mut pc = cfg.prefix_cache.clone();
    let sha = match &pc.disk {
        Some((dir, _)) => match ferrite_kvstore::model_sha256(&cfg.model_path, Some(dir)) {
            Ok(sha) => sha,
            Err(e) => {
                eprintln!("kv-cache: disk cache disabled: hashing the model: {e}");
                pc.disk = None;
                [0; 32]
            }
        },
        None => [0; 32],
    };
    if pc.memory_bytes == 0 && pc.disk.is_none() {
        return None;
    }
    let compat = ferrite_kvstore::Compat::for_session(model, sha, cfg.kv, n_ctx);
    match PrefixCache::new(pc, compat, stats) {
        Ok(c) => Some(c),
        Err(e) => {
            eprintln!("kv-cache: prefix cache disabled: {e}");
            None
        }
    }
}

impl Engine {
    /// Load the model on a new engine thread and return once it is ready to serve.
    pub fn start(cfg: EngineConfig) -> Result<Engine, EngineError> {
        if cfg.parallel == 0
            || cfg.n_ctx < 2
            || cfg.prefill_chunk == 0
            || cfg.prefix_cache.block == 0
        {
            return Err(EngineError::Config(format!(
                "parallel={} ctx={} prefill_chunk={}",
                cfg.parallel, cfg.n_ctx, cfg.prefill_chunk
            )));
        }
        let (ready_tx, ready_rx) = sync_channel(1);
        let (jobs_tx, jobs_rx) = channel();
        let counters = Arc::new(Counters::default());
        let thread_cfg = cfg.clone();
        let thread_counters = counters.clone();
        let cache_stats = Arc::new(CacheStats::default());
        let thread_stats = cache_stats.clone();
        let thread = std::thread::Builder::new()
            .name("ferrite-engine".into())
            .spawn(move || {
                engine_thread(thread_cfg, ready_tx, jobs_rx, thread_counters, thread_stats)
            })
            .map_err(|e| EngineError::Thread(e.to_string()))?;
        let (tokenizer, n_ctx, backend_line) = ready_rx
            .recv()
            .map_err(|_| EngineError::Thread("the engine thread died while loading".into()))??;
        let template = tokenizer.chat_template_renderer().ok();
        let bos_text = tokenizer
            .bos_id()
            .and_then(|id| tokenizer.piece(id))
            .map(str::to_string);
        Ok(Engine {
            config: cfg,
            n_ctx,
            backend_line,
            tokenizer,
            template,
            bos_text,
            jobs: jobs_tx,
            counters,
            cache_stats,
            thread,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    #[test]
    fn requests_without_logprobs_get_the_same_tokens_and_no_logprobs() {
        // The token-only path must follow the same random stream as the full one, and the
        // reported log-probabilities are the sampler's own, bit for bit.
        let logits: Vec<f32> = (0..500).map(|i| ((i * 37) % 101) as f32 * 0.05).collect();
        for temperature in [0.0, 0.9] {
            let cfg = SamplerConfig {
                temperature,
                top_p: 0.95,
                seed: 3,
                n_logprobs: 2,
                ..SamplerConfig::default()
            };
            let free = |logprobs| RequestSampler {
                chooser: Chooser::Free(Sampler::new(cfg.clone()).unwrap()),
                logprobs,
            };
            let (mut with, mut without) = (free(Some(2)), free(None));
            let mut plain = Sampler::new(cfg.clone()).unwrap();
            for _ in 0..20 {
                let a = with.pick(&logits, &[]).unwrap();
                let b = without.pick(&logits, &[]).unwrap();
                let want = plain.sample(&logits, &[]).unwrap();
                assert_eq!(a.token, b.token);
                assert_eq!(a.token, want.token);
                assert_eq!(a.logprob.map(f32::to_bits), Some(want.logprob.to_bits()));
                assert_eq!(a.top, want.top);
                assert_eq!((b.logprob, b.top.len()), (None, 0));
            }
        }
    }

    /// A config speculating with at most 8 draft tokens a step in 4 slots of f16 KV.
    fn drafting() -> EngineConfig {
        EngineConfig {
            model_path: PathBuf::new(),
            model_id: String::new(),
            aliases: Vec::new(),
            n_ctx: 512,
            parallel: 4,
            threads: 1,
            queue_limit: 4,
            prefill_chunk: 8,
            prefix_cache: Default::default(),
            backend: EngineBackend::Cpu,
            kv: KvType::F16,
            speculation: Some(crate::Speculation {
                draft_model: Some(PathBuf::from("draft.gguf")),
                draft_max: 8,
                draft_min: 0,
                p_min: 0.0,
            }),
        }
    }

    #[test]
    fn slot_memory_counts_the_draft_sessions_and_the_verify_logits() {
        // Oracle: hand arithmetic from the two configs (SmolLM2 serving, Gemma 3 drafting,
        // so that the two terms differ), whose shapes are asserted first.
        let (Some(t), Some(d)) = (
            ferrite_testkit::real_model(ferrite_testkit::SMOLLM2),
            ferrite_testkit::real_model(ferrite_testkit::GEMMA3),
        ) else {
            println!("skipped: SmolLM2 or Gemma 3 is not in the model cache");
            return;
        };
        let config = |p: &std::path::Path| {
            ModelConfig::from_gguf(&ferrite_gguf::Gguf::open(p).unwrap()).unwrap()
        };
        let (target, draft) = (config(&t), config(&d));
        let shape = |c: &ModelConfig| (c.kv_layers(), c.n_kv_head, c.head_dim, c.n_vocab);
        assert_eq!(shape(&target), (30, 3, 64, 49_152));
        assert_eq!(shape(&draft), (18, 1, 256, 262_144));
        // A position of f16 K and V: layers x 2 (K, V) x heads x head size x 2 bytes.
        let target_token = 30 * 2 * 3 * 64 * 2;
        let draft_token = 18 * 2 * 256 * 2;
        assert_eq!((target_token, draft_token), (23_040, 18_432));
        assert_eq!(
            session_bytes(&draft, KvType::F16, 512).unwrap(),
            Some(draft_token * 512)
        );
        // The verify rows: the pending token and 8 drafts, target-vocabulary f32 logits,
        // held twice (the batch, the scheduler's copy).
        let cfg = drafting();
        let logits = 9 * 49_152 * 4 * 2;
        assert_eq!(logits, 3_538_944);
        assert_eq!(slot_extra(&cfg, &target, None).unwrap(), logits);
        let beside = logits + draft_token * 512;
        assert_eq!(
            slot_extra(&cfg, &target, Some((&draft, 512))).unwrap(),
            beside
        );
        // A budget the 4 slots fit without their draft sessions, not with them.
        let without = 4 * (target_token * 512 + logits);
        let with = 4 * (target_token * 512 + beside);
        let check = |draft, memory| check_slots(&cfg, &target, draft, 512, Some(memory));
        assert!(check(None, without).is_ok());
        assert!(check(Some((&draft, 512)), with).is_ok());
        let err = check(Some((&draft, 512)), with - 1)
            .unwrap_err()
            .to_string();
        println!("{err}");
        assert!(
            err.contains("4 sequences of 512 positions")
                && err.contains("draft sessions and verify rows included")
                && err.contains(
                    "without the draft model's 4 sessions of 512 positions they would fit"
                ),
            "{err}"
        );
        // Short of even the target's own: refused without blaming the draft.
        let err = check(Some((&draft, 512)), without - 1)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("lower --parallel or --ctx") && !err.contains("without the draft"),
            "{err}"
        );
    }
}
