//! OpenAI endpoints: `/v1/chat/completions` and `/v1/completions`, plain and streaming.

use std::convert::Infallible;

use axum::Extension;
use axum::Json;
use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use tokio::sync::mpsc::UnboundedReceiver;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tokio_stream::{Stream, StreamExt, StreamMap};

use ferrite_engine::output::{Event, OutputConfig};

use crate::error::{ApiError, Flavor};
use crate::generate::{self, Finished, GenOptions};
use crate::metrics::RequestLog;
use crate::parse::{self, Obj, body_object, field, opt_bool, opt_object, opt_u64};
use crate::{AppState, tool_choice, tools};
use ferrite_engine::{Backend, GenEvent, TokenLogprob, Usage};

/// Wrap an event stream as an SSE response with keep-alive comments.
pub fn sse<S>(state: &AppState, events: S) -> Response
where
    S: Stream<Item = SseEvent> + Send + 'static,
{
    Sse::new(events.map(Ok::<SseEvent, Infallible>))
        .keep_alive(KeepAlive::new().interval(state.config().keepalive))
        .into_response()
}

/// `usage` object with cached-token details.
pub fn usage_json(u: Usage) -> Value {
    json!({
        "prompt_tokens": u.prompt_tokens,
        "completion_tokens": u.completion_tokens,
        "total_tokens": u.prompt_tokens + u.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": u.cached_tokens},
        "ferrite": {"cache_source": u.cache_source.as_str(), "cached_tokens": u.cached_tokens},
    })
}

fn chat_logprob_items(lps: &[TokenLogprob]) -> Vec<Value> {
    lps.iter()
        .map(|l| {
            json!({
                "token": l.token, "logprob": l.logprob, "bytes": l.bytes,
                "top_logprobs": l.top.iter()
                    .map(|t| json!({"token": t.token, "logprob": t.logprob, "bytes": t.bytes}))
                    .collect::<Vec<_>>(),
            })
        })
        .collect()
}

/// Identity fields shared by every object of one response.
struct Meta {
    id: String,
    created: u64,
    model: String,
}

/// Options common to both endpoints.
fn options(
    obj: &Obj,
    backend: &dyn Backend,
    max_tokens: Option<u64>,
    room: usize,
    logprobs: Option<usize>,
) -> Result<GenOptions, ApiError> {
    let stop = parse::opt_stops(obj, "stop")?;
    let mut sampling = generate::sampling(obj, 2.0)?;
    sampling.logit_bias = generate::logit_bias(obj, backend.vocab_size())?;
    sampling.format = crate::structured::requested(
        obj,
        Some(("response_format", opt_object(obj, "response_format")?)),
    )?;
    Ok(GenOptions {
        sampling,
        max_tokens: max_tokens.map_or(room, |m| (m as usize).min(room)),
        stop,
        logprobs,
        prompt_logprobs: false,
        reasoning_budget: None,
        speculative: crate::speculative::speculative(obj, backend.speculation())?,
    })
}

/// Chat tools, each `{"type": "function", "function": {"name": …}}`: the template renders
/// them and tool calls are matched to them by name, so one without a name is refused.
fn check_tools(tools: &[Value]) -> Result<(), ApiError> {
    for (i, t) in tools.iter().enumerate() {
        let at = format!("tools[{i}]");
        let t = t
            .as_object()
            .ok_or_else(|| ApiError::invalid_param(&at, "each tool must be an object"))?;
        match t.get("type").and_then(Value::as_str) {
            Some("function") => {}
            other => {
                return Err(ApiError::invalid_param(
                    &format!("{at}.type"),
                    format!(
                        "tool type '{}' is not supported (function tools only)",
                        other.unwrap_or("")
                    ),
                ));
            }
        }
        if t.get("function")
            .and_then(|f| f.get("name"))
            .and_then(Value::as_str)
            .is_none()
        {
            return Err(ApiError::invalid_param(
                &format!("{at}.function.name"),
                "a function tool needs a 'function' with a string 'name'",
            ));
        }
    }
    Ok(())
}

fn include_usage(obj: &Obj) -> Result<bool, ApiError> {
    match opt_object(obj, "stream_options")? {
        Some(o) => Ok(opt_bool(o, "include_usage")?.unwrap_or(false)),
        None => Ok(false),
    }
}

