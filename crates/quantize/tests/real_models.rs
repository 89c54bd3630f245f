//! The mix rule against files llama.cpp produced, and requantizing a real model.
//!
//! Oracle: the tensor types in `gemma-3-270m-q4_k_m.gguf` (made by llama.cpp's Q4_K_M mix)
//! and `SmolLM2-135M-Instruct.Q4_1.gguf` (its Q4_1 mix). The rule must reproduce every type
//! of both files from names and shapes alone. Needs the real models (skipped with a
//! `skipped:` line when absent, a failure with FERRITE_TEST_MODELS=1).

use ferrite_gguf::Gguf;
use ferrite_model::{KvType, LoadOptions, Model, Outputs, Session};
use ferrite_quantize::{Mix, QuantizeOptions, plan, quantize_file};

fn plan_reproduces(file: &str, mix: Mix) {
    let Some(path) = ferrite_testkit::real_model(file) else {
        return;
    };
    let g = Gguf::open(&path).expect("open");
    let planned = plan(&g, mix);
    let mut mismatches = Vec::new();
    for (t, p) in g.tensors().iter().zip(&planned) {
        if t.ty != p.to {
            mismatches.push(format!("{}: file {} rule {}", t.name, t.ty, p.to));
        }
    }
    println!(
        "{file}: {} tensors checked against the {mix} rule",
        planned.len()
    );
    assert!(mismatches.is_empty(), "{mismatches:#?}");
}

#[test]
fn rule_reproduces_llama_cpp_q4_k_m_of_gemma3() {
    plan_reproduces("gemma-3-270m-q4_k_m.gguf", Mix::Q4_K_M);
}

#[test]
fn rule_reproduces_llama_cpp_q4_1_of_smollm2() {
    plan_reproduces("SmolLM2-135M-Instruct.Q4_1.gguf", Mix::Q4_1);
}

fn top1(model: &Model, toks: &[u32]) -> Vec<usize> {
    let pool = ferrite_cpu::ThreadPool::new(2).expect("pool");
    let mut s = Session::new(model, &pool, 256, KvType::F32).expect("session");
    let logits = s.eval(toks, Outputs::All).expect("eval");
    (0..logits.n_rows())
        .map(|r| {
            let row = logits.row(r).expect("row");
            assert!(row.iter().all(|v| v.is_finite()));
            row.iter()
                .enumerate()
                .max_by(|a, b| a.1.total_cmp(b.1))
                .map(|(i, _)| i)
                .expect("vocab")
        })
        .collect()
}

#[test]
fn requantizing_smollm2_to_q8_0_keeps_its_predictions() {
    // Q8_0 of the dequantized Q4_1 weights is within ~0.5% of them, so the top token of
    // the original file should survive at nearly every position.
    let Some(path) = ferrite_testkit::real_model("SmolLM2-135M-Instruct.Q4_1.gguf") else {
        return;
    };
    let g = Gguf::open(&path).expect("open");
    let dir = tempfile::tempdir().expect("tempdir");
    let out = dir.path().join("q8.gguf");
    let opts = QuantizeOptions {
        mix: Mix::Q8_0,
        threads: 2,
        allow_requantize: true,
    };
    let s = quantize_file(&g, &out, &opts, &mut |_| {}).expect("requantize");
    println!(
        "SmolLM2 Q4_1 -> Q8_0: {} converted, {} copied, {:.2} s",
        s.converted,
        s.copied,
        s.elapsed.as_secs_f64()
    );
    // A real prompt's ids would be nicer; any ids exercise every weight the same way.
    let toks: Vec<u32> = (0..48).map(|i| 1 + (i * 997) % 49_000).collect();
    let a = top1(
        &Model::load(&path, LoadOptions::default()).expect("load"),
        &toks,
    );
    let b = top1(
        &Model::load(&out, LoadOptions::default()).expect("load q8"),
        &toks,
    );
    let agree = a.iter().zip(&b).filter(|(x, y)| x == y).count() as f64 / a.len() as f64;
    println!("top-1 agreement Q8_0-of-Q4_1 vs Q4_1: {agree:.3}");
    assert!(agree >= 0.9, "agreement {agree:.3}");
}
