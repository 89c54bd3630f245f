//! OpenAI Responses API, stateless: `/v1/responses` with string or item input, plain and
//! streaming (`response.created` … `response.completed`). Nothing is stored, so
//! `previous_response_id` is refused with a 400.
//!
//! Function tools: `tools` (`{"type": "function", "name", "description", "parameters"}`)
//! are rendered through the chat template like chat-completions tools; tool calls the model
//! writes (Hermes `<tool_call>` blocks) come back as `function_call` output items, and the
//! client answers them with `function_call_output` input items on the next request.

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
use crate::parse::{self, body_object, field, opt_bool, opt_u64};
use crate::{AppState, tools};
use ferrite_engine::{ChatPrompt, FinishReason, GenEvent, SamplingParams, Usage};

/// Fields echoed in every response object.
#[derive(Clone)]
struct Shape {
    id: String,
    msg_id: String,
    created: u64,
    model: String,
    instructions: Option<String>,
    max_output_tokens: Option<u64>,
    temperature: f32,
    top_p: f32,
    /// Tools as the client sent them (echoed in the response object).
    tools: Value,
    tool_choice: Value,
    /// Whether tool calls are parsed from the output.
    with_tools: bool,
    /// The output format object, echoed as `text.format`.
    format: Value,
}

impl Shape {
    fn object(
        &self,
        status: &str,
        output: Vec<Value>,
        usage: Option<Usage>,
        incomplete: bool,
    ) -> Value {
        json!({
            "id": self.id, "object": "response", "created_at": self.created, "status": status,
            "error": null,
            "incomplete_details": if incomplete { json!({"reason": "max_output_tokens"}) } else { Value::Null },
            "instructions": self.instructions, "max_output_tokens": self.max_output_tokens,
            "model": self.model, "output": output, "parallel_tool_calls": true,
            "previous_response_id": null, "temperature": self.temperature, "top_p": self.top_p,
            "tool_choice": self.tool_choice, "tools": self.tools,
            "text": {"format": self.format},
            "truncation": "disabled", "metadata": {}, "store": false,
            "usage": usage.map_or(Value::Null, |u| json!({
                "input_tokens": u.prompt_tokens,
                "input_tokens_details": {"cached_tokens": u.cached_tokens},
                "output_tokens": u.completion_tokens,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": u.prompt_tokens + u.completion_tokens,
            })),
        })
    }

    fn part(text: &str) -> Value {
        json!({"type": "output_text", "text": text, "annotations": []})
    }

    fn item(&self, status: &str, content: Vec<Value>) -> Value {
        json!({"type": "message", "id": self.msg_id, "status": status, "role": "assistant", "content": content})
    }

    /// Output item of tool call `k`; `arguments` is the JSON text of the arguments.
    fn call_item(&self, k: usize, call: &Value, status: &str, with_arguments: bool) -> Value {
        let base = self.id.trim_start_matches("resp_");
        let args = call["function"]["arguments"].as_str().unwrap_or("{}");
        json!({"type": "function_call", "id": format!("fc_{base}_{k}"),
            "call_id": format!("call_{base}_{k}"), "name": call["function"]["name"],
            "arguments": if with_arguments { args } else { "" }, "status": status})
    }

    /// Finished output items: the message (when there is text or no tool call), with the
    /// response's `status`, then one `function_call` item per call (always whole: calls are
    /// only parsed from closed markup).
    fn output(&self, status: &str, text: Option<&str>, calls: &[Value]) -> Vec<Value> {
        let mut out = Vec::with_capacity(calls.len() + 1);
        if text.is_some() || calls.is_empty() {
            out.push(self.item(status, vec![Shape::part(text.unwrap_or(""))]));
        }
        for (k, c) in calls.iter().enumerate() {
            out.push(self.call_item(k, c, "completed", true));
        }
        out
    }
}

/// Function tools of a Responses request, converted to the chat-completions shape the chat
/// template expects; other tool types (web search, file search, ...) are refused.
fn chat_tools(tools: &[Value]) -> Result<Vec<Value>, ApiError> {
    tools
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let at = format!("tools[{i}]");
            let kind = t.get("type").and_then(Value::as_str).unwrap_or("");
            if kind != "function" {
                return Err(ApiError::invalid_param(
                    &format!("{at}.type"),
                    format!("tool type '{kind}' is not supported (function tools only)"),
                ));
            }
            let name = t.get("name").and_then(Value::as_str).ok_or_else(|| {
                ApiError::invalid_param(
                    &format!("{at}.name"),
                    "a function tool needs a string 'name'",
                )
            })?;
            let mut function = json!({"name": name});
            for key in ["description", "parameters"] {
                if let Some(v) = t.get(key).filter(|v| !v.is_null()) {
                    function[key] = v.clone();
                }
            }
            Ok(json!({"type": "function", "function": function}))
        })
        .collect()
}

