//! `ferrite serve --lookup` on the real SmolLM2 (CPU): every answer equals the plain
//! server's, field for field (text, token log-probabilities, finish reason, token counts),
//! greedy and seeded-sampled, with stop strings, token limits, penalties and JSON mode,
//! plain and streamed, several at once so that speculating and plain slots share batched
//! steps. Path marker: the accepted-draft counter of `/metrics` is above zero, so the
//! verify path really ran.

mod common;
mod server_util;

use serde_json::{Value, json};
use server_util::{
    MODEL, REPEAT, Server, answer, metric, start, start_with, stream_text, text_of, with,
};

const FOX: &str = "The quick brown fox jumps over the lazy dog. The quick brown fox jumps over \
the lazy dog. The quick brown fox jumps over the lazy dog. The quick brown";

/// The requests: (path, body). Completions ask for log-probabilities, so those are
/// compared too.
fn requests() -> Vec<(&'static str, Value)> {
    let comp = |prompt: &str, extra: Value| {
        with(
            json!({"model": MODEL, "prompt": prompt, "max_tokens": 48, "temperature": 0,
                "logprobs": 2}),
            extra,
        )
    };
    let chat = |content: &str, extra: Value| {
        with(
            json!({"model": MODEL, "messages": [{"role": "user", "content": content}],
                "max_tokens": 40, "temperature": 0}),
            extra,
        )
    };
    vec![
        ("/v1/completions", comp(REPEAT, json!({}))),
        ("/v1/completions", comp(FOX, json!({}))),
        // Ends inside a draft: a stop string, then a token limit shorter than a draft.
        ("/v1/completions", comp(FOX, json!({"stop": ["lazy"]}))),
        ("/v1/completions", comp(REPEAT, json!({"max_tokens": 5}))),
        // Penalties look at the generated tokens, which verification extends row by row.
        (
            "/v1/completions",
            comp(
                REPEAT,
                json!({"frequency_penalty": 0.4, "presence_penalty": 0.2}),
            ),
        ),
        // Seeded sampling: the verify rows are picked with the request's own random
        // stream, so the answer is the plain server's draw for draw.
        (
            "/v1/completions",
            comp(FOX, json!({"temperature": 0.8, "top_p": 0.95, "seed": 42})),
        ),
        (
            "/v1/chat/completions",
            chat(
                &format!("Repeat this text exactly:\n\n{FOX}"),
                json!({"temperature": 0.7, "seed": 3}),
            ),
        ),
        // Held to JSON: the grammar advances over each verified token in turn.
        (
            "/v1/chat/completions",
            chat(
                "Give a JSON object with keys a, b and c, each the string \"abc abc abc\".",
                json!({"response_format": {"type": "json_object"}}),
            ),
        ),
        // Plain prompts with little to look up.
        (
            "/v1/chat/completions",
            chat("Name three rivers in Europe.", json!({})),
        ),
        (
            "/v1/chat/completions",
            chat("Write one short sentence about the number 7.", json!({})),
        ),
    ]
}

/// Every request once, one after the other.
fn sequential(server: &Server) -> Vec<Value> {
    requests()
        .iter()
        .map(|(path, body)| {
            let r = server.post(path, body);
            assert_eq!(r.status, 200, "{}", r.body);
            r.json()
        })
        .collect()
}

#[test]
fn lookup_answers_equal_the_plain_servers_alone_and_under_concurrency() {
    let plain = start();
    let want = sequential(&plain);
    drop(plain);
    let spec = start_with(&["--lookup", "--draft-max", "8"]);
    // Alone, one after the other.
    let got = sequential(&spec);
    for (k, (w, g)) in want.iter().zip(&got).enumerate() {
        assert_eq!(answer(g), answer(w), "request {k} differs with --lookup");
    }
    let alone_accepted = metric(&spec, "ferrite_spec_accepted_tokens_total");
    // All at once, every other one streamed: speculating and plain slots in one step.
    let reqs = requests();
    let concurrent: Vec<String> = std::thread::scope(|s| {
        let handles: Vec<_> = reqs
            .iter()
            .enumerate()
            .map(|(k, (path, body))| {
                let spec = &spec;
                s.spawn(move || {
                    let streamed = k % 2 == 0;
                    let body = with(body.clone(), json!({"stream": streamed}));
                    let r = spec.post(path, &body);
                    assert_eq!(r.status, 200, "{}", r.body);
                    if streamed {
                        stream_text(path, &r)
                    } else {
                        text_of(path, &r.json())
                    }
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (k, ((path, _), text)) in reqs.iter().zip(&concurrent).enumerate() {
        assert_eq!(
            *text,
            text_of(path, &want[k]),
            "request {k} differs under concurrency with --lookup"
        );
    }
    let proposed = metric(&spec, "ferrite_spec_proposed_tokens_total");
    let accepted = metric(&spec, "ferrite_spec_accepted_tokens_total");
    println!("alone: accepted {alone_accepted}; in all: proposed {proposed} accepted {accepted}");
    // Path markers: drafts were verified and accepted, alone and under concurrency, and
    // the concurrent requests shared batched steps.
    assert!(alone_accepted > 0.0, "no draft accepted");
    assert!(
        accepted > alone_accepted,
        "no draft accepted under concurrency"
    );
    assert!(proposed >= accepted);
    assert!(metric(&spec, "ferrite_batched_steps_total") > 0.0);
}

#[test]
fn lookup_is_refused_where_it_cannot_run() {
    // --draft-max needs --lookup, and is bounded as for `run`.
    let model = common::pull(MODEL);
    let m = model.to_str().unwrap();
    for args in [
        vec!["serve", "-m", m, "--draft-max", "4"],
        vec!["serve", "-m", m, "--lookup", "--draft-max", "16"],
    ] {
        let out = common::run(&args);
        assert!(!out.status.success(), "{args:?} was accepted");
        println!("{args:?}: {}", String::from_utf8_lossy(&out.stderr).trim());
    }
}
