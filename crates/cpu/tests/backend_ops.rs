//! backend_ops on the CPU backend (default lane): every op of the contract, every weight
//! type, the boundary shapes of `ferrite_backend::conformance`, against its naive f64
//! reference. The table printed names each case's error and bound and lists what the CPU
//! refuses; refusals are never counted as passes.

use ferrite_backend::conformance::{self, Verdict};
use ferrite_cpu::{CpuBackend, ThreadPool};

#[test]
fn cpu_backend_passes_backend_ops() {
    let pool = ThreadPool::new(2).unwrap();
    println!("simd level: {}", ferrite_quant::simd_level());
    let report = conformance::run(&CpuBackend::new(&pool));
    println!("{report}");
    let failures = report.failures();
    assert!(
        failures.is_empty(),
        "{} cases failed: {failures:#?}",
        failures.len()
    );
    // Every op of the contract ran at least one checked case: none was skipped silently.
    let checked = report.ops_checked();
    for op in conformance::ops() {
        assert!(checked.contains(&op.name()), "{} never checked", op.name());
    }
    // What the CPU refuses, by design: q8 KV rows of heads that are not whole blocks, and
    // a selection of no candidates.
    let refused: Vec<(&str, &str)> = report
        .cases
        .iter()
        .filter(|c| matches!(c.verdict, Verdict::Refused(_)))
        .map(|c| (c.op, c.dtype.as_str()))
        .collect();
    assert!(refused.contains(&("attention", "q8 KV")), "{refused:?}");
    assert!(refused.contains(&("top_k", "f32")), "{refused:?}");
}
