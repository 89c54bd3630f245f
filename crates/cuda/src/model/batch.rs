//! [`CudaBatch`]: one decode step for several [`CudaSession`]s at once, each taking one new
//! token, in one forward pass (the server's continuous batching).
//!
//! Every weight matrix is read once per step for up to eight sessions (`bmv_*` in
//! `kernels/batch.cu`: the single-column kernels' unit dot products, summed in the same
//! order for each column, so every session gets the logits it would get alone, bit for
//! bit). Element-wise and per-row ops run over all rows in one launch; rope, the KV store
//! and attention take one launch per layer over all sessions, each reading its own
//! position, caches and key splits from small device tables (`tps`, `splits`, `kvt`)
//! rewritten before every step. Because nothing per-step lives in the kernels' arguments,
//! a step is captured once per (batch size, widest key split) as a CUDA graph and replayed.
//!
//! Mixture-of-experts models are stepped session by session (their expert kernels take one
//! token per launch here); so are batches larger than the capacity given at creation.

use std::collections::HashMap;

use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::{CudaGraph, CudaSlice, DevicePtr, LaunchConfig, PushKernelArg};
use ferrite_gguf::GgmlType;
use ferrite_model::Activation;
use ferrite_model::ops::RopeStyle;

use super::{CudaModel, CudaSession, DeviceFfn, StepGraph};
use crate::attn_ops::ATT_TILE;
use crate::decode::{ATTD_MAX_SPLITS, ATTD_THREADS, decode_kernel};
use crate::device::{grid_1d, weight_kernels};
use crate::ops::{ActQ, DeviceMatrix, act_q8_bytes, matvec_split};
use crate::{Activations, AttnShape, CudaBackend, CudaError};

/// Columns one batched product launch takes (BMV_COLS in batch.cu).
const BMV_COLS: usize = 8;
/// Most key splits of decode attention (`decode_splits` clamps to it).
const MAX_SPLITS: usize = ATTD_MAX_SPLITS;

/// The batched kernels, loaded with the others by [`CudaBackend::new`].
pub(crate) const BATCH_KERNELS: &[&str] = &[
    "bmv_q4_1",
    "bmv_gated_q4_1",
    "bmv_q8_0",
    "bmv_gated_q8_0",
    "bmv_q4_0",
    "bmv_gated_q4_0",
    "bmv_q5_0",
    "bmv_gated_q5_0",
    "bmv_q4_k",
    "bmv_gated_q4_k",
    "bmv_q6_k",
    "bmv_gated_q6_k",
    "bmv_f32",
    "bmv_gated_f32",
    "bmv_f16",
    "bmv_gated_f16",
    "bmv_bf16",
    "bmv_gated_bf16",
    "bmv_i8_q4_1",
    "bmv_gated_i8_q4_1",
    "bmv_i8_q8_0",
    "bmv_gated_i8_q8_0",
    "bmv_i8_q4_k",
    "bmv_gated_i8_q4_k",
    "bmv_i8_q6_k",
    "bmv_gated_i8_q6_k",
    "bmv_i8x2_q4_1",
    "bmv_gated_i8x2_q4_1",
    "bmv_i8x2_q8_0",
    "bmv_gated_i8x2_q8_0",
    "bmv_i8x2_q4_k",
    "bmv_gated_i8x2_q4_k",
    "bmv_i8x2_q6_k",
    "bmv_gated_i8x2_q6_k",
    "brope_store_f16",
    "battn_f16",
    "battn_combine",
    "battn_decode_f16_64",
    "battn_decode_f16_128",
    "battn_decode_f16_256",
];

