//! HTTP-layer tests of reasoning and streamed tool calls (issue 33) over the fake engine's
//! scripted replies: every case through all three APIs, plain and streamed, read back into
//! one shape (reasoning, answer text, finished calls) that must match the expectation
//! written from the reply. Also template kwargs, tools a template drops, and model names.

use axum::http::StatusCode;
use serde_json::{Value, json};

use crate::ServerConfig;
use crate::http_tests::{app_with, chat_body, post, send, sse_events};
use crate::testing::Fake;
use ferrite_engine::Backend;

/// What an answer said, whatever the API.
#[derive(Debug, Default, PartialEq)]
struct Said {
    reasoning: String,
    content: String,
    calls: Vec<(String, String)>,
}

fn said(reasoning: &str, content: &str, calls: &[(&str, &str)]) -> Said {
    Said {
        reasoning: reasoning.into(),
        content: content.into(),
        calls: calls
            .iter()
            .map(|(n, a)| (n.to_string(), a.to_string()))
            .collect(),
    }
}

fn chat_tools() -> Value {
    json!([{"type": "function", "function": {"name": "get", "parameters": {"type": "object"}}}])
}

async fn openai(app: &axum::Router, tools: bool, stream: bool) -> Said {
    let mut body = chat_body(json!({"stream": stream}));
    if tools {
        body["tools"] = chat_tools();
    }
    let mut s = Said::default();
    if !stream {
        let (status, v) = post(app, "/v1/chat/completions", body).await;
        assert_eq!(status, StatusCode::OK, "{v}");
        let m = &v["choices"][0]["message"];
        s.reasoning = m["reasoning_content"].as_str().unwrap_or("").into();
        s.content = m["content"].as_str().unwrap_or("").into();
        for c in m["tool_calls"].as_array().into_iter().flatten() {
            s.calls.push((
                c["function"]["name"].as_str().unwrap().into(),
                c["function"]["arguments"].as_str().unwrap().into(),
            ));
        }
        return s;
    }
    let (_, text) = send(app, "POST", "/v1/chat/completions", &body.to_string(), &[]).await;
    for (_, d) in sse_events(&text) {
        let Ok(v) = serde_json::from_str::<Value>(&d) else {
            continue;
        };
        let Some(delta) = v.pointer("/choices/0/delta") else {
            continue;
        };
        s.reasoning += delta["reasoning_content"].as_str().unwrap_or("");
        s.content += delta["content"].as_str().unwrap_or("");
        for c in delta["tool_calls"].as_array().into_iter().flatten() {
            let k = c["index"].as_u64().unwrap() as usize;
            if let Some(name) = c.pointer("/function/name").and_then(Value::as_str) {
                assert_eq!(k, s.calls.len(), "each call starts once, in order");
                s.calls.push((name.into(), String::new()));
            }
            s.calls[k].1 += c["function"]["arguments"].as_str().unwrap_or("");
        }
    }
    s
}

async fn anthropic(app: &axum::Router, tools: bool, stream: bool) -> Said {
    let mut body = json!({"model": "fake-model", "max_tokens": 200, "stream": stream,
        "messages": [{"role": "user", "content": "hi"}]});
    if tools {
        body["tools"] = json!([{"name": "get", "input_schema": {"type": "object"}}]);
    }
    let mut s = Said::default();
    let canon = |v: &Value| v.to_string();
    if !stream {
        let (status, v) = post(app, "/v1/messages", body).await;
        assert_eq!(status, StatusCode::OK, "{v}");
        for b in v["content"].as_array().unwrap() {
            match b["type"].as_str().unwrap() {
                "thinking" => s.reasoning += b["thinking"].as_str().unwrap(),
                "text" => s.content += b["text"].as_str().unwrap(),
                "tool_use" => s
                    .calls
                    .push((b["name"].as_str().unwrap().into(), canon(&b["input"]))),
                other => panic!("block {other}"),
            }
        }
        return s;
    }
    let (_, text) = send(app, "POST", "/v1/messages", &body.to_string(), &[]).await;
    let mut kinds = Vec::new();
    let mut args = Vec::new();
    for (name, d) in sse_events(&text) {
        let v: Value = serde_json::from_str(&d).unwrap();
        match name.as_deref() {
            Some("content_block_start") => {
                assert_eq!(v["index"], kinds.len(), "blocks are numbered in order");
                let b = &v["content_block"];
                kinds.push(b["type"].as_str().unwrap().to_string());
                if b["type"] == "tool_use" {
                    s.calls
                        .push((b["name"].as_str().unwrap().into(), String::new()));
                    args.push(String::new());
                }
            }
            Some("content_block_delta") => {
                let delta = &v["delta"];
                match delta["type"].as_str().unwrap() {
                    "thinking_delta" => s.reasoning += delta["thinking"].as_str().unwrap(),
                    "text_delta" => s.content += delta["text"].as_str().unwrap(),
                    "input_json_delta" => {
                        *args.last_mut().unwrap() += delta["partial_json"].as_str().unwrap()
                    }
                    other => panic!("delta {other}"),
                }
            }
            _ => {}
        }
    }
    for (call, a) in s.calls.iter_mut().zip(args) {
        call.1 = canon(&serde_json::from_str::<Value>(&a).unwrap());
    }
    s
}

