//! End-to-end tests of held output with the real SmolLM2 on CPU: JSON mode, structured
//! outputs, differently held requests in one batch, and tool choices that force a call.

mod common;
mod server_util;

use ferrite_engine::grammar::Constraint;
use serde_json::{Value, json};
use server_util::{MODEL, Server, chat, chat_stream_text, metric, start, start_with, with};

/// Runs each chat of `prompts` (prompt, sampling fields) under `format` with `max_tokens`,
/// plain and streamed: an output that ended by itself must pass `whole`, one cut by the
/// token limit `prefix`, and the stream must give the plain text. Returns how many ended by
/// themselves.
fn constrained_chats(
    server: &Server,
    format: &Value,
    max_tokens: u32,
    prompts: &[(&str, Value)],
    whole: impl Fn(&str) -> bool,
    prefix: impl Fn(&str) -> bool,
) -> usize {
    let mut finished = 0;
    for (prompt, sampling) in prompts {
        let body = with(
            with(chat(prompt, max_tokens), format.clone()),
            sampling.clone(),
        );
        let r = server.post("/v1/chat/completions", &body);
        assert_eq!(r.status, 200, "{}", r.body);
        let v = r.json();
        let text = v["choices"][0]["message"]["content"].as_str().unwrap();
        match v["choices"][0]["finish_reason"].as_str().unwrap() {
            "stop" => {
                assert!(whole(text), "{text:?}");
                finished += 1;
            }
            "length" => assert!(prefix(text), "{text:?}"),
            other => panic!("finish {other}: {v}"),
        }
        let stream = server.post("/v1/chat/completions", &with(body, json!({"stream": true})));
        assert_eq!(chat_stream_text(&stream).0, text);
    }
    finished
}

/// JSON mode (`response_format` `json_object`, and `text.format` in responses). Oracles:
/// serde_json parses every output that ended by itself as one object; an output cut by the
/// token limit is still a prefix of one (the grammar's own check); streaming gives the
/// plain text.
#[test]
fn json_mode_holds_output_to_one_object() {
    let any_object = Constraint::json_object();
    let server = start();
    let object = |text: &str| {
        serde_json::from_str::<Value>(text)
            .unwrap_or_else(|e| panic!("{text:?}: {e}"))
            .is_object()
    };
    let json = json!({"response_format": {"type": "json_object"}});
    let prompts = [
        ("Give me a JSON object describing Paris.", json!({})),
        ("List three colors.", json!({})),
        ("Hi", json!({})),
        ("Describe a cat.", json!({"temperature": 1.0, "seed": 1})),
        (
            "Describe a cat.",
            json!({"temperature": 1.0, "seed": 2, "top_p": 0.9}),
        ),
    ];
    let finished = constrained_chats(&server, &json, 150, &prompts, object, |text| {
        any_object.admits_prefix(text.as_bytes())
    });
    assert!(
        finished >= 3,
        "only {finished} of 5 outputs closed their object"
    );
    let comp = json!({"model": MODEL, "prompt": "A person, as JSON:", "max_tokens": 150,
        "temperature": 0, "response_format": {"type": "json_object"}});
    let v = server.post("/v1/completions", &comp).json();
    assert_eq!(v["choices"][0]["finish_reason"], "stop", "{v}");
    assert!(object(v["choices"][0]["text"].as_str().unwrap()), "{v}");
    let resp = json!({"model": MODEL, "input": "Describe a dog as JSON.", "max_output_tokens": 150,
        "temperature": 0, "text": {"format": {"type": "json_object"}}});
    let v = server.post("/v1/responses", &resp).json();
    assert_eq!(v["text"]["format"]["type"], "json_object", "{v}");
    assert_eq!(v["status"], "completed", "{v}");
    assert!(
        object(v["output"][0]["content"][0]["text"].as_str().unwrap()),
        "{v}"
    );
}

