//! How `ferrite run` shows a model's reasoning: dimmed on a terminal, between plain marker
//! lines when stdout is a pipe or file (so a reader can still tell it from the answer), or
//! not at all with `--hide-reasoning`; and the `--reasoning-format` flag `run` and `serve`
//! share.
//!
//! The markup is split by `ferrite_engine::output` (the parser the server uses); this module
//! must never parse text itself, nor let reasoning reach the output unmarked.

use ferrite_engine::output::{Event, OutputConfig, OutputParser, ReasoningFormat};

/// `--reasoning-format`, one flag for `run` and `serve`.
#[derive(clap::Args)]
pub struct ReasoningFormatArg {
    /// How reasoning is marked in the output: auto (from the chat template), none (no
    /// parsing), think (`<think>…</think>` at the start) or harmony (gpt-oss channels).
    #[arg(long, default_value = "auto")]
    pub reasoning_format: ReasoningFormat,
}

/// ANSI faint intensity, and back to normal.
const DIM: &str = "\x1b[2m";
const UNDIM: &str = "\x1b[22m";
/// Reasoning closed on a terminal: normal intensity, a blank line before the answer.
const DIM_CLOSE: &str = "\x1b[22m\n\n";
/// Where plain output opens and closes reasoning.
const PLAIN_OPEN: &str = "[reasoning]\n";
const PLAIN_CLOSE: &str = "\n[end of reasoning]\n\n";
/// Plain output that ended inside reasoning.
const PLAIN_UNCLOSED: &str = "\n[reasoning not closed]";

/// How reasoning is written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Style {
    /// Faint text (stdout is a terminal).
    Dim,
    /// Between marker lines (stdout is not a terminal).
    Plain,
    /// Not written (`--hide-reasoning`).
    Hidden,
}

impl Style {
    /// The style for `--hide-reasoning` and whether stdout is a terminal.
    pub(super) fn new(hide: bool, terminal: bool) -> Style {
        match (hide, terminal) {
            (true, _) => Style::Hidden,
            (false, true) => Style::Dim,
            (false, false) => Style::Plain,
        }
    }
}

/// One output on its way to stdout: text in, what to write out.
pub(super) struct Shown {
    parser: OutputParser,
    screen: Screen,
}

/// What has been written so far.
struct Screen {
    style: Style,
    /// The last text written was reasoning (its opening is written, its close not yet).
    in_reasoning: bool,
}

impl Shown {
    /// A view of one output read with `config`.
    pub(super) fn new(config: OutputConfig, style: Style) -> Shown {
        Shown {
            parser: OutputParser::new(config),
            screen: Screen {
                style,
                in_reasoning: false,
            },
        }
    }

    /// The next decoded text; returns what to write.
    pub(super) fn push(&mut self, text: &str) -> String {
        if text.is_empty() {
            return String::new();
        }
        let events = self.parser.push(text, false);
        self.screen.render(events)
    }

    /// The output ended: what is left to write, and whether reasoning was never closed.
    pub(super) fn finish(self) -> (String, bool) {
        let fin = self.parser.finish();
        let mut screen = self.screen;
        let mut out = screen.render(fin.events);
        if screen.in_reasoning {
            out.push_str(match screen.style {
                Style::Dim => UNDIM,
                Style::Plain => PLAIN_UNCLOSED,
                Style::Hidden => "",
            });
        }
        (out, fin.unclosed_reasoning)
    }
}

