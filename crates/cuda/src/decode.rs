//! Launches specialised for the single-token decode step: split attention that merges its
//! splits and quantizes its output in the same launch (`kernels/attn_decode.cu`), and the
//! Q/K/V products over int8 activations when their weight types differ (`matvec3_i8_mixed`
//! in `kernels/matvec_i8.cu`). Shapes the attention kernel does not cover fall back to the
//! general attention kernel plus separate merge and quantize launches, so callers need not
//! care.

use cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};

use ferrite_gguf::GgmlType;

use crate::ops::{ActQ, DeviceMatrix, act_q8_bytes, matvec_grid};
use crate::{AttnShape, CudaBackend, CudaError};

/// Warps per block of the decode attention kernel (ATTD_WARPS).
const ATTD_WARPS: usize = 4;
/// Most query heads per KV head the decode attention kernel takes (ATTD_MAX_REP).
const ATTD_MAX_REP: usize = 8;
/// Fewest keys per split (ATTD_MIN_KEYS: one 32-key tile per warp).
const ATTD_MIN_KEYS: usize = 32 * ATTD_WARPS;
/// Blocks the decode attention aims for over all KV heads at long contexts.
const ATTD_BLOCKS_WANTED: usize = 1024;
/// Most key splits per KV head (ATTD_MAX_SPLITS).
const ATTD_MAX_SPLITS: usize = 128;

/// The decode attention kernel for a shape, if it covers it (head_dim 64, 128 or 256, at
/// most ATTD_MAX_REP query heads per KV head).
fn decode_kernel(shape: &AttnShape) -> Option<&'static str> {
    if shape.n_head / shape.n_kv_head > ATTD_MAX_REP {
        return None;
    }
    match shape.head_dim {
        64 => Some("attn_decode_f16_64"),
        128 => Some("attn_decode_f16_128"),
        256 => Some("attn_decode_f16_256"),
        _ => None,
    }
}

/// The type code of the mixed-type int8 product (row_i8 in matvec_i8.cu); `None` for types
/// without int8 kernels.
pub(crate) fn i8_type_code(ty: GgmlType) -> Option<i32> {
    match ty {
        GgmlType::Q4_1 => Some(0),
        GgmlType::Q8_0 => Some(1),
        GgmlType::Q4_K => Some(2),
        GgmlType::Q6_K => Some(3),
        _ => None,
    }
}

/// Key splits of decode attention for a cache of `ctx` positions: up to
/// ATTD_BLOCKS_WANTED blocks over the KV heads, each split at least ATTD_MIN_KEYS keys of
/// the context (the kernel uses fewer at shorter positions).
pub(crate) fn decode_splits(n_kv_head: usize, ctx: usize) -> usize {
    (ATTD_BLOCKS_WANTED / n_kv_head.max(1))
        .clamp(1, ATTD_MAX_SPLITS)
        .min(ctx.div_ceil(ATTD_MIN_KEYS))
}

impl CudaBackend {
    /// [`CudaBackend::matvec_multi`] over matrices of one width and different types that
    /// all have int8 kernels, with x as int8 blocks: one launch.
    pub(crate) fn matvec3_i8_mixed(
        &self,
        ws: &[&DeviceMatrix],
        xq: ActQ<'_>,
        ys: &[&CudaSlice<f32>],
    ) -> Result<(), CudaError> {
        let first = ws[0];
        if !(1..=2).contains(&xq.planes) || xq.buf.len() < act_q8_bytes(first.cols, xq.planes) {
            return Err(CudaError::InvalidArgument(format!(
                "int8 activations of {} values in {} planes",
                first.cols, xq.planes
            )));
        }
        let rows = |i: usize| ws.get(i).map_or(0, |w| w.rows as i32);
        let code = |i: usize| ws.get(i).and_then(|w| i8_type_code(w.ty)).unwrap_or(0);
        let rb = |i: usize| ws.get(i).map_or(0, |w| w.row_bytes);
        let w = |i: usize| &ws.get(i).unwrap_or(&first).data;
        let y = |i: usize| *ys.get(i).unwrap_or(&ys[0]);
        let (r0, r1, r2) = (rows(0), rows(1), rows(2));
        let (t0, t1, t2) = (code(0), code(1), code(2));
        let (rb0, rb1, rb2) = (rb(0), rb(1), rb(2));
        let cols = first.cols as i32;
        let planes = xq.planes as i32;
        let total = ws.iter().map(|w| w.rows).sum::<usize>();
        let mut b = self.kernel("matvec3_i8_mixed")?;
        b.arg(w(0))
            .arg(w(1))
            .arg(w(2))
            .arg(xq.buf)
            .arg(y(0))
            .arg(y(1))
            .arg(y(2))
            .arg(&r0)
            .arg(&r1)
            .arg(&r2)
            .arg(&cols)
            .arg(&t0)
            .arg(&t1)
            .arg(&t2)
            .arg(&rb0)
            .arg(&rb1)
            .arg(&rb2)
            .arg(&planes);
        // SAFETY: matrix i (absent ones have 0 rows and are never read) has r_i rows of
        // rb_i bytes of the type coded t_i (checked at upload; every code is one the kernel
        // decodes); xq holds the int8 blocks of cols values (checked above) and y_i r_i
        // values.
        unsafe { b.launch(matvec_grid(total, 1)) }?;
        Ok(())
    }

