//! A layer's rotary positions and cache writes for the new rows of a forward pass: rope on
//! each row's query and key, then the row's key and value into its session's cache, with
//! the rows split over the pool in contiguous ranges.
//!
//! Each row's work touches only its own query and key and its own cache positions, and
//! every row is computed by the same code whichever thread takes it, so the split changes no
//! bit. This module never reads the cache: attention does, after it.

use std::sync::{Mutex, PoisonError};

use ferrite_backend::{Rope, Segment};

use crate::ThreadPool;
use crate::backend::factors_at;
use crate::kv::KvCache;
use crate::ops::{RopeTable, rope_scaled};

/// How one layer rotates its rows.
pub(crate) struct Rotary<'a> {
    pub(crate) q_dim: usize,
    pub(crate) kv_dim: usize,
    /// The layer's rope: head size, base, pairing and its per-pair divisors (scaled rope,
    /// LongRoPE's two sets), which compute their own angles.
    pub(crate) rope: &'a Rope<&'a [f32]>,
    /// The angles of the forward pass's rows, where there are no divisors.
    pub(crate) table: Option<&'a RopeTable>,
}

/// Rotates the rows of `q` and `k` (one per new token, the rows of `segs` in order) to their
/// positions and stores each row's key and value in layer `layer` of its session's cache.
pub(crate) fn rotate_and_store(
    pool: &ThreadPool,
    r: &Rotary<'_>,
    layer: usize,
    q: &mut [f32],
    k: &mut [f32],
    v: &[f32],
    segs: &mut [Segment<'_, KvCache>],
) {
    let n = k.len() / r.kv_dim.max(1);
    // One row is not worth waking the pool for.
    let threads = if n < 2 { 1 } else { pool.n_threads().min(n) };
    let mut parts = Vec::with_capacity(threads);
    let (mut q_rest, mut k_rest) = (q, k);
    for i in 0..threads {
        let (first, end) = (n * i / threads, n * (i + 1) / threads);
        let (qa, qb) = q_rest.split_at_mut((end - first) * r.q_dim);
        let (ka, kb) = k_rest.split_at_mut((end - first) * r.kv_dim);
        parts.push(Mutex::new(Some((first, qa, ka))));
        (q_rest, k_rest) = (qb, kb);
    }
    let mut starts = Vec::with_capacity(segs.len());
    let mut row = 0;
    for seg in segs.iter() {
        starts.push((row, seg.pos0, seg.len, seg.kv.ctx()));
        row += seg.len;
    }
    let caches: Vec<Mutex<&mut KvCache>> =
        segs.iter_mut().map(|s| Mutex::new(&mut *s.kv)).collect();
    let work = |index: usize| {
        let part = parts
            .get(index)
            .and_then(|p| p.lock().unwrap_or_else(PoisonError::into_inner).take());
        let Some((first, q, k)) = part else {
            return;
        };
        let rows = k.len() / r.kv_dim.max(1);
        for (j, (qr, kr)) in q
            .chunks_exact_mut(r.q_dim)
            .zip(k.chunks_exact_mut(r.kv_dim))
            .enumerate()
        {
            let t = first + j;
            let Some(&(start, pos0, _, ctx)) = starts.iter().rev().find(|s| s.0 <= t) else {
                continue;
            };
            rotate_row(r, qr, kr, t, pos0 + t - start, ctx);
        }
        for (&(start, pos0, len, _), cache) in starts.iter().zip(&caches) {
            let (lo, hi) = (start.max(first), (start + len).min(first + rows));
            if lo >= hi {
                continue;
            }
            let kv = |rows: std::ops::Range<usize>| rows.start * r.kv_dim..rows.end * r.kv_dim;
            let mut cache = cache.lock().unwrap_or_else(PoisonError::into_inner);
            cache.store(
                layer,
                pos0 + lo - start,
                &k[kv(lo - first..hi - first)],
                &v[kv(lo..hi)],
            );
        }
    };
    if threads == 1 {
        work(0);
    } else {
        pool.run(|index, _| work(index));
    }
}

/// Rope of row `t` of the forward pass (its query `qr` and key `kr`) at position `pos`, of a
/// session whose store holds `ctx` positions.
fn rotate_row(r: &Rotary<'_>, qr: &mut [f32], kr: &mut [f32], t: usize, pos: usize, ctx: usize) {
    let rope = r.rope;
    if let Some(f) = factors_at(rope, ctx) {
        let dims = (rope.head_dim, rope.rot_dim);
        rope_scaled(qr, dims, pos, rope.base, rope.style, f);
        rope_scaled(kr, dims, pos, rope.base, rope.style, f);
    } else if let Some(table) = r.table {
        table.apply(qr, rope.head_dim, t, rope.style);
        table.apply(kr, rope.head_dim, t, rope.style);
    }
}