/// `tool_choice`: "none", "auto", "required" or `{"type": "function", "name": …}`.
fn tool_choice(obj: &parse::Obj) -> Result<Value, ApiError> {
    match field(obj, "tool_choice") {
        None => Ok(json!("auto")),
        Some(Value::String(s)) if ["none", "auto", "required"].contains(&s.as_str()) => {
            Ok(json!(s))
        }
        Some(v @ Value::Object(o)) if o.get("type").and_then(Value::as_str) == Some("function") => {
            Ok(v.clone())
        }
        Some(_) => Err(ApiError::invalid_param(
            "tool_choice",
            "'tool_choice' must be \"none\", \"auto\", \"required\" or a function choice",
        )),
    }
}

/// POST /v1/responses
pub async fn responses(
    State(state): State<AppState>,
    Extension(log): Extension<RequestLog>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    respond(state, log, body)
        .await
        .unwrap_or_else(|e| e.into_response(Flavor::OpenAi))
}

async fn respond(
    state: AppState,
    log: RequestLog,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let obj = body_object(body)?;
    let backend = state.backend()?.clone();
    if field(&obj, "previous_response_id").is_some() {
        return Err(ApiError::invalid_param(
            "previous_response_id",
            "this server is stateless: previous_response_id is not supported; send the whole conversation as input",
        ));
    }
    let model = generate::check_model(backend.as_ref(), &obj, true)?;
    let instructions = parse::opt_str(&obj, "instructions")?;
    let input = field(&obj, "input").ok_or_else(|| ApiError::missing("input"))?;
    let messages = crate::chat::responses_input(instructions, input)?;
    let max_output_tokens = opt_u64(&obj, "max_output_tokens", 1, u32::MAX as u64)?;
    let stream = opt_bool(&obj, "stream")?.unwrap_or(false);
    let client_tools = parse::opt_array(&obj, "tools")?
        .cloned()
        .unwrap_or_default();
    let template_tools = chat_tools(&client_tools)?;
    let choice = tool_choice(&obj)?;
    let forcing = crate::tool_choice::responses(Some(&choice))?;
    let with_tools = !template_tools.is_empty() && forcing.allows_calls();
    let forced = crate::tool_choice::forced_call(&template_tools, &forcing)?;
    let rendered = backend
        .render_chat(&ChatPrompt {
            messages,
            tools: (!template_tools.is_empty()).then(|| Value::Array(template_tools.clone())),
        })
        .map_err(|e| ApiError::bad_request(format!("could not apply the chat template: {e}")))?;
    let prompt = backend.tokenize(&rendered, true, true);
    generate::check_prompt(backend.as_ref(), &prompt, "input")?;
    let room = generate::room(backend.as_ref(), prompt.len());
    let format_obj = match parse::opt_object(&obj, "text")? {
        Some(t) => parse::opt_object(t, "format")?,
        None => None,
    };
    let format = generate::output_format(format_obj, "text.format")?;
    let format_echo =
        format_obj.map_or_else(|| json!({"type": "text"}), |f| Value::Object(f.clone()));
    let opts = GenOptions {
        sampling: SamplingParams {
            format: forced.unwrap_or(format),
            ..generate::sampling(&obj, 2.0)?
        },
        max_tokens: max_output_tokens.map_or(room, |m| (m as usize).min(room)),
        stop: Vec::new(),
        logprobs: None,
        prompt_logprobs: false,
    };
    let rx = generate::submit_n(backend.as_ref(), &prompt, &opts, 1)?
        .pop()
        .ok_or_else(|| ApiError::internal("no generation was queued"))?;
    log.start_generation();
    let shape = Shape {
        id: generate::new_id("resp_", log.id()),
        msg_id: generate::new_id("msg_", log.id()),
        created: generate::unix_now(),
        model,
        instructions: instructions.map(str::to_string),
        max_output_tokens,
        temperature: opts.sampling.temperature,
        top_p: opts.sampling.top_p,
        tools: Value::Array(client_tools),
        tool_choice: choice,
        with_tools,
        format: format_echo,
    };
    if stream {
        return Ok(crate::openai::sse(&state, response_events(log, rx, shape)));
    }
    let f = generate::collect(rx, &log).await?;
    log.finish();
    Ok(Json(finished_object(&shape, &f)).into_response())
}

fn finished_object(shape: &Shape, f: &Finished) -> Value {
    let parsed = shape
        .with_tools
        .then(|| tools::parse_tool_calls(&f.text))
        .flatten();
    match &parsed {
        Some(p) => final_object(shape, f, p.content.as_deref(), &p.calls),
        None => final_object(shape, f, Some(&f.text), &[]),
    }
}

