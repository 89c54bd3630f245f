//! Text-scanning pieces every tool syntax shares: markers that may be split across tokens,
//! the extent of a JSON value still being generated, and the shape a syntax reports a block
//! in. It must never decide what a block means: that is each syntax's file.

use serde_json::Value;

/// Where a marker is in text that may end in the middle of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Found {
    /// The whole marker starts here.
    At(usize),
    /// The text ends with a proper prefix of the marker, starting here: more text decides.
    Partial(usize),
}

impl Found {
    /// The position, whole or partial.
    pub(crate) fn pos(self) -> usize {
        match self {
            Found::At(p) | Found::Partial(p) => p,
        }
    }
}

/// Length of the longest proper prefix of `marker` that `text` ends with.
pub(crate) fn partial_suffix(text: &str, marker: &str) -> usize {
    (1..marker.len().min(text.len() + 1))
        .rev()
        .find(|&len| {
            text.is_char_boundary(text.len() - len) && marker.starts_with(&text[text.len() - len..])
        })
        .unwrap_or(0)
}

/// The earliest whole occurrence of any of `markers` in `text`, else the earliest partial one
/// at its end.
pub(crate) fn find_any(text: &str, markers: &[&str]) -> Option<(Found, usize)> {
    let whole = markers
        .iter()
        .enumerate()
        .filter_map(|(k, m)| text.find(m).map(|p| (p, k)))
        .min();
    if let Some((p, k)) = whole {
        return Some((Found::At(p), k));
    }
    markers
        .iter()
        .enumerate()
        .filter_map(|(k, m)| {
            let len = partial_suffix(text, m);
            (len > 0).then(|| (text.len() - len, k))
        })
        .min()
        .map(|(p, k)| (Found::Partial(p), k))
}

/// `text` starts with `marker`: `Some(true)`; it could still (text is a proper prefix of it):
/// `None`; it cannot: `Some(false)`.
pub(crate) fn starts(text: &str, marker: &str) -> Option<bool> {
    if text.starts_with(marker) {
        Some(true)
    } else if marker.starts_with(text) {
        None
    } else {
        Some(false)
    }
}

/// Where a JSON value starting at the first byte of some text stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Json {
    /// The value ends at this byte offset.
    Complete(usize),
    /// Everything so far could begin a value.
    Partial,
    /// This cannot be a JSON value.
    Invalid,
}

/// Scan one JSON value from the start of `text` (no leading whitespace), strings and
/// escapes respected, so markers inside strings are just text. Structure only: the caller
/// confirms a complete value with serde_json.
pub(crate) fn json_value(text: &str) -> Json {
    let bytes = text.as_bytes();
    let mut stack: Vec<u8> = Vec::new();
    let mut in_string = false;
    let mut escaped = false;
    let mut scalar = false;
    for (i, &b) in bytes.iter().enumerate() {
        if in_string {
            if escaped {
                escaped = false;
            } else if b == b'\\' {
                escaped = true;
            } else if b == b'"' {
                in_string = false;
                if stack.is_empty() {
                    return Json::Complete(i + 1);
                }
            }
            continue;
        }
        if scalar {
            if b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'+') {
                continue;
            }
            scalar = false;
            if stack.is_empty() {
                return Json::Complete(i);
            }
        }
        match b {
            b'"' => in_string = true,
            b'{' => stack.push(b'}'),
            b'[' => stack.push(b']'),
            b'}' | b']' => {
                if stack.pop() != Some(b) {
                    return Json::Invalid;
                }
                if stack.is_empty() {
                    return Json::Complete(i + 1);
                }
            }
            b if b.is_ascii_alphanumeric() || b == b'-' => scalar = true,
            b' ' | b'\t' | b'\n' | b'\r' | b',' | b':' if !stack.is_empty() => {}
            _ => return Json::Invalid,
        }
    }
    Json::Partial
}

/// `text` with leading JSON whitespace skipped, and how much was skipped.
pub(crate) fn skip_ws(text: &str) -> (&str, usize) {
    let rest = text.trim_start_matches([' ', '\t', '\n', '\r']);
    (rest, text.len() - rest.len())
}

