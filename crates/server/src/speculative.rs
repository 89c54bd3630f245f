//! A request's speculation fields, as llama.cpp's server takes them: `speculative.n_max`
//! (most draft tokens a step, 0 for none), `speculative.n_min` (fewest worth verifying)
//! and `speculative.p_min` (the draft model's confidence threshold), each defaulting to
//! the server's `--draft-max`, `--draft-min` and `--draft-p-min`.
//!
//! llama.cpp reads them as flat keys (`{"speculative.n_max": 4}`); ferrite also takes them
//! nested (`{"speculative": {"n_max": 4}}`). Owns their validation against the server's
//! speculation, so that a field is honoured or refused with a 400 naming it, never
//! ignored: a positive value where the server does not speculate, an `n_max` above
//! `--draft-max`, an `n_min` above the request's draft length, a `p_min` outside [0, 1] or
//! on a server that drafts by prompt lookup (whose guesses carry no probability). It must
//! never change the sampling: these fields decide only which drafts are verified.

use ferrite_engine::{SpecLimits, SpecRequest};
use serde_json::Value;

use crate::error::ApiError;
use crate::parse::{Obj, int_value};

/// The request's speculation fields, checked against `server` (its speculation, `None`
/// when it does not speculate).
pub fn speculative(obj: &Obj, server: Option<SpecLimits>) -> Result<SpecRequest, ApiError> {
    let nested = crate::parse::opt_object(obj, "speculative")?;
    let n_max = field(obj, nested, "n_max")?
        .map(|(v, key)| count(v, key, server))
        .transpose()?;
    if let (Some((n, key)), Some(s)) = (&n_max, server)
        && *n > s.draft_max
    {
        return Err(ApiError::invalid_param(
            key,
            format!(
                "'{key}' is {n}, more than this server's --draft-max of {}",
                s.draft_max
            ),
        ));
    }
    let n_min = field(obj, nested, "n_min")?
        .map(|(v, key)| count(v, key, server))
        .transpose()?;
    if let (Some((n, key)), Some(s)) = (&n_min, server) {
        let (most, from) = match &n_max {
            Some((m, max_key)) => (*m, format!("'{max_key}'")),
            None => (s.draft_max, "this server's --draft-max".to_string()),
        };
        if *n > most {
            return Err(ApiError::invalid_param(
                key,
                format!(
                    "'{key}' is {n}, more than the draft length of {most} ({from}): no \
                     draft could be verified"
                ),
            ));
        }
    }
    let p_min = field(obj, nested, "p_min")?
        .map(|(v, key)| probability(v, key, server))
        .transpose()?;
    Ok(SpecRequest {
        n_max: n_max.map(|(n, _)| n),
        n_min: n_min.map(|(n, _)| n),
        p_min,
    })
}

/// Field `name` of the request's speculation, flat (`speculative.name`) or nested, with
/// the spelling it came in for errors; both at once is refused, as they could differ.
fn field<'a>(
    obj: &'a Obj,
    nested: Option<&'a Obj>,
    name: &str,
) -> Result<Option<(&'a Value, String)>, ApiError> {
    let flat_key = format!("speculative.{name}");
    let flat = crate::parse::field(obj, &flat_key);
    let inner = nested.and_then(|n| crate::parse::field(n, name));
    match (flat, inner) {
        (Some(_), Some(_)) => Err(ApiError::invalid_param(
            &flat_key,
            format!(
                "'{flat_key}' is given twice, as a key of its own and inside 'speculative'; \
                 give it once"
            ),
        )),
        (Some(v), None) | (None, Some(v)) => Ok(Some((v, flat_key))),
        (None, None) => Ok(None),
    }
}

/// A draft length: 0 anywhere, a positive one only where the server speculates.
fn count(v: &Value, key: String, server: Option<SpecLimits>) -> Result<(usize, String), ApiError> {
    let n = int_value(v, &key, 0, u32::MAX as u64)? as usize;
    if n > 0 && server.is_none() {
        return Err(not_speculating(&key, n.to_string()));
    }
    Ok((n, key))
}

/// A confidence threshold in [0, 1]: a positive one only where a draft model proposes.
fn probability(v: &Value, key: String, server: Option<SpecLimits>) -> Result<f32, ApiError> {
    let p = v
        .as_f64()
        .filter(|p| (0.0..=1.0).contains(p))
        .ok_or_else(|| {
            ApiError::invalid_param(
                &key,
                format!("'{key}' must be a probability, a number from 0 to 1, got {v}"),
            )
        })?;
    match server {
        _ if p == 0.0 => Ok(0.0),
        None => Err(not_speculating(&key, v.to_string())),
        Some(s) if !s.draft_model => Err(ApiError::invalid_param(
            &key,
            format!(
                "'{key}' is {v}, but this server drafts by prompt lookup (--lookup), whose \
                 guesses carry no probability to compare; leave it out, or start the \
                 server with --draft-model MODEL"
            ),
        )),
        Some(_) => Ok(p as f32),
    }
}

