//! `ferrite run`: one-shot generation or an interactive chat on one model.
//!
//! Owns the user-facing loop only: building the prompt (chat template or raw text), streaming
//! decoded text, stop conditions and the end-of-run clocks. The model math lives in
//! `ferrite-model`, sampling in `ferrite-engine`.

use std::io::{BufRead, IsTerminal, Read, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use ferrite_engine::budget::{Budgeted, ReasoningBudget};
use ferrite_engine::grammar::Constraint;
use ferrite_engine::output::OutputConfig;
use ferrite_engine::speculate::Lookup;
use ferrite_engine::{Finish, Flow, Picker, Sampler, SamplerConfig, Timeline};
use ferrite_model::{KvType, LoadOptions, Model, Precision, Session};
use ferrite_tokenizer::{ChatRequest, ChatTemplate, Tokenizer};

use crate::backend::{BackendArg, CudaLoaded, CudaPath, load_cuda};
use crate::models::DEFAULT_MODEL;
use crate::outputs::check_not_an_input;
use ferrite_engine::{AnySession, CudaTimeline};

mod held;
pub(crate) mod reasoning;
mod report;
mod session_file;
pub(crate) mod speculate;

use report::{Clocks, SpeculationReport, report};
use session_file::{save_session, try_load};
use speculate::Speculator;

/// Weight precision choices on the command line.
#[derive(Clone, Copy, clap::ValueEnum)]
pub enum PrecisionArg {
    /// Quantized weights read in place; activations f32, or 16-bit integers per block in
    /// Q4_1 and Q8_0 products on AVX-512 VNNI and AVX2, and Q5_0, Q4_K and Q6_K products on
    /// AVX2 (`act=q16` in the backend line).
    Default,
    /// Every weight dequantized to f32 at load (separates graph bugs from quantization noise).
    F32,
}

/// KV cache element type on the command line.
#[derive(Clone, Copy, clap::ValueEnum)]
pub enum KvArg {
    /// Half precision (default).
    F16,
    /// Single precision.
    F32,
    /// Blocks of 32 signed bytes with one scale: 56 % of f16's memory and of the bytes
    /// attention reads, at a cost in fidelity (CPU backend only; head sizes that are
    /// multiples of 32).
    Q8,
}

impl From<KvArg> for KvType {
    fn from(arg: KvArg) -> KvType {
        match arg {
            KvArg::F16 => KvType::F16,
            KvArg::F32 => KvType::F32,
            KvArg::Q8 => KvType::Q8,
        }
    }
}

/// Refuses a KV type other than f16 on the CUDA backend, whose cache is always f16: asking
/// for another must not silently run with f16.
pub fn check_cuda_kv(kv: KvType) -> anyhow::Result<()> {
    if kv != KvType::F16 {
        bail!(
            "--kv {} runs on the CPU backend only (the CUDA cache is f16); add --backend cpu",
            kv.name()
        );
    }
    Ok(())
}

/// The full weight scan of `--check-weights` (run, score, bench, serve), saying on stderr that
/// it ran and what it covered.
pub fn check_weights(g: &ferrite_gguf::Gguf, path: &Path) -> anyhow::Result<()> {
    ferrite_model::check_weights(g).with_context(|| format!("checking {}", path.display()))?;
    eprintln!(
        "checked weights: all {} tensors of {} are finite",
        g.tensors().len(),
        path.display()
    );
    Ok(())
}

/// Options shared by every command that loads a model and generates.
#[derive(clap::Args)]
pub struct ModelArgs {
    /// Model: a known name, a path to a .gguf file, or a Hugging Face model directory.
    #[arg(short = 'm', long, default_value = DEFAULT_MODEL)]
    pub model: String,
    /// Context size in tokens (KV cache capacity).
    #[arg(long, default_value_t = 4096)]
    pub ctx: usize,
    /// Worker threads (default: all cores).
    #[arg(long, value_parser = crate::backend::threads_arg())]
    pub threads: Option<usize>,
    /// Weight precision.
    #[arg(long, value_enum, default_value = "default")]
    pub precision: PrecisionArg,
    /// KV cache element type.
    #[arg(long, value_enum, default_value = "f16")]
    pub kv: KvArg,
    /// Compute backend.
    #[arg(long, value_enum, default_value = "auto")]
    pub backend: BackendArg,
    /// Scan every value of every weight for NaN and infinity at load, naming the first bad
    /// tensor (a pass over the whole file; norms and block scales are always checked).
    #[arg(long)]
    pub check_weights: bool,
}

/// Arguments of `ferrite run`.
#[derive(clap::Args)]
pub struct RunArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// The prompt (alternatively positional; read from stdin when neither is given and stdin is
    /// not a terminal; interactive chat when stdin is a terminal).
    #[arg(short = 'p', long)]
    prompt: Option<String>,
    /// The prompt, as a positional argument.
    #[arg(conflicts_with = "prompt")]
    prompt_text: Option<String>,
    /// Chat turn by turn even when stdin is not a terminal: each line read is the user's next
    /// message (as llama.cpp's `-cnv`).
    #[arg(long, conflicts_with_all = ["prompt", "prompt_text"])]
    chat: bool,
    /// Do not apply the chat template; feed the prompt as plain text.
    #[arg(long)]
    raw: bool,
    /// System message for the chat template.
    #[arg(long)]
    system: Option<String>,
    /// Most tokens to generate (0: no limit, until the end of text or a full context).
    #[arg(long, default_value_t = 512)]
    max_tokens: usize,
    /// Sampling temperature (0 = greedy).
    #[arg(long, default_value_t = 0.8)]
    temp: f32,
    /// Top-k filter (0 = off).
    #[arg(long, default_value_t = 40)]
    top_k: usize,
    /// Top-p (nucleus) filter (1 = off).
    #[arg(long, default_value_t = 0.95)]
    top_p: f32,
    /// Min-p filter (0 = off).
    #[arg(long, default_value_t = 0.05)]
    min_p: f32,
    /// Repetition penalty (1 = off).
    #[arg(long, default_value_t = 1.0)]
    repeat_penalty: f32,
    /// Frequency penalty (0 = off).
    #[arg(long, default_value_t = 0.0)]
    frequency_penalty: f32,
    /// Presence penalty (0 = off).
    #[arg(long, default_value_t = 0.0)]
    presence_penalty: f32,
    /// Random seed: the same seed and settings give the same tokens on every run.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Write the chosen token's log-probability and the top alternatives of each generated
    /// token to this file (JSON lines).
    #[arg(long)]
    dump_logprobs: Option<PathBuf>,
    /// How many alternatives `--dump-logprobs` records per token.
    #[arg(long, default_value_t = 5)]
    logprobs_top_k: usize,
    /// Restore a session file (KV cache and chat so far) before the prompt: in chat mode
    /// the prompt continues the saved conversation; with `--raw` the saved tokens are only
    /// reused where the new prompt starts with them. A file of another model or setting is
    /// reported and ignored, as is a file written by the other backend (CPU or CUDA).
    #[arg(long)]
    load_session: Option<PathBuf>,
    /// Hold the answer to this JSON schema, given as JSON text (`{"type": "object"}`: any
    /// JSON object). In a chat, every reply is held to it.
    #[arg(long, conflicts_with = "json_schema_file")]
    json_schema: Option<String>,
    /// As `--json-schema`, read from a file.
    #[arg(long)]
    json_schema_file: Option<PathBuf>,
    /// Hold the answer to this grammar (GBNF, as llama.cpp's `--grammar`).
    #[arg(long, conflicts_with_all = ["json_schema", "json_schema_file"])]
    grammar: Option<String>,
    /// Save the session (KV cache, tokens and chat) to this file after generating.
    #[arg(long)]
    save_session: Option<PathBuf>,
    #[command(flatten)]
    reasoning: reasoning::ReasoningFormatArg,
    /// Do not show the model's reasoning, only its answer (shown dimmed on a terminal,
    /// between `[reasoning]` lines otherwise).
    #[arg(long)]
    hide_reasoning: bool,
    /// Most tokens the model may spend reasoning (inside `<think>`, or a harmony
    /// `analysis` message): at the limit the block is closed for it and the answer
    /// follows. Unset: no limit.
    #[arg(long)]
    reasoning_budget: Option<usize>,
    /// Speculate with prompt lookup: guess the next tokens from earlier text of the
    /// context and verify them in one batched step (CPU backend). The output is the same
    /// as without it; the end-of-run line says how many guesses were accepted.
    #[arg(long, group = "speculate")]
    lookup: bool,
    /// Speculate with this draft model (a name or path as for -m; it must share the
    /// model's vocabulary): it proposes greedily and the model verifies in one batched
    /// step (CPU backend). The output is the same as without it.
    #[arg(long, value_name = "MODEL", group = "speculate")]
    draft_model: Option<String>,
    /// Most tokens `--lookup` or `--draft-model` guesses a step (1 to 15); fewer, down to
    /// none, while few guesses are accepted.
    #[arg(long, default_value_t = 8, requires = "speculate", value_parser = draft_max_arg)]
    draft_max: usize,
}

