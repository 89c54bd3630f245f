//! HTTP-layer tests of the OpenAI API details beyond the basics (issue #5): Responses API
//! function tools with their round trip, multi-prompt completions, and `echo` with prompt
//! logprobs. Same fake engine and helpers as `http_tests`.

use axum::http::StatusCode;
use serde_json::{Value, json};

use crate::ServerConfig;
use crate::http_tests::{app_with, post, send, sse_events};
use crate::testing::Fake;

const CALL_REPLY: &str =
    "<tool_call>{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}</tool_call>";

fn weather_tool() -> Value {
    json!({"type": "function", "name": "get_weather", "description": "Weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}})
}

#[tokio::test]
async fn responses_tool_call_becomes_a_function_call_item_and_round_trips() {
    let (app, fake) = app_with(Fake::new(CALL_REPLY), ServerConfig::default());
    let body =
        json!({"model": "fake-model", "input": "weather in Oslo?", "tools": [weather_tool()]});
    let (status, v) = post(&app, "/v1/responses", body).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["status"], "completed");
    assert_eq!(v["tools"][0]["name"], "get_weather");
    let out = v["output"].as_array().unwrap();
    assert_eq!(out.len(), 1, "only the call, no empty message: {v}");
    assert_eq!(out[0]["type"], "function_call");
    assert_eq!(out[0]["name"], "get_weather");
    assert_eq!(out[0]["status"], "completed");
    let args: Value = serde_json::from_str(out[0]["arguments"].as_str().unwrap()).unwrap();
    assert_eq!(args, json!({"city": "Oslo"}));
    let call_id = out[0]["call_id"].as_str().unwrap().to_string();
    assert!(call_id.starts_with("call_"), "{call_id}");
    // The tools reached the template.
    let prompt = fake.last_prompt.lock().unwrap().clone();
    let rendered = String::from_utf8(prompt.iter().map(|&t| (t - 1) as u8).collect()).unwrap();
    assert!(rendered.contains("tools: yes"), "{rendered}");

    // Round trip: the call and its output go back as input items.
    let next = json!({"model": "fake-model", "tools": [weather_tool()], "input": [
        {"role": "user", "content": "weather in Oslo?"},
        out[0].clone(),
        {"type": "function_call_output", "call_id": call_id, "output": "rain, 7 C"},
    ]});
    let (status, v) = post(&app, "/v1/responses", next).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    let prompt = fake.last_prompt.lock().unwrap().clone();
    let rendered = String::from_utf8(prompt.iter().map(|&t| (t - 1) as u8).collect()).unwrap();
    assert!(
        rendered.contains(&format!("[call \"{call_id}\" \"get_weather\"")),
        "{rendered}"
    );
    assert!(
        rendered.contains(&format!("tool: rain, 7 C [answers {call_id}]")),
        "{rendered}"
    );

    // tool_choice "none": the same reply stays plain text.
    let body = json!({"model": "fake-model", "input": "x", "tools": [weather_tool()], "tool_choice": "none"});
    let (_, v) = post(&app, "/v1/responses", body).await;
    assert_eq!(v["output"][0]["type"], "message");
    assert_eq!(v["output"][0]["content"][0]["text"], CALL_REPLY);
}

#[tokio::test]
async fn responses_tool_call_streams_function_call_events() {
    let reply = format!("Checking. {CALL_REPLY}");
    let (app, _) = app_with(Fake::new(&reply), ServerConfig::default());
    let body =
        json!({"model": "fake-model", "input": "x", "tools": [weather_tool()], "stream": true});
    let (status, text) = send(&app, "POST", "/v1/responses", &body.to_string(), &[]).await;
    assert_eq!(status, StatusCode::OK);
    let events = sse_events(&text);
    let names: Vec<&str> = events.iter().map(|(n, _)| n.as_deref().unwrap()).collect();
    let data: Vec<Value> = events
        .iter()
        .map(|(_, d)| serde_json::from_str(d).unwrap())
        .collect();
    let deltas: String = data
        .iter()
        .filter(|d| d["type"] == "response.output_text.delta")
        .map(|d| d["delta"].as_str().unwrap())
        .collect();
    assert_eq!(deltas, "Checking. ", "no tool-call markup leaks into text");
    let tail: Vec<&str> = names
        .iter()
        .copied()
        // Arguments stream in as many deltas as the model took tokens.
        .filter(|n| !n.ends_with("output_text.delta") && !n.ends_with("arguments.delta"))
        .collect();
    assert_eq!(
        tail,
        [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.content_part.added",
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done",
            "response.output_item.added",
            "response.function_call_arguments.done",
            "response.output_item.done",
            "response.completed",
        ]
    );
    let args = data
        .iter()
        .find(|d| d["type"] == "response.function_call_arguments.done")
        .unwrap();
    assert_eq!(args["output_index"], 1);
    let done = data.last().unwrap();
    let out = done["response"]["output"].as_array().unwrap();
    assert_eq!(out[0]["content"][0]["text"], "Checking. ");
    assert_eq!(out[1]["type"], "function_call");
    assert_eq!(
        out[1]["call_id"],
        args["item_id"].as_str().unwrap().replace("fc_", "call_")
    );
    for (k, d) in data.iter().enumerate() {
        assert_eq!(d["sequence_number"], k);
    }
}

#[tokio::test]
async fn responses_refuses_non_function_tools() {
    let (app, _) = app_with(Fake::new("x"), ServerConfig::default());
    for (tools, param) in [
        (json!([{"type": "web_search"}]), "tools[0].type"),
        (json!([{"type": "function"}]), "tools[0].name"),
    ] {
        let body = json!({"model": "fake-model", "input": "x", "tools": tools});
        let (status, v) = post(&app, "/v1/responses", body).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{v}");
        assert_eq!(v["error"]["param"], param);
    }
    let body = json!({"model": "fake-model", "input": "x", "tool_choice": "sometimes"});
    let (status, v) = post(&app, "/v1/responses", body).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{v}");
}

#[tokio::test]
async fn completions_take_several_prompts_with_choices_grouped_per_prompt() {
    let (app, _) = app_with(Fake::new("Hello"), ServerConfig::default());
    let body = json!({"model": "fake-model", "prompt": ["ab", "xyz"], "n": 2, "max_tokens": 3, "echo": true});
    let (status, v) = post(&app, "/v1/completions", body).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    let texts: Vec<&str> = v["choices"]
        .as_array()
        .unwrap()
        .iter()
        .enumerate()
        .map(|(i, c)| {
            assert_eq!(c["index"], i);
            c["text"].as_str().unwrap()
        })
        .collect();
    assert_eq!(texts, ["abHel", "abHel", "xyzHel", "xyzHel"]);
    // Each prompt counted once: 2 + 3 prompt tokens, 4 choices of 3 tokens.
    assert_eq!(v["usage"]["prompt_tokens"], 5);
    assert_eq!(v["usage"]["completion_tokens"], 12);

    let body =
        json!({"model": "fake-model", "prompt": [[98, 99], [100]], "max_tokens": 1, "echo": true});
    let (_, v) = post(&app, "/v1/completions", body).await;
    assert_eq!(v["choices"][0]["text"], "abH");
    assert_eq!(v["choices"][1]["text"], "cH");

    let body = json!({"model": "fake-model", "prompt": ["ab", "c"], "max_tokens": 2, "echo": true,
        "stream": true, "stream_options": {"include_usage": true}});
    let (_, text) = send(&app, "POST", "/v1/completions", &body.to_string(), &[]).await;
    let events = sse_events(&text);
    assert_eq!(events.last().unwrap().1, "[DONE]");
    let mut per_choice = [String::new(), String::new()];
    let mut finished = [false, false];
    let mut usage = Value::Null;
    for (_, d) in &events[..events.len() - 1] {
        let v: Value = serde_json::from_str(d).unwrap();
        if let Some(c) = v["choices"].as_array().and_then(|c| c.first()) {
            let i = c["index"].as_u64().unwrap() as usize;
            per_choice[i].push_str(c["text"].as_str().unwrap());
            finished[i] |= !c["finish_reason"].is_null();
        } else {
            usage = v["usage"].clone();
        }
    }
    assert_eq!(per_choice, ["abHe", "cHe"]);
    assert_eq!(finished, [true, true]);
    assert_eq!(usage["prompt_tokens"], 3);
    assert_eq!(usage["completion_tokens"], 4);

    let many: Vec<&str> = vec!["a"; 33];
    let (status, v) = post(
        &app,
        "/v1/completions",
        json!({"model": "fake-model", "prompt": many}),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{v}");
    let body = json!({"model": "fake-model", "prompt": vec!["a"; 8], "n": 9});
    let (status, v) = post(&app, "/v1/completions", body).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{v}");
    assert_eq!(v["error"]["param"], "n");
}

#[tokio::test]
async fn echo_with_logprobs_scores_the_prompt() {
    let (app, _) = app_with(Fake::new("Hello"), ServerConfig::default());
    // The classic scoring call: echo, logprobs, no new tokens.
    let body = json!({"model": "fake-model", "prompt": "Say", "max_tokens": 0, "echo": true, "logprobs": 1});
    let (status, v) = post(&app, "/v1/completions", body).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    let c = &v["choices"][0];
    assert_eq!(c["text"], "Say");
    assert_eq!(c["finish_reason"], "length");
    let lp = &c["logprobs"];
    assert_eq!(lp["tokens"], json!(["S", "a", "y"]));
    assert_eq!(lp["token_logprobs"], json!([null, -1.0, -1.0]));
    assert_eq!(lp["top_logprobs"], json!([null, {"a": -1.0}, {"y": -1.0}]));
    assert_eq!(lp["text_offset"], json!([0, 1, 2]));
    assert_eq!(v["usage"]["prompt_tokens"], 3);
    assert_eq!(v["usage"]["completion_tokens"], 0);

    // With generation: prompt entries, then the generated ones, offsets running on.
    let body = json!({"model": "fake-model", "prompt": "Sa", "max_tokens": 2, "echo": true, "logprobs": 0});
    let (_, v) = post(&app, "/v1/completions", body).await;
    let c = &v["choices"][0];
    assert_eq!(c["text"], "SaHe");
    assert_eq!(c["logprobs"]["tokens"], json!(["S", "a", "H", "e"]));
    assert_eq!(
        c["logprobs"]["token_logprobs"],
        json!([null, -1.0, -0.5, -0.5])
    );
    assert_eq!(c["logprobs"]["text_offset"], json!([0, 1, 2, 3]));
    assert_eq!(v["usage"]["completion_tokens"], 2);

    // Streaming: the echo chunk carries the prompt logprobs and comes first.
    let body = json!({"model": "fake-model", "prompt": "Sa", "max_tokens": 0, "echo": true,
        "logprobs": 1, "stream": true});
    let (_, text) = send(&app, "POST", "/v1/completions", &body.to_string(), &[]).await;
    let events = sse_events(&text);
    assert_eq!(events.last().unwrap().1, "[DONE]");
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|(_, d)| serde_json::from_str(d).unwrap())
        .collect();
    assert_eq!(chunks.len(), 2, "{chunks:?}");
    assert_eq!(chunks[0]["choices"][0]["text"], "Sa");
    assert_eq!(
        chunks[0]["choices"][0]["logprobs"]["token_logprobs"],
        json!([null, -1.0])
    );
    assert_eq!(chunks[1]["choices"][0]["text"], "");
    assert_eq!(chunks[1]["choices"][0]["finish_reason"], "length");

    // echo without logprobs and max_tokens 0 still answers without the engine.
    let body = json!({"model": "fake-model", "prompt": "Sa", "max_tokens": 0, "echo": true});
    let (_, v) = post(&app, "/v1/completions", body).await;
    assert_eq!(v["choices"][0]["text"], "Sa");
    assert!(v["choices"][0]["logprobs"].is_null());
}

/// Streamed completions logprobs, joined over the chunks, equal the plain answer's, offsets
/// included: each `text_offset` is the token's place in the choice's whole text (after the
/// echoed prompt, if any). Regression: every streamed chunk restarted its offsets at 0.
#[tokio::test]
async fn streamed_completion_logprobs_keep_running_text_offsets() {
    let (app, _) = app_with(Fake::new("Hello"), ServerConfig::default());
    for echo in [false, true] {
        let body = json!({"model": "fake-model", "prompt": "Sa", "max_tokens": 4, "echo": echo,
            "logprobs": 1, "n": 2});
        let (status, plain) = post(&app, "/v1/completions", body.clone()).await;
        assert_eq!(status, StatusCode::OK, "{plain}");
        let mut stream_body = body;
        stream_body["stream"] = json!(true);
        let (_, text) = send(
            &app,
            "POST",
            "/v1/completions",
            &stream_body.to_string(),
            &[],
        )
        .await;
        let events = sse_events(&text);
        let mut joined = vec![json!({}); 2];
        for (_, data) in &events[..events.len() - 1] {
            let chunk: Value = serde_json::from_str(data).unwrap();
            let c = &chunk["choices"][0];
            let i = c["index"].as_u64().unwrap() as usize;
            for key in ["tokens", "token_logprobs", "top_logprobs", "text_offset"] {
                for item in c["logprobs"][key].as_array().into_iter().flatten() {
                    match joined[i][key].as_array_mut() {
                        Some(items) => items.push(item.clone()),
                        None => joined[i][key] = json!([item]),
                    }
                }
            }
        }
        for (i, got) in joined.iter().enumerate() {
            assert_eq!(
                got, &plain["choices"][i]["logprobs"],
                "echo {echo}, choice {i}"
            );
        }
    }
}

/// Tool definitions that name no function are refused with a 400 naming the tool, in chat
/// completions (`{"type": "function", "function": {"name", ...}}`) and in Anthropic
/// messages (`{"name", "input_schema"}`), and the server answers normally afterwards.
/// Regression: they were passed to the template as they were (a null name, a string, a
/// retrieval tool), where the model saw a tool it could not call.
#[tokio::test]
async fn tools_without_a_function_name_are_refused() {
    let (app, _) = app_with(Fake::new("Hello"), ServerConfig::default());
    let chat = |tools: Value| {
        json!({"model": "fake-model", "messages": [{"role": "user", "content": "hi"}],
            "tools": tools})
    };
    for (tools, param) in [
        (json!(["get_weather"]), "tools[0]"),
        (json!([{"type": "retrieval"}]), "tools[0].type"),
        (json!([{"type": "function"}]), "tools[0].function.name"),
        (
            json!([{"type": "function", "function": {"name": "a"}}, {"type": "function", "function": {"parameters": {}}}]),
            "tools[1].function.name",
        ),
    ] {
        let (status, v) = post(&app, "/v1/chat/completions", chat(tools.clone())).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{tools}: {v}");
        assert_eq!(v["error"]["param"], param, "{tools}: {v}");
    }
    let good = json!([{"type": "function", "function": {"name": "get_weather"}}]);
    let (status, v) = post(&app, "/v1/chat/completions", chat(good)).await;
    assert_eq!(status, StatusCode::OK, "{v}");

    let messages = |tools: Value| {
        json!({"model": "fake-model", "max_tokens": 5, "tools": tools,
            "messages": [{"role": "user", "content": "hi"}]})
    };
    for tools in [
        json!([{"description": "no name", "input_schema": {"type": "object"}}]),
        json!(["get_weather"]),
    ] {
        let (status, v) = post(&app, "/v1/messages", messages(tools.clone())).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{tools}: {v}");
        assert_eq!(v["type"], "error", "{v}");
        assert!(
            v["error"]["message"].as_str().unwrap().contains("tools[0]"),
            "{v}"
        );
    }
    let good = json!([{"name": "get_weather", "input_schema": {"type": "object"}}]);
    let (status, v) = post(&app, "/v1/messages", messages(good)).await;
    assert_eq!(status, StatusCode::OK, "{v}");
}

/// Completions options the server cannot honour are refused, not dropped: `suffix`
/// (fill-in-the-middle) and `best_of` above `n` (sampling more and returning the best)
/// would otherwise come back as an ordinary completion the client takes for what it asked
/// for. Regression: both were ignored with a 200. The neutral values stay accepted.
#[tokio::test]
async fn completions_refuse_suffix_and_best_of_they_cannot_honour() {
    let (app, _) = app_with(Fake::new("Hello"), ServerConfig::default());
    let body = |extra: Value| {
        let mut b = json!({"model": "fake-model", "prompt": "def f(", "max_tokens": 3});
        for (k, v) in extra.as_object().unwrap() {
            b[k] = v.clone();
        }
        b
    };
    for (extra, param) in [
        (json!({"suffix": "\n    return x"}), "suffix"),
        (json!({"best_of": 3}), "best_of"),
        (json!({"best_of": 2, "n": 3}), "best_of"),
        (json!({"best_of": 0}), "best_of"),
    ] {
        let (status, v) = post(&app, "/v1/completions", body(extra.clone())).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{extra}: {v}");
        assert_eq!(v["error"]["param"], param, "{extra}: {v}");
    }
    for extra in [
        json!({"suffix": ""}),
        json!({"suffix": null}),
        json!({"best_of": 1}),
        json!({"best_of": 2, "n": 2}),
    ] {
        let (status, v) = post(&app, "/v1/completions", body(extra.clone())).await;
        assert_eq!(status, StatusCode::OK, "{extra}: {v}");
    }
}

/// Tool-call ids are unique across answers, in chat completions and Anthropic messages,
/// plain and streamed: clients match tool results to calls by id over a whole conversation,
/// so a second turn's call must not reuse the first's id. Regression: every answer named its
/// calls `call_0`, `call_1`… (`toolu_0`… in Anthropic's shape).
#[tokio::test]
async fn tool_call_ids_differ_between_answers() {
    let (app, _) = app_with(Fake::new(CALL_REPLY), ServerConfig::default());
    let chat = json!({"model": "fake-model", "messages": [{"role": "user", "content": "hi"}],
        "tools": [{"type": "function", "function": {"name": "get_weather"}}]});
    let anthropic = json!({"model": "fake-model", "max_tokens": 200,
        "messages": [{"role": "user", "content": "hi"}],
        "tools": [{"name": "get_weather", "input_schema": {"type": "object"}}]});
    let mut ids = Vec::new();
    for _ in 0..2 {
        let (_, v) = post(&app, "/v1/chat/completions", chat.clone()).await;
        ids.push(v["choices"][0]["message"]["tool_calls"][0]["id"].clone());
        let (_, v) = post(&app, "/v1/messages", anthropic.clone()).await;
        ids.push(v["content"][0]["id"].clone());
        for (path, body) in [
            ("/v1/chat/completions", &chat),
            ("/v1/messages", &anthropic),
        ] {
            let mut body = body.clone();
            body["stream"] = json!(true);
            let (_, text) = send(&app, "POST", path, &body.to_string(), &[]).await;
            let id = sse_events(&text)
                .iter()
                .filter_map(|(_, d)| serde_json::from_str::<Value>(d).ok())
                .find_map(|e| {
                    let call = e
                        .pointer("/choices/0/delta/tool_calls/0/id")
                        .or_else(|| e.pointer("/content_block/id"));
                    call.cloned()
                });
            ids.push(id.unwrap_or_else(|| panic!("no tool call id in {text}")));
        }
    }
    for (i, id) in ids.iter().enumerate() {
        assert!(id.as_str().is_some_and(|s| !s.is_empty()), "{ids:?}");
        assert!(!ids[..i].contains(id), "id {id} repeats: {ids:?}");
    }
}

/// An Anthropic stream builds the same content blocks as the plain answer. Regression: a
/// reply that is only a tool call streamed an empty text block before the `tool_use` block
/// (the plain answer has none, and Anthropic's API refuses empty text blocks when such a
/// message is sent back).
#[tokio::test]
async fn anthropic_stream_blocks_equal_the_plain_content() {
    for reply in [
        CALL_REPLY.to_string(),
        format!("\n{CALL_REPLY}"),
        format!("Checking.{CALL_REPLY}"),
        "Just text.".to_string(),
    ] {
        let (app, _) = app_with(Fake::new(&reply), ServerConfig::default());
        let body = json!({"model": "fake-model", "max_tokens": 200,
            "messages": [{"role": "user", "content": "hi"}],
            "tools": [{"name": "get_weather", "input_schema": {"type": "object"}}]});
        let (_, plain) = post(&app, "/v1/messages", body.clone()).await;
        let mut stream = body;
        stream["stream"] = json!(true);
        let (_, text) = send(&app, "POST", "/v1/messages", &stream.to_string(), &[]).await;
        let mut blocks: Vec<Value> = Vec::new();
        let mut json_parts: Vec<String> = Vec::new();
        for (_, data) in sse_events(&text) {
            let e: Value = serde_json::from_str(&data).unwrap();
            match e["type"].as_str().unwrap() {
                "content_block_start" => {
                    assert_eq!(e["index"], blocks.len(), "{text}");
                    blocks.push(e["content_block"].clone());
                    json_parts.push(String::new());
                }
                "content_block_delta" => {
                    let i = e["index"].as_u64().unwrap() as usize;
                    match e["delta"]["type"].as_str().unwrap() {
                        "text_delta" => {
                            let t = blocks[i]["text"].as_str().unwrap().to_string();
                            blocks[i]["text"] = json!(t + e["delta"]["text"].as_str().unwrap());
                        }
                        _ => json_parts[i].push_str(e["delta"]["partial_json"].as_str().unwrap()),
                    }
                }
                "content_block_stop" => {
                    let i = e["index"].as_u64().unwrap() as usize;
                    if !json_parts[i].is_empty() {
                        blocks[i]["input"] = serde_json::from_str(&json_parts[i]).unwrap();
                    }
                }
                _ => {}
            }
        }
        let without_ids = |blocks: &[Value]| -> Vec<Value> {
            blocks
                .iter()
                .map(|b| {
                    let mut b = b.clone();
                    b.as_object_mut().unwrap().remove("id");
                    b
                })
                .collect()
        };
        assert_eq!(
            without_ids(&blocks),
            without_ids(plain["content"].as_array().unwrap()),
            "reply {reply:?}: {text}"
        );
    }
}