    /// Attention of one query (`q`: n_head × head_dim values, at position `tp[1]`) over cache
    /// rows up to its own, into `out`, keys split over up to `splits` blocks per KV head
    /// (partials in `part`: n_head × splits × (head_dim + 2) values; `cnt`: n_kv_head
    /// counters, zero between launches). With `xq`, the output is also quantized to int8
    /// blocks there (see [`CudaBackend::quantize_act`]).
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
    ) -> Result<(), CudaError> {
        let hd = shape.head_dim;
        let qdim = shape.n_head * hd;
        let Some(name) = decode_kernel(shape) else {
            self.attention(shape, q, kc, vc, out, part, tp, 1, splits)?;
            return match xq {
                Some(x) => self.quantize_act(out, x, qdim),
                None => Ok(()),
            };
        };
        if splits == 0
            || splits > ATTD_MAX_SPLITS
            || q.len() < qdim
            || out.len() < qdim
            || part.len() < shape.n_head * splits * (hd + 2)
            || cnt.len() < shape.n_kv_head
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
            grid_dim: (shape.n_kv_head as u32, splits as u32, 1),
            block_dim: (32 * ATTD_WARPS as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        let (nh, nkv, sp) = (shape.n_head as i32, shape.n_kv_head as i32, splits as i32);
        let win = shape.window.map_or(0, |w| w.min(i32::MAX as usize) as i32);
        let planes = xq.map_or(0, |x| x.planes as i32);
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
            .arg(&sp);
        // SAFETY: reads one query row and cache rows up to tp[1] (callers keep that below the
        // cache's rows), writes n_head × head_dim values of out, at most n_head × splits ×
        // (head_dim + 2) partials, n_kv_head counters (left at zero) and, with xq (a null
        // pointer otherwise, which the kernel tests), act_q8_bytes(qdim, planes) bytes; all
        // checked above.
        unsafe { b.launch(cfg) }?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_fill_the_device_and_keep_a_tile_per_warp() {
        assert_eq!(decode_splits(8, 4096 + 512), 36);
        assert_eq!(decode_splits(8, 1 << 20), 128);
        assert_eq!(decode_splits(3, 16), 1);
        assert_eq!(decode_splits(3, 1 << 20), 128);
        assert_eq!(decode_splits(32, 1 << 20), 32);
        assert_eq!(decode_splits(0, 1), 1);
    }

    #[test]
    fn the_decode_kernel_covers_the_common_head_sizes() {
        let s = |nh, nkv, hd| AttnShape::new(nh, nkv, hd, 1.0, None).unwrap();
        assert_eq!(decode_kernel(&s(32, 8, 128)), Some("attn_decode_f16_128"));
        assert_eq!(decode_kernel(&s(9, 3, 64)), Some("attn_decode_f16_64"));
        assert_eq!(decode_kernel(&s(4, 1, 256)), Some("attn_decode_f16_256"));
        assert_eq!(decode_kernel(&s(16, 1, 64)), None);
        assert_eq!(decode_kernel(&s(2, 2, 32)), None);
    }
}
