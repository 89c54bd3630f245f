//! Anthropic endpoints: `/v1/messages` (plain and streaming with named events) and
//! `/v1/messages/count_tokens`.

use axum::Extension;
use axum::Json;
use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::response::sse::Event;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use tokio::sync::mpsc::UnboundedReceiver;
use tokio_stream::Stream;

use ferrite_engine::output::{Collected, Event as ParsedEvent, OutputConfig};

use crate::error::{ApiError, Flavor};
use crate::generate::{self, Finished, GenOptions};
use crate::metrics::RequestLog;
use crate::parse::{self, Obj, body_object, field, opt_bool, opt_u64};
use crate::tool_choice::ToolChoice;
use crate::{AppState, tool_choice, tools};
use ferrite_engine::{Backend, FinishReason, GenEvent, Usage};

/// Anthropic tool definitions → OpenAI function tools for the template.
fn template_tools(obj: &Obj) -> Result<Option<Value>, ApiError> {
    let Some(tools) = parse::opt_array(obj, "tools")? else {
        return Ok(None);
    };
    if tools.is_empty() {
        return Ok(None);
    }
    let converted = tools
        .iter()
        .enumerate()
        .map(|(i, t)| {
            // Calls are matched to tools by name; a nameless tool could never be called.
            let name = t.get("name").and_then(Value::as_str).ok_or_else(|| {
                ApiError::invalid_param(
                    &format!("tools[{i}].name"),
                    format!("tools[{i}] needs a string 'name'"),
                )
            })?;
            Ok(json!({"type": "function", "function": {
                "name": name,
                "description": t.get("description").cloned().unwrap_or(Value::Null),
                "parameters": t.get("input_schema").cloned().unwrap_or(json!({})),
            }}))
        })
        .collect::<Result<_, ApiError>>()?;
    Ok(Some(Value::Array(converted)))
}

/// Anthropic's `thinking`: `{"type": "enabled", "budget_tokens": N}` or `{"type":
/// "disabled"}`; `None` when the request leaves it out.
fn thinking(obj: &Obj) -> Result<Option<Thinking>, ApiError> {
    let Some(thinking) = parse::opt_object(obj, "thinking")? else {
        return Ok(None);
    };
    match parse::opt_str(thinking, "type")? {
        Some("enabled") => {
            let budget = opt_u64(thinking, "budget_tokens", 1, u32::MAX as u64)?
                .ok_or_else(|| ApiError::missing("thinking.budget_tokens"))?;
            Ok(Some(Thinking::Enabled {
                budget: budget as usize,
            }))
        }
        Some("disabled") => Ok(Some(Thinking::Disabled)),
        _ => Err(ApiError::invalid_param(
            "thinking.type",
            "'thinking.type' must be 'enabled' or 'disabled'",
        )),
    }
}

/// A request's `thinking`.
enum Thinking {
    /// Think, at most `budget` tokens.
    Enabled {
        budget: usize,
    },
    Disabled,
}

/// `thinking` as the `enable_thinking` template variable reasoning templates read.
fn thinking_kwargs(obj: &Obj) -> Result<serde_json::Map<String, Value>, ApiError> {
    let mut kwargs = serde_json::Map::new();
    if let Some(t) = thinking(obj)? {
        let enabled = matches!(t, Thinking::Enabled { .. });
        kwargs.insert("enable_thinking".into(), json!(enabled));
    }
    Ok(kwargs)
}

