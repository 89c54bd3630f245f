//! Whole-model checks on the two real development models: the optimized forward pass against
//! the naive f64 reference layer by layer, against the transformers logits fixtures, prefill
//! against decode, thread-count determinism, and mutations that the fixture check must catch.
//!
//! Models come from `$FERRITE_HOME/models` (default `~/.cache/ferrite/models`); when absent
//! each test prints `skipped: ...` and passes, unless `FERRITE_TEST_MODELS=1` requests them.
//! Fixtures come from `FERRITE_FIXTURES` when set, else `fixtures/reference`.

use ferrite_testkit::real_model;
use std::sync::OnceLock;

use ferrite_cpu::ThreadPool;
use serde_json::Value;

use crate::session::Mutation;
use crate::{KvType, LoadOptions, Model, Outputs, Precision, Session, reference};

const SMOLLM2: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
const GEMMA3: &str = "gemma-3-270m-q4_k_m.gguf";

/// Loaded models shared by the tests of this file (loading F32 copies takes seconds).
fn model(file: &'static str, precision: Precision) -> Option<&'static Model> {
    type Slot = OnceLock<Option<Model>>;
    static SLOTS: [Slot; 4] = [Slot::new(), Slot::new(), Slot::new(), Slot::new()];
    let i = usize::from(file == GEMMA3) * 2 + usize::from(precision == Precision::F32);
    let m = SLOTS[i]
        .get_or_init(|| {
            let path = real_model(file)?;
            let m = Model::load(&path, LoadOptions { precision }).expect("model loads");
            println!("loaded {} ({precision:?})", path.display());
            Some(m)
        })
        .as_ref();
    if m.is_none() {
        // Every skipping test says so, not only the first to look.
        println!("skipped: {file} not available");
    }
    m
}

struct Case {
    id: String,
    prompt: Vec<u32>,
    generated: Vec<u32>,
    /// Per step: reference top-20 `(id, logprob)`, descending.
    top: Vec<Vec<(u32, f64)>>,
}

fn cases(tag: &str) -> Vec<Case> {
    let file = &ferrite_testkit::logits_fixture(tag);
    let text = std::fs::read_to_string(file).expect("fixture readable");
    let ids = |v: &Value| -> Vec<u32> {
        v.as_array()
            .expect("id array")
            .iter()
            .map(|x| x.as_u64().expect("id") as u32)
            .collect()
    };
    let out: Vec<Case> = text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let v: Value = serde_json::from_str(l).expect("fixture json");
            Case {
                id: v["id"].as_str().expect("id").to_owned(),
                prompt: ids(&v["prompt_ids"]),
                generated: ids(&v["generated_ids"]),
                top: v["steps"]
                    .as_array()
                    .expect("steps")
                    .iter()
                    .map(|s| {
                        s["top"]
                            .as_array()
                            .expect("top")
                            .iter()
                            .map(|p| {
                                (
                                    p[0].as_u64().expect("id") as u32,
                                    p[1].as_f64().expect("lp"),
                                )
                            })
                            .collect()
                    })
                    .collect(),
            }
        })
        .collect();
    assert!(!out.is_empty(), "{} is empty", file.display());
    out
}

/// Comparison of our teacher-forced log-probabilities with one case's reference.
#[derive(Debug, Default, Clone, Copy)]
struct Cmp {
    max_abs: f64,
    sum_abs: f64,
    n: usize,
    top1_agree: usize,
    top1_steps: usize,
}

impl Cmp {
    fn add(&mut self, o: Cmp) {
        self.max_abs = self.max_abs.max(o.max_abs);
        self.sum_abs += o.sum_abs;
        self.n += o.n;
        self.top1_agree += o.top1_agree;
        self.top1_steps += o.top1_steps;
    }
    fn mean(&self) -> f64 {
        self.sum_abs / self.n.max(1) as f64
    }
    fn top1(&self) -> f64 {
        self.top1_agree as f64 / self.top1_steps.max(1) as f64
    }
}

