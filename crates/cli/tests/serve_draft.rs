//! `ferrite serve --draft-model` on the real SmolLM2 (CPU), drafting for itself: every
//! answer equals the plain server's, field for field (text, token log-probabilities, finish
//! reason, token counts), greedy and seeded-sampled, with stop strings, token limits and
//! JSON mode, several at once and every other one streamed, so that speculating slots
//! share batched steps. A same-model draft is accepted nearly always; a planted bad draft
//! (the same model with its output norm negated, so its greedy pick is the least likely
//! token) must leave every answer unchanged and be accepted less. Path markers: the
//! proposed and accepted counters of `/metrics`. Also the refusals: a draft of another
//! vocabulary (Gemma 3 drafting for SmolLM2), `--lookup` with `--draft-model`, a draft
//! length out of bounds. A request's `speculative.n_max` on every API: 0 proposes nothing,
//! more than `--draft-max` or a positive value on a plain server is refused with 400.
//! Its `speculative.n_min` and `speculative.p_min` (flat, as llama.cpp sends them, or
//! nested), and the server's `--draft-min` and `--draft-p-min`: answers stay the plain
//! server's, a high `p_min` proposes fewer tokens, a floor equal to the draft length
//! proposes only whole drafts (a multiple of it) and nothing where the room left is
//! shorter; values out of bounds, and `p_min` where
//! only prompt lookup proposes, are refused naming the field or the flag.

mod common;
mod server_util;

use std::path::Path;

use serde_json::{Value, json};
use server_util::{
    MODEL, REPEAT, Server, answer, metric, start, start_with, stream_text, text_of, with,
};

const FOX: &str = "The quick brown fox jumps over the lazy dog. The quick brown fox jumps over \
the lazy dog. The quick brown";

/// The requests: (path, body). Completions ask for log-probabilities, so those are
/// compared too.
fn requests() -> Vec<(&'static str, Value)> {
    let comp = |prompt: &str, extra: Value| {
        with(
            json!({"model": MODEL, "prompt": prompt, "max_tokens": 40, "temperature": 0,
                "logprobs": 2}),
            extra,
        )
    };
    let chat = |content: &str, extra: Value| {
        with(
            json!({"model": MODEL, "messages": [{"role": "user", "content": content}],
                "max_tokens": 32, "temperature": 0}),
            extra,
        )
    };
    vec![
        ("/v1/completions", comp(REPEAT, json!({}))),
        ("/v1/completions", comp(FOX, json!({"stop": ["lazy"]}))),
        ("/v1/completions", comp(REPEAT, json!({"max_tokens": 5}))),
        (
            "/v1/completions",
            comp(FOX, json!({"temperature": 0.8, "top_p": 0.95, "seed": 42})),
        ),
        (
            "/v1/chat/completions",
            chat(
                "Give a JSON object with keys a and b, each the string \"abc\".",
                json!({"response_format": {"type": "json_object"}}),
            ),
        ),
        (
            "/v1/chat/completions",
            chat("Name three rivers in Europe.", json!({})),
        ),
    ]
}

