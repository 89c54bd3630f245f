//! Attention launches on device buffers: the tiled kernel over the cache (one query or a
//! prompt chunk, keys optionally split over blocks and merged), its launch geometry, and
//! [`AttnShape`], the per-layer geometry the kernels accept. Split from `ops.rs`, which holds
//! every other kernel launch; like those, every buffer is passed by shared reference and all
//! work is on one stream.

use cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};

use crate::ops::{ActQ, act_q8_bytes, i32_of};
use crate::{CudaBackend, CudaError};

/// Keys per tile of the attention kernel (ATT_TK in attention.cu).
pub(crate) const ATT_TILE: usize = 32;
/// Most (query × head) rows one attention block holds.
const ATT_MAX_ROWS: usize = 32;
/// Most query values (rows × head_dim) one attention block holds in shared memory.
const ATT_MAX_ROW_VALUES: usize = 4096;

/// Most key splits of a prefill attention launch (the partials its buffer holds per query
/// and head).
pub(crate) const PREFILL_MAX_SPLITS: usize = 8;

/// Blocks a prefill attention launch aims for.
const PREFILL_ATT_BLOCKS: usize = 1024;

/// Most keys one split of a prefill attention launch walks.
const PREFILL_SPLIT_KEYS: usize = 1024;

/// Queries per block of the attention kernel: enough rows (query × head) to reuse each
/// loaded key, its rows (query × the block's heads) within ATT_MAX_ROWS and their query
/// values within ATT_MAX_ROW_VALUES, the budget [`AttnShape::heads_per_block`] keeps.
fn queries_per_block(shape: &AttnShape, nq: usize) -> usize {
    let hpb = shape.heads_per_block();
    if nq == 1 {
        1
    } else {
        (ATT_MAX_ROWS / hpb)
            .min(ATT_MAX_ROW_VALUES / (hpb * shape.head_dim))
            .clamp(1, nq)
    }
}

/// Key splits of the attention of `nq` queries, the last of which sees `keys` keys. Each
/// block walks its keys one tile after another, so the longest blocks set the time: enough
/// splits for PREFILL_ATT_BLOCKS blocks and at most PREFILL_SPLIT_KEYS keys per split,
/// within PREFILL_MAX_SPLITS.
pub(crate) fn prefill_splits(shape: &AttnShape, nq: usize, keys: usize) -> usize {
    let blocks = shape.n_head / shape.heads_per_block() * nq.div_ceil(queries_per_block(shape, nq));
    PREFILL_ATT_BLOCKS
        .div_ceil(blocks.max(1))
        .max(keys.div_ceil(PREFILL_SPLIT_KEYS))
        .clamp(1, PREFILL_MAX_SPLITS)
}

