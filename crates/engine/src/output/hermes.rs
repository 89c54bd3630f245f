//! Hermes / Qwen2.5 tool calls: `<tool_call>{"name": …, "arguments": …}</tool_call>`.
//! Never ends a call at a closing tag inside the JSON: the object's extent decides.

use super::json_call::{self, ObjState};
use super::scan::{Block, BlockState, skip_ws, starts};

/// The opening marker.
pub(crate) const OPEN: &str = "<tool_call>";
const CLOSE: &str = "</tool_call>";

/// Scan a block that starts with [`OPEN`].
pub(crate) fn scan(block: &str, end: bool) -> Block {
    let body = &block[OPEN.len()..];
    let (rest, ws) = skip_ws(body);
    if rest.is_empty() {
        return if end {
            Block::not_a_call()
        } else {
            Block::open(Vec::new())
        };
    }
    let (call, state) = json_call::scan(rest);
    let calls: Vec<_> = call.into_iter().collect();
    match state {
        ObjState::Invalid => Block::not_a_call(),
        ObjState::Partial => Block::open(calls),
        ObjState::Complete(e) => {
            let after = OPEN.len() + ws + e;
            let (tail, ws2) = skip_ws(&block[after..]);
            let state = match starts(tail, CLOSE) {
                Some(true) => BlockState::Done(after + ws2 + CLOSE.len()),
                // The closing tag may still come; at the end of the output the object is
                // whole, so the call is too.
                None if !end => BlockState::Open,
                _ => BlockState::Done(after),
            };
            Block { calls, state }
        }
    }
}
