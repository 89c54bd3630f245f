//! Multi-head latent attention (DeepSeek V2/V3, GGUF architecture `deepseek2`): its
//! settings, its weights and its layer's sequence of contract ops. It never computes a value
//! itself.
//!
//! Per row, the query (one projection, or a low-rank pair with a norm between) holds for
//! each head `nope_dim` values without rope, then `rope_dim` values with it; the joint
//! projection `attn_kv_a_mqa` gives the key/value latent (`kv_lora_rank` values, normed) and
//! one rope key that every head shares. Decompressing the latent into each head's keys and
//! values at every cached position would cache `n_head` full heads; instead each head's
//! `attn_k_b` carries the query's non-rope part into the latent's space (the absorbed
//! form), so attention is multi-query attention over one KV head of `rope_dim +
//! kv_lora_rank` values, `[rope key | latent]`, whose values are the latent itself
//! ([`Values::InKeys`]): the cache holds one such row per position and layer. Each head's
//! output latent is then decompressed by its `attn_v_b` before the output projection.
//! Scores are unchanged by the absorption: `q_nope · (K_h c) = (K_hᵀ q_nope) · c`.

use ferrite_arch::{Arch, Key, MlaShape, TensorRole};
use ferrite_backend::{AttnShape, Backend, Op, Rope, Segment, Values};
use ferrite_gguf::Gguf;

use crate::ModelError;
use crate::model::{Model, Precision, Weight, matrix, matrix_rows, vector};
use crate::moe::Experts;
use crate::session::Weights;

fn count(g: &Gguf, key: &str) -> Result<usize, ModelError> {
    let v = g.get_u32(key)?;
    usize::try_from(v).map_err(|_| bad(key, "does not fit in usize".into()))
}

fn bad(key: &str, reason: String) -> ModelError {
    ModelError::BadMetadata {
        key: key.to_owned(),
        reason,
    }
}

/// Reads and checks the MLA keys of `g`, given the attention shape the common keys gave:
/// one KV head (the latent) of `head_dim = rope_dim + kv_lora_rank` values. Returns the
/// shape and the multiplier of the scores: `1 / sqrt(nope_dim + rope_dim)`, times the
/// square of YaRN's `1 + yarn_log_multiplier · ln(factor)` when the rope is YaRN-scaled.
pub(crate) fn from_gguf(
    g: &Gguf,
    arch: Arch,
    (n_kv_head, head_dim, rope_dim): (usize, usize, usize),
) -> Result<(MlaShape, f32), ModelError> {
    let k = |key: Key| arch.key(key);
    let kv_lora_rank = count(g, &k(Key::KvLoraRank))?;
    if kv_lora_rank == 0 {
        return Err(bad(&k(Key::KvLoraRank), "must be positive".into()));
    }
    if n_kv_head != 1 {
        return Err(bad(
            &k(Key::HeadCountKv),
            format!("{n_kv_head}: latent attention has one KV head, the latent"),
        ));
    }
    if head_dim != kv_lora_rank + rope_dim {
        return Err(bad(
            &k(Key::KeyLength),
            format!("{head_dim}, not kv_lora_rank {kv_lora_rank} + rope {rope_dim}"),
        ));
    }
    let value_key = k(Key::ValueLength);
    if g.get(&value_key).is_some() && count(g, &value_key)? != kv_lora_rank {
        return Err(bad(
            &value_key,
            format!("must be kv_lora_rank {kv_lora_rank}"),
        ));
    }
    let key_mla = k(Key::KeyLengthMla);
    let qk_dim = count(g, &key_mla)?;
    if qk_dim <= rope_dim {
        return Err(bad(
            &key_mla,
            format!("{qk_dim} leaves no values without rope beside {rope_dim}"),
        ));
    }
    let value_mla = k(Key::ValueLengthMla);
    let v_dim = count(g, &value_mla)?;
    if v_dim == 0 {
        return Err(bad(&value_mla, "must be positive".into()));
    }
    // llama.cpp writes 0, or nothing, for a model without the query's low-rank pair.
    let q_key = k(Key::QLoraRank);
    let q_lora_rank = match g.get(&q_key) {
        Some(_) => Some(count(g, &q_key)?).filter(|&r| r > 0),
        None => None,
    };
    let shape = MlaShape {
        q_lora_rank,
        kv_lora_rank,
        nope_dim: qk_dim - rope_dim,
        rope_dim,
        v_dim,
    };
    Ok((
        shape,
        yarn_mscale(g, arch)?.powi(2) / (qk_dim as f32).sqrt(),
    ))
}

