//! OpenAI Responses API, stateless: `/v1/responses` with string or item input, plain and
//! streaming (`response.created` … `response.completed`). Nothing is stored, so
//! `previous_response_id` is refused with a 400.
//!
//! Function tools: `tools` (`{"type": "function", "name", "description", "parameters"}`)
//! are rendered through the chat template like chat-completions tools; tool calls the model
//! writes (in its template's syntax) come back as `function_call` output items, streamed
//! as generated, and the client answers them with `function_call_output` input items on
//! the next request. Reasoning comes back as a `reasoning` item (streamed as
//! `response.reasoning_text.delta`) and is counted in `output_tokens_details`.

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
use crate::parse::{self, body_object, field, opt_bool, opt_u64};
use crate::{AppState, tools};
use ferrite_engine::{FinishReason, GenEvent, SamplingParams, Usage};

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
    /// The output format object, echoed as `text.format`.
    format: Value,
}

impl Shape {
    fn object(
        &self,
        status: &str,
        output: Vec<Value>,
        usage: Option<(Usage, usize)>,
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
            "usage": usage.map_or(Value::Null, |(u, reasoning)| json!({
                "input_tokens": u.prompt_tokens,
                "input_tokens_details": {"cached_tokens": u.cached_tokens},
                "output_tokens": u.completion_tokens,
                "output_tokens_details": {"reasoning_tokens": reasoning},
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

    /// Output item of tool call `k`.
    fn call_item(&self, k: usize, name: &str, arguments: &str, status: &str) -> Value {
        let base = self.id.trim_start_matches("resp_");
        json!({"type": "function_call", "id": format!("fc_{base}_{k}"),
            "call_id": format!("call_{base}_{k}"), "name": name,
            "arguments": arguments, "status": status})
    }

    fn reasoning_id(&self) -> String {
        format!("rs_{}", self.id.trim_start_matches("resp_"))
    }

    /// The reasoning output item.
    fn reasoning_item(&self, text: &str) -> Value {
        let content = if text.is_empty() {
            json!([])
        } else {
            json!([{"type": "reasoning_text", "text": text}])
        };
        json!({"type": "reasoning", "id": self.reasoning_id(), "summary": [], "content": content})
    }

    /// Finished output items of a parsed output: reasoning, the message (when there is
    /// text or no call), with the response's `status`, then one `function_call` item per
    /// finished call (unfinished calls are no calls).
    fn output(&self, status: &str, out: &Collected) -> Vec<Value> {
        let mut items = Vec::new();
        if !out.reasoning.is_empty() {
            items.push(self.reasoning_item(&out.reasoning));
        }
        let calls: Vec<Value> = out
            .calls
            .iter()
            .enumerate()
            .filter(|(_, c)| c.complete)
            .map(|(k, c)| self.call_item(k, &c.name, &c.arguments, "completed"))
            .collect();
        if calls.is_empty() || !out.content.trim().is_empty() {
            items.push(self.item(status, vec![Shape::part(&out.content)]));
        }
        items.extend(calls);
        items
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
    let model = generate::check_model(backend.as_ref(), &obj)?;
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
    let rendered = tools::render(
        backend.as_ref(),
        tools::Chat {
            messages,
            tools: (!template_tools.is_empty()).then(|| Value::Array(template_tools.clone())),
            kwargs: kwargs(&obj)?,
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
    generate::check_prompt(backend.as_ref(), &prompt, "input")?;
    let room = generate::room(backend.as_ref(), prompt.len());
    let format_obj = match parse::opt_object(&obj, "text")? {
        Some(t) => parse::opt_object(t, "format")?,
        None => None,
    };
    let format = match &forced {
        Some(call) => call.format(&mut output, &|t| backend.is_control_token(t))?,
        None => crate::structured::after_reasoning(
            crate::structured::requested(&obj, Some(("text.format", format_obj)))?,
            &output,
        )?,
    };
    let format_echo =
        format_obj.map_or_else(|| json!({"type": "text"}), |f| Value::Object(f.clone()));
    let reasoning_budget = tools::reasoning_budget(
        backend.as_ref(),
        generate::thinking_token_budget(&obj)?,
        state.config().reasoning_budget,
        &output,
        &format,
    )?;
    let opts = GenOptions {
        sampling: SamplingParams {
            format,
            ..generate::sampling(&obj, 2.0)?
        },
        max_tokens: max_output_tokens.map_or(room, |m| (m as usize).min(room)),
        stop: Vec::new(),
        logprobs: None,
        prompt_logprobs: false,
        reasoning_budget,
        speculative: crate::speculative::speculative(&obj, backend.speculation())?,
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
        format: format_echo,
    };
    if stream {
        return Ok(crate::openai::sse(
            &state,
            response_events(log, rx, shape, output),
        ));
    }
    let f = generate::collect(rx, &log, Some(output)).await?;
    log.finish();
    let status = status(&f);
    let out = shape.output(status, &f.out);
    Ok(Json(shape.object(
        status,
        out,
        Some((f.usage, f.reasoning_tokens)),
        status == "incomplete",
    ))
    .into_response())
}

/// Template variables: `chat_template_kwargs`, and the Responses `reasoning.effort`.
fn kwargs(obj: &parse::Obj) -> Result<serde_json::Map<String, Value>, ApiError> {
    let mut kwargs = tools::template_kwargs(obj)?;
    if let Some(reasoning) = parse::opt_object(obj, "reasoning")?
        && let Some(effort) = parse::opt_str(reasoning, "effort")?
    {
        if !["low", "medium", "high"].contains(&effort) {
            return Err(ApiError::invalid_param(
                "reasoning.effort",
                format!("'reasoning.effort' must be 'low', 'medium' or 'high', got '{effort}'"),
            ));
        }
        kwargs.insert("reasoning_effort".into(), json!(effort));
    }
    Ok(kwargs)
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

/// The open output item of a stream.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Open {
    Reasoning,
    Message,
    Call(usize),
}

/// Output items opened as parsed events arrive; a change of kind finishes the open item.
/// Blank text is held while tools may be called: a reply that is only calls has no
/// message item.
struct Items {
    shape: Shape,
    open: Option<Open>,
    /// Finished items, in order (the final response's output).
    done: Vec<Value>,
    /// Text of the open item (reasoning, message text or arguments).
    text: String,
    /// Name of the open call.
    name: String,
    held: String,
    called: bool,
}

type Out = Vec<(&'static str, Value)>;

impl Items {
    fn index(&self) -> usize {
        self.done.len()
    }

    /// Finish the open item; `status` is a message's or a call's.
    fn close(&mut self, status: &str, out: &mut Out) {
        let Some(open) = self.open.take() else {
            return;
        };
        let i = self.index();
        let text = std::mem::take(&mut self.text);
        let item = match open {
            Open::Reasoning => {
                let id = self.shape.reasoning_id();
                out.push((
                    "response.reasoning_text.done",
                    json!({"item_id": id,
                    "output_index": i, "content_index": 0, "text": text}),
                ));
                self.shape.reasoning_item(&text)
            }
            Open::Message => {
                let id = self.shape.msg_id.clone();
                out.push((
                    "response.output_text.done",
                    json!({"item_id": id, "output_index": i,
                    "content_index": 0, "text": text, "logprobs": []}),
                ));
                out.push((
                    "response.content_part.done",
                    json!({"item_id": id, "output_index": i,
                    "content_index": 0, "part": Shape::part(&text)}),
                ));
                self.shape.item(status, vec![Shape::part(&text)])
            }
            Open::Call(k) => {
                let item = self.shape.call_item(k, &self.name, &text, status);
                if status == "completed" {
                    out.push((
                        "response.function_call_arguments.done",
                        json!({"item_id": item["id"],
                        "output_index": i, "arguments": text}),
                    ));
                }
                item
            }
        };
        out.push((
            "response.output_item.done",
            json!({"output_index": i, "item": item}),
        ));
        // An unfinished call is announced but never part of the answer.
        if !matches!(open, Open::Call(_)) || status == "completed" {
            self.done.push(item);
        }
    }

    fn switch(&mut self, to: Open, out: &mut Out) {
        if self.open == Some(to) {
            return;
        }
        self.close("completed", out);
        let i = self.index();
        match to {
            Open::Reasoning => {
                let mut item = self.shape.reasoning_item("");
                item["status"] = json!("in_progress");
                out.push((
                    "response.output_item.added",
                    json!({"output_index": i, "item": item}),
                ));
            }
            Open::Message => {
                out.push((
                    "response.output_item.added",
                    json!({"output_index": i,
                    "item": self.shape.item("in_progress", vec![])}),
                ));
                out.push((
                    "response.content_part.added",
                    json!({"item_id": self.shape.msg_id,
                    "output_index": i, "content_index": 0, "part": Shape::part("")}),
                ));
            }
            Open::Call(k) => {
                out.push((
                    "response.output_item.added",
                    json!({"output_index": i,
                    "item": self.shape.call_item(k, &self.name, "", "in_progress")}),
                ));
            }
        }
        self.open = Some(to);
    }

    fn text_delta(&mut self, text: &str, out: &mut Out) {
        let delta = if self.open == Some(Open::Message) {
            text.to_string()
        } else {
            self.held.push_str(text);
            if self.held.trim().is_empty() {
                return;
            }
            self.switch(Open::Message, out);
            std::mem::take(&mut self.held)
        };
        self.text.push_str(&delta);
        out.push((
            "response.output_text.delta",
            json!({"item_id": self.shape.msg_id,
            "output_index": self.index(), "content_index": 0, "delta": delta, "logprobs": []}),
        ));
    }

    fn event(&mut self, ev: ParsedEvent, out: &mut Out) {
        match ev {
            ParsedEvent::Reasoning(t) => {
                self.switch(Open::Reasoning, out);
                self.text.push_str(&t);
                out.push((
                    "response.reasoning_text.delta",
                    json!({"item_id": self.shape.reasoning_id(),
                    "output_index": self.index(), "content_index": 0, "delta": t}),
                ));
            }
            ParsedEvent::Content(t) => self.text_delta(&t, out),
            ParsedEvent::ToolStart { index, name } => {
                self.close("completed", out);
                self.name = name;
                self.switch(Open::Call(index), out);
            }
            ParsedEvent::ToolArgs { index, delta } => {
                self.text.push_str(&delta);
                let id = self.shape.call_item(index, "", "", "")["id"].clone();
                out.push((
                    "response.function_call_arguments.delta",
                    json!({"item_id": id,
                    "output_index": self.index(), "delta": delta}),
                ));
            }
            ParsedEvent::ToolEnd { .. } => {
                self.called = true;
                self.close("completed", out);
            }
        }
    }

    /// The output ended with `status`: finish the open item (a call still open is
    /// unfinished); without calls the answer keeps its message, blank or not.
    fn end(&mut self, status: &str, out: &mut Out) {
        if !self.called && (!self.held.is_empty() || self.done.is_empty() && self.open.is_none()) {
            self.switch(Open::Message, out);
            let held = std::mem::take(&mut self.held);
            if !held.is_empty() {
                self.text_delta(&held, out);
            }
        }
        let status = match self.open {
            Some(Open::Call(_)) => "incomplete",
            _ => status,
        };
        self.close(status, out);
    }
}

fn response_events(
    log: RequestLog,
    mut rx: UnboundedReceiver<GenEvent>,
    shape: Shape,
    output: OutputConfig,
) -> impl Stream<Item = Event> + Send + 'static {
    async_stream::stream! {
        let mut seq = 0u64;
        let mut ev = |kind: &str, mut body: Value| {
            body["type"] = json!(kind);
            body["sequence_number"] = json!(seq);
            seq += 1;
            Event::default().event(kind).data(body.to_string())
        };
        let pending = shape.object("in_progress", vec![], None, false);
        yield ev("response.created", json!({"response": pending}));
        yield ev("response.in_progress", json!({"response": pending}));
        let mut items = Items { shape: shape.clone(), open: None, done: Vec::new(), text: String::new(),
            name: String::new(), held: String::new(), called: false };
        let mut state = Finished::parsing(output);
        while let Some(event) = rx.recv().await {
            match state.apply(event, &log) {
                Err(e) => {
                    yield ev("error", json!({"code": "server_error", "message": e.message, "param": null}));
                    return;
                }
                Ok(step) => {
                    let mut out = Vec::new();
                    for e in step.events {
                        items.event(e, &mut out);
                    }
                    if step.last {
                        items.end(status(&state), &mut out);
                    }
                    for (kind, body) in out {
                        yield ev(kind, body);
                    }
                    if step.last {
                        let status = status(&state);
                        let done = shape.object(status, std::mem::take(&mut items.done),
                            Some((state.usage, state.reasoning_tokens)), status == "incomplete");
                        let kind = if status == "completed" { "response.completed" } else { "response.incomplete" };
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
