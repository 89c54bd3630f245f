//! Scaled dot-product attention of a chunk of queries over the KV cache, with the causal mask
//! and an optional sliding window.
//!
//! A query at absolute position `p` sees keys at positions `kv` with `kv <= p` and, when a
//! window `w` is set, `p - kv < w` (transformers' `kv > q - w`, llama.cpp's standard SWA).
//! Keys and values are read in place from the cache, in its element type (the kernels widen
//! f16 and q8 blocks exactly as they load them), and each KV head's are shared by every
//! query head of its group (grouped-query attention). Attention sinks (gpt-oss) add one
//! logit per head to the softmax's denominator, a share of the weight that reads no value.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, PoisonError};

use ferrite_backend::{AttnShape, Values};
use ferrite_quant::kernels::{
    MAX_TILE, PREFETCH_ROWS, RowElem, dot_rows, softmax_scaled, weighted_rows,
};
use ferrite_quant::{SimdLevel, simd_level};

use crate::ThreadPool;
use crate::kv::{KvCache, KvRows};

/// First key position visible from a query at `pos`.
fn first_visible(pos: usize, window: Option<usize>) -> usize {
    match window {
        Some(w) if w > 0 => (pos + 1).saturating_sub(w),
        _ => 0,
    }
}

/// Attention for `n` consecutive queries at positions `pos0..pos0+n` of `layer`.
///
/// `q` holds `n × n_head × head_dim` rotated queries; the cache must already hold keys and
/// values for positions `..pos0+n`. Writes `n × n_head × head_dim` values to `out`.
///
/// Work items are (token, block of query heads): part of one KV group, or whole groups (the
/// block that best balances the threads). A group's heads share its key and value rows, so
/// each row is loaded once for all of them ([`dot_rows`] for the scores, [`weighted_rows`]
/// for the values). Items go to the pool's threads as they free up. Per head the arithmetic
/// is the same whatever the blocking and the thread (scores are bit-identical to single dot
/// products, value sums run in key order), so the result depends neither on the thread
/// count nor on how many tokens share the call.
pub fn attend(
    pool: &ThreadPool,
    shape: &AttnShape,
    cache: &KvCache,
    layer: usize,
    pos0: usize,
    q: &[f32],
    out: &mut [f32],
) {
    attend_many(
        pool,
        shape,
        layer,
        None,
        &mut [AttnJob {
            cache,
            pos0,
            q,
            out,
        }],
    );
}

/// One sequence's queries in an [`attend_many`] call: the arguments of [`attend`].
#[derive(Debug)]
pub struct AttnJob<'a> {
    /// The sequence's cache, holding keys and values for positions `..pos0 + n`.
    pub cache: &'a KvCache,
    /// Position of the first query.
    pub pos0: usize,
    /// `n × n_head × head_dim` rotated queries.
    pub q: &'a [f32],
    /// `n × n_head × head_dim` outputs.
    pub out: &'a mut [f32],
}

