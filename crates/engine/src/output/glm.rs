//! GLM 4.5 tool calls: `<tool_call>name\n<arg_key>key</arg_key>\n<arg_value>value
//! </arg_value>…</tool_call>`. Arguments stream as written: a key once `</arg_key>` closes it, a
//! string value's text as it comes (a number or object whole at its end). A literal
//! `</arg_value>` inside a value never ends it: only one followed by the next tag does.

use super::scan::{
    Block, BlockState, CallSoFar, close_params, find_any, param_value, push_key, push_param,
    push_partial_param, skip_ws, starts, trim_newlines, value_end,
};

/// The opening marker (shared with Hermes; the template decides which syntax it is).
pub(crate) const OPEN: &str = "<tool_call>";
const CLOSE: &str = "</tool_call>";
const KEY: &str = "<arg_key>";
const KEY_END: &str = "</arg_key>";
const VALUE: &str = "<arg_value>";
const VALUE_END: &str = "</arg_value>";

/// Scan a block that starts with [`OPEN`].
pub(crate) fn scan(block: &str, end: bool) -> Block {
    let body = &block[OPEN.len()..];
    let Some((found, _)) = find_any(body, &["\n", KEY, CLOSE]) else {
        return if end || body.contains(['{', '<']) {
            Block::not_a_call()
        } else {
            Block::open(Vec::new())
        };
    };
    let name = body[..found.pos()].trim();
    if name.is_empty() || name.contains(['{', '<', ' ', '"']) {
        return Block::not_a_call();
    }
    if matches!(found, super::scan::Found::Partial(_)) && !end {
        return Block::open(Vec::new());
    }
    let mut call = CallSoFar {
        name: name.to_string(),
        args: String::new(),
        closed: false,
    };
    let mut at = OPEN.len() + found.pos();
    loop {
        let (rest, ws) = skip_ws(&block[at..]);
        if let Some(true) = starts(rest, CLOSE) {
            close_params(&mut call.args);
            call.closed = true;
            return Block {
                calls: vec![call],
                state: BlockState::Done(at + ws + CLOSE.len()),
            };
        }
        if starts(rest, KEY) != Some(true) {
            return Block::open(vec![call]);
        }
        let key_at = at + ws + KEY.len();
        let Some(k_end) = block[key_at..].find(KEY_END) else {
            return Block::open(vec![call]);
        };
        let key = block[key_at..key_at + k_end].trim().to_string();
        let after_key = key_at + k_end + KEY_END.len();
        let (rest, ws) = skip_ws(&block[after_key..]);
        if starts(rest, VALUE) != Some(true) {
            push_key(&mut call.args, &key);
            return Block::open(vec![call]);
        }
        let value_at = after_key + ws + VALUE.len();
        let next = [KEY, CLOSE];
        match value_end(&block[value_at..], VALUE_END, &next, end) {
            Some(Ok((v_end, after))) => {
                let raw = trim_newlines(&block[value_at..value_at + v_end]);
                push_param(&mut call.args, &key, &param_value(raw));
                at = value_at + after;
            }
            _ => {
                push_partial_param(&mut call.args, &key, &block[value_at..], VALUE_END, &next);
                return Block::open(vec![call]);
            }
        }
    }
}
