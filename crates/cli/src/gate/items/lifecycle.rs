//! Item `cancellation`: a client disconnects at each phase of a request's life on the real
//! server stack (one slot): while queued behind another request, during prefill of a long
//! prompt, at its first streamed token, mid-stream, and while a non-streaming request
//! decodes. After each, the engine must free what the request held.
//!
//! The oracle is a lifecycle invariant read at the boundary (`/metrics`): the phase was
//! reached before the disconnect (queue depth 1, or the slot held with no token yet, or the
//! tokens streamed), afterwards no slot is active and the queue is empty, the request is
//! counted cancelled (not finished: it did not simply run to its end), and a following
//! request is served. The planted defect is the state of a request that is still
//! streaming, observed the same way: the oracle must find its slot held. End-of-text is
//! banned with `logit_bias` so no request ends by itself before it is cancelled.

use std::time::Duration;

use serde_json::{Value, json};

use super::http::{GateServer, MODEL_ID, Stream, wait_for};
use super::malformed::good_problem;
use super::{Env, Outcome, Proof, Target};

/// Longest wait for the engine to free a cancelled request's slot.
const SETTLE: Duration = Duration::from_secs(30);

/// What was seen around one disconnect.
#[derive(Debug, Clone)]
struct Observed {
    phase: &'static str,
    /// The client saw the phase it meant to cancel in.
    reached: bool,
    slots_active: f64,
    queue_depth: f64,
    /// Cancelled requests counted since before the phase.
    cancelled: f64,
    /// Why the request that followed was not served, if it was not.
    follow_up: Option<String>,
}

/// `None` when the invariant holds for `o`, else what is wrong.
fn problem(o: &Observed) -> Option<String> {
    if !o.reached {
        return Some(format!(
            "{}: the phase was not reached before the disconnect",
            o.phase
        ));
    }
    if o.slots_active != 0.0 || o.queue_depth != 0.0 {
        return Some(format!(
            "{}: still running after the disconnect ({} slots active, {} queued)",
            o.phase, o.slots_active, o.queue_depth
        ));
    }
    if o.cancelled < 1.0 {
        return Some(format!(
            "{}: the request was not counted cancelled",
            o.phase
        ));
    }
    o.follow_up.as_ref().map(|p| format!("{}: {p}", o.phase))
}

/// A streamed completion of `prompt` that never ends by itself within `max_tokens`.
fn endless(prompt: &str, max_tokens: u32, eos: Option<u32>, stream: bool) -> Value {
    let mut bias = serde_json::Map::new();
    if let Some(id) = eos {
        bias.insert(id.to_string(), json!(-100));
    }
    json!({"model": MODEL_ID, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
        "stream": stream, "logit_bias": bias})
}

/// SSE data events received so far.
fn events(got: &[u8]) -> usize {
    String::from_utf8_lossy(got).matches("data: ").count()
}

/// State after waiting (bounded) for every slot and the queue to be free and the
/// cancellation counted; then the follow-up request.
fn settle(
    s: &GateServer,
    phase: &'static str,
    reached: bool,
    before: f64,
) -> anyhow::Result<Observed> {
    let mut o = Observed {
        phase,
        reached,
        slots_active: 0.0,
        queue_depth: 0.0,
        cancelled: 0.0,
        follow_up: None,
    };
    wait_for(SETTLE, || {
        o.slots_active = s.metric("ferrite_slots_active")?;
        o.queue_depth = s.metric("ferrite_queue_depth")?;
        o.cancelled = s.metric("ferrite_cancelled_requests_total")? - before;
        Ok(o.slots_active == 0.0 && o.queue_depth == 0.0 && o.cancelled >= 1.0)
    })?;
    let good = json!({"model": MODEL_ID, "prompt": "Hello", "max_tokens": 2, "temperature": 0});
    o.follow_up = good_problem(&s.post("/v1/completions", &good), "/v1/completions");
    Ok(o)
}