/// [`attend`] for several sequences at once (the rows of a continuous batch, each over its
/// own cache): every sequence's work items share one pass over the pool, instead of one
/// pass per sequence. A decode batch has only a few items per sequence, so per-sequence
/// passes left the threads mostly waiting on each other. Each job's output has the same bits
/// as [`attend`] on it alone: items are the same per-head computations, only handed out
/// differently. `sinks` holds one logit per query head, or is `None`.
pub fn attend_many(
    pool: &ThreadPool,
    shape: &AttnShape,
    layer: usize,
    sinks: Option<&[f32]>,
    jobs: &mut [AttnJob<'_>],
) {
    let hd = shape.head_dim;
    let vd = shape.values.dim(hd);
    let n_kv = shape.n_kv_head.max(1);
    let group = shape.n_head / n_kv;
    let n_threads = pool.n_threads();
    let qw = shape.n_head * hd;
    let kvd = n_kv * hd;
    // Visible key range of each job (all of its queries together).
    let ranges: Vec<std::ops::Range<usize>> = jobs
        .iter()
        .map(|j| first_visible(j.pos0, shape.window)..j.pos0 + j.q.len() / qw.max(1))
        .collect();
    let tokens: usize = jobs.iter().map(|j| j.q.len() / qw.max(1)).sum();
    let block = head_block(tokens, shape.n_head, group, n_threads);
    let items_per_token = shape.n_head / block;
    // Heads of each group an item holds, and its groups.
    let (group_heads, groups) = if block < group {
        (block, 1)
    } else {
        (group, block / group)
    };
    // First item of each job, and one past the last item of all.
    let mut starts = Vec::with_capacity(jobs.len() + 1);
    let mut items = 0;
    for j in jobs.iter() {
        starts.push(items);
        items += j.q.len() / qw.max(1) * items_per_token;
    }
    starts.push(items);
    // What the threads read of each job, and each item's own slice of its job's output
    // (consecutive items own consecutive slices of `block` heads).
    let mut views: Vec<JobView<'_>> = Vec::with_capacity(jobs.len());
    let mut outs: Vec<Mutex<&mut [f32]>> = Vec::with_capacity(items);
    for (j, r) in jobs.iter_mut().zip(&ranges) {
        views.push((j.cache.rows(layer, r.clone()), j.q, j.pos0));
        let n_out = j.q.len() / hd.max(1) * vd;
        outs.extend(j.out[..n_out].chunks_mut(block * vd).map(Mutex::new));
    }
    let level = simd_level();
    // Items go to whichever thread is free: the sequences of a batch sit at different
    // depths, so a fixed share per thread left one waiting on the other.
    let next = AtomicUsize::new(0);
    pool.run(|_, buf: &mut Vec<f32>| {
        loop {
            let item = next.fetch_add(1, Ordering::Relaxed);
            if item >= items {
                break;
            }
            let mut dst = outs[item].lock().unwrap_or_else(PoisonError::into_inner);
            // The job holding this item: the last whose first item is at or before it.
            let ji = starts.partition_point(|&s| s <= item) - 1;
            let (rows, q, pos0) = views[ji];
            let lo_all = ranges[ji].start;
            let item = item - starts[ji];
            let t = item / items_per_token;
            let h0 = item % items_per_token * block;
            let pos = pos0 + t;
            let lo = first_visible(pos, shape.window) - lo_all;
            let hi = pos + 1 - lo_all;
            let row = t * shape.n_head;
            let qs = &q[(row + h0) * hd..(row + h0 + block) * hd];
            // A job of one token reads its rows once, from memory: its groups take the
            // rows block by block. A chunk's rows stay in cache across its tokens: each
            // group takes them all in one pass.
            let step = if q.len() == qw { KEY_BLOCK } else { usize::MAX };
            let keys = Keys {
                kvd,
                g: h0 / group,
                groups,
                lo,
                hi,
                step,
                sinks: sinks.map(|s| &s[h0..h0 + block]),
            };
            let o = match rows {
                KvRows::F16 { k, v } => heads(level, shape, &keys, k, v, qs, group_heads, buf),
                KvRows::F32 { k, v } => heads(level, shape, &keys, k, v, qs, group_heads, buf),
                KvRows::Q8 { k, v } => heads(level, shape, &keys, k, v, qs, group_heads, buf),
            };
            dst.copy_from_slice(o);
        }
    });
}

/// What the pool's threads read of one job: its keys and values (the visible positions of
/// the layer), queries and the first query's position.
type JobView<'a> = (KvRows<'a>, &'a [f32], usize);

/// The keys one work item sees: KV heads `g..g + groups` (`hd` values each, rows every
/// `kvd` values) at row offsets `lo..hi` from the job's first visible position, taken
/// `step` rows at a time by each group in turn; the item's heads' sink logits, if any.
struct Keys<'a> {
    kvd: usize,
    g: usize,
    groups: usize,
    lo: usize,
    hi: usize,
    step: usize,
    sinks: Option<&'a [f32]>,
}

/// Rows of keys (values) that the scores (value sums) of all an item's groups take in turn
/// when the rows come from memory. Each group's kernel call fetches its part of the next
/// block's rows while it works on this one, so together they fetch whole cache rows, a few
/// kilobytes of contiguous memory, one block ahead. One group at a time over all the rows
/// is a strided walk that streamed at half the rate (batch 16 at depth 224: 2.9 against
/// 6.1 ms for a pass over every layer). Rows already in cache do better in one pass: in
/// blocks, a 512-token prefill's attention took 72 against 63 ms.
const KEY_BLOCK: usize = PREFETCH_ROWS;

