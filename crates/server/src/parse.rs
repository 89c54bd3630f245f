//! Typed reading of JSON request bodies with API-shaped errors.
//!
//! Bodies are parsed to `serde_json::Value` and read field by field, so every wrong type,
//! out-of-range number or non-integer count becomes a 400 naming the field; unknown fields
//! are ignored and `null` counts as absent (SDKs send both).

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::http::StatusCode;
use serde_json::{Map, Value};

use crate::error::ApiError;

/// A JSON object body.
pub type Obj = Map<String, Value>;

/// Turn the raw body (or its rejection, e.g. over the size limit) into a JSON object.
pub fn body_object(body: Result<Bytes, BytesRejection>) -> Result<Obj, ApiError> {
    let bytes = body.map_err(|rej| {
        let status = rej.status();
        if status == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::new(status, "request body is larger than the server's limit")
        } else {
            ApiError::bad_request(format!("could not read the request body: {rej}"))
        }
    })?;
    let value: Value = serde_json::from_slice(&bytes)
        .map_err(|e| ApiError::bad_request(format!("request body is not valid JSON: {e}")))?;
    match value {
        Value::Object(map) => Ok(map),
        _ => Err(ApiError::bad_request("request body must be a JSON object")),
    }
}

/// A present, non-null field.
pub fn field<'a>(obj: &'a Obj, key: &str) -> Option<&'a Value> {
    obj.get(key).filter(|v| !v.is_null())
}

/// An optional string field.
pub fn opt_str<'a>(obj: &'a Obj, key: &str) -> Result<Option<&'a str>, ApiError> {
    match field(obj, key) {
        None => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(_) => Err(ApiError::invalid_param(
            key,
            format!("'{key}' must be a string"),
        )),
    }
}

/// An optional boolean field.
pub fn opt_bool(obj: &Obj, key: &str) -> Result<Option<bool>, ApiError> {
    match field(obj, key) {
        None => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(_) => Err(ApiError::invalid_param(
            key,
            format!("'{key}' must be a boolean"),
        )),
    }
}

/// An optional number field within `[min, max]`.
pub fn opt_f32(obj: &Obj, key: &str, min: f64, max: f64) -> Result<Option<f32>, ApiError> {
    match field(obj, key) {
        None => Ok(None),
        Some(Value::Number(n)) => match n.as_f64() {
            Some(x) if x.is_finite() && (min..=max).contains(&x) => Ok(Some(x as f32)),
            _ => Err(ApiError::invalid_param(
                key,
                format!("'{key}' must be a number between {min} and {max}, got {n}"),
            )),
        },
        Some(_) => Err(ApiError::invalid_param(
            key,
            format!("'{key}' must be a number"),
        )),
    }
}

/// An optional integer field within `[min, max]`; fractions and huge values are rejected.
pub fn opt_u64(obj: &Obj, key: &str, min: u64, max: u64) -> Result<Option<u64>, ApiError> {
    match field(obj, key) {
        None => Ok(None),
        Some(v) => int_value(v, key, min, max).map(Some),
    }
}

/// An integer value within `[min, max]`, named `key` in errors.
pub fn int_value(v: &Value, key: &str, min: u64, max: u64) -> Result<u64, ApiError> {
    match v.as_u64() {
        Some(x) if (min..=max).contains(&x) => Ok(x),
        _ => Err(ApiError::invalid_param(
            key,
            format!("'{key}' must be an integer between {min} and {max}, got {v}"),
        )),
    }
}

/// An optional seed: any integer that fits 64 bits (negative values wrap, as some SDKs
/// send signed seeds).
pub fn opt_seed(obj: &Obj, key: &str) -> Result<Option<u64>, ApiError> {
    match field(obj, key) {
        None => Ok(None),
        Some(v) => v
            .as_u64()
            .or_else(|| v.as_i64().map(|x| x as u64))
            .map(Some)
            .ok_or_else(|| ApiError::invalid_param(key, format!("'{key}' must be an integer"))),
    }
}

/// Most stop strings a request may carry: each is matched against the text after every
/// generated token.
pub const MAX_STOPS: usize = 16;

