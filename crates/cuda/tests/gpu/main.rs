//! The GPU test lane, selected by `FERRITE_TEST_CUDA=1`: every kernel against the CPU on
//! boundary shapes, then whole synthetic models against `ferrite_model::Session`, then
//! session state export/import (`session.rs`).
//! With the variable set and no device the tests FAIL; without it each prints
//! `skipped: FERRITE_TEST_CUDA not set`. `arch.rs` runs the tiny transformers models of
//! fixtures/arch (q/k/v biases, Llama 3 rope factors, mixture of experts). `batch.rs` steps
//! several sessions through `CudaBatch` against each stepped alone. `mmq.rs` checks the
//! integer tensor-core prefill products. `backend_ops.rs` runs the backend contract's
//! conformance harness on `CudaOps`; `pass.rs` runs whole models through the one forward
//! pass of `ferrite_model::Session` over `CudaOps` against the CPU.

mod arch;
mod backend_ops;
mod batch;
mod decode;
mod fixtures;
mod greedy;
mod kernels;
mod kernels_i8;
mod mmq;
mod model;
mod pass;
mod session;
mod synth;
mod topk;

use std::sync::{Arc, OnceLock};

use ferrite_cuda::CudaBackend;
pub use ferrite_testkit::err_tuple;

/// The shared backend, or `None` (after printing why) when the lane is not selected.
pub fn backend() -> Option<Arc<CudaBackend>> {
    if std::env::var("FERRITE_TEST_CUDA").as_deref() != Ok("1") {
        println!("skipped: FERRITE_TEST_CUDA not set");
        return None;
    }
    static B: OnceLock<Arc<CudaBackend>> = OnceLock::new();
    Some(
        B.get_or_init(|| {
            let b = CudaBackend::new()
                .unwrap_or_else(|e| panic!("FERRITE_TEST_CUDA=1 but the backend failed: {e}"));
            let i = b.info();
            let r = b.compile_report();
            println!(
                "cuda device: {} sm_{}{} driver {} mem {} MiB; kernels {} in {:.1} ms ({:?})",
                i.name,
                i.compute_capability.0,
                i.compute_capability.1,
                i.driver_version,
                i.total_mem >> 20,
                if r.cache_hit {
                    "from cache"
                } else {
                    "compiled"
                },
                r.millis,
                r.cache_file
            );
            b
        })
        .clone(),
    )
}

/// Asserts `got` is within `rel` of `want` (relative to the largest |want|).
pub fn assert_close(what: &str, got: &[f32], want: &[f64], rel: f64) {
    let e = err_tuple(got, want);
    assert!(e.finite, "{what}: non-finite output");
    assert!(
        e.max_rel <= rel && e.cosine >= 1.0 - rel,
        "{what}: {e:?} exceeds {rel:e}"
    );
}

/// Deterministic values in [-1, 1).
pub fn pseudo(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}
