//! [`CudaModel`] (the weights uploaded once, quantized blocks kept as stored) and
//! [`CudaSession`] (an f16 KV cache and the decode loop). The forward pass mirrors
//! `ferrite_model::Session` step for step: embedding (times Gemma's scale), pre-norms,
//! Q/K/V products (plus Qwen 2's biases), per-head Q/K norms, rope with the layer's base
//! (and Llama 3's frequency divisors), attention with the layer's window, optional
//! post-norms, gated FFN or mixture of experts (`moe.rs`), final norm and output product.
//!
//! A decode step is recorded once into a CUDA graph (the token and position live in device
//! memory, so one graph serves every step) and replayed: one launch per token instead of ~8
//! per layer. Several tokens at once go through batched prefill (`prefill.rs`: cuBLAS GEMMs
//! over all of them); without cuBLAS they run as decode steps. Several sessions taking one
//! token each share one pass through [`CudaBatch`] (`batch.rs`).

mod batch;
mod greedy;
mod moe;
mod prefill;
mod state;
mod topk;

pub(crate) use batch::BATCH_KERNELS;
pub use batch::CudaBatch;
pub(crate) use greedy::ARGMAX_PICK_WORDS;
pub use greedy::Greedy;
pub use topk::{TOPK_MAX, TopCandidates};

use std::sync::Arc;
use std::time::Instant;

use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::{CudaGraph, CudaSlice};
use ferrite_arch::{GlobalTensor, TensorRole};
use ferrite_backend::RouteRule;
use ferrite_gguf::Gguf;
use ferrite_model::{Model, ModelConfig, MoeConfig};

use crate::arch_ops::MOE_MAX_EXPERTS;
use crate::decode::decode_splits;
use crate::ops::{ActQ, DeviceMatrix, RESIDUAL_NORM_MAX_DIM, act_q8_bytes};
use crate::{Activations, AttnShape, CudaBackend, CudaError};

/// The FFN of one block.
#[derive(Debug)]
enum DeviceFfn {
    /// One gated FFN.
    Dense {
        gate: DeviceMatrix,
        up: DeviceMatrix,
        down: DeviceMatrix,
    },
    /// Routed experts.
    Moe(moe::DeviceMoe),
}

/// Device weights of one block.
#[derive(Debug)]
struct DeviceLayer {
    attn_norm: CudaSlice<f32>,
    wq: DeviceMatrix,
    wk: DeviceMatrix,
    wv: DeviceMatrix,
    wo: DeviceMatrix,
    /// Q, K, V biases (Qwen 2).
    qkv_bias: Option<[CudaSlice<f32>; 3]>,
    /// Attention output bias.
    out_bias: Option<CudaSlice<f32>>,
    q_norm: Option<CudaSlice<f32>>,
    k_norm: Option<CudaSlice<f32>>,
    post_attn_norm: Option<CudaSlice<f32>>,
    ffn_norm: CudaSlice<f32>,
    ffn: DeviceFfn,
    post_ffn_norm: Option<CudaSlice<f32>>,
}

impl DeviceLayer {
    /// The plain matrices (attention, and the FFN's when dense).
    fn matrices_mut(&mut self) -> Vec<&mut DeviceMatrix> {
        let mut v = vec![&mut self.wq, &mut self.wk, &mut self.wv, &mut self.wo];
        if let DeviceFfn::Dense { gate, up, down } = &mut self.ffn {
            v.extend([gate, up, down]);
        }
        v
    }

    /// The plain matrices (attention, and the FFN's when dense).
    fn matrices(&self) -> Vec<&DeviceMatrix> {
        let mut v = vec![&self.wq, &self.wk, &self.wv, &self.wo];
        if let DeviceFfn::Dense { gate, up, down } = &self.ffn {
            v.extend([gate, up, down]);
        }
        v
    }
}

/// A model whose weights live on the device.
#[derive(Debug)]
pub struct CudaModel {
    backend: Arc<CudaBackend>,
    config: ModelConfig,
    embed: DeviceMatrix,
    output: Option<DeviceMatrix>,
    output_norm: CudaSlice<f32>,
    layers: Vec<DeviceLayer>,
    /// Llama 3 rope frequency divisors (`head_dim / 2`).
    rope_factors: Option<CudaSlice<f32>>,
    weight_bytes: u64,
    /// Bytes of the expert layers a decode step does not read (the unselected experts).
    unread_expert_bytes: u64,
    upload_ms: f64,
    f16_cached: bool,
}

