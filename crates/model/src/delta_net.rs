//! Qwen3-Next's gated DeltaNet layers: their shape from the `ssm.*` keys, their weights,
//! the scratch of a pass, and the layer as a sequence of the contract's ops (projections,
//! the causal convolution and the delta rule over each session's state slot, the gated
//! norm). The output projection (`ssm_out`) is the layer's `wo`, run by the forward pass
//! like attention's.
//!
//! Which layers are DeltaNets and which attention is [`DeltaNetShape::is_attention`]; the
//! two kinds keep their state in separate slots of a session's store
//! ([`crate::ModelConfig::slot`]). This module never computes a value itself.

use ferrite_arch::{Arch, DeltaNetShape, Key, TensorRole};
use ferrite_backend::{Backend, Op, Segment};
use ferrite_gguf::Gguf;

use crate::ModelError;
use crate::model::{Model, Precision, Weight, matrix, vector};
use crate::session::Weights;

fn count(g: &Gguf, key: &str) -> Result<usize, ModelError> {
    let v = g.get_u32(key)?;
    let v = usize::try_from(v).map_err(|_| bad(key, "does not fit in usize".into()))?;
    if v == 0 {
        return Err(bad(key, "must be positive".into()));
    }
    Ok(v)
}

fn bad(key: &str, reason: String) -> ModelError {
    ModelError::BadMetadata {
        key: key.to_owned(),
        reason,
    }
}

/// Reads and checks the DeltaNet keys of `g`.
pub(crate) fn from_gguf(g: &Gguf, arch: Arch) -> Result<DeltaNetShape, ModelError> {
    let k = |key: Key| arch.key(key);
    let v_heads = count(g, &k(Key::SsmTimeStepRank))?;
    let inner_key = k(Key::SsmInnerSize);
    let inner = count(g, &inner_key)?;
    if !inner.is_multiple_of(v_heads) {
        return Err(bad(
            &inner_key,
            format!("{inner} is not {v_heads} equal heads"),
        ));
    }
    let s = DeltaNetShape {
        conv_kernel: count(g, &k(Key::SsmConvKernel))?,
        k_heads: count(g, &k(Key::SsmGroupCount))?,
        v_heads,
        k_dim: count(g, &k(Key::SsmStateSize))?,
        v_dim: inner / v_heads,
        interval: count(g, &k(Key::FullAttentionInterval))?,
    };
    if s.conv_kernel < 2 {
        return Err(bad(&k(Key::SsmConvKernel), "must be at least 2".into()));
    }
    if !s.v_heads.is_multiple_of(s.k_heads) {
        return Err(bad(
            &k(Key::SsmTimeStepRank),
            format!("{v_heads} value heads for {} key heads", s.k_heads),
        ));
    }
    Ok(s)
}

/// The weights of one gated DeltaNet layer.
#[derive(Debug)]
pub(crate) struct DeltaNetWeights {
    /// Queries, keys and values of every head (`attn_qkv`), the convolution's channels.
    qkv: Weight,
    /// The output gate `z` (`attn_gate`).
    z: Weight,
    beta: Weight,
    alpha: Weight,
    /// `channels × kernel` taps.
    conv: Vec<f32>,
    /// `-exp(A_log)` per value head.
    a: Vec<f32>,
    dt_bias: Vec<f32>,
    norm: Vec<f32>,
}

impl DeltaNetWeights {
    /// Layer `i`'s weights, and its output projection (`ssm_out`).
    pub(crate) fn load(
        g: &Gguf,
        (s, d): (&DeltaNetShape, usize),
        i: usize,
        p: Precision,
    ) -> Result<(DeltaNetWeights, Weight), ModelError> {
        let n = |r: TensorRole| r.weight(i);
        let (c, nv) = (s.conv_channels(), s.v_heads);
        let conv = crate::model::vectors(g, &n(TensorRole::SsmConv1d), s.conv_kernel, c)?;
        let w = DeltaNetWeights {
            qkv: matrix(g, &n(TensorRole::AttnQkv), c, d, p)?,
            z: matrix(g, &n(TensorRole::AttnGate), s.inner(), d, p)?,
            beta: matrix(g, &n(TensorRole::SsmBeta), nv, d, p)?,
            alpha: matrix(g, &n(TensorRole::SsmAlpha), nv, d, p)?,
            conv,
            a: vector(g, &TensorRole::SsmA.bare(i), nv)?,
            dt_bias: vector(g, &TensorRole::SsmDt.bias(i), nv)?,
            norm: vector(g, &n(TensorRole::SsmNorm), s.v_dim)?,
        };
        let out = matrix(g, &n(TensorRole::SsmOut), d, s.inner(), p)?;
        Ok((w, out))
    }

