//! The mixture-of-experts FFN of the CUDA forward pass (Mixtral, Qwen3-MoE), mirroring
//! `ferrite_model`'s `moe::ffn`: router logits in f32, softmax over all experts, the top
//! `k` (ties to the lower id), optionally renormalised, then each token's selected experts'
//! gated FFNs weighted and summed in selection order. Routing stays on the device, so the
//! decode step is still one captured graph and reads only the selected experts' weights.
//!
//! Prefill routes all the chunk's tokens on the device too. Short chunks (fewer than
//! [`GROUPED_FROM`] (token, slot) pairs) then run the decode kernels over every pair at
//! once, each pair reading its expert's rows itself. Longer ones copy the selection to the
//! host, group the pairs by expert (a counting sort, as the CPU backend does) and run one
//! cuBLAS GEMM per used expert and projection on f16 operands, so each used expert's
//! weights are read once per chunk; the outputs are weighted and summed per token in
//! selection order.

use cudarc::driver::CudaSlice;
use ferrite_arch::TensorRole;
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
    let n = |r: TensorRole| r.weight(i);
    let e = moe.n_expert;
    Ok(DeviceMoe {
        router: super::upload_matrix(b, g, &n(TensorRole::FfnGateInp), e, c.d_model)?,
        gate: upload_experts(b, g, &n(TensorRole::FfnGateExps), c.d_ff, c.d_model, e)?,
        up: upload_experts(b, g, &n(TensorRole::FfnUpExps), c.d_ff, c.d_model, e)?,
        down: upload_experts(b, g, &n(TensorRole::FfnDownExps), c.d_model, c.d_ff, e)?,
    })
}

/// (Token, slot) pairs of a prefill chunk from which it groups them by expert. A guess,
/// not a measurement: grouping costs a host round trip and an f16 copy of each used
/// expert, and pays once several tokens share an expert.
const GROUPED_FROM: usize = 64;

/// Routing and expert activations of up to `rows` tokens.
#[derive(Debug)]
pub(super) struct MoeBufs {
    rows: usize,
    logits: CudaSlice<f32>,
    sel: CudaSlice<i32>,
    wts: CudaSlice<f32>,
    /// Gated expert inputs, one row of `d_ff` per (token, slot).
    gate: CudaSlice<f32>,
    /// Buffers of the grouped path (prefill only).
    grouped: Option<GroupedBufs>,
}

/// Buffers of the expert-grouped prefill path.
#[derive(Debug)]
struct GroupedBufs {
    /// Pair id (token · k + slot) of each grouped row.
    order: CudaSlice<i32>,
    /// Grouped row of each pair.
    pos: CudaSlice<i32>,
    /// f16 GEMM inputs: gathered rows, then the gated activations.
    x16: CudaSlice<u16>,
    /// One expert matrix as f16.
    w16: CudaSlice<u16>,
    /// Up products, grouped rows.
    up: CudaSlice<f32>,
    /// Down products, grouped rows.
    ys: CudaSlice<f32>,
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
        let grouped = if pairs >= GROUPED_FROM && b.blas.is_ok() {
            Some(GroupedBufs {
                order: s.alloc_zeros(pairs)?,
                pos: s.alloc_zeros(pairs)?,
                x16: s.alloc_zeros(pairs * c.d_model.max(c.d_ff))?,
                w16: s.alloc_zeros(c.d_model * c.d_ff)?,
                up: s.alloc_zeros(pairs * c.d_ff)?,
                ys: s.alloc_zeros(pairs * c.d_model)?,
            })
        } else {
            None
        };
        Ok(MoeBufs {
            rows,
            logits: s.alloc_zeros(rows * moe.n_expert)?,
            sel: s.alloc_zeros(pairs)?,
            wts: s.alloc_zeros(pairs)?,
            gate: s.alloc_zeros(pairs * c.d_ff)?,
            grouped,
        })
    }
}

