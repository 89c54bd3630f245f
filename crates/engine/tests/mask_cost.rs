//! The cost of a grammar's token mask against a decode step, on Gemma 3's 262k-token
//! vocabulary (the issue 33 receipts, `docs/receipts/llguidance-mask-2026-12-02.md` for the
//! mask alone, `docs/receipts/grammar-mask-cost-2026-12-07.md` for what a held pick costs
//! with the mask computed during the forward pass). Benchmarks, not checks: `#[ignore]`d,
//! they print figures and assert only that the held output stayed whole.
//!
//! Run: `cargo test --release -p ferrite-engine --test mask_cost -- --ignored --nocapture`.

use std::time::{Duration, Instant};

use ferrite_cpu::ThreadPool;
use ferrite_engine::grammar::{Constraint, Matcher, Vocab};
use ferrite_engine::held::{Chooser, grammar_vocab};
use ferrite_engine::{
    Flow, GenerateError, Picker, Sampled, Sampler, SamplerConfig, StopReason, Timeline, generate,
};
use ferrite_model::{KvType, LoadOptions, Model, Outputs, Session};
use ferrite_tokenizer::Tokenizer;
use serde_json::json;

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

/// The constraints both benchmarks hold Gemma's output to.
fn constraints() -> Vec<(&'static str, Constraint)> {
    let person = json!({"type": "object", "properties": {"name": {"type": "string", "maxLength": 30},
        "age": {"type": "integer", "minimum": 0}, "born": {"type": "string", "format": "date"},
        "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 3}},
        "required": ["name", "age", "born", "tags"], "additionalProperties": false});
    let call = json!({"type": "object", "properties": {"name": {"const": "get_weather"},
        "arguments": {"type": "object", "properties": {"city": {"type": "string"}},
        "required": ["city"]}}, "required": ["name", "arguments"], "additionalProperties": false});
    vec![
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
    ]
}

/// Gemma 3, its grammar vocabulary, and the chat prompt both benchmarks answer.
fn gemma() -> Option<(Model, Tokenizer, Vocab)> {
    let path = ferrite_testkit::real_model(ferrite_testkit::GEMMA3)?;
    let model = Model::load(&path, LoadOptions::default()).expect("model loads");
    let tokenizer = Tokenizer::from_gguf(model.gguf()).expect("tokenizer");
    let t = Instant::now();
    let vocab = grammar_vocab(&tokenizer).expect("vocabulary");
    println!(
        "vocabulary: {} tokens, built in {:?} (once per model)",
        vocab.size(),
        t.elapsed()
    );
    Some((model, tokenizer, vocab))
}

const PROMPT: &str =
    "<start_of_turn>user\nDescribe a person as JSON.<end_of_turn>\n<start_of_turn>model\n";

#[test]
#[ignore = "benchmark: prints the mask cost receipt"]
fn mask_cost_against_a_decode_step_on_gemma3() {
    let Some((model, tokenizer, vocab)) = gemma() else {
        return;
    };
    let constraints = constraints();
    let pool = ThreadPool::new(2).expect("pool");
    let mut session = Session::new(&model, &pool, 256, KvType::F16).expect("session");
    let prompt = tokenizer.encode(PROMPT, true, true);
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

/// A picker that times, for each token, the forward pass that makes the row and the pick
/// from it (for a held chooser: the wait for the mask the worker computed during that pass,
/// masking a copy of the row, the draw, and handing the grammar back to the worker).
struct Timed {
    inner: Chooser,
    forward: Vec<Duration>,
    pick: Vec<Duration>,
}

impl Picker for Timed {
    fn eval_pick<T: Timeline + ?Sized>(
        &mut self,
        session: &mut T,
        tokens: &[u32],
        history: &[u32],
    ) -> Result<Sampled, GenerateError> {
        let t = Instant::now();
        let row = session.eval_last(tokens)?;
        let forward = t.elapsed();
        let t = Instant::now();
        let sampled = self.inner.pick_row(row, history)?;
        // The prompt's pass is prefill, not a decode step.
        if tokens.len() == 1 {
            self.forward.push(forward);
            self.pick.push(t.elapsed());
        }
        Ok(sampled)
    }

    fn pick_row(&mut self, row: &[f32], history: &[u32]) -> Result<Sampled, GenerateError> {
        self.inner.pick_row(row, history)
    }

    fn pick_forced(&mut self, row: &[f32], token: u32) -> Result<Sampled, GenerateError> {
        self.inner.pick_forced(row, token)
    }

    fn stop_reason(&self, token: u32, n_generated: usize) -> Option<StopReason> {
        self.inner.stop_reason(token, n_generated)
    }
}

/// What a held pick costs with the mask computed during the forward pass (the path
/// `ferrite run` and `serve` take): each decode step's forward pass and pick, greedy, for
/// each constraint and for the free sampler on the same prompt; the held pick's excess
/// over the free one is the grammar's cost per token.
#[test]
#[ignore = "benchmark: prints the overlapped mask cost receipt"]
fn overlapped_mask_cost_against_a_decode_step_on_gemma3() {
    let Some((model, tokenizer, vocab)) = gemma() else {
        return;
    };
    let pool = ThreadPool::new(2).expect("pool");
    let mut session = Session::new(&model, &pool, 256, KvType::F16).expect("session");
    let prompt = tokenizer.encode(PROMPT, true, true);
    let cfg = SamplerConfig {
        stop_ids: tokenizer.end_of_generation_ids(),
        max_tokens: 40,
        ..SamplerConfig::default()
    };
    let mut cases: Vec<(&str, Option<Constraint>)> = vec![("free", None)];
    cases.extend(constraints().into_iter().map(|(n, c)| (n, Some(c))));
    for (name, c) in &cases {
        for run in 0..3 {
            let sampler = Sampler::new(cfg.clone()).expect("sampler");
            let mut timed = Timed {
                inner: Chooser::new(sampler, c.as_ref(), &vocab).expect("chooser"),
                forward: Vec::new(),
                pick: Vec::new(),
            };
            session.reset();
            let out =
                generate(&mut session, &mut timed, &prompt, |_| Flow::Continue).expect("generates");
            if let Chooser::Held(h) = &mut timed.inner {
                assert!(
                    h.is_complete() || out.tokens.len() == 40,
                    "{name}: held output cut short"
                );
            }
            // The worker shares the CPU with the forward pass: a step is both, measured.
            let steps: Vec<Duration> = timed
                .forward
                .iter()
                .zip(&timed.pick)
                .map(|(f, p)| *f + *p)
                .collect();
            let (forward, pick) = (median(timed.forward.clone()), median(timed.pick.clone()));
            println!(
                "{name} run {run}: {} steps, step median {:?}, forward median {forward:?}, \
                 pick median {pick:?} (max {:?}); pick/forward {:.2} %",
                timed.pick.len(),
                median(steps),
                timed.pick.iter().max().unwrap(),
                100.0 * pick.as_secs_f64() / forward.as_secs_f64()
            );
        }
    }
}