/// A person's schema for the structured-output test, and a check of a value against it
/// written from the schema by hand: exactly its keys, in its order, of its types.
fn person_schema() -> Value {
    json!({"type": "object", "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer"},
        "hobbies": {"type": "array", "items": {"type": "string"}, "maxItems": 3},
        "mood": {"enum": ["happy", "sad"]}
    }, "required": ["name", "age", "hobbies", "mood"], "additionalProperties": false})
}

fn is_person(text: &str) -> bool {
    let Ok(Value::Object(v)) = serde_json::from_str::<Value>(text) else {
        return false;
    };
    let keys: Vec<&str> = v.keys().map(String::as_str).collect();
    keys == ["name", "age", "hobbies", "mood"]
        && v["name"].is_string()
        && (v["age"].is_i64() || v["age"].is_u64())
        && v["hobbies"]
            .as_array()
            .is_some_and(|h| h.len() <= 3 && h.iter().all(Value::is_string))
        && (v["mood"] == "happy" || v["mood"] == "sad")
}

/// Structured outputs (`response_format` `json_schema`; `text.format` in responses, echoed).
/// Oracles: [`is_person`] on every output that ended by itself; the schema grammar's own
/// check on outputs cut by the token limit; streaming gives the plain text; a schema the
/// server cannot enforce is refused with the parameter named.
#[test]
fn json_schema_holds_output_to_the_schema() {
    let server = start();
    let compiled = Constraint::json_schema(&person_schema()).unwrap();
    let format = json!({"response_format": {"type": "json_schema",
        "json_schema": {"name": "person", "strict": true, "schema": person_schema()}}});
    let prompts = [
        ("Describe a person named Ada who is 36, as JSON.", json!({})),
        ("Hi", json!({})),
        (
            "Tell me about a sailor.",
            json!({"temperature": 1.0, "seed": 1}),
        ),
        (
            "Tell me about a sailor.",
            json!({"temperature": 0.9, "seed": 2, "top_p": 0.9}),
        ),
    ];
    let finished = constrained_chats(&server, &format, 120, &prompts, is_person, |text| {
        compiled.admits_prefix(text.as_bytes())
    });
    assert!(finished >= 2, "only {finished} of 4 outputs were whole");
    let comp = with(
        json!({"model": MODEL, "prompt": "A person, as JSON:", "max_tokens": 120, "temperature": 0}),
        format,
    );
    let v = server.post("/v1/completions", &comp).json();
    assert_eq!(v["choices"][0]["finish_reason"], "stop", "{v}");
    assert!(is_person(v["choices"][0]["text"].as_str().unwrap()), "{v}");
    let text_format = json!({"type": "json_schema", "name": "person", "schema": person_schema()});
    let resp = json!({"model": MODEL, "input": "Describe a person as JSON.", "max_output_tokens": 120,
        "temperature": 0, "text": {"format": text_format}});
    let v = server.post("/v1/responses", &resp).json();
    assert_eq!(v["text"]["format"], text_format, "{v}");
    assert_eq!(v["status"], "completed", "{v}");
    assert!(
        is_person(v["output"][0]["content"][0]["text"].as_str().unwrap()),
        "{v}"
    );
    // Values the schema leaves open: a map of strings, and anything at all.
    let open = json!({"type": "object", "properties": {
        "name": {"type": "string"},
        "traits": {"type": "object", "additionalProperties": {"type": "string"}},
        "notes": {}
    }, "required": ["name", "traits", "notes"]});
    let open_compiled = Constraint::json_schema(&open).unwrap();
    let comp = json!({"model": MODEL, "prompt": "A cat, as JSON:", "max_tokens": 120, "temperature": 0,
        "response_format": {"type": "json_schema", "json_schema": {"name": "cat", "schema": open}}});
    let v = server.post("/v1/completions", &comp).json();
    let text = v["choices"][0]["text"].as_str().unwrap();
    assert!(open_compiled.admits_prefix(text.as_bytes()), "{v}");
    if v["choices"][0]["finish_reason"] == "stop" {
        let cat: Value = serde_json::from_str(text).unwrap();
        let keys: Vec<&str> = cat
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        assert_eq!(keys, ["name", "traits", "notes"], "{v}");
        assert!(cat["name"].is_string(), "{v}");
        assert!(
            cat["traits"]
                .as_object()
                .unwrap()
                .values()
                .all(Value::is_string),
            "{v}"
        );
    }
    let unsupported = json!({"type": "json_schema", "name": "x",
        "schema": {"type": "object", "properties": {"a": {"type": "array", "uniqueItems": true}}}});
    let r = server.post(
        "/v1/responses",
        &with(resp, json!({"text": {"format": unsupported}})),
    );
    assert_eq!(r.status, 400, "{}", r.body);
    let e = r.json();
    assert_eq!(e["error"]["param"], "text.format", "{e}");
    assert!(
        e["error"]["message"]
            .as_str()
            .unwrap()
            .contains("\"uniqueItems\""),
        "{e}"
    );
}

