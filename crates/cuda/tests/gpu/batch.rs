//! Batched decode (`CudaBatch::step`) against each session stepped alone.
//!
//! Oracle: twin sessions of the same model and context, fed the same prompts, each stepped
//! by `CudaSession::eval` of one token. The batched kernels add, for every column, the same
//! unit dot products in the same order as the one-column kernels, and every other op runs
//! the same per-row code, so the logits should be equal bit for bit. The assertion allows
//! max |Δ| ≤ 1e-5 of the largest |logit| per row (the f32 kernels' own product bound), so a
//! re-tuned single-column kernel that sums in another order still passes while any wrong
//! column, position or cache (orders of magnitude larger: see the planted defect in the
//! receipt) fails. Sessions differ in prompt, length and context (hence in key splits), and
//! batches of 1, 2, 4, 8 and 11 sessions (two column launches) run under every activation
//! setting. Path marker: the batched kernels' launch counts and the batch's graph replays.

use ferrite_cuda::{Activations, CudaBatch, CudaModel, CudaSession, DEFAULT_ACTIVATIONS};
use ferrite_gguf::GgmlType;

use crate::backend;
use crate::synth::{self, Spec};

/// Max |Δ logit| between a batched and a single step, relative to the largest |logit|.
const BATCH_REL: f64 = 1e-5;

fn prompt(len: usize, vocab: usize, seed: usize) -> Vec<u32> {
    (0..len)
        .map(|i| ((i * 31 + seed * 97 + 5) % vocab) as u32)
        .collect()
}

/// Max |a − b| / max |b|, and whether the rows are equal bit for bit.
fn diff(a: &[f32], b: &[f32]) -> (f64, bool) {
    assert_eq!(a.len(), b.len());
    let scale = b.iter().fold(0.0f64, |m, &x| m.max(f64::from(x).abs()));
    let d = a
        .iter()
        .zip(b)
        .fold(0.0f64, |m, (&x, &y)| m.max(f64::from(x - y).abs()));
    let same = a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits());
    (d / scale.max(1e-30), same)
}

/// Steps `n` sessions (prompt lengths 1 + 5i, contexts 64 or 512) three times batched and
/// their twins alone, then once more alone both; returns (worst relative difference, rows
/// compared, rows equal bit for bit).
fn compare<'m>(
    cm: &'m CudaModel,
    batch: &mut CudaBatch<'m>,
    n: usize,
    vocab: usize,
) -> (f64, usize, usize) {
    let ctx = |i: usize| if i.is_multiple_of(2) { 64 } else { 512 };
    let mut solo: Vec<CudaSession<'_>> = (0..n)
        .map(|i| CudaSession::new(cm, ctx(i)).unwrap())
        .collect();
    let mut bat: Vec<CudaSession<'_>> = (0..n)
        .map(|i| CudaSession::new(cm, ctx(i)).unwrap())
        .collect();
    let mut next = Vec::new();
    for i in 0..n {
        let p = prompt(1 + 5 * i, vocab, i);
        let a = solo[i].eval(&p).unwrap();
        let b = bat[i].eval(&p).unwrap();
        assert_eq!(a, b, "prefill is deterministic");
        next.push(crate::model::argmax(&a) as u32);
    }
    let (mut worst, mut rows, mut same) = (0.0f64, 0, 0);
    let mut check = |got: &[f32], want: &[f32], what: String| {
        let (d, eq) = diff(got, want);
        assert!(d <= BATCH_REL, "{what}: max rel {d:e} > {BATCH_REL:e}");
        worst = worst.max(d);
        rows += 1;
        same += usize::from(eq);
    };
    let replays = batch.replays();
    for step in 0..3 {
        let want: Vec<Vec<f32>> = (0..n).map(|i| solo[i].eval(&[next[i]]).unwrap()).collect();
        let mut refs: Vec<&mut CudaSession<'_>> = bat.iter_mut().collect();
        let got = batch.step(&mut refs, &next).unwrap();
        assert_eq!(got.len(), n);
        for i in 0..n {
            check(&got[i], &want[i], format!("n={n} step {step} session {i}"));
            let kept = bat[i].next_logits().unwrap().unwrap();
            assert!(
                kept.iter()
                    .zip(&got[i])
                    .all(|(a, b)| a.to_bits() == b.to_bits())
            );
            assert_eq!(bat[i].n_past(), solo[i].n_past());
            assert_eq!(bat[i].tokens(), solo[i].tokens());
            next[i] = crate::model::argmax(&want[i]) as u32;
        }
    }
    let batched = if n > 1 { 3 } else { 0 };
    assert_eq!(batch.replays() - replays, batched, "batched steps replayed");
    // The rows the batched steps stored serve a later single step.
    for i in 0..n {
        let a = solo[i].eval(&[next[i]]).unwrap();
        let b = bat[i].eval(&[next[i]]).unwrap();
        check(
            &b,
            &a,
            format!("n={n} single step after batching, session {i}"),
        );
    }
    (worst, rows, same)
}

