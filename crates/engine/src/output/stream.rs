//! The streaming driver: feeds text through the reasoning phase (`<think>…</think>`) and the
//! answer phase, where a tool syntax's scanner reports each block, and turns those reports
//! into deltas. It must never emit text it may still have to take back: a possible marker
//! split across tokens is held until the next token decides it.

use super::harmony::Harmony;
use super::scan::{Block, BlockState, Found, find_any, skip_ws, starts};
use super::{Event, OutputConfig, ReasoningFormat, ToolSyntax};
use super::{deepseek, glm, hermes, llama3, mistral, qwen_xml};

/// The marker that opens reasoning.
pub const THINK_OPEN: &str = "<think>";
/// The marker that closes it.
pub const THINK_CLOSE: &str = "</think>";

impl ToolSyntax {
    /// Markers that open a block of this syntax anywhere in the answer.
    fn markers(self) -> &'static [&'static str] {
        match self {
            ToolSyntax::Hermes | ToolSyntax::Qwen3Coder | ToolSyntax::Glm45 => &[hermes::OPEN],
            ToolSyntax::Llama3 => &[llama3::PYTHON_TAG],
            ToolSyntax::Mistral => &[mistral::OPEN],
            ToolSyntax::DeepSeek => &[deepseek::OPEN],
            // Harmony calls are channels, parsed by the harmony driver.
            ToolSyntax::Harmony => &[],
        }
    }

    /// Whether an answer that starts with `{` is a block (Llama 3 writes bare JSON).
    fn opens_at_start(self) -> bool {
        self == ToolSyntax::Llama3
    }

    fn scan(self, block: &str, end: bool) -> Block {
        match self {
            ToolSyntax::Hermes => hermes::scan(block, end),
            ToolSyntax::Qwen3Coder => qwen_xml::scan(block, end),
            ToolSyntax::Glm45 => glm::scan(block, end),
            ToolSyntax::Llama3 => llama3::scan(block, end),
            ToolSyntax::Mistral => mistral::scan(block, end),
            ToolSyntax::DeepSeek => deepseek::scan(block, end),
            ToolSyntax::Harmony => Block::not_a_call(),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// Nothing decided yet: the output may open with `<think>`.
    Prelude,
    Reasoning,
    Answer,
}

/// What an output left open when it ended.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Finish {
    /// The last events (held text released, calls recovered from unclosed reasoning).
    pub events: Vec<Event>,
    /// Reasoning never closed.
    pub unclosed_reasoning: bool,
    /// A tool-call block was cut off or malformed; its text is neither content nor a call.
    pub unfinished_call: bool,
    /// Tokens that were (at least partly) reasoning.
    pub reasoning_tokens: usize,
}

/// An incremental parser of one output (see the module doc).
#[derive(Debug)]
pub struct OutputParser {
    config: OutputConfig,
    phase: Phase,
    /// Text not yet released.
    pending: String,
    /// `pending` starts with a tool-call block.
    in_block: bool,
    /// Calls of the current block already announced: their index and arguments sent.
    announced: Vec<(usize, String)>,
    next_index: usize,
    /// Content or a block has been seen in the answer.
    answer_started: bool,
    /// Drop whitespace before the answer (what follows `</think>`).
    trim_start: bool,
    /// A repeated `<think>` right at the start of reasoning is dropped.
    reopen_check: bool,
    unfinished_call: bool,
    reasoning_tokens: usize,
    harmony: Option<Harmony>,
}

impl OutputParser {
    /// A parser for one output.
    pub fn new(config: OutputConfig) -> OutputParser {
        let harmony = (config.reasoning == ReasoningFormat::Harmony
            || config.tools == Some(ToolSyntax::Harmony))
        .then(Harmony::default);
        let phase = match config.reasoning {
            ReasoningFormat::None | ReasoningFormat::Harmony => Phase::Answer,
            _ if config.starts_in_reasoning => Phase::Reasoning,
            _ => Phase::Prelude,
        };
        OutputParser {
            config,
            phase,
            pending: String::new(),
            in_block: false,
            announced: Vec::new(),
            next_index: 0,
            answer_started: false,
            trim_start: false,
            reopen_check: phase == Phase::Reasoning,
            unfinished_call: false,
            reasoning_tokens: 0,
            harmony,
        }
    }

    fn block_syntax(&self) -> Option<ToolSyntax> {
        self.config.tools.filter(|t| *t != ToolSyntax::Harmony)
    }