    /// Its matrices but the output projection.
    pub(crate) fn matrices(&self) -> [&Weight; 4] {
        [&self.qkv, &self.z, &self.beta, &self.alpha]
    }

    /// Asks `b` for the ops of this layer.
    pub(crate) fn require<B: Backend>(&self, b: &B, s: &DeltaNetShape) -> Result<(), ModelError> {
        for w in self.matrices() {
            b.require(&Op::MatMulShared {
                ty: w.ty(),
                cols: w.cols,
            })?;
        }
        b.require(&Op::Conv1d {
            kernel: s.conv_kernel,
            bias: false,
        })?;
        b.require(&Op::DeltaRule {
            k_dim: s.k_dim,
            v_dim: s.v_dim,
        })?;
        Ok(b.require(&Op::GatedNorm)?)
    }
}

/// Scratch of the DeltaNet layers for the rows of one pass.
#[derive(Debug)]
pub(crate) struct DeltaNetScratch<Buf> {
    qkv: Buf,
    conv: Buf,
    z: Buf,
    beta: Buf,
    alpha: Buf,
    /// The heads' normalised, gated outputs: the input of `ssm_out`.
    pub(crate) out: Buf,
}

impl<Buf> DeltaNetScratch<Buf> {
    /// Buffers for `rows` rows.
    pub(crate) fn new<B: Backend<Buf = Buf>>(
        b: &B,
        s: &DeltaNetShape,
        rows: usize,
    ) -> Result<DeltaNetScratch<Buf>, ModelError> {
        let buf = |w: usize| -> Result<Buf, ModelError> {
            let len = rows
                .checked_mul(w)
                .ok_or_else(|| ModelError::InvalidArgument("scratch size overflows".into()))?;
            Ok(b.alloc(len)?)
        };
        Ok(DeltaNetScratch {
            qkv: buf(s.conv_channels())?,
            conv: buf(s.conv_channels())?,
            z: buf(s.inner())?,
            beta: buf(s.v_heads)?,
            alpha: buf(s.v_heads)?,
            out: buf(s.inner())?,
        })
    }
}

/// The DeltaNet of layer `w` (state slot `slot`) over the `n` normalised rows `xn` of
/// `segs`, into `s.out`. `eps` is the gated norm's.
#[allow(clippy::too_many_arguments)]
pub(crate) fn layer<B: Weights>(
    b: &B,
    m: &Model,
    (shape, w): (&DeltaNetShape, &DeltaNetWeights),
    slot: usize,
    xn: &B::Buf,
    n: usize,
    s: &mut DeltaNetScratch<B::Buf>,
    segs: &mut [Segment<'_, B::Kv>],
) -> Result<(), ModelError> {
    let eps = m.config().rms_eps;
    b.matmul_shared(
        [b.matrix(m, &w.qkv), b.matrix(m, &w.z)],
        xn,
        n,
        [&mut s.qkv, &mut s.z],
    )?;
    b.matmul_shared(
        [b.matrix(m, &w.beta), b.matrix(m, &w.alpha)],
        xn,
        n,
        [&mut s.beta, &mut s.alpha],
    )?;
    b.conv1d(
        shape.conv(),
        slot,
        &s.qkv,
        b.param(&w.conv)?,
        None,
        segs,
        &mut s.conv,
    )?;
    b.delta_rule(
        shape,
        slot,
        &s.conv,
        (&s.beta, &s.alpha),
        (b.param(&w.a)?, b.param(&w.dt_bias)?),
        segs,
        &mut s.out,
    )?;
    let len = n * shape.inner();
    b.gated_norm(&mut s.out, &s.z, len, b.param(&w.norm)?, shape.v_dim, eps)?;
    Ok(())
}
