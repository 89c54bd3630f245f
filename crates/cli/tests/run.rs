//! `ferrite run` end to end on the real models: output, clocks, backend line, determinism,
//! context errors, models without a chat template.

mod common;

use common::{pull, run, text};

fn run_ok(args: &[&str]) -> (String, String) {
    let out = run(args);
    assert!(out.status.success(), "{}", text(&out));
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn default_model_answers_and_reports_clocks_and_backend() {
    pull("smollm2-135m-instruct");
    let (stdout, stderr) = run_ok(&[
        "run",
        "--temp",
        "0",
        "--max-tokens",
        "12",
        "Why is the sky blue?",
    ]);
    assert!(stdout.trim().len() > 10, "answer too short: {stdout:?}");
    assert!(stderr.contains("backend=cpu threads="), "{stderr}");
    assert!(stderr.contains("simd="), "{stderr}");
    // The product kernels that ran: the tile kernel only ever serves 16-bit activations.
    assert!(
        stderr.contains(" act=") && stderr.contains(" amx="),
        "{stderr}"
    );
    assert!(
        !stderr.contains("amx=on") || stderr.contains("act=q16"),
        "{stderr}"
    );
    for clock in ["load ", "ttft ", "prefill ", "decode "] {
        assert!(stderr.contains(clock), "missing clock {clock:?}: {stderr}");
    }
}

/// Same seed and settings → same text, on every run and every thread count.
#[test]
fn sampling_is_deterministic_across_runs_and_threads() {
    pull("smollm2-135m-instruct");
    let args = |threads: &'static str| {
        [
            "run",
            "--temp",
            "0.9",
            "--seed",
            "42",
            "--max-tokens",
            "16",
            "--threads",
            threads,
            "Tell me a story.",
        ]
    };
    let (a, _) = run_ok(&args("1"));
    let (b, _) = run_ok(&args("2"));
    let (c, _) = run_ok(&args("2"));
    assert_eq!(a, b);
    assert_eq!(b, c);
    let (other_seed, _) = run_ok(&[
        "run",
        "--temp",
        "0.9",
        "--seed",
        "7",
        "--max-tokens",
        "16",
        "Tell me a story.",
    ]);
    assert_ne!(
        a, other_seed,
        "a different seed should change a sampled answer"
    );
}

#[test]
fn prompt_longer_than_context_is_a_clear_error() {
    pull("smollm2-135m-instruct");
    let out = run(&["run", "--ctx", "8", "--raw", &"word ".repeat(40)]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("context holds 8"), "{stderr}");
}

