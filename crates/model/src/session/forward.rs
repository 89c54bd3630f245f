//! The one forward pass: the transformer layers over the rows of one or many sessions,
//! written once against `ferrite_backend::Backend`, plus the scratch it runs in and the
//! binding of the model's weights to a backend's handles.
//!
//! Prefill chunks, decode steps and `Batch` steps all come here. The pass only sequences
//! the contract's ops; it never computes a value itself, so what a row gets is what the
//! backend's ops give it.

use ferrite_backend::{
    Act, AttnShape, Backend, ExpertBufs, KvType, Op, Rope, Routing, Segment, Values,
};
use ferrite_cpu::CpuBackend;

use crate::config::Activation;
use crate::delta_net::{self, DeltaNetScratch};
use crate::features::MoeConfig;
use crate::mamba2::{self, Mamba2Scratch};
use crate::mla::{self, MlaScratch};
use crate::model::{Attn, DenseFfn, Ffn, FfnWeights, Model, Weight};
use crate::moe::{Experts, MoeScratch};
use crate::{ModelConfig, ModelError};

/// How a backend reads one model's weights: the handle of each matrix and of each vector
/// the model owns. The products take [`Weights::matrix`]; embedding lookups take the stored
/// rows ([`Weights::table`]). A backend whose weights live elsewhere (a GPU) uploads each
/// matrix and vector at its first use and keeps it, so a value implementing this trait
/// serves one model, whose weights outlive it; a handle whose upload failed makes the op
/// that reads it fail with the cause.
pub trait Weights: Backend {
    /// Weight matrix `w` of `m` for the products.
    fn matrix<'a>(&'a self, m: &'a Model, w: &'a Weight) -> Self::Weight<'a>;
    /// Expert `e` of the stacked experts `x` of `m` for the products.
    fn expert<'a>(&'a self, m: &'a Model, x: &'a Experts, e: usize) -> Self::Weight<'a>;
    /// Matrix `w` of `m` as a table of rows to look up.
    fn table<'a>(&'a self, m: &'a Model, w: &'a Weight) -> Self::Weight<'a>;
    /// A vector the model owns (a norm weight, a bias, rope factors), as a handle.
    fn param<'a>(&'a self, v: &'a [f32]) -> Result<Self::Vector<'a>, ModelError> {
        Ok(self.vector(v)?)
    }
}

impl Weights for CpuBackend<'_> {
    fn matrix<'a>(&'a self, m: &'a Model, w: &'a Weight) -> ferrite_cpu::Matrix<'a> {
        m.matrix(w)
    }

    fn expert<'a>(&'a self, m: &'a Model, x: &'a Experts, e: usize) -> ferrite_cpu::Matrix<'a> {
        x.matrix(m.gguf(), e)
    }

    fn table<'a>(&'a self, m: &'a Model, w: &'a Weight) -> ferrite_cpu::Matrix<'a> {
        // The stored rows: packing the embedding for products it never takes part in
        // (an untied output head) would hold a second copy and drop the rows' pages.
        m.raw_matrix(w)
    }
}

/// Deliberate defects of the forward pass; always `Faults::default()` outside tests.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Faults {
    /// Rope with twice the model's base (a misread `rope_theta`).
    pub(crate) wrong_rope_base: bool,
    /// A layer whose attention residual is dropped.
    pub(crate) skip_attn_residual: Option<usize>,
    /// Leave out the q/k/v biases.
    pub(crate) drop_qkv_bias: bool,
    /// Plain rope even when the model has frequency factors.
    pub(crate) ignore_rope_factors: bool,
    /// Route every row to one expert instead of the top k.
    pub(crate) top_one_expert: bool,
    /// Attention scores without their soft cap.
    pub(crate) drop_attn_softcap: bool,
    /// Attention without its sink logits.
    pub(crate) drop_sinks: bool,
    /// Router and expert products without their biases.
    pub(crate) drop_expert_bias: bool,
}

