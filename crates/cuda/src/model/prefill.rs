//! Batched prefill: a prompt goes through the model a chunk of tokens at a time. Each
//! weight matrix is multiplied with all the chunk's tokens in one product (cuBLAS on f16
//! copies, or MMQ on the quantized blocks: `gemm.rs`); norms, rope, the KV store and attention (causal, sliding window) run
//! on all rows in one launch each. Leaves the last token's final norm in the session's
//! decode buffer, where the output product reads it. Expert layers run `moe.rs` (grouped by
//! expert for long chunks).

use cudarc::driver::CudaSlice;

use super::{CudaModel, CudaSession, DeviceFfn, DeviceLayer, moe};
use crate::attn_ops::{PREFILL_MAX_SPLITS, prefill_splits};
use crate::gemm::{PrefillMode, ProductScratch};
use crate::ops::act_q8_bytes;
use crate::{AttnShape, CudaError};

/// Most tokens one prefill pass holds; longer prompts go in chunks of this many.
const PREFILL_CHUNK: usize = 512;

/// Activation buffers of one prefill chunk (one row per token) and the products' scratch.
#[derive(Debug)]
pub(super) struct PrefillBufs {
    cap: usize,
    /// The products' mode these buffers are sized for (MMQ's operands exist only under it).
    mode: PrefillMode,
    tokens: CudaSlice<i32>,
    x: CudaSlice<f32>,
    xn: CudaSlice<f32>,
    q: CudaSlice<f32>,
    k: CudaSlice<f32>,
    v: CudaSlice<f32>,
    att: CudaSlice<f32>,
    o: CudaSlice<f32>,
    gate: CudaSlice<f32>,
    up: CudaSlice<f32>,
    /// Attention partials: PREFILL_MAX_SPLITS per token and head.
    part: CudaSlice<f32>,
    /// f16 activations, the cuBLAS products' token operand.
    x16: CudaSlice<u16>,
    /// Int8 activations, the MMQ products' token operand (one value under cuBLAS only).
    xq: CudaSlice<u8>,
    /// The products' weight scratch (f16 copy) and MMQ partial sums.
    scratch: ProductScratch,
    /// Routing and expert buffers of the chunk (MoE models).
    moe: Option<moe::MoeBufs>,
}

impl PrefillBufs {
    fn new(m: &CudaModel, cap: usize, mode: PrefillMode) -> Result<PrefillBufs, CudaError> {
        let c = &m.config;
        let s = &m.backend.stream;
        let widest = c.d_model.max(c.q_dim()).max(c.d_ff);
        let biggest = m
            .layers
            .iter()
            .flat_map(DeviceLayer::matrices)
            .filter(|w| w.f16.is_none() && !mode.is_mmq(w))
            .map(|w| w.rows * w.cols)
            .max()
            .unwrap_or(1);
        // MMQ's int8 operand (two planes at most) and its partial sums.
        let (xq, part) = match mode.mmq_planes() {
            Some(planes) => (act_q8_bytes(cap * widest, planes), 2 * cap * widest),
            None => (1, 1),
        };
        Ok(PrefillBufs {
            cap,
            mode,
            tokens: s.alloc_zeros(cap)?,
            x: s.alloc_zeros(cap * c.d_model)?,
            xn: s.alloc_zeros(cap * c.d_model)?,
            q: s.alloc_zeros(cap * c.q_dim())?,
            k: s.alloc_zeros(cap * c.kv_dim())?,
            v: s.alloc_zeros(cap * c.kv_dim())?,
            att: s.alloc_zeros(cap * c.q_dim())?,
            o: s.alloc_zeros(cap * c.d_model)?,
            gate: s.alloc_zeros(cap * c.d_ff)?,
            up: s.alloc_zeros(cap * c.d_ff)?,
            part: s.alloc_zeros(cap * c.n_head * PREFILL_MAX_SPLITS * (c.head_dim + 2))?,
            x16: s.alloc_zeros(cap * widest)?,
            xq: s.alloc_zeros(xq)?,
            scratch: ProductScratch {
                w16: s.alloc_zeros(biggest)?,
                part: s.alloc_zeros(part)?,
            },
            moe: match &c.moe {
                Some(cfg) => Some(moe::MoeBufs::new(&m.backend, c, cfg, cap)?),
                None => None,
            },
        })
    }
}

