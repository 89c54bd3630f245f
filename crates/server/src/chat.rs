//! Turning each API's message format into the plain `{"role","content"}` list the chat
//! template renders: content-part arrays are flattened to text, unsupported parts (images,
//! audio) are rejected with a 400 naming the message.

use serde_json::{Map, Value, json};

use crate::error::ApiError;

/// Text of a content value: a string, or an array of text parts (`text`, `input_text`,
/// `output_text`) joined by newlines. `None` for null.
fn content_text(content: &Value, at: &str) -> Result<Option<String>, ApiError> {
    match content {
        Value::Null => Ok(None),
        Value::String(s) => Ok(Some(s.clone())),
        Value::Array(parts) => {
            let mut texts = Vec::with_capacity(parts.len());
            for (j, part) in parts.iter().enumerate() {
                let kind = part.get("type").and_then(Value::as_str).unwrap_or("");
                match (kind, part.get("text")) {
                    ("text" | "input_text" | "output_text", Some(Value::String(t))) => {
                        texts.push(t.as_str())
                    }
                    ("text" | "input_text" | "output_text", _) => {
                        return Err(ApiError::invalid_param(
                            &format!("{at}.content[{j}].text"),
                            "a text part needs a string 'text'",
                        ));
                    }
                    _ => {
                        return Err(ApiError::invalid_param(
                            &format!("{at}.content[{j}]"),
                            format!("content part type '{kind}' is not supported (text only)"),
                        ));
                    }
                }
            }
            Ok(Some(texts.join("\n")))
        }
        _ => Err(ApiError::invalid_param(
            &format!("{at}.content"),
            "'content' must be a string or an array of content parts",
        )),
    }
}

fn role_of<'a>(m: &'a Map<String, Value>, at: &str) -> Result<&'a str, ApiError> {
    match m.get("role") {
        Some(Value::String(r)) => Ok(r),
        None | Some(Value::Null) => Err(ApiError::missing(&format!("{at}.role"))),
        Some(_) => Err(ApiError::invalid_param(
            &format!("{at}.role"),
            "'role' must be a string",
        )),
    }
}

/// OpenAI chat messages → template messages.
pub fn openai_messages(msgs: &[Value]) -> Result<Vec<Value>, ApiError> {
    if msgs.is_empty() {
        return Err(ApiError::invalid_param(
            "messages",
            "'messages' must not be empty",
        ));
    }
    msgs.iter()
        .enumerate()
        .map(|(i, m)| {
            let at = format!("messages[{i}]");
            let m = m
                .as_object()
                .ok_or_else(|| ApiError::invalid_param(&at, "each message must be an object"))?;
            let role = match role_of(m, &at)? {
                "developer" | "system" => "system",
                r @ ("user" | "assistant" | "tool") => r,
                other => {
                    return Err(ApiError::invalid_param(
                        &format!("{at}.role"),
                        format!("unknown role '{other}'"),
                    ));
                }
            };
            let text = content_text(m.get("content").unwrap_or(&Value::Null), &at)?;
            let tool_calls = m.get("tool_calls").filter(|v| !v.is_null());
            if let Some(calls) = tool_calls {
                check_tool_calls(calls, &at)?;
            }
            if text.is_none() && !(role == "assistant" && tool_calls.is_some()) {
                return Err(ApiError::missing(&format!("{at}.content")));
            }
            // A tool result is rendered as the answer to one call; without the id the model
            // cannot tell which.
            if role == "tool" && !m.get("tool_call_id").is_some_and(Value::is_string) {
                return Err(ApiError::missing(&format!("{at}.tool_call_id")));
            }
            let mut out = Map::new();
            out.insert("role".into(), json!(role));
            out.insert("content".into(), json!(text.unwrap_or_default()));
            if let Some(calls) = tool_calls {
                out.insert("tool_calls".into(), template_tool_calls(calls));
            }
            for key in ["tool_call_id", "name", "reasoning_content"] {
                if let Some(v) = m.get(key).filter(|v| v.is_string()) {
                    out.insert(key.into(), v.clone());
                }
            }
            Ok(Value::Object(out))
        })
        .collect()
}

