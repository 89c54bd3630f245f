//! Tool choices, and the output format of those that force a call: OpenAI's `tool_choice`
//! `"required"` or a named function, Anthropic's `"any"` or a named tool. Such output is
//! held, through an llguidance grammar, to one call in the model's own syntax
//! ([`Framing`]): one JSON object for Hermes `<tool_call>\n{"name": …, "arguments":
//! …}\n</tool_call>`, Llama 3 `{"name": …, "parameters": …}` and Mistral
//! `[TOOL_CALLS][…]`; tagged parameters for Qwen3-Coder (`<function=…><parameter=…>`) and
//! GLM 4.5 (`<arg_key>…<arg_value>`), each value one JSON value of its property's schema;
//! a harmony message to the function (its markers control tokens) for gpt-oss; DeepSeek
//! V3/R1's `<｜tool▁calls▁begin｜>…` with a fenced JSON object, each marker a control token
//! or text as the model's vocabulary holds it; Hermes markup for tools whose parameters
//! tags cannot hold. The call's name is
//! one of the tools offered and its arguments fit that tool's parameters schema: one
//! alternative per tool, its name first. When the prompt opened a reasoning block, the
//! reasoning runs free to its close before the call.
//!
//! Never parses calls back out of text: that is [`crate::tools`].

use std::sync::Arc;

use ferrite_engine::OutputFormat;
use ferrite_engine::grammar::{Constraint, GrammarError, Group, Piece};
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

/// How a forced call is written in the model's own syntax ([`Framing::of`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Framing {
    /// The syntax the call is written, and parsed, in.
    pub syntax: ToolSyntax,
    /// Its markup.
    pub markup: Markup,
}

/// The markup of a forced call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Markup {
    /// One JSON object, `{"name": …, ARGUMENTS: {…}}`, between fixed texts.
    Json {
        /// Text before the call object.
        before: &'static str,
        /// Text after it.
        after: &'static str,
        /// The call object's key of the arguments.
        arguments: &'static str,
    },
    /// The name between `name`'s two texts, then one tagged parameter per argument (the
    /// key after `param.0`, its value between `param.1` and `param.2`), then `close`. Each
    /// value is written as one JSON value, which the parser reads back as that value (a
    /// bare text would be read as JSON where it happens to parse as JSON).
    Tagged {
        /// Around the tool's name.
        name: (&'static str, &'static str),
        /// Before the key, between key and value, after the value.
        param: (&'static str, &'static str, &'static str),
        /// After the last parameter.
        close: &'static str,
    },
    /// A gpt-oss harmony message to the function, its body the arguments object:
    /// `<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{…}`, the
    /// markers control tokens; generation ends on `<|call|>`.
    Harmony,
    /// DeepSeek V3/R1, as its template writes a call: [`DEEPSEEK_CALL`]'s markers around
    /// `function`, the name, and the arguments object fenced as JSON. Each marker is a
    /// control token where the model's vocabulary holds it as one, text otherwise.
    DeepSeek,
}

/// A DeepSeek V3/R1 call as its template writes one, part by part: the markers
/// `<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>`, `function`, `<｜tool▁sep｜>`, the name, a
/// fence opening a JSON block, the arguments object, the fence's close, and
/// `<｜tool▁call▁end｜>` (then [`DEEPSEEK_CLOSE`]).
const DEEPSEEK_CALL: [DeepSeekPart; 9] = [
    DeepSeekPart::Marker("<｜tool▁calls▁begin｜>"),
    DeepSeekPart::Marker("<｜tool▁call▁begin｜>"),
    DeepSeekPart::Text("function"),
    DeepSeekPart::Marker("<｜tool▁sep｜>"),
    DeepSeekPart::Name,
    DeepSeekPart::Text("\n```json\n"),
    DeepSeekPart::Arguments,
    DeepSeekPart::Text("\n```"),
    DeepSeekPart::Marker("<｜tool▁call▁end｜>"),
];

/// The marker after [`DEEPSEEK_CALL`]: one call per forced output.
const DEEPSEEK_CLOSE: &str = "<｜tool▁calls▁end｜>";