/// Requests held to different formats (free text, JSON mode, two schemas) batched together
/// keep their own grammars. Oracle: each greedy output equals the same request run alone,
/// and every whole output fits its own format.
#[test]
fn differently_constrained_requests_in_one_batch_keep_their_own_formats() {
    let server = start();
    let color = json!({"type": "object", "properties": {
        "color": {"enum": ["red", "green", "blue"]}, "count": {"type": "integer"}},
        "required": ["color", "count"]});
    let schema = |s: &Value| json!({"response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": s}}});
    let formats = [
        json!({}),
        json!({"response_format": {"type": "json_object"}}),
        schema(&person_schema()),
        schema(&color),
    ];
    let bodies: Vec<Value> = (0..8)
        .map(|i| {
            with(
                chat(&format!("Tell me about thing number {i}, as JSON."), 80),
                formats[i % 4].clone(),
            )
        })
        .collect();
    let text = |v: &Value| {
        v["choices"][0]["message"]["content"]
            .as_str()
            .unwrap()
            .to_string()
    };
    let alone: Vec<Value> = bodies
        .iter()
        .map(|b| server.post("/v1/chat/completions", b).json())
        .collect();
    let batched_before = metric(&server, "ferrite_batched_steps_total");
    let together: Vec<Value> = std::thread::scope(|s| {
        let handles: Vec<_> = bodies
            .iter()
            .map(|b| s.spawn(|| server.post("/v1/chat/completions", b).json()))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert!(metric(&server, "ferrite_batched_steps_total") > batched_before);
    let mut whole = 0;
    for (i, (a, b)) in alone.iter().zip(&together).enumerate() {
        assert_eq!(text(a), text(b), "request {i} differs when batched");
        if a["choices"][0]["finish_reason"] != "stop" {
            continue;
        }
        whole += usize::from(i % 4 != 0);
        let t = text(a);
        let fits = match i % 4 {
            0 => true,
            1 => serde_json::from_str::<Value>(&t).is_ok_and(|v| v.is_object()),
            2 => is_person(&t),
            _ => serde_json::from_str::<Value>(&t).is_ok_and(|v| {
                let keys: Vec<&String> = v
                    .as_object()
                    .map(|o| o.keys().collect())
                    .unwrap_or_default();
                keys == ["color", "count"]
                    && ["red", "green", "blue"].contains(&v["color"].as_str().unwrap_or(""))
                    && (v["count"].is_i64() || v["count"].is_u64())
            }),
        };
        assert!(fits, "request {i}: {t:?}");
    }
    assert!(
        whole >= 3,
        "only {whole} of 6 constrained outputs were whole"
    );
}

/// The weather tool of the tool-choice test, in OpenAI's shape.
fn weather_tool() -> Value {
    json!({"type": "function", "function": {"name": "get_weather",
        "description": "The current weather in a city",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string"}, "unit": {"enum": ["c", "f"]}}, "required": ["city"]}}})
}

/// Whether `args` fit the weather tool's parameters (a check written from the schema).
fn weather_args(args: &Value) -> bool {
    let Some(o) = args.as_object() else {
        return false;
    };
    o.keys().all(|k| k == "city" || k == "unit")
        && o.get("city").is_some_and(Value::is_string)
        && o.get("unit").is_none_or(|u| u == "c" || u == "f")
}

/// `tool_choice` naming a tool (OpenAI chat and responses, Anthropic's `"tool"`) makes the
/// answer a call of that tool whose arguments fit its parameters, plain and streamed;
/// `"required"` a call of one of the tools, with that tool's parameters; a name that is not
/// among the tools is refused. Oracles: [`weather_args`], and a check of the clock's.
#[test]
fn tool_choice_forces_a_call_held_to_the_tools_parameters() {
    let server = start();
    let clock = json!({"type": "function", "function": {"name": "get_time", "parameters": {
        "type": "object", "properties": {"tz": {"type": "string"}}, "required": ["tz"],
        "additionalProperties": false}}});
    let body = with(
        chat("Is it raining in Paris?", 80),
        json!({"tools": [clock, weather_tool()],
            "tool_choice": {"type": "function", "function": {"name": "get_weather"}}}),
    );
    let v = server.post("/v1/chat/completions", &body).json();
    let choice = &v["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls", "{v}");
    let call = &choice["message"]["tool_calls"][0]["function"];
    assert_eq!(call["name"], "get_weather", "{v}");
    let args: Value = serde_json::from_str(call["arguments"].as_str().unwrap()).unwrap();
    assert!(weather_args(&args), "{v}");
    // Streamed: the same call, in tool_calls deltas.
    let stream = server.post(
        "/v1/chat/completions",
        &with(body.clone(), json!({"stream": true})),
    );
    let (text, chunks) = chat_stream_text(&stream);
    assert_eq!(text, "", "{}", stream.body);
    // Arguments stream as they are generated: the deltas joined are the plain call.
    let (mut name, mut args) = (String::new(), String::new());
    for f in chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["tool_calls"][0].get("function"))
    {
        name += f["name"].as_str().unwrap_or("");
        args += f["arguments"].as_str().unwrap_or("");
    }
    assert_eq!(name, call["name"], "{}", stream.body);
    assert_eq!(args, call["arguments"], "{}", stream.body);
    // Responses: the name beside the type; one function call item.
    let resp = json!({"model": MODEL, "input": "Is it raining in Paris?", "max_output_tokens": 80,
        "temperature": 0, "tools": [{"type": "function", "name": "get_weather",
            "parameters": weather_tool()["function"]["parameters"]}],
        "tool_choice": {"type": "function", "name": "get_weather"}});
    let v = server.post("/v1/responses", &resp).json();
    let item = &v["output"][0];
    assert_eq!(item["type"], "function_call", "{v}");
    assert_eq!(item["name"], "get_weather", "{v}");
    let args: Value = serde_json::from_str(item["arguments"].as_str().unwrap()).unwrap();
    assert!(weather_args(&args), "{v}");
    // Anthropic: a tool_use block of the named tool.
    let msg = json!({"model": MODEL, "max_tokens": 80, "temperature": 0,
        "messages": [{"role": "user", "content": "Is it raining in Paris?"}],
        "tools": [{"name": "get_weather", "input_schema": weather_tool()["function"]["parameters"]}],
        "tool_choice": {"type": "tool", "name": "get_weather"}});
    let v = server.post("/v1/messages", &msg).json();
    assert_eq!(v["stop_reason"], "tool_use", "{v}");
    let block = v["content"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["type"] == "tool_use")
        .unwrap_or_else(|| panic!("{v}"));
    assert_eq!(block["name"], "get_weather", "{v}");
    assert!(weather_args(&block["input"]), "{v}");
    // Required: either tool, held to its own parameters.
    for prompt in ["Is it raining in Paris?", "What time is it in Tokyo?"] {
        let body = with(
            chat(prompt, 80),
            json!({"tools": [clock, weather_tool()], "tool_choice": "required"}),
        );
        let v = server.post("/v1/chat/completions", &body).json();
        assert_eq!(v["choices"][0]["finish_reason"], "tool_calls", "{v}");
        let call = &v["choices"][0]["message"]["tool_calls"][0]["function"];
        let args: Value = serde_json::from_str(call["arguments"].as_str().unwrap()).unwrap();
        let fits = match call["name"].as_str() {
            Some("get_weather") => weather_args(&args),
            Some("get_time") => {
                args.as_object().is_some_and(|o| o.len() == 1) && args["tz"].is_string()
            }
            _ => false,
        };
        assert!(fits, "{v}");
    }
    // A name that is not offered.
    let r = server.post(
        "/v1/chat/completions",
        &with(
            body,
            json!({"tool_choice": {"type": "function", "function": {"name": "nope"}}}),
        ),
    );
    assert_eq!(r.status, 400, "{}", r.body);
    assert_eq!(r.json()["error"]["param"], "tool_choice");
}

/// A forced call is written in the model's own marked-up syntax (Qwen3-Coder XML, GLM 4.5,
/// DeepSeek V3/R1), here forced by `--tool-syntax` on SmolLM2 whose template shows none of
/// them: the grammar makes the model write that markup (DeepSeek's markers as text, since
/// SmolLM2's vocabulary holds none of them as a control token), and the parser of that
/// syntax reads it back, plain and streamed. Oracles: [`weather_args`], the streamed
/// deltas joined equal to the plain call, more deltas than whole parameters would give
/// (arguments stream as generated), and no markup left in the content.
#[test]
fn forced_calls_in_marked_up_syntaxes_parse_back_plain_and_streamed() {
    for syntax in ["qwen3coder", "glm45", "deepseek"] {
        let server = start_with(&["--tool-syntax", syntax]);
        let body = with(
            // Unfamiliar markup comes a few bytes a token: room for it.
            chat("Is it raining in Paris?", 240),
            json!({"tools": [weather_tool()], "tool_choice": "required"}),
        );
        let v = server.post("/v1/chat/completions", &body).json();
        let choice = &v["choices"][0];
        assert_eq!(choice["finish_reason"], "tool_calls", "{syntax}: {v}");
        assert!(choice["message"]["content"].is_null(), "{syntax}: {v}");
        let call = &choice["message"]["tool_calls"][0]["function"];
        assert_eq!(call["name"], "get_weather", "{syntax}: {v}");
        let args: Value = serde_json::from_str(call["arguments"].as_str().unwrap()).unwrap();
        assert!(weather_args(&args), "{syntax}: {v}");
        let stream = server.post(
            "/v1/chat/completions",
            &with(body.clone(), json!({"stream": true})),
        );
        let (text, chunks) = chat_stream_text(&stream);
        assert_eq!(text, "", "{syntax}: {}", stream.body);
        let pieces: Vec<&str> = chunks
            .iter()
            .filter_map(|c| c["choices"][0]["delta"]["tool_calls"][0].get("function"))
            .filter_map(|f| f["arguments"].as_str())
            .collect();
        assert_eq!(
            pieces.concat(),
            call["arguments"],
            "{syntax}: {}",
            stream.body
        );
        // Streamed as generated: more pieces than one per parameter and one to close.
        let params = args.as_object().map_or(0, |o| o.len());
        assert!(
            pieces.len() > params + 1,
            "{syntax}: {} pieces for {params} parameters: {pieces:?}",
            pieces.len()
        );
        println!("{syntax}: {} in {} pieces", call["arguments"], pieces.len());
    }
}

/// The JSON Schema keywords the hand-written grammar refused, now held through llguidance:
/// `pattern`, `minLength`, `format` and `minimum`. Oracle: each greedy SmolLM2 answer that
/// ended by itself is checked against each keyword's rule, written here by hand.
#[test]
fn pattern_min_length_format_and_minimum_hold_on_the_real_model() {
    let server = start();
    let schema = json!({"type": "object", "properties": {
        "code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{2}$"},
        "name": {"type": "string", "minLength": 4, "maxLength": 24},
        "born": {"type": "string", "format": "date"},
        "age": {"type": "integer", "minimum": 18, "maximum": 120}
    }, "required": ["code", "name", "born", "age"], "additionalProperties": false});
    let valid = |text: &str| -> bool {
        let Ok(v) = serde_json::from_str::<Value>(text) else {
            return false;
        };
        let code = v["code"].as_str().unwrap_or("").as_bytes();
        let name = v["name"].as_str().unwrap_or("");
        let born = v["born"].as_str().unwrap_or("").as_bytes();
        code.len() == 6
            && code[..3].iter().all(u8::is_ascii_uppercase)
            && code[3] == b'-'
            && code[4..].iter().all(u8::is_ascii_digit)
            && (4..=24).contains(&name.chars().count())
            && born.len() == 10
            && born
                .iter()
                .enumerate()
                .all(|(i, b)| [4, 7].contains(&i) == (*b == b'-'))
            && v["age"].as_i64().is_some_and(|a| (18..=120).contains(&a))
    };
    let format = json!({"response_format": {"type": "json_schema",
        "json_schema": {"name": "person", "strict": true, "schema": schema}}});
    let prompts = [
        "Describe a person as JSON.",
        "Hi",
        "Who is a child of five?",
    ];
    for prompt in prompts {
        let v = server
            .post(
                "/v1/chat/completions",
                &with(chat(prompt, 160), format.clone()),
            )
            .json();
        let text = v["choices"][0]["message"]["content"].as_str().unwrap();
        assert_eq!(v["choices"][0]["finish_reason"], "stop", "{v}");
        assert!(valid(text), "{prompt}: {text}");
    }
}

/// The extension fields, each on a different endpoint (and `json_schema` on all four), on
/// the real model. Oracle: llguidance's own check of the whole answer, and a hand check.
#[test]
fn extension_fields_hold_output_on_every_endpoint() {
    let server = start();
    let digits = |t: &str| t.len() == 5 && t.bytes().all(|b| b.is_ascii_digit());
    let comp = json!({"model": MODEL, "prompt": "A zip code:", "max_tokens": 20, "temperature": 0,
        "structured_outputs": {"regex": "[0-9]{5}"}});
    let v = server.post("/v1/completions", &comp).json();
    assert!(digits(v["choices"][0]["text"].as_str().unwrap()), "{v}");
    let msg = json!({"model": MODEL, "max_tokens": 20, "temperature": 0,
        "messages": [{"role": "user", "content": "Is the sky green?"}],
        "guided_regex": "(yes|no)"});
    let v = server.post("/v1/messages", &msg).json();
    let answer = v["content"][0]["text"].as_str().unwrap();
    assert!(answer == "yes" || answer == "no", "{v}");
    let resp = json!({"model": MODEL, "input": "Pick a color.", "max_output_tokens": 20,
        "temperature": 0, "grammar": "start: \"red\" | \"green\" | \"blue\""});
    let v = server.post("/v1/responses", &resp).json();
    let color = v["output"][0]["content"][0]["text"].as_str().unwrap();
    assert!(["red", "green", "blue"].contains(&color), "{v}");
    let v = server
        .post(
            "/v1/chat/completions",
            &with(
                chat("Pick one.", 20),
                json!({"guided_grammar":
            "start: \"left\" | \"right\""}),
            ),
        )
        .json();
    let side = v["choices"][0]["message"]["content"].as_str().unwrap();
    assert!(side == "left" || side == "right", "{v}");
    let pet = json!({"type": "object", "properties": {"pet": {"enum": ["cat", "dog"]}},
        "required": ["pet"], "additionalProperties": false});
    let held = Constraint::json_schema(&pet).unwrap();
    let bodies = [
        (
            "/v1/chat/completions",
            with(chat("A pet?", 30), json!({"json_schema": pet})),
        ),
        (
            "/v1/completions",
            json!({"model": MODEL, "prompt": "A pet:", "max_tokens": 30,
            "temperature": 0, "guided_json": pet}),
        ),
        (
            "/v1/messages",
            json!({"model": MODEL, "max_tokens": 30, "temperature": 0,
            "messages": [{"role": "user", "content": "A pet?"}], "structured_outputs": {"json": pet}}),
        ),
        (
            "/v1/responses",
            json!({"model": MODEL, "input": "A pet?", "max_output_tokens": 30,
            "temperature": 0, "json_schema": pet}),
        ),
    ];
    for (path, body) in bodies {
        let v = server.post(path, &body).json();
        let text = v
            .pointer("/choices/0/message/content")
            .or_else(|| v.pointer("/choices/0/text"))
            .or_else(|| v.pointer("/content/0/text"))
            .or_else(|| v.pointer("/output/0/content/0/text"))
            .and_then(Value::as_str)
            .unwrap_or_else(|| panic!("{path}: {v}"));
        assert!(held.accepts(text.as_bytes()), "{path}: {text}");
    }
    // Refused by name on an endpoint whose own API has no such field.
    let r = server.post(
        "/v1/messages",
        &with(
            msg,
            json!({"guided_regex": null,
        "json_schema": {"type": "array", "uniqueItems": true}}),
        ),
    );
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(r.body.contains("uniqueItems"), "{}", r.body);
}

/// `--reasoning-format` on `ferrite serve`: a regex makes SmolLM2 open its answer with a
/// `<think>` block. Under the default (`auto`, read as `think`: SmolLM2's template shows no
/// harmony channels) the block is `reasoning_content` and never content; under `none` it is
/// left in the content as written, plain and streamed. The default server is the control:
/// same request, same greedy text.
#[test]
fn reasoning_format_on_serve_decides_whether_think_blocks_are_reasoning() {
    let body = with(
        chat("Where is Paris?", 40),
        json!({"structured_outputs": {"regex": "<think>[a-z]{2,12}</think>[A-Z][a-z ]{2,20}"}}),
    );
    let mut texts = Vec::new();
    for flags in [&[][..], &["--reasoning-format", "none"][..]] {
        let server = start_with(flags);
        let v = server.post("/v1/chat/completions", &body).json();
        let m = &v["choices"][0]["message"];
        let content = m["content"].as_str().unwrap_or_else(|| panic!("{v}"));
        let reasoning = m["reasoning_content"].as_str().unwrap_or("");
        let stream = server.post(
            "/v1/chat/completions",
            &with(body.clone(), json!({"stream": true})),
        );
        let (streamed, chunks) = chat_stream_text(&stream);
        assert_eq!(streamed, content, "{flags:?}: {}", stream.body);
        let streamed_reasoning: String = chunks
            .iter()
            .filter_map(|c| c["choices"][0]["delta"]["reasoning_content"].as_str())
            .collect();
        assert_eq!(streamed_reasoning, reasoning, "{flags:?}");
        if flags.is_empty() {
            assert!(!reasoning.is_empty(), "default: {v}");
            assert!(!content.contains("think>"), "default: {v}");
            texts.push(format!("<think>{reasoning}</think>{content}"));
        } else {
            assert_eq!(reasoning, "", "none: {v}");
            assert!(content.starts_with("<think>"), "none: {v}");
            assert!(content.contains("</think>"), "none: {v}");
            texts.push(content.to_string());
        }
        println!("{flags:?}: reasoning {reasoning:?}, content {content:?}");
    }
    // Both read the same output: only where its think block went differs.
    assert_eq!(texts[0], texts[1]);
}