/// One call of a block as far as it has been generated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct CallSoFar {
    /// The function's name (a call is reported only once its name is whole).
    pub name: String,
    /// JSON text of the arguments so far; each scan of a longer block extends it.
    pub args: String,
    /// The call's arguments are whole and valid.
    pub closed: bool,
}

/// Where a block opened by a syntax's marker stands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum BlockState {
    /// More text is needed.
    Open,
    /// The block ended after this many bytes.
    Done(usize),
    /// This is not a tool-call block: its text is ordinary text.
    NotACall,
}

/// What a syntax found in a block (from its opening marker on).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Block {
    /// Calls, in order.
    pub calls: Vec<CallSoFar>,
    /// Where the block stands.
    pub state: BlockState,
}

impl Block {
    pub(crate) fn open(calls: Vec<CallSoFar>) -> Block {
        Block {
            calls,
            state: BlockState::Open,
        }
    }

    pub(crate) fn not_a_call() -> Block {
        Block {
            calls: Vec::new(),
            state: BlockState::NotACall,
        }
    }
}

/// A parameter value of the XML-like syntaxes: JSON when it parses as JSON (numbers,
/// booleans, objects the template wrote with `tojson`), else the text as a string.
pub(crate) fn param_value(raw: &str) -> Value {
    serde_json::from_str::<Value>(raw).unwrap_or_else(|_| Value::String(raw.to_string()))
}

/// Arguments JSON of the XML-like syntaxes: the object opens with the first parameter and
/// grows by one `"key":value` per finished parameter.
pub(crate) fn push_param(args: &mut String, key: &str, value: &Value) {
    push_key(args, key);
    args.push_str(&value.to_string());
}

/// `{"key":` or `,"key":`: what a parameter writes once its name is known.
pub(crate) fn push_key(args: &mut String, key: &str) {
    args.push(if args.is_empty() { '{' } else { ',' });
    args.push_str(&Value::String(key.to_string()).to_string());
    args.push(':');
}

/// Whitespace serde_json skips around a value.
const JSON_WS: [char; 4] = [' ', '\t', '\n', '\r'];

/// Whether no text that starts with `p` parses as JSON, so [`param_value`] will read the
/// value as a string whatever follows. Conservative: `false` means "not known yet".
fn surely_string(p: &str) -> bool {
    let t = p.trim_start_matches(JSON_WS);
    let Some(first) = t.chars().next() else {
        return false;
    };
    match first {
        // An object, array or JSON string: only its whole text says whether it parses.
        '{' | '[' | '"' => false,
        't' | 'f' | 'n' | '-' | '0'..='9' => {
            let run = t
                .find(|c: char| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '+' | '-')))
                .unwrap_or(t.len());
            let (word, after) = t.split_at(run);
            let no_scalar = if first.is_ascii_alphabetic() {
                !["true", "false", "null"]
                    .iter()
                    .any(|l| l.starts_with(word))
            } else {
                word.chars()
                    .any(|c| c.is_ascii_alphabetic() && !matches!(c, 'e' | 'E'))
            };
            no_scalar || !after.trim_start_matches(JSON_WS).is_empty()
        }
        _ => true,
    }
}

/// The part of a value still being generated that is surely the value's text: up to the
/// first `close` that may yet end it (one the next tag follows, or may still follow) or a
/// partial `close` at the end, without the newlines [`param_value`]'s caller trims. Grows
/// monotonically as text is added.
fn settled_value<'a>(text: &'a str, close: &str, next: &[&str]) -> &'a str {
    let mut from = 0;
    let hold = loop {
        let Some(p) = text[from..].find(close) else {
            break text.len() - partial_suffix(&text[from..], close);
        };
        let at = from + p;
        let after = at + close.len();
        let (rest, _) = skip_ws(&text[after..]);
        if rest.is_empty() || next.iter().any(|n| starts(rest, n) != Some(false)) {
            break at;
        }
        from = after;
    };
    trim_newlines(&text[..hold])
}

/// One value's text without the newline the template writes on each side.
pub(crate) fn trim_newlines(v: &str) -> &str {
    let v = v.strip_prefix('\n').unwrap_or(v);
    v.strip_suffix('\n').unwrap_or(v)
}

