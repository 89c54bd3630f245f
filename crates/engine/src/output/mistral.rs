//! Mistral tool calls: `[TOOL_CALLS]` then a JSON array of `{"name", "arguments"}` objects
//! (v3 tokenizers) or `name[ARGS]{…}` (v11 and later; one marker per call). Never reads a
//! call name containing anything but a function name's characters.

use super::json_call::{self, ObjState};
use super::scan::{Block, BlockState, CallSoFar, Json, json_value, skip_ws, starts};

/// The opening marker.
pub(crate) const OPEN: &str = "[TOOL_CALLS]";
const ARGS: &str = "[ARGS]";

fn name_char(c: char) -> bool {
    c.is_alphanumeric() || matches!(c, '_' | '-' | '.')
}

/// Scan a block that starts with [`OPEN`].
pub(crate) fn scan(block: &str, end: bool) -> Block {
    let (rest, ws) = skip_ws(&block[OPEN.len()..]);
    let start = OPEN.len() + ws;
    match rest.chars().next() {
        None if end => Block::not_a_call(),
        None => Block::open(Vec::new()),
        Some('[') => array(block, start + 1, end),
        Some(_) => named(block, start, end),
    }
}

fn array(block: &str, mut at: usize, end: bool) -> Block {
    let mut calls: Vec<CallSoFar> = Vec::new();
    loop {
        let (rest, ws) = skip_ws(&block[at..]);
        if rest.is_empty() {
            return if end && calls.is_empty() {
                Block::not_a_call()
            } else {
                Block::open(calls)
            };
        }
        if rest.starts_with(']') && calls.is_empty() {
            return Block::not_a_call();
        }
        let (call, state) = json_call::scan(rest);
        match state {
            ObjState::Invalid => {
                return if calls.is_empty() {
                    Block::not_a_call()
                } else {
                    Block::open(calls)
                };
            }
            ObjState::Partial => {
                calls.extend(call);
                return Block::open(calls);
            }
            ObjState::Complete(e) => {
                calls.extend(call);
                let after = at + ws + e;
                let (tail, ws2) = skip_ws(&block[after..]);
                match tail.chars().next() {
                    Some(',') => at = after + ws2 + 1,
                    Some(']') => {
                        return Block {
                            calls,
                            state: BlockState::Done(after + ws2 + 1),
                        };
                    }
                    None if !end => return Block::open(calls),
                    // An array cut short or followed by other text is not a whole block.
                    _ => return Block::open(calls),
                }
            }
        }
    }
}

fn named(block: &str, at: usize, end: bool) -> Block {
    let rest = &block[at..];
    let name_len = rest.find(|c: char| !name_char(c)).unwrap_or(rest.len());
    let after_name = &rest[name_len..];
    if name_len == 0 {
        return Block::not_a_call();
    }
    match starts(after_name, ARGS) {
        Some(false) => return Block::not_a_call(),
        None if end => return Block::not_a_call(),
        None => return Block::open(Vec::new()),
        Some(true) => {}
    }
    let name = rest[..name_len].to_string();
    let args_at = at + name_len + ARGS.len();
    let (args, ws) = skip_ws(&block[args_at..]);
    let call = |args: &str, closed| CallSoFar {
        name: name.clone(),
        args: args.to_string(),
        closed,
    };
    match json_value(args) {
        Json::Invalid => Block::not_a_call(),
        Json::Partial => Block::open(vec![call(args, false)]),
        Json::Complete(e) => {
            if serde_json::from_str::<serde_json::Value>(&args[..e]).is_err() {
                return Block::not_a_call();
            }
            Block {
                calls: vec![call(&args[..e], true)],
                state: BlockState::Done(args_at + ws + e),
            }
        }
    }
}
