//! The mixture-of-experts FFN of the CUDA forward pass (Mixtral, Qwen3-MoE), mirroring
//! `ferrite_model`'s `moe::ffn`: router logits in f32, softmax over all experts, the top
//! `k` (ties to the lower id), optionally renormalised, then each token's selected experts'
//! gated FFNs weighted and summed in selection order. Routing stays on the device, so the
//! decode step is still one captured graph and reads only the selected experts' weights.
//!
//! Prefill runs the same kernels over all the chunk's (token, slot) pairs in one launch
//! each: every pair reads its expert's rows itself (per-token expert products, f32
//! activations), rather than grouping tokens by expert into GEMMs.

use cudarc::driver::CudaSlice;
use ferrite_gguf::Gguf;
use ferrite_model::{Activation, ModelConfig, MoeConfig};

use crate::arch_ops::DeviceExperts;
use crate::ops::DeviceMatrix;
use crate::{CudaBackend, CudaError};

/// The expert weights of one layer.
#[derive(Debug)]
pub(super) struct DeviceMoe {
    /// Router `n_expert × d_model` (`ffn_gate_inp`).
    pub(super) router: DeviceMatrix,
    pub(super) gate: DeviceExperts,
    pub(super) up: DeviceExperts,
    pub(super) down: DeviceExperts,
}

impl DeviceMoe {
    /// Bytes of the whole layer (router and every expert).
    pub(super) fn bytes(&self) -> u64 {
        [&self.gate, &self.up, &self.down]
            .iter()
            .map(|e| e.data.len() as u64)
            .sum::<u64>()
            + self.router.data.len() as u64
    }

    /// Bytes one token's decode step reads: the router and `k` experts' three matrices.
    pub(super) fn decode_bytes(&self, k: usize) -> u64 {
        let per: u64 = [&self.gate, &self.up, &self.down]
            .iter()
            .map(|e| e.expert_bytes)
            .sum();
        self.router.data.len() as u64 + k as u64 * per
    }
}

fn upload_experts(
    b: &CudaBackend,
    g: &Gguf,
    name: &str,
    rows: usize,
    cols: usize,
    n_expert: usize,
) -> Result<DeviceExperts, CudaError> {
    let t = g
        .tensor(name)
        .ok_or_else(|| ferrite_model::ModelError::MissingTensor(name.to_owned()))?;
    if t.dims != [cols as u64, rows as u64, n_expert as u64] {
        return Err(CudaError::InvalidArgument(format!(
            "{name}: dims {:?}, expected [{cols}, {rows}, {n_expert}]",
            t.dims
        )));
    }
    if crate::device::kernel_suffix(t.ty).is_none() {
        return Err(CudaError::UnsupportedType {
            name: name.to_owned(),
            ty: t.ty,
        });
    }
    b.upload_experts(t.ty, rows, cols, n_expert, g.tensor_data(t))
        .map_err(|e| CudaError::InvalidArgument(format!("{name}: {e}")))
}

/// Uploads layer `i`'s router and expert stacks.
pub(super) fn load(
    b: &CudaBackend,
    g: &Gguf,
    c: &ModelConfig,
    moe: &MoeConfig,
    i: usize,
) -> Result<DeviceMoe, CudaError> {
    let n = |s: &str| format!("blk.{i}.{s}.weight");
    let e = moe.n_expert;
    Ok(DeviceMoe {
        router: super::upload_matrix(b, g, &n("ffn_gate_inp"), e, c.d_model)?,
        gate: upload_experts(b, g, &n("ffn_gate_exps"), c.d_ff, c.d_model, e)?,
        up: upload_experts(b, g, &n("ffn_up_exps"), c.d_ff, c.d_model, e)?,
        down: upload_experts(b, g, &n("ffn_down_exps"), c.d_model, c.d_ff, e)?,
    })
}

/// Routing and expert activations of up to `rows` tokens.
#[derive(Debug)]
pub(super) struct MoeBufs {
    rows: usize,
    logits: CudaSlice<f32>,
    sel: CudaSlice<i32>,
    wts: CudaSlice<f32>,
    /// Gated expert inputs, one row of `d_ff` per (token, slot).
    gate: CudaSlice<f32>,
}

impl MoeBufs {
    pub(super) fn new(
        b: &CudaBackend,
        c: &ModelConfig,
        moe: &MoeConfig,
        rows: usize,
    ) -> Result<MoeBufs, CudaError> {
        let s = &b.stream;
        let pairs = rows * moe.n_expert_used;
        Ok(MoeBufs {
            rows,
            logits: s.alloc_zeros(rows * moe.n_expert)?,
            sel: s.alloc_zeros(pairs)?,
            wts: s.alloc_zeros(pairs)?,
            gate: s.alloc_zeros(pairs * c.d_ff)?,
        })
    }
}

/// The expert FFN of `n` normalised rows `xn` (`n × d_model`) into `out`.
#[allow(clippy::too_many_arguments)]
pub(super) fn ffn(
    b: &CudaBackend,
    cfg: &MoeConfig,
    act: Activation,
    w: &DeviceMoe,
    bufs: &MoeBufs,
    xn: &CudaSlice<f32>,
    n: usize,
    out: &CudaSlice<f32>,
) -> Result<(), CudaError> {
    if n > bufs.rows {
        return Err(CudaError::InvalidArgument(format!(
            "{n} rows through expert buffers of {}",
            bufs.rows
        )));
    }
    let k = cfg.n_expert_used;
    b.matvec_rows(&w.router, xn, n, &bufs.logits)?;
    b.moe_route(
        &bufs.logits,
        &bufs.sel,
        &bufs.wts,
        n,
        cfg.n_expert,
        k,
        cfg.norm_topk,
    )?;
    b.moe_gated(act, &w.gate, &w.up, xn, &bufs.gate, &bufs.sel, n, k)?;
    b.moe_down(&w.down, &bufs.gate, out, &bufs.sel, &bufs.wts, n, k)
}