/// A parameter whose value is still being generated (`text`, up to where the block's text
/// ends): its key, and when the value can only be a string, the string's opening quote and
/// its escaped text so far. A value that may still parse as JSON (a number, `true`, an
/// object) is sent whole when it ends: its JSON text is known only then. What this appends
/// is always a prefix of what [`push_param`] appends once the value ends.
pub(crate) fn push_partial_param(
    args: &mut String,
    key: &str,
    text: &str,
    close: &str,
    next: &[&str],
) {
    push_key(args, key);
    let settled = settled_value(text, close, next);
    if surely_string(settled) {
        let quoted = Value::String(settled.to_string()).to_string();
        // Without the closing quote: more text may follow. JSON escapes each character on
        // its own, so the escaped prefix is a prefix of the escaped whole.
        args.push_str(&quoted[..quoted.len() - 1]);
    }
}

/// Close the arguments object built by [`push_param`].
pub(crate) fn close_params(args: &mut String) {
    if args.is_empty() {
        args.push('{');
    }
    args.push('}');
}

/// Where a value of the XML-like syntaxes ends: at the first `close` that is followed (after
/// whitespace) by one of `next` (or by the end of the output), so a literal closing tag
/// inside a value does not end it. Returns the value's end and the offset after `close`.
pub(crate) fn value_end(
    text: &str,
    close: &str,
    next: &[&str],
    end: bool,
) -> Option<Result<(usize, usize), ()>> {
    let mut from = 0;
    while let Some(p) = text[from..].find(close) {
        let at = from + p;
        let after = at + close.len();
        let (rest, _) = skip_ws(&text[after..]);
        if rest.is_empty() {
            return if end { Some(Ok((at, after))) } else { None };
        }
        let mut undecided = false;
        for n in next {
            match starts(rest, n) {
                Some(true) => return Some(Ok((at, after))),
                None => undecided = true,
                Some(false) => {}
            }
        }
        if undecided {
            return None;
        }
        from = after;
    }
    if end { Some(Err(())) } else { None }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_values_end_where_they_end() {
        assert_eq!(json_value("{\"a\": [1, 2]} tail"), Json::Complete(13));
        assert_eq!(json_value("{\"a\": \"}</tool_call>\"}"), Json::Complete(22));
        assert_eq!(json_value("{\"a\": \"\\\"}\""), Json::Partial);
        assert_eq!(json_value("{\"a\": 1"), Json::Partial);
        assert_eq!(json_value("\"x\""), Json::Complete(3));
        assert_eq!(json_value("12 "), Json::Complete(2));
        assert_eq!(json_value("{]"), Json::Invalid);
        assert_eq!(json_value("<b>"), Json::Invalid);
    }

    #[test]
    fn partial_markers_are_found_at_the_end() {
        assert_eq!(partial_suffix("ab<tool", "<tool_call>"), 5);
        assert_eq!(partial_suffix("ab<tool_call>", "<tool_call>"), 0);
        assert_eq!(
            find_any("x</think>", &["</think>"]),
            Some((Found::At(1), 0))
        );
        assert_eq!(
            find_any("x</thi", &["</think>"]),
            Some((Found::Partial(1), 0))
        );
        assert_eq!(find_any("xyz", &["</think>"]), None);
        // A multi-byte character before the partial marker is no boundary problem.
        assert_eq!(partial_suffix("é<", "<a>"), 1);
    }

    #[test]
    fn xml_values_end_only_before_the_next_tag() {
        let next = ["<parameter=", "</function>"];
        let t = "a</parameter>b</parameter>\n</function>";
        assert_eq!(
            value_end(t, "</parameter>", &next, false),
            Some(Ok((14, 26)))
        );
        assert_eq!(
            value_end("a</parameter>\n</fun", "</parameter>", &next, false),
            None
        );
        assert_eq!(
            value_end("a</parameter>", "</parameter>", &next, true),
            Some(Ok((1, 13)))
        );
        assert_eq!(value_end("a", "</parameter>", &next, true), Some(Err(())));
    }
}