impl CudaBackend {
    /// Attention of `nq` consecutive queries (rows of `q`, `n_head × head_dim` each) at
    /// positions `tp[1]..` over cache rows up to each query's own, into `out` (`n_head ×
    /// v_dim` values a query). With `splits > 1` (decode), keys are split over that many
    /// blocks whose partial results go to `part` (`nq × n_head × splits × (v_dim + 2)`
    /// values) and are merged after. With values in the keys, `vc` is not read (pass `kc`).
    /// With `sinks` (one logit per query head, gpt-oss), each head's softmax also holds its
    /// sink in the denominator.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn attention(
        &self,
        shape: &AttnShape,
        q: &CudaSlice<f32>,
        kc: &CudaSlice<u16>,
        vc: &CudaSlice<u16>,
        out: &CudaSlice<f32>,
        part: &CudaSlice<f32>,
        tp: &CudaSlice<i32>,
        nq: usize,
        splits: usize,
        sinks: Option<&CudaSlice<f32>>,
    ) -> Result<(), CudaError> {
        self.attention_q(shape, q, kc, vc, out, part, tp, nq, splits, None, sinks)
    }

    /// [`CudaBackend::attention`] of one query (`nq` = 1) whose output is also quantized to
    /// int8 blocks in `xq` (see [`CudaBackend::quantize_act`]): by the merge launch when the
    /// keys are split and head_dim is a multiple of 32 (at most 256), else by a separate
    /// launch.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn attention_q(
        &self,
        shape: &AttnShape,
        q: &CudaSlice<f32>,
        kc: &CudaSlice<u16>,
        vc: &CudaSlice<u16>,
        out: &CudaSlice<f32>,
        part: &CudaSlice<f32>,
        tp: &CudaSlice<i32>,
        nq: usize,
        splits: usize,
        xq: Option<ActQ<'_>>,
        sinks: Option<&CudaSlice<f32>>,
    ) -> Result<(), CudaError> {
        check_sinks(shape, sinks)?;
        let (hd, vd) = (shape.head_dim, shape.v_dim());
        let hpb = shape.heads_per_block();
        let (qdim, odim) = (shape.n_head * hd, shape.n_head * vd);
        if nq == 0 || splits == 0 || q.len() < nq * qdim || out.len() < nq * odim {
            return Err(CudaError::InvalidArgument(format!(
                "attention of {nq} queries in {splits} splits"
            )));
        }
        if splits > 1 && part.len() < nq * shape.n_head * splits * (vd + 2) {
            return Err(CudaError::InvalidArgument(format!(
                "attention partials smaller than {nq} × {} heads × {splits} splits",
                shape.n_head
            )));
        }
        let qt = queries_per_block(shape, nq);
        let cap = qt * hpb;
        let smem = (cap * (hd + vd) + cap * ATT_TILE + 3 * cap) * 4;
        let cfg = LaunchConfig {
            grid_dim: (
                (shape.n_head / hpb) as u32,
                nq.div_ceil(qt) as u32,
                splits as u32,
            ),
            block_dim: (128, 1, 1),
            shared_mem_bytes: smem as u32,
        };
        let (nh, nkv, hd32) = (shape.n_head as i32, shape.n_kv_head as i32, hd as i32);
        let (hpb32, vd32, v_at) = (hpb as i32, vd as i32, shape.v_at() as i32);
        let (nq32, qt32, sp32) = (i32_of(nq, "queries")?, qt as i32, splits as i32);
        let win = shape.window.map_or(0, |w| w.min(i32::MAX as usize) as i32);
        let min_chunk = ATT_TILE as i32;
        let cap = shape.cap_arg();
        let mut b = self.kernel("attn_f16")?;
        b.arg(q)
            .arg(kc)
            .arg(vc)
            .arg(out)
            .arg(part)
            .arg(&nh)
            .arg(&nkv)
            .arg(&hd32)
            .arg(&hpb32)
            .arg(&vd32)
            .arg(&v_at)
            .arg(tp)
            .arg(&nq32)
            .arg(&qt32)
            .arg(&win)
            .arg(&shape.scale)
            .arg(&sp32)
            .arg(&min_chunk)
            .arg(&cap);
        let null = 0u64;
        match sinks {
            Some(s) => b.arg(s),
            None => b.arg(&null),
        };
        // SAFETY: reads nq query rows (checked above), cache rows up to tp[1] + nq - 1
        // (callers keep that below the cache's rows; values at v_at..v_at + v_dim of each
        // key head lie inside it, AttnShape::with_values_in_keys) and n_head sink logits
        // when sinks is not null (checked above); writes nq rows of out or, with splits >
        // 1, nq × n_head × splits partials (checked above). Shared memory is sized from the
        // same qt, heads per block, head_dim and v_dim the kernel uses.
        unsafe { b.launch(cfg) }?;
        if xq.is_some_and(|x| {
            nq != 1 || !(1..=2).contains(&x.planes) || x.buf.len() < act_q8_bytes(odim, x.planes)
        }) {
            return Err(CudaError::InvalidArgument(format!(
                "int8 copy of {nq} attention rows of {odim}"
            )));
        }
        // The merge quantizes when each of its warps holds 32 consecutive outputs.
        let fused_q = splits > 1 && vd.is_multiple_of(32) && vd <= 256;
        if splits > 1 {
            let cfg = LaunchConfig {
                grid_dim: ((nq * shape.n_head) as u32, 1, 1),
                block_dim: (vd.next_multiple_of(32).min(256) as u32, 1, 1),
                shared_mem_bytes: 0,
            };
            let planes = xq.map_or(0, |x| x.planes as i32);
            let mut b = self.kernel("attn_combine")?;
            b.arg(part)
                .arg(out)
                .arg(&vd32)
                .arg(&sp32)
                .arg(tp)
                .arg(&win)
                .arg(&min_chunk)
                .arg(&nq32);
            match xq.filter(|_| fused_q) {
                Some(x) => b.arg(x.buf),
                None => b.arg(&null),
            };
            b.arg(&planes).arg(&nh);
            match sinks {
                Some(s) => b.arg(s),
                None => b.arg(&null),
            };
            // SAFETY: reads the partials written above and, when sinks is not null, n_head
            // sink logits; writes nq × n_head × v_dim values of out (all checked above);
            // with xq (a null pointer otherwise, which the kernel tests), one query's
            // act_q8_bytes(odim, planes) bytes (checked above), each block of v_dim
            // threads (a multiple of 32, at most 256) quantizing its head.
            unsafe { b.launch(cfg) }?;
        }
        match xq {
            Some(x) if !fused_q => self.quantize_act(out, x, odim),
            _ => Ok(()),
        }
    }
}