/// A messages-shaped body's prompt, rendered and tokenized, and how to read the output;
/// `parse_calls` when tool calls are to be parsed.
fn prompt_tokens(
    state: &AppState,
    backend: &dyn Backend,
    obj: &Obj,
    choice: &ToolChoice,
    forced: bool,
) -> Result<(Vec<u32>, Option<Value>, OutputConfig), ApiError> {
    let messages =
        parse::opt_array(obj, "messages")?.ok_or_else(|| ApiError::missing("messages"))?;
    let messages = crate::chat::anthropic_messages(field(obj, "system"), messages)?;
    let tools = template_tools(obj)?;
    let rendered = tools::render(
        backend,
        tools::Chat {
            messages,
            tools: tools.clone(),
            kwargs: thinking_kwargs(obj)?,
            parse_calls: tools.is_some() && choice.allows_calls(),
            forced,
            format: state.config().reasoning_format,
            tool_syntax: state.config().tool_syntax,
            tools_param: "tools",
        },
    )?;
    Ok((
        backend.tokenize(&rendered.prompt, true, true),
        tools,
        rendered.output,
    ))
}

/// POST /v1/messages/count_tokens
pub async fn count_tokens(
    State(state): State<AppState>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let result = (|| {
        let obj = body_object(body)?;
        let backend = state.backend()?;
        generate::check_model(backend.as_ref(), &obj)?;
        let choice = tool_choice::anthropic(field(&obj, "tool_choice"))?;
        let (prompt, _, _) = prompt_tokens(&state, backend.as_ref(), &obj, &choice, false)?;
        Ok::<_, ApiError>(Json(json!({"input_tokens": prompt.len()})).into_response())
    })();
    result.unwrap_or_else(|e| e.into_response(Flavor::Anthropic))
}

/// POST /v1/messages
pub async fn messages(
    State(state): State<AppState>,
    Extension(log): Extension<RequestLog>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    message(state, log, body)
        .await
        .unwrap_or_else(|e| e.into_response(Flavor::Anthropic))
}

fn stop_reason(f: &Finished) -> &'static str {
    match (f.finish, &f.stop_sequence) {
        (Some(FinishReason::Length), _) => "max_tokens",
        (_, Some(_)) => "stop_sequence",
        _ => "end_turn",
    }
}

fn usage_json(u: Usage) -> Value {
    json!({
        "input_tokens": u.prompt_tokens - u.cached_tokens.min(u.prompt_tokens),
        "output_tokens": u.completion_tokens,
        "cache_read_input_tokens": u.cached_tokens,
        "cache_creation_input_tokens": 0,
    })
}

/// The id of tool call `k` of message `msg_id`, unique to it: clients match tool results
/// to calls by id over a whole conversation, so no later answer may reuse one.
fn tool_use_id(msg_id: &str, k: usize) -> String {
    format!("toolu_{}_{k}", msg_id.trim_start_matches("msg_"))
}

/// The content blocks of a parsed output: thinking, text (kept when it is all there is),
/// finished tool calls.
fn content_blocks(out: &Collected, msg_id: &str) -> Vec<Value> {
    let mut content = Vec::new();
    if !out.reasoning.is_empty() {
        content.push(json!({"type": "thinking", "thinking": out.reasoning, "signature": ""}));
    }
    let calls: Vec<Value> = out
        .calls
        .iter()
        .enumerate()
        .filter(|(_, c)| c.complete)
        .map(|(k, c)| {
            json!({"type": "tool_use", "id": tool_use_id(msg_id, k), "name": c.name,
                "input": serde_json::from_str::<Value>(&c.arguments).unwrap_or(json!({}))})
        })
        .collect();
    if calls.is_empty() || !out.content.trim().is_empty() {
        content.push(json!({"type": "text", "text": out.content}));
    }
    content.extend(calls);
    content
}