async fn responses(app: &axum::Router, tools: bool, stream: bool) -> Said {
    let mut body = json!({"model": "fake-model", "input": "hi", "stream": stream});
    if tools {
        body["tools"] =
            json!([{"type": "function", "name": "get", "parameters": {"type": "object"}}]);
    }
    let read = |out: &Value, s: &mut Said| {
        for item in out.as_array().unwrap() {
            match item["type"].as_str().unwrap() {
                "reasoning" => {
                    for c in item["content"].as_array().unwrap() {
                        s.reasoning += c["text"].as_str().unwrap();
                    }
                }
                "message" => s.content += item["content"][0]["text"].as_str().unwrap(),
                "function_call" => s.calls.push((
                    item["name"].as_str().unwrap().into(),
                    item["arguments"].as_str().unwrap().into(),
                )),
                other => panic!("item {other}"),
            }
        }
    };
    let mut s = Said::default();
    if !stream {
        let (status, v) = post(app, "/v1/responses", body).await;
        assert_eq!(status, StatusCode::OK, "{v}");
        read(&v["output"], &mut s);
        return s;
    }
    let (_, text) = send(app, "POST", "/v1/responses", &body.to_string(), &[]).await;
    let data: Vec<Value> = sse_events(&text)
        .iter()
        .map(|(_, d)| serde_json::from_str(d).unwrap())
        .collect();
    let mut streamed = Said::default();
    for d in &data {
        match d["type"].as_str().unwrap() {
            "response.reasoning_text.delta" => streamed.reasoning += d["delta"].as_str().unwrap(),
            "response.output_text.delta" => streamed.content += d["delta"].as_str().unwrap(),
            "response.output_item.added" if d["item"]["type"] == "function_call" => streamed
                .calls
                .push((d["item"]["name"].as_str().unwrap().into(), String::new())),
            "response.function_call_arguments.delta" => {
                streamed.calls.last_mut().unwrap().1 += d["delta"].as_str().unwrap()
            }
            _ => {}
        }
    }
    read(&data.last().unwrap()["response"]["output"], &mut s);
    assert_eq!(streamed, s, "the deltas add up to the final response");
    s
}

/// `reply` through every API, plain and streamed, with or without tools: all must say
/// `expected`.
async fn everywhere(reply: &str, tools: bool, expected: &Said) {
    everywhere_with(ServerConfig::default(), reply, tools, expected).await;
}

/// As [`everywhere`], served with `config`.
async fn everywhere_with(config: ServerConfig, reply: &str, tools: bool, expected: &Said) {
    let (app, _) = app_with(Fake::new(reply), config);
    for stream in [false, true] {
        let got = openai(&app, tools, stream).await;
        assert_eq!(&got, expected, "openai stream={stream} reply {reply:?}");
        let got = responses(&app, tools, stream).await;
        assert_eq!(&got, expected, "responses stream={stream} reply {reply:?}");
        // Anthropic gives arguments as an object: compare them re-serialized.
        let mut want = Said {
            reasoning: expected.reasoning.clone(),
            content: expected.content.clone(),
            calls: Vec::new(),
        };
        for (n, a) in &expected.calls {
            let v: Value = serde_json::from_str(a).unwrap();
            want.calls.push((n.clone(), v.to_string()));
        }
        let got = anthropic(&app, tools, stream).await;
        assert_eq!(got, want, "anthropic stream={stream} reply {reply:?}");
    }
}