impl Screen {
    fn render(&mut self, events: Vec<Event>) -> String {
        let mut out = String::new();
        for ev in events {
            match ev {
                Event::Reasoning(text) => {
                    if !self.in_reasoning {
                        self.in_reasoning = true;
                        out.push_str(match self.style {
                            Style::Dim => DIM,
                            Style::Plain => PLAIN_OPEN,
                            Style::Hidden => "",
                        });
                    }
                    if self.style != Style::Hidden {
                        out.push_str(&text);
                    }
                }
                Event::Content(text) => {
                    if self.in_reasoning {
                        self.in_reasoning = false;
                        out.push_str(match self.style {
                            Style::Dim => DIM_CLOSE,
                            Style::Plain => PLAIN_CLOSE,
                            Style::Hidden => "",
                        });
                    }
                    out.push_str(&text);
                }
                // `run` offers no tools, so its outputs are parsed for none.
                Event::ToolStart { .. } | Event::ToolArgs { .. } | Event::ToolEnd { .. } => {}
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(starts_in_reasoning: bool) -> OutputConfig {
        OutputConfig {
            reasoning: ReasoningFormat::Think,
            starts_in_reasoning,
            tools: None,
        }
    }

    /// Every piece of `pieces` through one view, and what it wrote.
    fn show(style: Style, starts: bool, pieces: &[&str]) -> (String, bool) {
        let mut shown = Shown::new(config(starts), style);
        let mut out: String = pieces.iter().map(|p| shown.push(p)).collect();
        let (tail, unclosed) = shown.finish();
        out.push_str(&tail);
        (out, unclosed)
    }

    const SPLIT: [&str; 6] = ["<thi", "nk>sun", " is hot</", "think>", "\n\nYes", "."];

    #[test]
    fn a_terminal_gets_dim_reasoning_then_the_answer() {
        let (out, unclosed) = show(Style::Dim, false, &SPLIT);
        assert_eq!(out, "\x1b[2msun is hot\x1b[22m\n\nYes.");
        assert!(!unclosed);
    }

    #[test]
    fn a_pipe_gets_reasoning_between_marker_lines() {
        let (out, _) = show(Style::Plain, false, &SPLIT);
        assert_eq!(out, "[reasoning]\nsun is hot\n[end of reasoning]\n\nYes.");
    }

    #[test]
    fn hidden_reasoning_leaves_only_the_answer() {
        assert_eq!(show(Style::Hidden, false, &SPLIT).0, "Yes.");
    }

    #[test]
    fn output_without_reasoning_is_written_as_it_came() {
        for style in [Style::Dim, Style::Plain, Style::Hidden] {
            assert_eq!(
                show(style, false, &["Hel", "lo <think>"]).0,
                "Hello <think>"
            );
        }
    }

    /// A prompt that opened `<think>`: the output starts as reasoning, and an output that
    /// never closes it still ends with normal intensity (or the plain note).
    #[test]
    fn unclosed_reasoning_is_closed_on_screen_and_reported() {
        assert_eq!(
            show(Style::Dim, true, &["hmm"]),
            ("\x1b[2mhmm\x1b[22m".to_string(), true)
        );
        assert_eq!(
            show(Style::Plain, true, &["hmm"]),
            ("[reasoning]\nhmm\n[reasoning not closed]".to_string(), true)
        );
        assert_eq!(show(Style::Hidden, true, &["hmm"]), (String::new(), true));
        assert_eq!(
            show(Style::Plain, true, &["hmm</think>ok"]).0,
            "[reasoning]\nhmm\n[end of reasoning]\n\nok"
        );
    }

    #[test]
    fn format_none_shows_think_markup_as_answer() {
        let mut shown = Shown::new(
            OutputConfig {
                reasoning: ReasoningFormat::None,
                ..config(false)
            },
            Style::Hidden,
        );
        let mut out = shown.push("<think>a</think>b");
        out.push_str(&shown.finish().0);
        assert_eq!(out, "<think>a</think>b");
    }

    #[test]
    fn the_style_follows_the_flag_then_the_terminal() {
        assert_eq!(Style::new(true, true), Style::Hidden);
        assert_eq!(Style::new(true, false), Style::Hidden);
        assert_eq!(Style::new(false, true), Style::Dim);
        assert_eq!(Style::new(false, false), Style::Plain);
    }
}
