//! Chat templates: rendering `tokenizer.chat_template` (jinja2) the way Hugging Face's
//! `apply_chat_template` does.
//!
//! Differences from stock minijinja that matter for byte-exact output: `trim_blocks` and
//! `lstrip_blocks` are on (as in transformers), Python string/dict/list methods come from
//! minijinja-contrib's pycompat, and `tojson` is replaced by a `json.dumps` look-alike (no HTML
//! escaping, key order kept, Python's `", "`/`": "` separators, `indent`), the `iterable` test
//! is false for `none` as in Python, and `tools`/`documents` are `none` when not given (as
//! `apply_chat_template` passes them). `raise_exception` and `strftime_now` are provided as
//! globals; [`ChatTemplate::with_fixed_time`] pins the time `strftime_now` reports.

use minijinja::value::{Kwargs, Value, ValueKind};
use minijinja::{Environment, Error, ErrorKind};

use crate::error::{Result, TokenizerError};
use crate::json::{JsonStyle, json_to_value, write_json};
use crate::time::{strftime, strftime_now};

/// transformers' `{% generation %}` … `{% endgeneration %}` marks assistant text for training
/// masks and renders its body unchanged; minijinja has no such tag, so it becomes an
/// always-true `if` with the same whitespace control (and the same line numbers).
fn replace_generation_tags(source: &str) -> String {
    let mut out = String::with_capacity(source.len());
    let mut rest = source;
    while let Some(start) = rest.find("{%") {
        let Some(len) = rest[start..].find("%}") else {
            break;
        };
        let tag = &rest[start..start + len + 2];
        let inner = tag[2..tag.len() - 2].trim_matches('-').trim();
        out.push_str(&rest[..start]);
        let left = if tag.starts_with("{%-") { "{%-" } else { "{%" };
        let right = if tag.ends_with("-%}") { "-%}" } else { "%}" };
        match inner {
            "generation" => out.push_str(&format!("{left} if true {right}")),
            "endgeneration" => out.push_str(&format!("{left} endif {right}")),
            _ => out.push_str(tag),
        }
        rest = &rest[start + len + 2..];
    }
    out.push_str(rest);
    out
}

/// Name under which the template is registered (appears in minijinja's own messages).
const NAME: &str = "chat_template";

/// Inputs of one rendering besides the template itself.
#[derive(Debug, Clone, Default)]
pub struct ChatRequest {
    /// The conversation: objects with `role`, `content`, and optionally `tool_calls`,
    /// `tool_call_id`, `name`, … passed to the template unchanged.
    pub messages: Vec<serde_json::Value>,
    /// Append the opening of an assistant turn.
    pub add_generation_prompt: bool,
    /// Tool (function) definitions, passed as `tools` when present.
    pub tools: Option<serde_json::Value>,
    /// Retrieval documents, passed as `documents` when present.
    pub documents: Option<serde_json::Value>,
    /// Further template variables (e.g. `enable_thinking`), passed unchanged.
    pub extra: serde_json::Map<String, serde_json::Value>,
}

/// A parsed chat template, ready to render.
#[derive(Debug)]
pub struct ChatTemplate {
    env: Environment<'static>,
    bos_token: String,
    eos_token: String,
}

fn template_error(err: &Error) -> TokenizerError {
    let mut message = err.to_string();
    let mut source = std::error::Error::source(err);
    while let Some(s) = source {
        message.push_str(": ");
        message.push_str(&s.to_string());
        source = s.source();
    }
    TokenizerError::Template {
        line: err.line(),
        message,
    }
}