/// An assistant message's `tool_calls`: a list of calls, each naming its function.
fn check_tool_calls(calls: &Value, at: &str) -> Result<(), ApiError> {
    let param = format!("{at}.tool_calls");
    let items = calls
        .as_array()
        .ok_or_else(|| ApiError::invalid_param(&param, "'tool_calls' must be an array"))?;
    for (k, call) in items.iter().enumerate() {
        if call
            .pointer("/function/name")
            .and_then(Value::as_str)
            .is_none()
        {
            return Err(ApiError::invalid_param(
                &format!("{param}[{k}].function.name"),
                "each tool call needs a 'function' with a string 'name'",
            ));
        }
    }
    Ok(())
}

/// Tool calls as templates expect them: `function.arguments` as an object when the client
/// sent a JSON string.
fn template_tool_calls(calls: &Value) -> Value {
    let mut calls = calls.clone();
    if let Some(items) = calls.as_array_mut() {
        for call in items {
            if let Some(args) = call.pointer_mut("/function/arguments")
                && let Some(s) = args.as_str()
                && let Ok(parsed) = serde_json::from_str::<Value>(s)
            {
                *args = parsed;
            }
        }
    }
    calls
}

/// Anthropic `system` + `messages` → template messages.
pub fn anthropic_messages(system: Option<&Value>, msgs: &[Value]) -> Result<Vec<Value>, ApiError> {
    if msgs.is_empty() {
        return Err(ApiError::invalid_param(
            "messages",
            "'messages' must not be empty",
        ));
    }
    let mut out = Vec::with_capacity(msgs.len() + 1);
    if let Some(system) = system {
        let text = content_text(system, "system")?
            .ok_or_else(|| ApiError::invalid_param("system", "'system' must be text"))?;
        out.push(json!({"role": "system", "content": text}));
    }
    for (i, m) in msgs.iter().enumerate() {
        let at = format!("messages[{i}]");
        let m = m
            .as_object()
            .ok_or_else(|| ApiError::invalid_param(&at, "each message must be an object"))?;
        let role = match role_of(m, &at)? {
            r @ ("user" | "assistant") => r,
            other => {
                return Err(ApiError::invalid_param(
                    &format!("{at}.role"),
                    format!("role must be 'user' or 'assistant', got '{other}'"),
                ));
            }
        };
        match m.get("content") {
            Some(Value::Array(blocks)) => anthropic_blocks(role, blocks, &at, &mut out)?,
            Some(c @ Value::String(_)) => {
                out.push(json!({"role": role, "content": content_text(c, &at)?}))
            }
            None | Some(Value::Null) => return Err(ApiError::missing(&format!("{at}.content"))),
            Some(_) => {
                return Err(ApiError::invalid_param(
                    &format!("{at}.content"),
                    "'content' must be a string or an array of content blocks",
                ));
            }
        }
    }
    Ok(out)
}

/// Content blocks of one Anthropic message: text joins into one message, tool_use becomes
/// assistant tool calls, tool_result becomes a `tool` message.
fn anthropic_blocks(
    role: &str,
    blocks: &[Value],
    at: &str,
    out: &mut Vec<Value>,
) -> Result<(), ApiError> {
    let mut texts = Vec::new();
    let mut thinking = Vec::new();
    let mut calls = Vec::new();
    let mut results = Vec::new();
    for (j, b) in blocks.iter().enumerate() {
        let bat = format!("{at}.content[{j}]");
        let kind = b.get("type").and_then(Value::as_str).unwrap_or("");
        match kind {
            "text" => match b.get("text") {
                Some(Value::String(t)) => texts.push(t.clone()),
                _ => {
                    return Err(ApiError::invalid_param(
                        &bat,
                        "a text block needs a string 'text'",
                    ));
                }
            },
            // Earlier reasoning goes back to the template as the message's
            // `reasoning_content`, which reasoning templates render (or drop) as they were
            // trained to; redacted reasoning is opaque and has nothing to render.
            "thinking" if role == "assistant" => match b.get("thinking") {
                Some(Value::String(t)) => thinking.push(t.clone()),
                _ => {
                    return Err(ApiError::invalid_param(
                        &bat,
                        "a thinking block needs a string 'thinking'",
                    ));
                }
            },
            "redacted_thinking" if role == "assistant" => {}
            "tool_use" => calls.push(json!({
                "id": b.get("id").cloned().unwrap_or(Value::Null),
                "type": "function",
                "function": {"name": b.get("name").cloned().unwrap_or(Value::Null),
                             "arguments": b.get("input").cloned().unwrap_or(json!({}))},
            })),
            "tool_result" => {
                let content = content_text(b.get("content").unwrap_or(&Value::Null), &bat)?;
                results.push(json!({"role": "tool",
                    "tool_call_id": b.get("tool_use_id").cloned().unwrap_or(Value::Null),
                    "content": content.unwrap_or_default()}));
            }
            _ => {
                return Err(ApiError::invalid_param(
                    &bat,
                    format!("content block type '{kind}' is not supported"),
                ));
            }
        }
    }
    out.extend(results);
    if !texts.is_empty() || !calls.is_empty() || !thinking.is_empty() {
        let mut msg = json!({"role": role, "content": texts.join("\n")});
        if !thinking.is_empty() {
            msg["reasoning_content"] = json!(thinking.join("\n"));
        }
        if !calls.is_empty() {
            msg["tool_calls"] = Value::Array(calls);
        }
        out.push(msg);
    }
    Ok(())
}

