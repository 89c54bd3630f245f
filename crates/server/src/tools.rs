//! Tool calls in Hermes format: the model writes `<tool_call>{"name": …, "arguments": …}
//! </tool_call>` blocks, which become OpenAI `tool_calls` (arguments as a JSON string).

use serde_json::{Value, json};

const OPEN: &str = "<tool_call>";
const CLOSE: &str = "</tool_call>";

/// Text with its tool calls taken out.
#[derive(Debug, PartialEq)]
pub struct Parsed {
    /// Text outside the tool-call blocks, if any.
    pub content: Option<String>,
    /// OpenAI-shaped tool calls, without ids: each API names them under its answer's id.
    pub calls: Vec<Value>,
}

/// Parse every complete `<tool_call>` block; `None` when there is none that parses.
pub fn parse_tool_calls(text: &str) -> Option<Parsed> {
    let mut calls = Vec::new();
    let mut content = String::new();
    let mut rest = text;
    while let Some(start) = rest.find(OPEN) {
        content.push_str(&rest[..start]);
        let after = &rest[start + OPEN.len()..];
        let (body, next) = match after.find(CLOSE) {
            Some(end) => (&after[..end], &after[end + CLOSE.len()..]),
            None => (after, ""),
        };
        let call: Value = serde_json::from_str(body.trim()).ok()?;
        let name = call.get("name")?.as_str()?;
        let args = call.get("arguments").cloned().unwrap_or(json!({}));
        let args = match args {
            Value::String(s) => s,
            other => other.to_string(),
        };
        calls.push(json!({
            "type": "function",
            "function": {"name": name, "arguments": args},
        }));
        rest = next;
    }
    content.push_str(rest);
    if calls.is_empty() {
        return None;
    }
    let content = content.trim();
    Some(Parsed {
        content: (!content.is_empty()).then(|| content.to_string()),
        calls,
    })
}

/// Streaming side: passes text through until a `<tool_call>` may begin, then holds the rest
/// to parse it at the end.
#[derive(Debug)]
pub struct StreamSplitter {
    enabled: bool,
    seen: String,
    emitted: usize,
    calls: Option<Vec<Value>>,
}

impl StreamSplitter {
    /// A splitter; disabled ones pass everything through.
    pub fn new(enabled: bool) -> StreamSplitter {
        StreamSplitter {
            enabled,
            seen: String::new(),
            emitted: 0,
            calls: None,
        }
    }

    /// Add text; returns what may be shown now. On the last push, held text that did not
    /// parse as tool calls is released.
    pub fn push(&mut self, text: &str, last: bool) -> String {
        if !self.enabled {
            return text.to_string();
        }
        self.seen.push_str(text);
        let limit = if last {
            match parse_tool_calls(&self.seen[self.emitted..]) {
                Some(parsed) => {
                    self.calls = Some(parsed.calls);
                    self.seen
                        .find(OPEN)
                        .unwrap_or(self.seen.len())
                        .max(self.emitted)
                }
                None => self.seen.len(),
            }
        } else if let Some(at) = self.seen.find(OPEN) {
            at.max(self.emitted)
        } else {
            let mut keep = 0;
            for len in (1..OPEN.len()).rev() {
                if self.seen.len() >= len
                    && self.seen.is_char_boundary(self.seen.len() - len)
                    && OPEN.starts_with(&self.seen[self.seen.len() - len..])
                {
                    keep = len;
                    break;
                }
            }
            self.seen.len() - keep
        };
        let out = self.seen[self.emitted..limit].to_string();
        self.emitted = limit;
        out
    }

    /// Tool calls found at the end, if any.
    pub fn calls(&mut self) -> Option<Vec<Value>> {
        self.calls.take()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_hermes_blocks() {
        let text = "ok <tool_call>\n{\"name\": \"get\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
        let p = parse_tool_calls(text).unwrap();
        assert_eq!(p.content.as_deref(), Some("ok"));
        assert_eq!(p.calls[0]["function"]["name"], "get");
        assert_eq!(p.calls[0]["function"]["arguments"], "{\"city\":\"Paris\"}");
        assert!(parse_tool_calls("plain text").is_none());
        assert!(parse_tool_calls("<tool_call>not json</tool_call>").is_none());
    }

    #[test]
    fn splitter_holds_tool_calls_back() {
        let mut s = StreamSplitter::new(true);
        let mut shown = s.push("Hi <tool", false);
        shown += &s.push("_call>{\"name\":\"f\",\"arguments\":{}}", false);
        shown += &s.push("</tool_call>", true);
        assert_eq!(shown, "Hi ");
        assert_eq!(s.calls().unwrap().len(), 1);
        let mut plain = StreamSplitter::new(true);
        let mut shown = plain.push("a <tool", false);
        shown += &plain.push("box", true);
        assert_eq!(shown, "a <toolbox");
        assert!(plain.calls().is_none());
    }
}