async fn message(
    state: AppState,
    log: RequestLog,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let obj = body_object(body)?;
    let backend = state.backend()?.clone();
    let model = generate::check_model(backend.as_ref(), &obj)?;
    let max_tokens = opt_u64(&obj, "max_tokens", 1, u32::MAX as u64)?
        .ok_or_else(|| ApiError::missing("max_tokens"))?;
    let choice = tool_choice::anthropic(field(&obj, "tool_choice"))?;
    let offered = template_tools(&obj)?;
    let offered = offered.as_ref().and_then(Value::as_array);
    let forced = tool_choice::forced_call(offered.map_or(&[], Vec::as_slice), &choice)?;
    let (prompt, _, mut output) =
        prompt_tokens(&state, backend.as_ref(), &obj, &choice, forced.is_some())?;
    generate::check_prompt(backend.as_ref(), &prompt, "messages")?;
    let stop = parse::opt_stops(&obj, "stop_sequences")?;
    let stream = opt_bool(&obj, "stream")?.unwrap_or(false);
    let mut sampling = generate::sampling(&obj, 1.0)?;
    sampling.format = match forced {
        Some(call) => call.format(&mut output, &|t| backend.is_control_token(t))?,
        None => {
            crate::structured::after_reasoning(crate::structured::requested(&obj, None)?, &output)?
        }
    };
    let budget = match thinking(&obj)? {
        Some(Thinking::Enabled { budget }) => Some((budget, "thinking.budget_tokens")),
        _ => None,
    };
    let reasoning_budget = tools::reasoning_budget(
        backend.as_ref(),
        budget,
        state.config().reasoning_budget,
        &output,
        &sampling.format,
    )?;
    let opts = GenOptions {
        sampling,
        max_tokens: (max_tokens as usize).min(generate::room(backend.as_ref(), prompt.len())),
        stop,
        logprobs: None,
        prompt_logprobs: false,
        reasoning_budget,
        speculative: crate::speculative::speculative(&obj, backend.speculation())?,
    };
    let rx = generate::submit_n(backend.as_ref(), &prompt, &opts, 1)?
        .pop()
        .ok_or_else(|| ApiError::internal("no generation was queued"))?;
    log.start_generation();
    let id = generate::new_id("msg_", log.id());
    if stream {
        return Ok(crate::openai::sse(
            &state,
            message_events(log, rx, id, model, prompt.len(), output),
        ));
    }
    let f = generate::collect(rx, &log, Some(output)).await?;
    log.finish();
    let content = content_blocks(&f.out, &id);
    let called = f.out.complete_calls().next().is_some();
    let reason = if called { "tool_use" } else { stop_reason(&f) };
    Ok(Json(json!({
        "id": id, "type": "message", "role": "assistant", "model": model,
        "content": content, "stop_reason": reason, "stop_sequence": f.stop_sequence,
        "usage": usage_json(f.usage),
    }))
    .into_response())
}

fn named(name: &str, v: Value) -> Event {
    Event::default().event(name).data(v.to_string())
}

/// The open content block of a stream and its index.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Open {
    Thinking,
    Text,
    Tool(usize),
}

fn block_start(index: usize, block: Value) -> Event {
    named(
        "content_block_start",
        json!({"type": "content_block_start", "index": index, "content_block": block}),
    )
}

fn block_delta(index: usize, delta: Value) -> Event {
    named(
        "content_block_delta",
        json!({"type": "content_block_delta", "index": index, "delta": delta}),
    )
}

fn block_stop(index: usize) -> Event {
    named(
        "content_block_stop",
        json!({"type": "content_block_stop", "index": index}),
    )
}

/// Content blocks opened as parsed events arrive: a change of kind closes the open block.
/// Blank text is held while tools may be called: the plain answer drops blank text beside
/// tool calls, so a reply that is only calls has no text block.
struct Blocks {
    msg_id: String,
    open: Option<Open>,
    /// Index of the open block, or of the next one.
    index: usize,
    held: String,
}

impl Blocks {
    fn switch(&mut self, to: Open, block: Value, out: &mut Vec<Event>) {
        if self.open == Some(to) {
            return;
        }
        if self.open.take().is_some() {
            out.push(block_stop(self.index));
            self.index += 1;
        }
        out.push(block_start(self.index, block));
        self.open = Some(to);
    }

    fn text(&mut self, text: &str, out: &mut Vec<Event>) {
        if self.open != Some(Open::Text) {
            self.held.push_str(text);
            if self.held.trim().is_empty() {
                return;
            }
            self.switch(Open::Text, json!({"type": "text", "text": ""}), out);
            let held = std::mem::take(&mut self.held);
            out.push(block_delta(
                self.index,
                json!({"type": "text_delta", "text": held}),
            ));
            return;
        }
        out.push(block_delta(
            self.index,
            json!({"type": "text_delta", "text": text}),
        ));
    }