/// Teacher-forces `case` in one prefill call and compares with the reference top-20.
fn compare(s: &mut Session<'_>, case: &Case) -> Cmp {
    s.reset();
    let mut seq = case.prompt.clone();
    seq.extend_from_slice(&case.generated[..case.generated.len() - 1]);
    let logits = s
        .eval(&seq, Outputs::From(case.prompt.len() - 1))
        .expect("eval");
    let mut c = Cmp::default();
    for (i, top) in case.top.iter().enumerate() {
        let row = logits.row(i).expect("row");
        let mx = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let lse = f64::from(mx)
            + row
                .iter()
                .map(|&l| (f64::from(l) - f64::from(mx)).exp())
                .sum::<f64>()
                .ln();
        let mut best = 0;
        for (j, &v) in row.iter().enumerate() {
            if v > row[best] {
                best = j;
            }
        }
        for &(id, lp) in top {
            let d = (f64::from(row[id as usize]) - lse - lp).abs();
            c.max_abs = if d.is_nan() {
                f64::INFINITY
            } else {
                c.max_abs.max(d)
            };
            c.sum_abs += d;
            c.n += 1;
        }
        c.top1_steps += 1;
        let tied = top
            .iter()
            .any(|&(id, lp)| id as usize == best && top[0].1 - lp < 1e-4);
        if tied {
            c.top1_agree += 1;
        }
    }
    c
}

/// Short cases (prompt ≤ 40 tokens), at most `n`, plus the longest case when `long`.
fn pick(all: &[Case], n: usize, long: bool) -> Vec<&Case> {
    let mut v: Vec<&Case> = all
        .iter()
        .filter(|c| c.prompt.len() <= 40)
        .take(n)
        .collect();
    if long && let Some(c) = all.iter().max_by_key(|c| c.prompt.len()) {
        v.push(c);
    }
    v
}

fn fixture_check(
    file: &'static str,
    tag: &str,
    precision: Precision,
    kv: KvType,
    n: usize,
    long: bool,
) -> Option<Cmp> {
    let m = model(file, precision)?;
    let pool = ThreadPool::new(2).expect("pool");
    let all = cases(tag);
    let mut s = Session::new(m, &pool, 1024, kv).expect("session");
    let mut total = Cmp::default();
    for case in pick(&all, n, long) {
        let c = compare(&mut s, case);
        println!(
            "{tag} {precision:?} {kv:?} {}: prompt {} max {:.2e} mean {:.2e} top1 {}/{}",
            case.id,
            case.prompt.len(),
            c.max_abs,
            c.mean(),
            c.top1_agree,
            c.top1_steps
        );
        total.add(c);
    }
    Some(total)
}

#[test]
fn f32_weights_match_fixtures_smollm2() {
    let Some(c) = fixture_check(SMOLLM2, "smollm2", Precision::F32, KvType::F32, 4, false) else {
        return;
    };
    assert!(c.max_abs <= 2e-3 && c.top1() == 1.0, "{c:?}");
}

#[test]
fn f32_weights_match_fixtures_gemma3_including_sliding_window() {
    let Some(c) = fixture_check(GEMMA3, "gemma3", Precision::F32, KvType::F32, 3, true) else {
        return;
    };
    assert!(c.max_abs <= 2e-3 && c.top1() == 1.0, "{c:?}");
}

#[test]
fn default_precision_within_bounds_smollm2() {
    let Some(c) = fixture_check(
        SMOLLM2,
        "smollm2",
        Precision::Default,
        KvType::F16,
        6,
        false,
    ) else {
        return;
    };
    assert!(c.mean() <= 0.08 && c.top1() >= 0.97, "{c:?}");
}

#[test]
fn default_precision_within_bounds_gemma3() {
    let Some(c) = fixture_check(GEMMA3, "gemma3", Precision::Default, KvType::F16, 6, false) else {
        return;
    };
    assert!(c.mean() <= 0.08 && c.top1() >= 0.97, "{c:?}");
}

/// Worst relative error and cosine gap of the optimized path against the naive reference on
/// a short prompt, layer by layer; prints the error tuple of each layer.
fn naive_check(file: &'static str, tag: &str) -> Option<f64> {
    let m = model(file, Precision::Default)?;
    let pool = ThreadPool::new(2).expect("pool");
    let case = &cases(tag)[0];
    let toks = &case.prompt[..case.prompt.len().min(6)];
    let want = reference::forward(m, toks).expect("reference");
    let mut s = Session::new(m, &pool, 64, KvType::F32).expect("session");
    let (logits, hidden) = s.eval_hidden(toks).expect("eval");
    let mut worst = 0.0f64;
    let mut report = |what: String, got: &[f32], want: &[f64]| {
        let e = ferrite_testkit::err_tuple(got, want);
        println!(
            "{tag} {what}: finite {} max_abs {:.3e} max_rel {:.3e} cos {:.9}",
            e.finite, e.max_abs, e.max_rel, e.cosine
        );
        assert!(e.finite, "{what}");
        worst = worst.max(e.max_rel).max(1.0 - e.cosine);
    };
    for (l, (h, w)) in hidden.iter().zip(&want.hidden).enumerate() {
        report(format!("layer {l}"), h, w);
    }
    report("logits".into(), logits.data, &want.logits);
    Some(worst)
}

