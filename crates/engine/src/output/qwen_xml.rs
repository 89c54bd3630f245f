//! Qwen3-Coder tool calls: `<tool_call>\n<function=name>\n<parameter=key>\nvalue\n</parameter>
//! …</function>\n</tool_call>`. Arguments stream as written: a parameter's key as soon as its
//! tag is whole, a string value's text as it comes (a number or object whole at its end). A
//! literal `</parameter>` inside a value never ends it: only one followed by the next tag does.

use super::scan::{
    Block, BlockState, CallSoFar, close_params, param_value, push_param, push_partial_param,
    skip_ws, starts, trim_newlines, value_end,
};

/// The opening marker (shared with Hermes; the template decides which syntax it is).
pub(crate) const OPEN: &str = "<tool_call>";
const CLOSE: &str = "</tool_call>";
const FUNCTION: &str = "<function=";
const FUNCTION_END: &str = "</function>";
const PARAM: &str = "<parameter=";
const PARAM_END: &str = "</parameter>";

/// A tag's `name>`: the name and the offset after `>`; `Err` when this is no tag name.
pub(crate) fn tag_name(text: &str, end: bool) -> Option<Result<(&str, usize), ()>> {
    match text.find('>') {
        Some(p) if p > 0 && !text[..p].contains(['<', '\n']) => Some(Ok((&text[..p], p + 1))),
        Some(_) => Some(Err(())),
        None if end || text.contains(['<', '\n']) => Some(Err(())),
        None => None,
    }
}

/// Scan a block that starts with [`OPEN`].
pub(crate) fn scan(block: &str, end: bool) -> Block {
    let (rest, ws) = skip_ws(&block[OPEN.len()..]);
    match starts(rest, FUNCTION) {
        Some(false) => return Block::not_a_call(),
        None if end => return Block::not_a_call(),
        None => return Block::open(Vec::new()),
        Some(true) => {}
    }
    let name_at = OPEN.len() + ws + FUNCTION.len();
    let (name, len) = match tag_name(&block[name_at..], end) {
        None => return Block::open(Vec::new()),
        Some(Err(())) => return Block::not_a_call(),
        Some(Ok(n)) => n,
    };
    let mut call = CallSoFar {
        name: name.to_string(),
        args: String::new(),
        closed: false,
    };
    let mut at = name_at + len;
    loop {
        let (rest, ws) = skip_ws(&block[at..]);
        if let Some(true) = starts(rest, FUNCTION_END) {
            close_params(&mut call.args);
            call.closed = true;
            let after = at + ws + FUNCTION_END.len();
            let (tail, ws2) = skip_ws(&block[after..]);
            let state = match starts(tail, CLOSE) {
                Some(true) => BlockState::Done(after + ws2 + CLOSE.len()),
                None if !end => BlockState::Open,
                _ => BlockState::Done(after),
            };
            return Block {
                calls: vec![call],
                state,
            };
        }
        if starts(rest, PARAM) != Some(true) {
            return Block::open(vec![call]);
        }
        let key_at = at + ws + PARAM.len();
        let (key, len) = match tag_name(&block[key_at..], end) {
            None | Some(Err(())) => return Block::open(vec![call]),
            Some(Ok(k)) => k,
        };
        let value_at = key_at + len;
        let next = [PARAM, FUNCTION_END];
        match value_end(&block[value_at..], PARAM_END, &next, end) {
            Some(Ok((v_end, after))) => {
                let raw = trim_newlines(&block[value_at..value_at + v_end]);
                push_param(&mut call.args, key, &param_value(raw));
                at = value_at + after;
            }
            _ => {
                push_partial_param(&mut call.args, key, &block[value_at..], PARAM_END, &next);
                return Block::open(vec![call]);
            }
        }
    }
}