#[tokio::test]
async fn reasoning_is_separated_in_every_api() {
    everywhere(
        "<think>plan</think>\n\nAnswer.",
        false,
        &said("plan", "Answer.", &[]),
    )
    .await;
    everywhere(
        "<think>plan</think>Answer.",
        true,
        &said("plan", "Answer.", &[]),
    )
    .await;
}

/// The ds4 release gate's cases: unterminated and twice-closed reasoning, with and without
/// tools, never leak reasoning into the answer.
#[tokio::test]
async fn unterminated_and_twice_closed_reasoning_never_reach_the_answer() {
    for tools in [false, true] {
        everywhere(
            "<think>thinking until the end",
            tools,
            &said("thinking until the end", "", &[]),
        )
        .await;
        everywhere("<think>a</think>b</think>c", tools, &said("a", "bc", &[])).await;
    }
}

/// The ds4 gate: a complete tool block inside unclosed reasoning is recovered once, the
/// prose before it stays reasoning, and nothing is synthesized.
#[tokio::test]
async fn a_tool_block_inside_unclosed_reasoning_is_recovered_once() {
    let reply = "<think>call it <tool_call>{\"name\": \"get\", \"arguments\": {\"city\": \"Oslo\"}}</tool_call>";
    everywhere(
        reply,
        true,
        &said("call it ", "", &[("get", "{\"city\": \"Oslo\"}")]),
    )
    .await;
    // Cut off inside the block: no call, the text stays reasoning.
    let cut = "<think>call it <tool_call>{\"name\": \"get\", \"arguments\": {\"ci";
    everywhere(cut, true, &said(&cut[7..], "", &[])).await;
}

#[tokio::test]
async fn tool_arguments_stream_as_generated() {
    let reply = "Checking. <tool_call>{\"name\": \"get\", \"arguments\": {\"city\": \"Oslo\", \"note\": \"</tool_call>\"}}</tool_call>";
    let args = "{\"city\": \"Oslo\", \"note\": \"</tool_call>\"}";
    everywhere(reply, true, &said("", "Checking. ", &[("get", args)])).await;
    let (app, _) = app_with(Fake::new(reply), ServerConfig::default());
    let body = chat_body(json!({"stream": true, "tools": chat_tools()}));
    let (_, text) = send(&app, "POST", "/v1/chat/completions", &body.to_string(), &[]).await;
    let pieces = text.matches("\"arguments\":\"").count();
    assert!(pieces > 10, "arguments came in {pieces} chunks");
    let body = json!({"model": "fake-model", "max_tokens": 200, "stream": true,
        "tools": [{"name": "get", "input_schema": {"type": "object"}}],
        "messages": [{"role": "user", "content": "hi"}]});
    let (_, text) = send(&app, "POST", "/v1/messages", &body.to_string(), &[]).await;
    assert!(text.matches("input_json_delta").count() > 10, "{text}");
    let body = json!({"model": "fake-model", "input": "hi", "stream": true,
        "tools": [{"type": "function", "name": "get", "parameters": {"type": "object"}}]});
    let (_, text) = send(&app, "POST", "/v1/responses", &body.to_string(), &[]).await;
    assert!(
        text.matches("function_call_arguments.delta").count() > 10 * 2,
        "{text}"
    );
}

#[tokio::test]
async fn reasoning_tokens_are_counted_in_responses_usage() {
    let (app, _) = app_with(
        Fake::new("<think>plan</think>Answer."),
        ServerConfig::default(),
    );
    let (_, v) = post(&app, "/v1/responses", json!({"input": "hi"})).await;
    // The `>` that opens reasoning, the 4 of "plan" and the 8 of "</think>" (one token per
    // byte in the fake).
    assert_eq!(v["usage"]["output_tokens_details"]["reasoning_tokens"], 13);
}