/// The expert FFN of `n` normalised rows `xn` (`n × d_model`) into `out`, grouped by
/// expert when there are enough pairs (see the module doc).
#[allow(clippy::too_many_arguments)]
pub(super) fn prefill_ffn(
    b: &CudaBackend,
    cfg: &MoeConfig,
    act: Activation,
    w: &DeviceMoe,
    bufs: &mut MoeBufs,
    xn: &CudaSlice<f32>,
    n: usize,
    out: &CudaSlice<f32>,
) -> Result<(), CudaError> {
    let k = cfg.n_expert_used;
    if n * k < GROUPED_FROM || bufs.grouped.is_none() {
        return ffn(b, cfg, act, w, bufs, xn, n, out);
    }
    route(b, cfg, w, bufs, xn, n)?;
    let pairs = n * k;
    let sel = b.stream.clone_dtoh(&bufs.sel.slice(..pairs))?;
    let ne = cfg.n_expert;
    // Counting sort of the pairs by expert.
    let mut start = vec![0usize; ne + 1];
    for &e in &sel {
        let e = usize::try_from(e)
            .ok()
            .filter(|&e| e < ne)
            .ok_or_else(|| CudaError::InvalidArgument(format!("routed to expert {e}")))?;
        start[e + 1] += 1;
    }
    for e in 0..ne {
        start[e + 1] += start[e];
    }
    let mut fill = start.clone();
    let (mut order, mut pos) = (vec![0i32; pairs], vec![0i32; pairs]);
    for (i, &e) in sel.iter().enumerate() {
        let e = e as usize;
        order[fill[e]] = i as i32;
        pos[i] = fill[e] as i32;
        fill[e] += 1;
    }
    let Some(gb) = bufs.grouped.as_mut() else {
        return Err(CudaError::InvalidArgument(
            "no grouped expert buffers".into(),
        ));
    };
    b.stream
        .memcpy_htod(&order[..], &mut gb.order.slice_mut(..pairs))?;
    b.stream
        .memcpy_htod(&pos[..], &mut gb.pos.slice_mut(..pairs))?;
    let (d, ff) = (w.down.rows, w.gate.rows);
    b.moe_gather_f16(xn, &gb.order, &gb.x16, d, k, pairs)?;
    let used = || (0..ne).filter(|&e| start[e + 1] > start[e]);
    for e in used() {
        let (r0, m) = (start[e], start[e + 1] - start[e]);
        let x = gb.x16.slice(r0 * d..(r0 + m) * d);
        b.dequant_expert_f16(&w.gate, e, &gb.w16)?;
        b.gemm_f16(
            &gb.w16,
            ff,
            d,
            &x,
            m,
            &bufs.gate.slice(r0 * ff..(r0 + m) * ff),
        )?;
        b.dequant_expert_f16(&w.up, e, &gb.w16)?;
        b.gemm_f16(&gb.w16, ff, d, &x, m, &gb.up.slice(r0 * ff..(r0 + m) * ff))?;
    }
    b.gated(act, &bufs.gate, &gb.up, pairs * ff)?;
    b.to_f16(&bufs.gate, &gb.x16, pairs * ff)?;
    for e in used() {
        let (r0, m) = (start[e], start[e + 1] - start[e]);
        let x = gb.x16.slice(r0 * ff..(r0 + m) * ff);
        b.dequant_expert_f16(&w.down, e, &gb.w16)?;
        b.gemm_f16(&gb.w16, d, ff, &x, m, &gb.ys.slice(r0 * d..(r0 + m) * d))?;
    }
    b.moe_combine(&gb.ys, &gb.pos, &bufs.wts, out, d, k, n)
}

/// Router logits and routing of `n` rows into `bufs.sel` and `bufs.wts`.
fn route(
    b: &CudaBackend,
    cfg: &MoeConfig,
    w: &DeviceMoe,
    bufs: &MoeBufs,
    xn: &CudaSlice<f32>,
    n: usize,
) -> Result<(), CudaError> {
    if n > bufs.rows {
        return Err(CudaError::InvalidArgument(format!(
            "{n} rows through expert buffers of {}",
            bufs.rows
        )));
    }
    b.matvec_rows(&w.router, xn, n, &bufs.logits)?;
    b.moe_route(
        &bufs.logits,
        &bufs.sel,
        &bufs.wts,
        n,
        cfg.n_expert,
        cfg.n_expert_used,
        cfg.rule.norm_topk,
    )
}

/// The expert FFN of `n` normalised rows `xn` (`n × d_model`) into `out`, every (token,
/// slot) pair reading its expert's rows (decode, short prefill chunks).
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
    let k = cfg.n_expert_used;
    route(b, cfg, w, bufs, xn, n)?;
    b.moe_gated(act, &w.gate, &w.up, xn, &bufs.gate, &bufs.sel, n, k)?;
    b.moe_down(&w.down, &bufs.gate, out, &bufs.sel, &bufs.wts, n, k)
}
