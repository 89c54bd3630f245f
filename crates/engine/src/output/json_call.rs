//! A call written as one JSON object, `{"name": …, "arguments": …}` (Hermes, Mistral) or
//! `{"name": …, "parameters": …}` (Llama 3). Arguments stream as generated when the object
//! names the function first, as these models do; another key order is reported whole once
//! the object is. It must never report an object that is not a call as one.

use serde_json::Value;

use super::scan::{CallSoFar, Json, json_value, skip_ws};

/// Where one call object stands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum ObjState {
    /// The object ends at this offset.
    Complete(usize),
    /// More text is needed.
    Partial,
    /// This is not a call object.
    Invalid,
}

const ARG_KEYS: [&str; 2] = ["arguments", "parameters"];

/// The arguments' JSON text from a streamed prefix `{"name": "f", "arguments": …`; `None`
/// when the object does not start that way (yet).
fn streamed_prefix(text: &str) -> Option<(String, &str)> {
    let rest = text.strip_prefix('{')?;
    let (rest, _) = skip_ws(rest);
    let rest = rest.strip_prefix("\"name\"")?;
    let (rest, _) = skip_ws(rest);
    let rest = rest.strip_prefix(':')?;
    let (rest, _) = skip_ws(rest);
    let Json::Complete(end) = json_value(rest) else {
        return None;
    };
    let name = serde_json::from_str::<String>(&rest[..end]).ok()?;
    let (rest, _) = skip_ws(&rest[end..]);
    let rest = rest.strip_prefix(',')?;
    let (rest, _) = skip_ws(rest);
    let rest = ARG_KEYS
        .iter()
        .find_map(|k| rest.strip_prefix(&format!("\"{k}\"")))?;
    let (rest, _) = skip_ws(rest);
    let rest = rest.strip_prefix(':')?;
    let (rest, _) = skip_ws(rest);
    Some((name, rest))
}

/// Scan a call object at the start of `text`.
pub(crate) fn scan(text: &str) -> (Option<CallSoFar>, ObjState) {
    if !text.starts_with('{') {
        return (None, ObjState::Invalid);
    }
    let streamed = streamed_prefix(text);
    match json_value(text) {
        Json::Invalid => (None, ObjState::Invalid),
        Json::Partial => {
            // Arguments given as a JSON string are unescaped when whole; objects stream.
            let call = streamed.map(|(name, args)| {
                let args = match json_value(args) {
                    _ if args.starts_with('"') => String::new(),
                    Json::Complete(e) => args[..e].to_string(),
                    _ => args.to_string(),
                };
                CallSoFar {
                    name,
                    args,
                    closed: false,
                }
            });
            (call, ObjState::Partial)
        }
        Json::Complete(end) => {
            let Ok(Value::Object(obj)) = serde_json::from_str::<Value>(&text[..end]) else {
                return (None, ObjState::Invalid);
            };
            let Some(Value::String(name)) = obj.get("name") else {
                return (None, ObjState::Invalid);
            };
            // An object with a name but no arguments is data (`{"name": "Bob", "age": 3}`).
            let Some(value) = ARG_KEYS.iter().find_map(|k| obj.get(*k)) else {
                return (None, ObjState::Invalid);
            };
            let args = match (value, &streamed) {
                (Value::String(s), _) => s.clone(),
                (v @ (Value::Object(_) | Value::Array(_)), Some((_, raw))) => {
                    // The text streamed so far, exactly: the deltas must add up to it.
                    match json_value(raw) {
                        Json::Complete(e) => raw[..e].to_string(),
                        _ => v.to_string(),
                    }
                }
                (v, _) => v.to_string(),
            };
            let call = CallSoFar {
                name: name.clone(),
                args,
                closed: true,
            };
            (Some(call), ObjState::Complete(end))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arguments_stream_and_end_with_the_object() {
        let full = r#"{"name": "get", "arguments": {"city": "Pa\"ris"}} rest"#;
        let mut last = String::new();
        for cut in 1..=full.len() {
            let (call, state) = scan(&full[..cut]);
            if let Some(c) = call {
                assert!(c.args.starts_with(&last), "{cut}: {} after {last}", c.args);
                last = c.args;
            }
            if state != ObjState::Partial {
                assert_eq!(state, ObjState::Complete(49), "{cut}");
                break;
            }
        }
        assert_eq!(last, r#"{"city": "Pa\"ris"}"#);
    }

    #[test]
    fn other_shapes() {
        let (c, s) = scan(r#"{"arguments": {"a": 1}, "name": "f"}"#);
        assert_eq!(s, ObjState::Complete(36));
        assert_eq!(c.unwrap().args, r#"{"a":1}"#);
        let (c, _) = scan(r#"{"name": "f", "arguments": "{\"a\": 1}"}"#);
        assert_eq!(c.unwrap().args, r#"{"a": 1}"#);
        let (c, _) = scan(r#"{"name": "f", "parameters": {}}"#);
        assert_eq!(c.unwrap().args, "{}");
        assert_eq!(scan(r#"{"title": "x"}"#), (None, ObjState::Invalid));
        assert_eq!(
            scan(r#"{"name": "Bob", "age": 3}"#),
            (None, ObjState::Invalid)
        );
        assert_eq!(scan("not json").1, ObjState::Invalid);
        // A name alone is no call yet: the arguments key must follow.
        assert_eq!(scan(r#"{"name": "Bob", "age"#), (None, ObjState::Partial));
    }
}