/// The batched product and gated kernels of a weight type over f32 activations, or over
/// int8 blocks of `planes` planes (`None` when that type has no int8 kernels, as in
/// `i8_kernels`).
fn bmv_kernels(ty: GgmlType, planes: usize) -> Option<(&'static str, &'static str)> {
    use GgmlType as T;
    Some(match (ty, planes) {
        (T::Q4_1, 0) => ("bmv_q4_1", "bmv_gated_q4_1"),
        (T::Q8_0, 0) => ("bmv_q8_0", "bmv_gated_q8_0"),
        (T::Q4_0, 0) => ("bmv_q4_0", "bmv_gated_q4_0"),
        (T::Q5_0, 0) => ("bmv_q5_0", "bmv_gated_q5_0"),
        (T::Q4_K, 0) => ("bmv_q4_k", "bmv_gated_q4_k"),
        (T::Q6_K, 0) => ("bmv_q6_k", "bmv_gated_q6_k"),
        (T::F32, 0) => ("bmv_f32", "bmv_gated_f32"),
        (T::F16, 0) => ("bmv_f16", "bmv_gated_f16"),
        (T::BF16, 0) => ("bmv_bf16", "bmv_gated_bf16"),
        (T::Q4_1, 1) => ("bmv_i8_q4_1", "bmv_gated_i8_q4_1"),
        (T::Q8_0, 1) => ("bmv_i8_q8_0", "bmv_gated_i8_q8_0"),
        (T::Q4_K, 1) => ("bmv_i8_q4_k", "bmv_gated_i8_q4_k"),
        (T::Q6_K, 1) => ("bmv_i8_q6_k", "bmv_gated_i8_q6_k"),
        (T::Q4_1, 2) => ("bmv_i8x2_q4_1", "bmv_gated_i8x2_q4_1"),
        (T::Q8_0, 2) => ("bmv_i8x2_q8_0", "bmv_gated_i8x2_q8_0"),
        (T::Q4_K, 2) => ("bmv_i8x2_q4_k", "bmv_gated_i8x2_q4_k"),
        (T::Q6_K, 2) => ("bmv_i8x2_q6_k", "bmv_gated_i8x2_q6_k"),
        _ => return None,
    })
}

/// The kernel pair a product of `w` takes: int8 when `xq` is given and the type has int8
/// kernels (as `CudaBackend::matvec` decides), else f32.
fn pick<'a>(
    w: &DeviceMatrix,
    xq: Option<ActQ<'a>>,
) -> Result<((&'static str, &'static str), Option<ActQ<'a>>), CudaError> {
    if let Some(q) = xq
        && let Some(k) = bmv_kernels(w.ty, q.planes)
    {
        return Ok((k, Some(q)));
    }
    bmv_kernels(w.ty, 0)
        .map(|k| (k, None))
        .ok_or_else(|| CudaError::UnsupportedType {
            name: "matrix".into(),
            ty: w.ty,
        })
}

impl CudaBackend {
    /// `y[c] = W · x[c]` for the `n` columns of `x` (f32, `w.cols` apart) or of their int8
    /// blocks `xq`, splitting each row's sum over `ks` warps like the one-column product;
    /// launches of at most [`BMV_COLS`] columns.
    fn bmv(
        &self,
        w: &DeviceMatrix,
        x: &CudaSlice<f32>,
        xq: Option<ActQ<'_>>,
        y: &CudaSlice<f32>,
        n: usize,
        ks: usize,
    ) -> Result<(), CudaError> {
        let ((name, _), q) = pick(w, xq)?;
        if x.len() < n * w.cols || y.len() < n * w.rows {
            return Err(CudaError::InvalidArgument(format!(
                "batched product of {n} columns: buffers too small"
            )));
        }
        let ntot = i32::try_from(n * w.cols)
            .map_err(|_| CudaError::InvalidArgument("batch activations too large".into()))?;
        let ks32 = ks as i32;
        let cfg = LaunchConfig {
            grid_dim: ((w.rows * ks).div_ceil(4) as u32, 1, 1),
            block_dim: (128, 1, 1),
            shared_mem_bytes: 0,
        };
        self.launch_columns(name, cfg, &[w], x, q, y, ks32, n, ntot)
    }