/// POST /v1/chat/completions
pub async fn chat_completions(
    State(state): State<AppState>,
    Extension(log): Extension<RequestLog>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    chat(state, log, body)
        .await
        .unwrap_or_else(|e| e.into_response(Flavor::OpenAi))
}

async fn chat(
    state: AppState,
    log: RequestLog,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let obj = body_object(body)?;
    let backend = state.backend()?.clone();
    let model = generate::check_model(backend.as_ref(), &obj)?;
    let messages =
        parse::opt_array(&obj, "messages")?.ok_or_else(|| ApiError::missing("messages"))?;
    let messages = crate::chat::openai_messages(messages)?;
    let tools = match parse::opt_array(&obj, "tools")? {
        Some(t) if !t.is_empty() => {
            check_tools(t)?;
            Some(Value::Array(t.clone()))
        }
        _ => None,
    };
    let choice = tool_choice::openai_chat(field(&obj, "tool_choice"))?;
    let with_tools = tools.is_some() && choice.allows_calls();
    let n = opt_u64(&obj, "n", 1, 16)?.unwrap_or(1) as usize;
    let stream = opt_bool(&obj, "stream")?.unwrap_or(false);
    let usage_chunk = include_usage(&obj)?;
    let logprobs = opt_bool(&obj, "logprobs")?.unwrap_or(false);
    let top = opt_u64(&obj, "top_logprobs", 0, 20)?;
    if top.is_some() && !logprobs {
        return Err(ApiError::invalid_param(
            "top_logprobs",
            "'top_logprobs' requires 'logprobs': true",
        ));
    }
    let max_tokens = match opt_u64(&obj, "max_completion_tokens", 1, u32::MAX as u64)? {
        Some(m) => Some(m),
        None => opt_u64(&obj, "max_tokens", 1, u32::MAX as u64)?,
    };
    let offered = tools.as_ref().and_then(Value::as_array);
    let forced = tool_choice::forced_call(offered.map_or(&[], Vec::as_slice), &choice)?;
    let rendered = tools::render(
        backend.as_ref(),
        tools::Chat {
            messages,
            tools: tools.clone(),
            kwargs: tools::template_kwargs(&obj)?,
            parse_calls: with_tools,
            forced: forced.is_some(),
            format: state.config().reasoning_format,
            tool_syntax: state.config().tool_syntax,
            tools_param: "tools",
        },
    )?;
    let mut output = rendered.output;
    let rendered = rendered.prompt;
    let prompt = backend.tokenize(&rendered, true, true);
    generate::check_prompt(backend.as_ref(), &prompt, "messages")?;
    let room = generate::room(backend.as_ref(), prompt.len());
    let mut opts = options(
        &obj,
        backend.as_ref(),
        max_tokens,
        room,
        logprobs.then(|| top.unwrap_or(0) as usize),
    )?;
    opts.sampling.format = match forced {
        Some(call) => call.format(&mut output, &|t| backend.is_control_token(t))?,
        None => crate::structured::after_reasoning(opts.sampling.format, &output)?,
    };
    opts.reasoning_budget = tools::reasoning_budget(
        backend.as_ref(),
        generate::thinking_token_budget(&obj)?,
        state.config().reasoning_budget,
        &output,
        &opts.sampling.format,
    )?;
    let rxs = generate::submit_n(backend.as_ref(), &prompt, &opts, n)?;
    log.start_generation();
    let meta = Meta {
        id: generate::new_id("chatcmpl-", log.id()),
        created: generate::unix_now(),
        model,
    };
    if stream {
        return Ok(sse(
            &state,
            chat_events(log, rxs, meta, usage_chunk, output),
        ));
    }
    let done = generate::collect_all(rxs, &log, Some(output)).await?;
    log.finish();
    let choices: Vec<Value> = done
        .iter()
        .enumerate()
        .map(|(i, f)| {
            let calls: Vec<Value> = f
                .out
                .calls
                .iter()
                .enumerate()
                .filter(|(_, c)| c.complete)
                .map(|(k, c)| {
                    json!({"id": call_id(&meta.id, i, k), "type": "function",
                        "function": {"name": c.name, "arguments": c.arguments}})
                })
                .collect();
            let content = if calls.is_empty() || !f.out.content.trim().is_empty() {
                json!(f.out.content)
            } else {
                Value::Null
            };
            let mut message = json!({"role": "assistant", "content": content, "refusal": null});
            if !f.out.reasoning.is_empty() {
                message["reasoning_content"] = json!(f.out.reasoning);
            }
            let mut finish = generate::finish_name(f.finish);
            if !calls.is_empty() {
                message["tool_calls"] = Value::Array(calls);
                finish = "tool_calls";
            }
            json!({
                "index": i,
                "message": message,
                "logprobs": if logprobs { json!({"content": chat_logprob_items(&f.logprobs), "refusal": null}) } else { Value::Null },
                "finish_reason": finish,
            })
        })
        .collect();
    Ok(Json(json!({
        "id": meta.id, "object": "chat.completion", "created": meta.created, "model": meta.model,
        "system_fingerprint": null,
        "choices": choices,
        "usage": usage_json(generate::total_usage(&done)),
    }))
    .into_response())
}

