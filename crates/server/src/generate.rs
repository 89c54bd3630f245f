//! Pieces every generation endpoint shares: model-name checks, prompt limits, sampling
//! options read from the OpenAI-style fields, submission, and collecting a finished run.

use std::time::{SystemTime, UNIX_EPOCH};

use axum::http::StatusCode;
use ferrite_engine::output::{Collected, Event, OutputConfig, OutputParser};
use serde_json::Value;
use tokio::sync::mpsc::UnboundedReceiver;

use crate::error::ApiError;
use crate::metrics::RequestLog;
use crate::parse::{Obj, int_value, opt_f32, opt_seed, opt_u64};
use ferrite_engine::{
    Backend, FinishReason, GenEvent, GenRequest, OutputFormat, ReasoningBudget, SamplingParams,
    SpecRequest, SubmitError, Timings, TokenLogprob, Usage,
};

/// Whether `name` refers to the served model.
pub fn model_matches(backend: &dyn Backend, name: &str) -> bool {
    name == backend.model_id() || backend.aliases().iter().any(|a| a == name)
}

/// Check the request's `model` field: absent or null is the served model (there is only
/// one, as llama-server does it); a name that is not one of its names is OpenAI's 404
/// `model_not_found`.
pub fn check_model(backend: &dyn Backend, obj: &Obj) -> Result<String, ApiError> {
    match crate::parse::opt_str(obj, "model")? {
        None => Ok(backend.model_id().to_string()),
        Some(name) if model_matches(backend, name) => Ok(backend.model_id().to_string()),
        Some(name) => Err(ApiError {
            code: Some("model_not_found"),
            param: Some("model".to_string()),
            ..ApiError::new(
                StatusCode::NOT_FOUND,
                format!(
                    "The model '{name}' does not exist; this server serves '{}'",
                    backend.model_id()
                ),
            )
        }),
    }
}

/// Reject empty prompts and prompts that leave no room to generate; `param` names the
/// request field the prompt came from.
pub fn check_prompt(backend: &dyn Backend, prompt: &[u32], param: &str) -> Result<(), ApiError> {
    let n_ctx = backend.n_ctx();
    if prompt.is_empty() {
        return Err(ApiError::invalid_param(param, "the prompt is empty"));
    }
    if prompt.len() >= n_ctx {
        return Err(ApiError {
            code: Some("context_length_exceeded"),
            param: Some(param.to_string()),
            ..ApiError::bad_request(format!(
                "this model's maximum context length is {n_ctx} tokens, but the prompt has {} tokens",
                prompt.len()
            ))
        });
    }
    Ok(())
}

/// A token-id array, each id checked against the vocabulary.
pub fn token_array(v: &Value, key: &str, backend: &dyn Backend) -> Result<Vec<u32>, ApiError> {
    let items = v.as_array().ok_or_else(|| {
        ApiError::invalid_param(key, format!("'{key}' must be an array of token ids"))
    })?;
    let max = backend.vocab_size().saturating_sub(1) as u64;
    items
        .iter()
        .map(|t| int_value(t, key, 0, max).map(|x| x as u32))
        .collect()
}

/// Seconds since the epoch, for `created` fields.
pub fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// A fresh random-looking id with a prefix (`chatcmpl-…`); unique per process run.
pub fn new_id(prefix: &str, seq: u64) -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!("{prefix}{:08x}{:08x}", seq as u32, nanos)
}

/// Sampling fields shared by the OpenAI-style APIs.
pub struct GenOptions {
    /// Sampling settings (seed not yet offset per choice).
    pub sampling: SamplingParams,
    /// Most tokens to generate.
    pub max_tokens: usize,
    /// Stop strings.
    pub stop: Vec<String>,
    /// Logprob alternatives, when logprobs were requested.
    pub logprobs: Option<usize>,
    /// Report prompt-token logprobs too (completions `echo` with `logprobs`).
    pub prompt_logprobs: bool,
    /// The reasoning budget, when there is one.
    pub reasoning_budget: Option<ReasoningBudget>,
    /// The request's speculation fields (`speculative.n_max`, `n_min`, `p_min`).
    pub speculative: SpecRequest,
}