/// A part of [`DEEPSEEK_CALL`].
#[derive(Clone, Copy)]
enum DeepSeekPart {
    Marker(&'static str),
    Text(&'static str),
    Name,
    Arguments,
}

/// Hermes markup: the framing of calls whose parameters tags cannot hold.
const HERMES: Framing = Framing {
    syntax: ToolSyntax::Hermes,
    markup: Markup::Json {
        before: HERMES_CALL.0,
        after: HERMES_CALL.1,
        arguments: HERMES_CALL.2,
    },
};

/// Hermes markup's text before and after the call object, and its key of the arguments.
const HERMES_CALL: (&str, &str, &str) = ("<tool_call>\n", "\n</tool_call>", "arguments");

impl Framing {
    /// The framing of a forced call for a model that writes `syntax`: its own markup.
    pub fn of(syntax: ToolSyntax) -> Framing {
        let markup = match syntax {
            // Llama 3.1's template shows calls as `{"name": …, "parameters": …}`.
            ToolSyntax::Llama3 => Markup::Json {
                before: "",
                after: "",
                arguments: "parameters",
            },
            ToolSyntax::Mistral => Markup::Json {
                before: "[TOOL_CALLS][",
                after: "]",
                arguments: "arguments",
            },
            ToolSyntax::Qwen3Coder => Markup::Tagged {
                name: ("<tool_call>\n<function=", ">\n"),
                param: ("<parameter=", ">\n", "\n</parameter>\n"),
                close: "</function>\n</tool_call>",
            },
            ToolSyntax::Glm45 => Markup::Tagged {
                name: ("<tool_call>", "\n"),
                param: ("<arg_key>", "</arg_key>\n<arg_value>", "</arg_value>\n"),
                close: "</tool_call>",
            },
            ToolSyntax::Harmony => Markup::Harmony,
            ToolSyntax::DeepSeek => Markup::DeepSeek,
            ToolSyntax::Hermes => return HERMES,
        };
        Framing { syntax, markup }
    }
}

/// A call a tool choice forces: the tools it may be.
#[derive(Debug, Clone, PartialEq)]
pub struct ForcedCall {
    tools: Vec<Value>,
}

impl ForcedCall {
    /// The grammar of this call in `framing`; `None` when a tool's parameters cannot be
    /// written in it (tagged parameters hold plain properties only). `is_control` says
    /// which markers the model's vocabulary holds as control tokens.
    fn constraint(
        &self,
        framing: Framing,
        is_control: &dyn Fn(&str) -> bool,
    ) -> Option<Result<Constraint, GrammarError>> {
        let calls: Vec<Vec<Group>> = match framing.markup {
            Markup::Json {
                before,
                after,
                arguments,
            } => return Some(self.json_call(before, after, arguments)),
            Markup::Tagged { name, param, close } => {
                let mut calls = Vec::new();
                for t in &self.tools {
                    let tool = name_of(t).unwrap_or_default();
                    let mut groups = vec![Group::always(vec![Piece::Text(format!(
                        "{}{tool}{}",
                        name.0, name.1
                    ))])];
                    for (key, schema, required) in tagged_params(t)? {
                        groups.push(Group {
                            pieces: vec![
                                Piece::Text(format!("{}{key}{}", param.0, param.1)),
                                Piece::Json(schema),
                                Piece::Text(param.2.to_string()),
                            ],
                            optional: !required,
                        });
                    }
                    groups.push(Group::always(vec![Piece::Text(close.to_string())]));
                    calls.push(groups);
                }
                calls
            }
            Markup::Harmony => {
                let special = |s: &str| Piece::Special(s.to_string());
                self.tools
                    .iter()
                    .map(|t| {
                        let name = name_of(t).unwrap_or_default();
                        vec![Group::always(vec![
                            special("<|channel|>"),
                            Piece::Text(format!("commentary to=functions.{name} ")),
                            special("<|constrain|>"),
                            Piece::Text("json".into()),
                            special("<|message|>"),
                            Piece::Json(Value::Object(arguments_schema(t))),
                        ])]
                    })
                    .collect()
            }
            Markup::DeepSeek => {
                let marker = |m: &str| {
                    if is_control(m) {
                        Piece::Special(m.to_string())
                    } else {
                        Piece::Text(m.to_string())
                    }
                };
                self.tools
                    .iter()
                    .map(|t| {
                        let mut pieces: Vec<Piece> = DEEPSEEK_CALL
                            .iter()
                            .map(|part| match *part {
                                DeepSeekPart::Marker(m) => marker(m),
                                DeepSeekPart::Text(s) => Piece::Text(s.to_string()),
                                DeepSeekPart::Name => {
                                    Piece::Text(name_of(t).unwrap_or_default().to_string())
                                }
                                DeepSeekPart::Arguments => {
                                    Piece::Json(Value::Object(arguments_schema(t)))
                                }
                            })
                            .collect();
                        pieces.push(marker(DEEPSEEK_CLOSE));
                        vec![Group::always(pieces)]
                    })
                    .collect()
            }
        };
        Some(Constraint::one_of(&calls))
    }

    /// The grammar of this call as one JSON object between `before` and `after`, its
    /// arguments under `arguments`: any tool's parameters fit it.
    fn json_call(
        &self,
        before: &str,
        after: &str,
        arguments: &str,
    ) -> Result<Constraint, GrammarError> {
        let calls: Vec<Value> = self
            .tools
            .iter()
            .map(|t| call_schema(t, arguments))
            .collect();
        Constraint::framed_json(before, &calls, after)
    }

    /// The grammar of this call in Hermes markup.
    fn hermes(&self) -> Result<Constraint, GrammarError> {
        let (before, after, arguments) = HERMES_CALL;
        self.json_call(before, after, arguments)
    }

    /// The output format of the call for output read as `output` says (its tool syntax
    /// decides the framing; `output.tools` becomes the syntax the call is written in, Hermes
    /// where a tool's parameters cannot be tagged): when the prompt opened a `<think>`
    /// block, reasoning runs free to its close first. `is_control` is the model's
    /// vocabulary's view of a marker ([`ferrite_engine::Backend::is_control_token`]): a
    /// control token is named as one, anything else spelt as text.
    pub fn format(
        &self,
        output: &mut OutputConfig,
        is_control: &dyn Fn(&str) -> bool,
    ) -> Result<OutputFormat, ApiError> {
        let own = Framing::of(output.tools.unwrap_or(ToolSyntax::Hermes));
        let (framing, c) = match self.constraint(own, is_control) {
            Some(c) => (own, c),
            None => (HERMES, self.hermes()),
        };
        output.tools = Some(framing.syntax);
        let mut c = c.map_err(unenforceable)?;
        if output.starts_in_reasoning && output.reasoning == ReasoningFormat::Think {
            c = c.after_reasoning("</think>").map_err(unenforceable)?;
        }
        Ok(OutputFormat::Held(Arc::new(c)))
    }
}

/// A tool's parameters as tagged parameters, in the schema's order: each key, its schema
/// and whether it is required; `None` when the parameters schema says more than plain
/// properties (definitions, extra keys allowed, combinators), which tags cannot hold.
fn tagged_params(tool: &Value) -> Option<Vec<(String, Value, bool)>> {
    let Some(Value::Object(p)) = tool.pointer("/function/parameters") else {
        return Some(Vec::new());
    };
    const PLAIN: [&str; 6] = [
        "type",
        "properties",
        "required",
        "additionalProperties",
        "description",
        "title",
    ];
    let plain = p.iter().all(|(k, v)| match k.as_str() {
        "type" => v == "object",
        "additionalProperties" => v == false,
        "$schema" => true,
        k => PLAIN.contains(&k),
    });
    if !plain {
        return None;
    }
    let required: Vec<&str> = match p.get("required") {
        None => Vec::new(),
        Some(Value::Array(r)) => r.iter().map(Value::as_str).collect::<Option<_>>()?,
        Some(_) => return None,
    };
    let properties = match p.get("properties") {
        None => return required.is_empty().then(Vec::new),
        Some(Value::Object(props)) => props,
        Some(_) => return None,
    };
    if required.iter().any(|r| !properties.contains_key(*r)) {
        return None;
    }
    Some(
        properties
            .iter()
            .map(|(k, schema)| (k.clone(), schema.clone(), required.contains(&k.as_str())))
            .collect(),
    )
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
    forced.hermes().map_err(unenforceable)?;
    Ok(Some(forced))
}

/// A function tool's name.
fn name_of(tool: &Value) -> Option<&str> {
    tool.pointer("/function/name").and_then(Value::as_str)
}

/// The schema of `tool`'s arguments: its parameters schema, any object when it gives none.
fn arguments_schema(tool: &Value) -> serde_json::Map<String, Value> {
    match tool.pointer("/function/parameters") {
        Some(Value::Object(p)) if !p.is_empty() => p.clone(),
        _ => serde_json::Map::from_iter([("type".to_string(), json!("object"))]),
    }
}

/// The schema of a call of `tool`: its name, then (under `key`) arguments of its
/// parameters schema (any object when it gives none), nothing else. The parameters' own definitions move to the
/// call's root, where their local references (`#/$defs/…`, `#/definitions/…`) point.
fn call_schema(tool: &Value, key: &str) -> Value {
    let mut arguments = arguments_schema(tool);
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