/// Responses API `instructions` + `input` → template messages. Input items are messages,
/// `function_call` items (the model's earlier tool calls, merged into one assistant message
/// with `tool_calls`) and `function_call_output` items (`tool` messages answering them).
pub fn responses_input(instructions: Option<&str>, input: &Value) -> Result<Vec<Value>, ApiError> {
    let mut out = Vec::new();
    if let Some(s) = instructions {
        out.push(json!({"role": "system", "content": s}));
    }
    match input {
        Value::String(s) => out.push(json!({"role": "user", "content": s})),
        Value::Array(items) => {
            if items.is_empty() {
                return Err(ApiError::invalid_param(
                    "input",
                    "'input' must not be empty",
                ));
            }
            for (i, item) in items.iter().enumerate() {
                let at = format!("input[{i}]");
                let m = item.as_object().ok_or_else(|| {
                    ApiError::invalid_param(&at, "each input item must be an object")
                })?;
                match m.get("type").and_then(Value::as_str).unwrap_or("message") {
                    "message" => {
                        let msg = responses_message(m, &at)?;
                        // The answer that follows its own reasoning item is one message.
                        match out.last_mut() {
                            Some(last)
                                if msg["role"] == "assistant"
                                    && last["role"] == "assistant"
                                    && last["content"] == "" =>
                            {
                                last["content"] = msg["content"].clone();
                            }
                            _ => out.push(msg),
                        }
                    }
                    "reasoning" => {
                        let text = reasoning_item_text(m);
                        out.push(json!({"role": "assistant", "content": "",
                            "reasoning_content": text}));
                    }
                    "function_call" => push_function_call(&mut out, m, &at)?,
                    "function_call_output" => {
                        let call_id = required_str(m, "call_id", &at)?;
                        let output = content_text(m.get("output").unwrap_or(&Value::Null), &at)?
                            .ok_or_else(|| ApiError::missing(&format!("{at}.output")))?;
                        out.push(
                            json!({"role": "tool", "tool_call_id": call_id, "content": output}),
                        );
                    }
                    kind => {
                        return Err(ApiError::invalid_param(
                            &at,
                            format!("input item type '{kind}' is not supported"),
                        ));
                    }
                }
            }
        }
        _ => {
            return Err(ApiError::invalid_param(
                "input",
                "'input' must be a string or an array of input items",
            ));
        }
    }
    Ok(out)
}

/// Text of a Responses `reasoning` item: its `reasoning_text` content, else its summary.
fn reasoning_item_text(m: &Map<String, Value>) -> String {
    let texts = |key: &str| -> Vec<String> {
        m.get(key)
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|p| p.get("text").and_then(Value::as_str).map(str::to_string))
            .collect()
    };
    let content = texts("content");
    if content.is_empty() {
        texts("summary").join("\n")
    } else {
        content.join("\n")
    }
}