fn not_speculating(key: &str, value: String) -> ApiError {
    ApiError::invalid_param(
        key,
        format!(
            "'{key}' is {value}, but this server does not speculate; start it with \
             --lookup or --draft-model MODEL"
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    // Oracle: the rules of the module documentation, case by case, on hand-written bodies.

    fn obj(v: Value) -> Obj {
        match v {
            Value::Object(m) => m,
            _ => unreachable!("a test body is an object"),
        }
    }

    const DRAFT: SpecLimits = SpecLimits {
        draft_max: 4,
        draft_min: 0,
        p_min: 0.0,
        draft_model: true,
    };
    const LOOKUP: SpecLimits = SpecLimits {
        draft_model: false,
        ..DRAFT
    };

    fn parse(body: Value, server: Option<SpecLimits>) -> Result<SpecRequest, String> {
        speculative(&obj(body), server).map_err(|e| format!("{e:?}"))
    }

    #[test]
    fn fields_are_read_flat_or_nested() {
        let want = SpecRequest {
            n_max: Some(3),
            n_min: Some(2),
            p_min: Some(0.5),
        };
        let flat =
            json!({"speculative.n_max": 3, "speculative.n_min": 2, "speculative.p_min": 0.5});
        let nested = json!({"speculative": {"n_max": 3, "n_min": 2, "p_min": 0.5}});
        assert_eq!(parse(flat, Some(DRAFT)), Ok(want));
        assert_eq!(parse(nested, Some(DRAFT)), Ok(want));
        assert_eq!(parse(json!({}), Some(DRAFT)), Ok(SpecRequest::default()));
        assert_eq!(
            parse(json!({"speculative": null}), None),
            Ok(SpecRequest::default())
        );
        let twice = parse(
            json!({"speculative.n_min": 1, "speculative": {"n_min": 1}}),
            Some(DRAFT),
        )
        .unwrap_err();
        assert!(
            twice.contains("speculative.n_min") && twice.contains("twice"),
            "{twice}"
        );
    }

    #[test]
    fn bad_values_are_refused_naming_the_field() {
        for (body, server, field, says) in [
            (
                json!({"speculative": {"p_min": 1.5}}),
                Some(DRAFT),
                "speculative.p_min",
                "from 0 to 1",
            ),
            (
                json!({"speculative": {"p_min": -0.1}}),
                Some(DRAFT),
                "speculative.p_min",
                "from 0 to 1",
            ),
            (
                json!({"speculative": {"p_min": "0.5"}}),
                Some(DRAFT),
                "speculative.p_min",
                "from 0 to 1",
            ),
            (
                json!({"speculative": {"p_min": 0.5}}),
                Some(LOOKUP),
                "speculative.p_min",
                "prompt lookup",
            ),
            (
                json!({"speculative": {"p_min": 0.5}}),
                None,
                "speculative.p_min",
                "does not speculate",
            ),
            (
                json!({"speculative": {"n_min": 5}}),
                Some(DRAFT),
                "speculative.n_min",
                "--draft-max",
            ),
            (
                json!({"speculative": {"n_min": 3, "n_max": 2}}),
                Some(DRAFT),
                "speculative.n_min",
                "'speculative.n_max'",
            ),
            (
                json!({"speculative": {"n_min": 1, "n_max": 0}}),
                Some(DRAFT),
                "speculative.n_min",
                "of 0",
            ),
            (
                json!({"speculative": {"n_min": -1}}),
                Some(DRAFT),
                "speculative.n_min",
                "integer",
            ),
            (
                json!({"speculative": {"n_min": 1}}),
                None,
                "speculative.n_min",
                "does not speculate",
            ),
            (
                json!({"speculative": {"n_max": 5}}),
                Some(DRAFT),
                "speculative.n_max",
                "--draft-max of 4",
            ),
            (
                json!({"speculative.n_max": 2}),
                None,
                "speculative.n_max",
                "--draft-model",
            ),
        ] {
            let err = parse(body.clone(), server).expect_err(&body.to_string());
            assert!(err.contains(field) && err.contains(says), "{body}: {err}");
        }
    }

    #[test]
    fn zero_is_taken_everywhere_it_means_nothing() {
        let zeros = json!({"speculative": {"n_max": 0, "n_min": 0, "p_min": 0}});
        for server in [None, Some(LOOKUP), Some(DRAFT)] {
            assert_eq!(
                parse(zeros.clone(), server),
                Ok(SpecRequest {
                    n_max: Some(0),
                    n_min: Some(0),
                    p_min: Some(0.0),
                }),
                "{server:?}"
            );
        }
        // A floor equal to the draft length, and p_min 1 (only certain drafts), are fine.
        assert!(
            parse(
                json!({"speculative": {"n_min": 4, "p_min": 1}}),
                Some(DRAFT)
            )
            .is_ok()
        );
    }
}