/// DeepSeek's YaRN factor of the attention scale, `1 + yarn_log_multiplier · ln(factor)`
/// (transformers' `yarn_get_mscale(factor, mscale_all_dim)`), 1 without YaRN. The rope's
/// own attention factor must be 1: transformers applies it to the rope values only (the
/// ratio of `mscale` to `mscale_all_dim`), which a scale of the whole score cannot give.
fn yarn_mscale(g: &Gguf, arch: Arch) -> Result<f32, ModelError> {
    let k = |key: Key| arch.key(key);
    if g.get_str(&k(Key::RopeScalingType)).ok() != Some("yarn") {
        return Ok(1.0);
    }
    let attn = k(Key::RopeScalingAttnFactor);
    if g.get(&attn).is_some() && g.get_f32(&attn)? != 1.0 {
        return Err(ModelError::Unsupported {
            key: attn,
            what: "a YaRN attention factor on the rope values of latent attention".into(),
        });
    }
    let factor = g.get_f32(&k(Key::RopeScalingFactor))?;
    let log_key = k(Key::RopeScalingYarnLogMultiplier);
    let log_mul = match g.get(&log_key) {
        Some(_) => g.get_f32(&log_key)?,
        None => 0.0,
    };
    if !(factor.is_finite() && log_mul.is_finite()) {
        return Err(bad(&log_key, format!("{log_mul} with factor {factor}")));
    }
    Ok(if factor <= 1.0 {
        1.0
    } else {
        1.0 + log_mul * factor.ln()
    })
}

/// How the query is projected.
#[derive(Debug)]
pub(crate) enum Query {
    /// One projection (`attn_q`).
    One(Weight),
    /// Down to the rank, normed, up to every head (`attn_q_a`, `attn_q_a_norm`, `attn_q_b`).
    LowRank {
        a: Weight,
        norm: Vec<f32>,
        b: Weight,
    },
}

/// The latent attention weights of one layer.
#[derive(Debug)]
pub(crate) struct MlaWeights {
    pub(crate) query: Query,
    /// The latent's rows of `attn_kv_a_mqa`.
    pub(crate) latent: Weight,
    /// Its rope key's rows.
    pub(crate) rope_key: Weight,
    pub(crate) latent_norm: Vec<f32>,
    /// Per head, `kv_lora_rank × nope_dim`: the query's non-rope part into the latent.
    pub(crate) k_b: Experts,
    /// Per head, `v_dim × kv_lora_rank`: the output latent into the head's value.
    pub(crate) v_b: Experts,
}

impl MlaWeights {
    /// Layer `i`'s weights under `mla`, in a model of `d` and `n_head` heads.
    pub(crate) fn load(
        g: &Gguf,
        (mla, d, n_head): (&MlaShape, usize, usize),
        i: usize,
        p: Precision,
    ) -> Result<MlaWeights, ModelError> {
        let n = |r: TensorRole| r.weight(i);
        let q_rows = n_head * mla.qk_dim();
        let query = match mla.q_lora_rank {
            None => Query::One(matrix(g, &n(TensorRole::AttnQ), q_rows, d, p)?),
            Some(r) => Query::LowRank {
                a: matrix(g, &n(TensorRole::AttnQA), r, d, p)?,
                norm: vector(g, &n(TensorRole::AttnQANorm), r)?,
                b: matrix(g, &n(TensorRole::AttnQB), q_rows, r, p)?,
            },
        };
        let (rank, rope) = (mla.kv_lora_rank, mla.rope_dim);
        let kv_a = n(TensorRole::AttnKvAMqa);
        let f32_copy = p == Precision::F32;
        Ok(MlaWeights {
            query,
            latent: matrix_rows(g, &kv_a, rank + rope, 0..rank, d, p)?,
            rope_key: matrix_rows(g, &kv_a, rank + rope, rank..rank + rope, d, p)?,
            latent_norm: vector(g, &n(TensorRole::AttnKvANorm), rank)?,
            k_b: Experts::load(
                g,
                &n(TensorRole::AttnKB),
                rank,
                mla.nope_dim,
                n_head,
                f32_copy,
            )?,
            v_b: Experts::load(g, &n(TensorRole::AttnVB), mla.v_dim, rank, n_head, f32_copy)?,
        })
    }

