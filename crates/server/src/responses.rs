//! OpenAI Responses API, stateless: `/v1/responses` with string or item input, plain and
//! streaming (`response.created` … `response.completed`). Nothing is stored, so
//! `previous_response_id` is refused with a 400.

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

use crate::AppState;
use crate::backend::{ChatPrompt, FinishReason, GenEvent, Usage};
use crate::error::{ApiError, Flavor};
use crate::generate::{self, Finished, GenOptions};
use crate::metrics::RequestLog;
use crate::parse::{self, body_object, field, opt_bool, opt_u64};

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
            "tool_choice": "auto", "tools": [], "text": {"format": {"type": "text"}},
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
    let rendered = backend
        .render_chat(&ChatPrompt {
            messages,
            tools: None,
        })
        .map_err(|e| ApiError::bad_request(format!("could not apply the chat template: {e}")))?;
    let prompt = backend.tokenize(&rendered, true, true);
    generate::check_prompt(backend.as_ref(), &prompt, "input")?;
    let room = generate::room(backend.as_ref(), prompt.len());
    let opts = GenOptions {
        sampling: generate::sampling(&obj, 2.0)?,
        max_tokens: max_output_tokens.map_or(room, |m| (m as usize).min(room)),
        stop: Vec::new(),
        logprobs: None,
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
    };
    if stream {
        return Ok(crate::openai::sse(&state, response_events(log, rx, shape)));
    }
    let f = generate::collect(rx, &log).await?;
    log.finish();
    Ok(Json(finished_object(&shape, &f)).into_response())
}

fn finished_object(shape: &Shape, f: &Finished) -> Value {
    let incomplete = f.finish == Some(FinishReason::Length);
    let status = if incomplete {
        "incomplete"
    } else {
        "completed"
    };
    let item = shape.item("completed", vec![Shape::part(&f.text)]);
    shape.object(status, vec![item], Some(f.usage), incomplete)
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
        let pending = shape.object("in_progress", vec![], None, false);
        yield ev("response.created", json!({"response": pending}));
        yield ev("response.in_progress", json!({"response": pending}));
        yield ev("response.output_item.added", json!({"output_index": 0, "item": shape.item("in_progress", vec![])}));
        yield ev("response.content_part.added", json!({"item_id": shape.msg_id, "output_index": 0,
            "content_index": 0, "part": Shape::part("")}));
        let mut state = Finished::default();
        while let Some(event) = rx.recv().await {
            match state.apply(event, &log) {
                Err(e) => {
                    yield ev("error", json!({"code": "server_error", "message": e.message, "param": null}));
                    return;
                }
                Ok((text, last)) => {
                    if !text.is_empty() {
                        yield ev("response.output_text.delta", json!({"item_id": shape.msg_id, "output_index": 0,
                            "content_index": 0, "delta": text, "logprobs": []}));
                    }
                    if last {
                        yield ev("response.output_text.done", json!({"item_id": shape.msg_id, "output_index": 0,
                            "content_index": 0, "text": state.text, "logprobs": []}));
                        yield ev("response.content_part.done", json!({"item_id": shape.msg_id, "output_index": 0,
                            "content_index": 0, "part": Shape::part(&state.text)}));
                        yield ev("response.output_item.done", json!({"output_index": 0,
                            "item": shape.item("completed", vec![Shape::part(&state.text)])}));
                        let done = finished_object(&shape, &state);
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