    /// `y[c] = act(Wg · x[c]) · (Wu · x[c])` for `n` columns: one kernel when the two
    /// matrices share type and shape (as `CudaBackend::matvec_gated`), else two products
    /// (the second into `scratch`) and the element-wise gate.
    #[allow(clippy::too_many_arguments)]
    fn bmv_gated(
        &self,
        act: Activation,
        wg: &DeviceMatrix,
        wu: &DeviceMatrix,
        x: &CudaSlice<f32>,
        xq: Option<ActQ<'_>>,
        y: &CudaSlice<f32>,
        scratch: &CudaSlice<f32>,
        n: usize,
    ) -> Result<(), CudaError> {
        let same = wg.ty == wu.ty && wg.rows == wu.rows && wg.cols == wu.cols;
        if !same || weight_kernels(wg.ty).is_none() {
            self.bmv(wg, x, xq, y, n, matvec_split(wg))?;
            self.bmv(wu, x, xq, scratch, n, matvec_split(wu))?;
            return self.gated(act, y, scratch, n * wg.rows);
        }
        let ((_, name), q) = pick(wg, xq)?;
        if x.len() < n * wg.cols || y.len() < n * wg.rows {
            return Err(CudaError::InvalidArgument(format!(
                "batched gated product of {n} columns: buffers too small"
            )));
        }
        let ntot = i32::try_from(n * wg.cols)
            .map_err(|_| CudaError::InvalidArgument("batch activations too large".into()))?;
        let a = crate::arch_ops::act_code(act)?;
        let cfg = LaunchConfig {
            grid_dim: (wg.rows.div_ceil(4) as u32, 1, 1),
            block_dim: (128, 1, 1),
            shared_mem_bytes: 0,
        };
        self.launch_columns(name, cfg, &[wg, wu], x, q, y, a, n, ntot)
    }

    /// Launches the batched product `name` over `n` columns, at most [`BMV_COLS`] per
    /// launch. Its arguments: the weights' data, x or its int8 blocks `q`, y, the first
    /// matrix's rows, columns and row bytes, the kernel's own `extra` (key splits, or the
    /// activation), the launch's first column and count, and `ntot` (n × cols). The callers
    /// check the buffers against `n` and give matrices of one shape.
    #[allow(clippy::too_many_arguments)]
    fn launch_columns(
        &self,
        name: &str,
        cfg: LaunchConfig,
        weights: &[&DeviceMatrix],
        x: &CudaSlice<f32>,
        q: Option<ActQ<'_>>,
        y: &CudaSlice<f32>,
        extra: i32,
        n: usize,
        ntot: i32,
    ) -> Result<(), CudaError> {
        let Some(w) = weights.first() else {
            return Err(CudaError::InvalidArgument(
                "batched product of no matrix".into(),
            ));
        };
        let (rows, cols) = (w.rows as i32, w.cols as i32);
        for c0 in (0..n).step_by(BMV_COLS) {
            let (c0_32, nc32) = (c0 as i32, (n - c0).min(BMV_COLS) as i32);
            let mut b = self.kernel(name)?;
            for m in weights {
                b.arg(&m.data);
            }
            match q {
                Some(q) => b.arg(q.buf),
                None => b.arg(x),
            };
            b.arg(y)
                .arg(&rows)
                .arg(&cols)
                .arg(&w.row_bytes)
                .arg(&extra)
                .arg(&c0_32)
                .arg(&nc32)
                .arg(&ntot);
            // SAFETY: every matrix has rows × row_bytes bytes (one shape, checked at upload
            // and by the callers); x (or its int8 blocks) holds n × cols values and y
            // n × rows (checked by the callers, which size xq for n × cols).
            unsafe { b.launch(cfg) }?;
        }
        Ok(())
    }
}

