//! backend_ops on the CUDA backend (GPU lane): every op of the contract, every weight type,
//! the boundary shapes of `ferrite_backend::conformance`, through `CudaOps` (the kernels the
//! CUDA model launches) against the harness's naive f64 reference — the same table the CPU
//! backend passes in the default lane. Refusals are listed, never counted as passes.

use ferrite_backend::conformance::{self, Verdict};
use ferrite_cuda::CudaOps;

#[test]
fn cuda_backend_passes_backend_ops() {
    let Some(dev) = crate::backend() else { return };
    println!("decode activations: {}", dev.activations().name());
    let report = conformance::run(&CudaOps::new(dev.clone()));
    println!("{report}");
    let failures = report.failures();
    assert!(
        failures.is_empty(),
        "{} cases failed: {failures:#?}",
        failures.len()
    );
    let refused: Vec<(&str, &str)> = report
        .cases
        .iter()
        .filter(|c| matches!(c.verdict, Verdict::Refused(_)))
        .map(|c| (c.op, c.dtype.as_str()))
        .collect();
    // What the CUDA contract refuses today, by name: every other op ran checked cases.
    let expected_refusals = [
        "moe_experts",
        "kv_store",
        "rope_store",
        "attention",
        "top_k",
    ];
    let checked = report.ops_checked();
    for op in conformance::ops() {
        assert!(
            checked.contains(&op.name()) || expected_refusals.contains(&op.name()),
            "{} never checked and not an expected refusal",
            op.name()
        );
    }
    // The f16 KV path and the weight types the decode step reads ran, not only refusals.
    for op in [
        "attention",
        "kv_store",
        "rope_store",
        "rope",
        "matmul",
        "matmul_shared",
        "top_k",
        "moe_route",
        "moe_experts",
    ] {
        assert!(checked.contains(&op), "{op} has no checked case");
    }
    assert!(refused.contains(&("attention", "q8 KV")), "{refused:?}");
    // The hybrid models' ops ran every case, none refused; so did every gate.
    let recurrent = [
        "row_gate",
        "gated_norm",
        "conv1d",
        "delta_rule",
        "ssm_scan",
        "group_norm",
        "relu_sq",
    ];
    for op in recurrent {
        assert!(checked.contains(&op), "{op} has no checked case");
    }
    assert!(
        !refused.iter().any(|(op, _)| recurrent.contains(op)),
        "{refused:?}"
    );
    // Every gate and every rope (frequency-scaled and LongRoPE outside the store too) runs.
    assert!(
        !refused
            .iter()
            .any(|(op, _)| ["gated_act", "rope"].contains(op)),
        "{refused:?}"
    );
    // Soft-capped scores, sink logits and values read from the keys (MLA's latent) run on
    // the f16 KV store: none of its attention cases is refused.
    let reason = |c: &conformance::Case| match &c.verdict {
        Verdict::Refused(why) => Some(why.clone()),
        _ => None,
    };
    let f16_attention = || {
        report
            .cases
            .iter()
            .filter(|c| c.op == "attention" && c.dtype == "f16 KV")
    };
    for c in f16_attention() {
        assert!(reason(c).is_none(), "attention refused: {:?}", c.verdict);
    }
    for marker in ["cap Some(", "sinks true", "values InKeys"] {
        assert!(
            f16_attention().any(|c| c.shape.contains(marker) && reason(c).is_none()),
            "no f16 attention case with {marker} ran"
        );
    }
    // Routing is the contract's host data: every case runs. Of the expert FFNs only what
    // the products refuse (types without kernels, rows not of whole 32-value units) are.
    assert!(
        !refused.iter().any(|(op, _)| *op == "moe_route"),
        "{refused:?}"
    );
    let why_ok = |why: &str| {
        ["whole units", "no CUDA kernel reads"]
            .iter()
            .any(|w| why.contains(w))
    };
    let experts_refused = report
        .cases
        .iter()
        .filter(|c| c.op == "moe_experts")
        .filter_map(|c| match &c.verdict {
            Verdict::Refused(why) => Some(why.as_str()),
            _ => None,
        });
    for why in experts_refused {
        assert!(why_ok(why), "moe_experts refused: {why}");
    }
}