    /// Feed one token's text. A special token counts only when it is a marker of this
    /// output's formats (others, like end-of-turn tokens, are never text).
    pub fn push(&mut self, text: &str, special: bool) -> Vec<Event> {
        if let Some(h) = &mut self.harmony {
            return h.push(text, special);
        }
        if special && !self.is_marker(text) {
            return Vec::new();
        }
        let was = self.phase == Phase::Reasoning;
        self.pending.push_str(text);
        let out = self.process(false);
        if was || self.phase == Phase::Reasoning {
            self.reasoning_tokens += 1;
        }
        out
    }

    fn is_marker(&self, text: &str) -> bool {
        let think = self.config.reasoning != ReasoningFormat::None
            && (text == THINK_OPEN || text == THINK_CLOSE);
        think
            || self
                .block_syntax()
                .is_some_and(|t| t.markers().contains(&text))
    }

    /// The output ended: release what was held and say what was left open.
    pub fn finish(mut self) -> Finish {
        if let Some(h) = self.harmony.take() {
            return h.finish();
        }
        let mut events = self.process(true);
        let unclosed_reasoning = self.phase == Phase::Reasoning;
        if unclosed_reasoning {
            self.recover(&mut events);
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
            match self.phase {
                Phase::Prelude => {
                    let (rest, ws) = skip_ws(&self.pending);
                    match starts(rest, THINK_OPEN) {
                        Some(true) => {
                            self.pending.drain(..ws + THINK_OPEN.len());
                            self.phase = Phase::Reasoning;
                        }
                        None if !end => return out,
                        _ => self.phase = Phase::Answer,
                    }
                }
                Phase::Reasoning => {
                    if !self.reasoning(end, &mut out) {
                        return out;
                    }
                }
                Phase::Answer => {
                    self.answer(end, &mut out);
                    return out;
                }
            }
        }
    }

    fn reasoning_delta(&mut self, upto: usize, out: &mut Vec<Event>) {
        if upto > 0 {
            out.push(Event::Reasoning(self.pending[..upto].to_string()));
            self.pending.drain(..upto);
        }
    }

    /// Reasoning until `</think>`; returns whether the answer began. With tools, text from a
    /// block's opening marker is held: a block inside reasoning that is never closed is the
    /// model's call (recovered at the end), and a `</think>` inside a call is its text.
    fn reasoning(&mut self, end: bool, out: &mut Vec<Event>) -> bool {
        if self.reopen_check {
            let (rest, ws) = skip_ws(&self.pending);
            match starts(rest, THINK_OPEN) {
                Some(true) => {
                    self.pending.drain(..ws + THINK_OPEN.len());
                    self.reopen_check = false;
                }
                None if !end => return false,
                _ => self.reopen_check = false,
            }
        }
        let tools = self.block_syntax();
        let mut pos = 0;
        let mut hold: Option<usize> = None;
        loop {
            let rest = &self.pending[pos..];
            let close = find_any(rest, &[THINK_CLOSE]).map(|f| f.0);
            let open = tools.and_then(|t| find_any(rest, t.markers()).map(|f| f.0));
            match (close, open) {
                (Some(Found::At(c)), o) if o.is_none_or(|o| c < o.pos()) => {
                    let at = pos + c;
                    self.reasoning_delta(at, out);
                    self.pending.drain(..THINK_CLOSE.len());
                    self.phase = Phase::Answer;
                    self.trim_start = true;
                    return true;
                }
                (_, Some(Found::At(o))) => {
                    let at = pos + o;
                    hold.get_or_insert(at);
                    let syntax = tools.expect("an open marker implies a syntax");
                    match syntax.scan(&self.pending[at..], end).state {
                        BlockState::Done(n) => pos = at + n,
                        BlockState::Open => break,
                        BlockState::NotACall => pos = at + 1,
                    }
                }
                (c, o) => {
                    let partial = [c, o].into_iter().flatten().map(|f| pos + f.pos()).min();
                    hold = match (hold, partial) {
                        (Some(h), Some(p)) => Some(h.min(p)),
                        (h, p) => h.or(p),
                    };
                    break;
                }
            }
        }
        if !end {
            self.reasoning_delta(hold.unwrap_or(self.pending.len()), out);
        }
        false
    }

