//! Kernel benchmark (not a test): memory read bandwidth, matvec GB/s of weight bytes per
//! format on a matrix larger than L3, and GEMM GFLOP/s at 512 tokens x 576 x 1536.
//!
//! Run: `cargo run --release -p ferrite-cpu --example kernels [threads] [MiB]`
//! (`FERRITE_SIMD=scalar|avx2|avx512` lowers the SIMD level). Prints one receipt line per
//! measurement: median of the trials, with min and max.

mod common;

use ferrite_cpu::{Matrix, ThreadPool, matmul};
use ferrite_gguf::GgmlType;
use ferrite_quant::kernels::has_fused_matvec;
use ferrite_quant::simd_level;

use common::{Rng, random_weights, time};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let threads = args
        .get(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(ferrite_cpu::default_threads);
    let mib: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(256);
    let pool = ThreadPool::new(threads).expect("thread pool");
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_string())
        })
        .unwrap_or_default();
    println!(
        "kernels bench: cpu '{cpu}', simd {}, threads {}, weights {mib} MiB",
        simd_level(),
        pool.n_threads()
    );

    // Memory read bandwidth: every thread sums its share of a large buffer.
    let words = mib * 1024 * 1024 / 8;
    let buf: Vec<u64> = (0..words as u64).collect();
    let n = pool.n_threads();
    let sink = std::sync::atomic::AtomicU64::new(0);
    let (med, lo, hi) = time(5, || {
        pool.run(|i, _| {
            let part = &buf[words * i / n..words * (i + 1) / n];
            let s = part.iter().fold(0u64, |a, &v| a.wrapping_add(v));
            sink.fetch_add(s, std::sync::atomic::Ordering::Relaxed);
        })
    });
    let gb = (words * 8) as f64 / 1e9;
    println!(
        "memory read: {:.1} GB/s (median; min {:.1}, max {:.1})",
        gb / med,
        gb / hi,
        gb / lo
    );
    drop(buf);

    let mut rng = Rng(0x2545_f491_4f6c_dd1d);
    let cols = 4096;
    let types = [
        GgmlType::F32,
        GgmlType::F16,
        GgmlType::BF16,
        GgmlType::Q8_0,
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
        GgmlType::Q4_K,
        GgmlType::Q5_K,
        GgmlType::Q6_K,
        GgmlType::IQ4_NL,
        GgmlType::IQ4_XS,
    ];
    for ty in types {
        let rb = ty.row_bytes(cols as u64).expect("whole blocks") as usize;
        let rows = mib * 1024 * 1024 / rb;
        let data = random_weights(&mut rng, ty, rows, cols);
        let x: Vec<f32> = (0..cols).map(|_| rng.f32()).collect();
        let mut y = vec![0f32; rows];
        let m = Matrix {
            ty,
            rows,
            cols,
            data: &data,
            packed: None,
        };
        let (med, lo, hi) = time(7, || matmul(&pool, m, &x, 1, &mut y).expect("matmul"));
        let gb = data.len() as f64 / 1e9;
        println!(
            "matvec {:<6} {rows}x{cols} [{}]: {:.1} GB/s weights (median; min {:.1}, max {:.1}), {:.2} ms",
            ty.name(),
            if has_fused_matvec(simd_level(), ty) {
                "fused"
            } else {
                "dot_row"
            },
            gb / med,
            gb / hi,
            gb / lo,
            med * 1e3
        );
    }

    // Compute ceiling: the same kernels on a 1 MiB matrix that stays in cache.
    for ty in [
        GgmlType::F32,
        GgmlType::Q8_0,
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q4_K,
        GgmlType::Q6_K,
    ] {
        let rb = ty.row_bytes(cols as u64).expect("whole blocks") as usize;
        let rows = 1024 * 1024 / rb;
        let data = random_weights(&mut rng, ty, rows, cols);
        let x: Vec<f32> = (0..cols).map(|_| rng.f32()).collect();
        let mut y = vec![0f32; rows];
        let m = Matrix {
            ty,
            rows,
            cols,
            data: &data,
            packed: None,
        };
        let (med, lo, hi) = time(501, || matmul(&pool, m, &x, 1, &mut y).expect("matmul"));
        let gb = data.len() as f64 / 1e9;
        println!(
            "matvec in-cache {:<6} {rows}x{cols}: {:.1} GB/s (median; min {:.1}, max {:.1})",
            ty.name(),
            gb / med,
            gb / hi,
            gb / lo
        );
    }

    for ty in [
        GgmlType::F32,
        GgmlType::Q8_0,
        GgmlType::Q4_1,
        GgmlType::Q4_K,
        GgmlType::Q6_K,
    ] {
        // 576 is not a whole number of 256-value k-quant blocks: those run the transposed
        // shape (the 1536 -> 576 down projection), the same FLOP count.
        let (tokens, k, rows) = if 576 % ty.block_size() as usize == 0 {
            (512, 576, 1536)
        } else {
            (512, 1536, 576)
        };
        let data = random_weights(&mut rng, ty, rows, k);
        let x: Vec<f32> = (0..tokens * k).map(|_| rng.f32()).collect();
        let mut y = vec![0f32; tokens * rows];
        let m = Matrix {
            ty,
            rows,
            cols: k,
            data: &data,
            packed: None,
        };
        let (med, lo, hi) = time(5, || matmul(&pool, m, &x, tokens, &mut y).expect("matmul"));
        let gf = 2.0 * (tokens * k * rows) as f64 / 1e9;
        println!(
            "gemm {:<6} {tokens}x{k}x{rows}: {:.1} GFLOP/s (median; min {:.1}, max {:.1}), {:.2} ms",
            ty.name(),
            gf / med,
            gf / hi,
            gf / lo,
            med * 1e3
        );
    }
    std::hint::black_box(sink.into_inner());
}