/// A chat message the context cannot hold is refused with both numbers, and the chat goes
/// on from where it was: the next message is answered as if the refused one never came.
#[test]
fn a_chat_survives_a_message_longer_than_the_context() {
    pull("smollm2-135m-instruct");
    let base = ["run", "--temp", "0", "--max-tokens", "8", "--ctx", "96"];
    let long = "tell me more ".repeat(40);
    let out = common::run_stdin(
        &[&base[..], &["--chat"]].concat(),
        &format!("{long}\nName a color.\n"),
    );
    assert!(out.status.success(), "{}", text(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("needs") && stderr.contains("the context holds 96"),
        "{stderr}"
    );
    let (alone, _) = run_ok(&[&base[..], &["Name a color."]].concat());
    assert!(!alone.trim().is_empty());
    assert_eq!(String::from_utf8_lossy(&out.stdout), alone);
}

#[test]
fn gemma_without_template_completes_plain_text_and_refuses_chat() {
    pull("gemma3-270m");
    let (stdout, stderr) = run_ok(&[
        "run",
        "-m",
        "gemma3-270m",
        "--temp",
        "0",
        "--max-tokens",
        "8",
        "The capital of France is",
    ]);
    assert!(!stdout.trim().is_empty());
    assert!(stderr.contains("no chat template"), "{stderr}");
}

#[test]
fn prompt_from_stdin_and_logprob_dump() {
    pull("smollm2-135m-instruct");
    let dir = tempfile::tempdir().unwrap();
    let dump = dir.path().join("lp.jsonl");
    let args = ["run", "--temp", "0", "--max-tokens", "5", "--dump-logprobs"];
    let dump_path = dump.to_str().unwrap();
    let out = common::run_stdin(
        &[&args[..], &[dump_path, "--logprobs-top-k", "3"]].concat(),
        "What is 2+2?",
    );
    assert!(out.status.success(), "{}", text(&out));
    let lines: Vec<serde_json::Value> = std::fs::read_to_string(&dump)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert!(!lines.is_empty());
    for line in &lines {
        let lp = line["logprob"].as_f64().unwrap();
        assert!(lp.is_finite() && lp <= 0.0, "{line}");
        assert_eq!(line["top"].as_array().unwrap().len(), 3);
        // Greedy: the chosen token is the most likely one.
        assert_eq!(line["top"][0][0], line["token"], "{line}");
    }
}

/// `--backend cuda` either runs on CUDA and says so, or fails with a clear "no CUDA device"
/// (never a panic, never a silent CPU fallback).
#[test]
fn explicit_cuda_backend_runs_or_fails_clearly() {
    pull("smollm2-135m-instruct");
    let out = run(&[
        "run",
        "--backend",
        "cuda",
        "--temp",
        "0",
        "--max-tokens",
        "4",
        "Hello",
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    match out.status.code() {
        Some(0) => assert!(stderr.contains("backend=cuda device="), "{stderr}"),
        Some(1) => assert!(stderr.contains("no CUDA device"), "{stderr}"),
        other => panic!("unexpected exit {other:?}: {}", text(&out)),
    }
}

/// `--json-schema` holds the answer to the schema. Oracle: the answer parses, with exactly
/// the schema's keys in its order and their types (checked by hand); the same schema from a
/// file gives the same answer; schemas that are not JSON or cannot be enforced
/// (`uniqueItems`) are refused by name.
#[test]
fn a_json_schema_holds_the_answer() {
    pull("smollm2-135m-instruct");
    let schema = r#"{"type": "object", "properties": {"name": {"type": "string"},
        "legs": {"type": "integer"}, "sounds": {"type": "array", "items": {"type": "string"},
        "maxItems": 3}}, "required": ["name", "legs", "sounds"], "additionalProperties": false}"#;
    let base = ["run", "--temp", "0", "--max-tokens", "120"];
    let prompt = "Describe a cat as JSON.";
    let (stdout, _) = run_ok(&[&base[..], &["--json-schema", schema, prompt]].concat());
    let v: serde_json::Value =
        serde_json::from_str(stdout.trim()).unwrap_or_else(|e| panic!("{stdout:?}: {e}"));
    let keys: Vec<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
    assert_eq!(keys, ["name", "legs", "sounds"], "{stdout}");
    assert!(
        v["name"].is_string() && (v["legs"].is_i64() || v["legs"].is_u64()),
        "{stdout}"
    );
    let sounds = v["sounds"].as_array().unwrap();
    assert!(
        sounds.len() <= 3 && sounds.iter().all(|s| s.is_string()),
        "{stdout}"
    );
    let dir = std::env::temp_dir().join(format!("ferrite-run-schema-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("schema.json");
    std::fs::write(&file, schema).unwrap();
    let path = file.to_str().unwrap();
    let (from_file, _) = run_ok(&[&base[..], &["--json-schema-file", path, prompt]].concat());
    assert_eq!(from_file, stdout);
    for (bad, says) in [
        ("{not json", "--json-schema is not valid JSON"),
        (
            r#"{"type": "object", "properties": {"a": {"type": "array", "uniqueItems": true}}}"#,
            "\"uniqueItems\"",
        ),
    ] {
        let out = run(&[&base[..], &["--json-schema", bad, prompt]].concat());
        assert_eq!(out.status.code(), Some(1), "{}", text(&out));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(says), "{stderr}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A `pattern` is enforced, not refused: the answer's code is three capitals, a dash and two
/// digits. Oracle: the answer parses, and the code is checked against the pattern by hand.
#[test]
fn a_json_schema_pattern_holds_the_answer() {
    pull("smollm2-135m-instruct");
    let schema = r#"{"type": "object", "properties": {"code": {"type": "string",
        "pattern": "^[A-Z]{3}-[0-9]{2}$"}}, "required": ["code"]}"#;
    let (stdout, _) = run_ok(&[
        "run",
        "--temp",
        "0",
        "--max-tokens",
        "40",
        "--json-schema",
        schema,
        "Give the product code of a cat toy as JSON.",
    ]);
    let v: serde_json::Value =
        serde_json::from_str(stdout.trim()).unwrap_or_else(|e| panic!("{stdout:?}: {e}"));
    let keys: Vec<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
    assert_eq!(keys, ["code"], "{stdout}");
    let code = v["code"].as_str().unwrap().as_bytes();
    assert!(
        code.len() == 6
            && code[..3].iter().all(u8::is_ascii_uppercase)
            && code[3] == b'-'
            && code[4..].iter().all(u8::is_ascii_digit),
        "{stdout}"
    );
}

/// `--chat` reads turns from a pipe. With a schema every reply is held to it: the two
/// replies are two JSON values of its shape, and after `/reset` a reply is the one-shot
/// answer to the same message (oracle: `run` with the prompt alone).
#[test]
fn a_chat_holds_every_reply_to_the_schema() {
    pull("smollm2-135m-instruct");
    let schema = r#"{"type": "object", "properties": {"name": {"type": "string"},
        "legs": {"type": "integer"}}, "required": ["name", "legs"], "additionalProperties": false}"#;
    let base = [
        "run",
        "--temp",
        "0",
        "--max-tokens",
        "60",
        "--json-schema",
        schema,
    ];
    let (cat, dog) = ("Describe a cat as JSON.", "Now describe a dog.");
    let out = common::run_stdin(
        &[&base[..], &["--chat"]].concat(),
        &format!("{cat}\n{dog}\n"),
    );
    assert!(out.status.success(), "{}", text(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let replies: Vec<serde_json::Value> = serde_json::Deserializer::from_str(&stdout)
        .into_iter()
        .collect::<Result<_, _>>()
        .unwrap_or_else(|e| panic!("{stdout:?}: {e}"));
    assert_eq!(replies.len(), 2, "{stdout}");
    for reply in &replies {
        let keys: Vec<&str> = reply
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        assert_eq!(keys, ["name", "legs"], "{stdout}");
        assert!(reply["legs"].is_i64() || reply["legs"].is_u64(), "{stdout}");
    }
    let (alone, _) = run_ok(&[&base[..], &[dog]].concat());
    let out = common::run_stdin(
        &[&base[..], &["--chat"]].concat(),
        &format!("{cat}\n/reset\n{dog}\n"),
    );
    assert!(out.status.success(), "{}", text(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.ends_with(&alone),
        "chat:\n{stdout}\none-shot:\n{alone}"
    );
}

/// Regression: a `--ctx` whose KV cache exceeds the machine's memory failed with "invalid
/// argument: cannot allocate the KV cache", naming neither the flag nor the sizes. `run`
/// clamps `--ctx` to the model's training context (as `serve` does), so the check is driven
/// through `score --text`, which sizes its session by `--ctx` as asked.
#[test]
fn a_context_beyond_memory_is_refused_naming_ctx_and_sizes() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("m.gguf");
    common::tiny_model(&model);
    let text_file = dir.path().join("t.txt");
    std::fs::write(&text_file, "hello world this is text").unwrap();
    // 2^40 positions of 2 × 32 f16 values: 256 TiB.
    let o = run(&[
        "score",
        "-m",
        model.to_str().unwrap(),
        "--backend",
        "cpu",
        "--ctx",
        "1099511627776",
        "--text",
        text_file.to_str().unwrap(),
    ]);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let line = stderr
        .lines()
        .find(|l| l.starts_with("error:"))
        .unwrap_or("");
    assert!(
        line.contains("--ctx 1099511627776") && line.contains("GB of memory"),
        "{}",
        text(&o)
    );
}

/// Reasoning is marked off from the answer when stdout is a pipe, hidden with
/// `--hide-reasoning`, and left as text with `--reasoning-format none`. SmolLM2 does not
/// reason, so a grammar makes it write `<think>…</think>` and an answer; the oracle is the
/// grammar's language (yes/no inside the block, Paris/Rome after it), checked by hand.
#[test]
fn reasoning_is_marked_off_hidden_or_left_as_text() {
    pull("smollm2-135m-instruct");
    let grammar = r#"root ::= "<think>" ("yes" | "no") "</think>" ("Paris" | "Rome")"#;
    let run_with = |extra: &[&str]| {
        let base = [
            "run",
            "--temp",
            "0",
            "--max-tokens",
            "30",
            "--grammar",
            grammar,
        ];
        let prompt = "Is Paris in France? Where is it?";
        run_ok(&[&base[..], extra, &[prompt]].concat())
    };
    let (shown, _) = run_with(&[]);
    let marked = |r: &str, a: &str| format!("[reasoning]\n{r}\n[end of reasoning]\n\n{a}\n");
    let pairs = [
        ("yes", "Paris"),
        ("yes", "Rome"),
        ("no", "Paris"),
        ("no", "Rome"),
    ];
    let (think, answer) = pairs
        .into_iter()
        .find(|(r, a)| shown == marked(r, a))
        .unwrap_or_else(|| panic!("reasoning not marked off: {shown:?}"));
    // No ANSI codes in a pipe.
    assert!(!shown.contains('\x1b'), "{shown:?}");
    let (hidden, _) = run_with(&["--hide-reasoning"]);
    assert_eq!(hidden, format!("{answer}\n"));
    let (raw, _) = run_with(&["--reasoning-format", "none"]);
    assert_eq!(raw, format!("<think>{think}</think>{answer}\n"));
    // A grammar GBNF cannot express is refused by flag; so is an unknown format.
    for (bad, says) in [
        (&["--grammar", "root ::= (", "x"][..], "--grammar"),
        (
            &["--reasoning-format", "thinking", "x"][..],
            "unknown reasoning format 'thinking'",
        ),
    ] {
        let out = run(&[&["run"][..], bad].concat());
        assert!(!out.status.success(), "{}", text(&out));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(says), "{stderr}");
    }
}

/// The pieces `ferrite run --dump-logprobs` recorded, in order.
fn dumped_pieces(dump: &std::path::Path) -> Vec<String> {
    std::fs::read_to_string(dump)
        .unwrap()
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            v["piece"].as_str().unwrap().to_string()
        })
        .collect()
}