/// Parses `--draft-max`, with the bound the proposer itself enforces.
pub(crate) fn draft_max_arg(s: &str) -> Result<usize, String> {
    let n: usize = s.parse().map_err(|e| format!("{e}"))?;
    Lookup::new(n)
        .map(|l| l.draft_max())
        .map_err(|e| e.to_string())
}

/// A loaded model with its tokenizer and thread pool.
pub struct Loaded {
    /// The model.
    pub model: Model,
    /// Its tokenizer.
    pub tokenizer: Tokenizer,
    /// Worker threads.
    pub pool: ferrite_cpu::ThreadPool,
    /// KV cache type requested.
    pub kv: KvType,
    /// Context size requested.
    pub ctx: usize,
    /// The GPU copy of the model, when the CUDA backend was chosen.
    pub cuda: Option<CudaLoaded>,
    /// Wall time of loading.
    pub load_time: Duration,
    /// The model file.
    pub path: PathBuf,
}

impl Loaded {
    /// Resolve, load and tokenize-ready a model from the shared options.
    pub fn load(args: &ModelArgs) -> anyhow::Result<Loaded> {
        let path = crate::models::resolve(&args.model)?;
        let start = Instant::now();
        let precision = match args.precision {
            PrecisionArg::Default => Precision::Default,
            PrecisionArg::F32 => Precision::F32,
        };
        let model = Model::load(&path, LoadOptions { precision })
            .with_context(|| format!("loading {}", path.display()))?;
        if args.check_weights {
            check_weights(model.gguf(), &path)?;
        }
        let tokenizer = Tokenizer::from_gguf(model.gguf())
            .with_context(|| format!("building the tokenizer of {}", path.display()))?;
        let pool = match args.threads {
            Some(n) => ferrite_cpu::ThreadPool::new(n)?,
            None => ferrite_cpu::ThreadPool::with_default_threads()?,
        };
        if args.ctx == 0 {
            bail!("--ctx must be at least 1");
        }
        let kv = KvType::from(args.kv);
        let cuda = load_cuda(args.backend, &model, kv)?;
        if cuda.is_some() {
            check_cuda_kv(kv)?;
        }
        if cuda.is_none() {
            model.pack_weights(&pool);
        }
        Ok(Loaded {
            model,
            tokenizer,
            pool,
            kv,
            ctx: args.ctx,
            cuda,
            load_time: start.elapsed(),
            path,
        })
    }

