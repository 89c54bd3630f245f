//! Session state on the GPU: `CudaSession::export_state` / `import_state`.
//!
//! Oracle: the uninterrupted session. A session restored from a state and fed the same
//! tokens through the same calls runs the same kernels on the same bits (KV rows copied
//! exactly, positions and tokens rewritten to device memory at every step), so its logits
//! must be equal bit for bit, through the decode graph and through batched prefill. The
//! test of the test drops one layer's value rows and requires a difference. The layout is
//! checked against the CPU backend's export (same rows, same order, up to f16 rounding).

use ferrite_cpu::ThreadPool;
use ferrite_cuda::{CudaError, CudaModel, CudaSession};
use ferrite_model::{KvType, Model, Outputs, Session, SessionState};
use half::f16;

use crate::synth::{self, Spec};
use crate::{backend, err_tuple};

fn tokens(n: usize, vocab: usize, seed: usize) -> Vec<u32> {
    (0..n)
        .map(|i| ((i * 37 + seed * 101 + 11) % vocab) as u32)
        .collect()
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// Logits of the calls `pieces` after whatever `s` holds (one logits vector per call).
fn feed(s: &mut CudaSession<'_>, pieces: &[&[u32]]) -> Vec<Vec<u32>> {
    pieces.iter().map(|p| bits(&s.eval(p).unwrap())).collect()
}

/// The continuation used everywhere: three single tokens (decode graph), a batch of five
/// (prefill from a non-empty cache), two more singles.
fn continuation(vocab: usize) -> Vec<Vec<u32>> {
    let t = tokens(10, vocab, 7);
    vec![
        t[0..1].to_vec(),
        t[1..2].to_vec(),
        t[2..3].to_vec(),
        t[3..8].to_vec(),
        t[8..9].to_vec(),
        t[9..10].to_vec(),
    ]
}

fn pieces(c: &[Vec<u32>]) -> Vec<&[u32]> {
    c.iter().map(Vec::as_slice).collect()
}

fn check_spec(s: &Spec) {
    let m = synth::model(s);
    let b = backend().unwrap();
    let cm = CudaModel::load(b.clone(), &m).unwrap();
    let what = format!("synthetic {} ({} layers)", s.arch, s.n_layer);
    let prompt = tokens(37, s.vocab, 1);
    let cont = continuation(s.vocab);
    let ctx = 64;

    // Uninterrupted: prompt (batched prefill), export, continue.
    let mut a = CudaSession::new(&cm, ctx).unwrap();
    let after_prompt = bits(&a.eval(&prompt).unwrap());
    let state = a.export_state(prompt.len()).unwrap();
    assert_eq!(state.tokens, prompt);
    assert_eq!(
        state.logits.as_deref().map(bits),
        Some(after_prompt.clone())
    );
    let want = feed(&mut a, &pieces(&cont));
    assert_eq!(a.tokens().len(), prompt.len() + 10);

    // Restored into a fresh session: the logits come back without an evaluation, then the
    // continuation matches bit for bit.
    let steps0 = b.launch_counts()["graph_step"];
    let mut r = CudaSession::new(&cm, ctx).unwrap();
    r.import_state(&state, prompt.len()).unwrap();
    assert_eq!((r.n_past(), r.tokens()), (prompt.len(), &prompt[..]));
    assert_eq!(
        r.next_logits().unwrap().map(|l| bits(&l)),
        Some(after_prompt)
    );
    assert_eq!(
        r.export_state(prompt.len()).unwrap(),
        state,
        "{what}: re-export"
    );
    assert_eq!(feed(&mut r, &pieces(&cont)), want, "{what}: first restore");
    let graph_steps = b.launch_counts()["graph_step"] - steps0;
    assert!(
        graph_steps >= 5,
        "{what}: decode graph ran {graph_steps} steps"
    );

    // Restored a second time into the same session (its graph and prefill buffers already
    // exist and the cache holds later rows): the same again.
    r.import_state(&state, prompt.len()).unwrap();
    assert_eq!(feed(&mut r, &pieces(&cont)), want, "{what}: second restore");

    // A partial restore (the first 20 positions of the 37-position state) holds exactly
    // the first 20 rows of every block (the block stride is the state's 37, not 20) and
    // continues as the whole state truncated to 20 does. (Not compared with a fresh
    // 20-token prefill: cuBLAS may pick another algorithm for another batch size.)
    let block = prompt.len() * state.row * 2;
    let head = SessionState {
        tokens: prompt[..20].to_vec(),
        kv: state
            .kv
            .chunks(block)
            .flat_map(|c| c[..20 * state.row * 2].to_vec())
            .collect(),
        logits: None,
        ..state.clone()
    };
    let mut q = CudaSession::new(&cm, ctx).unwrap();
    q.import_state(&state, prompt.len()).unwrap();
    q.truncate(20);
    let want_part = feed(&mut q, &[&prompt[20..], &cont[0]]);
    r.import_state(&state, 20).unwrap();
    assert!(
        r.next_logits().unwrap().is_none(),
        "a partial state has no logits"
    );
    assert_eq!(r.export_state(20).unwrap(), head, "{what}: partial rows");
    assert_eq!(
        feed(&mut r, &[&prompt[20..], &cont[0]]),
        want_part,
        "{what}: partial restore"
    );

    // Truncation invalidates the exported logits.
    r.truncate(30);
    assert!(r.export_state(30).unwrap().logits.is_none());
    assert!(r.export_state(31).is_err());

    // The rows have the CPU backend's layout: same order, f16 rounding apart.
    let pool = ThreadPool::new(4).unwrap();
    let mut cpu = Session::new(&m, &pool, ctx, KvType::F16).unwrap();
    cpu.eval(&prompt, Outputs::Last).unwrap();
    let host = cpu.export_state(prompt.len()).unwrap();
    assert_eq!((host.n_layer, host.row), (state.n_layer, state.row));
    for (i, (g, c)) in state
        .kv
        .chunks(block)
        .zip(host.kv.chunks(block))
        .enumerate()
    {
        let g: Vec<f32> = g
            .chunks_exact(2)
            .map(|x| f16::from_bits(u16::from_le_bytes([x[0], x[1]])).to_f32())
            .collect();
        let c: Vec<f64> = c
            .chunks_exact(2)
            .map(|x| f64::from(f16::from_bits(u16::from_le_bytes([x[0], x[1]])).to_f32()))
            .collect();
        let e = err_tuple(&g, &c);
        assert!(
            e.finite && e.cosine > 0.999 && e.max_rel < 3e-2,
            "{what}: block {i} (layer {}, {}) vs CPU: {e:?}",
            i / 2,
            if i % 2 == 0 { "keys" } else { "values" }
        );
    }
    println!(
        "{what}: restore of {} positions continued bit-identically over {} calls ({graph_steps} graph steps), twice; partial restore exact; rows match the CPU layout",
        prompt.len(),
        cont.len()
    );

    // Test of the test: drop layer 1's value rows (zero them); the continuation differs.
    let mut planted = state.clone();
    let at = 3 * block;
    planted.kv[at..at + block].fill(0);
    r.import_state(&planted, prompt.len()).unwrap();
    let got = feed(&mut r, &pieces(&cont));
    assert_ne!(
        got, want,
        "{what}: dropping a layer's values went unnoticed"
    );
    println!("{what}: planted defect (layer 1 values zeroed) detected");
}

#[test]
fn llama_restores_continue_bit_identically() {
    if backend().is_none() {
        return;
    }
    check_spec(&synth::llama_small());
}

#[test]
fn gemma3_restores_continue_bit_identically_across_the_window() {
    if backend().is_none() {
        return;
    }
    check_spec(&synth::gemma_small());
}

fn rejected(s: &mut CudaSession<'_>, st: &SessionState, n: usize, what: &str) {
    match s.import_state(st, n) {
        Err(CudaError::SessionState(msg)) => println!("rejected {what}: {msg}"),
        other => panic!("{what}: {other:?}"),
    }
}

#[test]
fn states_of_another_shape_are_rejected_and_leave_the_session_unchanged() {
    let Some(b) = backend() else {
        return;
    };
    let (ls, gs) = (synth::llama_small(), synth::gemma_small());
    let (lm, gm): (Model, Model) = (synth::model(&ls), synth::model(&gs));
    let lc = CudaModel::load(b.clone(), &lm).unwrap();
    let gc = CudaModel::load(b.clone(), &gm).unwrap();
    let prompt = tokens(12, ls.vocab.min(gs.vocab), 2);
    let mut g = CudaSession::new(&gc, 32).unwrap();
    g.eval(&prompt).unwrap();
    let gemma_state = g.export_state(12).unwrap();
    let mut s = CudaSession::new(&lc, 32).unwrap();
    s.eval(&prompt).unwrap();
    let good = s.export_state(12).unwrap();
    let next = tokens(3, ls.vocab, 5);
    let mut probe = CudaSession::new(&lc, 32).unwrap();
    probe.import_state(&good, 12).unwrap();
    let want = bits(&probe.eval(&next).unwrap());

    rejected(&mut s, &gemma_state, 12, "another model's shape");
    let mut f32s = good.clone();
    f32s.kv_type = KvType::F32;
    f32s.kv.extend_from_within(..);
    rejected(&mut s, &f32s, 12, "f32 rows");
    let mut layers = good.clone();
    layers.n_layer += 1;
    layers.kv.extend_from_within(..good.kv.len() / ls.n_layer);
    rejected(&mut s, &layers, 12, "one layer more");
    let mut short = good.clone();
    short.kv.pop();
    rejected(&mut s, &short, 12, "a truncated KV section");
    let mut tok = good.clone();
    tok.tokens[4] = ls.vocab as u32;
    rejected(&mut s, &tok, 12, "a token outside the vocabulary");
    let mut lg = good.clone();
    lg.logits = Some(vec![0.0; 3]);
    rejected(&mut s, &lg, 12, "a wrong logits length");
    rejected(&mut s, &good, 13, "more positions than the state holds");
    let mut small = CudaSession::new(&lc, 8).unwrap();
    rejected(&mut small, &good, 12, "a context too small");

    // Nothing was written: the session continues as the probe did.
    assert_eq!(s.n_past(), 12);
    assert_eq!(
        bits(&s.eval(&next).unwrap()),
        want,
        "session changed by a rejection"
    );
}
