//! The architecture extras on the GPU — q/k/v biases (qwen2), Llama 3 rope frequency
//! factors (llama3), mixture of experts (mixtral, qwen3moe) — on the tiny transformers
//! models of fixtures/arch, converted to f32 GGUF in memory by `ferrite_convert`.
//!
//! Per model, for each fixture prompt and 12 teacher-forced decode steps (the CPU's argmax
//! fed to both): CUDA logits (batched prefill, then graph decode steps) against the CPU
//! backend on the same file and machine (both f16 KV caches), top-1 agreement 1.0 and max
//! |Δ logit| ≤ [`MAX_DLOGIT`] (one-plane int8 activations: ≥ 0.98 and [`MAX_DLOGIT_INT8`]); the same prompt fed to CUDA one token at a time (decode
//! steps only) against the prefilled timeline, within the same bound; and the launch
//! counters of the extra kernels as path markers (a fresh backend per model). The MoE
//! prompts (20–156 tokens, top-2) take both prefill paths: per-pair expert products below
//! 64 (token, slot) pairs, expert-grouped GEMMs above.
//!
//! The fixture directory: `$FERRITE_ARCH_FIXTURES`, else `fixtures/arch` under the current
//! directory (the repository root on the GPU machine), else the one next to this crate.

use std::path::{Path, PathBuf};

use ferrite_convert::{HfModel, OutType};
use ferrite_cpu::ThreadPool;
use ferrite_cuda::{Activations, CudaBackend, CudaModel, CudaSession};
use ferrite_gguf::Gguf;
use ferrite_model::{KvType, LoadOptions, Model, Outputs, Session};

use crate::backend;
use crate::model::argmax;

/// Bound on max |Δ logit| (f32 weights; the fixtures' logits spread about ±40). Prefill
/// rounds activations and attention weights to f16 for its GEMMs and both sides keep f16
/// KV caches. Seen on an H200: 6.4e-3 (mixtral) to 1.06e-2 (qwen2); the planted defects
/// (bias not added, top-k picking the smallest, rope factors ignored) gave 3.3 to 21.
pub(crate) const MAX_DLOGIT: f64 = 0.03;
/// The bound with one-plane int8 activations in the decode products (only the Q8_0
/// matrices of [`quantized_experts_match_cpu`] take them; f32 matrices have no int8 kernel):
/// each product input is rounded to 8 bits per block of 32. H200: 0.25 (mixtral, top-1
/// 52/52) and 0.23 (qwen3moe, 51/52) against 0.008 with f32 activations; the bound leaves
/// twice that. Two-plane activations are held to [`MAX_DLOGIT`] (H200: 0.0077 / 0.0079).
const MAX_DLOGIT_INT8: f64 = 0.5;
/// Teacher-forced decode steps after each prompt.
const STEPS: usize = 12;

/// The fixture directory `$var`, else `fixtures/<sub>` under the current directory (the
/// repository root on the GPU machine), else the one next to this crate.
pub(crate) fn fixture_root(var: &str, sub: &str) -> PathBuf {
    if let Some(d) = std::env::var_os(var) {
        return PathBuf::from(d);
    }
    let here = Path::new("fixtures").join(sub);
    if here.is_dir() {
        return here;
    }
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures")
        .join(sub)
}

/// The transformers checkpoint in `dir` converted in memory to GGUF with matrices as `ty`.
pub(crate) fn convert(dir: &Path, ty: OutType) -> Model {
    let hf = HfModel::open(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    let (w, _) = hf.to_gguf(ty, &mut |_| {}).unwrap();
    let g = Gguf::from_bytes(w.to_bytes().unwrap()).unwrap();
    Model::from_gguf(g, LoadOptions::default()).unwrap()
}

/// The fixture's prompts: the `prompt_ids` of each line of its logits file.
pub(crate) fn prompts(file: &Path) -> Vec<Vec<u32>> {
    let lines = std::fs::read_to_string(file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    lines
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            v["prompt_ids"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_u64().unwrap() as u32)
                .collect()
        })
        .collect()
}

/// The GGUF of fixture `name` with matrices as `ty`, and its prompts.
pub(crate) fn load(name: &str, ty: OutType) -> (Model, Vec<Vec<u32>>) {
    let dir = fixture_root("FERRITE_ARCH_FIXTURES", "arch").join(name);
    let m = convert(&dir, ty);
    (m, prompts(&dir.join(format!("logits-{name}.jsonl"))))
}

pub(crate) fn max_abs(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len());
    assert!(a.iter().all(|v| v.is_finite()), "non-finite logits");
    a.iter()
        .zip(b)
        .map(|(&x, &y)| (f64::from(x) - f64::from(y)).abs())
        .fold(0.0, f64::max)
}