    /// Unclosed reasoning at the end: each complete block in it is a call (reported once),
    /// everything else stays reasoning; nothing is added.
    fn recover(&mut self, out: &mut Vec<Event>) {
        let tools = self.block_syntax();
        let mut text = std::mem::take(&mut self.pending);
        while let Some(syntax) = tools {
            let Some((Found::At(at), _)) = find_any(&text, syntax.markers()) else {
                break;
            };
            let block = syntax.scan(&text[at..], true);
            let n = match block.state {
                BlockState::Done(n) if block.calls.iter().all(|c| c.closed) => n,
                _ => {
                    // Not a whole call: its text and all that follows stay reasoning.
                    break;
                }
            };
            if at > 0 {
                out.push(Event::Reasoning(text[..at].to_string()));
            }
            for c in block.calls {
                let index = self.next_index;
                self.next_index += 1;
                out.push(Event::ToolStart {
                    index,
                    name: c.name,
                });
                out.push(Event::ToolArgs {
                    index,
                    delta: c.args,
                });
                out.push(Event::ToolEnd { index });
            }
            text.drain(..at + n);
        }
        if !text.is_empty() {
            out.push(Event::Reasoning(text));
        }
    }

    fn content(&mut self, upto: usize, out: &mut Vec<Event>) {
        if upto > 0 {
            out.push(Event::Content(self.pending[..upto].to_string()));
            self.pending.drain(..upto);
            self.answer_started = true;
        }
    }

    fn answer(&mut self, end: bool, out: &mut Vec<Event>) {
        loop {
            if self.in_block {
                if !self.block(end, out) {
                    return;
                }
                continue;
            }
            if self.trim_start {
                let ws = skip_ws(&self.pending).1;
                self.pending.drain(..ws);
                if self.pending.is_empty() {
                    return;
                }
                self.trim_start = false;
            }
            let tools = self.block_syntax();
            if let Some(t) = tools
                && t.opens_at_start()
                && !self.answer_started
            {
                let (rest, ws) = skip_ws(&self.pending);
                if rest.is_empty() && !end {
                    return;
                }
                if rest.starts_with('{') {
                    self.pending.drain(..ws);
                    self.in_block = true;
                    self.answer_started = true;
                    continue;
                }
            }
            let mut markers: Vec<&str> = tools.map_or(&[][..], |t| t.markers()).to_vec();
            if self.config.reasoning == ReasoningFormat::Think {
                // A second `</think>` is the reasoning's marker, never answer text.
                markers.push(THINK_CLOSE);
            }
            match find_any(&self.pending, &markers) {
                Some((Found::At(p), k)) => {
                    self.content(p, out);
                    if markers[k] == THINK_CLOSE {
                        self.pending.drain(..THINK_CLOSE.len());
                    } else {
                        self.in_block = true;
                        self.answer_started = true;
                    }
                }
                Some((Found::Partial(p), _)) if !end => {
                    self.content(p, out);
                    return;
                }
                _ => {
                    self.content(self.pending.len(), out);
                    return;
                }
            }
        }
    }

    /// Advance the block `pending` starts with; returns whether it ended (scanning goes on).
    fn block(&mut self, end: bool, out: &mut Vec<Event>) -> bool {
        let syntax = self.block_syntax().expect("a block implies a syntax");
        let block = syntax.scan(&self.pending, end);
        self.announce(&block, out);
        match block.state {
            BlockState::Done(n) => {
                for (k, (index, _)) in self.announced.iter().enumerate() {
                    if block.calls[k].closed {
                        out.push(Event::ToolEnd { index: *index });
                    } else {
                        self.unfinished_call = true;
                    }
                }
                self.announced.clear();
                self.pending.drain(..n);
                self.in_block = false;
                true
            }
            BlockState::Open => {
                if end {
                    self.unfinished_call = true;
                    self.announced.clear();
                    self.pending.clear();
                    self.in_block = false;
                }
                false
            }
            BlockState::NotACall => {
                self.in_block = false;
                if !self.announced.is_empty() {
                    // Announced, then malformed: the call stays unfinished; its text is the
                    // model's and is shown.
                    self.unfinished_call = true;
                    self.announced.clear();
                    self.content(self.pending.len(), out);
                    return true;
                }
                let marker = syntax
                    .markers()
                    .iter()
                    .find(|m| self.pending.starts_with(**m))
                    .map_or(1, |m| m.len());
                self.content(marker, out);
                true
            }
        }
    }

    /// Announce new calls and send the arguments each has gained.
    fn announce(&mut self, block: &Block, out: &mut Vec<Event>) {
        for (k, c) in block.calls.iter().enumerate() {
            if k == self.announced.len() {
                let index = self.next_index;
                self.next_index += 1;
                out.push(Event::ToolStart {
                    index,
                    name: c.name.clone(),
                });
                self.announced.push((index, String::new()));
            }
            let (index, sent) = &mut self.announced[k];
            if c.args.len() > sent.len() && c.args.starts_with(sent.as_str()) {
                out.push(Event::ToolArgs {
                    index: *index,
                    delta: c.args[sent.len()..].to_string(),
                });
                sent.clone_from(&c.args);
            }
        }
    }
}

#[cfg(test)]
mod tests;