/// Share of the free device memory the f16 copies of the layer matrices may take.
const F16_CACHE_SHARE: usize = 4;

/// Dequantizes every layer matrix that prefill multiplies through cuBLAS (not MMQ) to a
/// kept f16 copy when all of them fit in a quarter of the free device memory, so prefill
/// runs its GEMMs without dequantizing each matrix per chunk; returns whether it did.
fn cache_f16_copies(b: &CudaBackend, layers: &mut [DeviceLayer]) -> Result<bool, CudaError> {
    let mode = b.prefill_mode();
    let bytes: usize = layers
        .iter()
        .flat_map(DeviceLayer::matrices)
        .filter(|w| !mode.is_mmq(w))
        .map(|w| 2 * w.rows * w.cols)
        .sum();
    let (free, _) = b.stream.context().mem_get_info()?;
    if b.blas.is_err() || bytes > free / F16_CACHE_SHARE {
        return Ok(false);
    }
    for w in layers.iter_mut().flat_map(DeviceLayer::matrices_mut) {
        if !mode.is_mmq(w) {
            b.cache_f16(w)?;
        }
    }
    Ok(true)
}

fn upload_matrix(
    b: &CudaBackend,
    g: &Gguf,
    name: &str,
    rows: usize,
    cols: usize,
) -> Result<DeviceMatrix, CudaError> {
    let t = g
        .tensor(name)
        .ok_or_else(|| ferrite_model::ModelError::MissingTensor(name.to_owned()))?;
    if t.dims != [cols as u64, rows as u64] {
        return Err(CudaError::InvalidArgument(format!(
            "{name}: dims {:?}, expected [{cols}, {rows}]",
            t.dims
        )));
    }
    if crate::device::kernel_suffix(t.ty).is_none() {
        return Err(CudaError::UnsupportedType {
            name: name.to_owned(),
            ty: t.ty,
        });
    }
    b.upload_matrix(t.ty, rows, cols, g.tensor_data(t))
        .map_err(|e| CudaError::InvalidArgument(format!("{name}: {e}")))
}

fn upload_vector(
    b: &CudaBackend,
    g: &Gguf,
    name: &str,
    len: usize,
) -> Result<CudaSlice<f32>, CudaError> {
    let t = g
        .tensor(name)
        .ok_or_else(|| ferrite_model::ModelError::MissingTensor(name.to_owned()))?;
    if t.dims != [len as u64] {
        return Err(CudaError::InvalidArgument(format!(
            "{name}: dims {:?}, expected [{len}]",
            t.dims
        )));
    }
    let mut v = vec![0.0f32; len];
    ferrite_quant::dequantize(t.ty, g.tensor_data(t), &mut v)
        .map_err(|e| CudaError::InvalidArgument(format!("{name}: {e}")))?;
    Ok(b.stream.clone_htod(&v)?)
}

/// The first feature of a model with expert settings `moe` that the device forward pass
/// does not implement, if any: a model that loads must compute what the CPU backend
/// computes. (Biases, Llama 3 rope factors and softmax-routed expert layers are
/// implemented; the CPU loader already refuses what neither backend implements.)
fn unsupported_feature(d_model: usize, moe: Option<&MoeConfig>) -> Option<&'static str> {
    if d_model > RESIDUAL_NORM_MAX_DIM {
        return Some("a residual width above 8192");
    }
    let m = moe?;
    if m.n_expert > MOE_MAX_EXPERTS {
        return Some("more than 4096 experts per layer");
    }
    let softmax = RouteRule::softmax(m.rule.norm_topk);
    if m.rule != softmax || m.selection_bias {
        return Some("expert routing other than softmax top-k (sigmoid, bias, groups, scale)");
    }
    if m.shared_ff > 0 || m.leading_dense > 0 {
        return Some("shared experts or dense layers in an expert model");
    }
    None
}

