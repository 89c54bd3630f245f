//! DeepSeek V3/R1 tool calls: `<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>name
//! \n```json\n{…}\n```<｜tool▁call▁end｜>…<｜tool▁calls▁end｜>`, and V3.1's
//! `<｜tool▁call▁begin｜>name<｜tool▁sep｜>{…}<｜tool▁call▁end｜>`. Arguments stream as their JSON
//! is generated; markers inside JSON strings are text.

use super::scan::{Block, BlockState, CallSoFar, Json, json_value, skip_ws, starts};

/// The opening marker.
pub(crate) const OPEN: &str = "<｜tool▁calls▁begin｜>";
const CLOSE: &str = "<｜tool▁calls▁end｜>";
const CALL: &str = "<｜tool▁call▁begin｜>";
const CALL_END: &str = "<｜tool▁call▁end｜>";
const SEP: &str = "<｜tool▁sep｜>";
const FENCE: &str = "```json";

/// Scan a block that starts with [`OPEN`].
pub(crate) fn scan(block: &str, end: bool) -> Block {
    let mut calls: Vec<CallSoFar> = Vec::new();
    let mut at = OPEN.len();
    loop {
        let (rest, ws) = skip_ws(&block[at..]);
        if let Some(true) = starts(rest, CLOSE) {
            return Block {
                calls,
                state: BlockState::Done(at + ws + CLOSE.len()),
            };
        }
        match starts(rest, CALL) {
            Some(true) => {}
            Some(false) if calls.is_empty() => return Block::not_a_call(),
            _ if end && calls.iter().all(|c| c.closed) && !calls.is_empty() => {
                return Block {
                    calls,
                    state: BlockState::Done(at),
                };
            }
            _ => return Block::open(calls),
        }
        let head_at = at + ws + CALL.len();
        let Some(sep) = block[head_at..].find(SEP) else {
            return Block::open(calls);
        };
        let head = &block[head_at..head_at + sep];
        let mut args_at = head_at + sep + SEP.len();
        let name = if head == "function" {
            // V3/R1: the name runs to the line's end, then a fenced JSON block.
            let Some(nl) = block[args_at..].find('\n') else {
                return Block::open(calls);
            };
            let name = block[args_at..args_at + nl].trim().to_string();
            let (rest, ws) = skip_ws(&block[args_at + nl..]);
            match starts(rest, FENCE) {
                Some(true) => args_at += nl + ws + FENCE.len(),
                Some(false) => return Block::not_a_call(),
                None => return Block::open(calls),
            }
            name
        } else {
            head.trim().to_string()
        };
        let (args, ws) = skip_ws(&block[args_at..]);
        let mut call = CallSoFar {
            name,
            args: String::new(),
            closed: false,
        };
        match json_value(args) {
            Json::Invalid => return Block::not_a_call(),
            Json::Partial => {
                call.args = args.to_string();
                calls.push(call);
                return Block::open(calls);
            }
            Json::Complete(e) => {
                call.args = args[..e].to_string();
                call.closed = serde_json::from_str::<serde_json::Value>(&args[..e]).is_ok();
                let mut after = args_at + ws + e;
                let fenced = head == "function";
                calls.push(call);
                let (mut tail, mut ws2) = skip_ws(&block[after..]);
                if fenced {
                    match starts(tail, "```") {
                        Some(true) => {
                            after += ws2 + 3;
                            (tail, ws2) = skip_ws(&block[after..]);
                        }
                        _ => return Block::open(calls),
                    }
                }
                match starts(tail, CALL_END) {
                    Some(true) => at = after + ws2 + CALL_END.len(),
                    _ => return Block::open(calls),
                }
            }
        }
    }
}