/// Device buffers of a batch of up to `cap` sessions, column-major by session.
#[derive(Debug)]
struct BatchBufs {
    x: CudaSlice<f32>,
    xn: CudaSlice<f32>,
    q: CudaSlice<f32>,
    k: CudaSlice<f32>,
    v: CudaSlice<f32>,
    att: CudaSlice<f32>,
    o: CudaSlice<f32>,
    gate: CudaSlice<f32>,
    up: CudaSlice<f32>,
    part: CudaSlice<f32>,
    /// Split counters of the decode attention kernel: n_head per session, zero between
    /// launches.
    att_cnt: CudaSlice<u32>,
    logits: CudaSlice<f32>,
    xq: CudaSlice<u8>,
    /// Session s's new token at `tokens[s]`.
    tokens: CudaSlice<i32>,
    /// `[token, position]` of session s at `tps[2s..]`.
    tps: CudaSlice<i32>,
    /// Key splits of session s's attention.
    splits: CudaSlice<i32>,
    /// Device addresses of the caches: layer l's key caches at `kvt[2l·cap..]`, its value
    /// caches at `kvt[(2l+1)·cap..]`, one per session.
    kvt: CudaSlice<u64>,
}

/// Steps several [`CudaSession`]s of one [`CudaModel`] by one token each in one forward pass.
pub struct CudaBatch<'m> {
    model: &'m CudaModel,
    cap: usize,
    buf: BatchBufs,
    /// Captured steps by (sessions, widest key split), with the activations they were
    /// recorded with.
    graphs: HashMap<(usize, usize), (StepGraph, Activations)>,
    replays: u64,
}

impl std::fmt::Debug for CudaBatch<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaBatch")
            .field("cap", &self.cap)
            .field("graphs", &self.graphs.len())
            .field("replays", &self.replays)
            .finish_non_exhaustive()
    }
}