fn check_spec(s: &Spec) {
    let b = backend().unwrap();
    let m = synth::model(s);
    let cm = CudaModel::load(b.clone(), &m).unwrap();
    let mut batch = CudaBatch::new(&cm, 16).unwrap();
    for act in [Activations::Int8x2, Activations::F32, Activations::Int8] {
        b.set_activations(act);
        let before: u64 = b
            .launch_counts()
            .iter()
            .filter(|(k, _)| k.starts_with("bmv_") || k.starts_with("battn"))
            .map(|(_, v)| v)
            .sum();
        for n in [1, 2, 4, 8, 11] {
            let (worst, rows, same) = compare(&cm, &mut batch, n, s.vocab);
            println!(
                "batch {} ({} layers) act={} n={n}: max rel {worst:.2e}, {same}/{rows} rows bit-identical",
                s.arch,
                s.n_layer,
                act.name()
            );
        }
        let after: u64 = b
            .launch_counts()
            .iter()
            .filter(|(k, _)| k.starts_with("bmv_") || k.starts_with("battn"))
            .map(|(_, v)| v)
            .sum();
        assert!(after > before, "the batched kernels were captured");
    }
    b.set_activations(DEFAULT_ACTIVATIONS);
}

#[test]
fn batched_steps_match_single_steps_llama() {
    if backend().is_none() {
        return;
    }
    check_spec(&synth::llama_small());
}

#[test]
fn batched_steps_match_single_steps_gemma3() {
    if backend().is_none() {
        return;
    }
    check_spec(&synth::gemma_small());
}

#[test]
fn batched_steps_match_single_steps_f16_f32_weights() {
    if backend().is_none() {
        return;
    }
    check_spec(&Spec {
        attn_qk: GgmlType::F16,
        attn_v: GgmlType::F32,
        attn_o: GgmlType::F16,
        ffn_up: GgmlType::F32,
        ffn_down: GgmlType::F16,
        output: Some(GgmlType::F32),
        ..synth::llama_small()
    });
}

#[test]
fn batched_steps_match_single_steps_q4_0_bf16_weights() {
    if backend().is_none() {
        return;
    }
    check_spec(&synth::llama_q4_0_bf16());
    let counts = backend().unwrap().launch_counts();
    for k in ["bmv_q4_0", "bmv_gated_bf16", "bmv_bf16"] {
        assert!(counts[k] > 0, "{k} never ran");
    }
}

#[test]
fn batch_errors_leave_sessions_unchanged() {
    let Some(b) = backend() else {
        return;
    };
    let s = synth::llama_small();
    let m = synth::model(&s);
    let cm = CudaModel::load(b, &m).unwrap();
    let mut batch = CudaBatch::new(&cm, 4).unwrap();
    let mut a = CudaSession::new(&cm, 8).unwrap();
    let mut c = CudaSession::new(&cm, 8).unwrap();
    a.eval(&prompt(8, s.vocab, 1)).unwrap();
    c.eval(&prompt(3, s.vocab, 2)).unwrap();
    let full = batch.step(&mut [&mut a, &mut c], &[1, 2]);
    assert!(full.is_err_and(|e| e.to_string().contains("context full")));
    let bad = batch.step(&mut [&mut c], &[s.vocab as u32]);
    assert!(bad.is_err());
    assert!(batch.step(&mut [&mut c], &[1, 2]).is_err());
    assert_eq!((a.n_past(), c.n_past()), (8, 3));
}

/// Aggregate decode tok/s of `n` sessions (contexts of 512, 16-token prompts): stepped one
/// by one through `CudaSession::eval` (the graph of one session), and together through
/// `CudaBatch::step`; medians of 5 timed runs of `steps` steps after a warm-up. Both
/// include copying the logits rows back, as the server does.
fn aggregate_tps(cm: &CudaModel, n: usize, steps: usize) -> (f64, f64) {
    let b = cm.backend();
    let mut sessions: Vec<CudaSession<'_>> =
        (0..n).map(|_| CudaSession::new(cm, 512).unwrap()).collect();
    let mut batch = CudaBatch::new(cm, n).unwrap();
    let mut run = |batched: bool| {
        for (i, s) in sessions.iter_mut().enumerate() {
            s.reset();
            s.eval(&prompt(16, cm.config().n_vocab, i)).unwrap();
        }
        let tokens: Vec<u32> = (0..n as u32).collect();
        b.synchronize().unwrap();
        let t = std::time::Instant::now();
        for _ in 0..steps {
            if batched {
                let mut refs: Vec<&mut CudaSession<'_>> = sessions.iter_mut().collect();
                batch.step(&mut refs, &tokens).unwrap();
            } else {
                for (s, &tok) in sessions.iter_mut().zip(&tokens) {
                    s.eval(&[tok]).unwrap();
                }
            }
        }
        b.synchronize().unwrap();
        (n * steps) as f64 / t.elapsed().as_secs_f64()
    };
    let mut med = |batched: bool| {
        let mut v: Vec<f64> = (0..6).map(|_| run(batched)).skip(1).collect();
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    (med(false), med(true))
}

#[test]
#[ignore = "batched decode speed receipt; run explicitly on the GPU machine"]
fn batch_decode_speed() {
    let Some(b) = backend() else { return };
    let m = match std::env::var("FERRITE_BATCH_BENCH_MODEL") {
        Ok(path) => ferrite_model::Model::load(std::path::Path::new(&path), Default::default())
            .unwrap_or_else(|e| panic!("{path}: {e}")),
        Err(_) => synth::model(&synth::smollm2_shape()),
    };
    let cm = CudaModel::load(b.clone(), &m).unwrap();
    println!(
        "model: {} layers, d {}, {} weight bytes per decode step, act={}",
        cm.config().n_layer,
        cm.config().d_model,
        cm.decode_weight_bytes(),
        b.activations().name()
    );
    for n in [1, 2, 4, 8, 16] {
        let (solo, batched) = aggregate_tps(&cm, n, 32);
        println!(
            "n={n:>2}: one by one {solo:8.1} tok/s, batched {batched:8.1} tok/s ({:.2}x)",
            batched / solo
        );
    }
}