#[tokio::test]
async fn reasoning_format_none_leaves_the_text_alone() {
    let config = ServerConfig {
        reasoning_format: ferrite_engine::output::ReasoningFormat::None,
        ..ServerConfig::default()
    };
    let (app, _) = app_with(Fake::new("<think>plan</think>Answer."), config);
    let s = openai(&app, false, false).await;
    assert_eq!(s, said("", "<think>plan</think>Answer.", &[]));
}

/// An Anthropic messages body with this `thinking` object.
fn anthropic_thinking(thinking: Value) -> Value {
    json!({"max_tokens": 10, "thinking": thinking,
        "messages": [{"role": "user", "content": "hi"}]})
}

fn rendered(fake: &Fake) -> String {
    let prompt = fake.last_prompt.lock().unwrap().clone();
    fake.detokenize(&prompt).unwrap()
}

#[tokio::test]
async fn template_kwargs_reach_the_template() {
    let (app, fake) = app_with(Fake::new("ok"), ServerConfig::default());
    let body = chat_body(json!({"chat_template_kwargs": {"enable_thinking": false},
        "reasoning_effort": "high"}));
    let (status, _) = post(&app, "/v1/chat/completions", body).await;
    assert_eq!(status, StatusCode::OK);
    let p = rendered(&fake);
    assert!(
        p.contains("\"enable_thinking\":false") && p.contains("\"reasoning_effort\":\"high\""),
        "{p}"
    );
    let (status, v) = post(
        &app,
        "/v1/chat/completions",
        chat_body(json!({"reasoning_effort": "max"})),
    )
    .await;
    assert_eq!(
        (status, v["error"]["param"].as_str()),
        (StatusCode::BAD_REQUEST, Some("reasoning_effort"))
    );
    let body = anthropic_thinking(json!({"type": "enabled", "budget_tokens": 64}));
    assert_eq!(post(&app, "/v1/messages", body).await.0, StatusCode::OK);
    assert!(rendered(&fake).contains("\"enable_thinking\":true"));
    let body = json!({"input": "hi", "reasoning": {"effort": "low"}});
    assert_eq!(post(&app, "/v1/responses", body).await.0, StatusCode::OK);
    assert!(rendered(&fake).contains("\"reasoning_effort\":\"low\""));
}

fn budget_tokens(fake: &Fake) -> Option<usize> {
    fake.last_budget.lock().unwrap().as_ref().map(|b| b.tokens)
}

