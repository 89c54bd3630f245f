//! HTTP-layer tests over the fake engine: every endpoint, SSE framing and event order,
//! every bad-input class (each followed by a valid request on the same router), auth, body
//! limit, queue bound, cancellation and keep-alives.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::http::{Request, StatusCode};
use http_body_util::BodyExt;
use serde_json::{Value, json};
use tower::ServiceExt;

use crate::testing::Fake;
use crate::{AppState, Backend, ServerConfig, router};

pub(crate) const REPLY: &str = "Hello from fake.";

pub(crate) fn app_with(fake: Fake, config: ServerConfig) -> (Router, Arc<Fake>) {
    let state = AppState::new(config);
    let fake = Arc::new(fake);
    assert!(state.set_backend(fake.clone()));
    (router(state), fake)
}

pub(crate) fn app() -> Router {
    app_with(Fake::new(REPLY), ServerConfig::default()).0
}

pub(crate) async fn send(
    app: &Router,
    method: &str,
    path: &str,
    body: &str,
    headers: &[(&str, &str)],
) -> (StatusCode, String) {
    let mut req = Request::builder()
        .method(method)
        .uri(path)
        .header("content-type", "application/json");
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let resp = app
        .clone()
        .oneshot(req.body(Body::from(body.to_string())).unwrap())
        .await
        .unwrap();
    let status = resp.status();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8(bytes.to_vec()).unwrap())
}

pub(crate) async fn post(app: &Router, path: &str, body: Value) -> (StatusCode, Value) {
    let (status, text) = send(app, "POST", path, &body.to_string(), &[]).await;
    (
        status,
        serde_json::from_str(&text).unwrap_or_else(|_| panic!("not JSON: {text}")),
    )
}

async fn get(app: &Router, path: &str) -> (StatusCode, String) {
    send(app, "GET", path, "", &[]).await
}

pub(crate) fn chat_body(extra: Value) -> Value {
    let mut b = json!({"model": "fake-model", "messages": [{"role": "user", "content": "hi"}], "temperature": 0});
    for (k, v) in extra.as_object().unwrap() {
        b[k] = v.clone();
    }
    b
}

/// Split an SSE body into events, checking the exact framing: every event ends with a blank
/// line and every line is `event: …`, `data: …` or a comment.
pub(crate) fn sse_events(body: &str) -> Vec<(Option<String>, String)> {
    assert!(
        body.ends_with("\n\n"),
        "SSE body must end with a blank line: {body:?}"
    );
    body.trim_end_matches('\n')
        .split("\n\n")
        .filter(|block| !block.starts_with(':'))
        .map(|block| {
            let mut name = None;
            let mut data = None;
            for line in block.lines() {
                if let Some(n) = line.strip_prefix("event: ") {
                    name = Some(n.to_string());
                } else if let Some(d) = line.strip_prefix("data: ") {
                    data = Some(d.to_string());
                } else {
                    panic!("unexpected SSE line {line:?}");
                }
            }
            (name, data.expect("event without data"))
        })
        .collect()
}

#[tokio::test]
async fn health_is_503_while_loading_then_200() {
    let state = AppState::new(ServerConfig::default());
    let app = router(state.clone());
    let (status, body) = get(&app, "/health").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(body.contains("loading"));
    let (status, _) = post(&app, "/v1/chat/completions", chat_body(json!({}))).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    state.set_backend(Arc::new(Fake::new(REPLY)));
    let (status, body) = get(&app, "/health").await;
    assert_eq!(
        (status, body.as_str()),
        (StatusCode::OK, r#"{"status":"ok"}"#)
    );
}

#[tokio::test]
async fn models_list_and_lookup() {
    let app = app();
    let (status, body) = get(&app, "/v1/models").await;
    assert_eq!(status, StatusCode::OK);
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["data"][0]["id"], "fake-model");
    assert_eq!(get(&app, "/v1/models/fake-model").await.0, StatusCode::OK);
    assert_eq!(get(&app, "/v1/models/fake.gguf").await.0, StatusCode::OK);
    let (status, body) = get(&app, "/v1/models/gpt-9").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert!(body.contains("model_not_found"));
    assert_eq!(get(&app, "/nope").await.0, StatusCode::NOT_FOUND);
    let (status, body) = get(&app, "/v1/chat/completions").await;
    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
    assert!(body.contains("invalid_request_error"), "{body}");
}