/// Scratch activations for the rows of one forward pass (the tokens of one chunk, or one
/// token from each session of a batch), allocated once.
/// Parametrized by the backend's buffer and angle types rather than the backend, so that
/// the scratch of a `Batch` outlives the borrow of the pool a CPU backend holds.
#[derive(Debug)]
pub(crate) struct Scratch<Buf, Angles> {
    x: Buf,
    xn: Buf,
    q: Buf,
    k: Buf,
    v: Buf,
    att: Buf,
    o: Buf,
    gate: Buf,
    up: Buf,
    /// Rope angles of the rows of one forward pass.
    angles: Angles,
    /// Expert routing and grouping buffers (MoE models only).
    pub(crate) moe: Option<MoeScratch<Buf>>,
    /// Latent attention's own buffers (MLA models only).
    mla: Option<MlaScratch<Buf>>,
    /// The gated DeltaNet's buffers (Qwen3-Next only).
    delta: Option<DeltaNetScratch<Buf>>,
    /// The Mamba-2 mixer's buffers (Nemotron-H only).
    mamba: Option<Mamba2Scratch<Buf>>,
}

/// The scratch of backend `B`.
pub(crate) type ScratchOf<B> = Scratch<<B as Backend>::Buf, <B as Backend>::Angles>;

impl<Buf, Angles: Default> Scratch<Buf, Angles> {
    /// Buffers for up to `rows` rows of model `c`.
    pub(crate) fn new<B: Backend<Buf = Buf, Angles = Angles>>(
        b: &B,
        c: &ModelConfig,
        rows: usize,
    ) -> Result<Scratch<Buf, Angles>, ModelError> {
        let buf = |w: usize| {
            rows.checked_mul(w)
                .ok_or_else(|| ModelError::InvalidArgument("scratch size overflows".into()))
                .and_then(|len| Ok(b.alloc(len)?))
        };
        let moe = match &c.moe {
            None => None,
            Some(m) => Some(MoeScratch {
                shared_out: buf(if m.shared_ff > 0 { c.d_model } else { 0 })?,
                router: buf(m.n_expert)?,
                routing: Routing::new(m.n_expert, m.n_expert_used, rows),
                bufs: ExpertBufs {
                    x: buf(c.d_model)?,
                    gate: buf(c.d_ff)?,
                    up: buf(c.d_ff)?,
                    y: buf(c.d_model)?,
                    slots: buf(m.n_expert_used * c.d_model)?,
                },
                experts_run: 0,
                expert_rows: 0,
            }),
        };
        Ok(Scratch {
            x: buf(c.d_model)?,
            xn: buf(c.d_model)?,
            q: buf(c.q_dim())?,
            k: buf(c.kv_dim())?,
            v: buf(c.kv_dim())?,
            att: buf(c.q_dim())?,
            o: buf(c.d_model)?,
            gate: buf(c.ffn_width())?,
            up: buf(c.ffn_width())?,
            angles: Angles::default(),
            moe,
            mla: match &c.mla {
                Some(m) => Some(MlaScratch::new(b, m, c.n_head, rows)?),
                None => None,
            },
            delta: match &c.delta_net {
                Some(s) => Some(DeltaNetScratch::new(b, s, rows)?),
                None => None,
            },
            mamba: match &c.mamba {
                Some(s) => Some(Mamba2Scratch::new(b, s, rows)?),
                None => None,
            },
        })
    }

    /// Moves residual rows `rows[i]` to row `i`; `rows` must be increasing (so `rows[i] >= i`
    /// and no row is overwritten before it is read).
    pub(crate) fn gather_rows<B: Backend<Buf = Buf>>(
        &mut self,
        b: &B,
        rows: &[usize],
        d: usize,
    ) -> Result<(), ModelError> {
        for (i, &r) in rows.iter().enumerate() {
            b.copy(None, r * d, &mut self.x, i * d, d)?;
        }
        Ok(())
    }

