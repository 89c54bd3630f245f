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

use crate::error::{ApiError, Flavor};
use crate::generate::{self, Finished, GenOptions};
use crate::metrics::RequestLog;
use crate::parse::{self, Obj, body_object, field, opt_bool, opt_u64};
use crate::{AppState, tool_choice, tools};
use ferrite_engine::{Backend, ChatPrompt, FinishReason, GenEvent, Usage};

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

/// A messages-shaped body's prompt, rendered and tokenized, and its tools as the template
/// got them.
fn prompt_tokens(backend: &dyn Backend, obj: &Obj) -> Result<(Vec<u32>, Option<Value>), ApiError> {
    let messages =
        parse::opt_array(obj, "messages")?.ok_or_else(|| ApiError::missing("messages"))?;
    let messages = crate::chat::anthropic_messages(field(obj, "system"), messages)?;
    let tools = template_tools(obj)?;
    let rendered = backend
        .render_chat(&ChatPrompt {
            messages,
            tools: tools.clone(),
        })
        .map_err(|e| ApiError::bad_request(format!("could not apply the chat template: {e}")))?;
    Ok((backend.tokenize(&rendered, true, true), tools))
}

/// POST /v1/messages/count_tokens
pub async fn count_tokens(
    State(state): State<AppState>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let result = (|| {
        let obj = body_object(body)?;
        let backend = state.backend()?;
        generate::check_model(backend.as_ref(), &obj, true)?;
        let (prompt, _) = prompt_tokens(backend.as_ref(), &obj)?;
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

/// `tool_use` blocks of message `msg_id`, with ids unique to it: clients match tool results
/// to calls by id over a whole conversation, so no later answer may reuse one.
fn tool_use_blocks(calls: &[Value], msg_id: &str) -> Vec<Value> {
    let base = msg_id.trim_start_matches("msg_");
    calls
        .iter()
        .enumerate()
        .map(|(k, c)| {
            let args = c
                .pointer("/function/arguments")
                .and_then(Value::as_str)
                .unwrap_or("{}");
            json!({"type": "tool_use", "id": format!("toolu_{base}_{k}"),
                "name": c.pointer("/function/name").cloned().unwrap_or(Value::Null),
                "input": serde_json::from_str::<Value>(args).unwrap_or(json!({}))})
        })
        .collect()
}

async fn message(
    state: AppState,
    log: RequestLog,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let obj = body_object(body)?;
    let backend = state.backend()?.clone();
    let model = generate::check_model(backend.as_ref(), &obj, true)?;
    let max_tokens = opt_u64(&obj, "max_tokens", 1, u32::MAX as u64)?
        .ok_or_else(|| ApiError::missing("max_tokens"))?;
    let (prompt, tools) = prompt_tokens(backend.as_ref(), &obj)?;
    generate::check_prompt(backend.as_ref(), &prompt, "messages")?;
    let choice = tool_choice::anthropic(field(&obj, "tool_choice"))?;
    let with_tools = tools.is_some() && choice.allows_calls();
    let offered = tools.as_ref().and_then(Value::as_array);
    let forced = tool_choice::forced_call(offered.map_or(&[], Vec::as_slice), &choice)?;
    let stop = parse::opt_stops(&obj, "stop_sequences")?;
    let stream = opt_bool(&obj, "stream")?.unwrap_or(false);
    let mut sampling = generate::sampling(&obj, 1.0)?;
    if let Some(call) = forced {
        sampling.format = call;
    }
    let opts = GenOptions {
        sampling,
        max_tokens: (max_tokens as usize).min(generate::room(backend.as_ref(), prompt.len())),
        stop,
        logprobs: None,
        prompt_logprobs: false,
    };
    let rx = generate::submit_n(backend.as_ref(), &prompt, &opts, 1)?
        .pop()
        .ok_or_else(|| ApiError::internal("no generation was queued"))?;
    log.start_generation();
    let id = generate::new_id("msg_", log.id());
    if stream {
        return Ok(crate::openai::sse(
            &state,
            message_events(log, rx, id, model, prompt.len(), with_tools),
        ));
    }
    let f = generate::collect(rx, &log).await?;
    log.finish();
    let mut reason = stop_reason(&f);
    let mut content = Vec::new();
    let calls = if with_tools {
        tools::parse_tool_calls(&f.text)
    } else {
        None
    };
    match calls {
        Some(parsed) => {
            if let Some(text) = parsed.content {
                content.push(json!({"type": "text", "text": text}));
            }
            content.extend(tool_use_blocks(&parsed.calls, &id));
            reason = "tool_use";
        }
        None => content.push(json!({"type": "text", "text": f.text})),
    }
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

fn text_block_start() -> Event {
    named(
        "content_block_start",
        json!({"type": "content_block_start", "index": 0,
            "content_block": {"type": "text", "text": ""}}),
    )
}

fn text_delta(text: &str) -> Event {
    named(
        "content_block_delta",
        json!({"type": "content_block_delta", "index": 0,
            "delta": {"type": "text_delta", "text": text}}),
    )
}

fn message_events(
    log: RequestLog,
    mut rx: UnboundedReceiver<GenEvent>,
    id: String,
    model: String,
    prompt_len: usize,
    with_tools: bool,
) -> impl Stream<Item = Event> + Send + 'static {
    async_stream::stream! {
        let mut state = Finished::default();
        let mut splitter = tools::StreamSplitter::new(with_tools);
        let mut started = false;
        // With tools the text block opens only once non-blank text is shown (blank text is
        // held): the plain answer drops blank text beside tool calls, so a reply that is only
        // calls has no text block.
        let mut opened = false;
        let mut held = String::new();
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
                if !with_tools {
                    opened = true;
                    yield text_block_start();
                }
                yield named("ping", json!({"type": "ping"}));
                started = true;
            }
            match state.apply(ev, &log) {
                Err(e) => {
                    yield named("error", e.body(Flavor::Anthropic));
                    return;
                }
                Ok((text, last)) => {
                    let mut text = splitter.push(&text, last);
                    if !opened {
                        held.push_str(&text);
                        text = String::new();
                        if !held.trim().is_empty() {
                            opened = true;
                            yield text_block_start();
                            text = std::mem::take(&mut held);
                        }
                    }
                    if !text.is_empty() {
                        yield text_delta(&text);
                    }
                    if last {
                        let calls = splitter.calls();
                        if !opened && calls.is_none() {
                            // Without calls the plain answer keeps its text, blank or not.
                            opened = true;
                            yield text_block_start();
                            if !held.is_empty() {
                                yield text_delta(&held);
                            }
                        }
                        if opened {
                            yield named("content_block_stop", json!({"type": "content_block_stop", "index": 0}));
                        }
                        let first = usize::from(opened);
                        let mut reason = stop_reason(&state);
                        if let Some(calls) = calls {
                            for (k, block) in tool_use_blocks(&calls, &id).into_iter().enumerate() {
                                let index = first + k;
                                let input = block["input"].to_string();
                                let mut start = block.clone();
                                start["input"] = json!({});
                                yield named("content_block_start", json!({"type": "content_block_start",
                                    "index": index, "content_block": start}));
                                yield named("content_block_delta", json!({"type": "content_block_delta",
                                    "index": index, "delta": {"type": "input_json_delta", "partial_json": input}}));
                                yield named("content_block_stop", json!({"type": "content_block_stop", "index": index}));
                            }
                            reason = "tool_use";
                        }
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
