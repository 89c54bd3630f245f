//! Tool choices, and the output format of those that force a call: OpenAI's `tool_choice`
//! `"required"` or a named function, Anthropic's `"any"` or a named tool. Such output is
//! held, through an llguidance grammar, to one call in the model's own syntax where that
//! call is one JSON object ([`Framing`]: Hermes `<tool_call>\n{"name": …, "arguments":
//! …}\n</tool_call>`, Llama 3 `{"name": …, "parameters": …}`, Mistral `[TOOL_CALLS][…]`),
//! else in Hermes markup, whose name is one of the tools offered and whose arguments fit
//! that tool's parameters schema: one alternative per tool, each a compact JSON object with
//! its name first. When the prompt opened a reasoning block, the reasoning runs free to its
//! close before the call.
//!
//! Never parses calls back out of text: that is [`crate::tools`].

use std::sync::Arc;

use ferrite_engine::OutputFormat;
use ferrite_engine::grammar::{Constraint, GrammarError};
use ferrite_engine::output::{OutputConfig, ReasoningFormat, ToolSyntax};
use serde_json::{Value, json};

use crate::error::ApiError;

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

/// How a forced call is written in a syntax whose call is one JSON object: the text
/// around it and the key of its arguments. Calls of the other syntaxes (XML arguments,
/// markers that are special tokens, which grammars read only as text) are forced in
/// Hermes markup, and the output is parsed as Hermes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Framing {
    /// The syntax the call is written, and parsed, in.
    pub syntax: ToolSyntax,
    /// Text before the call object.
    pub before: &'static str,
    /// Text after it.
    pub after: &'static str,
    /// The call object's key of the arguments.
    pub arguments: &'static str,
}

impl Framing {
    /// The framing of a forced call for a model that writes `syntax`.
    pub fn of(syntax: ToolSyntax) -> Framing {
        match syntax {
            // Llama 3.1's template shows calls as `{"name": …, "parameters": …}`.
            ToolSyntax::Llama3 => Framing {
                syntax,
                before: "",
                after: "",
                arguments: "parameters",
            },
            ToolSyntax::Mistral => Framing {
                syntax,
                before: "[TOOL_CALLS][",
                after: "]",
                arguments: "arguments",
            },
            _ => Framing {
                syntax: ToolSyntax::Hermes,
                before: "<tool_call>\n",
                after: "\n</tool_call>",
                arguments: "arguments",
            },
        }
    }
}

/// A call a tool choice forces: the tools it may be.
#[derive(Debug, Clone, PartialEq)]
pub struct ForcedCall {
    tools: Vec<Value>,
}

impl ForcedCall {
    fn constraint(&self, framing: Framing) -> Result<Constraint, GrammarError> {
        let calls: Vec<Value> = self
            .tools
            .iter()
            .map(|t| call_schema(t, framing.arguments))
            .collect();
        Constraint::framed_json(framing.before, &calls, framing.after)
    }

    /// The output format of the call for output read as `output` says (its tool syntax
    /// decides the framing): when the prompt opened a `<think>` block, reasoning runs free
    /// to its close first.
    pub fn format(&self, output: &OutputConfig) -> Result<OutputFormat, ApiError> {
        let framing = Framing::of(output.tools.unwrap_or(ToolSyntax::Hermes));
        let mut c = self.constraint(framing).map_err(unenforceable)?;
        if output.starts_in_reasoning && output.reasoning == ReasoningFormat::Think {
            c = c.after_reasoning("</think>").map_err(unenforceable)?;
        }
        Ok(OutputFormat::Held(Arc::new(c)))
    }
}

fn unenforceable(e: GrammarError) -> ApiError {
    ApiError::invalid_param(
        "tools",
        format!("the tool's parameters cannot be enforced for 'tool_choice': {e}"),
    )
}

/// The call a choice forces among `tools` (OpenAI function tools, as the template gets
/// them), `None` when the choice forces none; tools whose parameters cannot be enforced
/// are refused here, before anything is queued.
pub fn forced_call(tools: &[Value], choice: &ToolChoice) -> Result<Option<ForcedCall>, ApiError> {
    let candidates: Vec<&Value> = match choice {
        ToolChoice::None | ToolChoice::Auto => return Ok(None),
        ToolChoice::Required => tools.iter().collect(),
        ToolChoice::Named(name) => tools
            .iter()
            .filter(|t| name_of(t) == Some(name.as_str()))
            .collect(),
    };
    match (&candidates[..], choice) {
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
        _ => {}
    }
    let forced = ForcedCall {
        tools: candidates.into_iter().cloned().collect(),
    };
    forced
        .constraint(Framing::of(ToolSyntax::Hermes))
        .map_err(unenforceable)?;
    Ok(Some(forced))
}

/// A function tool's name.
fn name_of(tool: &Value) -> Option<&str> {
    tool.pointer("/function/name").and_then(Value::as_str)
}

/// The schema of a call of `tool`: its name, then (under `key`) arguments of its
/// parameters schema (any object when it gives none), nothing else. The parameters' own definitions move to the
/// call's root, where their local references (`#/$defs/…`, `#/definitions/…`) point.
fn call_schema(tool: &Value, key: &str) -> Value {
    let mut arguments = match tool.pointer("/function/parameters") {
        Some(Value::Object(p)) if !p.is_empty() => p.clone(),
        _ => serde_json::Map::from_iter([("type".to_string(), json!("object"))]),
    };
    let mut call = json!({"type": "object", "properties": {"name": {"const": name_of(tool)}},
        "required": ["name", key], "additionalProperties": false});
    for key in ["$defs", "definitions"] {
        if let Some(defs) = arguments.remove(key) {
            call[key] = defs;
        }
    }
    call["properties"][key] = Value::Object(arguments);
    call
}

#[cfg(test)]
mod tests;
