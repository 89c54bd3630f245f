//! Attention benchmark (not a test): one decode step's attention over every layer of
//! SmolLM2-135M's shape (30 layers, 9 query heads, 3 KV heads of 64 values, f16 cache), for
//! `sessions` sequences each at depth `depth` (a continuous batch), or one prompt chunk of
//! `chunk` tokens ending at `depth`. Reports the best of several passes in milliseconds and
//! the cache bytes read per second (keys and values of every visible position, once).
//!
//! Run: `cargo run --release -p ferrite-cpu --example attention_pass [sessions] [depth]
//! [threads] [chunk] [kv]` (defaults 16 224 2 1 f16; kv is f16, f32 or q8). Each session's cache is its own allocation,
//! larger than the caches of the machine when there are many sessions, as in serving.

use ferrite_backend::{AttnShape, KvType};
use ferrite_cpu::KvCache;
use ferrite_cpu::ThreadPool;
use ferrite_cpu::attention::{AttnJob, attend_many};

const LAYERS: usize = 30;
const CTX: usize = 512;

fn arg(i: usize, default: usize) -> usize {
    std::env::args()
        .nth(i)
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

fn main() {
    let (sessions, depth, threads, chunk) = (arg(1, 16), arg(2, 224), arg(3, 2), arg(4, 1));
    let kv = match std::env::args().nth(5).as_deref() {
        None | Some("f16") => KvType::F16,
        Some("f32") => KvType::F32,
        Some("q8") => KvType::Q8,
        Some(other) => panic!("unknown KV type {other}: f16, f32 or q8"),
    };
    assert!(
        chunk >= 1 && depth < CTX && chunk <= depth + 1,
        "need 1 <= chunk <= depth + 1 < {CTX}"
    );
    let shape = AttnShape {
        n_head: 9,
        n_kv_head: 3,
        head_dim: 64,
        scale: 0.125,
        window: None,
        softcap: None,
        values: ferrite_backend::Values::Own,
    };
    let row = shape.n_kv_head * shape.head_dim;
    let qw = shape.n_head * shape.head_dim;
    let values: Vec<f32> = (0..CTX * row)
        .map(|i| ((i * 7919) % 1000) as f32 / 1000.0 - 0.5)
        .collect();
    let caches: Vec<KvCache> = (0..sessions)
        .map(|_| {
            let mut c =
                KvCache::new(kv, LAYERS, CTX, shape.n_kv_head, shape.head_dim).expect("cache");
            for l in 0..LAYERS {
                c.store(l, 0, &values, &values);
            }
            c
        })
        .collect();
    let q: Vec<f32> = (0..qw * chunk).map(|i| (i % 17) as f32 / 17.0).collect();
    let pool = ThreadPool::new(threads).expect("pool");
    let mut outs: Vec<Vec<f32>> = (0..sessions).map(|_| vec![0.0; qw * chunk]).collect();
    let passes = if chunk > 1 { 5 } else { 20 };
    let mut best = f64::MAX;
    for _ in 0..passes {
        let start = std::time::Instant::now();
        for l in 0..LAYERS {
            let mut jobs: Vec<AttnJob<'_>> = caches
                .iter()
                .zip(outs.iter_mut())
                .map(|(cache, out)| AttnJob {
                    cache,
                    pos0: depth + 1 - chunk,
                    q: &q,
                    out,
                })
                .collect();
            attend_many(&pool, &shape, l, None, &mut jobs);
        }
        best = best.min(start.elapsed().as_secs_f64());
    }
    let row_bytes = kv.row_elems(shape.n_kv_head, shape.head_dim).expect("row") * kv.elem_bytes();
    let bytes = (sessions * LAYERS * (depth + 1) * row_bytes * 2) as f64;
    println!(
        "sessions={sessions} depth={depth} threads={threads} chunk={chunk} kv={}: best {:.3} ms, {:.1} GB/s of cache",
        kv.name(),
        best * 1e3,
        bytes / best / 1e9
    );
}
