//! gpt-oss harmony output: messages `<|channel|>NAME[ to=functions.F][ <|constrain|>json]
//! <|message|>BODY` ended by `<|end|>`, `<|call|>` or `<|return|>`, the next starting with
//! `<|start|>assistant`. `analysis` is reasoning, a recipient `functions.F` a tool call
//! (its body the arguments, streamed), anything else answer text. It must never show a
//! header as text or report a call whose arguments are not whole JSON.

use super::scan::{Found, Json, find_any, json_value, skip_ws, starts};
use super::{Event, Finish};

const START: &str = "<|start|>";
const CHANNEL: &str = "<|channel|>";
const MESSAGE: &str = "<|message|>";
const ENDS: [&str; 4] = [END, "<|call|>", "<|return|>", START];

/// The end of a message.
pub(crate) const END: &str = "<|end|>";
/// The header of a reasoning message, as the model writes it after `<|start|>assistant`.
pub(crate) const ANALYSIS_HEADER: &str = "<|channel|>analysis<|message|>";
/// What ends a reasoning message early and opens the answer (a reasoning budget's close).
pub(crate) const ANALYSIS_TO_FINAL: &str = "<|end|><|start|>assistant<|channel|>final<|message|>";

#[derive(Clone, Debug, PartialEq, Eq)]
enum Body {
    Reasoning,
    Content,
    Call { index: usize, sent: usize },
}

#[derive(Debug, Default)]
pub(crate) struct Harmony {
    pending: String,
    /// The body being read; `None` while a header is.
    body: Option<Body>,
    /// The output is not harmony at all (no header at its start): all answer text.
    plain: bool,
    started: bool,
    next_index: usize,
    unfinished_call: bool,
    reasoning_tokens: usize,
}

impl Harmony {
    pub(crate) fn push(&mut self, text: &str, _special: bool) -> Vec<Event> {
        let was = self.body == Some(Body::Reasoning);
        self.pending.push_str(text);
        let out = self.process(false);
        if was || self.body == Some(Body::Reasoning) {
            self.reasoning_tokens += 1;
        }
        out
    }

    pub(crate) fn finish(mut self) -> Finish {
        let mut events = self.process(true);
        let unclosed_reasoning = self.body == Some(Body::Reasoning);
        if let Some(Body::Call { index, .. }) = self.body.take() {
            // No `<|call|>` (generation stops on it): whole, valid JSON is the call.
            let args = self.pending.trim();
            let whole = matches!(json_value(args), Json::Complete(e) if e == args.len())
                && serde_json::from_str::<serde_json::Value>(args).is_ok();
            if whole {
                events.push(Event::ToolEnd { index });
            } else {
                self.unfinished_call = true;
            }
        }
        Finish {
            events,
            unclosed_reasoning,
            unfinished_call: self.unfinished_call,
            reasoning_tokens: self.reasoning_tokens,
        }
    }

    fn process(&mut self, end: bool) -> Vec<Event> {
        let mut out = Vec::new();
        loop {
            if self.plain {
                if !self.pending.is_empty() {
                    out.push(Event::Content(std::mem::take(&mut self.pending)));
                }
                return out;
            }
            match self.body.clone() {
                None => {
                    if !self.header(end, &mut out) {
                        return out;
                    }
                }
                Some(body) => {
                    if !self.body_text(body, end, &mut out) {
                        return out;
                    }
                }
            }
        }
    }

    /// Read a header up to `<|message|>`; returns whether a body began.
    fn header(&mut self, end: bool, out: &mut Vec<Event>) -> bool {
        let (rest, ws) = skip_ws(&self.pending);
        if !self.started {
            let opens = [START, CHANNEL].map(|m| starts(rest, m));
            if !opens.contains(&Some(true)) {
                if end || opens.iter().all(|s| *s == Some(false)) {
                    self.plain = true;
                    return true;
                }
                return false;
            }
        }
        let Some(m) = rest.find(MESSAGE) else {
            if end {
                self.pending.clear();
            }
            return false;
        };
        let header = &rest[..m];
        self.started = true;
        let channel = header
            .split(CHANNEL)
            .nth(1)
            .and_then(|c| c.split([' ', '<']).next())
            .unwrap_or("");
        let recipient = header
            .split("to=")
            .nth(1)
            .and_then(|r| r.split([' ', '<']).next())
            .and_then(|r| r.strip_prefix("functions."));
        let body = match recipient {
            Some(name) => {
                let index = self.next_index;
                self.next_index += 1;
                out.push(Event::ToolStart {
                    index,
                    name: name.to_string(),
                });
                Body::Call { index, sent: 0 }
            }
            None if channel == "analysis" => Body::Reasoning,
            None => Body::Content,
        };
        self.pending.drain(..ws + m + MESSAGE.len());
        self.body = Some(body);
        true
    }

    /// Read a body; returns whether it ended (a header may follow).
    fn body_text(&mut self, body: Body, end: bool, out: &mut Vec<Event>) -> bool {
        let found = find_any(&self.pending, &ENDS);
        let (upto, ended) = match found {
            Some((Found::At(p), _)) => (p, true),
            Some((Found::Partial(p), _)) if !end => (p, false),
            _ => (self.pending.len(), false),
        };
        match body {
            Body::Reasoning | Body::Content => {
                if upto > 0 {
                    let text = self.pending[..upto].to_string();
                    out.push(if body == Body::Reasoning {
                        Event::Reasoning(text)
                    } else {
                        Event::Content(text)
                    });
                }
                self.pending.drain(..upto);
            }
            Body::Call { index, sent } => {
                // Arguments stay in `pending` until the call ends, so they can be checked.
                if upto > sent {
                    out.push(Event::ToolArgs {
                        index,
                        delta: self.pending[sent..upto].to_string(),
                    });
                }
                self.body = Some(Body::Call { index, sent: upto });
                if !ended {
                    return false;
                }
                let args = self.pending[..upto].trim();
                if serde_json::from_str::<serde_json::Value>(args).is_ok() {
                    out.push(Event::ToolEnd { index });
                } else {
                    self.unfinished_call = true;
                }
                self.pending.drain(..upto);
            }
        }
        if !ended {
            return false;
        }
        // Drop the end marker (a following `<|start|>` belongs to the next header).
        if !self.pending.starts_with(START) {
            let len = ENDS
                .iter()
                .find(|m| self.pending.starts_with(**m))
                .map_or(0, |m| m.len());
            self.pending.drain(..len);
        }
        self.body = None;
        true
    }
}