#[tokio::test]
async fn health_reports_a_dead_engine() {
    let (app, fake) = app_with(Fake::new(REPLY), ServerConfig::default());
    assert_eq!(get(&app, "/health").await.0, StatusCode::OK);
    fake.dead.store(true, std::sync::atomic::Ordering::SeqCst);
    let (status, body) = get(&app, "/health").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(body.contains("\"status\":\"error\""), "{body}");
}

#[tokio::test]
async fn chat_completion_plain() {
    let app = app();
    let (status, v) = post(
        &app,
        "/v1/chat/completions",
        chat_body(json!({"unknown_field": 1})),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["choices"][0]["message"]["content"], REPLY);
    assert_eq!(v["choices"][0]["message"]["role"], "assistant");
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    // The fake renders "user: hi\nassistant: " = 21 bytes = 21 tokens.
    assert_eq!(v["usage"]["prompt_tokens"], 20);
    assert_eq!(v["usage"]["completion_tokens"], REPLY.len());
    assert_eq!(v["usage"]["total_tokens"], 20 + REPLY.len());
    assert_eq!(v["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    assert!(v["id"].as_str().unwrap().starts_with("chatcmpl-"));
}

#[tokio::test]
async fn chat_limits_stops_n_and_logprobs() {
    let app = app();
    let (_, v) = post(
        &app,
        "/v1/chat/completions",
        chat_body(json!({"max_tokens": 3})),
    )
    .await;
    assert_eq!(v["choices"][0]["message"]["content"], "Hel");
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    let (_, v) = post(
        &app,
        "/v1/chat/completions",
        chat_body(json!({"max_completion_tokens": 2})),
    )
    .await;
    assert_eq!(v["choices"][0]["message"]["content"], "He");
    let (_, v) = post(
        &app,
        "/v1/chat/completions",
        chat_body(json!({"stop": ["from", "zzz"]})),
    )
    .await;
    assert_eq!(v["choices"][0]["message"]["content"], "Hello ");
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    let (_, v) = post(
        &app,
        "/v1/chat/completions",
        chat_body(json!({"stop": "o"})),
    )
    .await;
    assert_eq!(v["choices"][0]["message"]["content"], "Hell");
    let (_, v) = post(&app, "/v1/chat/completions", chat_body(json!({"n": 3}))).await;
    assert_eq!(v["choices"].as_array().unwrap().len(), 3);
    assert_eq!(v["choices"][2]["index"], 2);
    assert_eq!(v["usage"]["completion_tokens"], 3 * REPLY.len());
    let (_, v) = post(
        &app,
        "/v1/chat/completions",
        chat_body(json!({"logprobs": true, "top_logprobs": 2, "max_tokens": 2})),
    )
    .await;
    let content = &v["choices"][0]["logprobs"]["content"];
    assert_eq!(content.as_array().unwrap().len(), 2);
    assert_eq!(content[0]["token"], "H");
    assert_eq!(content[0]["top_logprobs"].as_array().unwrap().len(), 2);
}

#[tokio::test]
async fn chat_stream_framing_and_usage() {
    let app = app();
    let body = chat_body(json!({"stream": true, "stream_options": {"include_usage": true}}));
    let (status, text) = send(&app, "POST", "/v1/chat/completions", &body.to_string(), &[]).await;
    assert_eq!(status, StatusCode::OK);
    let events = sse_events(&text);
    assert_eq!(events.last().unwrap().1, "[DONE]");
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|(_, d)| serde_json::from_str(d).unwrap())
        .collect();
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let text: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(text, REPLY);
    let usage = chunks.last().unwrap();
    assert_eq!(usage["choices"], json!([]));
    assert_eq!(usage["usage"]["completion_tokens"], REPLY.len());
    let finish = &chunks[chunks.len() - 2];
    assert_eq!(finish["choices"][0]["finish_reason"], "stop");
    assert!(
        chunks
            .iter()
            .all(|c| c["object"] == "chat.completion.chunk")
    );
    // Without include_usage: no usage chunk and no usage key.
    let (_, text) = send(
        &app,
        "POST",
        "/v1/chat/completions",
        &chat_body(json!({"stream": true})).to_string(),
        &[],
    )
    .await;
    let events = sse_events(&text);
    let before_done: Value = serde_json::from_str(&events[events.len() - 2].1).unwrap();
    assert_eq!(before_done["choices"][0]["finish_reason"], "stop");
    assert!(before_done.get("usage").is_none());
}

#[tokio::test]
async fn completions_plain_echo_tokens_logprobs_stream() {
    let app = app();
    let (status, v) = post(
        &app,
        "/v1/completions",
        json!({"model": "fake-model", "prompt": "Say", "max_tokens": 5}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["object"], "text_completion");
    assert_eq!(v["choices"][0]["text"], "Hello");
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    assert_eq!(v["usage"]["prompt_tokens"], 3);
    let (_, v) = post(&app, "/v1/completions", json!({"model": "fake-model", "prompt": [84, 102], "max_tokens": 2, "echo": true, "logprobs": 1})).await;
    assert_eq!(v["choices"][0]["text"], "SeHe");
    // echo with logprobs covers the prompt tokens too (the first has no logprob).
    assert_eq!(
        v["choices"][0]["logprobs"]["tokens"],
        json!(["S", "e", "H", "e"])
    );
    assert_eq!(
        v["choices"][0]["logprobs"]["text_offset"],
        json!([0, 1, 2, 3])
    );
    let (_, v) = post(
        &app,
        "/v1/completions",
        json!({"model": "fake-model", "prompt": ["x"], "max_tokens": 0, "echo": true}),
    )
    .await;
    assert_eq!(v["choices"][0]["text"], "x");
    let body = json!({"model": "fake-model", "prompt": "x", "stream": true, "max_tokens": 4});
    let (_, text) = send(&app, "POST", "/v1/completions", &body.to_string(), &[]).await;
    let events = sse_events(&text);
    assert_eq!(events.last().unwrap().1, "[DONE]");
    let joined: String = events[..events.len() - 1]
        .iter()
        .map(|(_, d)| {
            serde_json::from_str::<Value>(d).unwrap()["choices"][0]["text"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    assert_eq!(joined, "Hell");
}

#[tokio::test]
async fn anthropic_messages_plain_and_stream() {
    let app = app();
    let body = json!({"model": "fake-model", "max_tokens": 64, "system": [{"type": "text", "text": "sys"}],
        "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}], "stop_sequences": ["fake"]});
    let (status, v) = post(&app, "/v1/messages", body.clone()).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["type"], "message");
    assert_eq!(
        v["content"][0],
        json!({"type": "text", "text": "Hello from "})
    );
    assert_eq!(v["stop_reason"], "stop_sequence");
    assert_eq!(v["stop_sequence"], "fake");
    let mut streaming = body.clone();
    streaming["stream"] = json!(true);
    streaming["max_tokens"] = json!(5);
    let (status, text) = send(&app, "POST", "/v1/messages", &streaming.to_string(), &[]).await;
    assert_eq!(status, StatusCode::OK);
    let events = sse_events(&text);
    let names: Vec<&str> = events.iter().map(|(n, _)| n.as_deref().unwrap()).collect();
    // Blocks open as the output shows what they hold (thinking, text or a tool call).
    let mut expected = vec!["message_start", "ping", "content_block_start"];
    expected.extend(std::iter::repeat_n("content_block_delta", 5));
    expected.extend(["content_block_stop", "message_delta", "message_stop"]);
    assert_eq!(names, expected);
    for (name, data) in &events {
        let v: Value = serde_json::from_str(data).unwrap();
        assert_eq!(v["type"], name.as_deref().unwrap());
    }
    let delta: Value = serde_json::from_str(&events[events.len() - 2].1).unwrap();
    assert_eq!(delta["delta"]["stop_reason"], "max_tokens");
    assert_eq!(delta["usage"]["output_tokens"], 5);
    let (status, v) = post(
        &app,
        "/v1/messages/count_tokens",
        json!({"model": "fake-model", "messages": [{"role": "user", "content": "hi"}]}),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(v["input_tokens"], 20);
}

#[tokio::test]
async fn responses_plain_and_stream() {
    let app = app();
    let (status, v) = post(
        &app,
        "/v1/responses",
        json!({"model": "fake-model", "input": "hi", "instructions": "be nice"}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["object"], "response");
    assert_eq!(v["status"], "completed");
    assert_eq!(v["output"][0]["content"][0]["text"], REPLY);
    let (_, v) = post(&app, "/v1/responses", json!({"model": "fake-model", "input": [{"role": "user", "content": "hi"}], "max_output_tokens": 2})).await;
    assert_eq!(v["status"], "incomplete");
    assert_eq!(v["incomplete_details"]["reason"], "max_output_tokens");
    // The cut message is itself incomplete, as the API marks it.
    assert_eq!(v["output"][0]["status"], "incomplete", "{v}");
    let body =
        json!({"model": "fake-model", "input": "hi", "stream": true, "max_output_tokens": 3});
    let (_, text) = send(&app, "POST", "/v1/responses", &body.to_string(), &[]).await;
    let events = sse_events(&text);
    let names: Vec<&str> = events.iter().map(|(n, _)| n.as_deref().unwrap()).collect();
    assert_eq!(
        names,
        [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.content_part.added",
            "response.output_text.delta",
            "response.output_text.delta",
            "response.output_text.delta",
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done",
            "response.incomplete"
        ]
    );
    for (k, (_, data)) in events.iter().enumerate() {
        assert_eq!(
            serde_json::from_str::<Value>(data).unwrap()["sequence_number"],
            k
        );
    }
    let data = |k: usize| serde_json::from_str::<Value>(&events[k].1).unwrap();
    assert_eq!(data(9)["item"]["status"], "incomplete");
    assert_eq!(data(10)["response"]["output"][0]["status"], "incomplete");
    let (status, v) = post(
        &app,
        "/v1/responses",
        json!({"model": "fake-model", "input": "x", "previous_response_id": "resp_1"}),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(v["error"]["param"], "previous_response_id");
}

#[tokio::test]
async fn tokenize_detokenize_round_trip() {
    let app = app();
    let (_, v) = post(&app, "/tokenize", json!({"content": "ab"})).await;
    assert_eq!(v["tokens"], json!([98, 99]));
    let (_, v) = post(&app, "/detokenize", json!({"tokens": [98, 99]})).await;
    assert_eq!(v["content"], "ab");
    let (status, v) = post(&app, "/detokenize", json!({"tokens": [98, 100000]})).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(v["error"]["param"], "tokens");
}

/// Every class of bad input answers 400 in the API's own shape, and a valid request on the
/// same router still works afterwards.
#[tokio::test]
async fn bad_input_is_400_and_server_stays_healthy() {
    let app = app();
    let valid = chat_body(json!({"max_tokens": 2}));
    let cases: Vec<(&str, String, Option<&str>)> = vec![
        ("/v1/chat/completions", "{not json".into(), None),
        ("/v1/chat/completions", "[1,2]".into(), None),
        ("/v1/chat/completions", r#"{"model":"fake-model","messages":[{"role":"user","content":"x"}],"temperature":NaN}"#.into(), None),
        ("/v1/chat/completions", r#"{"model":"fake-model","messages":[{"role":"user","content":"x"}],"temperature":Infinity}"#.into(), None),
        ("/v1/chat/completions", chat_body(json!({"max_tokens": 1e300})).to_string(), Some("max_tokens")),
        ("/v1/chat/completions", chat_body(json!({"max_tokens": 123456789012345678901234567890u128 as f64})).to_string(), Some("max_tokens")),
        ("/v1/chat/completions", chat_body(json!({"max_tokens": -1})).to_string(), Some("max_tokens")),
        ("/v1/chat/completions", chat_body(json!({"max_tokens": 2.5})).to_string(), Some("max_tokens")),
        ("/v1/chat/completions", chat_body(json!({"max_tokens": "2"})).to_string(), Some("max_tokens")),
        ("/v1/chat/completions", chat_body(json!({"n": 0})).to_string(), Some("n")),
        ("/v1/chat/completions", chat_body(json!({"temperature": "hot"})).to_string(), Some("temperature")),
        ("/v1/chat/completions", chat_body(json!({"temperature": 5})).to_string(), Some("temperature")),
        ("/v1/chat/completions", chat_body(json!({"stream": "yes"})).to_string(), Some("stream")),
        ("/v1/chat/completions", chat_body(json!({"stop": 3})).to_string(), Some("stop")),
        ("/v1/chat/completions", chat_body(json!({"messages": []})).to_string(), Some("messages")),
        ("/v1/chat/completions", chat_body(json!({"messages": "hi"})).to_string(), Some("messages")),
        ("/v1/chat/completions", json!({"model": "fake-model"}).to_string(), Some("messages")),
        ("/v1/chat/completions", chat_body(json!({"messages": [{"role": "user", "content": 5}]})).to_string(), Some("messages[0].content")),
        ("/v1/chat/completions", chat_body(json!({"top_logprobs": 3})).to_string(), Some("top_logprobs")),
        ("/v1/completions", json!({"model": "fake-model"}).to_string(), Some("prompt")),
        ("/v1/completions", json!({"model": "fake-model", "prompt": [1, -4]}).to_string(), Some("prompt")),
        ("/v1/completions", json!({"model": "fake-model", "prompt": ["a", 5]}).to_string(), Some("prompt")),
        ("/v1/completions", json!({"model": "fake-model", "prompt": []}).to_string(), Some("prompt")),
        ("/v1/completions", json!({"model": "fake-model", "prompt": ""}).to_string(), Some("prompt")),
        ("/v1/responses", json!({"model": "fake-model"}).to_string(), Some("input")),
        ("/v1/responses", json!({"model": "fake-model", "input": 7}).to_string(), Some("input")),
        ("/tokenize", json!({"content": 7}).to_string(), Some("content")),
    ];
    for (path, body, param) in cases {
        let (status, text) = send(&app, "POST", path, &body, &[]).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{path} {body} -> {text}");
        let v: Value = serde_json::from_str(&text).unwrap();
        assert!(
            v["error"]["message"]
                .as_str()
                .is_some_and(|m| !m.is_empty()),
            "{text}"
        );
        assert_eq!(v["error"]["type"], "invalid_request_error", "{text}");
        if let Some(p) = param {
            assert_eq!(v["error"]["param"], p, "{body} -> {text}");
        }
        let (status, v) = post(&app, "/v1/chat/completions", valid.clone()).await;
        assert_eq!(status, StatusCode::OK, "after {body}: {v}");
    }
    let anthropic_cases = [
        json!({"model": "fake-model", "messages": [{"role": "user", "content": "x"}]}),
        json!({"model": "fake-model", "max_tokens": 5, "messages": []}),
        json!({"model": "fake-model", "max_tokens": 5, "messages": [{"role": "system", "content": "x"}]}),
        json!({"model": "fake-model", "max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "image"}]}]}),
        json!({"model": "fake-model", "max_tokens": 1e30, "messages": [{"role": "user", "content": "x"}]}),
    ];
    for body in anthropic_cases {
        let (status, v) = post(&app, "/v1/messages", body.clone()).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
        assert_eq!(v["type"], "error");
        assert_eq!(v["error"]["type"], "invalid_request_error");
    }
    assert_eq!(get(&app, "/health").await.0, StatusCode::OK);
}

#[tokio::test]
async fn prompt_longer_than_context_names_both_numbers() {
    let app = app();
    let long = "x".repeat(300);
    let (status, v) = post(
        &app,
        "/v1/chat/completions",
        chat_body(json!({"messages": [{"role": "user", "content": long}]})),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(v["error"]["code"], "context_length_exceeded");
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(msg.contains("256") && msg.contains("318"), "{msg}");
    let (status, v) = post(&app, "/v1/messages", json!({"model": "fake-model", "max_tokens": 4, "messages": [{"role": "user", "content": "x".repeat(300)}]})).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(v["type"], "error");
    // A prompt that fits but leaves little room ends with "length", not an error.
    let fits = "x".repeat(230);
    let (status, v) = post(
        &app,
        "/v1/chat/completions",
        chat_body(json!({"messages": [{"role": "user", "content": fits}]})),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    assert_eq!(v["usage"]["completion_tokens"], 256 - 248);
}

#[tokio::test]
async fn api_key_body_limit_and_shapes() {
    let config = ServerConfig {
        api_key: Some("sekret".into()),
        max_body_bytes: 2048,
        ..ServerConfig::default()
    };
    let (app, _) = app_with(Fake::new(REPLY), config);
    let body = chat_body(json!({})).to_string();
    let (status, text) = send(&app, "POST", "/v1/chat/completions", &body, &[]).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert!(text.contains("authentication_error"));
    let (status, _) = send(
        &app,
        "POST",
        "/v1/chat/completions",
        &body,
        &[("authorization", "Bearer wrong")],
    )
    .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let (status, _) = send(
        &app,
        "POST",
        "/v1/chat/completions",
        &body,
        &[("authorization", "Bearer sekret")],
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let msg = json!({"model": "fake-model", "max_tokens": 3, "messages": [{"role": "user", "content": "x"}]}).to_string();
    let (status, text) = send(&app, "POST", "/v1/messages", &msg, &[]).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_eq!(
        serde_json::from_str::<Value>(&text).unwrap()["type"],
        "error"
    );
    let (status, _) = send(
        &app,
        "POST",
        "/v1/messages",
        &msg,
        &[("x-api-key", "sekret")],
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(get(&app, "/health").await.0, StatusCode::OK);
    let big = chat_body(json!({"pad": "y".repeat(4096)})).to_string();
    let (status, text) = send(
        &app,
        "POST",
        "/v1/chat/completions",
        &big,
        &[("authorization", "Bearer sekret")],
    )
    .await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE, "{text}");
    assert!(text.contains("\"error\""));
    let (status, text) = send(
        &app,
        "POST",
        "/v1/messages",
        &big,
        &[("x-api-key", "sekret")],
    )
    .await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    assert!(text.contains("request_too_large"));
    let (status, _) = send(
        &app,
        "POST",
        "/v1/chat/completions",
        &body,
        &[("authorization", "Bearer sekret")],
    )
    .await;
    assert_eq!(status, StatusCode::OK);
}

#[tokio::test]
async fn full_queue_answers_429() {
    let (app, fake) = app_with(
        Fake::with(REPLY, 1, 0, Duration::from_millis(200)),
        ServerConfig::default(),
    );
    let body = chat_body(json!({"stream": true})).to_string();
    let req = Request::post("/v1/chat/completions")
        .body(Body::from(body))
        .unwrap();
    let held = app.clone().oneshot(req).await.unwrap();
    assert_eq!(held.status(), StatusCode::OK);
    let (status, v) = post(&app, "/v1/chat/completions", chat_body(json!({}))).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(v["error"]["type"], "rate_limit_error");
    drop(held);
    for _ in 0..100 {
        if fake.stats().slots_active == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(fake.stats().slots_active, 0);
}

/// More choices than slots and queue together can never be queued: a 400 naming `n`, not
/// a 429 that clients would retry; as many as fit are served.
#[tokio::test]
async fn more_choices_than_the_server_holds_is_a_bad_request() {
    let (app, _) = app_with(
        Fake::with(REPLY, 1, 2, Duration::from_millis(1)),
        ServerConfig::default(),
    );
    let (status, v) = post(&app, "/v1/chat/completions", chat_body(json!({"n": 4}))).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{v}");
    assert_eq!(v["error"]["param"], "n");
    let message = v["error"]["message"].as_str().unwrap();
    assert!(message.contains("at most 3"), "{message}");
    let (status, v) = post(&app, "/v1/chat/completions", chat_body(json!({"n": 3}))).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["choices"].as_array().unwrap().len(), 3);
}

/// A client that goes away mid-stream frees its slot, is counted as cancelled, and the next
/// request is served.
#[tokio::test]
async fn dropped_stream_frees_the_slot() {
    let reply = "y".repeat(200);
    let (app, fake) = app_with(
        Fake::with(&reply, 1, 4, Duration::from_millis(10)),
        ServerConfig::default(),
    );
    let body = chat_body(json!({"stream": true})).to_string();
    let resp = app
        .clone()
        .oneshot(
            Request::post("/v1/chat/completions")
                .body(Body::from(body))
                .unwrap(),
        )
        .await
        .unwrap();
    let mut stream = resp.into_body().into_data_stream();
    use tokio_stream::StreamExt;
    let first = stream.next().await.unwrap().unwrap();
    assert!(first.starts_with(b"data: "));
    let second = stream.next().await.unwrap().unwrap();
    assert!(second.starts_with(b"data: "));
    assert_eq!(fake.stats().slots_active, 1);
    drop(stream);
    for _ in 0..100 {
        if fake.stats().slots_active == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        fake.stats().slots_active,
        0,
        "slot still busy after the client left"
    );
    let (_, metrics) = get(&app, "/metrics").await;
    assert!(
        metrics.contains("ferrite_cancelled_requests_total 1"),
        "{metrics}"
    );
    assert!(metrics.contains("ferrite_slots_active 0"));
    let (status, v) = post(
        &app,
        "/v1/chat/completions",
        chat_body(json!({"max_tokens": 3})),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(v["choices"][0]["message"]["content"], "yyy");
}

#[tokio::test]
async fn keepalive_comments_during_slow_prefill() {
    let mut fake = Fake::new("ok");
    fake.start_delay = Duration::from_millis(300);
    let config = ServerConfig {
        keepalive: Duration::from_millis(50),
        ..ServerConfig::default()
    };
    let (app, _) = app_with(fake, config);
    let (status, text) = send(
        &app,
        "POST",
        "/v1/messages",
        &json!({"model": "fake-model", "max_tokens": 4, "stream": true,
        "messages": [{"role": "user", "content": "x"}]})
        .to_string(),
        &[],
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        text.starts_with(':'),
        "expected a keep-alive comment first: {text:?}"
    );
    let events = sse_events(&text);
    assert_eq!(events[0].0.as_deref(), Some("message_start"));
}

#[tokio::test]
async fn metrics_count_requests_and_tokens() {
    let app = app();
    post(&app, "/v1/chat/completions", chat_body(json!({}))).await;
    post(&app, "/v1/chat/completions", chat_body(json!({"n": 0}))).await;
    let (status, text) = get(&app, "/metrics").await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        text.contains("ferrite_requests_total{endpoint=\"/v1/chat/completions\",status=\"200\"} 1"),
        "{text}"
    );
    assert!(
        text.contains("ferrite_requests_total{endpoint=\"/v1/chat/completions\",status=\"400\"} 1"),
        "{text}"
    );
    assert!(
        text.contains(&format!("ferrite_generated_tokens_total {}", REPLY.len())),
        "{text}"
    );
    assert!(text.contains("ferrite_slots_total 2"));
    assert!(text.contains("# TYPE ferrite_queue_depth gauge"));
}

#[tokio::test]
async fn tool_calls_are_parsed_when_tools_are_given() {
    let reply = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
    let (app, _) = app_with(Fake::new(reply), ServerConfig::default());
    let tools = json!([{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]);
    let (_, v) = post(
        &app,
        "/v1/chat/completions",
        chat_body(json!({"tools": tools})),
    )
    .await;
    assert_eq!(v["choices"][0]["finish_reason"], "tool_calls");
    let call = &v["choices"][0]["message"]["tool_calls"][0];
    assert_eq!(call["function"]["name"], "get_weather");
    // The arguments as the model wrote them: the stream's deltas add up to this.
    assert_eq!(call["function"]["arguments"], "{\"city\": \"Paris\"}");
    let (_, text) = send(
        &app,
        "POST",
        "/v1/chat/completions",
        &chat_body(json!({"tools": tools, "stream": true})).to_string(),
        &[],
    )
    .await;
    assert!(text.contains("\"tool_calls\":[{"), "{text}");
    assert!(!text.contains("<tool_call>"));
    let (_, v) = post(
        &app,
        "/v1/messages",
        json!({"model": "fake-model", "max_tokens": 100,
        "tools": [{"name": "get_weather", "input_schema": {"type": "object"}}],
        "messages": [{"role": "user", "content": "weather?"}]}),
    )
    .await;
    assert_eq!(v["stop_reason"], "tool_use");
    assert_eq!(v["content"][0]["input"]["city"], "Paris");
    // Without tools the text is returned as is.
    let (_, v) = post(&app, "/v1/chat/completions", chat_body(json!({}))).await;
    assert_eq!(v["choices"][0]["message"]["content"], reply);
}
