//! Hybrid recurrent models against transformers (fixtures/hybrid, see its README): every
//! Hugging Face directory there is converted to f32 GGUF and teacher-forced through its
//! fixture's sequences. Bound: max |Δ log-prob| ≤ 1e-3 over the fixture's top-20 and every
//! greedy token the argmax, with f32 weights and an f32 KV store. The naive f64 reference
//! (its own DeltaNet recurrence) meets the same bound and agrees with the optimized pass
//! within 5e-4 of a logit.
//!
//! The recurrent state's invariants, bit for bit on the CPU: a prompt in one pass equals the
//! same tokens one at a time; a session truncated to an earlier position (which restores
//! its latest checkpoint and replays the kept tokens after it) continues exactly as an
//! uninterrupted one; a reset session equals a fresh one; rows of a batch equal their
//! sessions stepped alone; a snapshot (whole, or at a kept checkpoint, also through the
//! snapshot file) continues exactly, and a rejected one leaves the session as it was.
//! Planted defects the fixture check must reject, per family: the convolution's taps moved
//! one position (it reads its inputs one position off); Qwen3-Next's attention output gate
//! and shared expert gate zeroed (each a missing gate: sigmoid(0) halves the output);
//! Nemotron-H's skip `D` zeroed, its `A` not negated (a decay that grows) and its time steps
//! left without transformers' floor (`ssm.time_step_min` 0, as llama.cpp runs them).

mod common;

use std::path::{Path, PathBuf};

use common::{TensorEdit, rewrite_gguf, run, text};
use ferrite_cpu::ThreadPool;
use ferrite_model::{
    Batch, CHECKPOINT_EVERY, KvType, LoadOptions, Model, Outputs, Precision, Session, reference,
};
use serde_json::Value as Json;

fn fixture_dirs() -> Vec<PathBuf> {
    common::model_dirs("FERRITE_HYBRID_FIXTURES", "hybrid")
}

struct Case {
    prompt: Vec<u32>,
    generated: Vec<u32>,
    /// Per step, the reference top-20 `(id, log-prob)`.
    top: Vec<Vec<(usize, f64)>>,
}

fn cases(dir: &Path) -> Vec<Case> {
    let ids = common::id_array;
    std::fs::read_to_string(dir.join("logits.jsonl"))
        .unwrap()
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let v: Json = serde_json::from_str(l).unwrap();
            let top = v["steps"]
                .as_array()
                .unwrap()
                .iter()
                .map(|s| {
                    s["top"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|p| (p[0].as_u64().unwrap() as usize, p[1].as_f64().unwrap()))
                        .collect()
                })
                .collect();
            Case {
                prompt: ids(&v["prompt_ids"]),
                generated: ids(&v["generated_ids"]),
                top,
            }
        })
        .collect()
}

fn convert(dir: &Path, out: &Path) -> PathBuf {
    let dst = out.join("f32.gguf");
    let o = run(&[
        "convert",
        dir.to_str().unwrap(),
        dst.to_str().unwrap(),
        "--type",
        "f32",
    ]);
    assert!(o.status.success(), "convert: {}", text(&o));
    dst
}

fn load(path: &Path) -> Model {
    Model::load(
        path,
        LoadOptions {
            precision: Precision::F32,
        },
    )
    .unwrap()
}

/// `(max |Δ log-prob| over the reference top-20s, greedy steps whose argmax is right, steps)`.
fn score(model: &Model, cases: &[Case], pool: &ThreadPool) -> (f64, usize, usize) {
    let (mut worst, mut right, mut steps) = (0.0f64, 0, 0);
    for c in cases {
        let seq = [c.prompt.as_slice(), &c.generated].concat();
        let mut s = Session::new(model, pool, seq.len(), KvType::F32).unwrap();
        let l = s.eval(&seq, Outputs::From(c.prompt.len() - 1)).unwrap();
        for (step, (&tok, top)) in c.generated.iter().zip(&c.top).enumerate() {
            let row = l.row(step).unwrap();
            let max = row.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x));
            let lse = f64::from(max)
                + row
                    .iter()
                    .map(|&x| f64::from(x - max).exp())
                    .sum::<f64>()
                    .ln();
            for &(id, lp) in top {
                worst = worst.max((f64::from(row[id]) - lse - lp).abs());
            }
            let arg = (0..row.len()).fold(0, |b, i| if row[i] > row[b] { i } else { b });
            right += usize::from(arg == tok as usize);
            steps += 1;
        }
    }
    (worst, right, steps)
}