impl<'m> CudaBatch<'m> {
    /// Buffers for steps of up to `cap` sessions of `model`.
    pub fn new(model: &'m CudaModel, cap: usize) -> Result<CudaBatch<'m>, CudaError> {
        let c = &model.config;
        if cap == 0 || i32::try_from(cap * c.n_vocab.max(c.d_ff)).is_err() {
            return Err(CudaError::InvalidArgument(format!(
                "batch of {cap} sessions"
            )));
        }
        let s = &model.backend.stream;
        let widest = c.d_model.max(c.q_dim()).max(c.d_ff);
        let buf = BatchBufs {
            x: s.alloc_zeros(cap * c.d_model)?,
            xn: s.alloc_zeros(cap * c.d_model)?,
            q: s.alloc_zeros(cap * c.q_dim())?,
            k: s.alloc_zeros(cap * c.kv_dim())?,
            v: s.alloc_zeros(cap * c.kv_dim())?,
            att: s.alloc_zeros(cap * c.q_dim())?,
            o: s.alloc_zeros(cap * c.d_model)?,
            gate: s.alloc_zeros(cap * c.d_ff)?,
            up: s.alloc_zeros(cap * c.d_ff)?,
            part: s.alloc_zeros(cap * c.n_head * MAX_SPLITS * (c.head_dim + 2))?,
            att_cnt: s.alloc_zeros(cap * c.n_head.max(1))?,
            logits: s.alloc_zeros(cap * c.n_vocab)?,
            xq: s.alloc_zeros(act_q8_bytes(cap * widest, 2))?,
            tokens: s.alloc_zeros(cap)?,
            tps: s.alloc_zeros(2 * cap)?,
            splits: s.alloc_zeros(cap)?,
            kvt: s.alloc_zeros(2 * c.n_layer * cap)?,
        };
        Ok(CudaBatch {
            model,
            cap,
            buf,
            graphs: HashMap::new(),
            replays: 0,
        })
    }

    /// Most sessions one batched pass takes.
    pub fn capacity(&self) -> usize {
        self.cap
    }

    /// Batched steps run so far (graph replays; a step of one session, a larger batch than
    /// the capacity and expert models go session by session and are not counted).
    pub fn replays(&self) -> u64 {
        self.replays
    }

    /// Appends `tokens[i]` to `sessions[i]` for every `i` and returns each session's
    /// logits after it, in order: the logits each would get from
    /// [`CudaSession::eval`]`(&[tokens[i]])` alone. Sessions may hold different numbers of
    /// tokens. On error no session has advanced.
    pub fn step(
        &mut self,
        sessions: &mut [&mut CudaSession<'m>],
        tokens: &[u32],
    ) -> Result<Vec<Vec<f32>>, CudaError> {
        let c = &self.model.config;
        if sessions.len() != tokens.len() {
            return Err(CudaError::InvalidArgument(format!(
                "{} sessions and {} tokens",
                sessions.len(),
                tokens.len()
            )));
        }
        for (s, &t) in sessions.iter().zip(tokens) {
            if !std::ptr::eq(s.model, self.model) {
                return Err(CudaError::InvalidArgument(
                    "a session of another model in the batch".into(),
                ));
            }
            if s.n_past >= s.ctx {
                return Err(CudaError::InvalidArgument(format!(
                    "context full: {} cached + 1 new > {}",
                    s.n_past, s.ctx
                )));
            }
            if t as usize >= c.n_vocab {
                return Err(CudaError::InvalidArgument(format!(
                    "token {t} outside a vocabulary of {}",
                    c.n_vocab
                )));
            }
        }
        let n = sessions.len();
        if n <= 1 || n > self.cap || c.moe.is_some() {
            return sessions
                .iter_mut()
                .zip(tokens)
                .map(|(s, &t)| s.eval(&[t]))
                .collect();
        }
        self.run(sessions, tokens)?;
        let b = &*self.model.backend;
        let v = c.n_vocab;
        for (i, s) in sessions.iter_mut().enumerate() {
            b.stream.memcpy_dtod(
                &self.buf.logits.slice(i * v..(i + 1) * v),
                &mut s.buf.logits,
            )?;
            s.n_past += 1;
            s.history.push(tokens[i]);
            s.has_logits = true;
        }
        let all = b.stream.clone_dtoh(&self.buf.logits.slice(..n * v))?;
        Ok(all.chunks(v).map(<[f32]>::to_vec).collect())
    }

    /// Writes the step's tables and replays (capturing first if needed) the step of
    /// `sessions.len()` sessions, leaving their logits in `buf.logits`.
    fn run(&mut self, sessions: &[&mut CudaSession<'m>], tokens: &[u32]) -> Result<(), CudaError> {
        let m = self.model;
        let b = &*m.backend;
        let n = sessions.len();
        let ids: Vec<i32> = tokens.iter().map(|&t| t as i32).collect();
        let tps: Vec<i32> = sessions
            .iter()
            .zip(&ids)
            .flat_map(|(s, &t)| [t, s.n_past as i32])
            .collect();
        let splits: Vec<i32> = sessions.iter().map(|s| s.splits as i32).collect();
        let max_splits = sessions.iter().map(|s| s.splits).max().unwrap_or(1);
        let mut kvt = vec![0u64; 2 * m.layers.len() * self.cap];
        for (i, s) in sessions.iter().enumerate() {
            for (l, (kc, vc)) in s.kv.iter().enumerate() {
                kvt[2 * l * self.cap + i] = kc.device_ptr(&b.stream).0;
                kvt[(2 * l + 1) * self.cap + i] = vc.device_ptr(&b.stream).0;
            }
        }
        b.stream.memcpy_htod(&ids[..], &mut self.buf.tokens)?;
        b.stream.memcpy_htod(&tps[..], &mut self.buf.tps)?;
        b.stream.memcpy_htod(&splits[..], &mut self.buf.splits)?;
        b.stream.memcpy_htod(&kvt[..], &mut self.buf.kvt)?;
        let act = sessions[0].activations();
        let key = (n, max_splits);
        if self.graphs.get(&key).is_none_or(|(_, a)| *a != act) {
            self.graphs.remove(&key);
            let g = self.capture(n, max_splits, act)?;
            self.graphs.insert(key, (StepGraph(g), act));
        }
        if let Some((StepGraph(g), _)) = self.graphs.get(&key) {
            g.launch()?;
            self.replays += 1;
        }
        Ok(())
    }

    /// Records the step of `n` sessions into a CUDA graph.
    fn capture(
        &self,
        n: usize,
        max_splits: usize,
        act: Activations,
    ) -> Result<CudaGraph, CudaError> {
        let s = &self.model.backend.stream;
        s.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)?;
        let recorded = self.record(n, max_splits, act);
        let graph = s.end_capture(CUgraphInstantiate_flags(0));
        recorded?;
        graph?.ok_or_else(|| CudaError::InvalidArgument("graph capture recorded nothing".into()))
    }

    /// The kernels of one step of `n` sessions, as `CudaSession::record_step` for each
    /// column, then the output product into `buf.logits`.
    fn record(&self, n: usize, max_splits: usize, act: Activations) -> Result<(), CudaError> {
        let m = self.model;
        let c = &m.config;
        let b = &*m.backend;
        let u = &self.buf;
        let xq = (act.planes() > 0).then_some(ActQ {
            buf: &u.xq,
            planes: act.planes(),
        });
        let quantize = |x: &CudaSlice<f32>, len: usize| match xq {
            Some(q) => b.quantize_act(x, q, n * len),
            None => Ok(()),
        };
        b.embed(&m.embed, &u.tokens, n, c.embed_scale, &u.x)?;
        if let Some(l0) = m.layers.first() {
            b.rms_norm(&u.x, &l0.attn_norm, &u.xn, n, c.rms_eps)?;
            quantize(&u.xn, c.d_model)?;
        }
        for (l, lw) in m.layers.iter().enumerate() {
            let lc = &c.layers[l];
            // One launch of matvec3 sums each row in one warp; separate products split it
            // like matvec.
            let fused = weight_kernels(lw.wq.ty).is_some()
                && [&lw.wk, &lw.wv]
                    .iter()
                    .all(|w| w.ty == lw.wq.ty && w.cols == lw.wq.cols);
            for (w, y) in [(&lw.wq, &u.q), (&lw.wk, &u.k), (&lw.wv, &u.v)] {
                b.bmv(w, &u.xn, xq, y, n, if fused { 1 } else { matvec_split(w) })?;
            }
            if let Some([bq, bk, bv]) = &lw.qkv_bias {
                b.qkv_bias(&u.q, &u.k, &u.v, [bq, bk, bv], n)?;
            }
            if let (Some(qn), Some(kn)) = (&lw.q_norm, &lw.k_norm) {
                b.rms_norm(&u.q, qn, &u.q, n * c.n_head, c.rms_eps)?;
                b.rms_norm(&u.k, kn, &u.k, n * c.n_kv_head, c.rms_eps)?;
            }
            let shape = AttnShape::new(c.n_head, c.n_kv_head, c.head_dim, c.attn_scale, lc.window)?;
            let kt = u.kvt.slice(2 * l * self.cap..(2 * l + 1) * self.cap);
            let vt = u.kvt.slice((2 * l + 1) * self.cap..(2 * l + 2) * self.cap);
            self.rope_store(n, &shape, &kt, &vt, lc.rope_base)?;
            if !self.attention(n, max_splits, &shape, &kt, &vt, xq)? {
                quantize(&u.att, c.q_dim())?;
            }
            b.bmv(&lw.wo, &u.att, xq, &u.o, n, matvec_split(&lw.wo))?;
            if let Some(ob) = &lw.out_bias {
                b.add_bias(&u.o, ob, n)?;
            }
            b.residual_norm(
                &u.x,
                &u.o,
                lw.post_attn_norm.as_ref(),
                &lw.ffn_norm,
                &u.xn,
                None,
                n,
                c.rms_eps,
            )?;
            quantize(&u.xn, c.d_model)?;
            let DeviceFfn::Dense { gate, up, down } = &lw.ffn else {
                return Err(CudaError::UnsupportedFeature("batched expert layers"));
            };
            b.bmv_gated(c.activation, gate, up, &u.xn, xq, &u.gate, &u.up, n)?;
            quantize(&u.gate, c.d_ff)?;
            b.bmv(down, &u.gate, xq, &u.o, n, matvec_split(down))?;
            let next = m.layers.get(l + 1).map_or(&m.output_norm, |x| &x.attn_norm);
            b.residual_norm(
                &u.x,
                &u.o,
                lw.post_ffn_norm.as_ref(),
                next,
                &u.xn,
                None,
                n,
                c.rms_eps,
            )?;
            quantize(&u.xn, c.d_model)?;
        }
        if m.layers.is_empty() {
            b.rms_norm(&u.x, &m.output_norm, &u.xn, n, c.rms_eps)?;
            quantize(&u.xn, c.d_model)?;
        }
        let out = m.output.as_ref().unwrap_or(&m.embed);
        b.bmv(out, &u.xn, xq, &u.logits, n, matvec_split(out))
    }

    /// Rope of every session's q and k at its own position and the f16 store of its k and
    /// v into its own caches (`kt`, `vt`: the layer's cache tables).
    fn rope_store(
        &self,
        n: usize,
        shape: &AttnShape,
        kt: &cudarc::driver::CudaView<'_, u64>,
        vt: &cudarc::driver::CudaView<'_, u64>,
        base: f32,
    ) -> Result<(), CudaError> {
        let m = self.model;
        let c = &m.config;
        let b = &*m.backend;
        let u = &self.buf;
        let (nh, nkv, hd) = (
            shape.n_head as i32,
            shape.n_kv_head as i32,
            shape.head_dim as i32,
        );
        let half = i32::from(c.rope_style == RopeStyle::HalfSplit);
        let threads = ((shape.n_head + shape.n_kv_head) * shape.head_dim / 2).max(shape.kv_dim());
        let mut cfg = grid_1d(threads);
        cfg.grid_dim.1 = n as u32;
        let null = 0u64;
        let mut l = b.kernel("brope_store_f16")?;
        l.arg(&u.q)
            .arg(&u.k)
            .arg(&u.v)
            .arg(kt)
            .arg(vt)
            .arg(&nh)
            .arg(&nkv)
            .arg(&hd)
            .arg(&u.tps)
            .arg(&base)
            .arg(&half);
        match &m.rope_factors {
            Some(f) => l.arg(f),
            None => l.arg(&null),
        };
        // SAFETY: column s < n of q, k, v (sized for cap ≥ n columns) and row tps[2s+1] of
        // session s's caches, whose addresses the table holds; `step` checked every
        // position against its session's context. The factors (when given, head_dim / 2
        // values, checked at load) or a null pointer the kernel does not read.
        unsafe { l.launch(cfg) }?;
        Ok(())
    }

    /// Decode attention of every session over its own caches with its own key splits,
    /// into `buf.att` (partials in `buf.part`, up to `max_splits` per head and session).
    /// Where the decode attention kernel covers the shape, each session runs exactly what
    /// it runs alone (`CudaBackend::decode_attention`) and its output is also quantized
    /// into `xq` when given; returns whether that happened (else the caller quantizes).
    fn attention(
        &self,
        n: usize,
        max_splits: usize,
        shape: &AttnShape,
        kt: &cudarc::driver::CudaView<'_, u64>,
        vt: &cudarc::driver::CudaView<'_, u64>,
        xq: Option<ActQ<'_>>,
    ) -> Result<bool, CudaError> {
        let b = &*self.model.backend;
        let u = &self.buf;
        let hd = shape.head_dim;
        if max_splits == 0 || max_splits > MAX_SPLITS {
            return Err(CudaError::InvalidArgument(format!(
                "{max_splits} attention splits"
            )));
        }
        if let Some((_, name)) = decode_kernel(shape) {
            let cfg = LaunchConfig {
                grid_dim: (shape.n_head as u32, max_splits as u32, n as u32),
                block_dim: (ATTD_THREADS, 1, 1),
                shared_mem_bytes: 0,
            };
            let (nh, nkv, ms) = (
                shape.n_head as i32,
                shape.n_kv_head as i32,
                MAX_SPLITS as i32,
            );
            let win = shape.window.map_or(0, |w| w.min(i32::MAX as usize) as i32);
            let planes = xq.map_or(0, |x| x.planes as i32);
            let null = 0u64;
            let mut l = b.kernel(name)?;
            l.arg(&u.q)
                .arg(kt)
                .arg(vt)
                .arg(&u.att)
                .arg(&u.part)
                .arg(&u.att_cnt);
            match xq {
                Some(x) => l.arg(x.buf),
                None => l.arg(&null),
            };
            l.arg(&planes)
                .arg(&nh)
                .arg(&nkv)
                .arg(&u.tps)
                .arg(&u.splits)
                .arg(&ms)
                .arg(&win)
                .arg(&shape.scale);
            // SAFETY: session s < n reads its query column, its caches up to its position
            // (checked against its context in `step`), writes its output column, at most
            // n_head × splits[s] ≤ n_head × MAX_SPLITS partials in its region of `part`,
            // its n_head counters (left at zero) and, with xq (sized for cap ≥ n columns of
            // the widest input; a null pointer otherwise, which the kernel tests), its
            // int8 column.
            unsafe { l.launch(cfg) }?;
            return Ok(xq.is_some());
        }
        let hpb = shape.heads_per_block();
        let smem = (2 * hpb * hd + hpb * ATT_TILE + 3 * hpb) * 4;
        let cfg = LaunchConfig {
            grid_dim: ((shape.n_head / hpb) as u32, n as u32, max_splits as u32),
            block_dim: (128, 1, 1),
            shared_mem_bytes: smem as u32,
        };
        let (nh, nkv, hd32) = (shape.n_head as i32, shape.n_kv_head as i32, hd as i32);
        let win = shape.window.map_or(0, |w| w.min(i32::MAX as usize) as i32);
        let (min_chunk, hpb32) = (ATT_TILE as i32, hpb as i32);
        let mut l = b.kernel("battn_f16")?;
        l.arg(&u.q)
            .arg(kt)
            .arg(vt)
            .arg(&u.att)
            .arg(&u.part)
            .arg(&nh)
            .arg(&nkv)
            .arg(&hd32)
            .arg(&hpb32)
            .arg(&u.tps)
            .arg(&u.splits)
            .arg(&win)
            .arg(&shape.scale)
            .arg(&min_chunk);
        // SAFETY: session s < n reads its query column and its caches up to its position
        // (checked against its context in `step`) and writes its output column or its
        // n_head × splits partials inside its n_head × MAX_SPLITS region of `part`; shared
        // memory is sized from the same heads per block and head_dim as the kernel's
        // one-query tile.
        unsafe { l.launch(cfg) }?;
        let ms32 = max_splits as i32;
        let cfg = LaunchConfig {
            grid_dim: (shape.n_head as u32, n as u32, 1),
            block_dim: (hd.next_multiple_of(32).min(256) as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut l = b.kernel("battn_combine")?;
        l.arg(&u.part)
            .arg(&u.att)
            .arg(&nh)
            .arg(&hd32)
            .arg(&u.splits)
            .arg(&ms32);
        // SAFETY: reads the partials written above and writes head_dim values per (head,
        // session) of `att`, both inside the buffers sized for cap ≥ n sessions.
        unsafe { l.launch(cfg) }?;
        Ok(false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_batched_kernel_pair_is_loaded() {
        for ty in [
            GgmlType::Q4_1,
            GgmlType::Q8_0,
            GgmlType::Q5_0,
            GgmlType::Q4_K,
            GgmlType::Q6_K,
            GgmlType::F32,
            GgmlType::F16,
        ] {
            for planes in 0..3 {
                let Some((mv, gated)) = bmv_kernels(ty, planes) else {
                    assert!(planes > 0, "{ty} has no f32 batched kernels");
                    assert_eq!(crate::device::i8_kernels(ty, planes), None);
                    continue;
                };
                assert!(crate::device::i8_kernels(ty, planes).is_some() || planes == 0);
                assert!(BATCH_KERNELS.contains(&mv) && BATCH_KERNELS.contains(&gated));
            }
        }
        assert_eq!(bmv_kernels(GgmlType::Q2_K, 0), None);
    }
}