/// Read temperature, top_p, top_k, min_p, penalties and seed from an OpenAI-style body;
/// `temp_max` differs between APIs (2 for OpenAI, 1 for Anthropic).
pub fn sampling(obj: &Obj, temp_max: f64) -> Result<SamplingParams, ApiError> {
    let d = SamplingParams::default();
    Ok(SamplingParams {
        temperature: opt_f32(obj, "temperature", 0.0, temp_max)?.unwrap_or(d.temperature),
        top_k: opt_u64(obj, "top_k", 0, 1 << 20)?.map_or(d.top_k, |k| k as usize),
        top_p: opt_f32(obj, "top_p", 0.0, 1.0)?.unwrap_or(d.top_p),
        min_p: opt_f32(obj, "min_p", 0.0, 1.0)?.unwrap_or(d.min_p),
        frequency_penalty: opt_f32(obj, "frequency_penalty", -2.0, 2.0)?
            .unwrap_or(d.frequency_penalty),
        presence_penalty: opt_f32(obj, "presence_penalty", -2.0, 2.0)?
            .unwrap_or(d.presence_penalty),
        seed: opt_seed(obj, "seed")?.unwrap_or_else(random_seed),
        logit_bias: Vec::new(),
        format: OutputFormat::Text,
    })
}

/// Largest bias OpenAI's `logit_bias` takes either way: ±100 bans a token or all but
/// selects it.
const MAX_LOGIT_BIAS: f64 = 100.0;

/// OpenAI's `logit_bias`: an object from token ids (as strings) to biases in [-100, 100],
/// each added to that token's logit before sampling. Ids must be in the vocabulary.
pub fn logit_bias(obj: &Obj, vocab: usize) -> Result<Vec<(u32, f32)>, ApiError> {
    const KEY: &str = "logit_bias";
    let Some(map) = crate::parse::opt_object(obj, KEY)? else {
        return Ok(Vec::new());
    };
    map.iter()
        .map(|(id, bias)| {
            let id = id
                .parse::<u32>()
                .ok()
                .filter(|&t| (t as usize) < vocab)
                .ok_or_else(|| {
                    ApiError::invalid_param(
                        KEY,
                        format!(
                            "'{KEY}' keys must be token ids from 0 to {}, got '{id}'",
                            vocab.saturating_sub(1)
                        ),
                    )
                })?;
            let bias = bias
                .as_f64()
                .filter(|b| (-MAX_LOGIT_BIAS..=MAX_LOGIT_BIAS).contains(b))
                .ok_or_else(|| {
                    ApiError::invalid_param(
                        KEY,
                        format!(
                            "'{KEY}' values must be numbers between -{MAX_LOGIT_BIAS} and \
                             {MAX_LOGIT_BIAS}, got {bias} for token {id}"
                        ),
                    )
                })?;
            Ok((id, bias as f32))
        })
        .collect()
}

fn random_seed() -> u64 {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    nanos ^ 0x9e37_79b9_7f4a_7c15
}

/// The OpenAI-style APIs' reasoning budget field (`thinking_token_budget`, as vLLM names
/// it), with its name for errors.
pub fn thinking_token_budget(obj: &Obj) -> Result<Option<(usize, &'static str)>, ApiError> {
    const KEY: &str = "thinking_token_budget";
    Ok(opt_u64(obj, KEY, 0, u32::MAX as u64)?.map(|n| (n as usize, KEY)))
}

/// Default and upper bound of `max_tokens`: the room left in the context.
pub fn room(backend: &dyn Backend, prompt_len: usize) -> usize {
    backend.n_ctx().saturating_sub(prompt_len)
}

/// Queue `n` generations of the same prompt (seed offset per choice so samples differ).
/// More choices than the server holds at once (slots and queue) could never all be
/// queued: that is the request's fault (400), not a busy server's (429, which clients retry).
pub fn submit_n(
    backend: &dyn Backend,
    prompt: &[u32],
    opts: &GenOptions,
    n: usize,
) -> Result<Vec<UnboundedReceiver<GenEvent>>, ApiError> {
    let stats = backend.stats();
    let capacity = stats.slots_total + stats.queue_limit;
    if n > capacity {
        return Err(ApiError::invalid_param(
            "n",
            format!(
                "n is {n}, but this server holds at most {capacity} generations at once \
                 ({} slots and a queue of {})",
                stats.slots_total, stats.queue_limit
            ),
        ));
    }
    (0..n)
        .map(|i| {
            let mut sampling = opts.sampling.clone();
            sampling.seed = sampling.seed.wrapping_add(i as u64);
            backend
                .submit(GenRequest {
                    prompt: prompt.to_vec(),
                    sampling,
                    max_tokens: opts.max_tokens,
                    stop: opts.stop.clone(),
                    logprobs: opts.logprobs,
                    prompt_logprobs: opts.prompt_logprobs,
                    reasoning_budget: opts.reasoning_budget.clone(),
                    speculative: opts.speculative,
                })
                .map_err(submit_error)
        })
        .collect()
}

fn submit_error(e: SubmitError) -> ApiError {
    match e {
        SubmitError::QueueFull { .. } => {
            ApiError::new(StatusCode::TOO_MANY_REQUESTS, e.to_string())
        }
        _ => ApiError::new(StatusCode::SERVICE_UNAVAILABLE, e.to_string()),
    }
}