/// The id of call `k` of choice `i`, unique to this answer: clients match tool results to
/// calls by id over a whole conversation, so no later answer may reuse one.
fn call_id(answer_id: &str, i: usize, k: usize) -> String {
    let base = answer_id.trim_start_matches("chatcmpl-");
    format!("call_{base}_{i}_{k}")
}

/// The chat delta of one parsed event of choice `i`; `None` for events with no delta.
fn chat_delta(ev: &Event, answer_id: &str, i: usize) -> Option<Value> {
    Some(match ev {
        Event::Reasoning(t) => json!({"reasoning_content": t}),
        Event::Content(t) => json!({"content": t}),
        Event::ToolStart { index, name } => json!({"tool_calls": [{"index": index,
            "id": call_id(answer_id, i, *index), "type": "function",
            "function": {"name": name, "arguments": ""}}]}),
        Event::ToolArgs { index, delta } => {
            json!({"tool_calls": [{"index": index, "function": {"arguments": delta}}]})
        }
        Event::ToolEnd { .. } => return None,
    })
}

fn merged(
    rxs: Vec<UnboundedReceiver<GenEvent>>,
) -> StreamMap<usize, UnboundedReceiverStream<GenEvent>> {
    let mut map = StreamMap::new();
    for (i, rx) in rxs.into_iter().enumerate() {
        map.insert(i, UnboundedReceiverStream::new(rx));
    }
    map
}

fn data(v: &Value) -> SseEvent {
    SseEvent::default().data(v.to_string())
}

fn chat_events(
    log: RequestLog,
    rxs: Vec<UnboundedReceiver<GenEvent>>,
    meta: Meta,
    usage_chunk: bool,
    output: OutputConfig,
) -> impl Stream<Item = SseEvent> + Send + 'static {
    let n = rxs.len();
    async_stream::stream! {
        let chunk = |choices: Value| {
            let mut c = json!({"id": meta.id, "object": "chat.completion.chunk", "created": meta.created,
                "model": meta.model, "system_fingerprint": null, "choices": choices});
            if usage_chunk {
                c["usage"] = Value::Null;
            }
            c
        };
        for i in 0..n {
            yield data(&chunk(json!([{"index": i, "delta": {"role": "assistant", "content": ""},
                "logprobs": null, "finish_reason": null}])));
        }
        let mut map = merged(rxs);
        let mut states: Vec<Finished> = (0..n).map(|_| Finished::parsing(output)).collect();
        let mut done = 0;
        while let Some((i, ev)) = map.next().await {
            let mut lp = match &ev {
                GenEvent::Token { logprob: Some(l), .. } => Some(chat_logprob_items(std::slice::from_ref(l))),
                _ => None,
            };
            match states[i].apply(ev, &log) {
                Err(e) => {
                    yield data(&e.body(Flavor::OpenAi));
                    return;
                }
                Ok(step) => {
                    let mut deltas: Vec<Value> = step.events.iter().filter_map(|e| chat_delta(e, &meta.id, i)).collect();
                    if deltas.is_empty() && lp.is_some() {
                        deltas.push(json!({"content": ""}));
                    }
                    for delta in deltas {
                        // A token's logprobs go with the first chunk it released.
                        let logprobs = lp.take().map_or(Value::Null, |c| json!({"content": c, "refusal": null}));
                        yield data(&chunk(json!([{"index": i, "delta": delta,
                            "logprobs": logprobs, "finish_reason": null}])));
                    }
                    if step.last {
                        done += 1;
                        let called = states[i].out.complete_calls().next().is_some();
                        let finish = if called { "tool_calls" } else { generate::finish_name(states[i].finish) };
                        yield data(&chunk(json!([{"index": i, "delta": {}, "logprobs": null,
                            "finish_reason": finish}])));
                    }
                }
            }
        }
        if done < n {
            yield data(&ApiError::internal("the engine dropped a stream").body(Flavor::OpenAi));
            return;
        }
        if usage_chunk {
            let mut c = chunk(json!([]));
            c["usage"] = usage_json(generate::total_usage(&states));
            yield data(&c);
        }
        log.finish();
        yield SseEvent::default().data("[DONE]");
    }
}