    /// A fresh CPU session over this model (scoring and other CPU-only work).
    pub fn session(&self) -> anyhow::Result<Session<'_>> {
        self.session_of(self.ctx)
    }

    /// A fresh CPU session of `ctx` positions.
    fn session_of(&self, ctx: usize) -> anyhow::Result<Session<'_>> {
        // The cache is allocated whole: a context the machine cannot hold is named here,
        // with the sizes, rather than by a failed allocation.
        ferrite_model::check_kv_memory(self.model.config(), self.kv, 1, ctx)
            .with_context(|| format!("--ctx {ctx}"))?;
        Ok(Session::new(&self.model, &self.pool, ctx, self.kv)?)
    }

    /// A fresh session on the chosen backend.
    pub fn any_session(&self) -> anyhow::Result<AnySession<'_>> {
        self.any_session_of(self.ctx)
    }

    /// A fresh session of `ctx` positions (at most `--ctx`) on the chosen backend.
    pub fn any_session_of(&self, ctx: usize) -> anyhow::Result<AnySession<'_>> {
        let ctx = ctx.min(self.ctx);
        Ok(match &self.cuda {
            Some(CudaLoaded {
                path: CudaPath::Model(m),
                ..
            }) => AnySession::Cuda(Box::new(CudaTimeline::new(m, ctx)?)),
            Some(CudaLoaded {
                path: CudaPath::Pass(ops),
                ..
            }) => AnySession::Pass(Box::new(Session::on(
                &self.model,
                ops.clone(),
                ctx,
                self.kv,
            )?)),
            None => AnySession::Cpu(Box::new(self.session_of(ctx)?)),
        })
    }

    /// The line that says what actually ran.
    pub fn backend_line(&self) -> String {
        if let Some(cuda) = &self.cuda {
            let (major, minor) = cuda.info.compute_capability;
            let act = cuda.backend.activations().name();
            if let CudaPath::Pass(_) = cuda.path {
                // One-row products read the device's decode activations (`act`) as the CUDA
                // model's do; several rows the f32 row products. Sampling is the host's.
                return format!(
                    "backend=cuda device=\"{}\" cc={major}.{minor} pass=contract graphs=off \
                     kv=f16 act={act} sampling=host",
                    cuda.info.name
                );
            }
            let prefill = cuda.backend.prefill_products().name();
            return format!(
                "backend=cuda device=\"{}\" cc={major}.{minor} graphs=on kv=f16 act={act} \
                 sampling={} prefill={prefill}",
                cuda.info.name,
                ferrite_engine::sampling_where()
            );
        }
        let kv = self.kv.name();
        let level = ferrite_quant::simd_level();
        let kernels = self.model.cpu_kernels();
        format!(
            "backend=cpu threads={} simd={level} {kernels} kv={kv} precision={}",
            self.pool.n_threads(),
            match self.model.precision() {
                Precision::Default => "default",
                Precision::F32 => "f32",
            }
        )
    }
}

