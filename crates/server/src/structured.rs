//! Structured output requests: every field a client may hold the output with, read into one
//! [`OutputFormat`] — OpenAI's own format object (`response_format` in chat and
//! completions, `text.format` in responses), vLLM's `structured_outputs` (`json`, `regex`,
//! `grammar`) and its older `guided_json` / `guided_regex` / `guided_grammar`, and
//! llama-server's top-level `json_schema` and `grammar`. The same fields are read on every
//! endpoint.
//!
//! What llguidance cannot enforce is refused with a 400 naming the keyword, never ignored
//! or loosened: a client must never take output for schema-valid when it was not held to
//! it. So is a body that asks for two formats at once. A GBNF grammar (`::=` rules) is
//! rewritten as Lark; one the rewrite cannot read is refused, never guessed at.
//!
//! Never samples and never parses output: the engine holds the tokens, [`crate::tools`]
//! reads the text.

use std::sync::Arc;

use ferrite_engine::OutputFormat;
use ferrite_engine::grammar::{Constraint, GrammarError};
use ferrite_engine::output::{OutputConfig, ReasoningFormat};
use serde_json::Value;

use crate::error::ApiError;
use crate::parse::{Obj, field, opt_object, opt_str};

/// The output format `obj` asks for. `own` names the API's own format object and gives it
/// when the body has one (`response_format`, `text.format`); the extension fields are read
/// beside it. At most one of them may be set.
pub fn requested(obj: &Obj, own: Option<(&str, Option<&Obj>)>) -> Result<OutputFormat, ApiError> {
    let mut found: Option<(String, Constraint)> = None;
    let mut take = |param: &str, c: Option<Constraint>| -> Result<(), ApiError> {
        let Some(c) = c else { return Ok(()) };
        if let Some((first, _)) = &found {
            return Err(ApiError::invalid_param(
                param,
                format!("'{param}' and '{first}' both hold the output: give one"),
            ));
        }
        found = Some((param.to_string(), c));
        Ok(())
    };
    if let Some((param, format)) = own {
        take(param, openai_format(format, param)?)?;
    }
    if let Some(so) = opt_object(obj, "structured_outputs")? {
        take("structured_outputs", structured_outputs(so)?)?;
    }
    for key in ["guided_json", "json_schema"] {
        if let Some(schema) = field(obj, key) {
            take(key, Some(schema_of(schema, key)?))?;
        }
    }
    if let Some(rx) = opt_str(obj, "guided_regex")? {
        take("guided_regex", Some(regex(rx, "guided_regex")?))?;
    }
    for key in ["guided_grammar", "grammar"] {
        if let Some(g) = opt_str(obj, key)? {
            take(key, Some(grammar(g, key)?))?;
        }
    }
    Ok(match found {
        Some((_, c)) => OutputFormat::Held(Arc::new(c)),
        None => OutputFormat::Text,
    })
}

/// `format` for output read as `output` says: when the prompt opened a `<think>` block, the
/// reasoning runs free to its close before the held text.
pub fn after_reasoning(
    format: OutputFormat,
    output: &OutputConfig,
) -> Result<OutputFormat, ApiError> {
    match format {
        OutputFormat::Held(c)
            if output.starts_in_reasoning && output.reasoning == ReasoningFormat::Think =>
        {
            let c = c
                .after_reasoning("</think>")
                .map_err(|e| refused("response_format", e))?;
            Ok(OutputFormat::Held(Arc::new(c)))
        }
        other => Ok(other),
    }
}

fn refused(param: &str, e: GrammarError) -> ApiError {
    ApiError::invalid_param(param, format!("'{param}' cannot be enforced: {e}"))
}