    /// Every dense matrix, for packing.
    pub(crate) fn matrices(&self) -> Vec<&Weight> {
        let mut out = match &self.query {
            Query::One(w) => vec![w],
            Query::LowRank { a, b, .. } => vec![a, b],
        };
        out.extend([&self.latent, &self.rope_key]);
        out
    }

    /// The ops the layer needs of `b`, beside the output projection.
    pub(crate) fn require<B: Backend>(
        &self,
        b: &B,
        (kv, head_dim, values): (ferrite_backend::KvType, usize, Values),
    ) -> Result<(), ModelError> {
        let matmul = |w: &Weight| Op::MatMul {
            ty: w.ty(),
            cols: w.cols,
        };
        for w in self.matrices() {
            b.require(&matmul(w))?;
        }
        b.require(&Op::MatMulShared {
            ty: self.latent.ty(),
            cols: self.latent.cols,
        })?;
        for x in [&self.k_b, &self.v_b] {
            b.require(&Op::MatMul {
                ty: x.ty(),
                cols: x.cols(),
            })?;
        }
        b.require(&Op::KvStore { kv })?;
        Ok(b.require(&Op::Attention {
            kv,
            head_dim,
            softcap: false,
            values,
            sinks: false,
        })?)
    }
}

/// The layer's activations beyond the common scratch, for up to `rows` rows.
#[derive(Debug)]
pub(crate) struct MlaScratch<Buf> {
    /// Projected queries, `n_head × qk_dim` a row, each head `[nope | rope]`.
    q: Buf,
    /// The query latent (low-rank queries only).
    q_lora: Buf,
    latent: Buf,
    rope_key: Buf,
    /// One head's inputs and outputs of its per-head product, gathered over the rows.
    head_in: Buf,
    head_out: Buf,
    /// Every head's decompressed value, `n_head × v_dim` a row: the output projection's
    /// input.
    pub(crate) values: Buf,
}

impl<Buf> MlaScratch<Buf> {
    /// Buffers for `rows` rows of `mla` with `n_head` heads.
    pub(crate) fn new<B: Backend<Buf = Buf>>(
        b: &B,
        mla: &MlaShape,
        n_head: usize,
        rows: usize,
    ) -> Result<MlaScratch<Buf>, ModelError> {
        let buf = |w: usize| -> Result<Buf, ModelError> {
            let len = rows
                .checked_mul(w)
                .ok_or_else(|| ModelError::InvalidArgument("scratch size overflows".into()))?;
            Ok(b.alloc(len)?)
        };
        let rank = mla.kv_lora_rank;
        Ok(MlaScratch {
            q: buf(n_head * mla.qk_dim())?,
            q_lora: buf(mla.q_lora_rank.unwrap_or(0))?,
            latent: buf(rank)?,
            rope_key: buf(mla.rope_dim)?,
            head_in: buf(rank.max(mla.nope_dim))?,
            head_out: buf(rank.max(mla.v_dim))?,
            values: buf(n_head * mla.v_dim)?,
        })
    }
}

/// Where one head's rows lie in a buffer of `n` rows: value `at` of head `h` of row `t` is
/// `t * stride + h * head + at`.
#[derive(Debug, Clone, Copy)]
struct Heads {
    stride: usize,
    head: usize,
    at: usize,
}

/// `out[t, h] = W_h · x[t, h]` for every head `h` of the stacked per-head matrices `w` and
/// each of the `n` rows: the head's inputs are gathered into `gather`, multiplied into
/// `product`, and scattered back, so that every head is one product over the rows.
#[allow(clippy::too_many_arguments)]
fn per_head<B: Weights>(
    b: &B,
    m: &Model,
    w: &Experts,
    n: usize,
    (x, xs): (&B::Buf, Heads),
    [gather, product]: [&mut B::Buf; 2],
    (out, os): (&mut B::Buf, Heads),
) -> Result<(), ModelError> {
    let (cols, rows) = (w.cols(), w.rows());
    for h in 0..w.n_expert() {
        for t in 0..n {
            let from = t * xs.stride + h * xs.head + xs.at;
            b.copy(Some(x), from, gather, t * cols, cols)?;
        }
        b.matmul(b.expert(m, w, h), gather, n, product)?;
        for t in 0..n {
            let to = t * os.stride + h * os.head + os.at;
            b.copy(Some(product), t * rows, out, to, rows)?;
        }
    }
    Ok(())
}