/// Scores, softmax and value sums of the query heads `q` (`group_heads` heads of each of the
/// keys' groups, `hd` values each) over `keys` of the rows `k` and `v`; returns the heads'
/// outputs, held in `buf` (which first holds their scores).
#[allow(clippy::too_many_arguments)]
fn heads<'b, X: RowElem>(
    level: SimdLevel,
    shape: &AttnShape,
    keys: &Keys<'_>,
    k: &[X],
    v: &[X],
    q: &[f32],
    group_heads: usize,
    buf: &'b mut Vec<f32>,
) -> &'b [f32] {
    let (hd, kvd) = (shape.head_dim, keys.kvd);
    // Values per head, and where they start in a value row's head: the keys' own
    // columns when the values lie in them (`v` is then the key rows).
    let (vd, v_at, v) = match shape.values {
        Values::Own => (hd, 0, v),
        Values::InKeys { at, dim } => (dim, at, k),
    };
    let nh = q.len() / hd;
    let len = keys.hi - keys.lo;
    // Offsets are in values; the rows are sliced in elements (a q8 block holds 32 values,
    // and q8 head sizes are whole blocks).
    let e = X::VALUES;
    let span =
        (keys.lo * kvd + keys.g * hd) / e..((keys.hi - 1) * kvd + (keys.g + keys.groups) * hd) / e;
    let (kg, vg) = (&k[span.clone()], &v[span]);
    buf.resize(nh * (len + vd), 0.0);
    let (sc, o) = buf.split_at_mut(nh * len);
    o.fill(0.0);
    // The kernels cannot fail here: `level` came from `simd_level`, which only returns
    // levels the CPU has, and every shape is in range; a failure would leave zeros, caught
    // by the fixture tests.
    let step = keys.step.min(len);
    for j0 in (0..len).step_by(step) {
        let nb = step.min(len - j0);
        for gi in 0..keys.groups {
            let qs = group_rows(q, hd, gi, group_heads);
            let kb = &kg[(j0 * kvd + gi * hd) / e..];
            let out = &mut sc[gi * group_heads * len + j0..];
            let _ = dot_rows(level, &qs[..group_heads], kb, kvd, hd, nb, out, len);
        }
    }
    for (h, s) in sc.chunks_exact_mut(len).enumerate() {
        let scale = match shape.softcap {
            // Gemma 2: the cap applies to the scaled scores, so the softmax gets scale 1.
            Some(cap) => {
                s.iter_mut()
                    .for_each(|x| *x = cap * (*x * shape.scale / cap).tanh());
                1.0
            }
            None => shape.scale,
        };
        let top = s.iter().copied().fold(f32::NEG_INFINITY, f32::max) * scale;
        let _ = softmax_scaled(level, scale, s);
        if let Some(sinks) = keys.sinks {
            // The softmax gave the top score exp(0) / z, so `z = 1 / p_top`; the sink
            // joins the denominator: p_j · z / (z + exp(sink - top)).
            let p_top = s.iter().copied().fold(0.0f32, f32::max);
            let keep = 1.0 / (1.0 + (sinks[h] - top).exp() * p_top);
            s.iter_mut().for_each(|p| *p *= keep);
        }
    }
    for j0 in (0..len).step_by(step) {
        let nb = step.min(len - j0);
        for gi in 0..keys.groups {
            let ps: [&[f32]; MAX_TILE] =
                group_rows(sc, len, gi, group_heads).map(|p| &p[j0..j0 + nb]);
            let vb = &vg[(j0 * kvd + gi * hd + v_at) / e..];
            let ob = &mut o[gi * group_heads * vd..(gi + 1) * group_heads * vd];
            let _ = weighted_rows(level, &ps[..group_heads], vb, kvd, vd, ob);
        }
    }
    o
}

/// The `w`-value rows of `x` of group `gi`'s `n` heads, padded with the last one.
fn group_rows(x: &[f32], w: usize, gi: usize, n: usize) -> [&[f32]; MAX_TILE] {
    std::array::from_fn(|i| {
        let h = gi * n + i.min(n - 1);
        &x[h * w..(h + 1) * w]
    })
}