/// Run `ferrite run`.
pub fn run(args: RunArgs) -> anyhow::Result<i32> {
    let prompt = match (args.prompt.clone(), args.prompt_text.clone()) {
        (Some(p), _) | (None, Some(p)) => Some(p),
        (None, None) if !args.chat && !std::io::stdin().is_terminal() => {
            let mut text = String::new();
            std::io::stdin()
                .read_to_string(&mut text)
                .context("reading the prompt from stdin")?;
            Some(text)
        }
        (None, None) => None,
    };
    let schema = held::constraint(
        args.json_schema.as_deref(),
        args.json_schema_file.as_deref(),
        args.grammar.as_deref(),
    )?;
    let mut loaded = Loaded::load(&args.model)?;
    // Positions past the model's training context are not a context it was made for; the
    // request is clamped as `serve` clamps it (the metadata check keeps this at least 2).
    loaded.ctx = loaded.ctx.min(loaded.model.config().ctx_train);
    for (flag, output) in [
        ("--dump-logprobs", &args.dump_logprobs),
        ("--save-session", &args.save_session),
    ] {
        if let Some(output) = output {
            check_not_an_input(flag, output, &[("model", &loaded.path)])?;
        }
    }
    let template = if args.raw {
        None
    } else {
        match loaded.tokenizer.chat_template() {
            Some(_) => Some(loaded.tokenizer.chat_template_renderer()?),
            None => None,
        }
    };
    let draft = match &args.draft_model {
        Some(name) => Some(speculate::load_draft(&loaded, name)?),
        None => None,
    };
    let mut speculator = Speculator::new(&loaded, args.lookup, draft.as_ref(), args.draft_max)?;
    let mut session = loaded.any_session()?;
    match prompt {
        Some(prompt) => {
            if template.is_none() && !args.raw {
                eprintln!("note: this model has no chat template; running plain completion");
            }
            let mut messages = initial_messages(args.system.as_deref());
            let mut held = Vec::new();
            if let Some(path) = &args.load_session
                && let Some((tokens, saved)) = try_load(&loaded, &mut session, path)?
            {
                held = tokens;
                if let Some(saved) = saved.filter(|_| template.is_some()) {
                    messages = saved;
                }
            }
            let (ids, reading) = match &template {
                Some(t) => encode_chat(&args, &loaded, t, &messages, &prompt)?,
                None => (
                    loaded.tokenizer.encode(&prompt, true, true),
                    reading(&args, &loaded, &prompt)?,
                ),
            };
            // Reuse the restored tokens up to the first that differs.
            let common = common_prefix(&held, &ids);
            session.truncate(common);
            if args.load_session.is_some() {
                eprintln!("session: reusing {common} of {} prompt tokens", ids.len());
            }
            let mut clocks = Clocks::default();
            let sampler = Sampler::new(sampler_config(&args, &loaded))?;
            let mut picker = held::chooser(sampler, schema, &loaded.tokenizer)?;
            let mut dump = open_dump(&args)?;
            let start = Instant::now();
            let mut ttft = None;
            let generated = generate(
                &loaded,
                &mut session,
                &mut picker,
                speculator.as_mut(),
                &ids[common..],
                &mut clocks,
                &mut ttft,
                start,
                dump.as_mut(),
                &mut std::io::stdout(),
                reading,
            )?;
            println!();
            report(&loaded, &clocks, ttft);
            if let Some(path) = &args.save_session {
                let reply = loaded.tokenizer.decode(&generated, false)?;
                messages.push(serde_json::json!({"role": "user", "content": prompt}));
                messages.push(serde_json::json!({"role": "assistant", "content": reply}));
                save_session(&loaded, &session, path, &messages)?;
            }
        }
        None => {
            let Some(template) = template else {
                bail!(
                    "this model has no chat template, so interactive chat is not available; \
                     pass a prompt for plain completion (ferrite run -m {} \"text\")",
                    args.model.model
                );
            };
            chat_repl(
                &args,
                &loaded,
                &template,
                &mut session,
                schema,
                speculator.as_mut(),
            )?;
        }
    }
    Ok(0)
}

