//! Quantized files load and run in ferrite-model.
//!
//! Oracle: the same model's f32 forward pass (the input file). Q8_0 must agree with it on the
//! top-1 token at >= 98% of positions (issue #7's bar); every mix must load and give finite
//! logits. The agreement measure is checked to discriminate: an unrelated model (other seed
//! of the same shape) must score far below the bar. On the untied K-friendly model the lower
//! mixes land where expected (seen 2026-11-29: Q6_K 0.96, Q5_K_M 0.96, Q4_K_M 0.83, Q4_0
//! 0.89); the tied model mostly predicts its input token, so there it only proves loading
//! and finiteness.

mod common;

use common::{Shape, llama_f32};
use ferrite_gguf::Gguf;
use ferrite_model::{KvType, LoadOptions, Model, Outputs, Session};
use ferrite_quantize::{Mix, QuantizeOptions, quantize_file};

const N_TOKENS: usize = 96;

fn tokens(vocab: usize) -> Vec<u32> {
    (0..N_TOKENS)
        .map(|i| ((i * 37 + 11) % vocab) as u32)
        .collect()
}

/// Per-position argmax of the logits of `toks`, after checking every logit is finite.
fn top1(model: &Model, toks: &[u32]) -> Vec<usize> {
    let pool = ferrite_cpu::ThreadPool::new(2).expect("pool");
    let mut s = Session::new(model, &pool, 256, KvType::F32).expect("session");
    let logits = s.eval(toks, Outputs::All).expect("eval");
    assert_eq!(logits.n_rows(), toks.len());
    (0..logits.n_rows())
        .map(|r| {
            let row = logits.row(r).expect("row");
            assert!(row.iter().all(|v| v.is_finite()), "non-finite logit at {r}");
            row.iter()
                .enumerate()
                .max_by(|a, b| a.1.total_cmp(b.1))
                .map(|(i, _)| i)
                .expect("non-empty vocab")
        })
        .collect()
}

fn agreement(a: &[usize], b: &[usize]) -> f64 {
    a.iter().zip(b).filter(|(x, y)| x == y).count() as f64 / a.len() as f64
}

fn load(bytes: Vec<u8>) -> Model {
    Model::from_gguf(
        Gguf::from_bytes(bytes).expect("gguf"),
        LoadOptions::default(),
    )
    .expect("model loads")
}

#[test]
fn quantized_models_load_run_and_q8_0_keeps_the_top_token() {
    let dir = tempfile::tempdir().expect("tempdir");
    for shape in [Shape::K_FRIENDLY, Shape::ODD] {
        let bytes = llama_f32(shape, &[]);
        let input = Gguf::from_bytes(bytes.clone()).expect("input");
        let toks = tokens(shape.vocab);
        let reference = top1(&load(bytes), &toks);
        for mix in Mix::ALL {
            let out = dir.path().join(format!("{mix}-{}.gguf", shape.d));
            let opts = QuantizeOptions {
                mix,
                threads: 2,
                allow_requantize: false,
            };
            quantize_file(&input, &out, &opts, &mut |_| {}).expect("quantize");
            let model = Model::load(&out, LoadOptions::default()).expect("quantized loads");
            let agree = agreement(&reference, &top1(&model, &toks));
            println!("d={} {mix}: top-1 agreement with f32 {agree:.3}", shape.d);
            if matches!(mix, Mix::Q8_0 | Mix::F16 | Mix::BF16 | Mix::F32) {
                assert!(agree >= 0.98, "{mix}: top-1 agreement {agree:.3} < 0.98");
            }
        }
    }
}

#[test]
fn the_agreement_oracle_rejects_an_unrelated_model() {
    // Test the test: a model with other weights (the `extra` tensor shifts every seed) must
    // not pass the 0.98 bar, or the check above would prove nothing.
    let shape = Shape::K_FRIENDLY;
    let toks = tokens(shape.vocab);
    let a = top1(&load(llama_f32(shape, &[])), &toks);
    let other = Shape {
        seed: 8,
        ..Shape::K_FRIENDLY
    };
    let b = top1(&load(llama_f32(other, &[])), &toks);
    let agree = agreement(&a, &b);
    assert!(
        agree < 0.5,
        "unrelated models agree on {agree:.3} of positions"
    );
}
