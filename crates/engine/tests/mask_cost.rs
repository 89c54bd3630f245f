//! The cost of a grammar's token mask against a decode step, on Gemma 3's 262k-token
//! vocabulary (the issue 33 receipt, `docs/receipts/llguidance-mask-2026-12-02.md`). A
//! benchmark, not a check: `#[ignore]`d, it prints figures and asserts only that the held
//! output stayed whole.
//!
//! Run: `cargo test --release -p ferrite-engine --test mask_cost -- --ignored --nocapture`.

use std::time::{Duration, Instant};

use ferrite_cpu::ThreadPool;
use ferrite_engine::grammar::{Constraint, Matcher};
use ferrite_engine::held::grammar_vocab;
use ferrite_model::{KvType, LoadOptions, Model, Outputs, Session};
use ferrite_tokenizer::Tokenizer;
use serde_json::json;

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

#[test]
#[ignore = "benchmark: prints the mask cost receipt"]
fn mask_cost_against_a_decode_step_on_gemma3() {
    let Some(path) = ferrite_testkit::real_model(ferrite_testkit::GEMMA3) else {
        return;
    };
    let model = Model::load(&path, LoadOptions::default()).expect("model loads");
    let tokenizer = Tokenizer::from_gguf(model.gguf()).expect("tokenizer");
    let t = Instant::now();
    let vocab = grammar_vocab(&tokenizer).expect("vocabulary");
    println!(
        "vocabulary: {} tokens, built in {:?} (once per model)",
        vocab.size(),
        t.elapsed()
    );
    let person = json!({"type": "object", "properties": {"name": {"type": "string", "maxLength": 30},
        "age": {"type": "integer", "minimum": 0}, "born": {"type": "string", "format": "date"},
        "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 3}},
        "required": ["name", "age", "born", "tags"], "additionalProperties": false});
    let call = json!({"type": "object", "properties": {"name": {"const": "get_weather"},
        "arguments": {"type": "object", "properties": {"city": {"type": "string"}},
        "required": ["city"]}}, "required": ["name", "arguments"], "additionalProperties": false});
    let constraints = [
        ("json_object", Constraint::json_object()),
        ("schema (person)", Constraint::json_schema(&person).unwrap()),
        (
            "tool call (Hermes)",
            Constraint::framed_json("<tool_call>\n", &[call], "\n</tool_call>").unwrap(),
        ),
        (
            "regex",
            Constraint::regex("[A-Z][a-z]{2,12}( [A-Z][a-z]{2,12}){0,3}").unwrap(),
        ),
    ];
    let pool = ThreadPool::new(2).expect("pool");
    let mut session = Session::new(&model, &pool, 256, KvType::F16).expect("session");
    let prompt = tokenizer.encode(
        "<start_of_turn>user\nDescribe a person as JSON.<end_of_turn>\n<start_of_turn>model\n",
        true,
        true,
    );
    let eog = tokenizer.end_of_generation_ids();
    for (name, c) in &constraints {
        for run in 0..3 {
            let mut m = Matcher::new(&vocab, c).expect("matcher");
            session.reset();
            let mut row = session
                .eval(&prompt, Outputs::Last)
                .unwrap()
                .last()
                .unwrap()
                .to_vec();
            let (mut masks, mut steps) = (Vec::new(), Vec::new());
            for _ in 0..40 {
                let t = Instant::now();
                m.mask(&mut row).expect("mask");
                masks.push(t.elapsed());
                let token = (0..row.len())
                    .max_by(|&a, &b| row[a].total_cmp(&row[b]))
                    .unwrap() as u32;
                if eog.contains(&token) {
                    break;
                }
                m.accept(token).expect("allowed");
                let t = Instant::now();
                row = session
                    .eval(&[token], Outputs::Last)
                    .unwrap()
                    .last()
                    .unwrap()
                    .to_vec();
                steps.push(t.elapsed());
            }
            let (mask, step) = (median(masks.clone()), median(steps.clone()));
            println!(
                "{name} run {run}: {} masks, median {mask:?} (max {:?}); decode step median {step:?}; mask/step {:.1} %",
                masks.len(),
                masks.iter().max().unwrap(),
                100.0 * mask.as_secs_f64() / step.as_secs_f64()
            );
        }
    }
}