/// Model math the CUDA layer sequence (its own, not yet the contract's) does not have:
/// refused so that such a model never runs with the wrong logits.
fn unported_math(c: &ferrite_model::ModelConfig) -> Option<&'static str> {
    if c.delta_net.is_some() {
        return Some("gated DeltaNet layers and their recurrent state (Qwen3-Next)");
    }
    if c.mamba.is_some() {
        return Some("Mamba-2 blocks and their recurrent state (Nemotron-H)");
    }
    if c.attn_softcap.is_some() || c.final_softcap.is_some() {
        return Some("attention or final logit soft-capping");
    }
    if c.rope_freq_factors.is_some() && c.layers.iter().any(|l| !l.rope_scaled) {
        return Some("rope scaling on only some layers");
    }
    if c.rope_long.is_some() {
        return Some("LongRoPE");
    }
    if c.rope_dim != c.head_dim {
        return Some("partial rotary");
    }
    if c.arch.features().fused {
        return Some("fused q/k/v and gate/up tensors");
    }
    if c.arch.features().sinks || c.arch.features().expert_bias {
        return Some("attention sinks, expert biases and the clamped SwiGLU (gpt-oss)");
    }
    None
}

impl CudaModel {
    /// Uploads the weights of `model` (already loaded and checked on the host). When cuBLAS
    /// is present and f16 copies of all layer matrices fit in a quarter of the free device
    /// memory, they are made too (prefill then skips per-chunk dequantization).
    pub fn load(backend: Arc<CudaBackend>, model: &Model) -> Result<CudaModel, CudaError> {
        let start = Instant::now();
        let c = model.config().clone();
        if let Some(feature) =
            unsupported_feature(c.d_model, c.moe.as_ref()).or_else(|| unported_math(&c))
        {
            return Err(CudaError::UnsupportedFeature(feature));
        }
        let g = model.gguf();
        let b = &*backend;
        AttnShape::new(c.n_head, c.n_kv_head, c.head_dim, c.attn_scale, None)?;
        let embed = upload_matrix(b, g, GlobalTensor::TokenEmbd.name(), c.n_vocab, c.d_model)?;
        let output = match g.tensor(GlobalTensor::Output.name()) {
            Some(_) => Some(upload_matrix(
                b,
                g,
                GlobalTensor::Output.name(),
                c.n_vocab,
                c.d_model,
            )?),
            None => None,
        };
        let output_norm = upload_vector(b, g, GlobalTensor::OutputNorm.name(), c.d_model)?;
        let mut layers: Vec<DeviceLayer> = Vec::with_capacity(c.n_layer);
        for i in 0..c.n_layer {
            let n = |r: TensorRole| r.weight(i);
            let opt = |s: TensorRole, len: usize, wanted: bool| {
                if wanted {
                    upload_vector(b, g, &n(s), len).map(Some)
                } else {
                    Ok(None)
                }
            };
            let bias = |r: TensorRole, len: usize| upload_vector(b, g, &r.bias(i), len);
            let ffn = match &c.moe {
                None => DeviceFfn::Dense {
                    gate: upload_matrix(b, g, &n(TensorRole::FfnGate), c.d_ff, c.d_model)?,
                    up: upload_matrix(b, g, &n(TensorRole::FfnUp), c.d_ff, c.d_model)?,
                    down: upload_matrix(b, g, &n(TensorRole::FfnDown), c.d_model, c.d_ff)?,
                },
                Some(moe) => DeviceFfn::Moe(moe::load(b, g, &c, moe, i)?),
            };
            layers.push(DeviceLayer {
                attn_norm: upload_vector(b, g, &n(TensorRole::AttnNorm), c.d_model)?,
                wq: upload_matrix(b, g, &n(TensorRole::AttnQ), c.q_dim(), c.d_model)?,
                wk: upload_matrix(b, g, &n(TensorRole::AttnK), c.kv_dim(), c.d_model)?,
                wv: upload_matrix(b, g, &n(TensorRole::AttnV), c.kv_dim(), c.d_model)?,
                wo: upload_matrix(b, g, &n(TensorRole::AttnOutput), c.d_model, c.q_dim())?,
                qkv_bias: if c.qkv_bias {
                    Some([
                        bias(TensorRole::AttnQ, c.q_dim())?,
                        bias(TensorRole::AttnK, c.kv_dim())?,
                        bias(TensorRole::AttnV, c.kv_dim())?,
                    ])
                } else {
                    None
                },
                out_bias: if c.out_bias {
                    Some(bias(TensorRole::AttnOutput, c.d_model)?)
                } else {
                    None
                },
                q_norm: opt(TensorRole::AttnQNorm, c.head_dim, c.qk_norm)?,
                k_norm: opt(TensorRole::AttnKNorm, c.head_dim, c.qk_norm)?,
                post_attn_norm: opt(TensorRole::PostAttentionNorm, c.d_model, c.post_norms)?,
                ffn_norm: upload_vector(b, g, &n(TensorRole::FfnNorm), c.d_model)?,
                ffn,
                post_ffn_norm: opt(TensorRole::PostFfwNorm, c.d_model, c.post_norms)?,
            });
        }
        let rope_factors = match &c.rope_freq_factors {
            Some(f) => Some(b.stream.clone_htod(f)?),
            None => None,
        };
        let f16_cached = cache_f16_copies(b, &mut layers)?;
        b.synchronize()?;
        let mut weight_bytes = embed.data.len() as u64;
        weight_bytes += output.as_ref().map_or(0, |o| o.data.len() as u64);
        let mut unread_expert_bytes = 0;
        for l in &layers {
            for m in l.matrices() {
                weight_bytes += m.data.len() as u64;
            }
            if let (DeviceFfn::Moe(mw), Some(cfg)) = (&l.ffn, &c.moe) {
                weight_bytes += mw.bytes();
                unread_expert_bytes += mw.bytes() - mw.decode_bytes(cfg.n_expert_used);
            }
        }
        Ok(CudaModel {
            backend,
            config: c,
            embed,
            output,
            output_norm,
            layers,
            rope_factors,
            weight_bytes,
            unread_expert_bytes,
            upload_ms: start.elapsed().as_secs_f64() * 1e3,
            f16_cached,
        })
    }

