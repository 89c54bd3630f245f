//! Tool choices, and the output format of those that force a call: OpenAI's `tool_choice`
//! `"required"` or a named function, Anthropic's `"any"` or a named tool. Such output is
//! held, through the JSON grammar, to one call in Hermes markup (`<tool_call>\n{"name": …,
//! "arguments": …}\n</tool_call>`) whose name is one of the tools offered and whose
//! arguments fit that tool's parameters schema: the call's object is a tagged union of one
//! object per tool, its name the tag.
//!
//! Never parses calls back out of text: that is [`crate::tools`].

use std::sync::Arc;

use ferrite_engine::json_schema::JsonSchema;
use serde_json::{Map, Value, json};

use crate::error::ApiError;
use ferrite_engine::OutputFormat;

/// Whether and how the model is to call tools.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolChoice {
    /// Never: tools are not parsed out of the output.
    None,
    /// As the model decides.
    Auto,
    /// One of the tools offered.
    Required,
    /// The tool of this name.
    Named(String),
}

impl ToolChoice {
    /// Whether the output may hold tool calls.
    pub fn allows_calls(&self) -> bool {
        *self != ToolChoice::None
    }
}

fn invalid(param: &str, expected: &str) -> ApiError {
    ApiError::invalid_param(param, format!("'{param}' must be {expected}"))
}

/// OpenAI chat completions: `"none"`, `"auto"`, `"required"` or `{"type": "function",
/// "function": {"name": …}}`; absent is `"auto"`.
pub fn openai_chat(v: Option<&Value>) -> Result<ToolChoice, ApiError> {
    const EXPECTED: &str =
        "\"none\", \"auto\", \"required\" or {\"type\": \"function\", \"function\": {\"name\": …}}";
    match v {
        Some(Value::Object(o)) if o.get("type").and_then(Value::as_str) == Some("function") => {
            match o
                .get("function")
                .and_then(|f| f.get("name"))
                .and_then(Value::as_str)
            {
                Some(name) => Ok(ToolChoice::Named(name.to_string())),
                None => Err(invalid("tool_choice", EXPECTED)),
            }
        }
        other => keyword(other, "tool_choice", EXPECTED),
    }
}

/// OpenAI responses: as chat, with the name beside the type (`{"type": "function", "name":
/// …}`).
pub fn responses(v: Option<&Value>) -> Result<ToolChoice, ApiError> {
    const EXPECTED: &str =
        "\"none\", \"auto\", \"required\" or {\"type\": \"function\", \"name\": …}";
    match v {
        Some(Value::Object(o)) if o.get("type").and_then(Value::as_str) == Some("function") => {
            match o.get("name").and_then(Value::as_str) {
                Some(name) => Ok(ToolChoice::Named(name.to_string())),
                None => Err(invalid("tool_choice", EXPECTED)),
            }
        }
        other => keyword(other, "tool_choice", EXPECTED),
    }
}

fn keyword(v: Option<&Value>, param: &str, expected: &str) -> Result<ToolChoice, ApiError> {
    match v.map(|v| v.as_str()) {
        None | Some(Some("auto")) => Ok(ToolChoice::Auto),
        Some(Some("none")) => Ok(ToolChoice::None),
        Some(Some("required")) => Ok(ToolChoice::Required),
        Some(_) => Err(invalid(param, expected)),
    }
}