/// POST /v1/completions
pub async fn completions(
    State(state): State<AppState>,
    Extension(log): Extension<RequestLog>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    completion(state, log, body)
        .await
        .unwrap_or_else(|e| e.into_response(Flavor::OpenAi))
}

/// Most prompts in one completions request, and most choices (prompts × `n`).
const MAX_PROMPTS: usize = 32;
const MAX_CHOICES: usize = 64;

/// The prompts of a completions request: a string, a token array, or an array of either
/// (one choice group per prompt, as OpenAI's legacy API does).
fn completion_prompts(obj: &Obj, backend: &dyn crate::Backend) -> Result<Vec<Vec<u32>>, ApiError> {
    let v = field(obj, "prompt").ok_or_else(|| ApiError::missing("prompt"))?;
    let one = |p: &Value| match p {
        Value::String(s) => Ok(backend.tokenize(s, true, true)),
        Value::Array(_) => generate::token_array(p, "prompt", backend),
        _ => Err(ApiError::invalid_param(
            "prompt",
            "each prompt must be a string or an array of token ids",
        )),
    };
    let prompts: Vec<Vec<u32>> = match v {
        Value::String(_) => vec![one(v)?],
        Value::Array(items) if items.iter().all(Value::is_number) => vec![one(v)?],
        Value::Array(items) if items.iter().any(Value::is_number) => {
            return Err(ApiError::invalid_param(
                "prompt",
                "'prompt' mixes token ids with other prompts; use an array of token arrays",
            ));
        }
        Value::Array(items) => items.iter().map(one).collect::<Result<_, _>>()?,
        _ => {
            return Err(ApiError::invalid_param(
                "prompt",
                "'prompt' must be a string, an array of token ids, or an array of those",
            ));
        }
    };
    if prompts.is_empty() || prompts.len() > MAX_PROMPTS {
        return Err(ApiError::invalid_param(
            "prompt",
            format!("between 1 and {MAX_PROMPTS} prompts are supported per request"),
        ));
    }
    Ok(prompts)
}

/// `suffix` (fill-in-the-middle) and `best_of` above `n` change what the answer means; an
/// ordinary completion returned in their place would pass for one, so they are refused.
fn refuse_unsupported_completion_options(obj: &Obj, n: usize) -> Result<(), ApiError> {
    if parse::opt_str(obj, "suffix")?.is_some_and(|s| !s.is_empty()) {
        return Err(ApiError::invalid_param(
            "suffix",
            "'suffix' (fill-in-the-middle) is not supported",
        ));
    }
    match opt_u64(obj, "best_of", 1, u32::MAX as u64)? {
        Some(b) if b as usize != n => Err(ApiError::invalid_param(
            "best_of",
            format!(
                "'best_of' must equal 'n' ({n}): choosing the best of more samples is not supported"
            ),
        )),
        _ => Ok(()),
    }
}

fn completion_logprobs(f: &Finished, offset0: usize) -> Value {
    legacy_logprobs(None, f.logprobs.iter(), offset0)
}