/// Where the `<think>` block's reasoning starts, and how many pieces it has up to the
/// piece that starts its close.
fn reasoning_pieces(pieces: &[String]) -> (usize, usize) {
    let mut text = String::new();
    let mut inside = None;
    for (i, p) in pieces.iter().enumerate() {
        text.push_str(p);
        if inside.is_none() && text.contains("<think>") {
            inside = Some(i + 1);
        }
        if let Some(start) = inside
            && text.contains("</")
        {
            return (start, i - start);
        }
    }
    panic!("no closed <think> block in {pieces:?}");
}

/// `--reasoning-budget N` closes the block after exactly N reasoning tokens and the answer
/// follows. SmolLM2 does not reason, so a grammar makes it: words inside `<think>`,
/// then an answer the grammar fixes. Oracle: the same run without the budget (its block
/// must be longer than N, or the test shows nothing), counted piece by piece in the
/// `--dump-logprobs` record; the forced close is text the grammar accepts.
#[test]
fn a_reasoning_budget_closes_the_block_after_exactly_its_tokens() {
    pull("smollm2-135m-instruct");
    // A letter first: at temperature 0 the model would otherwise close the block at once.
    let grammar = r#"root ::= "<think>" [a-z] [a-z ]* "</think>" ("Paris" | "Rome")"#;
    let dir = tempfile::tempdir().unwrap();
    let run_with = |extra: &[&str], name: &str| {
        let dump = dir.path().join(name);
        let base = [
            "run",
            "--temp",
            "0",
            "--max-tokens",
            "40",
            "--reasoning-format",
            "think",
            "--grammar",
            grammar,
            "--dump-logprobs",
            dump.to_str().unwrap(),
        ];
        let prompt = "Think about where Paris is, then answer.";
        let (stdout, _) = run_ok(&[&base[..], extra, &[prompt]].concat());
        (stdout, dumped_pieces(&dump))
    };
    const BUDGET: usize = 2;
    let (_, plain) = run_with(&[], "plain.jsonl");
    let (start, free) = reasoning_pieces(&plain);
    assert!(
        free > BUDGET,
        "the plain run reasons only {free} tokens: {plain:?}"
    );
    let budget = BUDGET.to_string();
    let (stdout, held) = run_with(&["--reasoning-budget", &budget], "held.jsonl");
    assert_eq!(reasoning_pieces(&held), (start, BUDGET), "{held:?}");
    let limit = start + BUDGET;
    assert_eq!(held[..limit], plain[..limit], "untouched before the limit");
    let answer = stdout.rsplit("[end of reasoning]").next().unwrap().trim();
    assert!(["Paris", "Rome"].contains(&answer), "{stdout:?}");
    // A budget on output read without reasoning is refused, naming the flag.
    let out = run(&[
        "run",
        "--reasoning-budget",
        "3",
        "--reasoning-format",
        "none",
        "x",
    ]);
    assert!(!out.status.success(), "{}", text(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--reasoning-budget"), "{stderr}");
}

/// `--lookup` changes the speed, never the output: greedy and seeded sampling give the
/// text of the same run without it (oracle: that run), and the end-of-run line says what
/// speculation did. Bad draft lengths and `--draft-max` alone are refused.
#[test]
fn lookup_gives_the_plain_output_and_reports_acceptance() {
    pull("smollm2-135m-instruct");
    let prompt = "Repeat after me: one two three four five, one two three four five, one two";
    for sampling in [&["--temp", "0"][..], &["--temp", "0.9", "--seed", "5"][..]] {
        let base = [&["run", "--max-tokens", "48"][..], sampling].concat();
        let (plain, plain_err) = run_ok(&[&base[..], &[prompt]].concat());
        let (spec, spec_err) =
            run_ok(&[&base[..], &["--lookup", "--draft-max", "6", prompt]].concat());
        assert_eq!(spec, plain, "{sampling:?}");
        assert!(!plain_err.contains("lookup:"), "{plain_err}");
        assert!(
            spec_err.contains("lookup: proposed ") && spec_err.contains(" tokens per step"),
            "{spec_err}"
        );
    }
    for bad in ["0", "16"] {
        let out = run(&["run", "--lookup", "--draft-max", bad, "hi"]);
        assert!(!out.status.success());
        assert!(text(&out).contains("outside 1..=15"), "{}", text(&out));
    }
    let out = run(&["run", "--draft-max", "4", "hi"]);
    assert!(!out.status.success());
    assert!(text(&out).contains("--lookup"), "{}", text(&out));
}