#[test]
fn converted_hybrids_match_transformers_and_planted_defects_fail() {
    let pool = ThreadPool::new(2).unwrap();
    for dir in fixture_dirs() {
        let tmp = tempfile::tempdir().unwrap();
        let cases = cases(&dir);
        let f32_path = convert(&dir, tmp.path());
        let (worst, right, steps) = score(&load(&f32_path), &cases, &pool);
        println!(
            "{}: max |Δ log-prob| {worst:.2e}, top-1 {right}/{steps}",
            dir.display()
        );
        assert!(worst <= 1e-3 && right == steps, "{}", dir.display());
        let shift_taps = |data: &[u8]| -> Vec<u8> {
            // Each channel's 4-byte taps moved one later: tap j reads what tap j-1 should.
            let k = 4 * ferrite_gguf::Gguf::open(&f32_path)
                .unwrap()
                .tensors()
                .iter()
                .find(|t| t.name.ends_with("ssm_conv1d.weight"))
                .unwrap()
                .dims[0] as usize;
            data.chunks_exact(k)
                .flat_map(|taps| {
                    let mut out = vec![0u8; 4];
                    out.extend_from_slice(&taps[..k - 4]);
                    out
                })
                .collect()
        };
        let conv_off = |n: &str, d: &[u8]| n.ends_with("ssm_conv1d.weight").then(|| shift_taps(d));
        let gate_zeroed = |n: &str, d: &[u8]| {
            (n.ends_with("attn_gate.weight") && !is_delta_layer(&f32_path, n))
                .then(|| vec![0u8; d.len()])
        };
        let shared_gate_zeroed = |n: &str, d: &[u8]| {
            n.ends_with("ffn_gate_inp_shexp.weight")
                .then(|| vec![0u8; d.len()])
        };
        // The scan's skip connection `D · x` left out.
        let d_zeroed = |n: &str, d: &[u8]| n.ends_with(".ssm_d").then(|| vec![0u8; d.len()]);
        // A_log stored as A: the decay exp(δ·A) without its minus sign grows.
        let a_positive = |n: &str, d: &[u8]| n.ends_with(".ssm_a").then(|| flip_f32_signs(d));
        // Time steps left unfloored (as llama.cpp runs): the file's floor set to 0.
        let keep = |_: &str, _: &[u8]| None;
        let no_floor = [(
            "nemotron_h.ssm.time_step_min",
            ferrite_gguf::Value::F32(0.0),
        )];
        let g = ferrite_gguf::Gguf::open(&f32_path).unwrap();
        let arch = g.get_str("general.architecture").unwrap().to_owned();
        // Each family's own missing pieces; every one must change the file.
        type Meta<'a> = &'a [(&'a str, ferrite_gguf::Value)];
        let defects: Vec<(&str, Meta<'_>, &TensorEdit<'_>)> = match arch.as_str() {
            "qwen3next" => vec![
                ("attention gate zeroed", &[], &gate_zeroed),
                ("shared expert gate zeroed", &[], &shared_gate_zeroed),
                ("convolution one position off", &[], &conv_off),
            ],
            "nemotron_h" => vec![
                ("D skip zeroed", &[], &d_zeroed),
                ("A not negated", &[], &a_positive),
                ("convolution one position off", &[], &conv_off),
                ("time steps not floored", &no_floor, &keep),
            ],
            other => panic!("no planted defects for {other}"),
        };
        for (label, meta, edit) in defects {
            let bad = tmp.path().join("bad.gguf");
            assert!(
                rewrite_gguf(&f32_path, &bad, meta, edit),
                "{label}: nothing changed"
            );
            let (w, r, s) = score(&load(&bad), &cases, &pool);
            println!("  {label}: max |Δ log-prob| {w:.2e}, top-1 {r}/{s}");
            assert!(w > 1e-3 || r < s, "{label} passed the fixture check");
        }
    }
}

/// F32 values with their signs flipped.
fn flip_f32_signs(d: &[u8]) -> Vec<u8> {
    d.chunks_exact(4)
        .flat_map(|v| (-f32::from_le_bytes(v.try_into().unwrap())).to_le_bytes())
        .collect()
}

/// Whether tensor `name` of `path` belongs to a DeltaNet layer (one with `ssm_out`).
fn is_delta_layer(path: &Path, name: &str) -> bool {
    let layer = name.split('.').nth(1).unwrap();
    ferrite_gguf::Gguf::open(path)
        .unwrap()
        .tensor(&format!("blk.{layer}.ssm_out.weight"))
        .is_some()
}

#[test]
fn recurrent_state_is_exact_across_passes_truncation_resets_and_batches() {
    let pool = ThreadPool::new(2).unwrap();
    for dir in fixture_dirs() {
        let tmp = tempfile::tempdir().unwrap();
        let model = load(&convert(&dir, tmp.path()));
        let cases = cases(&dir);
        let long = cases.iter().max_by_key(|c| c.prompt.len()).unwrap();
        let seq = [long.prompt.as_slice(), &long.generated].concat();
        let n = seq.len();
        let session = || Session::new(&model, &pool, n, KvType::F32).unwrap();
        // One pass against token by token.
        let mut whole = session();
        let all = whole.eval(&seq, Outputs::All).unwrap();
        let rows: Vec<Vec<f32>> = (0..n).map(|i| all.row(i).unwrap().to_vec()).collect();
        let mut steps = session();
        for (i, &t) in seq.iter().enumerate() {
            let l = steps.eval(&[t], Outputs::Last).unwrap();
            assert_eq!(l.last().unwrap(), &rows[i][..], "token {i} decoded alone");
        }
        // Truncated to an earlier position, then continued: the kept tokens are replayed.
        for cut in [1, 7, n / 2, n - 1] {
            let mut s = session();
            s.eval(&seq, Outputs::Last).unwrap();
            s.truncate(cut);
            let l = s.eval(&seq[cut..], Outputs::All).unwrap();
            for (i, want) in rows.iter().enumerate().skip(cut) {
                assert_eq!(l.row(i - cut).unwrap(), &want[..], "cut {cut}, row {i}");
            }
        }
        // A second conversation after a reset equals a fresh one.
        let other = &cases[0];
        let mut s = session();
        s.eval(&other.prompt, Outputs::Last).unwrap();
        s.reset();
        let l = s.eval(&seq, Outputs::Last).unwrap();
        assert_eq!(l.last().unwrap(), &rows[n - 1][..], "after a reset");
        // Two sessions stepped as one batch, row for row as alone.
        let (a, b) = (&cases[1], &cases[2]);
        let mut sa = Session::new(&model, &pool, 64, KvType::F32).unwrap();
        let mut sb = Session::new(&model, &pool, 64, KvType::F32).unwrap();
        sa.eval(&a.prompt, Outputs::Last).unwrap();
        sb.eval(&b.prompt, Outputs::Last).unwrap();
        let mut batch = Batch::new(8).unwrap();
        for step in 0..4 {
            let (ta, tb) = (a.generated[step], b.generated[step]);
            let got = batch
                .step(&mut [&mut sa, &mut sb], &[&[ta], &[tb]])
                .unwrap();
            let (ga, gb) = (got.row(0).unwrap().to_vec(), got.row(1).unwrap().to_vec());
            for (c, g) in [(a, ga), (b, gb)] {
                let mut alone = Session::new(&model, &pool, 64, KvType::F32).unwrap();
                let fed = [c.prompt.as_slice(), &c.generated[..=step]].concat();
                let l = alone.eval(&fed, Outputs::Last).unwrap();
                assert_eq!(l.last().unwrap(), &g[..], "batched step {step}");
            }
        }
    }
}

/// `n` token ids spread over the vocabulary (past the fixtures' lengths, so that several
/// checkpoint positions are crossed).
fn long_sequence(n: usize, n_vocab: usize) -> Vec<u32> {
    (0..n).map(|i| ((i * 97 + 13) % n_vocab) as u32).collect()
}

#[test]
fn checkpoints_and_snapshots_restore_the_recurrent_state_exactly() {
    let pool = ThreadPool::new(2).unwrap();
    for dir in fixture_dirs() {
        let tmp = tempfile::tempdir().unwrap();
        let path = convert(&dir, tmp.path());
        let model = load(&path);
        let n = 5 * CHECKPOINT_EVERY / 2;
        let seq = long_sequence(n, model.config().n_vocab);
        let session = || Session::new(&model, &pool, n, KvType::F32).unwrap();
        let mut whole = session();
        let all = whole.eval(&seq, Outputs::All).unwrap();
        let rows: Vec<Vec<f32>> = (0..n).map(|i| all.row(i).unwrap().to_vec()).collect();
        let continues = |s: &mut Session<'_>, from: usize, what: &str| {
            let l = s.eval(&seq[from..], Outputs::All).unwrap();
            for (i, want) in rows.iter().enumerate().skip(from) {
                assert_eq!(l.row(i - from).unwrap(), &want[..], "{what}: row {i}");
            }
        };
        // Truncations on, just past and between checkpoints, and before the first.
        let e = CHECKPOINT_EVERY;
        for cut in [e - 1, e, e + 1, 2 * e, 2 * e + 3, n - 1] {
            let mut s = session();
            s.eval(&seq, Outputs::Last).unwrap();
            s.truncate(cut);
            continues(&mut s, cut, &format!("truncated to {cut}"));
        }
        // Snapshots: at the whole length and at a kept checkpoint; none between.
        let mut s = session();
        s.eval(&seq[..n - 5], Outputs::Last).unwrap();
        assert!(
            s.export_state(2 * e - 1).is_err(),
            "a position without a state"
        );
        for at in [2 * e, n - 5] {
            let state = s.export_state(at).unwrap();
            assert!(state.recurrent.slots > 0);
            let mut t = session();
            t.import_state(&state, at).unwrap();
            continues(&mut t, at, &format!("restored at {at}"));
            // A prefix of a recurrent snapshot would have to be recomputed: refused.
            assert!(t.import_state(&state, at - 1).is_err());
        }
        // Through the snapshot file, as `run --save-session` and the disk cache write it.
        let state = s.export_state(n - 5).unwrap();
        let compat = ferrite_kvstore::Compat::for_session(&model, [3; 32], KvType::F32, n);
        let file = tmp.path().join("s.kvsnap");
        ferrite_kvstore::write_snapshot(&file, &compat, &state, b"").unwrap();
        let back = ferrite_kvstore::read_snapshot(&file, &compat).unwrap();
        assert_eq!(back.state, state);
        let mut t = session();
        t.import_state(&back.state, n - 5).unwrap();
        continues(&mut t, n - 5, "restored from a file");
        // A state of another shape is rejected and the session continues as it was.
        let mut bad = state.clone();
        bad.recurrent.values.pop();
        bad.recurrent.len -= 1;
        bad.recurrent
            .values
            .truncate(bad.recurrent.slots * bad.recurrent.len);
        let mut t = session();
        t.eval(&seq[..e + 3], Outputs::Last).unwrap();
        assert!(t.import_state(&bad, n - 5).is_err());
        continues(&mut t, e + 3, "after a rejected snapshot");
    }
}

#[test]
fn the_naive_reference_recurrence_matches_transformers_and_the_optimized_pass() {
    let pool = ThreadPool::new(2).unwrap();
    for dir in fixture_dirs() {
        let tmp = tempfile::tempdir().unwrap();
        let model = load(&convert(&dir, tmp.path()));
        let nv = model.config().n_vocab;
        for c in cases(&dir) {
            let seq = [c.prompt.as_slice(), &c.generated].concat();
            let want = reference::forward(&model, &seq).unwrap();
            let mut s = Session::new(&model, &pool, seq.len(), KvType::F32).unwrap();
            let got = s.eval(&seq, Outputs::All).unwrap();
            let worst = got
                .data
                .iter()
                .zip(&want.logits)
                .fold(0.0f64, |m, (&g, &w)| m.max((f64::from(g) - w).abs()));
            assert!(worst <= 5e-4, "naive vs optimized: {worst:e}");
            for (step, top) in c.top.iter().enumerate() {
                let at = (c.prompt.len() - 1 + step) * nv;
                let row = &want.logits[at..at + nv];
                let max = row.iter().fold(f64::NEG_INFINITY, |m, &x| m.max(x));
                let lse = max + row.iter().map(|x| (x - max).exp()).sum::<f64>().ln();
                for &(id, lp) in top {
                    assert!((row[id] - lse - lp).abs() <= 1e-3, "reference step {step}");
                }
            }
        }
    }
}