    /// Normalizes rows `from..n` of the final residual stream into the first `n - from`
    /// rows of `xn` and writes their logits to `out`.
    pub(crate) fn logits<B: Weights<Buf = Buf>>(
        &mut self,
        b: &B,
        m: &Model,
        from: usize,
        n: usize,
        out: &mut [f32],
    ) -> Result<(), ModelError> {
        let c = m.config();
        let (d, rows) = (c.d_model, n - from);
        b.copy(Some(&self.x), from * d, &mut self.xn, 0, rows * d)?;
        b.rms_norm(
            &mut self.xn,
            rows * d,
            b.param(&m.output_norm)?,
            d,
            c.rms_eps,
        )?;
        b.logits(b.matrix(m, m.output_weight()), &self.xn, rows, out)?;
        // Gemma 2's final soft cap, on the host logits every backend hands back.
        if let Some(cap) = c.final_softcap {
            let n = (rows * c.n_vocab).min(out.len());
            out[..n]
                .iter_mut()
                .for_each(|x| *x = cap * (*x / cap).tanh());
        }
        Ok(())
    }
}

/// The contract's activation for the model's.
pub(crate) fn act(a: Activation) -> Act {
    match a {
        Activation::Silu => Act::Silu,
        Activation::GeluTanh => Act::GeluTanh,
        Activation::SwigluOai => Act::SwigluOai,
    }
}

/// Asks `b` for every op the forward pass of `m` with a `kv` cache needs, before anything
/// runs: a refusal is an error naming the op, its type and the reason.
pub(crate) fn require_ops<B: Weights>(b: &B, m: &Model, kv: KvType) -> Result<(), ModelError> {
    let c = m.config();
    let act = act(c.activation);
    b.require(&Op::Embed {
        ty: m.embed.ty(),
        cols: m.embed.cols,
    })?;
    let head = m.output_weight();
    b.require(&Op::Logits {
        ty: head.ty(),
        cols: head.cols,
    })?;
    let matmul = |w: &Weight| Op::MatMul {
        ty: w.ty(),
        cols: w.cols,
    };
    let shared = |w: &Weight| Op::MatMulShared {
        ty: w.ty(),
        cols: w.cols,
    };
    for op in [Op::Copy, Op::RmsNorm, Op::NormInto, Op::AddNorm, Op::Add] {
        b.require(&op)?;
    }
    for lc in &c.layers {
        let (style, scaled) = (c.rope_style, lc.rope_scaled);
        let long = scaled && c.rope_long.is_some();
        // Latent attention turns its queries and keys apart from the store; attention
        // without rope stores them as they are.
        b.require(&match c.mla {
            _ if c.rope_dim == 0 => Op::KvStore { kv },
            Some(_) => Op::Rope {
                style,
                scaled,
                long,
            },
            None => Op::RopeStore {
                style,
                scaled,
                long,
                kv,
            },
        })?;
    }
    b.require(&Op::Attention {
        kv,
        head_dim: c.head_dim,
        softcap: c.attn_softcap.is_some(),
        values: c.kv_values(),
        sinks: c.arch.features().sinks,
    })?;
    if c.qkv_bias || c.out_bias {
        b.require(&Op::AddBias)?;
    }
    for mx in m.layers.iter().filter_map(|l| l.mixer.as_ref()) {
        match &mx.attn {
            Attn::Qkv(qkv) => {
                for w in qkv.iter() {
                    b.require(&shared(w))?;
                }
            }
            Attn::Mla(w) => w.require(b, (kv, c.head_dim, c.kv_values()))?,
            Attn::DeltaNet(w) => {
                if let Some(s) = &c.delta_net {
                    w.require(b, s)?;
                }
            }
            Attn::Mamba2(w) => {
                if let Some(s) = &c.mamba {
                    w.require(b, s)?;
                }
            }
        }
        if let Some(g) = &mx.attn_gate {
            b.require(&matmul(g))?;
            b.require(&Op::GatedAct { act: Act::Sigmoid })?;
        }
        b.require(&matmul(&mx.wo))?;
    }
    for f in m.layers.iter().filter_map(|l| l.ffn.as_ref()) {
        let dense = |f: &DenseFfn| -> Result<(), ModelError> {
            b.require(&shared(&f.gate))?;
            b.require(&shared(&f.up))?;
            b.require(&matmul(&f.down))?;
            Ok(b.require(&Op::GatedAct { act })?)
        };
        match &f.ffn {
            Ffn::Dense(f) => dense(f)?,
            Ffn::SquaredRelu { up, down } => {
                b.require(&matmul(up))?;
                b.require(&matmul(down))?;
                b.require(&Op::ReluSq)?;
            }
            Ffn::Moe(mw) => {
                if let Some(f) = &mw.shared {
                    dense(f)?;
                }
                b.require(&matmul(&mw.router))?;
                b.require(&Op::MoeRoute {
                    n_expert: mw.gate.n_expert(),
                })?;
                if mw.router_bias.is_some() {
                    b.require(&Op::AddBias)?;
                }
                if let Some(g) = &mw.shared_gate {
                    b.require(&matmul(g))?;
                    b.require(&Op::RowGate)?;
                }
                for x in [&mw.gate, &mw.up, &mw.down] {
                    b.require(&Op::MoeExperts {
                        ty: x.ty(),
                        act,
                        bias: mw.bias.is_some(),
                        cols: x.cols(),
                    })?;
                }
            }
        }
    }
    Ok(())
}