/// Sink logits, when given, hold one value per query head of `shape`.
pub(crate) fn check_sinks(
    shape: &AttnShape,
    sinks: Option<&CudaSlice<f32>>,
) -> Result<(), CudaError> {
    match sinks {
        Some(s) if s.len() < shape.n_head => Err(CudaError::InvalidArgument(format!(
            "{} sink logits for {} heads",
            s.len(),
            shape.n_head
        ))),
        _ => Ok(()),
    }
}

/// Attention geometry of one layer.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AttnShape {
    /// Query heads.
    pub n_head: usize,
    /// KV heads (divides n_head).
    pub n_kv_head: usize,
    /// Values per key head (a multiple of 8, at most 4096: one head's query fits a block).
    pub head_dim: usize,
    /// Multiplier of q·k.
    pub scale: f32,
    /// Sliding window length; `None` for full causal attention.
    pub window: Option<usize>,
    /// Soft cap of the scaled scores, `cap · tanh(s / cap)` (Gemma 2); `None` for plain
    /// scores.
    pub softcap: Option<f32>,
    /// Values read from the keys, `(at, dim)`: values `at..at + dim` of each key head
    /// (MLA's latent after its rope part); `None` for value rows of their own.
    pub values_in_keys: Option<(usize, usize)>,
}

impl AttnShape {
    /// Checks the geometry against the kernel's limits.
    pub fn new(
        n_head: usize,
        n_kv_head: usize,
        head_dim: usize,
        scale: f32,
        window: Option<usize>,
    ) -> Result<AttnShape, CudaError> {
        if n_kv_head == 0
            || !n_head.is_multiple_of(n_kv_head)
            || head_dim == 0
            || !head_dim.is_multiple_of(8)
            || head_dim > ATT_MAX_ROW_VALUES
        {
            return Err(CudaError::InvalidArgument(format!(
                "attention {n_head} heads / {n_kv_head} KV heads of {head_dim}"
            )));
        }
        Ok(AttnShape {
            n_head,
            n_kv_head,
            head_dim,
            scale,
            window,
            softcap: None,
            values_in_keys: None,
        })
    }

