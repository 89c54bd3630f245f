//! Llama 3.x tool calls: the answer is `{"name": …, "parameters": …}` (optionally after
//! `<|python_tag|>`), several separated by `;`. Never takes JSON data for a call: the object
//! needs a name and arguments.

use super::json_call::{self, ObjState};
use super::scan::{Block, BlockState, CallSoFar, skip_ws};

/// The optional opening marker (a special token of Llama 3.1).
pub(crate) const PYTHON_TAG: &str = "<|python_tag|>";

/// Scan a block that starts with [`PYTHON_TAG`] or with the answer's first `{`.
pub(crate) fn scan(block: &str, end: bool) -> Block {
    let mut at = block
        .strip_prefix(PYTHON_TAG)
        .map_or(0, |_| PYTHON_TAG.len());
    let mut calls: Vec<CallSoFar> = Vec::new();
    loop {
        let (rest, ws) = skip_ws(&block[at..]);
        if rest.is_empty() && !end {
            return Block::open(calls);
        }
        let (call, state) = json_call::scan(rest);
        match state {
            ObjState::Invalid if calls.is_empty() => return Block::not_a_call(),
            ObjState::Invalid => {
                return Block {
                    calls,
                    state: BlockState::Done(at),
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
                    Some(';') => at = after + ws2 + 1,
                    None if !end => return Block::open(calls),
                    _ => {
                        return Block {
                            calls,
                            state: BlockState::Done(after),
                        };
                    }
                }
            }
        }
    }
}
