//! Batched-decode benchmark (not a test): the weight matrices of one decode step of a real
//! model shape, multiplied with `n` activation columns (one per session), for several `n`.
//! Reports milliseconds per step and the aggregate tokens/s relative to `n = 1`. Weights are
//! packed once first where the 16-bit products take them, as a loaded model's are.
//!
//! Run: `cargo run --release -p ferrite-cpu --example batch_matmul [smollm2|gemma3]
//! [threads] [n,n,...] [trials]` (`FERRITE_SIMD=avx2|avx512` lowers the SIMD level). With a
//! single `n` and `trials = 0`, it runs 20 steps untimed, for `perf stat -e instructions`.
//! With one thread it also reports the thread's CPU time per step (minimum over trials),
//! which other processes on the machine disturb much less than wall time.

mod common;

use ferrite_cpu::{Matrix, ThreadPool, matmul, pack};
use ferrite_gguf::GgmlType;
use ferrite_quant::simd_level;

use common::{Rng, random_weights, thread_cpu, time};

/// `(type, rows, cols, how many)` of the matrices of one step.
fn shapes(model: &str) -> Vec<(GgmlType, usize, usize, usize)> {
    use GgmlType as T;
    match model {
        // gemma-3-270m Q4_K_M: 18 layers, hidden 640, ffn 2048, vocab 262144.
        "gemma3" => vec![
            (T::Q5_0, 1024, 640, 18),
            (T::Q5_0, 256, 640, 18),
            (T::Q8_0, 256, 640, 18),
            (T::Q4_K, 640, 1024, 18),
            (T::Q5_0, 2048, 640, 36),
            (T::Q6_K, 640, 2048, 18),
            (T::Q8_0, 262_144, 640, 1),
        ],
        // SmolLM2-135M Q4_1: 30 layers, hidden 576, ffn 1536, vocab 49152.
        _ => vec![
            (T::Q4_1, 576, 576, 60),
            (T::Q4_1, 192, 576, 60),
            (T::Q4_1, 1536, 576, 60),
            (T::Q4_1, 576, 1536, 30),
            (T::Q8_0, 49_152, 576, 1),
        ],
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let model = args.get(1).map_or("smollm2", String::as_str);
    let threads = args
        .get(2)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(ferrite_cpu::default_threads);
    let ns: Vec<usize> = args
        .get(3)
        .map(|s| s.split(',').filter_map(|v| v.parse().ok()).collect())
        .unwrap_or_else(|| vec![1, 2, 4, 8, 16]);
    let trials: usize = args.get(4).and_then(|s| s.parse().ok()).unwrap_or(9);
    let pool = ThreadPool::new(threads).expect("thread pool");
    let mut rng = Rng(0x2545_f491_4f6c_dd1d);
    let mats: Vec<(GgmlType, usize, usize, Vec<u8>)> = shapes(model)
        .into_iter()
        .flat_map(|(ty, rows, cols, count)| std::iter::repeat_n((ty, rows, cols), count))
        .map(|(ty, rows, cols)| (ty, rows, cols, random_weights(&mut rng, ty, rows, cols)))
        .collect();
    let bytes: usize = mats.iter().map(|m| m.3.len()).sum();
    let max_n = ns.iter().copied().max().unwrap_or(1);
    let max_dim = mats.iter().map(|m| m.1.max(m.2)).max().unwrap_or(1);
    let x: Vec<f32> = (0..max_n * max_dim).map(|_| rng.f32()).collect();
    let mut y = vec![0f32; max_n * max_dim];
    println!(
        "batch_matmul: {model}, {:.1} MB of weights, simd {}, threads {}",
        bytes as f64 / 1e6,
        simd_level(),
        pool.n_threads()
    );
    fn matrix((ty, rows, cols, data): &(GgmlType, usize, usize, Vec<u8>)) -> Matrix<'_> {
        Matrix {
            ty: *ty,
            rows: *rows,
            cols: *cols,
            data,
            packed: None,
        }
    }
    // Packed once, as a loaded model packs its weights.
    let packs: Vec<_> = mats
        .iter()
        .map(|m| pack(matrix(m), |_| {}).expect("pack"))
        .collect();
    let mut step = |n: usize| {
        for (m, p) in mats.iter().zip(&packs) {
            let (rows, cols) = (m.1, m.2);
            let m = Matrix {
                packed: p.as_ref(),
                ..matrix(m)
            };
            matmul(&pool, m, &x[..n * cols], n, &mut y[..n * rows]).expect("matmul");
        }
    };
    if trials == 0 {
        for _ in 0..20 {
            step(ns[0]);
        }
        return;
    }
    let mut base = None;
    for &n in &ns {
        let mut cpu = f64::MAX;
        let (med, lo, hi) = time(trials, || {
            let c0 = thread_cpu();
            step(n);
            if let (Some(a), Some(b)) = (c0, thread_cpu()) {
                cpu = cpu.min(b - a);
            }
        });
        // With one thread the work runs on this thread, so its CPU time is the step's.
        let per_step = if pool.n_threads() == 1 && cpu < f64::MAX {
            cpu
        } else {
            med
        };
        let tps = n as f64 / per_step;
        let rel = tps / *base.get_or_insert(tps);
        println!(
            "n={n:>2}: wall {:.2} ms/step (min {:.2}, max {:.2}), cpu {:.2} ms/step, \
             {tps:.0} tok/s, {rel:.2}x n=1",
            med * 1e3,
            lo * 1e3,
            hi * 1e3,
            cpu * 1e3
        );
    }
}
