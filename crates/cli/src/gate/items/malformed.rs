//! Item `http-malformed`: malformed requests of every class the release seeds name (bad
//! JSON, a body that is not an object, wrong types, missing and repeated fields, huge
//! values, over-context prompts, unknown models, a form-encoded body, invalid UTF-8, a
//! truncated body, a body over the limit, wrong methods, unknown routes) sent to every
//! endpoint class of the real server stack, each followed by a good request to the same
//! endpoint.
//!
//! The oracle: every malformed request is answered 4xx with the API's JSON error shape and
//! a message (naming the field where one is at fault); never 5xx, never a dropped
//! connection; the good request after it is answered 200 in the endpoint's shape. It is
//! first run against stub servers that answer 500, drop the connection, refuse everything
//! or accept everything, and must judge every case failed on each.
//!
//! The endpoint table is shared with `json-nonfinite`; nothing here may depend on the
//! model's output beyond its shape.

use std::collections::BTreeMap;
use std::net::SocketAddr;

use serde_json::{Value, json};

use super::http::{self, JSON, MAX_BODY, MODEL_ID, Reply, Stub, StubMode};
use super::{Env, Outcome, Proof, Target};

/// One endpoint class and a request it must serve.
pub struct Endpoint {
    /// Route.
    pub path: &'static str,
    /// Answers in Anthropic's error shape.
    pub anthropic: bool,
    /// Needs the model's chat template.
    pub chat: bool,
    /// Generates tokens (takes a model, a prompt that must fit the context).
    pub generates: bool,
    /// A good request.
    pub good: Value,
    /// A field the endpoint requires.
    pub required: &'static str,
    /// A field and a value of the wrong type.
    pub wrong_type: (&'static str, Value),
    /// A field and a value too large for it.
    pub huge: Option<(&'static str, Value)>,
    /// The good body with an over-context prompt.
    pub over_context: Option<Value>,
}

fn chat_messages(text: &str) -> Value {
    json!([{"role": "user", "content": text}])
}

/// The endpoint classes of the API (there is no embeddings endpoint: `/v1/embeddings` is
/// one of the unknown routes).
pub fn endpoints() -> Vec<Endpoint> {
    let long = "go ".repeat(3000);
    let chat = |text: &str| {
        json!({"model": MODEL_ID, "messages": chat_messages(text), "max_tokens": 1,
            "temperature": 0})
    };
    let completion =
        |text: &str| json!({"model": MODEL_ID, "prompt": text, "max_tokens": 1, "temperature": 0});
    let response = |text: &str| json!({"model": MODEL_ID, "input": text, "max_output_tokens": 1, "temperature": 0});
    let message = |text: &str| {
        json!({"model": MODEL_ID, "max_tokens": 1, "temperature": 0,
            "messages": chat_messages(text)})
    };
    vec![
        Endpoint {
            path: "/v1/chat/completions",
            anthropic: false,
            chat: true,
            generates: true,
            good: chat("Say hi."),
            required: "messages",
            wrong_type: ("messages", json!("hi")),
            huge: Some(("max_tokens", json!(u64::MAX))),
            over_context: Some(chat(&long)),
        },
        Endpoint {
            path: "/v1/completions",
            anthropic: false,
            chat: false,
            generates: true,
            good: completion("Hello"),
            required: "prompt",
            wrong_type: ("prompt", json!({"text": "Hello"})),
            huge: Some(("max_tokens", json!(u64::MAX))),
            over_context: Some(completion(&long)),
        },
        Endpoint {
            path: "/v1/responses",
            anthropic: false,
            chat: true,
            generates: true,
            good: response("Say hi."),
            required: "input",
            wrong_type: ("input", json!(5)),
            huge: Some(("max_output_tokens", json!(u64::MAX))),
            over_context: Some(response(&long)),
        },
        Endpoint {
            path: "/v1/messages",
            anthropic: true,
            chat: true,
            generates: true,
            good: message("Say hi."),
            required: "max_tokens",
            wrong_type: ("messages", json!({"role": "user"})),
            huge: Some(("max_tokens", json!(u64::MAX))),
            over_context: Some(message(&long)),
        },
        Endpoint {
            path: "/v1/messages/count_tokens",
            anthropic: true,
            chat: true,
            generates: false,
            good: json!({"model": MODEL_ID, "messages": chat_messages("Say hi.")}),
            required: "messages",
            wrong_type: ("messages", json!(5)),
            huge: None,
            over_context: None,
        },
        Endpoint {
            path: "/tokenize",
            anthropic: false,
            chat: false,
            generates: false,
            good: json!({"content": "Hello world"}),
            required: "content",
            wrong_type: ("content", json!(5)),
            huge: None,
            over_context: None,
        },
        Endpoint {
            path: "/detokenize",
            anthropic: false,
            chat: false,
            generates: false,
            good: json!({"tokens": [1, 2, 3]}),
            required: "tokens",
            wrong_type: ("tokens", json!({"a": 1})),
            huge: Some(("tokens", json!([u64::MAX]))),
            over_context: None,
        },
    ]
}

/// The endpoints a model can serve: those needing a chat template only when it has one.
pub fn served(has_template: bool) -> Vec<Endpoint> {
    endpoints()
        .into_iter()
        .filter(|e| has_template || !e.chat)
        .collect()
}

/// Whether a good answer of `path` has the endpoint's shape.
pub fn good_shape(path: &str, v: &Value) -> bool {
    match path {
        "/v1/chat/completions" => v["choices"][0]["message"].is_object(),
        "/v1/completions" => v["choices"][0]["text"].is_string(),
        "/v1/responses" => v["output"].is_array() && v["status"].is_string(),
        "/v1/messages" => v["content"].is_array() && v["type"] == "message",
        "/v1/messages/count_tokens" => v["input_tokens"].is_u64(),
        "/tokenize" => v["tokens"].as_array().is_some_and(|t| !t.is_empty()),
        "/detokenize" => v["content"].is_string(),
        "/v1/models" => v["data"][0]["id"] == MODEL_ID,
        _ => false,
    }
}

/// `None` when `reply` is a 4xx in the API's error shape with a message (mentioning
/// `field` when given); else what is wrong.
pub fn refusal_problem(
    reply: &anyhow::Result<Reply>,
    anthropic: bool,
    field: Option<&str>,
) -> Option<String> {
    let r = match reply {
        Ok(r) => r,
        Err(e) => return Some(format!("no answer: {e:#}")),
    };
    if !(400..500).contains(&r.status) {
        return Some(format!("answered {}: {}", r.status, r.excerpt()));
    }
    let json_type = r
        .headers
        .to_ascii_lowercase()
        .contains("content-type: application/json");
    let Some(v) = r.json().filter(|_| json_type) else {
        return Some(format!("{} without a JSON body: {}", r.status, r.excerpt()));
    };
    let shaped = if anthropic {
        v["type"] == "error" && v["error"]["type"].is_string()
    } else {
        v["error"]["type"].is_string()
    };
    let message = v["error"]["message"].as_str().unwrap_or("");
    if !shaped || message.is_empty() {
        return Some(format!("{} not in the API's error shape: {v}", r.status));
    }
    match field {
        Some(f) if !message.contains(f) && v["error"]["param"] != f => {
            Some(format!("{} does not name '{f}': {message}", r.status))
        }
        _ => None,
    }
}

/// `None` when `reply` is a 200 of `path`'s shape.
pub fn good_problem(reply: &anyhow::Result<Reply>, path: &str) -> Option<String> {
    match reply {
        Err(e) => Some(format!("good request: no answer: {e:#}")),
        Ok(r) if r.status != 200 => Some(format!(
            "good request answered {}: {}",
            r.status,
            r.excerpt()
        )),
        Ok(r) if !r.json().is_some_and(|v| good_shape(path, &v)) => {
            Some(format!("good request: not {path}'s shape: {}", r.excerpt()))
        }
        Ok(_) => None,
    }
}

/// A malformed request.
struct Case {
    class: &'static str,
    path: &'static str,
    anthropic: bool,
    raw: Vec<u8>,
    /// Shut the sending side after `raw` (the client died mid-body).
    half_close: bool,
    /// The field the error must name.
    field: Option<&'static str>,
    /// The good request that follows: (path, body).
    follow: (&'static str, Value),
}

fn set(body: &Value, key: &str, value: Value) -> Value {
    let mut b = body.clone();
    b[key] = value;
    b
}

fn without(body: &Value, key: &str) -> Value {
    let mut b = body.clone();
    if let Some(o) = b.as_object_mut() {
        o.remove(key);
    }
    b
}

/// `body`'s JSON text with `"key": value` appended as a second occurrence of `key`.
fn repeated(body: &Value, key: &str, value: &Value) -> Vec<u8> {
    let text = body.to_string();
    let open = text.strip_suffix('}').unwrap_or(&text);
    format!("{open},\"{key}\":{value}}}").into_bytes()
}

fn cases(eps: &[Endpoint], follow_completions: bool) -> Vec<Case> {
    let completions = endpoints()
        .into_iter()
        .find(|e| e.path == "/v1/completions")
        .map(|e| e.good)
        .unwrap_or_default();
    let mut out = Vec::new();
    for ep in eps {
        let follow = if follow_completions && ep.chat {
            ("/v1/completions", completions.clone())
        } else {
            (ep.path, ep.good.clone())
        };
        let mut add = |class, raw, half_close, field| {
            out.push(Case {
                class,
                path: ep.path,
                anthropic: ep.anthropic,
                raw,
                half_close,
                field,
                follow: follow.clone(),
            });
        };
        let post = |body: &[u8]| http::request("POST", ep.path, JSON, body);
        let good = ep.good.to_string();
        add(
            "bad-json",
            post(&good.as_bytes()[..good.len() / 2]),
            false,
            None,
        );
        add("not-an-object", post(b"[1, 2, 3]"), false, None);
        add("empty-body", post(b""), false, None);
        let (key, wrong) = &ep.wrong_type;
        let body = set(&ep.good, key, wrong.clone()).to_string();
        add("wrong-type", post(body.as_bytes()), false, Some(*key));
        let body = without(&ep.good, ep.required).to_string();
        add(
            "missing-field",
            post(body.as_bytes()),
            false,
            Some(ep.required),
        );
        add(
            "repeated-field",
            post(&repeated(&ep.good, key, wrong)),
            false,
            Some(*key),
        );
        if let Some((key, v)) = &ep.huge {
            let body = set(&ep.good, key, v.clone()).to_string();
            add("huge-value", post(body.as_bytes()), false, Some(*key));
        }
        if let Some(body) = &ep.over_context {
            add(
                "over-context",
                post(body.to_string().as_bytes()),
                false,
                None,
            );
        }
        if ep.generates || ep.path == "/v1/messages/count_tokens" {
            let body = set(&ep.good, "model", json!("no-such-model")).to_string();
            add(
                "unknown-model",
                post(body.as_bytes()),
                false,
                Some("no-such-model"),
            );
        }
        let form = http::request(
            "POST",
            ep.path,
            Some("application/x-www-form-urlencoded"),
            b"model=gate-model&prompt=Hello",
        );
        add("form-body", form, false, None);
        let mut utf8 = br#"{"model": "gate-model", "prompt": "caf"#.to_vec();
        utf8.extend_from_slice(b"\xff\xfe\"}");
        add("invalid-utf8", post(&utf8), false, None);
        let mut truncated = http::request("POST", ep.path, JSON, good.as_bytes());
        truncated.truncate(truncated.len() - good.len() / 2);
        add("truncated-body", truncated, true, None);
        let head = format!(
            "POST {} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
            ep.path,
            MAX_BODY + 1
        );
        add("too-large", head.into_bytes(), true, None);
        add(
            "wrong-method",
            http::request("GET", ep.path, None, b""),
            false,
            None,
        );
    }
    let models = ("/v1/models", Value::Null);
    for (method, path, anthropic) in [
        ("POST", "/v1/embeddings", false),
        ("GET", "/v1/no-such-route", false),
        ("DELETE", "/v1/models", false),
        ("PUT", "/v1/messages", true),
    ] {
        out.push(Case {
            class: "unknown-route",
            path,
            anthropic,
            raw: http::request(method, path, JSON, b"{}"),
            half_close: false,
            field: None,
            follow: models.clone(),
        });
    }
    out
}

/// Sends one case and its good request; `None` when both answered as the oracle demands.
fn judge(addr: SocketAddr, case: &Case) -> Option<String> {
    let reply = http::exchange_then(addr, &case.raw, case.half_close);
    if let Some(p) = refusal_problem(&reply, case.anthropic, case.field) {
        return Some(format!("{} {}: {p}", case.class, case.path));
    }
    let (path, body) = &case.follow;
    let good = if body.is_null() {
        http::exchange(addr, &http::request("GET", path, None, b""))
    } else {
        http::exchange(
            addr,
            &http::request("POST", path, JSON, body.to_string().as_bytes()),
        )
    };
    good_problem(&good, path).map(|p| format!("{} {} then {path}: {p}", case.class, case.path))
}

/// Item `http-malformed`.
pub fn run(env: &Env, t: &Target) -> anyhow::Result<Outcome> {
    let has_template = t.has_chat_template(env)?;
    let eps = served(has_template);
    let all = cases(&eps, false);
    // Planted: each stub must fail every case.
    let mut undetected = Vec::new();
    for mode in [
        StubMode::ServerError,
        StubMode::Drop,
        StubMode::RefuseAll,
        StubMode::AcceptAll,
    ] {
        let stub = Stub::start(mode)?;
        for c in &all {
            if judge(stub.addr, c).is_none() {
                undetected.push(format!(
                    "{} {} against a stub that {mode:?}",
                    c.class, c.path
                ));
            }
        }
    }
    let planted = match undetected.first() {
        Some(first) => Proof::new(
            true,
            format!("{} cases passed; first: {first}", undetected.len()),
        ),
        None => Proof::new(
            false,
            format!(
                "all {} cases judged failed against 4 defective stubs",
                all.len()
            ),
        ),
    };
    let server = t.server(env)?;
    let mut failures = Vec::new();
    let mut classes: BTreeMap<&str, usize> = BTreeMap::new();
    for c in &all {
        *classes.entry(c.class).or_default() += 1;
        if let Some(p) = judge(server.addr, c) {
            failures.push(p);
        }
    }
    let skipped = if has_template {
        String::new()
    } else {
        "; chat-template endpoints not served (the model has no chat template)".into()
    };
    let detail = match failures.first() {
        None => format!(
            "{} malformed requests over {} endpoints and {} classes refused 4xx in JSON, each \
             followed by a good request answered 200{skipped}",
            all.len(),
            eps.len(),
            classes.len()
        ),
        Some(first) => format!(
            "{} of {} cases failed; first: {first}",
            failures.len(),
            all.len()
        ),
    };
    let mut real = Proof::new(failures.is_empty(), detail)
        .count("cases", all.len())
        .count("endpoints", eps.len())
        .count("failed", failures.len());
    for (class, n) in classes {
        real = real.count(&format!("class_{class}"), n);
    }
    Ok(Outcome::Judged { planted, real })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_case_fails_against_every_defective_stub() {
        let all = cases(&served(true), false);
        assert!(all.len() > 90, "{} cases", all.len());
        for mode in [
            StubMode::ServerError,
            StubMode::Drop,
            StubMode::RefuseAll,
            StubMode::AcceptAll,
        ] {
            let stub = Stub::start(mode).unwrap();
            for c in &all {
                assert!(
                    judge(stub.addr, c).is_some(),
                    "{} {} passed {mode:?}",
                    c.class,
                    c.path
                );
            }
        }
    }

    #[test]
    fn a_refusal_must_be_4xx_json_in_the_api_shape_and_name_the_field() {
        let reply = |status, ct: &str, body: &str| {
            Ok(Reply {
                status,
                headers: format!("HTTP/1.1 {status} X\r\ncontent-type: {ct}"),
                body: body.as_bytes().to_vec(),
            })
        };
        let openai = r#"{"error":{"message":"'n' must be an integer","type":"invalid_request_error","param":"n"}}"#;
        let anthropic =
            r#"{"type":"error","error":{"type":"invalid_request_error","message":"bad 'n'"}}"#;
        let json = "application/json";
        assert_eq!(
            refusal_problem(&reply(400, json, openai), false, Some("n")),
            None
        );
        assert_eq!(
            refusal_problem(&reply(400, json, anthropic), true, Some("n")),
            None
        );
        for (r, anth, field) in [
            (reply(500, json, openai), false, None),
            (reply(200, json, "{}"), false, None),
            (reply(400, "text/plain", openai), false, None),
            (reply(400, json, "not json"), false, None),
            (reply(400, json, openai), true, None),
            (reply(400, json, openai), false, Some("seed")),
            (Err(anyhow::anyhow!("connection closed")), false, None),
        ] {
            assert!(refusal_problem(&r, anth, field).is_some(), "{r:?}");
        }
    }
}