/// Anthropic messages: `{"type": "auto" | "any" | "none"}` or `{"type": "tool", "name": …}`;
/// absent is auto.
pub fn anthropic(v: Option<&Value>) -> Result<ToolChoice, ApiError> {
    const EXPECTED: &str = "{\"type\": \"auto\"}, {\"type\": \"any\"}, {\"type\": \"none\"} or {\"type\": \"tool\", \"name\": …}";
    let Some(v) = v else {
        return Ok(ToolChoice::Auto);
    };
    let o = v
        .as_object()
        .ok_or_else(|| invalid("tool_choice", EXPECTED))?;
    match o.get("type").and_then(Value::as_str) {
        Some("auto") => Ok(ToolChoice::Auto),
        Some("any") => Ok(ToolChoice::Required),
        Some("none") => Ok(ToolChoice::None),
        Some("tool") => match o.get("name").and_then(Value::as_str) {
            Some(name) => Ok(ToolChoice::Named(name.to_string())),
            None => Err(invalid("tool_choice", EXPECTED)),
        },
        _ => Err(invalid("tool_choice", EXPECTED)),
    }
}

/// The output format of a choice that forces a call among `tools` (OpenAI function tools,
/// as the template gets them), `None` when the choice forces none.
pub fn forced_call(tools: &[Value], choice: &ToolChoice) -> Result<Option<OutputFormat>, ApiError> {
    let candidates: Vec<&Value> = match choice {
        ToolChoice::None | ToolChoice::Auto => return Ok(None),
        ToolChoice::Required => tools.iter().collect(),
        ToolChoice::Named(name) => tools
            .iter()
            .filter(|t| name_of(t) == Some(name.as_str()))
            .collect(),
    };
    let schema = match (&candidates[..], choice) {
        ([], ToolChoice::Named(name)) => {
            return Err(ApiError::invalid_param(
                "tool_choice",
                format!("'tool_choice' names the tool '{name}', which is not among 'tools'"),
            ));
        }
        ([], _) => {
            return Err(ApiError::invalid_param(
                "tool_choice",
                "'tool_choice' requires a tool call, but no 'tools' were given",
            ));
        }
        (tools, _) => calls_schema(tools),
    };
    let compiled = JsonSchema::compile(&schema).map_err(|e| {
        ApiError::invalid_param(
            "tools",
            format!("the tool's parameters cannot be enforced for 'tool_choice': {e}"),
        )
    })?;
    Ok(Some(OutputFormat::ToolCall(Arc::new(compiled))))
}

/// A function tool's name.
fn name_of(tool: &Value) -> Option<&str> {
    tool.pointer("/function/name").and_then(Value::as_str)
}

/// A tool's parameters schema: any object when it gives none.
fn parameters(tool: &Value) -> Value {
    match tool.pointer("/function/parameters") {
        Some(Value::Object(p)) if !p.is_empty() => Value::Object(p.clone()),
        _ => json!({"type": "object"}),
    }
}

/// The schema of a call of one of `tools`: an object per tool, its name first, then its
/// arguments, as the alternatives of an `anyOf` (a tagged union on the name; one tool's
/// object alone when there is one). The parameters' own definitions move to the root, where
/// their local references (`#/$defs/…`, `#/definitions/…`) point; should two tools define
/// one name differently, each call's arguments are any object instead.
fn calls_schema(tools: &[&Value]) -> Value {
    let params: Vec<Value> = tools.iter().map(|t| parameters(t)).collect();
    let mut root = Map::new();
    let mut clash = false;
    for p in &params {
        for key in ["$defs", "definitions"] {
            let Some(Value::Object(defs)) = p.get(key) else {
                continue;
            };
            let merged = root.entry(key).or_insert_with(|| json!({}));
            for (name, def) in defs {
                match merged.get(name) {
                    Some(old) if old != def => clash = true,
                    _ => merged[name] = def.clone(),
                }
            }
        }
    }
    let calls: Vec<Value> = tools
        .iter()
        .zip(params)
        .map(|(tool, arguments)| {
            let arguments = if clash {
                json!({"type": "object"})
            } else {
                arguments
            };
            json!({"type": "object", "properties": {"name": {"const": name_of(tool)},
                "arguments": arguments}, "required": ["name", "arguments"]})
        })
        .collect();
    root.insert("anyOf".into(), Value::Array(calls));
    Value::Object(root)
}

#[cfg(test)]
mod tests;