/// A finished generation.
#[derive(Debug, Default)]
pub struct Finished {
    /// All shown text.
    pub text: String,
    /// Reasoning, answer and tool calls of the text, when it was parsed.
    pub out: Collected,
    /// Tokens that were reasoning.
    pub reasoning_tokens: usize,
    /// Per-token logprobs (when requested).
    pub logprobs: Vec<TokenLogprob>,
    /// Logprobs of prompt tokens `1..` (when requested).
    pub prompt_logprobs: Vec<TokenLogprob>,
    /// Generated token ids.
    pub tokens: Vec<u32>,
    /// Why it ended.
    pub finish: Option<FinishReason>,
    /// The stop string that ended it.
    pub stop_sequence: Option<String>,
    /// Counts.
    pub usage: Usage,
    /// Timings.
    pub timings: Timings,
    parser: Option<OutputParser>,
}

/// What one engine event released.
#[derive(Debug, Default)]
pub struct Step {
    /// Text released (unparsed).
    pub text: String,
    /// Parsed events of that text (with a parser).
    pub events: Vec<Event>,
    /// It was the last event.
    pub last: bool,
}

impl Finished {
    /// A generation whose text is parsed with `config`.
    pub fn parsing(config: OutputConfig) -> Finished {
        Finished {
            parser: Some(OutputParser::new(config)),
            ..Finished::default()
        }
    }

    fn parse(&mut self, text: &str, last: bool) -> Vec<Event> {
        let Some(parser) = &mut self.parser else {
            return Vec::new();
        };
        let mut events = if text.is_empty() {
            Vec::new()
        } else {
            parser.push(text, false)
        };
        if last && let Some(parser) = self.parser.take() {
            let fin = parser.finish();
            events.extend(fin.events);
            self.reasoning_tokens = fin.reasoning_tokens;
        }
        self.out.extend(events.iter().cloned());
        events
    }

    /// Fold one event in; returns what it released (for streaming). A failure becomes a
    /// 500.
    pub fn apply(&mut self, ev: GenEvent, log: &RequestLog) -> Result<Step, ApiError> {
        match ev {
            GenEvent::Started { .. } => Ok(Step::default()),
            GenEvent::PromptLogprobs(items) => {
                self.prompt_logprobs.extend(items);
                Ok(Step::default())
            }
            GenEvent::Token { id, text, logprob } => {
                log.first_token();
                self.tokens.push(id);
                self.text.push_str(&text);
                self.logprobs.extend(logprob);
                let events = self.parse(&text, false);
                Ok(Step {
                    text,
                    events,
                    last: false,
                })
            }
            GenEvent::Done {
                finish,
                stop_sequence,
                tail,
                usage,
                timings,
            } => {
                self.text.push_str(&tail);
                self.finish = Some(finish);
                self.stop_sequence = stop_sequence;
                self.usage = usage;
                self.timings = timings;
                log.add_usage(usage, timings);
                let events = self.parse(&tail, true);
                Ok(Step {
                    text: tail,
                    events,
                    last: true,
                })
            }
            GenEvent::Failed(msg) => Err(ApiError::internal(&msg)),
        }
    }
}

/// Read a generation to its end, parsing its text with `output` when given.
pub async fn collect(
    mut rx: UnboundedReceiver<GenEvent>,
    log: &RequestLog,
    output: Option<OutputConfig>,
) -> Result<Finished, ApiError> {
    let mut out = output.map_or_else(Finished::default, Finished::parsing);
    while let Some(ev) = rx.recv().await {
        if out.apply(ev, log)?.last {
            return Ok(out);
        }
    }
    Err(ApiError::internal(
        "the engine dropped a request without finishing it",
    ))
}

/// Read several generations to their ends, concurrently.
pub async fn collect_all(
    rxs: Vec<UnboundedReceiver<GenEvent>>,
    log: &RequestLog,
    output: Option<OutputConfig>,
) -> Result<Vec<Finished>, ApiError> {
    let all =
        futures_util::future::join_all(rxs.into_iter().map(|rx| collect(rx, log, output))).await;
    all.into_iter().collect()
}

/// Sum of usage over choices: prompt counted once, completions added.
pub fn total_usage(items: &[Finished]) -> Usage {
    let mut u = Usage::default();
    for f in items {
        u.prompt_tokens = f.usage.prompt_tokens;
        if f.usage.cached_tokens > u.cached_tokens {
            u.cached_tokens = f.usage.cached_tokens;
            u.cache_source = f.usage.cache_source;
        }
        u.completion_tokens += f.usage.completion_tokens;
    }
    u
}

/// OpenAI's name of a finish reason.
pub fn finish_name(f: Option<FinishReason>) -> &'static str {
    match f {
        Some(FinishReason::Length) => "length",
        _ => "stop",
    }
}