impl CudaSession<'_> {
    /// Runs `tokens` (checked by `eval`) at positions `n_past..` in chunks, advancing
    /// `n_past` per chunk.
    pub(super) fn prefill(&mut self, tokens: &[u32]) -> Result<(), CudaError> {
        let cap = PREFILL_CHUNK.min(self.ctx);
        let mode = self.model.backend.prefill_mode();
        if self
            .prefill
            .as_ref()
            .is_none_or(|p| p.cap < cap || p.mode != mode)
        {
            self.prefill = Some(PrefillBufs::new(self.model, cap, mode)?);
        }
        let Some(mut pb) = self.prefill.take() else {
            return Err(CudaError::InvalidArgument("no prefill buffers".into()));
        };
        let mut run = Ok(());
        for chunk in tokens.chunks(pb.cap) {
            run = self.prefill_chunk(&mut pb, chunk);
            if run.is_err() {
                break;
            }
            self.n_past += chunk.len();
        }
        self.prefill = Some(pb);
        run
    }

    /// One chunk of at most `pb.cap` tokens at positions `n_past..`.
    fn prefill_chunk(&mut self, pb: &mut PrefillBufs, toks: &[u32]) -> Result<(), CudaError> {
        let m = self.model;
        let c = &m.config;
        let b = &*m.backend;
        let n = toks.len();
        let ids: Vec<i32> = toks.iter().map(|&t| t as i32).collect();
        b.stream
            .memcpy_htod(&ids[..], &mut pb.tokens.slice_mut(..n))?;
        let tp = [0i32, self.n_past as i32];
        b.stream.memcpy_htod(&tp[..], &mut self.tp)?;
        let tp = &self.tp;
        b.embed(&m.embed, &pb.tokens, n, c.embed_scale, &pb.x)?;
        if let Some(l0) = m.layers.first() {
            b.rms_norm(&pb.x, &l0.attn_norm, &pb.xn, n, c.rms_eps)?;
        }
        let (scratch, x16, xq, mode) = (&pb.scratch, &pb.x16, &pb.xq, pb.mode);
        for (l, lw) in m.layers.iter().enumerate() {
            let lc = &c.layers[l];
            mode.prepare(b, &[&lw.wq, &lw.wk, &lw.wv], &pb.xn, n, c.d_model, x16, xq)?;
            mode.product(b, &lw.wq, x16, xq, n, &pb.q, scratch)?;
            mode.product(b, &lw.wk, x16, xq, n, &pb.k, scratch)?;
            mode.product(b, &lw.wv, x16, xq, n, &pb.v, scratch)?;
            if let Some([bq, bk, bv]) = &lw.qkv_bias {
                b.qkv_bias(&pb.q, &pb.k, &pb.v, [bq, bk, bv], n)?;
            }
            if let (Some(qn), Some(kn)) = (&lw.q_norm, &lw.k_norm) {
                b.rms_norm(&pb.q, qn, &pb.q, n * c.n_head, c.rms_eps)?;
                b.rms_norm(&pb.k, kn, &pb.k, n * c.n_kv_head, c.rms_eps)?;
            }
            let shape = AttnShape::new(c.n_head, c.n_kv_head, c.head_dim, c.attn_scale, lc.window)?;
            let (kc, vc) = &self.kv[l];
            b.rope_store(
                n,
                (&shape, c.head_dim),
                &pb.q,
                &pb.k,
                &pb.v,
                kc,
                vc,
                tp,
                lc.rope_base,
                c.rope_style,
                m.rope_factors.as_ref(),
            )?;
            let splits = prefill_splits(&shape, n, self.n_past + n);
            b.attention(
                &shape, &pb.q, kc, vc, &pb.att, &pb.part, tp, n, splits, None,
            )?;
            mode.prepare(b, &[&lw.wo], &pb.att, n, c.q_dim(), x16, xq)?;
            mode.product(b, &lw.wo, x16, xq, n, &pb.o, scratch)?;
            if let Some(ob) = &lw.out_bias {
                b.add_bias(&pb.o, ob, n)?;
            }
            b.residual_norm(
                &pb.x,
                &pb.o,
                lw.post_attn_norm.as_ref(),
                &lw.ffn_norm,
                &pb.xn,
                None,
                n,
                c.rms_eps,
            )?;
            match &lw.ffn {
                DeviceFfn::Dense { gate, up, down } => {
                    mode.prepare(b, &[gate, up], &pb.xn, n, c.d_model, x16, xq)?;
                    mode.product(b, gate, x16, xq, n, &pb.gate, scratch)?;
                    mode.product(b, up, x16, xq, n, &pb.up, scratch)?;
                    b.gated(c.activation, &pb.gate, &pb.up, n * c.d_ff)?;
                    mode.prepare(b, &[down], &pb.gate, n, c.d_ff, x16, xq)?;
                    mode.product(b, down, x16, xq, n, &pb.o, scratch)?;
                }
                DeviceFfn::Moe(mw) => {
                    let (Some(cfg), Some(mb)) = (&c.moe, pb.moe.as_mut()) else {
                        return Err(CudaError::InvalidArgument(
                            "expert weights without expert settings".into(),
                        ));
                    };
                    moe::prefill_ffn(b, cfg, c.activation, mw, mb, &pb.xn, n, &pb.o)?;
                }
            }
            let next = m
                .layers
                .get(l + 1)
                .map_or(&m.output_norm, |nl| &nl.attn_norm);
            b.residual_norm(
                &pb.x,
                &pb.o,
                lw.post_ffn_norm.as_ref(),
                next,
                &pb.xn,
                None,
                n,
                c.rms_eps,
            )?;
        }
        if m.layers.is_empty() {
            b.rms_norm(&pb.x, &m.output_norm, &pb.xn, n, c.rms_eps)?;
        }
        let d = c.d_model;
        b.stream
            .memcpy_dtod(&pb.xn.slice((n - 1) * d..n * d), &mut self.buf.xn)?;
        Ok(())
    }
}