    /// This geometry with its values read from the keys: values `at..at + dim` of each key
    /// head, which must lie inside it.
    pub fn with_values_in_keys(self, at: usize, dim: usize) -> Result<AttnShape, CudaError> {
        if dim == 0 || at + dim > self.head_dim {
            return Err(CudaError::InvalidArgument(format!(
                "values {at}..{} of key heads of {}",
                at + dim,
                self.head_dim
            )));
        }
        Ok(AttnShape {
            values_in_keys: Some((at, dim)),
            ..self
        })
    }

    /// Values per head that attention writes.
    pub fn v_dim(&self) -> usize {
        self.values_in_keys.map_or(self.head_dim, |(_, dim)| dim)
    }

    /// First value of a head's value row.
    pub(crate) fn v_at(&self) -> usize {
        self.values_in_keys.map_or(0, |(at, _)| at)
    }

    /// Query heads one block of the tiled kernel takes: every head of a KV head's group
    /// when they fit its rows and shared memory, else the largest divisor of the group
    /// that does (many query heads over one latent, as MLA has).
    pub(crate) fn heads_per_block(&self) -> usize {
        let n_rep = self.n_head / self.n_kv_head;
        (1..=n_rep.min(ATT_MAX_ROWS))
            .rev()
            .find(|&h| n_rep.is_multiple_of(h) && h * self.head_dim <= ATT_MAX_ROW_VALUES)
            .unwrap_or(1)
    }

    /// This geometry with its scores soft-capped at `cap` (none for `None`).
    pub fn with_softcap(self, cap: Option<f32>) -> AttnShape {
        AttnShape {
            softcap: cap,
            ..self
        }
    }

    /// The soft cap as the kernels take it: 0 for none.
    pub(crate) fn cap_arg(&self) -> f32 {
        self.softcap.unwrap_or(0.0)
    }

    /// `n_kv_head × head_dim`.
    pub fn kv_dim(&self) -> usize {
        self.n_kv_head * self.head_dim
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefill_splits_fill_the_device_and_bound_each_split() {
        let s = |nh, nkv, hd| AttnShape::new(nh, nkv, hd, 1.0, None).unwrap();
        // SmolLM2: 3 KV heads × 52 tiles of 10 queries = 156 blocks.
        assert_eq!(prefill_splits(&s(9, 3, 64), 512, 512), 7);
        // Llama 8B: 8 × 64 tiles = 512 blocks; a chunk late in a 4096-token prompt.
        assert_eq!(prefill_splits(&s(32, 8, 128), 512, 512), 2);
        assert_eq!(prefill_splits(&s(32, 8, 128), 512, 4096), 4);
        // Gemma 3 270M: 1 × 128 tiles of 4 queries.
        assert_eq!(prefill_splits(&s(4, 1, 256), 512, 512), PREFILL_MAX_SPLITS);
        assert_eq!(
            prefill_splits(&s(32, 8, 128), 4096, 1 << 20),
            PREFILL_MAX_SPLITS
        );
        assert_eq!(prefill_splits(&s(64, 64, 128), 4096, 16), 1);
    }

    #[test]
    fn a_block_takes_the_widest_group_of_heads_that_fits() {
        let hpb = |nh, nkv, hd| {
            AttnShape::new(nh, nkv, hd, 1.0, None)
                .unwrap()
                .heads_per_block()
        };
        assert_eq!(hpb(9, 3, 64), 3);
        assert_eq!(hpb(32, 8, 128), 4);
        assert_eq!(hpb(4, 1, 256), 4);
        // MLA: one latent of 64 + 512 under 16 or 128 query heads; 4 × 576 ≤ 4096 < 8 × 576.
        assert_eq!(hpb(16, 1, 576), 4);
        assert_eq!(hpb(128, 1, 576), 4);
        // At most 32 rows a block, and a group that no divisor fits takes one head a block.
        assert_eq!(hpb(64, 1, 64), 32);
        assert_eq!(hpb(7, 1, 1024), 1);
        assert!(AttnShape::new(1, 1, 4104, 1.0, None).is_err());
    }
}