/// Item `cancellation`.
pub fn run(env: &Env, t: &Target) -> anyhow::Result<Outcome> {
    let eos = t
        .cpu(env, ferrite_model::Precision::Default)?
        .tokenizer
        .eos_id();
    let s = t.server(env)?;
    let cancelled = || s.metric("ferrite_cancelled_requests_total");
    let mut seen = Vec::new();

    // Queued: A holds the only slot and streams; B waits behind it and goes away.
    let before = cancelled()?;
    let mut a = Stream::open(
        s.addr,
        "/v1/completions",
        &endless("Count: one, two,", 400, eos, true),
    )?;
    a.read_until("the first token of A", |g| events(g) >= 1)?;
    let b = Stream::open(
        s.addr,
        "/v1/completions",
        &endless("List fruits:", 400, eos, true),
    )?;
    let queued = wait_for(SETTLE, || Ok(s.metric("ferrite_queue_depth")? == 1.0))?;
    drop(b);
    let mut o = Observed {
        phase: "queued",
        reached: queued,
        slots_active: 0.0,
        queue_depth: 1.0,
        cancelled: 0.0,
        follow_up: None,
    };
    // A still runs and holds its own slot; the queue and the counter show B gone.
    wait_for(SETTLE, || {
        o.slots_active = s.metric("ferrite_slots_active")? - 1.0;
        o.queue_depth = s.metric("ferrite_queue_depth")?;
        o.cancelled = cancelled()? - before;
        Ok(o.queue_depth == 0.0 && o.cancelled >= 1.0)
    })?;
    seen.push(o);

    // Planted: A, not cancelled, observed as a cancelled request would be.
    a.read_until("eight tokens of A", |g| events(g) >= 8)?;
    let still = Observed {
        phase: "still streaming (planted)",
        reached: true,
        slots_active: s.metric("ferrite_slots_active")?,
        queue_depth: s.metric("ferrite_queue_depth")?,
        cancelled: cancelled()? - before - 1.0,
        follow_up: None,
    };
    let planted = match problem(&still) {
        Some(p) => Proof::new(false, p),
        None => Proof::new(true, "a request still streaming passed as freed"),
    };

    // Mid-stream: A goes away after eight tokens.
    let before = cancelled()?;
    drop(a);
    seen.push(settle(s, "mid-stream", true, before)?);

    // Prefill: a long prompt; the client leaves once the slot is held, before any token.
    let before = cancelled()?;
    let long = "The quick brown fox jumps over the lazy dog. ".repeat(36);
    let mut p = Stream::open(s.addr, "/v1/completions", &endless(&long, 8, eos, true))?;
    let held = wait_for(SETTLE, || Ok(s.metric("ferrite_slots_active")? == 1.0))?;
    p.drain_now()?;
    let reached = held && events(&p.got) == 0;
    drop(p);
    seen.push(settle(s, "prefill", reached, before)?);

    // First token: the client leaves as the first token arrives.
    let before = cancelled()?;
    let mut f = Stream::open(
        s.addr,
        "/v1/completions",
        &endless("Once upon a time", 400, eos, true),
    )?;
    f.read_until("the first token", |g| events(g) >= 1)?;
    drop(f);
    seen.push(settle(s, "first token", true, before)?);

    // Decode, not streaming: the client leaves while the slot is held.
    let before = cancelled()?;
    let n = Stream::open(
        s.addr,
        "/v1/completions",
        &endless("A list of colors:", 400, eos, false),
    )?;
    let held = wait_for(SETTLE, || Ok(s.metric("ferrite_slots_active")? == 1.0))?;
    drop(n);
    seen.push(settle(s, "decode (not streaming)", held, before)?);

    let failures: Vec<String> = seen.iter().filter_map(problem).collect();
    let phases: Vec<&str> = seen.iter().map(|o| o.phase).collect();
    let detail = match failures.first() {
        None => format!(
            "cancelled {}: every slot freed, the queue empty, each counted cancelled and the \
             next request served",
            phases.join(", ")
        ),
        Some(first) => format!(
            "{} of {} phases failed; first: {first}",
            failures.len(),
            seen.len()
        ),
    };
    let real = Proof::new(failures.is_empty(), detail)
        .count("phases", seen.len())
        .count("failed", failures.len());
    Ok(Outcome::Judged { planted, real })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_invariant_fails_on_a_held_slot_a_queued_request_an_uncounted_or_unserved_one() {
        let freed = Observed {
            phase: "p",
            reached: true,
            slots_active: 0.0,
            queue_depth: 0.0,
            cancelled: 1.0,
            follow_up: None,
        };
        assert_eq!(problem(&freed), None);
        let broken = [
            Observed {
                reached: false,
                ..freed.clone()
            },
            Observed {
                slots_active: 1.0,
                ..freed.clone()
            },
            Observed {
                queue_depth: 1.0,
                ..freed.clone()
            },
            Observed {
                cancelled: 0.0,
                ..freed.clone()
            },
            Observed {
                follow_up: Some("answered 503".into()),
                ..freed.clone()
            },
        ];
        for o in broken {
            assert!(problem(&o).is_some(), "{o:?}");
        }
    }
}