fn sampler_config(args: &RunArgs, loaded: &Loaded) -> SamplerConfig {
    SamplerConfig {
        temperature: args.temp,
        top_k: args.top_k,
        top_p: args.top_p,
        min_p: args.min_p,
        repeat_penalty: args.repeat_penalty,
        frequency_penalty: args.frequency_penalty,
        presence_penalty: args.presence_penalty,
        seed: args.seed,
        max_tokens: args.max_tokens,
        stop_ids: loaded.tokenizer.end_of_generation_ids(),
        n_logprobs: if args.dump_logprobs.is_some() {
            args.logprobs_top_k
        } else {
            0
        },
        ..SamplerConfig::default()
    }
}

fn open_dump(args: &RunArgs) -> anyhow::Result<Option<std::io::BufWriter<std::fs::File>>> {
    args.dump_logprobs
        .as_ref()
        .map(|path| {
            std::fs::File::create(path)
                .map(std::io::BufWriter::new)
                .with_context(|| format!("creating {}", path.display()))
        })
        .transpose()
}

fn initial_messages(system: Option<&str>) -> Vec<serde_json::Value> {
    system
        .map(|s| serde_json::json!({"role": "system", "content": s}))
        .into_iter()
        .collect()
}

/// How one output is read: its view on stdout and its reasoning budget.
struct Reading {
    shown: reasoning::Shown,
    budget: Option<ReasoningBudget>,
}

