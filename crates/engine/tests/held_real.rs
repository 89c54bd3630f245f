//! Held generation on SmolLM2 with each mask computed on the worker during the forward
//! pass (`generate` with a held [`Chooser`], as `ferrite run` and `serve` pick) against a
//! serial oracle: the row first, then the mask, then the draw, on the same session. The
//! tokens must be equal, greedy and sampled, for a schema and for JSON mode.
//!
//! The model comes from `$FERRITE_HOME/models` (default `~/.cache/ferrite/models`); when
//! absent the test prints `skipped: ...` and passes, unless `FERRITE_TEST_MODELS=1`.

use ferrite_cpu::ThreadPool;
use ferrite_engine::grammar::{Constraint, Matcher, Vocab};
use ferrite_engine::held::{Chooser, grammar_vocab};
use ferrite_engine::{Flow, Sampler, SamplerConfig, Timeline, generate};
use ferrite_model::{KvType, LoadOptions, Model, Session};
use ferrite_tokenizer::Tokenizer;
use serde_json::json;

const MAX_TOKENS: usize = 40;

/// The serial order: mask the row once it exists, draw, take the token, evaluate it.
fn serial(
    session: &mut Session,
    vocab: &Vocab,
    c: &Constraint,
    cfg: &SamplerConfig,
    prompt: &[u32],
) -> Vec<u32> {
    let mut m = Matcher::new(vocab, c).expect("matcher");
    let mut sampler = Sampler::new(cfg.clone()).expect("sampler");
    let mut history = prompt.to_vec();
    let mut out = Vec::new();
    session.reset();
    let mut row = session.eval_last(prompt).expect("prompt").to_vec();
    while out.len() < MAX_TOKENS {
        m.mask(&mut row).expect("mask");
        let drawn = sampler.next_token(&row, &history).expect("draw");
        let token = if row[drawn as usize].is_finite() {
            drawn
        } else {
            (0..row.len() as u32)
                .max_by(|&a, &b| row[a as usize].total_cmp(&row[b as usize]).then(b.cmp(&a)))
                .expect("a row")
        };
        m.accept(token).expect("allowed");
        if cfg.stop_ids.contains(&token) {
            break;
        }
        out.push(token);
        history.push(token);
        row = session.eval_last(&[token]).expect("decode").to_vec();
    }
    out
}

#[test]
fn masks_computed_during_the_pass_give_the_serial_tokens() {
    let Some(path) = ferrite_testkit::real_model(ferrite_testkit::SMOLLM2) else {
        return;
    };
    let model = Model::load(&path, LoadOptions::default()).expect("model loads");
    let tokenizer = Tokenizer::from_gguf(model.gguf()).expect("tokenizer");
    let vocab = grammar_vocab(&tokenizer).expect("vocabulary");
    let pool = ThreadPool::new(2).expect("pool");
    let mut session = Session::new(&model, &pool, 256, KvType::F16).expect("session");
    let prompt = tokenizer.encode(
        "<|im_start|>user\nDescribe a person as JSON.<|im_end|>\n<|im_start|>assistant\n",
        true,
        true,
    );
    let person = json!({"type": "object", "properties": {"name": {"type": "string", "maxLength": 20},
        "age": {"type": "integer", "minimum": 0}}, "required": ["name", "age"]});
    let constraints = [
        Constraint::json_schema(&person).unwrap(),
        Constraint::json_object(),
    ];
    let stop_ids = tokenizer.end_of_generation_ids();
    let configs = [
        SamplerConfig::default(),
        SamplerConfig {
            temperature: 0.9,
            top_k: 40,
            seed: 11,
            ..SamplerConfig::default()
        },
    ];
    for (ci, c) in constraints.iter().enumerate() {
        for cfg in &configs {
            let cfg = SamplerConfig {
                stop_ids: stop_ids.clone(),
                max_tokens: MAX_TOKENS,
                ..cfg.clone()
            };
            let want = serial(&mut session, &vocab, c, &cfg, &prompt);
            let sampler = Sampler::new(cfg.clone()).expect("sampler");
            let mut held = Chooser::new(sampler, Some(c), &vocab).expect("chooser");
            session.reset();
            let got = generate(&mut session, &mut held, &prompt, |_| Flow::Continue)
                .expect("generates")
                .tokens;
            assert!(want.len() > 5, "constraint {ci}: only {want:?}");
            assert_eq!(
                got, want,
                "constraint {ci}, temperature {}",
                cfg.temperature
            );
        }
    }
}
