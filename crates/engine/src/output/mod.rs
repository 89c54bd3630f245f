//! What a model's output means: reasoning, answer text and tool calls, split incrementally
//! as tokens arrive, for every API of the server and for `ferrite run` alike.
//!
//! [`OutputParser`] is fed each token's text (and whether it is a special token) and emits
//! [`Event`]s: reasoning and content deltas, and tool calls as they are generated (start
//! with the name, argument deltas, end once whole). Each tool syntax is a pure scanner of
//! one block (its own file) that reports how far the block has got; the driver
//! ([`stream`]) turns successive reports into deltas. Arguments are never re-written: the
//! deltas of a call add up to its final arguments text.
//!
//! It must never report an unfinished or malformed call as a call, let reasoning text reach
//! the answer, or synthesize text the model did not write.
//!
//! ```
//! use ferrite_engine::output::{Collected, OutputConfig, OutputParser, ReasoningFormat, ToolSyntax};
//! let config = OutputConfig {
//!     reasoning: ReasoningFormat::Think,
//!     starts_in_reasoning: false,
//!     tools: Some(ToolSyntax::Hermes),
//! };
//! let mut parser = OutputParser::new(config);
//! let mut out = Collected::default();
//! for piece in ["<think>sun?", "</think>", "<tool_call>{\"name\": \"w\", ", "\"arguments\": {}}</tool_call>"] {
//!     out.extend(parser.push(piece, false));
//! }
//! out.extend(parser.finish().events);
//! assert_eq!(out.reasoning, "sun?");
//! assert_eq!(out.content, "");
//! assert_eq!(out.calls[0].name, "w");
//! ```

mod deepseek;
mod glm;
pub(crate) mod harmony;
mod hermes;
mod json_call;
mod llama3;
mod mistral;
mod qwen_xml;
mod scan;
pub mod stream;
#[cfg(test)]
mod template_tests;

use std::fmt;
use std::str::FromStr;

pub use stream::{Finish, OutputParser};

/// What the parser reports, in output order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// More reasoning text.
    Reasoning(String),
    /// More answer text.
    Content(String),
    /// A tool call began; `index` counts the calls of this output from 0 (APIs name calls
    /// by it).
    ToolStart {
        /// Position among this output's calls.
        index: usize,
        /// The function's name.
        name: String,
    },
    /// More of a call's arguments (JSON text).
    ToolArgs {
        /// The call's index.
        index: usize,
        /// The next piece of the arguments.
        delta: String,
    },
    /// The call is whole and its arguments valid JSON. A call without this event is
    /// unfinished and never a call.
    ToolEnd {
        /// The call's index.
        index: usize,
    },
}

/// How reasoning is marked in the output (`--reasoning-format`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum ReasoningFormat {
    /// From the chat template: `harmony` when it speaks gpt-oss channels, else `think`.
    #[default]
    Auto,
    /// No reasoning: everything is answer.
    None,
    /// `<think>…</think>` at the start of the output (text or special tokens).
    Think,
    /// gpt-oss channels: `analysis` is reasoning, `final` the answer.
    Harmony,
}

/// A `--reasoning-format` value that is none of the four.
#[derive(Debug, thiserror::Error)]
#[error("unknown reasoning format '{0}' (auto, none, think or harmony)")]
pub struct UnknownFormat(pub String);

impl FromStr for ReasoningFormat {
    type Err = UnknownFormat;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(match s {
            "auto" => ReasoningFormat::Auto,
            "none" => ReasoningFormat::None,
            "think" => ReasoningFormat::Think,
            "harmony" => ReasoningFormat::Harmony,
            other => return Err(UnknownFormat(other.to_string())),
        })
    }
}

impl fmt::Display for ReasoningFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ReasoningFormat::Auto => "auto",
            ReasoningFormat::None => "none",
            ReasoningFormat::Think => "think",
            ReasoningFormat::Harmony => "harmony",
        })
    }
}

/// Markers only harmony templates write: a channel, or the assistant header a fresh
/// prompt ends with.
const HARMONY_MARKS: [&str; 2] = ["<|channel|>", "<|start|>assistant"];

fn harmony(template: &str) -> bool {
    HARMONY_MARKS.iter().any(|m| template.contains(m))
}

impl ReasoningFormat {
    /// The concrete format for a template (its source, or a prompt it rendered): `Auto`
    /// becomes `Harmony` or `Think`, others stay. `Think` is safe as the default because
    /// it only acts on output that starts with `<think>`.
    pub fn resolve(self, template: &str) -> ReasoningFormat {
        match self {
            ReasoningFormat::Auto if harmony(template) => ReasoningFormat::Harmony,
            ReasoningFormat::Auto => ReasoningFormat::Think,
            other => other,
        }
    }
}

/// A model family's way of writing tool calls.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ToolSyntax {
    /// Hermes / Qwen2.5: `<tool_call>{"name", "arguments"}</tool_call>`.
    Hermes,
    /// Qwen3-Coder: `<tool_call><function=…><parameter=…>…</tool_call>`.
    Qwen3Coder,
    /// Llama 3.x: `{"name", "parameters"}` or `<|python_tag|>…`.
    Llama3,
    /// Mistral: `[TOOL_CALLS]`.
    Mistral,
    /// DeepSeek V3/R1: `<｜tool▁calls▁begin｜>…`.
    DeepSeek,
    /// GLM 4.5: `<tool_call>name<arg_key>…`.
    Glm45,
    /// gpt-oss: `<|channel|>commentary to=functions.x`.
    Harmony,
}