/// How the output of `prompt` (the text the model continues) is read and shown. A
/// `--reasoning-budget` on output read without reasoning is refused, not ignored.
fn reading(args: &RunArgs, loaded: &Loaded, prompt: &str) -> anyhow::Result<Reading> {
    let template = loaded.tokenizer.chat_template().unwrap_or_default();
    let config = OutputConfig::for_prompt(args.reasoning.reasoning_format, template, prompt, None);
    let held =
        args.json_schema.is_some() || args.json_schema_file.is_some() || args.grammar.is_some();
    let budget = match args.reasoning_budget {
        Some(tokens) => Some(
            ReasoningBudget::for_output(tokens, &config, held, |text, special| {
                loaded.tokenizer.encode(text, false, special)
            })
            .with_context(|| {
                format!(
                    "--reasoning-budget closes a reasoning block, and the output is read as \
                     '{}' (no reasoning); drop one of the two",
                    config.reasoning
                )
            })?,
        ),
        None => None,
    };
    let style = reasoning::Style::new(args.hide_reasoning, std::io::stdout().is_terminal());
    Ok(Reading {
        shown: reasoning::Shown::new(config, style),
        budget,
    })
}

/// Render `messages` plus a new user turn and tokenize it as Hugging Face does
/// (`apply_chat_template`: special-token text parsed, nothing added), with the view of
/// its output.
fn encode_chat(
    args: &RunArgs,
    loaded: &Loaded,
    template: &ChatTemplate,
    messages: &[serde_json::Value],
    user: &str,
) -> anyhow::Result<(Vec<u32>, Reading)> {
    let mut all = messages.to_vec();
    all.push(serde_json::json!({"role": "user", "content": user}));
    let rendered = template.render(&ChatRequest {
        messages: all,
        add_generation_prompt: true,
        ..ChatRequest::default()
    })?;
    let ids = loaded.tokenizer.encode(&rendered, false, true);
    Ok((ids, reading(args, loaded, &rendered)?))
}