fn tojson(value: Value, kwargs: Kwargs) -> std::result::Result<Value, Error> {
    let indent = match kwargs.get::<Option<Value>>("indent")? {
        None => None,
        Some(v) if v.is_none() => None,
        Some(v) => match v.kind() {
            ValueKind::Number => Some(" ".repeat(usize::try_from(v).unwrap_or(0))),
            ValueKind::String => Some(v.as_str().unwrap_or_default().to_owned()),
            _ => return Err(Error::new(ErrorKind::InvalidOperation, "bad indent")),
        },
    };
    let sort_keys = kwargs.get::<Option<bool>>("sort_keys")?.unwrap_or(false);
    let ensure_ascii = kwargs.get::<Option<bool>>("ensure_ascii")?.unwrap_or(false);
    let separators = kwargs.get::<Option<Vec<String>>>("separators")?;
    kwargs.assert_all_used()?;
    let (item_sep, key_sep) = match separators.as_deref() {
        Some([a, b]) => (a.clone(), b.clone()),
        Some(_) => {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                "separators must be a pair",
            ));
        }
        // Python: ", " without indent, "," with it (trailing spaces would follow newlines).
        None if indent.is_some() => (",".into(), ": ".into()),
        None => (", ".into(), ": ".into()),
    };
    let style = JsonStyle {
        indent,
        item_sep,
        key_sep,
        sort_keys,
        ensure_ascii,
    };
    let mut out = String::new();
    write_json(&value, &style, 0, &mut out)?;
    Ok(Value::from(out))
}

fn raise_exception(message: String) -> std::result::Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, message))
}

