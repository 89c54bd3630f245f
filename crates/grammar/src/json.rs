//! How JSON is held: the compact options every schema is compiled with, objects closed
//! unless a schema opens them, and JSON mode as a grammar whose blank runs and numbers
//! are bounded. Owns what a schema means beyond what the request wrote; must never loosen a
//! schema (it only closes objects the schema left unsaid and drops a request's own
//! llguidance options).

use serde_json::{Map, Value, json};

use crate::GrammarError;

/// The JSON options every schema is compiled with (llguidance's `x-guidance` key): the
/// separators `json.dumps` writes and no flexible whitespace.
fn options() -> Value {
    json!({"item_separator": ", ", "key_separator": ": ", "whitespace_flexible": false})
}

/// `schema` as it is compiled: objects closed (see [`close_objects`]) and this crate's JSON
/// options; a schema that is not an object or a boolean is refused.
pub(crate) fn compact(schema: &Value) -> Result<Value, GrammarError> {
    let mut schema = match schema {
        Value::Object(o) => o.clone(),
        Value::Bool(true) => Map::new(),
        Value::Bool(false) => {
            return Err(GrammarError::Invalid(
                "the schema 'false' admits no value".into(),
            ));
        }
        _ => {
            return Err(GrammarError::Invalid(
                "a schema must be an object or a boolean".into(),
            ));
        }
    };
    close_objects(&mut schema, false);
    // Ours replaces any the request set: `lenient` there would let keywords be ignored.
    schema.insert("x-guidance".into(), options());
    Ok(Value::Object(schema))
}

/// Gives every object schema that lists `properties` and says nothing of
/// `additionalProperties` an `additionalProperties: false`, as llama.cpp's and xgrammar's
/// converters read such a schema: a model held to a schema writes its keys, not keys of its
/// own. An explicit `additionalProperties` (`true`, or a schema) is kept.
///
/// An object combined with others (one with `allOf` or `$ref` beside its properties, or
/// one of several `allOf` members) stays as written: closing one side of an intersection
/// would refuse the keys the other side lists.
fn close_objects(schema: &mut Map<String, Value>, in_intersection: bool) {
    let combined = in_intersection || schema.contains_key("allOf") || schema.contains_key("$ref");
    if schema.contains_key("properties")
        && !schema.contains_key("additionalProperties")
        && !combined
    {
        schema.insert("additionalProperties".into(), Value::Bool(false));
    }
    let intersection = schema
        .get("allOf")
        .and_then(Value::as_array)
        .is_some_and(|members| members.len() > 1);
    // Only the keywords llguidance reads hold subschemas; `const`, `enum` and annotations
    // hold data, which must never be rewritten.
    for (key, value) in schema.iter_mut() {
        match key.as_str() {
            "properties" | "patternProperties" | "$defs" | "definitions" => {
                if let Value::Object(subschemas) = value {
                    subschemas.values_mut().for_each(|s| close_value(s, false));
                }
            }
            "items" | "prefixItems" | "anyOf" | "oneOf" => match value {
                Value::Array(subschemas) => {
                    subschemas.iter_mut().for_each(|s| close_value(s, false))
                }
                single => close_value(single, false),
            },
            "allOf" => {
                if let Value::Array(members) = value {
                    members
                        .iter_mut()
                        .for_each(|s| close_value(s, intersection));
                }
            }
            "additionalProperties" | "additionalItems" => close_value(value, false),
            _ => {}
        }
    }
}

fn close_value(schema: &mut Value, in_intersection: bool) {
    if let Value::Object(map) = schema {
        close_objects(map, in_intersection);
    }
}

/// Digits a JSON-mode number may have before its point, after it, and in its exponent:
/// more than an f64 carries (17 significant digits), yet finite, so a model that keeps
/// choosing digits is made to end the number. Two exponent digits keep every number
/// inside f64's range (to 1e308), where a parser reads it.
pub(crate) const INT_DIGITS: usize = 20;
pub(crate) const FRACTION_DIGITS: usize = 20;
pub(crate) const EXPONENT_DIGITS: usize = 2;

/// The longest run of blanks JSON mode allows between two of its tokens (and before the
/// object): room for a newline and the indent of pretty-printed JSON, but a run that ends,
/// so a model cannot pad its output to the token limit.
pub(crate) const MAX_BLANKS: usize = 32;

/// JSON mode: one object of any content, as a model writes it (compact or pretty-printed,
/// blanks between tokens in runs of at most [`MAX_BLANKS`]), its numbers of bounded length.
/// A string escape `\u` names one Unicode scalar (a surrogate only in a pair), so every text
/// parses. Only one blank run can come between two tokens: no two `WS` are adjacent.
pub(crate) fn object_lark() -> String {
    format!(
        r#"start: WS? object
value: object | array | STRING | NUMBER | "true" | "false" | "null"
object: "{{" WS? (pair (WS? "," WS? pair)* WS?)? "}}"
pair: STRING WS? ":" WS? value
array: "[" WS? (value (WS? "," WS? value)* WS?)? "]"
WS: /[ \t\r\n]{{1,{MAX_BLANKS}}}/
STRING: /"([^"\\\x00-\x1F]|\\["\\\/bfnrt]|\\u([0-9a-ce-fA-CE-F][0-9a-fA-F]{{3}}|[dD][0-7][0-9a-fA-F]{{2}}|[dD][89aAbB][0-9a-fA-F]{{2}}\\u[dD][c-fC-F][0-9a-fA-F]{{2}}))*"/
NUMBER: /-?(0|[1-9][0-9]{{0,{int}}})(\.[0-9]{{1,{FRACTION_DIGITS}}})?([eE][+-]?[0-9]{{1,{EXPONENT_DIGITS}}})?/
"#,
        int = INT_DIGITS - 1,
    )
}