/// Feed `ids` (after whatever the session already holds) and generate until a stop, under
/// `reading`'s reasoning budget, streaming decoded text to `out` through its view
/// (reasoning marked or hidden). Returns the generated token ids (without a stop token).
#[allow(clippy::too_many_arguments)]
fn generate(
    loaded: &Loaded,
    session: &mut AnySession<'_>,
    sampler: &mut impl Picker,
    mut speculator: Option<&mut Speculator<'_>>,
    ids: &[u32],
    clocks: &mut Clocks,
    ttft: &mut Option<Duration>,
    start: Instant,
    mut dump: Option<&mut std::io::BufWriter<std::fs::File>>,
    out: &mut dyn Write,
    reading: Reading,
) -> anyhow::Result<Vec<u32>> {
    if ids.is_empty() {
        bail!("the prompt is empty: it encodes to no tokens");
    }
    let ctx = session.ctx();
    if session.n_past() + ids.len() > ctx {
        bail!(
            "the prompt needs {} tokens but the context holds {ctx} (use --ctx)",
            session.n_past() + ids.len()
        );
    }
    let mut decoder = loaded.tokenizer.stream_decoder(false);
    let begin = Instant::now();
    let mut first_token_at = None;
    // The callback cannot return errors; the first one is kept and ends generation.
    let mut failure: Option<anyhow::Error> = None;
    let adaptive_before = speculator.as_deref().map(Speculator::adaptive);
    let proposer = speculator.as_deref_mut().map(Speculator::proposer);
    let mut shown = reading.shown;
    let token_bytes = |id| {
        loaded
            .tokenizer
            .token_bytes(id)
            .map(<[u8]>::to_vec)
            .unwrap_or_default()
    };
    let mut picker = Budgeted::new(sampler, reading.budget, token_bytes);
    let generation =
        ferrite_engine::generate_with(session, &mut picker, proposer, ids, |sampled| {
            first_token_at.get_or_insert_with(Instant::now);
            if ttft.is_none() {
                *ttft = Some(start.elapsed());
            }
            let mut step = || -> anyhow::Result<()> {
                if let Some(dump) = dump.as_deref_mut() {
                    let line = serde_json::json!({
                        "token": sampled.token,
                        "piece": loaded.tokenizer.piece(sampled.token),
                        "logprob": sampled.logprob,
                        "top": sampled.top,
                    });
                    writeln!(dump, "{line}")?;
                }
                out.write_all(shown.push(&decoder.push(sampled.token)?).as_bytes())?;
                out.flush()?;
                Ok(())
            };
            match step() {
                Ok(()) => Flow::Continue,
                Err(err) => {
                    failure = Some(err);
                    Flow::Stop
                }
            }
        })?;
    if let Some(err) = failure {
        return Err(err);
    }
    let mut tail = shown.push(&decoder.finish());
    let (rest, unclosed) = shown.finish();
    tail.push_str(&rest);
    out.write_all(tail.as_bytes())?;
    if unclosed {
        eprintln!("\nnote: the output ended inside reasoning (no answer followed)");
    }
    if generation.finish == Finish::ContextFull {
        eprintln!("\nnote: context full ({ctx} tokens); stopping");
    }
    // Prefill ends when the first token is sampled; every later token is decode time.
    let first = first_token_at.unwrap_or_else(Instant::now);
    clocks.prompt_tokens += ids.len();
    clocks.prefill += first - begin;
    clocks.generated += generation.tokens.len();
    clocks.decoded += generation.tokens.len().saturating_sub(1);
    clocks.decode += first.elapsed();
    if let (Some(spec), Some(before)) = (speculator, adaptive_before) {
        let after = spec.adaptive();
        clocks.speculation = Some(SpeculationReport {
            name: spec.name(),
            stats: generation.speculation,
            off_steps: after.off_steps - before.off_steps,
            probes: after.probes - before.probes,
            failure: spec.failure(),
        });
    }
    if let Some(dump) = dump {
        dump.flush()?;
    }
    Ok(generation.tokens)
}

/// Length of the shared prefix of the held tokens and a prompt, leaving at least the last
/// prompt token to evaluate (its logits pick the first new token).
fn common_prefix(held: &[u32], ids: &[u32]) -> usize {
    held.iter()
        .zip(ids)
        .take_while(|(a, b)| a == b)
        .count()
        .min(ids.len().saturating_sub(1))
}