fn responses_message(m: &Map<String, Value>, at: &str) -> Result<Value, ApiError> {
    let role = match role_of(m, at)? {
        "developer" | "system" => "system",
        r @ ("user" | "assistant") => r,
        other => {
            return Err(ApiError::invalid_param(
                &format!("{at}.role"),
                format!("unknown role '{other}'"),
            ));
        }
    };
    let text = content_text(m.get("content").unwrap_or(&Value::Null), at)?
        .ok_or_else(|| ApiError::missing(&format!("{at}.content")))?;
    Ok(json!({"role": role, "content": text}))
}

fn required_str<'a>(m: &'a Map<String, Value>, key: &str, at: &str) -> Result<&'a str, ApiError> {
    match m.get(key) {
        Some(Value::String(s)) => Ok(s),
        None | Some(Value::Null) => Err(ApiError::missing(&format!("{at}.{key}"))),
        Some(_) => Err(ApiError::invalid_param(
            &format!("{at}.{key}"),
            format!("'{key}' must be a string"),
        )),
    }
}

/// A `function_call` item joins the assistant message right before it (so text and the
/// calls of one turn stay one message), or starts a new one.
fn push_function_call(
    out: &mut Vec<Value>,
    m: &Map<String, Value>,
    at: &str,
) -> Result<(), ApiError> {
    let call_id = required_str(m, "call_id", at)?;
    let name = required_str(m, "name", at)?;
    let args = required_str(m, "arguments", at)?;
    let call = json!({"id": call_id, "type": "function",
        "function": {"name": name, "arguments": args}});
    let call = template_tool_calls(&json!([call]))[0].clone();
    match out.last_mut() {
        Some(last) if last["role"] == "assistant" => match last.get_mut("tool_calls") {
            Some(Value::Array(calls)) => calls.push(call),
            _ => last["tool_calls"] = json!([call]),
        },
        _ => out.push(json!({"role": "assistant", "content": "", "tool_calls": [call]})),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_parts_flatten_and_images_are_rejected() {
        let msgs = vec![json!({"role": "user", "content": [
            {"type": "text", "text": "a"}, {"type": "text", "text": "b"}]})];
        assert_eq!(openai_messages(&msgs).unwrap()[0]["content"], "a\nb");
        let img =
            vec![json!({"role": "user", "content": [{"type": "image_url", "image_url": {}}]})];
        let e = openai_messages(&img).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("messages[0].content[0]"));
    }

    #[test]
    fn roles_and_content_are_checked() {
        assert!(openai_messages(&[]).is_err());
        assert!(openai_messages(&[json!({"role": "wizard", "content": "x"})]).is_err());
        assert!(openai_messages(&[json!({"content": "x"})]).is_err());
        assert!(openai_messages(&[json!({"role": "user"})]).is_err());
        assert!(openai_messages(&[json!("hi")]).is_err());
        let dev = openai_messages(&[json!({"role": "developer", "content": "x"})]).unwrap();
        assert_eq!(dev[0]["role"], "system");
    }

    /// A tool message must say which call it answers and an assistant's `tool_calls` must
    /// be a list of calls, as OpenAI requires. Regression: both were accepted, and the
    /// template rendered an answer to no call, or whatever `tool_calls` held.
    #[test]
    fn tool_messages_need_a_call_id_and_tool_calls_a_list() {
        let call = json!({"id": "c1", "type": "function",
            "function": {"name": "get", "arguments": "{}"}});
        let asked = json!({"role": "assistant", "content": null, "tool_calls": [call]});
        let user = json!({"role": "user", "content": "hi"});
        let answer = json!({"role": "tool", "content": "42"});
        let e = openai_messages(&[user.clone(), asked.clone(), answer]).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("messages[2].tool_call_id"));
        let answer = json!({"role": "tool", "tool_call_id": "c1", "content": "42"});
        assert!(openai_messages(&[user.clone(), asked, answer]).is_ok());
        for bad in [
            json!("get"),
            json!({"id": "c1"}),
            json!(["get"]),
            json!([{"id": "c1"}]),
        ] {
            let m = json!({"role": "assistant", "content": null, "tool_calls": bad});
            let e = openai_messages(&[user.clone(), m]).unwrap_err();
            assert!(
                e.param
                    .as_deref()
                    .unwrap()
                    .starts_with("messages[1].tool_calls"),
                "{bad}: {e:?}"
            );
        }
    }

    #[test]
    fn anthropic_system_blocks_and_tools() {
        let msgs = vec![
            json!({"role": "user", "content": [{"type": "text", "text": "hi"}]}),
            json!({"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "f", "input": {"a": 1}}]}),
            json!({"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "42"}]}),
        ];
        let sys = json!([{"type": "text", "text": "be brief"}]);
        let out = anthropic_messages(Some(&sys), &msgs).unwrap();
        assert_eq!(out[0], json!({"role": "system", "content": "be brief"}));
        assert_eq!(out[2]["tool_calls"][0]["function"]["name"], "f");
        assert_eq!(out[3]["role"], "tool");
        assert!(anthropic_messages(None, &[json!({"role": "system", "content": "x"})]).is_err());
    }

    /// Regression: a `thinking` block in the history was a 400 ("content block type
    /// 'thinking' is not supported"), found by llama.cpp's server tests.
    #[test]
    fn anthropic_thinking_history_becomes_reasoning_content() {
        let msgs = vec![
            json!({"role": "user", "content": "hi"}),
            json!({"role": "assistant", "content": [
                {"type": "thinking", "thinking": "greet back", "signature": "x"},
                {"type": "redacted_thinking", "data": "opaque"},
                {"type": "text", "text": "Hello"}]}),
        ];
        let out = anthropic_messages(None, &msgs).unwrap();
        assert_eq!(
            out[1],
            json!({"role": "assistant", "content": "Hello", "reasoning_content": "greet back"})
        );
        let bad = vec![json!({"role": "assistant", "content": [{"type": "thinking"}]})];
        assert!(anthropic_messages(None, &bad).is_err());
        let asked = vec![json!({"role": "assistant", "content": "a", "reasoning_content": "r"})];
        assert_eq!(
            openai_messages(&asked).unwrap()[0]["reasoning_content"],
            "r"
        );
    }

    #[test]
    fn responses_input_forms() {
        let out = responses_input(Some("sys"), &json!("hello")).unwrap();
        assert_eq!(out.len(), 2);
        let items = json!([{"role": "user", "content": [{"type": "input_text", "text": "x"}]}]);
        assert_eq!(responses_input(None, &items).unwrap()[0]["content"], "x");
        assert!(responses_input(None, &json!(5)).is_err());
        assert!(responses_input(None, &json!([{"type": "function_call"}])).is_err());
        assert!(responses_input(None, &json!([{"type": "web_search_call"}])).is_err());
        let replay = json!([
            {"role": "user", "content": "hi"},
            {"type": "reasoning", "id": "rs_1", "summary": [],
             "content": [{"type": "reasoning_text", "text": "greet"}]},
            {"role": "assistant", "content": "Hello"},
        ]);
        let out = responses_input(None, &replay).unwrap();
        assert_eq!(
            out[1],
            json!({"role": "assistant", "content": "Hello", "reasoning_content": "greet"})
        );
    }

    #[test]
    fn responses_function_items_become_tool_calls_and_tool_messages() {
        let items = json!([
            {"role": "user", "content": "weather?"},
            {"type": "function_call", "call_id": "c1", "name": "get", "arguments": "{\"city\":\"Oslo\"}"},
            {"type": "function_call", "call_id": "c2", "name": "get", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "rain"},
        ]);
        let out = responses_input(None, &items).unwrap();
        assert_eq!(out.len(), 3);
        assert_eq!(out[1]["role"], "assistant");
        let calls = out[1]["tool_calls"].as_array().unwrap();
        assert_eq!(calls.len(), 2);
        assert_eq!(calls[0]["id"], "c1");
        // Templates get the arguments as an object.
        assert_eq!(calls[0]["function"]["arguments"]["city"], "Oslo");
        assert_eq!(
            out[2],
            json!({"role": "tool", "tool_call_id": "c1", "content": "rain"})
        );
        let no_id = json!([{"type": "function_call_output", "output": "x"}]);
        let e = responses_input(None, &no_id).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("input[0].call_id"));
    }
}