/// The gated FFN `f` of `n` normalised rows `xn`, into `out`; `gate` and `up` hold its
/// hidden rows.
#[allow(clippy::too_many_arguments)]
fn dense_ffn<B: Weights>(
    b: &B,
    m: &Model,
    f: &DenseFfn,
    act: Act,
    xn: &B::Buf,
    n: usize,
    [gate, up]: [&mut B::Buf; 2],
    out: &mut B::Buf,
) -> Result<(), ModelError> {
    let gate_up = [b.matrix(m, &f.gate), b.matrix(m, &f.up)];
    b.matmul_shared(gate_up, xn, n, [&mut *gate, &mut *up])?;
    b.gated_act(act, gate, up, n, f.gate.rows)?;
    b.matmul(b.matrix(m, &f.down), gate, n, out)?;
    Ok(())
}

/// The second half of a block, `f`, over the `n` normalised rows in `s.xn`, into `s.o`
/// (its post-norm applied; the residual add is the caller's).
fn ffn_block<B: Weights>(
    b: &B,
    m: &Model,
    f: &FfnWeights,
    (act, moe_cfg, faults): (Act, &Option<MoeConfig>, Faults),
    n: usize,
    s: &mut ScratchOf<B>,
) -> Result<(), ModelError> {
    let (d, eps) = (m.config().d_model, m.config().rms_eps);
    match &f.ffn {
        Ffn::Dense(f) => {
            dense_ffn(b, m, f, act, &s.xn, n, [&mut s.gate, &mut s.up], &mut s.o)?;
        }
        Ffn::SquaredRelu { up, down } => {
            b.matmul(b.matrix(m, up), &s.xn, n, &mut s.gate)?;
            b.relu_sq(&mut s.gate, n * up.rows)?;
            b.matmul(b.matrix(m, down), &s.gate, n, &mut s.o)?;
        }
        Ffn::Moe(mw) => {
            let (Some(cfg), Some(ms)) = (moe_cfg, s.moe.as_mut()) else {
                return Err(ModelError::InvalidArgument(
                    "expert weights without expert settings".into(),
                ));
            };
            crate::moe::ffn(b, m, mw, (cfg, faults), act, &s.xn, n, &mut s.o, ms)?;
            // The shared expert's output joins the routed experts' sum.
            if let Some(f) = &mw.shared {
                let out = &mut ms.shared_out;
                dense_ffn(b, m, f, act, &s.xn, n, [&mut s.gate, &mut s.up], out)?;
                if let Some(g) = &mw.shared_gate {
                    // One gate logit per row, in the first `n` values of `up`.
                    b.matmul(b.matrix(m, g), &s.xn, n, &mut s.up)?;
                    b.row_gate(out, &s.up, n, d)?;
                }
                b.add(&mut s.o, &ms.shared_out, n * d)?;
            }
        }
    }
    if let Some(w) = &f.post_norm {
        b.rms_norm(&mut s.o, n * d, b.param(w)?, d, eps)?;
    }
    Ok(())
}