/// Every request at once; the odd ones answered whole (compared field for field), the
/// even ones streamed (compared by text).
fn concurrent(server: &Server, want: &[Value], label: &str) {
    let reqs = requests();
    std::thread::scope(|s| {
        let handles: Vec<_> = reqs
            .iter()
            .enumerate()
            .map(|(k, (path, body))| {
                s.spawn(move || {
                    let streamed = k % 2 == 0;
                    let body = with(body.clone(), json!({"stream": streamed}));
                    let r = server.post(path, &body);
                    assert_eq!(r.status, 200, "{}", r.body);
                    if streamed {
                        assert_eq!(
                            stream_text(path, &r),
                            text_of(path, &want[k]),
                            "request {k} differs streamed with {label}"
                        );
                    } else {
                        assert_eq!(
                            answer(&r.json()),
                            answer(&want[k]),
                            "request {k} differs with {label}"
                        );
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
    });
}

/// (proposed, accepted) so far.
fn drafted(server: &Server) -> (f64, f64) {
    (
        metric(server, "ferrite_spec_proposed_tokens_total"),
        metric(server, "ferrite_spec_accepted_tokens_total"),
    )
}

/// SmolLM2 with its output norm negated: the same vocabulary, but every logit's sign
/// flipped, so its greedy pick is the target's least likely token.
fn bad_draft(dir: &Path) -> std::path::PathBuf {
    let src = common::pull(MODEL);
    let dst = dir.join("smollm2-negated.gguf");
    let changed = common::rewrite_gguf(&src, &dst, &[], &|name, data| {
        (name == "output_norm.weight").then(|| {
            let mut d = data.to_vec();
            // f32 values: flip each sign bit (the little-endian word's last byte).
            for w in d.chunks_exact_mut(4) {
                w[3] ^= 0x80;
            }
            d
        })
    });
    assert!(changed, "no output_norm.weight in {}", src.display());
    dst
}

#[test]
fn draft_answers_equal_the_plain_servers_and_a_bad_draft_changes_nothing() {
    let plain = start();
    let want: Vec<Value> = requests()
        .iter()
        .map(|(path, body)| {
            let r = plain.post(path, body);
            assert_eq!(r.status, 200, "{}", r.body);
            r.json()
        })
        .collect();
    drop(plain);
    let model = common::pull(MODEL);
    let spec = start_with(&["--draft-model", model.to_str().unwrap(), "--draft-max", "8"]);
    concurrent(&spec, &want, "--draft-model (itself)");
    let (proposed, accepted) = drafted(&spec);
    let good = accepted / proposed;
    println!("same-model draft: proposed {proposed} accepted {accepted} ({good:.3})");
    assert!(metric(&spec, "ferrite_batched_steps_total") > 0.0);
    drop(spec);
    // Only ends of generation, stop strings, token limits and the sampled request reject
    // a draft of the model itself.
    assert!(good > 0.7, "a same-model draft accepted at {good:.3}");

    let dir = tempfile::tempdir().unwrap();
    let bad = bad_draft(dir.path());
    let spec = start_with(&["--draft-model", bad.to_str().unwrap(), "--draft-max", "8"]);
    concurrent(&spec, &want, "a bad --draft-model");
    let (proposed, accepted) = drafted(&spec);
    println!("negated draft: proposed {proposed} accepted {accepted}");
    assert!(proposed > 0.0, "the bad draft proposed nothing");
    assert!(
        accepted / proposed < good,
        "the bad draft was not accepted less"
    );
}

#[test]
fn draft_model_is_refused_where_it_cannot_run() {
    let model = common::pull(MODEL);
    let gemma = common::pull("gemma3-270m");
    let (m, g) = (model.to_str().unwrap(), gemma.to_str().unwrap());
    for (args, says) in [
        (
            vec!["serve", "-m", m, "--draft-model", g, "--port", "0"],
            "cannot draft for",
        ),
        (
            vec!["serve", "-m", m, "--lookup", "--draft-model", m],
            "cannot be used with",
        ),
        (
            vec!["serve", "-m", m, "--draft-model", m, "--draft-max", "16"],
            "16",
        ),
    ] {
        refused(&args, says);
    }
}

/// `ferrite args` fails, saying `says` on stderr.
fn refused(args: &[&str], says: &str) {
    let out = common::run(args);
    let err = String::from_utf8_lossy(&out.stderr);
    println!("{args:?}: {}", err.trim());
    assert!(!out.status.success(), "{args:?} was accepted");
    assert!(err.contains(says), "{args:?}: {err}");
}

/// A greedy request to `path` of each API, with `extra` fields.
fn each_api(extra: &Value) -> Vec<(&'static str, Value)> {
    let user = json!([{"role": "user", "content": format!("Repeat this text:\n{FOX}")}]);
    vec![
        (
            "/v1/chat/completions",
            json!({"model": MODEL, "messages": user, "max_tokens": 24, "temperature": 0}),
        ),
        (
            "/v1/completions",
            json!({"model": MODEL, "prompt": FOX, "max_tokens": 24, "temperature": 0}),
        ),
        (
            "/v1/responses",
            json!({"model": MODEL, "input": format!("Repeat this text:\n{FOX}"),
                "max_output_tokens": 24, "temperature": 0}),
        ),
        (
            "/v1/messages",
            json!({"model": MODEL, "messages": user, "max_tokens": 24, "temperature": 0}),
        ),
    ]
    .into_iter()
    .map(|(p, b)| (p, with(b, extra.clone())))
    .collect()
}

#[test]
fn speculative_n_max_is_per_request() {
    // A plain server takes n_max 0 and refuses a positive one, naming the flags.
    let plain = start();
    for (path, body) in each_api(&json!({"speculative": {"n_max": 0}})) {
        let r = plain.post(path, &body);
        assert_eq!(r.status, 200, "{path}: {}", r.body);
    }
    for (path, body) in each_api(&json!({"speculative": {"n_max": 3}})) {
        let r = plain.post(path, &body);
        assert_eq!(r.status, 400, "{path}: {}", r.body);
        assert!(
            r.body.contains("speculative.n_max") && r.body.contains("--draft-model"),
            "{path}: {}",
            r.body
        );
    }
    drop(plain);
    let model = common::pull(MODEL);
    let spec = start_with(&["--draft-model", model.to_str().unwrap(), "--draft-max", "4"]);
    // n_max 0 on every API: answered, and not one token proposed for it.
    for (path, body) in each_api(&json!({"speculative": {"n_max": 0}})) {
        let r = spec.post(path, &body);
        assert_eq!(r.status, 200, "{path}: {}", r.body);
    }
    assert_eq!(drafted(&spec), (0.0, 0.0), "an n_max 0 request speculated");
    // More than the server's --draft-max, or not a count: refused.
    for bad in [json!(5), json!(-1), json!("2")] {
        for (path, body) in each_api(&json!({"speculative": {"n_max": bad}})) {
            let r = spec.post(path, &body);
            assert_eq!(r.status, 400, "{path} n_max {bad}: {}", r.body);
            assert!(r.body.contains("speculative.n_max"), "{}", r.body);
            if bad == json!(5) {
                assert!(r.body.contains("--draft-max of 4"), "{}", r.body);
            }
        }
    }
    assert_eq!(drafted(&spec), (0.0, 0.0));
    // Within the bound, and by default: speculated on every API.
    for extra in [json!({"speculative": {"n_max": 2}}), json!({})] {
        for (path, body) in each_api(&extra) {
            let before = drafted(&spec).0;
            let r = spec.post(path, &body);
            assert_eq!(r.status, 200, "{path}: {}", r.body);
            let after = drafted(&spec).0;
            assert!(after > before, "{path} {extra}: nothing proposed");
        }
    }
    // Greedy requests only: the model's own greedy draft is rejected only where a
    // generation ends inside it.
    let (proposed, accepted) = drafted(&spec);
    println!("greedy, drafting for itself: proposed {proposed} accepted {accepted}");
    assert!(
        accepted / proposed > 0.9,
        "{accepted} of {proposed} accepted"
    );
}

/// The text of an answer of any of the four APIs.
fn reply_text(path: &str, v: &Value) -> String {
    let join = |items: &Value, inner: &dyn Fn(&Value) -> String| {
        items
            .as_array()
            .into_iter()
            .flatten()
            .map(inner)
            .collect::<String>()
    };
    let text = |b: &Value| b["text"].as_str().unwrap_or_default().to_string();
    match path {
        "/v1/responses" => join(&v["output"], &|item| join(&item["content"], &text)),
        "/v1/messages" => join(&v["content"], &text),
        _ => text_of(path, v),
    }
}

/// Posts `each_api(extra)` to `server`, checks every answer's text against `want` (by
/// position), and returns the draft tokens proposed meanwhile.
fn proposed_for(server: &Server, extra: &Value, want: &[String], label: &str) -> f64 {
    let before = drafted(server).0;
    for (k, (path, body)) in each_api(extra).into_iter().enumerate() {
        let r = server.post(path, &body);
        assert_eq!(r.status, 200, "{label} {path}: {}", r.body);
        assert_eq!(reply_text(path, &r.json()), want[k], "{label} {path}");
    }
    let n = drafted(server).0 - before;
    println!("{label}: proposed {n}");
    n
}

#[test]
fn speculative_n_min_and_p_min_change_the_drafts_never_the_answers() {
    let plain = start();
    let want: Vec<String> = each_api(&json!({}))
        .into_iter()
        .map(|(path, body)| {
            let r = plain.post(path, &body);
            assert_eq!(r.status, 200, "{path}: {}", r.body);
            let t = reply_text(path, &r.json());
            assert!(!t.is_empty(), "{path}: {}", r.body);
            t
        })
        .collect();
    drop(plain);
    let model = common::pull(MODEL);
    let m = model.to_str().unwrap();
    let spec = start_with(&["--draft-model", m, "--draft-max", "8"]);
    let free = proposed_for(&spec, &json!({}), &want, "no n_min or p_min");
    assert!(free > 0.0, "nothing proposed");
    // llama.cpp's flat key and the nested form alike: a draft that stops at the first
    // token the draft model is less than 99 % sure of proposes fewer.
    for extra in [
        json!({"speculative.p_min": 0.99}),
        json!({"speculative": {"p_min": 0.99}}),
    ] {
        let sure = proposed_for(&spec, &extra, &want, &format!("{extra}"));
        assert!(sure < free, "{extra}: proposed {sure}, {free} without");
    }
    // A floor of the whole draft length: only whole drafts are verified (the adaptive
    // length is raised to it where a draft is worth verifying at all).
    let whole = proposed_for(
        &spec,
        &json!({"speculative": {"n_min": 8}}),
        &want,
        "n_min 8",
    );
    assert!(
        whole > 0.0 && whole % 8.0 == 0.0,
        "n_min 8: proposed {whole}"
    );
    // A floor above the room a 5-token answer leaves (after its first token, at most 3
    // draft tokens fit): nothing is drafted at all.
    let short = |extra: Value| {
        let before = drafted(&spec).0;
        for (path, mut body) in each_api(&extra) {
            let key = if path == "/v1/responses" {
                "max_output_tokens"
            } else {
                "max_tokens"
            };
            body[key] = json!(5);
            let r = spec.post(path, &body);
            assert_eq!(r.status, 200, "{path} {extra}: {}", r.body);
        }
        drafted(&spec).0 - before
    };
    let unfloored = short(json!({}));
    let floored = short(json!({"speculative": {"n_min": 4}}));
    println!("5-token answers: proposed {unfloored}, {floored} with n_min 4");
    assert!(unfloored > 0.0, "5-token answers proposed nothing");
    assert_eq!(floored, 0.0, "n_min 4 verified drafts of 3");
    // Out of bounds: refused, naming the field.
    for (extra, field, says) in [
        (
            json!({"speculative": {"p_min": 1.5}}),
            "speculative.p_min",
            "from 0 to 1",
        ),
        (
            json!({"speculative.p_min": -0.5}),
            "speculative.p_min",
            "from 0 to 1",
        ),
        (
            json!({"speculative": {"n_min": 9}}),
            "speculative.n_min",
            "--draft-max",
        ),
        (
            json!({"speculative": {"n_min": 3, "n_max": 2}}),
            "speculative.n_min",
            "'speculative.n_max'",
        ),
    ] {
        for (path, body) in each_api(&extra) {
            let r = spec.post(path, &body);
            assert_eq!(r.status, 400, "{path} {extra}: {}", r.body);
            assert!(
                r.body.contains(field) && r.body.contains(says),
                "{path} {extra}: {}",
                r.body
            );
        }
    }
    drop(spec);
    // The same bounds as the server's defaults.
    let strict = start_with(&[
        "--draft-model",
        m,
        "--draft-max",
        "8",
        "--draft-p-min",
        "0.99",
        "--draft-min",
        "2",
    ]);
    let sure = proposed_for(
        &strict,
        &json!({}),
        &want,
        "--draft-p-min 0.99 --draft-min 2",
    );
    assert!(
        sure < free,
        "--draft-p-min 0.99: proposed {sure}, {free} without"
    );
    // A request's own p_min of 0 overrides the server's.
    let undone = proposed_for(
        &strict,
        &json!({"speculative": {"p_min": 0}}),
        &want,
        "--draft-p-min 0.99, request p_min 0",
    );
    assert!(
        undone > sure,
        "request p_min 0: proposed {undone}, {sure} with 0.99"
    );
}

#[test]
fn p_min_is_refused_where_only_prompt_lookup_proposes() {
    let lookup = start_with(&["--lookup"]);
    for (path, body) in each_api(&json!({"speculative": {"p_min": 0.5}})) {
        let r = lookup.post(path, &body);
        assert_eq!(r.status, 400, "{path}: {}", r.body);
        assert!(
            r.body.contains("speculative.p_min") && r.body.contains("prompt lookup"),
            "{path}: {}",
            r.body
        );
    }
    // p_min 0 asks for nothing lookup cannot do; n_min is lookup's as well.
    for (path, body) in each_api(&json!({"speculative": {"p_min": 0, "n_min": 2}})) {
        let r = lookup.post(path, &body);
        assert_eq!(r.status, 200, "{path}: {}", r.body);
    }
}

#[test]
fn draft_min_and_p_min_flags_are_checked() {
    let model = common::pull(MODEL);
    let m = model.to_str().unwrap();
    for (args, says) in [
        (
            vec![
                "serve",
                "-m",
                m,
                "--draft-model",
                m,
                "--draft-p-min",
                "1.5",
                "--port",
                "0",
            ],
            "not a probability",
        ),
        (
            vec![
                "serve",
                "-m",
                m,
                "--lookup",
                "--draft-p-min",
                "0.5",
                "--port",
                "0",
            ],
            "--draft-model",
        ),
        (
            vec!["serve", "-m", m, "--draft-min", "2", "--port", "0"],
            "--draft-min",
        ),
        (
            vec![
                "serve",
                "-m",
                m,
                "--draft-model",
                m,
                "--draft-max",
                "4",
                "--draft-min",
                "5",
                "--port",
                "0",
            ],
            "--draft-min 5 is more than --draft-max 4",
        ),
    ] {
        refused(&args, says);
    }
}