/// The interactive chat: the whole conversation is re-rendered each turn and only the part
/// after the longest common prefix with the session's tokens is evaluated. Each reply is
/// held to `schema` when there is one.
fn chat_repl(
    args: &RunArgs,
    loaded: &Loaded,
    template: &ChatTemplate,
    session: &mut AnySession<'_>,
    schema: Option<Constraint>,
    mut speculator: Option<&mut Speculator<'_>>,
) -> anyhow::Result<()> {
    let mut messages = initial_messages(args.system.as_deref());
    // Tokens the session holds, for reusing the common prefix of the next turn.
    let mut cached: Vec<u32> = Vec::new();
    let sampler = Sampler::new(sampler_config(args, loaded))?;
    let mut picker = held::chooser(sampler, schema, &loaded.tokenizer)?;
    if let Some(path) = &args.load_session
        && let Some((tokens, saved)) = try_load(loaded, session, path)?
    {
        cached = tokens;
        messages = saved.unwrap_or(messages);
    }
    eprintln!(
        "chat with {} — /reset clears the conversation, /save F and /load F store and \
         restore it, /exit quits",
        args.model.model
    );
    let stdin = std::io::stdin();
    loop {
        eprint!("> ");
        let mut line = String::new();
        if stdin.lock().read_line(&mut line)? == 0 {
            return Ok(());
        }
        let line = line.trim_end_matches(['\n', '\r']);
        match line.trim() {
            "/exit" | "/quit" => return Ok(()),
            "/reset" => {
                messages = initial_messages(args.system.as_deref());
                session.reset();
                cached.clear();
                eprintln!("(conversation cleared)");
                continue;
            }
            "" => continue,
            _ => {}
        }
        if let Some(path) = line.trim().strip_prefix("/save ") {
            match save_session(loaded, session, path.trim().as_ref(), &messages) {
                Ok(()) => eprintln!("(saved to {})", path.trim()),
                Err(e) => eprintln!("error: {e:#}"),
            }
            continue;
        }
        if let Some(path) = line.trim().strip_prefix("/load ") {
            match try_load(loaded, session, path.trim().as_ref()) {
                Ok(Some((tokens, saved))) => {
                    cached = tokens;
                    messages = saved.unwrap_or_else(|| initial_messages(args.system.as_deref()));
                    eprintln!("(loaded {} tokens from {})", cached.len(), path.trim());
                }
                Ok(None) => {}
                Err(e) => eprintln!("error: {e:#}"),
            }
            continue;
        }
        let (ids, reading) = encode_chat(args, loaded, template, &messages, line)?;
        // A turn the context cannot hold is refused before anything changes, so the
        // conversation so far can still be saved or continued with a shorter message.
        if ids.len() > session.ctx() {
            eprintln!(
                "error: the conversation with this message needs {} tokens but the context \
                 holds {} (shorter message, /reset, or a larger --ctx)",
                ids.len(),
                session.ctx()
            );
            continue;
        }
        // Reuse the cached conversation up to the first token that differs.
        let common = common_prefix(&cached, &ids);
        session.truncate(common);
        let mut clocks = Clocks::default();
        let mut ttft = None;
        let mut out = std::io::stdout();
        picker.restart()?;
        let generated = generate(
            loaded,
            session,
            &mut picker,
            speculator.as_deref_mut(),
            &ids[common..],
            &mut clocks,
            &mut ttft,
            Instant::now(),
            None,
            &mut out,
            reading,
        )?;
        println!();
        report(loaded, &clocks, ttft);
        let reply = loaded.tokenizer.decode(&generated, false)?;
        messages.push(serde_json::json!({"role": "user", "content": line}));
        messages.push(serde_json::json!({"role": "assistant", "content": reply}));
        cached = ids;
        cached.extend_from_slice(&generated);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draft_max_is_bounded_and_lookup_refused_on_cuda() {
        assert_eq!(draft_max_arg("1"), Ok(1));
        assert_eq!(draft_max_arg("15"), Ok(15));
        for bad in ["0", "16"] {
            let err = draft_max_arg(bad).unwrap_err();
            assert!(err.contains("outside 1..=15"), "{err}");
        }
        assert!(draft_max_arg("x").is_err());
        assert!(speculate::check_cuda_speculation(false, "--lookup").is_ok());
        for flag in ["--lookup", "--draft-model"] {
            let err = speculate::check_cuda_speculation(true, flag)
                .unwrap_err()
                .to_string();
            assert!(err.contains("--backend cpu") && err.contains(flag), "{err}");
        }
    }

    #[test]
    fn cuda_refuses_every_kv_type_but_f16() {
        assert!(check_cuda_kv(KvType::F16).is_ok());
        for kv in [KvType::F32, KvType::Q8] {
            let err = check_cuda_kv(kv).unwrap_err().to_string();
            assert!(err.contains(&format!("--kv {}", kv.name())), "{err}");
            assert!(err.contains("--backend cpu"), "{err}");
        }
    }
}