impl ChatTemplate {
    /// Parse `source`; `bos_token`/`eos_token` are the texts the template sees under those names.
    pub fn new(source: &str, bos_token: &str, eos_token: &str) -> Result<Self> {
        let mut env = Environment::new();
        let syntax = minijinja::syntax::SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .build()
            .map_err(|e| template_error(&e))?;
        env.set_syntax(syntax);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_filter("tojson", tojson);
        // jinja2 asks Python's `iter()`: `none` is not iterable (minijinja iterates it as
        // empty), so `tools is iterable and tools | length > 0` stops at `tools = None`.
        env.add_test("iterable", |v: Value| {
            v.kind() != ValueKind::None && v.try_iter().is_ok()
        });
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", |fmt: String| {
            Value::from(strftime_now(&fmt))
        });
        env.add_template_owned(NAME, replace_generation_tags(source))
            .map_err(|e| template_error(&e))?;
        Ok(Self {
            env,
            bos_token: bos_token.to_owned(),
            eos_token: eos_token.to_owned(),
        })
    }

    /// Make `strftime_now` report `unix_secs` (UTC) instead of the clock, so a template that
    /// prints today's date renders the same text on every day (reference fixtures, tests).
    #[must_use]
    pub fn with_fixed_time(mut self, unix_secs: i64) -> Self {
        self.env.add_function("strftime_now", move |fmt: String| {
            Value::from(strftime(&fmt, unix_secs))
        });
        self
    }

    /// Render a conversation to the prompt text.
    pub fn render(&self, req: &ChatRequest) -> Result<String> {
        let tmpl = self
            .env
            .get_template(NAME)
            .map_err(|e| template_error(&e))?;
        let mut ctx: Vec<(String, Value)> = vec![
            (
                "messages".into(),
                Value::from(req.messages.iter().map(json_to_value).collect::<Vec<_>>()),
            ),
            (
                "add_generation_prompt".into(),
                Value::from(req.add_generation_prompt),
            ),
            ("bos_token".into(), Value::from(self.bos_token.as_str())),
            ("eos_token".into(), Value::from(self.eos_token.as_str())),
        ];
        // apply_chat_template always passes `tools` and `documents`, `None` when absent: a
        // template's `tools is defined` and `tools is not none` read them that way.
        let optional =
            |v: &Option<serde_json::Value>| v.as_ref().map_or(Value::from(()), json_to_value);
        ctx.push(("tools".into(), optional(&req.tools)));
        ctx.push(("documents".into(), optional(&req.documents)));
        for (k, v) in &req.extra {
            ctx.push((k.clone(), json_to_value(v)));
        }
        tmpl.render(Value::from_pairs(ctx))
            .map_err(|e| template_error(&e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn render(src: &str, messages: serde_json::Value) -> Result<String> {
        let t = ChatTemplate::new(src, "<s>", "</s>")?;
        let messages = messages.as_array().cloned().unwrap_or_default();
        t.render(&ChatRequest {
            messages,
            add_generation_prompt: true,
            ..ChatRequest::default()
        })
    }

    #[test]
    fn tojson_is_python_json_dumps() {
        let out = render(
            "{{ messages[0] | tojson }}|{{ messages[0] | tojson(indent=2) }}",
            json!([{"role": "user", "content": "<a> & 'b' é", "z": [1, 2.5, null, true]}]),
        )
        .expect("render");
        assert_eq!(
            out,
            "{\"role\": \"user\", \"content\": \"<a> & 'b' é\", \"z\": [1, 2.5, null, true]}|{\n  \"role\": \"user\",\n  \"content\": \"<a> & 'b' é\",\n  \"z\": [\n    1,\n    2.5,\n    null,\n    true\n  ]\n}"
        );
    }

    #[test]
    fn trim_and_lstrip_blocks_and_pycompat() {
        // jinja2 with trim_blocks + lstrip_blocks drops the indentation before a block tag and the
        // newline after it, but not around `{{ }}`.
        let src = "{% for m in messages %}\n    {% if m %}{{ m.content.strip().upper() }}{% endif %}\n  {{ m.role }}\n{% endfor %}{{ bos_token }}{% if add_generation_prompt %}!{% endif %}";
        let out = render(src, json!([{"role": "user", "content": "  hi "}])).expect("render");
        assert_eq!(out, "HI  user\n<s>!");
    }

    #[test]
    fn raise_exception_and_syntax_errors_name_the_line() {
        let err = render("line1\n{{ raise_exception('bad role') }}", json!([])).unwrap_err();
        match err {
            TokenizerError::Template { line, message } => {
                assert_eq!(line, Some(2));
                assert!(message.contains("bad role"), "{message}");
            }
            other => panic!("unexpected {other:?}"),
        }
        let err = ChatTemplate::new("a\nb\n{% if %}", "", "").unwrap_err();
        assert!(
            matches!(err, TokenizerError::Template { line: Some(3), .. }),
            "{err}"
        );
    }

    #[test]
    fn tool_calls_and_tools_pass_through() {
        let t = ChatTemplate::new(
            "{% for t in tools %}{{ t.name }};{% endfor %}{% for m in messages %}{% if m.tool_calls %}{{ m.tool_calls[0].function.arguments | tojson }}{% endif %}{% if m.role == 'tool' %}[{{ m.content }}]{% endif %}{% endfor %}",
            "",
            "",
        )
        .expect("parse");
        let out = t
            .render(&ChatRequest {
                messages: vec![
                    json!({"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": {"b": 1, "a": "x"}}}]}),
                    json!({"role": "tool", "content": "42"}),
                ],
                tools: Some(json!([{"name": "f"}, {"name": "g"}])),
                ..ChatRequest::default()
            })
            .expect("render");
        assert_eq!(out, "f;g;{\"b\": 1, \"a\": \"x\"}[42]");
    }

    #[test]
    fn generation_tags_render_their_body() {
        let src = "{% for m in messages %}{%- generation -%}\n[{{ m.content }}]\n{%- endgeneration %}{% endfor %}";
        let out = render(src, json!([{"role": "assistant", "content": "x"}])).expect("render");
        assert_eq!(out, "[x]");
        assert_eq!(
            replace_generation_tags("{{ a }}{% if b %}"),
            "{{ a }}{% if b %}"
        );
    }

    #[test]
    fn a_fixed_time_pins_strftime_now() {
        let t = ChatTemplate::new("{{ strftime_now('%d %b %Y') }}", "", "")
            .expect("parse")
            .with_fixed_time(1_709_211_909);
        assert_eq!(
            t.render(&ChatRequest::default()).expect("render"),
            "29 Feb 2024"
        );
    }

    #[test]
    fn absent_tools_are_none_and_none_is_not_iterable() {
        let src = "{{ tools is defined }} {{ tools is none }} {{ tools is iterable }} \
                   {{ [] is iterable }} {{ 'ab' is iterable }} {{ nothing is iterable }} \
                   {{ 3 is iterable }}";
        let out = render(src, json!([])).expect("render");
        // jinja2's answers: `None` is defined but not iterable; Undefined iterates as empty.
        assert_eq!(out, "True True False True True True False");
    }

    #[test]
    fn strftime_now_is_available() {
        let out = render("{{ strftime_now('%Y') }}", json!([])).expect("render");
        assert_eq!(out.len(), 4);
        assert!(out.starts_with('2'));
    }
}
