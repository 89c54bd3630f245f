//! Whole models on the GPU against the CPU backend (`ferrite_model::Session`, f16 KV cache,
//! same machine): last-token logits after a prefill, then teacher-forced greedy decode
//! comparing the argmax at every step. Plus the decode-speed receipt (ignored by default).

use std::sync::Arc;
use std::time::Instant;

use ferrite_cpu::ThreadPool;
use ferrite_cuda::{CudaBackend, CudaModel, CudaSession};
use ferrite_model::{KvType, Model, Outputs, Session};

use crate::synth::{self, Spec};
use crate::{backend, err_tuple};

pub fn argmax(v: &[f32]) -> usize {
    let mut best = 0;
    for (i, &x) in v.iter().enumerate() {
        if x > v[best] {
            best = i;
        }
    }
    best
}

/// Runs the comparison; returns (max |Δ logit| over all steps, top-1 agreements, steps).
/// The GPU takes the prompt in pieces of `piece` tokens (batched prefill from a non-empty
/// cache when smaller than the prompt).
fn compare(
    b: &Arc<CudaBackend>,
    m: &Model,
    what: &str,
    prompt: &[u32],
    piece: usize,
    steps: usize,
) -> (f64, usize, usize) {
    let pool = ThreadPool::with_default_threads().unwrap();
    let ctx = prompt.len() + steps + 1;
    let mut cpu = Session::new(m, &pool, ctx, KvType::F16).unwrap();
    let cm = CudaModel::load(b.clone(), m).unwrap();
    let mut gpu = CudaSession::new(&cm, ctx).unwrap();
    let mut want = cpu
        .eval(prompt, Outputs::Last)
        .unwrap()
        .last()
        .unwrap()
        .to_vec();
    let mut got = Vec::new();
    for p in prompt.chunks(piece) {
        got = gpu.eval(p).unwrap();
    }
    let (mut worst, mut agree) = (0.0f64, 0usize);
    for step in 0..=steps {
        let want64: Vec<f64> = want.iter().map(|&v| f64::from(v)).collect();
        let e = err_tuple(&got, &want64);
        assert!(e.finite, "{what} step {step}: non-finite GPU logits");
        worst = worst.max(e.max_abs);
        let (tg, tc) = (argmax(&got), argmax(&want));
        if tg == tc {
            agree += 1;
        } else {
            // A flip is tolerated only at a near tie of the CPU's own top two.
            let gap = want[tc] - want[tg];
            assert!(
                gap < 1e-3,
                "{what} step {step}: GPU top-1 {tg} vs CPU {tc}, gap {gap}"
            );
        }
        assert!(
            e.max_rel < 2e-3 && e.cosine > 1.0 - 1e-5,
            "{what} step {step}: logits {e:?}"
        );
        if step == steps {
            break;
        }
        // Teacher-forced on the CPU's choice so both timelines stay identical.
        let next = [tc as u32];
        want = cpu
            .eval(&next, Outputs::Last)
            .unwrap()
            .last()
            .unwrap()
            .to_vec();
        got = gpu.eval(&next).unwrap();
    }
    println!(
        "{what}: max |Δ logit| {worst:.3e} over {} steps, top-1 agreement {agree}/{}",
        steps + 1,
        steps + 1
    );
    (worst, agree, steps + 1)
}

fn prompt(n: usize, vocab: usize) -> Vec<u32> {
    (0..n).map(|i| ((i * 37 + 11) % vocab) as u32).collect()
}

/// Runs `s` on a backend of its own, so its launch counters are this model's path markers.
fn run_spec(s: &Spec) -> Arc<CudaBackend> {
    let b = CudaBackend::new().unwrap();
    let m = synth::model(s);
    let what = format!("synthetic {}", s.arch);
    compare(
        &b,
        &m,
        &format!("{what} (whole prompt)"),
        &prompt(12, s.vocab),
        12,
        12,
    );
    compare(
        &b,
        &m,
        &format!("{what} (prompt in 5s)"),
        &prompt(12, s.vocab),
        5,
        12,
    );
    b
}

