//! Launches specialised for the single-token decode step: split attention that merges its
//! splits and quantizes its output in the same launch (`kernels/attn_decode.cu`), for one
//! session here and for a batch of sessions in `model/batch.rs`. Shapes the kernel does not
//! cover fall back to the general attention kernel plus separate merge and quantize
//! launches, so callers need not care.

use cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};

use crate::ops::{ActQ, act_q8_bytes};
use crate::{AttnShape, CudaBackend, CudaError};

/// Warps per block of the decode attention kernel (ATTD_WARPS).
const ATTD_WARPS: usize = 4;
/// Threads per block of the decode attention kernels.
pub(crate) const ATTD_THREADS: u32 = 32 * ATTD_WARPS as u32;
/// Fewest keys per split (ATTD_MIN_KEYS: one 32-key tile per warp).
const ATTD_MIN_KEYS: usize = 32 * ATTD_WARPS;
/// Blocks the decode attention aims for over all query heads at long contexts: one wave at
/// the kernel's occupancy on the H200 (114 registers per thread: 4 blocks per SM, 528).
/// Measured on the 8B shape at depth 4096 (receipt cuda-2026-11-29-6): 271 tok/s with 1024
/// blocks (two waves), 286 with 512, 282 with 256.
const ATTD_BLOCKS_WANTED: usize = 512;
/// Most key splits per query head (ATTD_MAX_SPLITS).
pub(crate) const ATTD_MAX_SPLITS: usize = 128;

/// The decode attention kernels for a shape, one session's and a batch's, if they cover it
/// (head_dim 64, 128 or 256).
pub(crate) fn decode_kernel(shape: &AttnShape) -> Option<(&'static str, &'static str)> {
    match (shape.head_dim, shape.values_in_keys) {
        (64, None) => Some(("attn_decode_f16_64", "battn_decode_f16_64")),
        (128, None) => Some(("attn_decode_f16_128", "battn_decode_f16_128")),
        (256, None) => Some(("attn_decode_f16_256", "battn_decode_f16_256")),
        _ => None,
    }
}

/// Key splits of decode attention for a cache of `ctx` positions: up to
/// ATTD_BLOCKS_WANTED blocks over the query heads, each split at least ATTD_MIN_KEYS keys
/// of the context (the kernel uses fewer at shorter positions).
pub(crate) fn decode_splits(n_head: usize, ctx: usize) -> usize {
    (ATTD_BLOCKS_WANTED / n_head.max(1))
        .clamp(1, ATTD_MAX_SPLITS)
        .min(ctx.div_ceil(ATTD_MIN_KEYS))
}

impl CudaBackend {
    /// Attention of one query (`q`: n_head × head_dim values, at position `tp[1]`) over cache
    /// rows up to its own, into `out`, keys split over up to `splits` blocks per query head
    /// (partials in `part`: n_head × splits × (head_dim + 2) values; `cnt`: n_head
    /// counters, zero between launches), by the kernel that merges its splits itself where
    /// it covers the shape, else by the general kernel and a merge launch. With `xq`, the
    /// output is also quantized to int8 blocks there (see [`CudaBackend::quantize_act`]);
    /// `sinks` as [`CudaBackend::attention`]'s.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn decode_attention(
        &self,
        shape: &AttnShape,
        q: &CudaSlice<f32>,
        kc: &CudaSlice<u16>,
        vc: &CudaSlice<u16>,
        out: &CudaSlice<f32>,
        part: &CudaSlice<f32>,
        cnt: &CudaSlice<u32>,
        tp: &CudaSlice<i32>,
        splits: usize,
        xq: Option<ActQ<'_>>,
        sinks: Option<&CudaSlice<f32>>,
    ) -> Result<(), CudaError> {
        let hd = shape.head_dim;
        let qdim = shape.n_head * hd;
        let Some((name, _)) = decode_kernel(shape) else {
            return self.attention_q(shape, q, kc, vc, out, part, tp, 1, splits, xq, sinks);
        };
        crate::attn_ops::check_sinks(shape, sinks)?;
        if splits == 0
            || splits > ATTD_MAX_SPLITS
            || q.len() < qdim
            || out.len() < qdim
            || part.len() < shape.n_head * splits * (hd + 2)
            || cnt.len() < shape.n_head
            || kc.len() != vc.len()
        {
            return Err(CudaError::InvalidArgument(format!(
                "decode attention buffers below {} heads × {splits} splits",
                shape.n_head
            )));
        }
        if xq.is_some_and(|x| {
            !(1..=2).contains(&x.planes) || x.buf.len() < act_q8_bytes(qdim, x.planes)
        }) {
            return Err(CudaError::InvalidArgument(format!(
                "int8 copy of {qdim} attention outputs"
            )));
        }
        let cfg = LaunchConfig {
            grid_dim: (shape.n_head as u32, splits as u32, 1),
            block_dim: (ATTD_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        let (nh, nkv, sp) = (shape.n_head as i32, shape.n_kv_head as i32, splits as i32);
        let win = shape.window.map_or(0, |w| w.min(i32::MAX as usize) as i32);
        let planes = xq.map_or(0, |x| x.planes as i32);
        let cap = shape.cap_arg();
        let null = 0u64;
        let mut b = self.kernel(name)?;
        b.arg(q).arg(kc).arg(vc).arg(out).arg(part).arg(cnt);
        match xq {
            Some(x) => b.arg(x.buf),
            None => b.arg(&null),
        };
        b.arg(&planes)
            .arg(&nh)
            .arg(&nkv)
            .arg(tp)
            .arg(&win)
            .arg(&shape.scale)
            .arg(&sp)
            .arg(&cap);
        match sinks {
            Some(s) => b.arg(s),
            None => b.arg(&null),
        };
        // SAFETY: reads one query row, cache rows up to tp[1] (callers keep that below the
        // cache's rows) and, when sinks is not null, n_head sink logits; writes n_head ×
        // head_dim values of out, at most n_head × splits × (head_dim + 2) partials, n_head
        // counters (left at zero) and, with xq (a null pointer otherwise, which the kernel
        // tests), act_q8_bytes(qdim, planes) bytes; all checked above.
        unsafe { b.launch(cfg) }?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_fill_the_device_and_keep_a_tile_per_warp() {
        assert_eq!(decode_splits(32, 4096 + 512), 16);
        assert_eq!(decode_splits(9, 4096 + 512), 36);
        assert_eq!(decode_splits(9, 1 << 20), 56);
        assert_eq!(decode_splits(3, 16), 1);
        assert_eq!(decode_splits(3, 1 << 20), 128);
        assert_eq!(decode_splits(64, 1 << 20), 8);
        assert_eq!(decode_splits(0, 1), 1);
    }

    #[test]
    fn the_decode_kernel_covers_the_common_head_sizes() {
        let s = |nh, nkv, hd| AttnShape::new(nh, nkv, hd, 1.0, None).unwrap();
        let name = |nh, nkv, hd| decode_kernel(&s(nh, nkv, hd)).map(|k| k.0);
        assert_eq!(name(32, 8, 128), Some("attn_decode_f16_128"));
        assert_eq!(name(9, 3, 64), Some("attn_decode_f16_64"));
        assert_eq!(name(4, 1, 256), Some("attn_decode_f16_256"));
        assert_eq!(name(16, 1, 64), Some("attn_decode_f16_64"));
        assert_eq!(name(2, 2, 32), None);
        assert_eq!(
            decode_kernel(&s(32, 8, 128)).map(|k| k.1),
            Some("battn_decode_f16_128")
        );
    }
}
