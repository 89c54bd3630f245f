//! Single-thread matvec benchmark (not a test) timed by the thread's CPU time, which other
//! processes on a busy machine disturb much less than wall time: GB/s of weight bytes per
//! format, for a matrix that stays in cache (the decode ceiling) and one larger than L3.
//!
//! Run: `cargo run --release -p ferrite-cpu --example matvec_cpu [MiB] [formats]` (default
//! 128 MiB from memory; formats as a comma list of GGUF names, default the quantized
//! formats with a fused kernel). Prints the best and median CPU-time rate of the trials.
//! `FERRITE_SIMD=scalar|avx2|avx512` lowers the SIMD level.

mod common;

use ferrite_gguf::GgmlType;
use ferrite_quant::kernels::matvec;
use ferrite_quant::simd_level;

use common::{Rng, random_weights, thread_cpu};

/// Best and median GB/s of `trials` runs of one matvec over `rows` rows of 4096 values.
fn rate(rng: &mut Rng, ty: GgmlType, bytes: usize, trials: usize) -> (f64, f64) {
    let cols = 4096;
    let rb = ty.row_bytes(cols as u64).expect("whole blocks") as usize;
    let rows = (bytes / rb).max(4) / 4 * 4;
    let data = random_weights(rng, ty, rows, cols);
    let x: Vec<f32> = (0..cols).map(|_| rng.f32()).collect();
    let mut y = vec![0f32; rows];
    matvec(simd_level(), ty, &data, &x, &mut y).expect("matvec");
    let mut t: Vec<f64> = (0..trials)
        .filter_map(|_| {
            let a = thread_cpu()?;
            matvec(simd_level(), ty, &data, &x, &mut y).expect("matvec");
            Some(thread_cpu()? - a)
        })
        .collect();
    std::hint::black_box(&y);
    t.sort_by(f64::total_cmp);
    let gb = data.len() as f64 / 1e9;
    match (t.first(), t.get(t.len() / 2)) {
        (Some(best), Some(med)) => (gb / best, gb / med),
        _ => (f64::NAN, f64::NAN),
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let mib: usize = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(128);
    let names = args
        .get(2)
        .cloned()
        .unwrap_or_else(|| "Q8_0,Q4_0,Q4_1,Q5_0,Q5_1,Q4_K,Q6_K,IQ4_NL".to_string());
    println!(
        "matvec cpu-time bench: simd {}, 1 thread, {mib} MiB from memory, 1 MiB in cache",
        simd_level()
    );
    let mut rng = Rng(0x2545_f491_4f6c_dd1d);
    for name in names.split(',') {
        let Some(ty) = GgmlType::from_name(name) else {
            println!("unknown format {name}");
            continue;
        };
        let (c_best, c_med) = rate(&mut rng, ty, 1 << 20, 301);
        let (m_best, m_med) = rate(&mut rng, ty, mib << 20, 7);
        println!(
            "{:<6} in-cache {c_best:5.1} GB/s (median {c_med:5.1}), memory {m_best:5.1} GB/s \
             (median {m_med:5.1})",
            ty.name()
        );
    }
}