/// Oracle: the field each API documents, read back from the request the engine received
/// (the engine's own tests show a budget closing the block).
#[tokio::test]
async fn reasoning_budgets_reach_the_engine_from_every_api() {
    let (app, fake) = app_with(Fake::new("ok"), ServerConfig::default());
    let (status, _) = post(
        &app,
        "/v1/chat/completions",
        chat_body(json!({"thinking_token_budget": 7})),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(budget_tokens(&fake), Some(7));
    let b = fake.last_budget.lock().unwrap().clone().unwrap();
    // One token per byte in the fake: the markers as the fake tokenizes them.
    assert_eq!(b.close, fake.tokenize("</think>", false, true));
    assert_eq!(b.open, fake.tokenize("<think>", false, true));
    assert_eq!(b.forced, b.close);
    let body = json!({"input": "hi", "thinking_token_budget": 0});
    assert_eq!(post(&app, "/v1/responses", body).await.0, StatusCode::OK);
    assert_eq!(budget_tokens(&fake), Some(0));
    let body = anthropic_thinking(json!({"type": "enabled", "budget_tokens": 64}));
    assert_eq!(post(&app, "/v1/messages", body).await.0, StatusCode::OK);
    assert_eq!(budget_tokens(&fake), Some(64));
    let body = anthropic_thinking(json!({"type": "disabled"}));
    assert_eq!(post(&app, "/v1/messages", body).await.0, StatusCode::OK);
    assert_eq!(budget_tokens(&fake), None);
    assert_eq!(
        post(&app, "/v1/chat/completions", chat_body(json!({})))
            .await
            .0,
        StatusCode::OK
    );
    assert_eq!(budget_tokens(&fake), None);
}

#[tokio::test]
async fn the_servers_budget_applies_where_the_request_sets_none() {
    let config = ServerConfig {
        reasoning_budget: Some(5),
        ..ServerConfig::default()
    };
    let (app, fake) = app_with(Fake::new("ok"), config);
    assert_eq!(
        post(&app, "/v1/chat/completions", chat_body(json!({})))
            .await
            .0,
        StatusCode::OK
    );
    assert_eq!(budget_tokens(&fake), Some(5));
    let body = chat_body(json!({"thinking_token_budget": 9}));
    assert_eq!(
        post(&app, "/v1/chat/completions", body).await.0,
        StatusCode::OK
    );
    assert_eq!(budget_tokens(&fake), Some(9));
}

/// A server reading output as `format`, with `--reasoning-budget 5`, after one chat that
/// sets no budget of its own.
async fn budgeted_server(
    format: ferrite_engine::output::ReasoningFormat,
) -> (axum::Router, std::sync::Arc<Fake>) {
    let config = ServerConfig {
        reasoning_format: format,
        reasoning_budget: Some(5),
        ..ServerConfig::default()
    };
    let (app, fake) = app_with(Fake::new("ok"), config);
    assert_eq!(
        post(&app, "/v1/chat/completions", chat_body(json!({})))
            .await
            .0,
        StatusCode::OK
    );
    (app, fake)
}

/// Harmony output gets a budget on its `analysis` message, closed by ending it and opening
/// the `final` one (oracle: the markers of the harmony format, as the fake tokenizes them).
#[tokio::test]
async fn a_harmony_budget_closes_the_analysis_message() {
    let (app, fake) = budgeted_server(ferrite_engine::output::ReasoningFormat::Harmony).await;
    let b = fake.last_budget.lock().unwrap().clone().unwrap();
    assert_eq!(b.tokens, 5);
    assert!(!b.starts_inside);
    assert_eq!(
        b.open,
        fake.tokenize("<|channel|>analysis<|message|>", false, true)
    );
    assert_eq!(b.close, fake.tokenize("<|end|>", false, true));
    assert_eq!(
        b.forced,
        fake.tokenize(
            "<|end|><|start|>assistant<|channel|>final<|message|>",
            false,
            true
        )
    );
    assert_eq!(b.text_markers, None);
    let body = anthropic_thinking(json!({"type": "enabled", "budget_tokens": 64}));
    assert_eq!(post(&app, "/v1/messages", body).await.0, StatusCode::OK);
    assert_eq!(budget_tokens(&fake), Some(64));
}

/// `/v1/completions` takes `thinking_token_budget` too; the prompt decides whether the
/// output starts inside `<think>` (oracle: the prompt's last marker, read back from the
/// request the engine received).
#[tokio::test]
async fn a_completion_takes_a_budget_and_its_prompt_opens_the_block() {
    let (app, fake) = app_with(Fake::new("ok"), ServerConfig::default());
    for (prompt, inside) in [("Solve 2+2. <think>", true), ("Solve 2+2.", false)] {
        let body = json!({"prompt": prompt, "max_tokens": 4, "thinking_token_budget": 3});
        assert_eq!(post(&app, "/v1/completions", body).await.0, StatusCode::OK);
        let b = fake.last_budget.lock().unwrap().clone().unwrap();
        assert_eq!((b.tokens, b.starts_inside), (3, inside), "{prompt}");
        assert_eq!(b.forced, fake.tokenize("</think>", false, true));
    }
    let body = json!({"prompt": "Solve.", "max_tokens": 4});
    assert_eq!(post(&app, "/v1/completions", body).await.0, StatusCode::OK);
    assert_eq!(budget_tokens(&fake), None);
    let config = ServerConfig {
        reasoning_format: ferrite_engine::output::ReasoningFormat::None,
        ..ServerConfig::default()
    };
    let (app, _) = app_with(Fake::new("ok"), config);
    let body = json!({"prompt": "Solve.", "max_tokens": 4, "thinking_token_budget": 3});
    let (status, v) = post(&app, "/v1/completions", body).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(v["error"]["param"], "thinking_token_budget");
}

/// A budget that cannot be enforced is refused, never ignored: output read without
/// reasoning has no block to close.
#[tokio::test]
async fn a_budget_on_output_without_reasoning_is_refused() {
    let (app, fake) = budgeted_server(ferrite_engine::output::ReasoningFormat::None).await;
    assert_eq!(
        budget_tokens(&fake),
        None,
        "the server's default applies only where it can"
    );
    let (status, v) = post(
        &app,
        "/v1/chat/completions",
        chat_body(json!({"thinking_token_budget": 9})),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(v["error"]["param"], "thinking_token_budget");
    let body = anthropic_thinking(json!({"type": "enabled", "budget_tokens": 64}));
    let (status, v) = post(&app, "/v1/messages", body).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(v.to_string().contains("thinking.budget_tokens"), "{v}");
}

/// `--tool-syntax` decides what is parsed when the template shows no markers (the fake's
/// shows none, so Hermes would be read): GLM 4.5 markup becomes a call in every API, and
/// Hermes markup is left as text.
#[tokio::test]
async fn the_servers_tool_syntax_overrides_the_templates() {
    let config = || ServerConfig {
        tool_syntax: Some(ferrite_engine::output::ToolSyntax::Glm45),
        ..ServerConfig::default()
    };
    let glm = "<tool_call>get\n<arg_key>city</arg_key>\n<arg_value>Oslo</arg_value>\n</tool_call>";
    everywhere_with(
        config(),
        glm,
        true,
        &said("", "", &[("get", "{\"city\":\"Oslo\"}")]),
    )
    .await;
    let hermes = "<tool_call>{\"name\": \"get\", \"arguments\": {}}</tool_call>";
    everywhere_with(config(), hermes, true, &said("", hermes, &[])).await;
}

/// Regression: tools were silently dropped when the template could not render them.
#[tokio::test]
async fn tools_a_template_cannot_render_are_refused() {
    let mut fake = Fake::new("ok");
    fake.drops_tools = true;
    let (app, _) = app_with(fake, ServerConfig::default());
    let (status, v) = post(
        &app,
        "/v1/chat/completions",
        chat_body(json!({"tools": chat_tools()})),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(v["error"]["param"], "tools");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("does not render tools")
    );
    let body = json!({"max_tokens": 10, "tools": [{"name": "get", "input_schema": {}}],
        "messages": [{"role": "user", "content": "hi"}]});
    assert_eq!(
        post(&app, "/v1/messages", body).await.0,
        StatusCode::BAD_REQUEST
    );
    let body = json!({"input": "hi", "tools": [{"type": "function", "name": "get"}]});
    assert_eq!(
        post(&app, "/v1/responses", body).await.0,
        StatusCode::BAD_REQUEST
    );
    assert_eq!(
        post(&app, "/v1/chat/completions", chat_body(json!({})))
            .await
            .0,
        StatusCode::OK
    );
}

#[tokio::test]
async fn a_missing_model_is_the_served_one_and_an_unknown_one_is_404() {
    let (app, _) = app_with(Fake::new("ok"), ServerConfig::default());
    for model in [Value::Null, json!("fake.gguf")] {
        let mut body = chat_body(json!({}));
        body["model"] = model.clone();
        let (status, v) = post(&app, "/v1/chat/completions", body).await;
        assert_eq!(
            (status, &v["model"]),
            (StatusCode::OK, &json!("fake-model")),
            "{model}"
        );
    }
    let body = json!({"max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]});
    assert_eq!(post(&app, "/v1/messages", body).await.0, StatusCode::OK);
    assert_eq!(
        post(&app, "/v1/responses", json!({"input": "hi"})).await.0,
        StatusCode::OK
    );
    assert_eq!(
        post(&app, "/v1/completions", json!({"prompt": "hi"}))
            .await
            .0,
        StatusCode::OK
    );
    let (status, v) = post(
        &app,
        "/v1/chat/completions",
        chat_body(json!({"model": "gpt-9"})),
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(v["error"]["code"], "model_not_found");
    let body =
        json!({"model": "gpt-9", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]});
    assert_eq!(
        post(&app, "/v1/messages", body).await.0,
        StatusCode::NOT_FOUND
    );
}
