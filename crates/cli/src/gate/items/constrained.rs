//! Items `structured-output` and `tool-call`: constrained generation through the real model
//! on the real server stack, judged by a JSON Schema validator written here from the
//! specification's keywords (it shares no code with the engine's grammar, whose output it
//! judges).
//!
//! - `structured-output`: `response_format` `json_schema` and `json_object` (chat when the
//!   model has a chat template, else completions); each output must end by itself, parse,
//!   and validate against the request's schema (`{"type": "object"}` for JSON mode).
//! - `tool-call`: a forced call (`tool_choice` naming the tool, and `"required"`) through
//!   the model's chat template; the answer must be one parsed call of the offered tool
//!   whose arguments are JSON valid against its parameters.
//!
//! The planted defects are outputs the validator must refuse: the real output with a
//! required field removed and with a value of the wrong type; the real call with its
//! arguments cut short and with another tool's name.

use serde_json::{Map, Value, json};

use super::http::MODEL_ID;
use super::{Env, Outcome, Proof, Target};

/// Why `v` does not validate against `schema`, if it does not. Keywords the validator does
/// not know are a failure, never ignored.
pub fn invalid(schema: &Value, v: &Value) -> Option<String> {
    let Some(s) = schema.as_object() else {
        return (schema != &Value::Bool(true)).then(|| format!("schema {schema} is not an object"));
    };
    for key in s.keys() {
        let known = [
            "type",
            "enum",
            "const",
            "properties",
            "required",
            "additionalProperties",
            "items",
            "maxItems",
            "minItems",
            "description",
            "title",
        ];
        if !known.contains(&key.as_str()) {
            return Some(format!("the validator does not know the keyword '{key}'"));
        }
    }
    if let Some(t) = s.get("type") {
        let types: Vec<&str> = match t {
            Value::String(one) => vec![one.as_str()],
            Value::Array(many) => many.iter().filter_map(Value::as_str).collect(),
            _ => return Some(format!("bad type {t}")),
        };
        if !types.iter().any(|t| is_type(t, v)) {
            return Some(format!("{v} is not of type {t}"));
        }
    }
    if let Some(Value::Array(options)) = s.get("enum")
        && !options.contains(v)
    {
        return Some(format!(
            "{v} is not one of {}",
            Value::Array(options.clone())
        ));
    }
    if let Some(c) = s.get("const")
        && c != v
    {
        return Some(format!("{v} is not {c}"));
    }
    if let Value::Object(o) = v {
        let props = s.get("properties").and_then(Value::as_object);
        for name in s
            .get("required")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            if let Some(n) = name.as_str().filter(|n| !o.contains_key(*n)) {
                return Some(format!("required property '{n}' missing"));
            }
        }
        for (k, item) in o {
            match props.and_then(|p| p.get(k)) {
                Some(sub) => {
                    if let Some(p) = invalid(sub, item) {
                        return Some(format!("'{k}': {p}"));
                    }
                }
                None if s.get("additionalProperties") == Some(&Value::Bool(false)) => {
                    return Some(format!("property '{k}' is not allowed"));
                }
                None => {}
            }
        }
    }
    if let Value::Array(items) = v {
        let n = items.len() as u64;
        if s.get("maxItems")
            .and_then(Value::as_u64)
            .is_some_and(|m| n > m)
            || s.get("minItems")
                .and_then(Value::as_u64)
                .is_some_and(|m| n < m)
        {
            return Some(format!("{n} items, outside the schema's bounds"));
        }
    }
    if let (Value::Array(items), Some(sub)) = (v, s.get("items")) {
        for (i, item) in items.iter().enumerate() {
            if let Some(p) = invalid(sub, item) {
                return Some(format!("[{i}]: {p}"));
            }
        }
    }
    None
}

fn is_type(t: &str, v: &Value) -> bool {
    match t {
        "object" => v.is_object(),
        "array" => v.is_array(),
        "string" => v.is_string(),
        "boolean" => v.is_boolean(),
        "null" => v.is_null(),
        "number" => v.is_number(),
        "integer" => v.is_i64() || v.is_u64(),
        _ => false,
    }
}

/// The schema of the structured-output requests: a string enum, an integer, a boolean and
/// a bounded array, all required. Nothing in it lets a small model ramble (no free string,
/// no unbounded array), so a healthy engine ends the object well inside the token limit.
fn trip_schema() -> Value {
    json!({"type": "object", "properties": {
        "city": {"type": "string", "enum": ["Paris", "Rome", "Oslo"]},
        "days": {"type": "integer"},
        "rainy": {"type": "boolean"},
        "sights": {"type": "array", "items": {"enum": ["museum", "park", "harbor"]},
            "maxItems": 2}
    }, "required": ["city", "days", "rainy", "sights"], "additionalProperties": false})
}

/// The tool of the tool-call requests.
fn weather_parameters() -> Value {
    json!({"type": "object", "properties": {
        "city": {"type": "string"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}
    }, "required": ["city", "unit"], "additionalProperties": false})
}