    /// Whether the layer matrices have f16 copies for prefill (see [`CudaModel::load`]).
    pub fn f16_cached(&self) -> bool {
        self.f16_cached
    }

    /// The configuration.
    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// The backend the weights live on.
    pub fn backend(&self) -> &Arc<CudaBackend> {
        &self.backend
    }

    /// Bytes of matrix weights read by one decode step (embedding row excluded, output
    /// product included, only the selected experts of expert layers): the numerator of the
    /// bandwidth floor.
    pub fn decode_weight_bytes(&self) -> u64 {
        let out = self.output.as_ref().unwrap_or(&self.embed);
        let tied_extra = if self.output.is_none() {
            out.data.len() as u64
        } else {
            0
        };
        self.weight_bytes - self.embed.data.len() as u64 + tied_extra - self.unread_expert_bytes
    }

    /// Milliseconds spent uploading the weights.
    pub fn upload_ms(&self) -> f64 {
        self.upload_ms
    }
}

/// Activation buffers of one decode step.
#[derive(Debug)]
struct Buffers {
    x: CudaSlice<f32>,
    xn: CudaSlice<f32>,
    q: CudaSlice<f32>,
    k: CudaSlice<f32>,
    v: CudaSlice<f32>,
    att: CudaSlice<f32>,
    o: CudaSlice<f32>,
    gate: CudaSlice<f32>,
    up: CudaSlice<f32>,
    /// Partial results of split decode attention.
    part: CudaSlice<f32>,
    /// Per KV head, the splits of decode attention done so far (zero between launches).
    att_cnt: CudaSlice<u32>,
    logits: CudaSlice<f32>,
    /// `[token, first NaN or -1, log-probability bits]` of the device greedy choice.
    pick: CudaSlice<i32>,
    /// The device top-k selection (`topk::out_len` words).
    cand: CudaSlice<u32>,
    /// The input of the next product as int8 blocks (`act_q8_bytes` of the widest input,
    /// two planes).
    xq: CudaSlice<u8>,
    /// Routing and expert buffers of one token (MoE models).
    moe: Option<moe::MoeBufs>,
}

/// One timeline over a [`CudaModel`]: an f16 KV cache of `ctx` positions.
pub struct CudaSession<'m> {
    model: &'m CudaModel,
    ctx: usize,
    n_past: usize,
    kv: Vec<(CudaSlice<u16>, CudaSlice<u16>)>,
    buf: Buffers,
    /// `[token, position]` of the step being run, read by the kernels.
    tp: CudaSlice<i32>,
    /// The captured decode step, made at first use, and the activations it was recorded
    /// with.
    graph: Option<(StepGraph, Activations)>,
    /// Key splits of decode attention.
    splits: usize,
    /// Buffers of batched prefill, made at the first prompt of several tokens.
    prefill: Option<prefill::PrefillBufs>,
    /// Token ids at positions `0..n_past` (exported with the KV rows, see `state.rs`).
    history: Vec<u32>,
    /// Whether `buf.logits` holds the logits after token `n_past - 1`.
    has_logits: bool,
}

