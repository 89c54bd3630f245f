//! Reasoning and tool calls of one chat output, as the APIs need them: rendering the prompt
//! (refusing tools the template would drop) and choosing what to parse out of the output
//! (`--reasoning-format`, the tool syntax the template teaches). The parsing itself is
//! `ferrite_engine::output`, shared with `ferrite run`; this file must never parse text.

use ferrite_engine::output::{OutputConfig, ReasoningFormat, ToolSyntax};
use serde_json::{Map, Value};

use crate::error::ApiError;
use ferrite_engine::{Backend, ChatPrompt, OutputFormat, ReasoningBudget};

/// A rendered chat prompt and how to read the model's output.
#[derive(Debug)]
pub struct Rendered {
    /// The prompt text.
    pub prompt: String,
    /// What to parse out of the output.
    pub output: OutputConfig,
}

/// What a request asks of the template and the output parser.
pub struct Chat<'a> {
    /// Template messages.
    pub messages: Vec<Value>,
    /// Tools for the template, when offered.
    pub tools: Option<Value>,
    /// Template variables (`chat_template_kwargs`, `reasoning_effort`, thinking).
    pub kwargs: Map<String, Value>,
    /// Whether tool calls are parsed out of the output.
    pub parse_calls: bool,
    /// A forced call is written by the grammar, in the model's syntax where it can be
    /// ([`crate::tool_choice::Framing`]).
    pub forced: bool,
    /// The server's `--reasoning-format`.
    pub format: ReasoningFormat,
    /// The server's `--tool-syntax`: the syntax to parse whatever the template shows.
    pub tool_syntax: Option<ToolSyntax>,
    /// Request field that carried the tools (named in the refusal).
    pub tools_param: &'a str,
}

fn render_error(e: impl std::fmt::Display) -> ApiError {
    ApiError::bad_request(format!("could not apply the chat template: {e}"))
}

/// Render the chat. Tools the template renders no differently from no tools would never
/// reach the model, so they are refused (400) rather than dropped, unless the call is
/// forced (`tool_choice` required or named): then the grammar holds the output to the
/// tools' parameters whatever the prompt shows.
pub fn render(backend: &dyn Backend, chat: Chat<'_>) -> Result<Rendered, ApiError> {
    let has_tools = chat.tools.is_some();
    let mut prompt = ChatPrompt {
        messages: chat.messages,
        tools: chat.tools,
        kwargs: chat.kwargs,
    };
    let text = backend.render_chat(&prompt).map_err(render_error)?;
    if has_tools && !chat.forced {
        prompt.tools = None;
        let bare = backend.render_chat(&prompt).map_err(render_error)?;
        if bare == text {
            return Err(ApiError::invalid_param(
                chat.tools_param,
                "this model's chat template does not render tools, so the model would never \
                 see them; send the request without tools",
            ));
        }
    }
    // Hermes markup is the default of templates that show tools without markers; a forced
    // call's format decides the syntax it is written in (`ForcedCall::format`).
    let syntax = chat.parse_calls.then(|| {
        chat.tool_syntax
            .or_else(|| ToolSyntax::detect(&text))
            .unwrap_or(ToolSyntax::Hermes)
    });
    let output = OutputConfig::for_prompt(chat.format, &text, &text, syntax);
    Ok(Rendered {
        prompt: text,
        output,
    })
}

/// `chat_template_kwargs` (an object of template variables, as vLLM and llama-server take
/// it) and OpenAI's `reasoning_effort` (the variable gpt-oss templates read).
pub fn template_kwargs(obj: &crate::parse::Obj) -> Result<Map<String, Value>, ApiError> {
    let mut kwargs = crate::parse::opt_object(obj, "chat_template_kwargs")?
        .cloned()
        .unwrap_or_default();
    if let Some(effort) = crate::parse::opt_str(obj, "reasoning_effort")? {
        if !["low", "medium", "high"].contains(&effort) {
            return Err(ApiError::invalid_param(
                "reasoning_effort",
                format!("'reasoning_effort' must be 'low', 'medium' or 'high', got '{effort}'"),
            ));
        }
        kwargs.insert("reasoning_effort".into(), Value::String(effort.into()));
    }
    Ok(kwargs)
}

/// The reasoning budget of one generation read as `output`: the request's (`requested`,
/// with the field it came from), else the server's `--reasoning-budget`. A budget closes a
/// `<think>` block or a harmony `analysis` message, so a request that asks one of output
/// read without reasoning (`--reasoning-format none`) is refused rather than ignored; the
/// server's default applies only where it can. `format` decides how a `<think>` close is
/// forced: as text where a grammar holds the output, since grammars read markers as text.
pub fn reasoning_budget(
    backend: &dyn Backend,
    requested: Option<(usize, &str)>,
    default: Option<usize>,
    output: &OutputConfig,
    format: &OutputFormat,
) -> Result<Option<ReasoningBudget>, ApiError> {
    let Some(tokens) = requested.map(|(n, _)| n).or(default) else {
        return Ok(None);
    };
    let held = matches!(format, OutputFormat::Held(_));
    let budget = ReasoningBudget::for_output(tokens, output, held, |text, special| {
        backend.tokenize(text, false, special)
    });
    match (budget, requested) {
        (None, Some((_, param))) => Err(ApiError::invalid_param(
            param,
            format!(
                "a reasoning budget closes a reasoning block, and this server reads this \
                 model's output as '{}' (no reasoning); send the request without '{param}'",
                output.reasoning
            ),
        )),
        (budget, _) => Ok(budget),
    }
}