/// OpenAI's output format object: `text`, `json_object` for JSON mode, or `json_schema`
/// with its schema (under `json_schema.schema` in chat and completions, `schema` in
/// responses). `strict` may be either: the schema is always held whole.
fn openai_format(format: Option<&Obj>, param: &str) -> Result<Option<Constraint>, ApiError> {
    let Some(format) = format else {
        return Ok(None);
    };
    match opt_str(format, "type")? {
        Some("text") => Ok(None),
        Some("json_object") => Ok(Some(Constraint::json_object())),
        Some("json_schema") => {
            let inner = opt_object(format, "json_schema")?;
            if let Some(strict) = inner.unwrap_or(format).get("strict")
                && !strict.is_boolean()
                && !strict.is_null()
            {
                return Err(ApiError::invalid_param(
                    param,
                    format!("'{param}' 'strict' must be a boolean"),
                ));
            }
            let schema = match inner {
                Some(inner) => inner.get("schema"),
                None => format.get("schema"),
            };
            let Some(schema) = schema else {
                return Err(ApiError::invalid_param(
                    param,
                    format!("'{param}' type 'json_schema' needs a 'schema'"),
                ));
            };
            Constraint::json_schema(schema).map(Some).map_err(|e| {
                ApiError::invalid_param(param, format!("'{param}' schema is not supported: {e}"))
            })
        }
        Some(other) => Err(ApiError::invalid_param(
            param,
            format!("'{param}' type must be 'text', 'json_object' or 'json_schema', got '{other}'"),
        )),
        None => Err(ApiError::invalid_param(
            param,
            format!("'{param}' needs a 'type'"),
        )),
    }
}

/// vLLM's `structured_outputs`: exactly one of `json` (a schema, or its JSON text),
/// `regex` and `grammar`; any other key is refused, never ignored.
fn structured_outputs(so: &Obj) -> Result<Option<Constraint>, ApiError> {
    const PARAM: &str = "structured_outputs";
    let mut set: Vec<(&str, &Value)> = so
        .iter()
        .filter(|(_, v)| !v.is_null())
        .map(|(k, v)| (k.as_str(), v))
        .collect();
    let Some((key, value)) = set.pop() else {
        return Ok(None);
    };
    if let Some((other, _)) = set.first() {
        return Err(ApiError::invalid_param(
            PARAM,
            format!("'{PARAM}' holds '{other}' and '{key}': give one"),
        ));
    }
    let at = format!("{PARAM}.{key}");
    let text = || {
        value
            .as_str()
            .ok_or_else(|| ApiError::invalid_param(&at, format!("'{at}' must be a string")))
    };
    match key {
        "json" => schema_of(value, &at).map(Some),
        "regex" => regex(text()?, &at).map(Some),
        "grammar" => grammar(text()?, &at).map(Some),
        other => Err(ApiError::invalid_param(
            &at,
            format!("'{PARAM}' key '{other}' is not supported (json, regex or grammar)"),
        )),
    }
}

/// A schema given as an object, or as its JSON text (as vLLM takes `guided_json`).
fn schema_of(value: &Value, param: &str) -> Result<Constraint, ApiError> {
    let parsed;
    let schema = match value {
        Value::String(text) => {
            parsed = serde_json::from_str::<Value>(text).map_err(|e| {
                ApiError::invalid_param(param, format!("'{param}' is not valid JSON: {e}"))
            })?;
            &parsed
        }
        v => v,
    };
    Constraint::json_schema(schema).map_err(|e| {
        ApiError::invalid_param(param, format!("'{param}' schema is not supported: {e}"))
    })
}

fn regex(rx: &str, param: &str) -> Result<Constraint, ApiError> {
    Constraint::regex(rx).map_err(|e| refused(param, e))
}

/// A grammar: GBNF (llama-server's format), told by its `::=` rules, else Lark
/// (llguidance's dialect).
fn grammar(text: &str, param: &str) -> Result<Constraint, ApiError> {
    let c = if text.contains("::=") {
        Constraint::gbnf(text)
    } else {
        Constraint::lark(text)
    };
    c.map_err(|e| refused(param, e))
}

#[cfg(test)]
mod tests;