/// A captured decode step. CUDA graph handles may be used from any thread provided calls on
/// one graph are never concurrent.
struct StepGraph(CudaGraph);

// SAFETY: the graph is owned by one session and only launched through `&mut CudaSession`,
// so no two threads ever use it at once; cudarc binds the context to the calling thread
// before each launch.
unsafe impl Send for StepGraph {}

impl std::fmt::Debug for CudaSession<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaSession")
            .field("ctx", &self.ctx)
            .field("n_past", &self.n_past)
            .field("graph", &self.graph.is_some())
            .finish_non_exhaustive()
    }
}

impl<'m> CudaSession<'m> {
    /// A session of `ctx` positions.
    pub fn new(model: &'m CudaModel, ctx: usize) -> Result<CudaSession<'m>, CudaError> {
        if ctx == 0 || i32::try_from(ctx).is_err() {
            return Err(CudaError::InvalidArgument(format!("context size {ctx}")));
        }
        let c = &model.config;
        let s = &model.backend.stream;
        let splits = decode_splits(c.n_head, ctx);
        let mut kv = Vec::with_capacity(c.n_layer);
        for _ in 0..c.n_layer {
            kv.push((
                s.alloc_zeros::<u16>(ctx * c.kv_dim())?,
                s.alloc_zeros::<u16>(ctx * c.kv_dim())?,
            ));
        }
        let buf = Buffers {
            x: s.alloc_zeros(c.d_model)?,
            xn: s.alloc_zeros(c.d_model)?,
            q: s.alloc_zeros(c.q_dim())?,
            k: s.alloc_zeros(c.kv_dim())?,
            v: s.alloc_zeros(c.kv_dim())?,
            att: s.alloc_zeros(c.q_dim())?,
            o: s.alloc_zeros(c.d_model)?,
            gate: s.alloc_zeros(c.d_ff)?,
            up: s.alloc_zeros(c.d_ff)?,
            part: s.alloc_zeros(c.n_head * splits * (c.head_dim + 2))?,
            att_cnt: s.alloc_zeros(c.n_head.max(1))?,
            logits: s.alloc_zeros(c.n_vocab)?,
            pick: s.alloc_zeros(ARGMAX_PICK_WORDS)?,
            cand: s.alloc_zeros(topk::out_len(TOPK_MAX))?,
            xq: s.alloc_zeros(act_q8_bytes(c.d_model.max(c.q_dim()).max(c.d_ff), 2))?,
            moe: match &c.moe {
                Some(cfg) => Some(moe::MoeBufs::new(&model.backend, c, cfg, 1)?),
                None => None,
            },
        };
        Ok(CudaSession {
            model,
            ctx,
            n_past: 0,
            kv,
            buf,
            tp: s.alloc_zeros(2)?,
            graph: None,
            splits,
            prefill: None,
            history: Vec::new(),
            has_logits: false,
        })
    }

    /// Tokens in the cache.
    pub fn n_past(&self) -> usize {
        self.n_past
    }

    /// Forgets all cached tokens.
    pub fn reset(&mut self) {
        self.truncate(0);
    }

    /// Forgets cached tokens after the first `n`.
    pub fn truncate(&mut self, n: usize) {
        if n < self.n_past {
            self.has_logits = false;
        }
        self.n_past = self.n_past.min(n);
        self.history.truncate(self.n_past);
    }

    /// Runs `tokens` at positions `n_past..` and returns the logits of the last one.
    pub fn eval(&mut self, tokens: &[u32]) -> Result<Vec<f32>, CudaError> {
        self.run(tokens)?;
        let logits = self.model.backend.stream.clone_dtoh(&self.buf.logits)?;
        Ok(logits)
    }

    /// Runs `tokens` at positions `n_past..`, leaving the last one's logits in `buf.logits`.
    fn run(&mut self, tokens: &[u32]) -> Result<(), CudaError> {
        let c = &self.model.config;
        if tokens.is_empty() {
            return Err(CudaError::InvalidArgument("no tokens to evaluate".into()));
        }
        if self.n_past + tokens.len() > self.ctx {
            return Err(CudaError::InvalidArgument(format!(
                "context full: {} cached + {} new > {}",
                self.n_past,
                tokens.len(),
                self.ctx
            )));
        }
        if let Some(&t) = tokens.iter().find(|&&t| t as usize >= c.n_vocab) {
            return Err(CudaError::InvalidArgument(format!(
                "token {t} outside a vocabulary of {}",
                c.n_vocab
            )));
        }
        let start = self.n_past;
        self.has_logits = false;
        let batched = tokens.len() > 1 && self.model.backend.blas.is_ok();
        let run = if batched {
            self.prefill(tokens)
        } else {
            tokens.iter().try_for_each(|&t| {
                self.step(t)?;
                self.n_past += 1;
                Ok(())
            })
        };
        if let Err(e) = run {
            self.n_past = start;
            return Err(e);
        }
        self.history.extend_from_slice(tokens);
        let m = self.model;
        let b = &*m.backend;
        // Prefill leaves no int8 copy of xn; one launch makes it for every path.
        let xq = self.act_q(self.activations());
        if let Some(q) = xq {
            b.quantize_act(&self.buf.xn, q, c.d_model)?;
        }
        b.matvec(
            m.output.as_ref().unwrap_or(&m.embed),
            &self.buf.xn,
            xq,
            &self.buf.logits,
        )?;
        self.has_logits = true;
        Ok(())
    }

    /// One token at position `n_past` (both checked by `eval`): writes them to `tp`, then
    /// replays the captured step graph (capturing it first if needed).
    fn step(&mut self, token: u32) -> Result<(), CudaError> {
        let b = &*self.model.backend;
        let tp = [token as i32, self.n_past as i32];
        b.stream.memcpy_htod(&tp[..], &mut self.tp)?;
        let act = self.activations();
        if self.graph.as_ref().is_none_or(|(_, a)| *a != act) {
            self.graph = None;
            self.graph = Some((StepGraph(self.capture(act)?), act));
        }
        if let Some((StepGraph(g), _)) = &self.graph {
            g.launch()?;
            b.count_graph_step();
        }
        Ok(())
    }

    /// What the decode products read: the backend's setting, for models whose product
    /// inputs are whole blocks of 32 (f32 otherwise).
    fn activations(&self) -> Activations {
        let c = &self.model.config;
        let whole = [c.d_model, c.q_dim(), c.d_ff]
            .iter()
            .all(|n| n.is_multiple_of(32));
        if whole {
            self.model.backend.activations()
        } else {
            Activations::F32
        }
    }

    /// The int8 copy of the product input under `act`, if any.
    fn act_q(&self, act: Activations) -> Option<ActQ<'_>> {
        (act.planes() > 0).then_some(ActQ {
            buf: &self.buf.xq,
            planes: act.planes(),
        })
    }