/// The legacy `logprobs` object over `items`; `first` is the text of an echoed first prompt
/// token, which has no logprob (nothing precedes it) and gets nulls.
fn legacy_logprobs<'a>(
    first: Option<&str>,
    items: impl Iterator<Item = &'a TokenLogprob>,
    offset0: usize,
) -> Value {
    let mut offset = offset0;
    let (mut tokens, mut lps, mut tops, mut offsets) = (vec![], vec![], vec![], vec![]);
    if let Some(t) = first {
        tokens.push(json!(t));
        lps.push(Value::Null);
        tops.push(Value::Null);
        offsets.push(offset);
        offset += t.len();
    }
    for l in items {
        tokens.push(json!(l.token));
        lps.push(json!(l.logprob));
        let mut m = serde_json::Map::new();
        for t in &l.top {
            m.insert(t.token.clone(), json!(t.logprob));
        }
        tops.push(Value::Object(m));
        offsets.push(offset);
        offset += l.token.len();
    }
    json!({"tokens": tokens, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offsets})
}

/// Logprobs of an echoed choice: the prompt's tokens, then (unless the client asked for no
/// tokens) the generated ones.
fn echo_logprobs(f: &Finished, first: &str, scoring_only: bool) -> Value {
    let generated = if scoring_only {
        &[][..]
    } else {
        &f.logprobs[..]
    };
    legacy_logprobs(Some(first), f.prompt_logprobs.iter().chain(generated), 0)
}

/// Usage of a completions request: every prompt counted once, completions added; the
/// cache source is that of the prompt with the most reused tokens.
fn completion_usage(done: &[Finished], n: usize) -> Usage {
    let mut u = Usage::default();
    let mut most_cached = 0;
    for group in done.chunks(n.max(1)) {
        let g = generate::total_usage(group);
        u.prompt_tokens += g.prompt_tokens;
        u.cached_tokens += g.cached_tokens;
        u.completion_tokens += g.completion_tokens;
        if g.cached_tokens > most_cached {
            most_cached = g.cached_tokens;
            u.cache_source = g.cache_source;
        }
    }
    u
}