/// The transformer layers over `tokens`, which are the rows of `segs` in order. Leaves the
/// final residual stream in the scratch for [`Scratch::logits`]. Every row's result depends
/// only on its own token, position and session cache, never on the other rows.
pub(crate) fn forward_rows<B: Weights>(
    b: &B,
    m: &Model,
    s: &mut ScratchOf<B>,
    tokens: &[u32],
    segs: &mut [Segment<'_, B::Kv>],
    hidden: &mut Option<&mut Vec<Vec<f32>>>,
    faults: Faults,
) -> Result<(), ModelError> {
    let c = m.config();
    let n = tokens.len();
    let (d, qd, kvd, eps) = (c.d_model, c.q_dim(), c.kv_dim(), c.rms_eps);
    let base = |theta: f32| {
        if faults.wrong_rope_base {
            2.0 * theta
        } else {
            theta
        }
    };
    let rope_factors = c
        .rope_freq_factors
        .as_ref()
        .filter(|_| !faults.ignore_rope_factors);
    let moe_cfg = c.moe.map(|mut moe| {
        if faults.top_one_expert {
            moe.n_expert_used = 1;
        }
        moe
    });
    let act = act(c.activation);

    b.embed(b.table(m, &m.embed), tokens, c.embed_scale, &mut s.x)?;
    let mut bases = c.layers.iter().map(|l| base(l.rope_base));
    if c.rope_dim > 0 {
        b.rope_prepare(&mut s.angles, c.rope_dim, &mut bases, segs)?;
    }
    for (l, lw) in m.layers.iter().enumerate() {
        let lc = &c.layers[l];
        // The layer's slot among the layers of its kind in each session's store.
        let slot = c.slot(l);
        if let Some(mx) = &lw.mixer {
            b.norm_into(&s.x, n * d, b.param(&mx.attn_norm)?, d, eps, &mut s.xn)?;
            let rope = Rope {
                head_dim: c.head_dim,
                rot_dim: c.rope_dim,
                base: base(lc.rope_base),
                style: c.rope_style,
                factors: rope_factors
                    .filter(|_| lc.rope_scaled)
                    .map(|f| b.param(f))
                    .transpose()?,
                long: match c.rope_long.as_ref().filter(|_| lc.rope_scaled) {
                    Some((f, after)) if rope_factors.is_some() => Some((b.param(f)?, *after)),
                    _ => None,
                },
            };
            let values = match (&mx.attn, s.mla.as_mut()) {
                (Attn::DeltaNet(w), _) => {
                    let (Some(shape), Some(ds)) = (&c.delta_net, s.delta.as_mut()) else {
                        return Err(ModelError::InvalidArgument(
                            "DeltaNet weights without its settings".into(),
                        ));
                    };
                    delta_net::layer(b, m, (shape, w), slot, &s.xn, n, ds, segs)?;
                    &ds.out
                }
                (Attn::Mamba2(w), _) => {
                    let (Some(shape), Some(ms)) = (&c.mamba, s.mamba.as_mut()) else {
                        return Err(ModelError::InvalidArgument(
                            "Mamba-2 weights without its settings".into(),
                        ));
                    };
                    mamba2::mixer(b, m, (shape, w), slot, &s.xn, n, ms, segs)?;
                    &ms.out
                }
                (Attn::Qkv(qkv), _) => {
                    let qkv = qkv.each_ref().map(|w| b.matrix(m, w));
                    b.matmul_shared(qkv, &s.xn, n, [&mut s.q, &mut s.k, &mut s.v])?;
                    let bias = mx.qkv_bias.as_ref().filter(|_| !faults.drop_qkv_bias);
                    if let Some([bq, bk, bv]) = bias {
                        b.add_bias(&mut s.q, n * qd, b.param(bq)?, qd)?;
                        b.add_bias(&mut s.k, n * kvd, b.param(bk)?, kvd)?;
                        b.add_bias(&mut s.v, n * kvd, b.param(bv)?, kvd)?;
                    }
                    if let (Some(qn), Some(kn)) = (&mx.q_norm, &mx.k_norm) {
                        b.rms_norm(&mut s.q, n * qd, b.param(qn)?, c.head_dim, eps)?;
                        b.rms_norm(&mut s.k, n * kvd, b.param(kn)?, c.head_dim, eps)?;
                    }
                    if c.rope_dim > 0 {
                        b.rope_store(
                            &rope,
                            &s.angles,
                            slot,
                            (&mut s.q, qd),
                            (&mut s.k, &s.v, kvd),
                            segs,
                        )?;
                    } else {
                        // No positions (Nemotron-H): the rows go to the store as they are.
                        b.kv_store(slot, &s.k, &s.v, kvd, segs)?;
                    }
                    let shape = AttnShape {
                        n_head: c.n_head,
                        n_kv_head: c.n_kv_head,
                        head_dim: c.head_dim,
                        scale: c.attn_scale,
                        window: lc.window,
                        softcap: c.attn_softcap.filter(|_| !faults.drop_attn_softcap),
                        values: Values::Own,
                    };
                    let sinks = match mx.sinks.as_ref().filter(|_| !faults.drop_sinks) {
                        Some(v) => Some(b.param(v)?),
                        None => None,
                    };
                    b.attention(&shape, slot, &s.q, sinks, segs, &mut s.att)?;
                    match &mx.attn_gate {
                        // Qwen3-Next: each head's output times sigmoid(gate · x).
                        Some(g) => {
                            b.matmul(b.matrix(m, g), &s.xn, n, &mut s.q)?;
                            b.gated_act(Act::Sigmoid, &mut s.q, &s.att, n, qd)?;
                            &s.q
                        }
                        None => &s.att,
                    }
                }
                (Attn::Mla(w), Some(ms)) => {
                    let io = mla::Io {
                        xn: &s.xn,
                        q: &mut s.q,
                        k: &mut s.k,
                        att: &mut s.att,
                    };
                    mla::attention(b, m, w, slot, (&rope, &s.angles), io, ms, segs)?;
                    &ms.values
                }
                (Attn::Mla(_), None) => {
                    return Err(ModelError::InvalidArgument(
                        "latent attention weights without its scratch".into(),
                    ));
                }
            };
            b.matmul(b.matrix(m, &mx.wo), values, n, &mut s.o)?;
            if let Some(bias) = &mx.out_bias {
                b.add_bias(&mut s.o, n * d, b.param(bias)?, d)?;
            }
            if let Some(w) = &mx.post_attn_norm {
                b.rms_norm(&mut s.o, n * d, b.param(w)?, d, eps)?;
            }
            let skip = faults.skip_attn_residual == Some(l);
            match &lw.ffn {
                // The residual add and the FFN's norm in one op.
                Some(f) if skip => {
                    b.norm_into(&s.x, n * d, b.param(&f.norm)?, d, eps, &mut s.xn)?
                }
                Some(f) => {
                    let norm = b.param(&f.norm)?;
                    b.add_norm(&mut s.x, &s.o, n * d, norm, d, eps, &mut s.xn)?;
                }
                None if skip => {}
                None => b.add(&mut s.x, &s.o, n * d)?,
            }
        } else if let Some(f) = &lw.ffn {
            b.norm_into(&s.x, n * d, b.param(&f.norm)?, d, eps, &mut s.xn)?;
        }
        if let Some(f) = &lw.ffn {
            ffn_block(b, m, f, (act, &moe_cfg, faults), n, s)?;
            b.add(&mut s.x, &s.o, n * d)?;
        }
        if let Some(h) = hidden.as_deref_mut() {
            let at = h[l].len();
            h[l].resize(at + n * d, 0.0);
            b.download(&s.x, 0, &mut h[l][at..])?;
        }
    }
    Ok(())
}