    /// Records one decode step into a CUDA graph.
    fn capture(&self, act: Activations) -> Result<CudaGraph, CudaError> {
        let s = &self.model.backend.stream;
        // Thread-local mode: other threads' unrelated CUDA calls stay legal meanwhile.
        s.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)?;
        let recorded = self.record_step(act);
        let graph = s.end_capture(CUgraphInstantiate_flags(0));
        recorded?;
        graph?.ok_or_else(|| CudaError::InvalidArgument("graph capture recorded nothing".into()))
    }

    /// Issues the kernels of one step at position `tp[1]` for token `tp[0]`, leaving the
    /// residual stream in `buf.x` and its final norm (the output product's input) in `buf.xn`.
    /// With int8 activations, each product input is also quantized into `buf.xq` (by the
    /// norm that writes it, or right after attention and the gated FFN input) and read from
    /// there.
    fn record_step(&self, act: Activations) -> Result<(), CudaError> {
        let m = self.model;
        let c = &m.config;
        let b = &*m.backend;
        let u = &self.buf;
        let tp = &self.tp;
        let xq = self.act_q(act);
        let quantize = |x: &CudaSlice<f32>, n: usize| match xq {
            Some(q) => b.quantize_act(x, q, n),
            None => Ok(()),
        };
        b.embed(&m.embed, tp, 1, c.embed_scale, &u.x)?;
        if let Some(l0) = m.layers.first() {
            b.rms_norm(&u.x, &l0.attn_norm, &u.xn, 1, c.rms_eps)?;
            quantize(&u.xn, c.d_model)?;
        }
        for (l, lw) in m.layers.iter().enumerate() {
            let lc = &c.layers[l];
            b.matvec_multi(&[&lw.wq, &lw.wk, &lw.wv], &u.xn, xq, &[&u.q, &u.k, &u.v])?;
            if let Some([bq, bk, bv]) = &lw.qkv_bias {
                b.qkv_bias(&u.q, &u.k, &u.v, [bq, bk, bv], 1)?;
            }
            if let (Some(qn), Some(kn)) = (&lw.q_norm, &lw.k_norm) {
                b.rms_norm(&u.q, qn, &u.q, c.n_head, c.rms_eps)?;
                b.rms_norm(&u.k, kn, &u.k, c.n_kv_head, c.rms_eps)?;
            }
            let shape = AttnShape::new(c.n_head, c.n_kv_head, c.head_dim, c.attn_scale, lc.window)?;
            let (kc, vc) = &self.kv[l];
            b.rope_store(
                1,
                (&shape, c.head_dim),
                &u.q,
                &u.k,
                &u.v,
                kc,
                vc,
                tp,
                lc.rope_base,
                c.rope_style,
                m.rope_factors.as_ref(),
            )?;
            b.decode_attention(
                &shape,
                &u.q,
                kc,
                vc,
                &u.att,
                &u.part,
                &u.att_cnt,
                tp,
                self.splits,
                xq,
                None,
            )?;
            b.matvec(&lw.wo, &u.att, xq, &u.o)?;
            if let Some(ob) = &lw.out_bias {
                b.add_bias(&u.o, ob, 1)?;
            }
            b.residual_norm(
                &u.x,
                &u.o,
                lw.post_attn_norm.as_ref(),
                &lw.ffn_norm,
                &u.xn,
                xq,
                1,
                c.rms_eps,
            )?;
            match &lw.ffn {
                DeviceFfn::Dense { gate, up, down } => {
                    b.matvec_gated(c.activation, gate, up, &u.xn, xq, &u.gate, &u.up)?;
                    quantize(&u.gate, c.d_ff)?;
                    b.matvec(down, &u.gate, xq, &u.o)?;
                }
                DeviceFfn::Moe(mw) => {
                    let (Some(cfg), Some(mb)) = (&c.moe, &u.moe) else {
                        return Err(CudaError::InvalidArgument(
                            "expert weights without expert settings".into(),
                        ));
                    };
                    moe::ffn(b, cfg, c.activation, mw, mb, &u.xn, 1, &u.o)?;
                }
            }
            let next = m.layers.get(l + 1).map_or(&m.output_norm, |n| &n.attn_norm);
            b.residual_norm(
                &u.x,
                &u.o,
                lw.post_ffn_norm.as_ref(),
                next,
                &u.xn,
                xq,
                1,
                c.rms_eps,
            )?;
        }
        if m.layers.is_empty() {
            b.rms_norm(&u.x, &m.output_norm, &u.xn, 1, c.rms_eps)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn model_and_session_can_move_between_threads() {
        fn send_sync<T: Send + Sync>() {}
        fn send<T: Send>() {}
        send_sync::<CudaModel>();
        send_sync::<CudaBackend>();
        send::<CudaSession<'static>>();
    }

    #[test]
    fn only_shapes_beyond_the_kernels_are_refused() {
        let moe = |n_expert| MoeConfig {
            n_expert,
            n_expert_used: 2,
            rule: RouteRule::softmax(true),
            selection_bias: false,
            leading_dense: 0,
            dense_ff: 0,
            shared_ff: 0,
        };
        assert_eq!(unsupported_feature(4096, None), None);
        assert_eq!(unsupported_feature(4096, Some(&moe(128))), None);
        assert_eq!(unsupported_feature(4096, Some(&moe(MOE_MAX_EXPERTS))), None);
        assert!(unsupported_feature(4096, Some(&moe(MOE_MAX_EXPERTS + 1))).is_some());
        assert_eq!(unsupported_feature(RESIDUAL_NORM_MAX_DIM, None), None);
        assert!(unsupported_feature(RESIDUAL_NORM_MAX_DIM + 32, None).is_some());
    }
}