/// Query heads per work item: whole groups (a multiple of the group size dividing `n_head`)
/// when a group fits a tile, else a divisor of the group size of at most [`MAX_TILE`]; the
/// one that minimises the heads the busiest thread computes, the larger block on ties (more
/// reuse of each loaded key, and whole cache rows read in one walk). Prefill and batched
/// decode get whole tokens, a single decode whole groups. Splitting a group over threads
/// instead balanced a single decode better but cost more than it gained: its items read
/// each row once per item, and widening the rows to f32 once first took a seventh of
/// SmolLM2's decode (measured against whole groups: SmolLM2 at depth 400-600 +2 to +22 %,
/// Gemma 3 +2 to +15 %). Any choice gives the same bits.
fn head_block(tokens: usize, n_head: usize, group: usize, n_threads: usize) -> usize {
    let group = group.max(1);
    (1..=n_head.max(1))
        .filter(|&h| {
            if group <= MAX_TILE {
                h.is_multiple_of(group) && n_head.is_multiple_of(h)
            } else {
                h <= MAX_TILE && group.is_multiple_of(h)
            }
        })
        .min_by_key(|&h| {
            let items = tokens * (n_head / h);
            (items.div_ceil(n_threads) * h, usize::MAX - h)
        })
        .unwrap_or(1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferrite_backend::KvType;

    /// Plain f64 attention over full k/v arrays (`len × n_kv × hd`), no cache, no grouping
    /// shortcuts: the oracle for [`attend`].
    fn naive(
        shape: &AttnShape,
        q: &[f32],
        k: &[f32],
        v: &[f32],
        pos0: usize,
        n: usize,
    ) -> Vec<f64> {
        let hd = shape.head_dim;
        let mut out = vec![0.0; n * shape.n_head * hd];
        for t in 0..n {
            let p = pos0 + t;
            for h in 0..shape.n_head {
                let g = h * shape.n_kv_head / shape.n_head;
                let visible: Vec<usize> = (0..=p)
                    .filter(|&j| shape.window.is_none_or(|w| p - j < w))
                    .collect();
                let s: Vec<f64> = visible
                    .iter()
                    .map(|&j| {
                        (0..hd)
                            .map(|d| {
                                f64::from(q[(t * shape.n_head + h) * hd + d])
                                    * f64::from(k[(j * shape.n_kv_head + g) * hd + d])
                            })
                            .sum::<f64>()
                            * f64::from(shape.scale)
                    })
                    .collect();
                let m = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let z: f64 = s.iter().map(|x| (x - m).exp()).sum();
                for (i, &j) in visible.iter().enumerate() {
                    let p = (s[i] - m).exp() / z;
                    for d in 0..hd {
                        out[(t * shape.n_head + h) * hd + d] +=
                            p * f64::from(v[(j * shape.n_kv_head + g) * hd + d]);
                    }
                }
            }
        }
        out
    }

    fn pseudo(n: usize, seed: u32) -> Vec<f32> {
        let mut s = seed.wrapping_mul(2654435761).wrapping_add(1);
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 17;
                s ^= s << 5;
                (s % 2000) as f32 / 1000.0 - 1.0
            })
            .collect()
    }

    fn check(window: Option<usize>, pos0: usize, n: usize) {
        let shape = AttnShape {
            n_head: 4,
            n_kv_head: 2,
            head_dim: 8,
            scale: 0.35,
            window,
            softcap: None,
            values: Values::Own,
        };
        check_shape(&shape, pos0, n);
    }

    fn check_shape(shape: &AttnShape, pos0: usize, n: usize) {
        let window = shape.window;
        let len = pos0 + n;
        let row = shape.n_kv_head * shape.head_dim;
        let k = pseudo(len * row, 1);
        let v = pseudo(len * row, 2);
        let q = pseudo(n * shape.n_head * shape.head_dim, 3);
        let q8 = shape.head_dim.is_multiple_of(32).then_some(KvType::Q8);
        for ty in std::iter::once(KvType::F32).chain(q8) {
            let mut cache = KvCache::new(ty, 2, 16, shape.n_kv_head, shape.head_dim).unwrap();
            cache.store(1, 0, &k, &v);
            let mut out = vec![f32::NAN; q.len()];
            let pool = ThreadPool::new(2).unwrap();
            attend(&pool, shape, &cache, 1, pos0, &q, &mut out);
            // q8 is attention over the rows its definition gives back.
            let (kw, vw) = match ty {
                KvType::Q8 => (q8_rows(&k), q8_rows(&v)),
                _ => (k.clone(), v.clone()),
            };
            let want = naive(shape, &q, &kw, &vw, pos0, n);
            for (i, (&a, &b)) in out.iter().zip(&want).enumerate() {
                assert!(
                    (f64::from(a) - b).abs() < 1e-5,
                    "{ty:?} {window:?} {pos0} {n} at {i}: {a} vs {b}"
                );
            }
        }
    }

    /// `x` as a q8 cache gives it back, from [`KvType::Q8`]'s definition: per block of 32
    /// values, `d = max|x| / 127` and `d · round(x · (1 / d))`.
    fn q8_rows(x: &[f32]) -> Vec<f32> {
        x.chunks(32)
            .flat_map(|h| {
                let d = h.iter().map(|v| v.abs()).fold(0.0, f32::max) / 127.0;
                h.iter().map(move |v| {
                    if d == 0.0 {
                        0.0
                    } else {
                        d * (v * (1.0 / d)).round()
                    }
                })
            })
            .collect()
    }

    /// Heads of 64 values in two groups of three, as in SmolLM2 (a multiple of the q8
    /// block).
    fn grouped_64(window: Option<usize>) -> AttnShape {
        AttnShape {
            n_head: 6,
            n_kv_head: 2,
            head_dim: 64,
            scale: 0.125,
            window,
            softcap: None,
            values: Values::Own,
        }
    }

    #[test]
    fn q8_cache_matches_naive_over_its_values() {
        for (window, pos0, n) in [(None, 0, 9), (None, 11, 1), (Some(4), 3, 6)] {
            check_shape(&grouped_64(window), pos0, n);
        }
    }

    #[test]
    fn head_blocks_balance_threads() {
        // Gemma 3 decode (1 KV head, group 4, 2 threads): the one group.
        assert_eq!(head_block(1, 4, 4, 2), 4);
        // SmolLM2 decode (3 KV heads, group 3): whole groups, 2 against 1 per thread.
        assert_eq!(head_block(1, 9, 3, 2), 3);
        // 16 SmolLM2 sessions decoding together: whole tokens.
        assert_eq!(head_block(16, 9, 3, 2), 9);
        // Two sessions: one whole token per thread. Three: whole groups balance the
        // threads best (5 against 4 groups).
        assert_eq!(head_block(2, 9, 3, 2), 9);
        assert_eq!(head_block(3, 9, 3, 2), 3);
        // Prefill: whole tokens.
        assert_eq!(head_block(256, 4, 4, 2), 4);
        assert_eq!(head_block(256, 9, 3, 2), 9);
        // Groups larger than a tile use a divisor that fits.
        assert_eq!(head_block(256, 8, 8, 2), 4);
        assert_eq!(head_block(1, 16, 8, 2), 4);
        // One head per group: whole tokens.
        assert_eq!(head_block(256, 4, 1, 2), 4);
    }

    /// Runs `attend` over `len` positions of a cache of `ty`, either as one chunk or token by
    /// token.
    fn run_attend(
        ty: KvType,
        shape: &AttnShape,
        threads: usize,
        len: usize,
        one_by_one: bool,
    ) -> Vec<f32> {
        let row = shape.n_kv_head * shape.head_dim;
        let qw = shape.n_head * shape.head_dim;
        let (k, v, q) = (
            pseudo(len * row, 7),
            pseudo(len * row, 8),
            pseudo(len * qw, 9),
        );
        let mut cache = KvCache::new(ty, 1, len, shape.n_kv_head, shape.head_dim).unwrap();
        cache.store(0, 0, &k, &v);
        let pool = ThreadPool::new(threads).unwrap();
        let mut out = vec![f32::NAN; q.len()];
        if one_by_one {
            for t in 0..len {
                let o = &mut out[t * qw..(t + 1) * qw];
                attend(&pool, shape, &cache, 0, t, &q[t * qw..(t + 1) * qw], o);
            }
        } else {
            attend(&pool, shape, &cache, 0, 0, &q, &mut out);
        }
        out
    }

    #[test]
    fn prefill_decode_and_threads_give_identical_bits_at_model_shapes() {
        // SmolLM2-like (group 3, head dim 64) and Gemma-3-like (group 4, head dim 256,
        // window): head blocking differs between these runs, the bits must not.
        for shape in [
            grouped_64(None),
            AttnShape {
                n_head: 4,
                n_kv_head: 1,
                head_dim: 256,
                scale: 0.0625,
                window: Some(13),
                softcap: None,
                values: Values::Own,
            },
        ] {
            for ty in [KvType::F16, KvType::Q8] {
                let want = run_attend(ty, &shape, 1, 37, false);
                assert!(want.iter().all(|v| v.is_finite()));
                for (threads, one) in [(2, false), (1, true), (2, true), (3, false)] {
                    let got = run_attend(ty, &shape, threads, 37, one);
                    assert_eq!(
                        got, want,
                        "{ty:?} {shape:?} threads={threads} one_by_one={one}"
                    );
                }
            }
        }
    }

    #[test]
    fn many_sequences_in_one_call_equal_each_alone_bit_for_bit() {
        // Continuous batching: sequences at different depths, some decoding one token and
        // one taking a chunk, attended together must each get the bits of a call of their
        // own, whatever the thread count.
        for (window, ty) in [
            (None, KvType::F16),
            (Some(50), KvType::F16),
            (None, KvType::Q8),
        ] {
            many_equal_alone(ty, grouped_64(window));
        }
    }

    fn many_equal_alone(ty: KvType, shape: AttnShape) {
        let row = shape.n_kv_head * shape.head_dim;
        let qw = shape.n_head * shape.head_dim;
        let ctx = 160;
        // (position of the first query, queries)
        let seqs = [(0, 1), (150, 1), (40, 7), (3, 1), (97, 1), (120, 2)];
        let caches: Vec<KvCache> = (0..seqs.len())
            .map(|i| {
                let mut c = KvCache::new(ty, 2, ctx, shape.n_kv_head, shape.head_dim).unwrap();
                let (k, v) = (
                    pseudo(ctx * row, 20 + i as u32),
                    pseudo(ctx * row, 40 + i as u32),
                );
                c.store(1, 0, &k, &v);
                c
            })
            .collect();
        let qs: Vec<Vec<f32>> = (0..seqs.len())
            .map(|i| pseudo(seqs[i].1 * qw, 60 + i as u32))
            .collect();
        let alone: Vec<Vec<f32>> = seqs
            .iter()
            .zip(&caches)
            .zip(&qs)
            .map(|((&(pos0, n), cache), q)| {
                let mut out = vec![f32::NAN; n * qw];
                let pool = ThreadPool::new(1).unwrap();
                attend(&pool, &shape, cache, 1, pos0, q, &mut out);
                out
            })
            .collect();
        for threads in [1, 2, 3] {
            let pool = ThreadPool::new(threads).unwrap();
            let mut outs: Vec<Vec<f32>> =
                seqs.iter().map(|&(_, n)| vec![f32::NAN; n * qw]).collect();
            let mut jobs: Vec<AttnJob<'_>> = seqs
                .iter()
                .zip(&caches)
                .zip(&qs)
                .zip(outs.iter_mut())
                .map(|(((&(pos0, _), cache), q), out)| AttnJob {
                    cache,
                    pos0,
                    q,
                    out,
                })
                .collect();
            attend_many(&pool, &shape, 1, None, &mut jobs);
            drop(jobs);
            for (i, (got, want)) in outs.iter().zip(&alone).enumerate() {
                assert!(want.iter().all(|v| v.is_finite()));
                assert!(
                    got == want,
                    "threads={threads}: sequence {i} differs from its own call"
                );
            }
        }
    }

    #[test]
    fn causal_chunk_matches_naive() {
        // 7 tokens split their items by group, 8 take one item per token (both KV heads).
        check(None, 0, 7);
        check(None, 2, 8);
        check(None, 5, 3);
        check(None, 9, 1);
    }

    #[test]
    fn groups_wider_than_a_tile_match_naive() {
        // Group 8 is split into items of 4 heads, for decode and for a chunk.
        let shape = AttnShape {
            n_head: 16,
            n_kv_head: 2,
            head_dim: 8,
            scale: 0.35,
            window: None,
            softcap: None,
            values: Values::Own,
        };
        check_shape(&shape, 0, 5);
        check_shape(&shape, 9, 1);
    }

    #[test]
    fn sliding_window_matches_naive() {
        check(Some(3), 0, 9);
        check(Some(3), 6, 4);
        check(Some(4), 11, 1);
    }

    #[test]
    fn window_masks_keys_outside_it() {
        // A decode step at position 5 with window 2 must ignore positions 0..4: poisoning them
        // must not change the output.
        let shape = AttnShape {
            n_head: 1,
            n_kv_head: 1,
            head_dim: 2,
            scale: 1.0,
            window: Some(2),
            softcap: None,
            values: Values::Own,
        };
        let mut cache = KvCache::new(KvType::F32, 1, 8, 1, 2).unwrap();
        let k = pseudo(12, 4);
        let v = pseudo(12, 5);
        cache.store(0, 0, &k, &v);
        let q = [0.3, -0.2];
        let pool = ThreadPool::new(1).unwrap();
        let mut a = [0.0; 2];
        attend(&pool, &shape, &cache, 0, 5, &q, &mut a);
        cache.store(0, 0, &[1e3; 8], &[1e3; 8]);
        let mut b = [0.0; 2];
        attend(&pool, &shape, &cache, 0, 5, &q, &mut b);
        assert_eq!(a, b);
    }
}