#[test]
fn llama_synthetic_matches_cpu() {
    if backend().is_none() {
        return;
    }
    let counts = run_spec(&synth::llama_small()).launch_counts();
    for k in [
        "matvec3_q4_1",
        "matvec_gated_q4_1",
        "matvec_q8_0",
        "embed_q8_0",
        "rope_store_f16",
        "residual_norm_f32",
        "attn_f16",
        "gemm_f16",
        "dequant_f16_q4_1",
        "graph_step",
    ] {
        assert!(counts[k] > 0, "{k} never ran");
    }
}

#[test]
fn gemma3_synthetic_matches_cpu() {
    if backend().is_none() {
        return;
    }
    let counts = run_spec(&synth::gemma_small()).launch_counts();
    for k in [
        "matvec_gated_q4_k",
        "matvec_q4_k",
        "matvec_q6_k",
        "matvec_q5_0",
        "rms_norm_f32",
        "embed_q8_0",
        "attn_f16",
        "gemm_f16",
        "dequant_f16_q6_k",
        "graph_step",
    ] {
        assert!(counts[k] > 0, "{k} never ran");
    }
}

#[test]
fn real_models_match_cpu_when_present() {
    if backend().is_none() {
        return;
    }
    let home = std::env::var_os("FERRITE_HOME")
        .map(std::path::PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME").map(|h| std::path::PathBuf::from(h).join(".cache/ferrite"))
        });
    for file in [
        "SmolLM2-135M-Instruct.Q4_1.gguf",
        "gemma-3-270m-q4_k_m.gguf",
    ] {
        let Some(path) = home.as_ref().map(|h| h.join("models").join(file)) else {
            println!("skipped: no FERRITE_HOME or HOME");
            return;
        };
        if !path.exists() {
            println!("skipped: {} not present", path.display());
            continue;
        }
        let m = Model::load(&path, Default::default()).unwrap();
        let vocab = m.config().n_vocab;
        let b = CudaBackend::new().unwrap();
        compare(&b, &m, file, &prompt(20, vocab.min(1000)), 20, 16);
        println!("{file} launches: {:?}", b.launch_counts());
    }
}

#[test]
#[ignore = "decode-speed receipt; run explicitly on the GPU machine"]
fn decode_speed_smollm2_shape() {
    let Some(b) = backend() else { return };
    let t = Instant::now();
    let m = synth::model(&synth::smollm2_shape());
    println!(
        "synthetic SmolLM2-shape model built in {:.1} s",
        t.elapsed().as_secs_f64()
    );
    let cm = CudaModel::load(b.clone(), &m).unwrap();
    let bytes = cm.decode_weight_bytes();
    println!(
        "uploaded in {:.1} ms; {bytes} weight bytes per decode step",
        cm.upload_ms()
    );
    let mut s = CudaSession::new(&cm, 512).unwrap();
    let n = 128;
    let mut trials = Vec::new();
    for trial in 0..6 {
        s.reset();
        s.eval(&[1]).unwrap();
        let t = Instant::now();
        let mut tok = 1u32;
        for _ in 0..n {
            let l = s.eval(&[tok]).unwrap();
            tok = argmax(&l) as u32;
        }
        let tps = n as f64 / t.elapsed().as_secs_f64();
        if trial > 0 {
            trials.push(tps);
        }
    }
    trials.sort_by(f64::total_cmp);
    let med = trials[trials.len() / 2];
    let floor = 4.3e12 / bytes as f64;
    println!(
        "decode {n} tokens, 5 trials after 1 warmup: median {med:.1} tok/s (min {:.1}, max {:.1}); \
         bandwidth floor at 4.3 TB/s {floor:.0} tok/s, reached {:.1} %; launches {:?}",
        trials[0],
        trials[trials.len() - 1],
        100.0 * med / floor,
        b.launch_counts()
    );
}