async fn completion(
    state: AppState,
    log: RequestLog,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let obj = body_object(body)?;
    let backend = state.backend()?.clone();
    let model = generate::check_model(backend.as_ref(), &obj)?;
    let prompts = completion_prompts(&obj, backend.as_ref())?;
    for p in &prompts {
        generate::check_prompt(backend.as_ref(), p, "prompt")?;
    }
    let n = opt_u64(&obj, "n", 1, 16)?.unwrap_or(1) as usize;
    refuse_unsupported_completion_options(&obj, n)?;
    if prompts.len() * n > MAX_CHOICES {
        return Err(ApiError::invalid_param(
            "n",
            format!("at most {MAX_CHOICES} choices (prompts times n) per request"),
        ));
    }
    let stream = opt_bool(&obj, "stream")?.unwrap_or(false);
    let usage_chunk = include_usage(&obj)?;
    let echo = opt_bool(&obj, "echo")?.unwrap_or(false);
    let logprobs = opt_u64(&obj, "logprobs", 0, 5)?.map(|k| k as usize);
    // The legacy API's default is 16 tokens.
    let max_tokens = opt_u64(&obj, "max_tokens", 0, u32::MAX as u64)?.unwrap_or(16);
    // `echo` with `logprobs` scores the prompt. With max_tokens 0 (the usual scoring call)
    // the engine still samples one token after the prompt; it is dropped here.
    let echo_lp = echo && logprobs.is_some();
    let scoring_only = echo_lp && max_tokens == 0;
    let longest = prompts.iter().map(Vec::len).max().unwrap_or(0);
    let mut opts = options(
        &obj,
        backend.as_ref(),
        Some(max_tokens),
        generate::room(backend.as_ref(), longest),
        logprobs,
    )?;
    opts.prompt_logprobs = echo_lp;
    // Each choice's echoed prompt text and the text of its first prompt token, in choice
    // order (prompt-major).
    let mut prefixes = Vec::with_capacity(prompts.len() * n);
    let mut firsts = Vec::with_capacity(prompts.len() * n);
    for p in &prompts {
        let text = if echo {
            backend
                .detokenize(p)
                .map_err(|e| ApiError::invalid_param("prompt", e.to_string()))?
        } else {
            String::new()
        };
        prefixes.extend(std::iter::repeat_n(text, n));
        let first = if echo_lp {
            backend
                .detokenize(&p[..1])
                .map_err(|e| ApiError::invalid_param("prompt", e.to_string()))?
        } else {
            String::new()
        };
        firsts.extend(std::iter::repeat_n(first, n));
    }
    let meta = Meta {
        id: generate::new_id("cmpl-", log.id()),
        created: generate::unix_now(),
        model,
    };
    if max_tokens == 0 && !scoring_only {
        // Nothing to generate (e.g. echo only): answer without touching the engine.
        let usage = Usage {
            prompt_tokens: prompts.iter().map(Vec::len).sum(),
            ..Usage::default()
        };
        log.add_usage(usage, Default::default());
        let choices: Vec<Value> = prefixes.iter().enumerate().map(|(i, text)| json!({"index": i, "text": text, "logprobs": null, "finish_reason": "length"})).collect();
        return Ok(Json(
            json!({"id": meta.id, "object": "text_completion", "created": meta.created,
            "model": meta.model, "choices": choices, "usage": usage_json(usage)}),
        )
        .into_response());
    }
    let requested_budget = generate::thinking_token_budget(&obj)?;
    let mut rxs = Vec::with_capacity(prefixes.len());
    for p in &prompts {
        opts.max_tokens = (max_tokens as usize)
            .max(usize::from(scoring_only))
            .min(generate::room(backend.as_ref(), p.len()));
        opts.reasoning_budget = completion_budget(
            &state,
            backend.as_ref(),
            requested_budget,
            p,
            &opts.sampling.format,
        )?;
        rxs.extend(generate::submit_n(backend.as_ref(), p, &opts, n)?);
    }
    log.start_generation();
    if stream {
        return Ok(sse(
            &state,
            completion_events(
                log,
                rxs,
                meta,
                usage_chunk,
                Echo {
                    prefixes,
                    firsts: echo_lp.then_some(firsts),
                    scoring_only,
                },
                n,
                logprobs.is_some(),
            ),
        ));
    }
    let done = generate::collect_all(rxs, &log, None).await?;
    log.finish();
    let choices: Vec<Value> = done
        .iter()
        .zip(prefixes.iter().zip(&firsts))
        .enumerate()
        .map(|(i, (f, (prefix, first)))| {
            let lp = match logprobs {
                None => Value::Null,
                Some(_) if echo_lp => echo_logprobs(f, first, scoring_only),
                Some(_) => completion_logprobs(f, prefix.len()),
            };
            let (text, finish) = if scoring_only {
                ("", "length")
            } else {
                (f.text.as_str(), generate::finish_name(f.finish))
            };
            json!({"index": i, "text": format!("{prefix}{text}"), "logprobs": lp, "finish_reason": finish})
        })
        .collect();
    let mut usage = completion_usage(&done, n);
    if scoring_only {
        usage.completion_tokens = 0;
    }
    Ok(Json(json!({
        "id": meta.id, "object": "text_completion", "created": meta.created, "model": meta.model,
        "choices": choices, "usage": usage_json(usage),
    }))
    .into_response())
}

/// A completion's reasoning budget. The prompt is the text the model continues, so its
/// reasoning is read from it as a chat's is from the rendered template: a prompt that ends
/// in `<think>` starts inside the block. The output itself stays one text (completions
/// separate no reasoning); the budget only closes the block.
fn completion_budget(
    state: &AppState,
    backend: &dyn Backend,
    requested: Option<(usize, &str)>,
    prompt: &[u32],
    format: &ferrite_engine::OutputFormat,
) -> Result<Option<ferrite_engine::ReasoningBudget>, ApiError> {
    let default = state.config().reasoning_budget;
    if requested.is_none() && default.is_none() {
        return Ok(None);
    }
    let text = backend
        .detokenize(prompt)
        .map_err(|e| ApiError::invalid_param("prompt", e.to_string()))?;
    let output = OutputConfig::for_prompt(state.config().reasoning_format, &text, &text, None);
    tools::reasoning_budget(backend, requested, default, &output, format)
}