/// Runs fixture `name` with matrices as `ty` (see the module doc) and decode products over
/// `act`; asserts the kernels in `markers` ran and those in `absent` did not.
fn check(name: &str, ty: OutType, act: Activations, markers: &[&str], absent: &[&str]) {
    if backend().is_none() {
        return;
    }
    let b = CudaBackend::new().unwrap();
    b.set_activations(act);
    let bound = if act == Activations::Int8 {
        MAX_DLOGIT_INT8
    } else {
        MAX_DLOGIT
    };
    let (m, prompts) = load(name, ty);
    let pool = ThreadPool::with_default_threads().unwrap();
    let cm = CudaModel::load(b.clone(), &m).unwrap();
    let (mut vs_cpu, mut dec_vs_pre, mut agree, mut total) = (0.0f64, 0.0f64, 0usize, 0usize);
    for p in &prompts {
        let ctx = p.len() + STEPS + 1;
        let mut cpu = Session::new(&m, &pool, ctx, KvType::F16).unwrap();
        let mut pre = CudaSession::new(&cm, ctx).unwrap();
        let mut dec = CudaSession::new(&cm, ctx).unwrap();
        let mut want = cpu.eval(p, Outputs::Last).unwrap().last().unwrap().to_vec();
        let mut got = pre.eval(p).unwrap();
        let mut got_dec = Vec::new();
        for &t in p {
            got_dec = dec.eval(&[t]).unwrap();
        }
        for step in 0..=STEPS {
            vs_cpu = vs_cpu.max(max_abs(&got, &want));
            dec_vs_pre = dec_vs_pre.max(max_abs(&got_dec, &got));
            let tc = argmax(&want);
            total += 1;
            if argmax(&got) == tc {
                agree += 1;
            } else {
                println!(
                    "{name} prompt of {} step {step}: CUDA top-1 {} vs CPU {tc}",
                    p.len(),
                    argmax(&got)
                );
            }
            if step == STEPS {
                break;
            }
            let next = [tc as u32];
            want = cpu
                .eval(&next, Outputs::Last)
                .unwrap()
                .last()
                .unwrap()
                .to_vec();
            got = pre.eval(&next).unwrap();
            got_dec = dec.eval(&next).unwrap();
        }
    }
    let counts = b.launch_counts();
    println!(
        "{name} ({} activations): CUDA vs CPU max |Δ logit| {vs_cpu:.3e}, top-1 {agree}/{total}; decode-only vs \
         prefill max |Δ logit| {dec_vs_pre:.3e}; markers {:?}",
        act.name(),
        markers
            .iter()
            .chain(absent)
            .map(|k| (*k, counts[k]))
            .collect::<Vec<_>>()
    );
    // One-plane int8 activations may flip a near tie (qwen3moe: 51/52 on the H200); the
    // issue's fidelity floor, top-1 agreement ≥ 0.98, is what they must keep.
    let floor = if act == Activations::Int8 {
        total - total / 50
    } else {
        total
    };
    assert!(agree >= floor, "{name}: top-1 agreement {agree}/{total}");
    assert!(vs_cpu <= bound, "{name}: CUDA vs CPU {vs_cpu:e}");
    assert!(
        dec_vs_pre <= bound,
        "{name}: decode vs prefill {dec_vs_pre:e}"
    );
    for k in markers {
        assert!(counts[k] > 0, "{name}: {k} never ran");
    }
    for k in absent {
        assert_eq!(counts[k], 0, "{name}: {k} ran");
    }
}

#[test]
fn qwen2_biases_match_cpu() {
    check(
        "qwen2",
        OutType::F32,
        Activations::F32,
        &["qkv_bias_f32", "rope_store_f16", "graph_step", "gemm_f16"],
        &["rope_store_scaled_f16", "moe_route"],
    );
}

#[test]
fn llama3_rope_factors_match_cpu() {
    check(
        "llama3",
        OutType::F32,
        Activations::F32,
        &["rope_store_scaled_f16", "graph_step", "gemm_f16"],
        &["rope_store_f16", "qkv_bias_f32", "moe_route"],
    );
}

#[test]
fn mixtral_experts_match_cpu() {
    check(
        "mixtral",
        OutType::F32,
        Activations::F32,
        &[
            "matvec_rows_f32",
            "moe_route",
            "moe_gated_f32",
            "moe_down_f32",
            "moe_gather_f16",
            "moe_combine",
            "gemm_f16",
            "graph_step",
        ],
        &["qkv_bias_f32", "matvec_gated_f32"],
    );
}

#[test]
fn qwen3moe_experts_match_cpu() {
    check(
        "qwen3moe",
        OutType::F32,
        Activations::F32,
        &[
            "matvec_rows_f32",
            "moe_route",
            "moe_gated_f32",
            "moe_down_f32",
            "moe_gather_f16",
            "moe_combine",
            "gemm_f16",
            "graph_step",
        ],
        &["qkv_bias_f32", "matvec_gated_f32"],
    );
}

/// Quantized expert stacks: the same comparison with every matrix as Q8_0 (both backends
/// read the same blocks), so the expert kernels of a quantized type are the ones checked;
/// with f32 activations, then with two-plane and one-plane int8 activations in the dense
/// decode products.
#[test]
fn quantized_experts_match_cpu() {
    for name in ["mixtral", "qwen3moe"] {
        check(
            name,
            OutType::Q8_0,
            Activations::F32,
            &["moe_route", "moe_gated_q8_0", "moe_down_q8_0", "graph_step"],
            &["moe_gated_f32", "moe_down_f32", "quantize_q8_f32"],
        );
    }
    for (name, act) in ["mixtral", "qwen3moe"]
        .into_iter()
        .flat_map(|n| [Activations::Int8x2, Activations::Int8].map(|a| (n, a)))
    {
        check(
            name,
            OutType::Q8_0,
            act,
            &[
                "moe_route",
                "moe_gated_q8_0",
                "quantize_q8_f32",
                "graph_step",
            ],
            &["moe_gated_f32", "moe_down_f32"],
        );
    }
}