/// (text, finish reason) of one constrained request: chat with a template, else completions.
fn constrained(
    env: &Env,
    t: &Target,
    format: Value,
    prompt: &str,
    chat: bool,
) -> anyhow::Result<(String, String)> {
    let s = t.server(env)?;
    let (path, body) = if chat {
        let body = json!({"model": MODEL_ID, "messages": [{"role": "user", "content": prompt}],
            "max_tokens": 96, "temperature": 0, "response_format": format});
        ("/v1/chat/completions", body)
    } else {
        let body = json!({"model": MODEL_ID, "prompt": prompt, "max_tokens": 96,
            "temperature": 0, "response_format": format});
        ("/v1/completions", body)
    };
    let r = s.post(path, &body)?;
    let v = r
        .json()
        .filter(|_| r.status == 200)
        .ok_or_else(|| anyhow::anyhow!("{path} answered {}: {}", r.status, r.excerpt()))?;
    let choice = &v["choices"][0];
    let text = if chat {
        &choice["message"]["content"]
    } else {
        &choice["text"]
    };
    Ok((
        text.as_str().unwrap_or_default().to_owned(),
        choice["finish_reason"]
            .as_str()
            .unwrap_or_default()
            .to_owned(),
    ))
}

/// `None` when `text` ended by itself, parses and validates against `schema`.
fn output_problem(schema: &Value, text: &str, finish: &str) -> Option<String> {
    if finish != "stop" {
        return Some(format!("finish_reason {finish:?}, not stop: {text:?}"));
    }
    match serde_json::from_str::<Value>(text) {
        Err(e) => Some(format!("does not parse ({e}): {text:?}")),
        Ok(v) => invalid(schema, &v).map(|p| format!("{p}: {text}")),
    }
}

/// `v` with its first property removed and, separately, its first value made a list.
fn broken(v: &Value) -> Vec<Value> {
    let Some(o) = v.as_object() else {
        return vec![json!([])];
    };
    let mut removed: Map<String, Value> = o.clone();
    let mut retyped = o.clone();
    if let Some(first) = o.keys().next() {
        removed.remove(first);
        retyped.insert(first.clone(), json!([[]]));
    }
    vec![Value::Object(removed), Value::Object(retyped)]
}

/// Item `structured-output`.
pub fn structured(env: &Env, t: &Target) -> anyhow::Result<Outcome> {
    let chat = t.has_chat_template(env)?;
    let schema = trip_schema();
    let format = json!({"type": "json_schema",
        "json_schema": {"name": "trip", "strict": true, "schema": schema}});
    let trip = "Plan a short trip as JSON: the city, the number of days, whether it is rainy, \
                and up to two sights.";
    let (text, finish) = constrained(env, t, format, trip, chat)?;
    // A base model (no template) is shown the answer's form first: told in words, it
    // opens with blank lines and never closes its object.
    let yes_no = if chat {
        "Answer with a JSON object whose only key \"answer\" is \"yes\" or \"no\": is Paris \
         in France?"
    } else {
        "Q: Is Rome in Spain?\nA: {\"answer\": \"no\"}\nQ: Is Oslo in Norway?\nA: \
         {\"answer\": \"yes\"}\nQ: Is Paris in France?\nA:"
    };
    let (object_text, object_finish) =
        constrained(env, t, json!({"type": "json_object"}), yes_no, chat)?;
    let any_object = json!({"type": "object"});
    let mut failures = Vec::new();
    failures.extend(output_problem(&schema, &text, &finish).map(|p| format!("json_schema: {p}")));
    failures.extend(
        output_problem(&any_object, &object_text, &object_finish)
            .map(|p| format!("json_object: {p}")),
    );
    // Planted: the real output (or the schema's own example when it did not parse) broken.
    let example = json!({"city": "Rome", "days": 2, "rainy": false, "sights": ["museum"]});
    let base = serde_json::from_str::<Value>(&text).unwrap_or(example);
    let accepted: Vec<String> = broken(&base)
        .iter()
        .filter(|b| invalid(&schema, b).is_none())
        .map(Value::to_string)
        .collect();
    let planted = match accepted.first() {
        None => Proof::new(false, "both broken outputs refused by the validator"),
        Some(b) => Proof::new(
            true,
            format!("the validator accepted the broken output {b}"),
        ),
    };
    let via = if chat {
        "chat"
    } else {
        "completions (no chat template)"
    };
    let detail = match failures.first() {
        None => format!("json_schema and json_object outputs via {via} parse and validate: {text}"),
        Some(first) => format!("{} of 2 failed; first: {first}", failures.len()),
    };
    let real = Proof::new(failures.is_empty(), detail)
        .count("outputs", 2)
        .count("output_bytes", text.len() + object_text.len())
        .count("failed", failures.len());
    Ok(Outcome::Judged { planted, real })
}