#[test]
fn naive_reference_matches_per_layer_smollm2() {
    // SmolLM2 is Q4_1 and Q8_0 throughout: on AVX-512 VNNI its products round the
    // activations to 16 bits, which the f64 reference does not (measured 2.7e-4 there).
    let q16 = ferrite_quant::kernels::q16::applies(
        ferrite_quant::simd_level(),
        ferrite_gguf::GgmlType::Q4_1,
    );
    let bound = if q16 { 1e-3 } else { 1e-4 };
    if let Some(w) = naive_check(SMOLLM2, "smollm2") {
        assert!(w < bound, "{w:e}");
    }
}

#[test]
fn naive_reference_matches_per_layer_gemma3() {
    // Gemma's Q4_K, Q6_K and Q5_0 products round the activations to 16 bits on AVX2
    // (measured 1.84e-4 there against 8.2e-5 with f32 activations).
    let q16 = ferrite_quant::kernels::q16::applies(
        ferrite_quant::simd_level(),
        ferrite_gguf::GgmlType::Q4_K,
    );
    let bound = if q16 { 1e-3 } else { 1e-4 };
    if let Some(w) = naive_check(GEMMA3, "gemma3") {
        assert!(w < bound, "{w:e}");
    }
}

#[test]
fn prefill_decode_and_threads_agree_on_real_models() {
    for (file, tag) in [(SMOLLM2, "smollm2"), (GEMMA3, "gemma3")] {
        let Some(m) = model(file, Precision::Default) else {
            continue;
        };
        let case = &cases(tag)[1];
        let mut seq = case.prompt.clone();
        seq.extend_from_slice(&case.generated[..8]);
        let np = case.prompt.len();
        let p1 = ThreadPool::new(1).expect("pool");
        let p2 = ThreadPool::new(2).expect("pool");
        let prefill = |pool: &ThreadPool| {
            let mut s = Session::new(m, pool, 64, KvType::F16).expect("session");
            s.eval(&seq, Outputs::From(np - 1))
                .expect("eval")
                .data
                .to_vec()
        };
        let a = prefill(&p1);
        let b = prefill(&p2);
        assert!(a == b, "{tag}: 1 and 2 threads differ");
        let mut s = Session::new(m, &p2, 64, KvType::F16).expect("session");
        let mut decode = s
            .eval(&seq[..np], Outputs::Last)
            .expect("eval")
            .data
            .to_vec();
        for &t in &seq[np..] {
            decode.extend_from_slice(s.eval(&[t], Outputs::Last).expect("eval").data);
        }
        let max = a
            .iter()
            .zip(&decode)
            .map(|(x, y)| (x - y).abs())
            .fold(0.0, f32::max);
        println!("{tag}: prefill vs decode max |Δ logit| {max:.3e}; threads 1/2 identical");
        assert!(max < 1e-3, "{tag}: prefill vs decode {max}");
    }
}

#[test]
fn fixture_check_catches_mutations() {
    // Test of the test: keys rotated one position too far, or one layer's attention residual
    // dropped, must fail the F32 fixture bound (max |Δ logprob| ≤ 2e-3) by a wide margin.
    let Some(m) = model(SMOLLM2, Precision::F32) else {
        return;
    };
    let pool = ThreadPool::new(2).expect("pool");
    let all = cases("smollm2");
    let mut s = Session::new(m, &pool, 256, KvType::F32).expect("session");
    for mutation in [Mutation::RopeWrongBase, Mutation::SkipAttnResidual(3)] {
        s.mutation = Some(mutation);
        let c = compare(&mut s, &all[0]);
        println!(
            "mutation {mutation:?}: max {:.3e} mean {:.3e} top1 {}/{}",
            c.max_abs,
            c.mean(),
            c.top1_agree,
            c.top1_steps
        );
        assert!(c.max_abs > 2e-2, "{mutation:?} not caught: {c:?}");
    }
}