/// `incomplete` when the output was cut by `max_output_tokens`, else `completed`: the
/// response's status and its message item's.
fn status(f: &Finished) -> &'static str {
    if f.finish == Some(FinishReason::Length) {
        "incomplete"
    } else {
        "completed"
    }
}

fn final_object(shape: &Shape, f: &Finished, text: Option<&str>, calls: &[Value]) -> Value {
    let status = status(f);
    let output = shape.output(status, text, calls);
    shape.object(status, output, Some(f.usage), status == "incomplete")
}

fn response_events(
    log: RequestLog,
    mut rx: UnboundedReceiver<GenEvent>,
    shape: Shape,
) -> impl Stream<Item = Event> + Send + 'static {
    async_stream::stream! {
        let mut seq = 0u64;
        let mut ev = |kind: &str, mut body: Value| {
            body["type"] = json!(kind);
            body["sequence_number"] = json!(seq);
            seq += 1;
            Event::default().event(kind).data(body.to_string())
        };
        let msg_opened = |ev: &mut dyn FnMut(&str, Value) -> Event| [
            ev("response.output_item.added", json!({"output_index": 0, "item": shape.item("in_progress", vec![])})),
            ev("response.content_part.added", json!({"item_id": shape.msg_id, "output_index": 0,
                "content_index": 0, "part": Shape::part("")})),
        ];
        let pending = shape.object("in_progress", vec![], None, false);
        yield ev("response.created", json!({"response": pending}));
        yield ev("response.in_progress", json!({"response": pending}));
        // With tools the message item opens only once text is shown: a reply that is only
        // tool calls has no message item.
        let mut opened = !shape.with_tools;
        if opened {
            for e in msg_opened(&mut ev) {
                yield e;
            }
        }
        let mut splitter = tools::StreamSplitter::new(shape.with_tools);
        let mut shown = String::new();
        let mut state = Finished::default();
        while let Some(event) = rx.recv().await {
            match state.apply(event, &log) {
                Err(e) => {
                    yield ev("error", json!({"code": "server_error", "message": e.message, "param": null}));
                    return;
                }
                Ok((text, last)) => {
                    let text = splitter.push(&text, last);
                    if !text.is_empty() {
                        if !opened {
                            opened = true;
                            for e in msg_opened(&mut ev) {
                                yield e;
                            }
                        }
                        shown.push_str(&text);
                        yield ev("response.output_text.delta", json!({"item_id": shape.msg_id, "output_index": 0,
                            "content_index": 0, "delta": text, "logprobs": []}));
                    }
                    if last {
                        let calls = splitter.calls().unwrap_or_default();
                        if !opened && calls.is_empty() {
                            opened = true;
                            for e in msg_opened(&mut ev) {
                                yield e;
                            }
                        }
                        if opened {
                            yield ev("response.output_text.done", json!({"item_id": shape.msg_id, "output_index": 0,
                                "content_index": 0, "text": shown, "logprobs": []}));
                            yield ev("response.content_part.done", json!({"item_id": shape.msg_id, "output_index": 0,
                                "content_index": 0, "part": Shape::part(&shown)}));
                            yield ev("response.output_item.done", json!({"output_index": 0,
                                "item": shape.item(status(&state), vec![Shape::part(&shown)])}));
                        }
                        let first = usize::from(opened);
                        for (k, call) in calls.iter().enumerate() {
                            let index = first + k;
                            let item_id = shape.call_item(k, call, "in_progress", false)["id"].clone();
                            let args = call["function"]["arguments"].as_str().unwrap_or("{}");
                            yield ev("response.output_item.added", json!({"output_index": index,
                                "item": shape.call_item(k, call, "in_progress", false)}));
                            yield ev("response.function_call_arguments.delta", json!({"item_id": item_id,
                                "output_index": index, "delta": args}));
                            yield ev("response.function_call_arguments.done", json!({"item_id": item_id,
                                "output_index": index, "arguments": args}));
                            yield ev("response.output_item.done", json!({"output_index": index,
                                "item": shape.call_item(k, call, "completed", true)}));
                        }
                        let text = opened.then_some(shown.as_str());
                        let done = final_object(&shape, &state, text, &calls);
                        let kind = if done["status"] == "completed" { "response.completed" } else { "response.incomplete" };
                        log.finish();
                        yield ev(kind, json!({"response": done}));
                        return;
                    }
                }
            }
        }
        yield ev("error", json!({"code": "server_error", "message": "the engine dropped a stream", "param": null}));
    }
}