/// `None` when `call` is one call of `name` with arguments valid against `parameters`.
fn call_problem(call: &Value, name: &str, parameters: &Value) -> Option<String> {
    let f = &call["function"];
    if f["name"] != name {
        return Some(format!("the call names {}, not {name}", f["name"]));
    }
    let Some(args) = f["arguments"].as_str() else {
        return Some(format!("arguments are not a JSON string: {call}"));
    };
    match serde_json::from_str::<Value>(args) {
        Err(e) => Some(format!("arguments do not parse ({e}): {args:?}")),
        Ok(v) => invalid(parameters, &v).map(|p| format!("arguments {args}: {p}")),
    }
}

/// Item `tool-call`.
pub fn tool_call(env: &Env, t: &Target) -> anyhow::Result<Outcome> {
    if !t.has_chat_template(env)? {
        return Ok(Outcome::blocked(
            "the model has no chat template, and tool calls are made through chat requests",
        ));
    }
    let s = t.server(env)?;
    let parameters = weather_parameters();
    let tool = json!({"type": "function", "function": {"name": "get_weather",
        "description": "The current weather in a city", "parameters": parameters}});
    let clock = json!({"type": "function", "function": {"name": "get_time",
        "parameters": {"type": "object", "properties": {"tz": {"type": "string"}},
            "required": ["tz"], "additionalProperties": false}}});
    let mut failures = Vec::new();
    let mut calls = Vec::new();
    for choice in [
        json!({"type": "function", "function": {"name": "get_weather"}}),
        json!("required"),
    ] {
        let tools = if choice.is_string() {
            json!([tool])
        } else {
            json!([clock, tool])
        };
        let body = json!({"model": MODEL_ID, "temperature": 0, "max_tokens": 96,
            "messages": [{"role": "user", "content": "Is it raining in Paris?"}],
            "tools": tools, "tool_choice": choice});
        let r = s.post("/v1/chat/completions", &body)?;
        let Some(v) = r.json().filter(|_| r.status == 200) else {
            failures.push(format!(
                "tool_choice {choice}: answered {}: {}",
                r.status,
                r.excerpt()
            ));
            continue;
        };
        let c = &v["choices"][0];
        let listed = c["message"]["tool_calls"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let problem = if c["finish_reason"] != "tool_calls" || listed.len() != 1 {
            Some(format!(
                "finish_reason {} with {} calls: {v}",
                c["finish_reason"],
                listed.len()
            ))
        } else {
            call_problem(&listed[0], "get_weather", &parameters)
        };
        match problem {
            Some(p) => failures.push(format!("tool_choice {choice}: {p}")),
            None => calls.push(listed[0].clone()),
        }
    }
    // Planted: a real call (or a made-up one when none came) with its arguments cut short,
    // and the same call under another tool's name.
    let base = calls.first().cloned().unwrap_or_else(|| {
        json!({"function": {"name": "get_weather",
            "arguments": "{\"city\":\"Paris\",\"unit\":\"celsius\"}"}})
    });
    let args = base["function"]["arguments"].as_str().unwrap_or("{}");
    let mut cut = base.clone();
    cut["function"]["arguments"] = json!(&args[..args.len().saturating_sub(1)]);
    let mut renamed = base.clone();
    renamed["function"]["name"] = json!("get_time");
    let undetected: Vec<&Value> = [&cut, &renamed]
        .into_iter()
        .filter(|c| call_problem(c, "get_weather", &parameters).is_none())
        .collect();
    let planted = match undetected.first() {
        None => Proof::new(false, "the cut and the renamed call are both refused"),
        Some(c) => Proof::new(true, format!("a malformed call passed: {c}")),
    };
    let detail = match failures.first() {
        None => format!(
            "named and required tool choices each gave one get_weather call with valid \
             arguments: {args}"
        ),
        Some(first) => format!("{} of 2 failed; first: {first}", failures.len()),
    };
    let real = Proof::new(failures.is_empty(), detail)
        .count("requests", 2)
        .count("calls_valid", calls.len());
    Ok(Outcome::Judged { planted, real })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_validator_refuses_what_the_schema_excludes_and_unknown_keywords() {
        let s = trip_schema();
        let good = json!({"city": "Oslo", "days": 3, "rainy": true, "sights": ["park"]});
        assert_eq!(invalid(&s, &good), None);
        for bad in [
            json!({"city": "Oslo", "days": 3, "rainy": true}),
            json!({"city": "Bergen", "days": 3, "rainy": true, "sights": []}),
            json!({"city": "Oslo", "days": 3.5, "rainy": true, "sights": []}),
            json!({"city": "Oslo", "days": 3, "rainy": "no", "sights": []}),
            json!({"city": "Oslo", "days": 3, "rainy": true, "sights": ["fjord"]}),
            json!({"city": "Oslo", "days": 3, "rainy": true, "sights": ["park", "park", "park"]}),
            json!({"city": "Oslo", "days": 3, "rainy": true, "sights": [], "x": 1}),
            json!([good]),
        ] {
            assert!(invalid(&s, &bad).is_some(), "{bad}");
        }
        assert!(invalid(&json!({"pattern": "a+"}), &json!("a")).is_some());
        for b in broken(&good) {
            assert!(invalid(&s, &b).is_some(), "{b}");
        }
    }
}