/// A `--tool-syntax` value that names no syntax.
#[derive(Debug, thiserror::Error)]
#[error(
    "unknown tool-call syntax '{0}' (hermes, qwen3coder, llama3, mistral, deepseek, glm45 or \
     harmony)"
)]
pub struct UnknownSyntax(pub String);

impl FromStr for ToolSyntax {
    type Err = UnknownSyntax;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        ToolSyntax::ALL
            .into_iter()
            .find(|t| t.name() == s)
            .ok_or_else(|| UnknownSyntax(s.to_string()))
    }
}

impl fmt::Display for ToolSyntax {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl ToolSyntax {
    /// Every syntax, in the order of the documentation.
    pub const ALL: [ToolSyntax; 7] = [
        ToolSyntax::Hermes,
        ToolSyntax::Qwen3Coder,
        ToolSyntax::Llama3,
        ToolSyntax::Mistral,
        ToolSyntax::DeepSeek,
        ToolSyntax::Glm45,
        ToolSyntax::Harmony,
    ];

    /// The syntax's name on the command line (`--tool-syntax`).
    pub fn name(self) -> &'static str {
        match self {
            ToolSyntax::Hermes => "hermes",
            ToolSyntax::Qwen3Coder => "qwen3coder",
            ToolSyntax::Llama3 => "llama3",
            ToolSyntax::Mistral => "mistral",
            ToolSyntax::DeepSeek => "deepseek",
            ToolSyntax::Glm45 => "glm45",
            ToolSyntax::Harmony => "harmony",
        }
    }

    /// The syntax a template (its source, or a prompt it rendered with tools) teaches its
    /// model, from the markers it writes; `None` when it shows none.
    pub fn detect(template: &str) -> Option<ToolSyntax> {
        let has = |m: &str| template.contains(m);
        Some(if harmony(template) {
            ToolSyntax::Harmony
        } else if has(deepseek::OPEN) {
            ToolSyntax::DeepSeek
        } else if has("<arg_key>") {
            ToolSyntax::Glm45
        } else if has("<function=") && has("<parameter=") {
            ToolSyntax::Qwen3Coder
        } else if has(mistral::OPEN) || has("[AVAILABLE_TOOLS]") {
            ToolSyntax::Mistral
        } else if has(hermes::OPEN) {
            ToolSyntax::Hermes
        } else if has(llama3::PYTHON_TAG) || has("<|start_header_id|>") && has("\"parameters\"") {
            ToolSyntax::Llama3
        } else {
            return None;
        })
    }
}

/// What to parse in one output.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OutputConfig {
    /// The reasoning format (already resolved: `Auto` acts as `Think`).
    pub reasoning: ReasoningFormat,
    /// The prompt opened the reasoning block, so the output starts inside it.
    pub starts_in_reasoning: bool,
    /// The tool syntax to parse, when tools were offered.
    pub tools: Option<ToolSyntax>,
}

impl OutputConfig {
    /// The configuration for `prompt` (the rendered text the model continues): the format
    /// resolved against `template`, and whether the prompt leaves a `<think>` open.
    pub fn for_prompt(
        format: ReasoningFormat,
        template: &str,
        prompt: &str,
        tools: Option<ToolSyntax>,
    ) -> OutputConfig {
        let reasoning = format.resolve(template);
        let starts_in_reasoning = reasoning == ReasoningFormat::Think && {
            let p = prompt.trim_end();
            p.ends_with(stream::THINK_OPEN)
        };
        OutputConfig {
            reasoning,
            starts_in_reasoning,
            tools,
        }
    }
}

/// One tool call of a whole output.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Call {
    /// The function's name.
    pub name: String,
    /// The arguments' JSON text.
    pub arguments: String,
    /// Whether it ended ([`Event::ToolEnd`]); unfinished calls are no calls.
    pub complete: bool,
}

/// The events of an output folded together (for non-streamed answers).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Collected {
    /// All reasoning text.
    pub reasoning: String,
    /// All answer text.
    pub content: String,
    /// Calls in order, finished or not.
    pub calls: Vec<Call>,
}

impl Collected {
    /// Fold one event in.
    pub fn apply(&mut self, ev: Event) {
        match ev {
            Event::Reasoning(t) => self.reasoning.push_str(&t),
            Event::Content(t) => self.content.push_str(&t),
            Event::ToolStart { index, name } => {
                if self.calls.len() <= index {
                    self.calls.resize_with(index + 1, Call::default);
                }
                self.calls[index].name = name;
            }
            Event::ToolArgs { index, delta } => {
                if let Some(c) = self.calls.get_mut(index) {
                    c.arguments.push_str(&delta);
                }
            }
            Event::ToolEnd { index } => {
                if let Some(c) = self.calls.get_mut(index) {
                    c.complete = true;
                }
            }
        }
    }

    /// Fold several events in.
    pub fn extend(&mut self, events: impl IntoIterator<Item = Event>) {
        for ev in events {
            self.apply(ev);
        }
    }

    /// The finished calls only.
    pub fn complete_calls(&self) -> impl Iterator<Item = &Call> {
        self.calls.iter().filter(|c| c.complete)
    }
}

#[cfg(test)]
mod name_tests {
    use super::*;

    #[test]
    fn every_tool_syntax_parses_from_its_name_and_nothing_else_does() {
        for t in ToolSyntax::ALL {
            assert_eq!(t.name().parse::<ToolSyntax>().unwrap(), t);
            assert_eq!(t.to_string(), t.name());
        }
        let err = "Hermes".parse::<ToolSyntax>().unwrap_err().to_string();
        assert!(err.contains("'Hermes'") && err.contains("glm45"), "{err}");
    }
}
