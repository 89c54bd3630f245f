//! Item `json-nonfinite`: NaN, ±Infinity, 1e999, 2^64, -1 and 3.5 in every integer field of
//! the generating endpoints (`max_tokens`, `max_completion_tokens`, `n`, `seed`, `top_k`,
//! `top_logprobs`, `logprobs`, `best_of`, `max_output_tokens`, Anthropic's `max_tokens`),
//! sent to the real server stack; each field's values are followed by a good request.
//!
//! The oracle: every such request is answered 400 in the API's error shape naming the field.
//! `NaN`, `Infinity`, `-Infinity` and `1e999` are not JSON numbers a parser can hold (the
//! JSON grammar has no NaN or infinity; 1e999 overflows every float), so for those the body
//! is refused as a whole and the error need not name the field: they are counted apart.
//! `seed` takes negative integers by design (they wrap to 64 bits), so -1 is not sent there.
//! The planted defect is real: a valid value (1) sent the same way is accepted by the server,
//! and the oracle must flag it as accepted for every field.

use serde_json::Value;

use super::http::{self, JSON};
use super::malformed::{Endpoint, good_problem, refusal_problem, served};
use super::{Env, Outcome, Proof, Target};

/// The values, as JSON text, and whether a JSON parser can represent them at all.
const VALUES: [(&str, bool); 7] = [
    ("NaN", false),
    ("Infinity", false),
    ("-Infinity", false),
    ("1e999", false),
    ("18446744073709551616", true),
    ("-1", true),
    ("3.5", true),
];

/// Integer fields of each generating endpoint.
fn fields(path: &str) -> &'static [&'static str] {
    match path {
        "/v1/chat/completions" => &[
            "max_tokens",
            "max_completion_tokens",
            "n",
            "seed",
            "top_k",
            "top_logprobs",
        ],
        "/v1/completions" => &["max_tokens", "n", "seed", "top_k", "logprobs", "best_of"],
        "/v1/responses" => &["max_output_tokens", "seed", "top_k"],
        "/v1/messages" => &["max_tokens", "top_k"],
        _ => &[],
    }
}

/// `good` without `field`, then `"field": value` written as raw text.
fn body_with(good: &Value, field: &str, value: &str) -> Vec<u8> {
    let mut b = good.clone();
    if let Some(o) = b.as_object_mut() {
        o.remove(field);
        if field == "top_logprobs" {
            // Read only beside `logprobs: true`; without it the value is refused for that.
            o.insert("logprobs".into(), Value::Bool(true));
        }
    }
    let text = b.to_string();
    let open = text.strip_suffix('}').unwrap_or(&text);
    format!("{open},\"{field}\":{value}}}").into_bytes()
}

/// Tallies of one pass over the fields.
#[derive(Default)]
struct Tally {
    sent: usize,
    named: usize,
    unparsable: usize,
    fields: usize,
    failures: Vec<String>,
}

fn pass(addr: std::net::SocketAddr, eps: &[Endpoint], values: &[(&str, bool)]) -> Tally {
    let mut t = Tally::default();
    for ep in eps {
        for &field in fields(ep.path) {
            t.fields += 1;
            for &(v, representable) in values {
                if field == "seed" && v == "-1" {
                    continue;
                }
                t.sent += 1;
                let raw = http::request("POST", ep.path, JSON, &body_with(&ep.good, field, v));
                let reply = http::exchange(addr, &raw);
                let status_400 = matches!(&reply, Ok(r) if r.status == 400);
                let problem = if !status_400 {
                    Some(match &reply {
                        Ok(r) => format!("answered {} (accepted or wrong status)", r.status),
                        Err(e) => format!("no answer: {e:#}"),
                    })
                } else {
                    let named = refusal_problem(&reply, ep.anthropic, Some(field));
                    match named {
                        None => {
                            t.named += 1;
                            None
                        }
                        Some(_) if !representable => {
                            t.unparsable += 1;
                            refusal_problem(&reply, ep.anthropic, None)
                        }
                        Some(p) => Some(p),
                    }
                };
                if let Some(p) = problem {
                    t.failures.push(format!("{} {field}={v}: {p}", ep.path));
                }
            }
            let good = http::exchange(
                addr,
                &http::request("POST", ep.path, JSON, ep.good.to_string().as_bytes()),
            );
            if let Some(p) = good_problem(&good, ep.path) {
                t.failures.push(format!("{} after {field}: {p}", ep.path));
            }
        }
    }
    t
}

/// Item `json-nonfinite`.
pub fn run(env: &Env, t: &Target) -> anyhow::Result<Outcome> {
    let eps: Vec<Endpoint> = served(t.has_chat_template(env)?)
        .into_iter()
        .filter(|e| !fields(e.path).is_empty())
        .collect();
    let server = t.server(env)?;
    let planted_tally = pass(server.addr, &eps, &[("1", true)]);
    let flagged = planted_tally
        .failures
        .iter()
        .filter(|f| f.contains("=1: answered 200"))
        .count();
    let planted = Proof::new(
        flagged < planted_tally.fields,
        format!(
            "a valid 1 in {} integer fields: {flagged} flagged as accepted",
            planted_tally.fields
        ),
    );
    let tally = pass(server.addr, &eps, &VALUES);
    let detail = match tally.failures.first() {
        None => format!(
            "{} requests over {} integer fields refused 400: {} naming the field, {} as \
             unparsable JSON (NaN, Infinity, 1e999); a good request after each field answered 200",
            tally.sent, tally.fields, tally.named, tally.unparsable
        ),
        Some(first) => format!(
            "{} of {} failed; first: {first}",
            tally.failures.len(),
            tally.sent
        ),
    };
    let real = Proof::new(tally.failures.is_empty(), detail)
        .count("requests", tally.sent)
        .count("fields", tally.fields)
        .count("named_field", tally.named)
        .count("unparsable_json", tally.unparsable)
        .count("failed", tally.failures.len());
    Ok(Outcome::Judged { planted, real })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_written_raw_in_place_of_the_field() {
        let good = serde_json::json!({"model": "m", "max_tokens": 1});
        let body = String::from_utf8(body_with(&good, "max_tokens", "NaN")).unwrap();
        assert_eq!(body.matches("max_tokens").count(), 1, "{body}");
        assert!(body.ends_with(",\"max_tokens\":NaN}"), "{body}");
        let body = String::from_utf8(body_with(&good, "top_logprobs", "3.5")).unwrap();
        assert!(body.contains("\"logprobs\":true"), "{body}");
        // Every generating endpoint has integer fields to probe.
        for ep in served(true).iter().filter(|e| e.generates) {
            assert!(!fields(ep.path).is_empty(), "{}", ep.path);
        }
    }
}