/// What a completions stream echoes: each choice's prompt text and, when prompt logprobs
/// were asked for, the text of its first prompt token (logprob-less); `scoring_only` drops
/// the one token sampled for a `max_tokens: 0` request.
struct Echo {
    prefixes: Vec<String>,
    firsts: Option<Vec<String>>,
    scoring_only: bool,
}

fn completion_events(
    log: RequestLog,
    rxs: Vec<UnboundedReceiver<GenEvent>>,
    meta: Meta,
    usage_chunk: bool,
    echo: Echo,
    per_prompt: usize,
    logprobs: bool,
) -> impl Stream<Item = SseEvent> + Send + 'static {
    let n = rxs.len();
    let Echo {
        prefixes,
        firsts,
        scoring_only,
    } = echo;
    async_stream::stream! {
        let chunk = |i: usize, text: &str, lp: Value, finish: Value| {
            json!({"id": meta.id, "object": "text_completion", "created": meta.created, "model": meta.model,
                "choices": [{"index": i, "text": text, "logprobs": lp, "finish_reason": finish}]})
        };
        // With prompt logprobs the echo waits for them (they come before the first token).
        let mut echoed: Vec<bool> = (0..n).map(|_| firsts.is_some()).collect();
        if firsts.is_none() {
            for (i, prefix) in prefixes.iter().enumerate() {
                if !prefix.is_empty() {
                    yield data(&chunk(i, prefix, Value::Null, Value::Null));
                }
            }
        }
        let mut map = merged(rxs);
        let mut states: Vec<Finished> = (0..n).map(|_| Finished::default()).collect();
        let mut done = 0;
        while let Some((i, ev)) = map.next().await {
            let before = states[i].logprobs.len();
            let prompt_side = matches!(ev, GenEvent::Started { .. } | GenEvent::PromptLogprobs(_));
            match states[i].apply(ev, &log) {
                Err(e) => {
                    yield data(&e.body(Flavor::OpenAi));
                    return;
                }
                Ok(step) => {
                    let (text, last) = (step.text, step.last);
                    if let Some(firsts) = &firsts && !prompt_side && echoed[i] {
                        echoed[i] = false;
                        let lp = legacy_logprobs(Some(&firsts[i]), states[i].prompt_logprobs.iter(), 0);
                        yield data(&chunk(i, &prefixes[i], lp, Value::Null));
                    }
                    if scoring_only {
                        if last {
                            done += 1;
                            yield data(&chunk(i, "", Value::Null, json!("length")));
                        }
                        continue;
                    }
                    let lp = if logprobs && states[i].logprobs.len() > before {
                        // Offsets run on from the plain answer's: after the echoed prompt (its
                        // scored tokens, when it was scored), then the tokens streamed so far.
                        let text_len = |items: &[TokenLogprob]| items.iter().map(|l| l.token.len()).sum::<usize>();
                        let echoed = match &firsts {
                            Some(firsts) => firsts[i].len() + text_len(&states[i].prompt_logprobs),
                            None => prefixes[i].len(),
                        };
                        let offset = echoed + text_len(&states[i].logprobs[..before]);
                        legacy_logprobs(None, states[i].logprobs[before..].iter(), offset)
                    } else {
                        Value::Null
                    };
                    if !text.is_empty() || !lp.is_null() {
                        yield data(&chunk(i, &text, lp, Value::Null));
                    }
                    if last {
                        done += 1;
                        yield data(&chunk(i, "", Value::Null, json!(generate::finish_name(states[i].finish))));
                    }
                }
            }
        }
        if done < n {
            yield data(&ApiError::internal("the engine dropped a stream").body(Flavor::OpenAi));
            return;
        }
        if usage_chunk {
            let mut usage = completion_usage(&states, per_prompt);
            if scoring_only {
                usage.completion_tokens = 0;
            }
            yield data(&json!({"id": meta.id, "object": "text_completion", "created": meta.created,
                "model": meta.model, "choices": [], "usage": usage_json(usage)}));
        }
        log.finish();
        yield SseEvent::default().data("[DONE]");
    }
}