/// The buffers of the common scratch that latent attention writes: the absorbed queries
/// (`n_head × head_dim` a row), the cached rows (`head_dim`), the heads' output latents.
pub(crate) struct Io<'a, Buf> {
    pub(crate) xn: &'a Buf,
    pub(crate) q: &'a mut Buf,
    pub(crate) k: &'a mut Buf,
    pub(crate) att: &'a mut Buf,
}

/// Latent attention of layer `layer` over the `n` normalised rows `io.xn`; leaves every
/// head's value in `s.values`, the output projection's input.
#[allow(clippy::too_many_arguments)]
pub(crate) fn attention<B: Weights>(
    b: &B,
    m: &Model,
    w: &MlaWeights,
    layer: usize,
    (rope, angles): (&Rope<B::Vector<'_>>, &B::Angles),
    io: Io<'_, B::Buf>,
    s: &mut MlaScratch<B::Buf>,
    segs: &mut [Segment<'_, B::Kv>],
) -> Result<(), ModelError> {
    let c = m.config();
    let mla = c.mla.as_ref().ok_or_else(|| {
        ModelError::InvalidArgument("latent attention weights without its settings".into())
    })?;
    let n = segs.iter().map(|s| s.len).sum::<usize>();
    let (nh, hd, eps) = (c.n_head, c.head_dim, c.rms_eps);
    let (rank, rope_dim, qk) = (mla.kv_lora_rank, mla.rope_dim, mla.qk_dim());
    match &w.query {
        Query::One(wq) => b.matmul(b.matrix(m, wq), io.xn, n, &mut s.q)?,
        Query::LowRank { a, norm, b: wb } => {
            b.matmul(b.matrix(m, a), io.xn, n, &mut s.q_lora)?;
            b.rms_norm(&mut s.q_lora, n * a.rows, b.param(norm)?, a.rows, eps)?;
            b.matmul(b.matrix(m, wb), &s.q_lora, n, &mut s.q)?;
        }
    }
    let kv_a = [b.matrix(m, &w.latent), b.matrix(m, &w.rope_key)];
    b.matmul_shared(kv_a, io.xn, n, [&mut s.latent, &mut s.rope_key])?;
    b.rms_norm(&mut s.latent, n * rank, b.param(&w.latent_norm)?, rank, eps)?;
    // The cached row `[rope key | latent]`, and each head's query `[rope part | its
    // non-rope part in the latent's space]`: rope then turns the first `rope_dim` values.
    for t in 0..n {
        b.copy(Some(&s.rope_key), t * rope_dim, io.k, t * hd, rope_dim)?;
        b.copy(Some(&s.latent), t * rank, io.k, t * hd + rope_dim, rank)?;
        for h in 0..nh {
            let from = (t * nh + h) * qk + mla.nope_dim;
            b.copy(Some(&s.q), from, io.q, (t * nh + h) * hd, rope_dim)?;
        }
    }
    per_head(
        b,
        m,
        &w.k_b,
        n,
        (
            &s.q,
            Heads {
                stride: nh * qk,
                head: qk,
                at: 0,
            },
        ),
        [&mut s.head_in, &mut s.head_out],
        (
            io.q,
            Heads {
                stride: nh * hd,
                head: hd,
                at: rope_dim,
            },
        ),
    )?;
    b.rope(rope, angles, io.q, nh * hd, segs)?;
    b.rope(rope, angles, io.k, hd, segs)?;
    // The store keeps keys only: its values are the latent inside them.
    b.kv_store(layer, io.k, io.k, hd, segs)?;
    let shape = AttnShape {
        n_head: nh,
        n_kv_head: 1,
        head_dim: hd,
        scale: c.attn_scale,
        window: None,
        softcap: None,
        values: c.kv_values(),
    };
    b.attention(&shape, layer, io.q, None, segs, io.att)?;
    let v = mla.v_dim;
    per_head(
        b,
        m,
        &w.v_b,
        n,
        (
            &*io.att,
            Heads {
                stride: nh * rank,
                head: rank,
                at: 0,
            },
        ),
        [&mut s.head_in, &mut s.head_out],
        (
            &mut s.values,
            Heads {
                stride: nh * v,
                head: v,
                at: 0,
            },
        ),
    )?;
    Ok(())
}