    fn event(&mut self, ev: ParsedEvent, out: &mut Vec<Event>) {
        match ev {
            ParsedEvent::Reasoning(t) => {
                self.switch(
                    Open::Thinking,
                    json!({"type": "thinking", "thinking": "", "signature": ""}),
                    out,
                );
                out.push(block_delta(
                    self.index,
                    json!({"type": "thinking_delta", "thinking": t}),
                ));
            }
            ParsedEvent::Content(t) => self.text(&t, out),
            ParsedEvent::ToolStart { index, name } => {
                let block = json!({"type": "tool_use", "id": tool_use_id(&self.msg_id, index),
                    "name": name, "input": {}});
                self.switch(Open::Tool(index), block, out);
            }
            ParsedEvent::ToolArgs { delta, .. } => out.push(block_delta(
                self.index,
                json!({"type": "input_json_delta", "partial_json": delta}),
            )),
            ParsedEvent::ToolEnd { .. } => {}
        }
    }

    /// Close the stream's blocks; without calls the answer keeps its text, blank or not.
    fn end(&mut self, called: bool, out: &mut Vec<Event>) {
        if !called && (!self.held.is_empty() || self.open.is_none()) {
            self.switch(Open::Text, json!({"type": "text", "text": ""}), out);
            let held = std::mem::take(&mut self.held);
            if !held.is_empty() {
                out.push(block_delta(
                    self.index,
                    json!({"type": "text_delta", "text": held}),
                ));
            }
        }
        if self.open.take().is_some() {
            out.push(block_stop(self.index));
        }
    }
}

fn message_events(
    log: RequestLog,
    mut rx: UnboundedReceiver<GenEvent>,
    id: String,
    model: String,
    prompt_len: usize,
    output: OutputConfig,
) -> impl Stream<Item = Event> + Send + 'static {
    async_stream::stream! {
        let mut state = Finished::parsing(output);
        let mut blocks = Blocks { msg_id: id.clone(), open: None, index: 0, held: String::new() };
        let mut started = false;
        while let Some(ev) = rx.recv().await {
            if !started {
                let cached = match &ev {
                    GenEvent::Started { cached_tokens } => *cached_tokens,
                    _ => 0,
                };
                let usage = Usage { prompt_tokens: prompt_len, cached_tokens: cached, ..Usage::default() };
                yield named("message_start", json!({"type": "message_start", "message": {
                    "id": id, "type": "message", "role": "assistant", "model": model, "content": [],
                    "stop_reason": null, "stop_sequence": null, "usage": usage_json(usage)}}));
                yield named("ping", json!({"type": "ping"}));
                started = true;
            }
            match state.apply(ev, &log) {
                Err(e) => {
                    yield named("error", e.body(Flavor::Anthropic));
                    return;
                }
                Ok(step) => {
                    let mut out = Vec::new();
                    for ev in step.events {
                        blocks.event(ev, &mut out);
                    }
                    if step.last {
                        let called = state.out.complete_calls().next().is_some();
                        blocks.end(called, &mut out);
                    }
                    for e in out {
                        yield e;
                    }
                    if step.last {
                        let called = state.out.complete_calls().next().is_some();
                        let reason = if called { "tool_use" } else { stop_reason(&state) };
                        yield named("message_delta", json!({"type": "message_delta",
                            "delta": {"stop_reason": reason, "stop_sequence": state.stop_sequence},
                            "usage": {"output_tokens": state.usage.completion_tokens}}));
                        log.finish();
                        yield named("message_stop", json!({"type": "message_stop"}));
                        return;
                    }
                }
            }
        }
        yield named("error", ApiError::internal("the engine dropped a stream").body(Flavor::Anthropic));
    }
}
