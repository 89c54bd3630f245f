//! End-to-end tests of `ferrite serve` with the real SmolLM2 on CPU: every API plain and
//! streaming (stream text must equal the plain answer: greedy decoding is deterministic),
//! prefix-cache reuse, concurrent streams equal to their sequential answers, disconnects
//! freeing slots, bad input, API keys and the per-request log line.

mod common;
mod server_util;

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use server_util::{Server, chat_stream_text};

use server_util::{MODEL, chat, metric, start, start_with, with};

#[test]
fn openai_chat_and_completions_plain_equals_stream() {
    let server = start();
    let models = server.get("/v1/models").json();
    let id = models["data"][0]["id"].as_str().unwrap().to_string();
    assert_eq!(id, MODEL);
    // The file name is accepted as well.
    assert_eq!(
        server
            .get("/v1/models/SmolLM2-135M-Instruct.Q4_1.gguf")
            .status,
        200
    );
    let body = json!({"model": id, "messages": [{"role": "user", "content": "What is the capital of France?"}],
        "temperature": 0, "max_tokens": 12});
    let plain = server.post("/v1/chat/completions", &body);
    assert_eq!(plain.status, 200, "{}", plain.body);
    let v = plain.json();
    let text = v["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_string();
    println!("chat answer: {text:?}");
    assert!(!text.trim().is_empty());
    let usage = &v["usage"];
    assert!(usage["prompt_tokens"].as_u64().unwrap() > 5);
    let completion = usage["completion_tokens"].as_u64().unwrap();
    assert!((1..=12).contains(&completion));
    let finish = v["choices"][0]["finish_reason"].as_str().unwrap();
    assert!(finish == "length" || finish == "stop");
    if finish == "length" {
        assert_eq!(completion, 12);
    }
    // Same request streamed: same text, usage chunk before [DONE].
    let stream = server.post(
        "/v1/chat/completions",
        &with(
            body.clone(),
            json!({"stream": true, "stream_options": {"include_usage": true}}),
        ),
    );
    assert_eq!(stream.status, 200);
    let (streamed, chunks) = chat_stream_text(&stream);
    assert_eq!(streamed, text);
    let last = chunks.last().unwrap();
    assert_eq!(last["choices"], json!([]));
    assert_eq!(last["usage"]["completion_tokens"], completion);
    // The repeat reuses the cached prompt prefix and still gives the same answer.
    let cached = server.post("/v1/chat/completions", &body).json();
    assert_eq!(cached["choices"][0]["message"]["content"], text.as_str());
    let hits = cached["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap();
    assert!(hits > 0, "no prefix reuse: {cached}");
    assert!(metric(&server, "ferrite_cache_hits_total") >= 1.0);

    let comp = json!({"model": id, "prompt": "The capital of France is", "max_tokens": 8, "temperature": 0});
    let plain = server.post("/v1/completions", &comp);
    assert_eq!(plain.status, 200, "{}", plain.body);
    let text = plain.json()["choices"][0]["text"]
        .as_str()
        .unwrap()
        .to_string();
    println!("completion: {text:?}");
    let stream = server.post(
        "/v1/completions",
        &with(comp.clone(), json!({"stream": true})),
    );
    let events = stream.events();
    assert_eq!(events.last().unwrap().1, "[DONE]");
    let streamed: String = events[..events.len() - 1]
        .iter()
        .map(|(_, d)| {
            serde_json::from_str::<Value>(d).unwrap()["choices"][0]["text"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    assert_eq!(streamed, text);
    let echo = server
        .post(
            "/v1/completions",
            &with(comp, json!({"echo": true, "logprobs": 2})),
        )
        .json();
    let echoed = echo["choices"][0]["text"].as_str().unwrap();
    assert_eq!(echoed, format!("The capital of France is{text}"));
    // Echo with logprobs scores the prompt too: its first token has no logprob.
    let lp = &echo["choices"][0]["logprobs"];
    let count = |k: &str| echo["usage"][k].as_u64().unwrap() as usize;
    assert_eq!(
        lp["tokens"].as_array().unwrap().len(),
        count("prompt_tokens") + count("completion_tokens")
    );
    assert!(lp["token_logprobs"][0].is_null());
    assert!(lp["token_logprobs"][1].as_f64().unwrap() <= 0.0);
    // One log line per request, with token counts.
    let log = server.log();
    assert!(
        log.lines()
            .any(|l| l.contains("POST /v1/chat/completions 200")
                && l.contains(" in=")
                && l.contains(" out=")),
        "{log}"
    );
}

/// `logit_bias` on both OpenAI endpoints. Oracles: -100 on the greedy token makes the
/// raw runner-up win (and its reported log-probability is still the raw one); +100 on a
/// token makes greedy decoding repeat it.
#[test]
fn logit_bias_bans_and_forces_tokens() {
    let server = start();
    let top2 = |bias: Value| {
        let body = with(
            chat("What is the capital of France?", 1),
            json!({"logprobs": true, "top_logprobs": 2, "logit_bias": bias}),
        );
        let r = server.post("/v1/chat/completions", &body);
        assert_eq!(r.status, 200, "{}", r.body);
        r.json()["choices"][0]["logprobs"]["content"][0].clone()
    };
    let token_id = |text: &str| {
        let ids = server.post("/tokenize", &json!({"content": text})).json()["tokens"].clone();
        assert_eq!(
            ids.as_array().unwrap().len(),
            1,
            "{text:?} is not one token: {ids}"
        );
        ids[0].as_u64().unwrap().to_string()
    };
    let plain = top2(json!({}));
    let (best, second) = (&plain["top_logprobs"][0], &plain["top_logprobs"][1]);
    assert_eq!(plain["token"], best["token"]);
    let best_id = token_id(best["token"].as_str().unwrap());
    let banned = top2(json!({best_id.clone(): -100}));
    assert_eq!(banned["token"], second["token"], "{banned}");
    assert_eq!(banned["logprob"], second["logprob"]);
    assert_eq!(banned["top_logprobs"], plain["top_logprobs"]);

    let second_text = second["token"].as_str().unwrap();
    let second_id = token_id(second_text);
    let forced = server
        .post(
            "/v1/chat/completions",
            &with(
                chat("What is the capital of France?", 3),
                json!({"logit_bias": {second_id.clone(): 100}}),
            ),
        )
        .json();
    assert_eq!(
        forced["choices"][0]["message"]["content"],
        second_text.repeat(3),
        "{forced}"
    );
    let comp = json!({"model": MODEL, "prompt": "The capital of France is", "max_tokens": 2,
        "temperature": 0, "logit_bias": {second_id: 100}});
    let forced = server.post("/v1/completions", &comp).json();
    assert_eq!(
        forced["choices"][0]["text"],
        second_text.repeat(2),
        "{forced}"
    );
}

/// The `bytes` of chat logprobs are each token's exact bytes, so a character the model
/// writes over several byte-level tokens (an emoji) is rebuilt by joining them, as OpenAI
/// documents. Regression: every partial token reported the bytes of U+FFFD instead.
/// Oracle: the joined bytes, decoded, are the message content; plain and streamed agree.
#[test]
fn chat_logprob_bytes_rebuild_characters_split_across_tokens() {
    let server = start();
    let body = with(
        chat("List 5 animal emojis", 24),
        json!({"logprobs": true, "top_logprobs": 2}),
    );
    let plain = server.post("/v1/chat/completions", &body).json();
    let content = plain["choices"][0]["message"]["content"].as_str().unwrap();
    println!("answer: {content:?}");
    assert!(
        content.chars().any(|c| c.len_utf8() == 4),
        "the check needs a 4-byte character in the answer: {content:?}"
    );
    let bytes = |v: &Value| -> Vec<u8> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|b| u8::try_from(b.as_u64().unwrap()).unwrap())
            .collect()
    };
    let items = plain["choices"][0]["logprobs"]["content"]
        .as_array()
        .unwrap();
    let joined: Vec<u8> = items.iter().flat_map(|i| bytes(&i["bytes"])).collect();
    assert_eq!(String::from_utf8_lossy(&joined), content);
    assert!(
        items
            .iter()
            .any(|i| std::str::from_utf8(&bytes(&i["bytes"])).is_err()),
        "no token split a character, so the check proves nothing: {items:?}"
    );
    // Greedy: the best alternative is the chosen token, bytes included.
    for i in items {
        assert_eq!(i["top_logprobs"][0]["bytes"], i["bytes"], "{i}");
    }
    let stream = server.post("/v1/chat/completions", &with(body, json!({"stream": true})));
    let (_, chunks) = chat_stream_text(&stream);
    let streamed: Vec<Value> = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["logprobs"]["content"].as_array())
        .flatten()
        .cloned()
        .collect();
    assert_eq!(&streamed, items);
}

#[test]
fn anthropic_messages_and_responses() {
    let server = start();
    let body = json!({"model": MODEL, "max_tokens": 10, "temperature": 0, "system": "You are terse.",
        "messages": [{"role": "user", "content": [{"type": "text", "text": "Name a color."}]}]});
    let plain = server.request(
        "POST",
        "/v1/messages",
        Some(&body.to_string()),
        &[("anthropic-version", "2023-06-01")],
    );
    assert_eq!(plain.status, 200, "{}", plain.body);
    let v = plain.json();
    let text = v["content"][0]["text"].as_str().unwrap().to_string();
    println!("messages answer: {text:?}");
    assert!(["end_turn", "max_tokens"].contains(&v["stop_reason"].as_str().unwrap()));
    let stream = server.post("/v1/messages", &with(body.clone(), json!({"stream": true})));
    let events = stream.events();
    let names: Vec<&str> = events.iter().map(|(n, _)| n.as_deref().unwrap()).collect();
    assert_eq!(
        &names[..3],
        ["message_start", "ping", "content_block_start"]
    );
    assert_eq!(
        &names[names.len() - 3..],
        ["content_block_stop", "message_delta", "message_stop"]
    );
    let streamed: String = events
        .iter()
        .filter(|(n, _)| n.as_deref() == Some("content_block_delta"))
        .map(|(_, d)| {
            serde_json::from_str::<Value>(d).unwrap()["delta"]["text"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    assert_eq!(streamed, text);
    let count = server
        .post(
            "/v1/messages/count_tokens",
            &json!({"model": MODEL, "system": "You are terse.",
        "messages": [{"role": "user", "content": "Name a color."}]}),
        )
        .json();
    let n = count["input_tokens"].as_u64().unwrap();
    assert_eq!(
        n,
        v["usage"]["input_tokens"].as_u64().unwrap()
            + v["usage"]["cache_read_input_tokens"].as_u64().unwrap()
    );
    let missing = server.post(
        "/v1/messages",
        &json!({"model": MODEL, "messages": [{"role": "user", "content": "x"}]}),
    );
    assert_eq!(missing.status, 400);
    assert_eq!(missing.json()["type"], "error");

    let resp = json!({"model": MODEL, "input": "Name a fruit.", "instructions": "Answer in one word.",
        "max_output_tokens": 8, "temperature": 0});
    let plain = server.post("/v1/responses", &resp);
    assert_eq!(plain.status, 200, "{}", plain.body);
    let v = plain.json();
    let text = v["output"][0]["content"][0]["text"]
        .as_str()
        .unwrap()
        .to_string();
    let stream = server.post("/v1/responses", &with(resp, json!({"stream": true})));
    let events = stream.events();
    assert_eq!(events[0].0.as_deref(), Some("response.created"));
    let last = events.last().unwrap().0.as_deref().unwrap();
    assert!(last == "response.completed" || last == "response.incomplete");
    let streamed: String = events
        .iter()
        .filter(|(n, _)| n.as_deref() == Some("response.output_text.delta"))
        .map(|(_, d)| {
            serde_json::from_str::<Value>(d).unwrap()["delta"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    assert_eq!(streamed, text);
    let tok = server
        .post("/tokenize", &json!({"content": "Hello world"}))
        .json();
    let ids = tok["tokens"].clone();
    assert!(!ids.as_array().unwrap().is_empty());
    let back = server.post("/detokenize", &json!({"tokens": ids})).json();
    assert_eq!(back["content"], "Hello world");
}

/// Eight different greedy prompts streamed at once give exactly their sequential answers,
/// and clients that disconnect mid-stream free their slots.
#[test]
fn concurrent_streams_match_sequential_and_disconnects_free_slots() {
    let server = start();
    // 32 streams over 4 slots: most wait in the queue, and every step batches the slots.
    let prompts: Vec<String> = (0..32)
        .map(|i| format!("Write one short sentence about the number {i}."))
        .collect();
    let sequential: Vec<String> = prompts
        .iter()
        .map(|p| {
            let v = server.post("/v1/chat/completions", &chat(p, 10)).json();
            v["choices"][0]["message"]["content"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    let concurrent: Vec<String> = std::thread::scope(|s| {
        let handles: Vec<_> = prompts
            .iter()
            .map(|p| {
                let server = &server;
                s.spawn(move || {
                    let r = server.post(
                        "/v1/chat/completions",
                        &with(chat(p, 10), json!({"stream": true})),
                    );
                    assert_eq!(r.status, 200, "{}", r.body);
                    chat_stream_text(&r).0
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (i, (a, b)) in sequential.iter().zip(&concurrent).enumerate() {
        assert_eq!(a, b, "prompt {i} differs under concurrency");
    }
    // Path marker: the concurrent requests really shared batched forward passes.
    assert!(metric(&server, "ferrite_batched_steps_total") > 0.0);
    assert!(
        sequential
            .iter()
            .collect::<std::collections::HashSet<_>>()
            .len()
            > 1,
        "prompts gave identical answers: {sequential:?}"
    );

    let sockets: Vec<_> = (0..6)
        .map(|i| {
            let body = with(
                chat(&format!("Count slowly from {i} to one thousand."), 400),
                json!({"stream": true}),
            );
            server.open_stream("/v1/chat/completions", &body, 200, &[])
        })
        .collect();
    // All four slots busy and two requests waiting before the clients go away.
    let deadline = Instant::now() + Duration::from_secs(60);
    while metric(&server, "ferrite_slots_active") < 4.0
        || metric(&server, "ferrite_queue_depth") < 2.0
    {
        assert!(
            Instant::now() < deadline,
            "streams never occupied the slots:\n{}",
            server.get("/metrics").body
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    drop(sockets);
    let deadline = Instant::now() + Duration::from_secs(60);
    while metric(&server, "ferrite_slots_active") > 0.0
        || metric(&server, "ferrite_queue_depth") > 0.0
    {
        assert!(
            Instant::now() < deadline,
            "slots not freed after disconnects:\n{}",
            server.get("/metrics").body
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(metric(&server, "ferrite_cancelled_requests_total") >= 6.0);
    let after = server
        .post("/v1/chat/completions", &chat(&prompts[0], 10))
        .json();
    assert_eq!(
        after["choices"][0]["message"]["content"],
        sequential[0].as_str()
    );
}

#[test]
fn q8_kv_cache_serves_batched_answers_equal_to_lone_ones() {
    let server = start_with(&["--kv", "q8"]);
    assert!(server.log().contains(" kv=q8"), "{}", server.log());
    let prompts: Vec<String> = (0..4)
        .map(|i| format!("Name a colour and the number {i}."))
        .collect();
    let answer = |r: &server_util::Reply| {
        assert_eq!(r.status, 200, "{}", r.body);
        r.json()["choices"][0]["message"]["content"]
            .as_str()
            .unwrap()
            .to_string()
    };
    let lone: Vec<String> = prompts
        .iter()
        .map(|p| answer(&server.post("/v1/chat/completions", &chat(p, 12))))
        .collect();
    let together: Vec<String> = std::thread::scope(|s| {
        let handles: Vec<_> = prompts
            .iter()
            .map(|p| {
                let server = &server;
                s.spawn(move || answer(&server.post("/v1/chat/completions", &chat(p, 12))))
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(lone, together);
    assert!(lone.iter().all(|a| !a.is_empty()));
    assert!(metric(&server, "ferrite_batched_steps_total") > 0.0);
}

#[test]
fn bad_input_and_api_key() {
    let model = common::pull(MODEL);
    let dir = tempfile::tempdir().unwrap();
    let key_file = dir.path().join("key");
    std::fs::write(&key_file, "k-123\n").unwrap();
    let server = Server::start(&[
        "-m",
        model.to_str().unwrap(),
        "--ctx",
        "256",
        "--parallel",
        "1",
        "--threads",
        "2",
        "--api-key-file",
        key_file.to_str().unwrap(),
        "--max-body-bytes",
        "4096",
        "--queue",
        "0",
    ]);
    let auth = [("authorization", "Bearer k-123")];
    let ok = chat("Hi", 2).to_string();
    assert_eq!(
        server
            .request("POST", "/v1/chat/completions", Some(&ok), &[])
            .status,
        401
    );
    assert_eq!(
        server
            .request(
                "POST",
                "/v1/chat/completions",
                Some(&ok),
                &[("authorization", "Bearer nope")]
            )
            .status,
        401
    );
    assert_eq!(
        server
            .request("POST", "/v1/messages", Some(&ok), &[])
            .json()["type"],
        "error"
    );
    let long = "word ".repeat(400);
    let cases = [
        (
            chat(&long, 4).to_string(),
            400,
            Some("context_length_exceeded"),
        ),
        ("{\"model\": ".to_string(), 400, None),
        (
            with(chat("Hi", 2), json!({"max_tokens": 1e300})).to_string(),
            400,
            None,
        ),
        (
            with(chat("Hi", 2), json!({"messages": []})).to_string(),
            400,
            None,
        ),
        (
            with(chat("Hi", 2), json!({"model": "other"})).to_string(),
            404,
            Some("model_not_found"),
        ),
        (
            with(chat("Hi", 2), json!({"pad": "x".repeat(5000)})).to_string(),
            413,
            None,
        ),
    ];
    // Each malformed `logit_bias` is refused, naming the field.
    let biases = [
        json!([1, 2]),
        json!({"abc": 1}),
        json!({"49152": 1}),
        json!({"-1": 1}),
        json!({"7": 100.5}),
        json!({"7": "1"}),
    ];
    // So is every output format but text, JSON objects and schemas the server enforces
    // (llguidance holds any schema it implements; `not` it does not).
    let formats = [
        json!("json_object"),
        json!({"type": "json_schema", "json_schema": {"name": "x", "schema": {"not": {}}}}),
        json!({"type": "json_schema", "json_schema": {"name": "x"}}),
        json!({"type": "json_schema", "json_schema": {"name": "x", "schema": "string"}}),
        json!({"type": "xml"}),
        json!({"schema": {}}),
    ];
    let cases = cases
        .into_iter()
        .chain(biases.into_iter().map(|b| {
            let body = with(chat("Hi", 2), json!({"logit_bias": b})).to_string();
            (body, 400, Some("invalid_value"))
        }))
        .chain(formats.into_iter().map(|f| {
            let body = with(chat("Hi", 2), json!({"response_format": f})).to_string();
            (body, 400, Some("invalid_value"))
        }));
    for (body, status, code) in cases {
        let r = server.request("POST", "/v1/chat/completions", Some(&body), &auth);
        assert_eq!(
            r.status,
            status,
            "{} -> {}",
            &body[..body.len().min(80)],
            r.body
        );
        let v = r.json();
        if let Some(code) = code {
            assert_eq!(v["error"]["code"], code, "{v}");
        }
        for param in ["logit_bias", "response_format"] {
            if body.contains(param) {
                assert_eq!(v["error"]["param"], param, "{v}");
            }
        }
        if code == Some("context_length_exceeded") {
            let msg = v["error"]["message"].as_str().unwrap();
            assert!(msg.contains("256"), "{msg}");
        }
        let good = server.request("POST", "/v1/chat/completions", Some(&ok), &auth);
        assert_eq!(good.status, 200, "after a bad request: {}", good.body);
    }
    let r = server.request(
        "POST",
        "/v1/messages",
        Some(
            &json!({"model": MODEL, "max_tokens": 2,
        "messages": [{"role": "user", "content": "Hi"}]})
            .to_string(),
        ),
        &[("x-api-key", "k-123")],
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let stops: Vec<String> = (0..17).map(|i| format!("s{i}")).collect();
    let r = server.request(
        "POST",
        "/v1/messages",
        Some(
            &json!({"model": MODEL, "max_tokens": 2, "stop_sequences": stops,
        "messages": [{"role": "user", "content": "Hi"}]})
            .to_string(),
        ),
        &[("x-api-key", "k-123")],
    );
    assert_eq!(r.status, 400, "{}", r.body);
    let v = r.json();
    assert_eq!(v["type"], "error", "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("at most 16 stop strings")),
        "{v}"
    );
    // One slot, no queue: while a stream holds the slot, another request gets 429.
    let held = server.open_stream(
        "/v1/chat/completions",
        &with(chat("Count to one hundred.", 200), json!({"stream": true})),
        200,
        &auth,
    );
    let busy = server.request("POST", "/v1/chat/completions", Some(&ok), &auth);
    assert_eq!(busy.status, 429, "{}", busy.body);
    assert_eq!(busy.json()["error"]["type"], "rate_limit_error");
    drop(held);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let r = server.request("POST", "/v1/chat/completions", Some(&ok), &auth);
        if r.status == 200 {
            break;
        }
        assert_eq!(r.status, 429, "{}", r.body);
        assert!(
            Instant::now() < deadline,
            "slot not freed after the stream was dropped"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(server.get("/health").status, 200);
}

/// `serve` arguments naming a model that does not exist, then `flags`.
fn without_model<'a>(flags: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec!["-m", "/nonexistent/model.gguf", "--port", "0"];
    args.extend(flags);
    args
}

/// Bad flags and unloadable models end the process with code 1 and a one-line reason,
/// never a panic or a server that stays up without a model.
#[test]
fn serve_rejects_bad_flags_and_models() {
    let dir = tempfile::tempdir().unwrap();
    let junk = dir.path().join("junk.gguf");
    std::fs::write(&junk, b"not a gguf file").unwrap();
    let missing_key = dir.path().join("no-key");
    let model = common::pull(MODEL);
    let model = model.to_str().unwrap();
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (
            vec!["-m", model, "--port", "0", "--parallel", "1000000"],
            "KV cache when full",
        ),
        // Checked before the model loads: without the check, the missing model would fail
        // with another message rather than leave a server running.
        (
            without_model(&["--kv-disk-dir", junk.to_str().unwrap()]),
            "is not a directory",
        ),
        (
            without_model(&["--kv-mem-space-mb", "1000000000"]),
            "more than this machine's memory",
        ),
        (
            without_model(&["--kv-mem-space-mb", "18446744073709551615"]),
            "--kv-mem-space-mb 18446744073709551615 is too large",
        ),
        (vec!["--parallel", "0"], "--parallel"),
        (vec!["--ctx", "4"], "--ctx"),
        (vec!["--api-key", ""], "--api-key"),
        (
            without_model(&["--cors-origin", "http://localhost:3000/"]),
            "--cors-origin: CORS origin \"http://localhost:3000/\"",
        ),
        (
            vec!["--api-key-file", missing_key.to_str().unwrap()],
            "API key file",
        ),
        (
            vec!["-m", "/nonexistent/model.gguf", "--port", "0"],
            "loading the model",
        ),
        (
            vec!["-m", junk.to_str().unwrap(), "--port", "0"],
            "loading the model",
        ),
    ];
    for (args, needle) in cases {
        let mut all = vec!["serve"];
        all.extend(&args);
        let out = common::run(&all);
        let text = common::text(&out);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {text}");
        assert!(text.contains(needle), "{args:?}: {text}");
        assert!(!text.contains("panicked"), "{args:?}: {text}");
    }
    // Thread counts outside what the CPU pool takes are usage errors (clap's exit code 2),
    // for every subcommand with `--threads`; 100,000 aborted the process before.
    for args in [
        ["serve", "-m", "/nonexistent/model.gguf", "--threads", "0"],
        [
            "serve",
            "-m",
            "/nonexistent/model.gguf",
            "--threads",
            "1025",
        ],
        [
            "run",
            "-m",
            "/nonexistent/model.gguf",
            "--threads",
            "100000",
        ],
        ["quantize", "--type", "q8_0", "--threads", "100000"],
    ] {
        let out = common::run(&args);
        let text = common::text(&out);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {text}");
        assert!(
            text.contains(&format!("{} is not in 1..=1024", args[4])),
            "{args:?}: {text}"
        );
    }
}

/// `serve --backend cuda` without a device fails clearly before loading anything (never a
/// panic, never a silent CPU fallback); with one it gets as far as the model, which does not
/// exist here.
#[test]
fn serve_on_cuda_without_a_device_fails_clearly() {
    let out = common::run(&[
        "serve",
        "--backend",
        "cuda",
        "-m",
        "/nonexistent/model.gguf",
        "--port",
        "0",
    ]);
    let text = common::text(&out);
    assert_eq!(out.status.code(), Some(1), "{text}");
    let want = match ferrite_cuda::CudaBackend::probe() {
        Ok(_) => "loading the model",
        Err(_) => "--backend cuda: no CUDA device: ",
    };
    assert!(text.contains(want), "{text}");
    assert!(!text.contains("panicked"), "{text}");
}

/// Read the data rows of a `bench serve` CSV receipt as column → value maps.
fn bench_rows(csv: &str) -> Vec<std::collections::HashMap<String, f64>> {
    let mut lines = csv.lines().filter(|l| !l.starts_with('#'));
    let header: Vec<&str> = lines.next().expect("csv header").split(',').collect();
    lines
        .map(|l| {
            header
                .iter()
                .zip(l.split(','))
                .map(|(k, v)| (k.to_string(), v.parse().expect("numeric cell")))
                .collect()
        })
        .collect()
}

#[test]
fn bench_serve_measures_every_level_and_counts_failures() {
    let server = start();
    let url = format!("http://{}", server.addr);
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("serve.csv");
    let out = common::run(&[
        "bench",
        "serve",
        "--url",
        &url,
        "--concurrency",
        "1,3",
        "--prompt-tokens",
        "24",
        "--max-tokens",
        "4",
        "--rounds",
        "1",
        "--csv",
        csv.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = std::fs::read_to_string(&csv).unwrap();
    assert!(text.contains(&format!("# model: {MODEL}")), "{text}");
    let rows = bench_rows(&text);
    assert_eq!(rows.len(), 2, "{text}");
    for (row, conc) in rows.iter().zip([1.0, 3.0]) {
        assert_eq!(row["concurrency"], conc);
        assert_eq!(row["requests"], conc);
        assert_eq!(row["errors"], 0.0);
        // The server's own count of the prompt: the request aims at about 24 tokens.
        assert!((12.0..=48.0).contains(&row["prompt_tokens_mean"]), "{text}");
        assert!(row["completion_tokens"] >= conc && row["completion_tokens"] <= 4.0 * conc);
        assert!(
            row["aggregate_tps"] > 0.0 && row["ttft_ms_p50"] > 0.0,
            "{text}"
        );
    }

    // A rejected request is a counted failure and a non-zero exit, never a silent zero.
    let out = common::run(&[
        "bench",
        "serve",
        "--url",
        &url,
        "--concurrency",
        "2",
        "--prompt-tokens",
        "8",
        "--max-tokens",
        "2",
        "--rounds",
        "1",
        "--model",
        "no-such-model",
    ]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("2 of 2 requests failed") && stderr.contains("HTTP 404"),
        "{stderr}"
    );

    // Nothing listening: a clear error line, exit 1.
    let out = common::run(&["bench", "serve", "--url", "http://127.0.0.1:9"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("error:"));
}

/// `--alias NAME` (repeatable) adds names a request's `model` may give; the answer names
/// the served model. Oracle: the same names are a 404 `model_not_found` on a server started
/// without the flag, so it is the flag that made them served.
#[test]
fn aliases_given_on_the_command_line_are_served_names() {
    let names = ["house-model", "my-bot"];
    let server = start_with(&["--alias", names[0], "--alias", names[1]]);
    let plain = start();
    for name in names {
        let body = with(chat("Hi", 2), json!({"model": name}));
        let r = server.post("/v1/chat/completions", &body);
        assert_eq!(r.status, 200, "{name}: {}", r.body);
        assert_eq!(r.json()["model"], MODEL, "{name}: {}", r.body);
        let r = plain.post("/v1/chat/completions", &body);
        assert_eq!(r.status, 404, "{name} without --alias: {}", r.body);
        assert_eq!(r.json()["error"]["code"], "model_not_found", "{}", r.body);
    }
    let r = server.post(
        "/v1/chat/completions",
        &with(chat("Hi", 2), json!({"model": "gpt-9"})),
    );
    assert_eq!(r.status, 404, "{}", r.body);
}