/// Stop strings: a string or an array of strings.
pub fn opt_stops(obj: &Obj, key: &str) -> Result<Vec<String>, ApiError> {
    let not_strings = || {
        ApiError::invalid_param(
            key,
            format!("'{key}' must be a string or an array of strings"),
        )
    };
    let stops = match field(obj, key) {
        None => Vec::new(),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(items)) => items
            .iter()
            .map(|v| v.as_str().map(str::to_string).ok_or_else(not_strings))
            .collect::<Result<_, _>>()?,
        Some(_) => return Err(not_strings()),
    };
    if stops.len() > MAX_STOPS {
        return Err(ApiError::invalid_param(
            key,
            format!("at most {MAX_STOPS} stop strings are supported"),
        ));
    }
    Ok(stops)
}

/// An array field's items.
pub fn opt_array<'a>(obj: &'a Obj, key: &str) -> Result<Option<&'a Vec<Value>>, ApiError> {
    match field(obj, key) {
        None => Ok(None),
        Some(Value::Array(a)) => Ok(Some(a)),
        Some(_) => Err(ApiError::invalid_param(
            key,
            format!("'{key}' must be an array"),
        )),
    }
}

/// An object field.
pub fn opt_object<'a>(obj: &'a Obj, key: &str) -> Result<Option<&'a Obj>, ApiError> {
    match field(obj, key) {
        None => Ok(None),
        Some(Value::Object(o)) => Ok(Some(o)),
        Some(_) => Err(ApiError::invalid_param(
            key,
            format!("'{key}' must be an object"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obj(text: &str) -> Obj {
        body_object(Ok(Bytes::from(text.to_string()))).unwrap()
    }

    #[test]
    fn integers_reject_fractions_negatives_and_huge_values() {
        for bad in [
            r#"{"n": 1.5}"#,
            r#"{"n": -1}"#,
            r#"{"n": 1e308}"#,
            r#"{"n": 99999999999999999999999}"#,
            r#"{"n": "3"}"#,
        ] {
            let e = opt_u64(&obj(bad), "n", 1, 128).unwrap_err();
            assert_eq!(e.status, StatusCode::BAD_REQUEST, "{bad}");
            assert_eq!(e.param.as_deref(), Some("n"));
        }
        assert_eq!(opt_u64(&obj(r#"{"n": 3}"#), "n", 1, 128).unwrap(), Some(3));
        assert_eq!(opt_u64(&obj(r#"{"n": null}"#), "n", 1, 128).unwrap(), None);
    }

    #[test]
    fn nan_and_infinity_are_not_json() {
        for bad in [r#"{"t": NaN}"#, r#"{"t": Infinity}"#, "{", "[1]", ""] {
            assert!(body_object(Ok(Bytes::from(bad))).is_err(), "{bad}");
        }
    }

    #[test]
    fn floats_are_range_checked() {
        assert!(opt_f32(&obj(r#"{"t": 3}"#), "t", 0.0, 2.0).is_err());
        assert!(opt_f32(&obj(r#"{"t": 1e300}"#), "t", 0.0, 2.0).is_err());
        assert_eq!(
            opt_f32(&obj(r#"{"t": 0.5}"#), "t", 0.0, 2.0).unwrap(),
            Some(0.5)
        );
    }

    #[test]
    fn stops_accept_string_or_list() {
        assert_eq!(opt_stops(&obj(r#"{"s": "x"}"#), "s").unwrap(), vec!["x"]);
        assert_eq!(
            opt_stops(&obj(r#"{"s": ["a","b"]}"#), "s").unwrap().len(),
            2
        );
        assert!(opt_stops(&obj(r#"{"s": [1]}"#), "s").is_err());
        let most = serde_json::json!({ "s": vec!["x"; MAX_STOPS] }).to_string();
        assert_eq!(opt_stops(&obj(&most), "s").unwrap().len(), MAX_STOPS);
        let over = serde_json::json!({ "s": vec!["x"; MAX_STOPS + 1] }).to_string();
        let err = opt_stops(&obj(&over), "s").unwrap_err();
        assert!(
            format!("{err:?}").contains("at most 16 stop strings"),
            "{err:?}"
        );
    }
}
