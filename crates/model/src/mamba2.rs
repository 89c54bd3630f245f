//! Nemotron-H's blocks: which part each block has (from the per-layer arrays llama.cpp
//! writes), the Mamba-2 shape from the `ssm.*` keys, the mixer's weights and scratch, and
//! the mixer as a sequence of the contract's ops (the input projection in its three parts,
//! the causal convolution with its bias, the selective scan over each session's state
//! slot, the `silu(z)` gate and the grouped norm). The output projection (`ssm_out`) is the
//! layer's `wo`, run by the forward pass like attention's.
//!
//! This module never computes a value itself.

use ferrite_arch::{Arch, BlockKind, Key, Mamba2Shape, TensorRole};
use ferrite_backend::{Act, Backend, Op, Segment, SsmParams};
use ferrite_gguf::Gguf;

use crate::ModelError;
use crate::model::{Model, Precision, Weight, matrix_rows, vector, vectors};
use crate::session::Weights;

fn bad(key: &str, reason: String) -> ModelError {
    ModelError::BadMetadata {
        key: key.to_owned(),
        reason,
    }
}

/// The parts of a Nemotron-H model's blocks.
#[derive(Debug)]
pub(crate) struct Blocks {
    /// One entry per block of the file.
    pub(crate) kinds: Vec<BlockKind>,
    /// The KV heads of every attention block.
    pub(crate) n_kv_head: usize,
    /// The hidden width of every MLP block.
    pub(crate) d_ff: usize,
}

/// Per-block values of `key`: an array of one integer per block, or one integer for all.
fn per_block(g: &Gguf, key: &str, n: usize) -> Result<Vec<usize>, ModelError> {
    let value = g
        .get(key)
        .ok_or_else(|| ferrite_gguf::GgufError::MissingKey {
            key: key.to_owned(),
        })?;
    let values = match value.as_array() {
        Some(a) => a
            .integers()
            .ok_or_else(|| bad(key, "is not an array of integers".into()))?,
        None => {
            let v = value
                .as_integer()
                .ok_or_else(|| bad(key, "is not an integer".into()))?;
            vec![v; n]
        }
    };
    if values.len() != n {
        return Err(bad(key, format!("{} entries for {n} blocks", values.len())));
    }
    values
        .into_iter()
        .map(|v| usize::try_from(v).map_err(|_| bad(key, format!("{v} is not a count"))))
        .collect()
}

/// The one value of `values` that is not zero, or 0 when all are.
fn common(key: &str, values: &[usize]) -> Result<usize, ModelError> {
    let mut nonzero = values.iter().copied().filter(|&v| v > 0);
    let first = nonzero.next().unwrap_or(0);
    match nonzero.find(|&v| v != first) {
        Some(other) => Err(ModelError::Unsupported {
            key: key.to_owned(),
            what: format!("blocks of different sizes ({first} and {other})"),
        }),
        None => Ok(first),
    }
}

/// Which part each of the `n` blocks of `g` has, as llama.cpp reads them: KV heads make an
/// attention block, an FFN width an MLP block, neither a Mamba-2 block.
pub(crate) fn blocks(g: &Gguf, arch: Arch, n: usize) -> Result<Blocks, ModelError> {
    let (kv_key, ff_key) = (arch.key(Key::HeadCountKv), arch.key(Key::FeedForwardLength));
    let kv = per_block(g, &kv_key, n)?;
    let ff = per_block(g, &ff_key, n)?;
    let kinds = kv
        .iter()
        .zip(&ff)
        .enumerate()
        .map(|(i, (&kv, &ff))| match (kv, ff) {
            (0, 0) => Ok(BlockKind::Mamba2),
            (_, 0) => Ok(BlockKind::Attention),
            (0, _) => Ok(BlockKind::Mlp),
            _ => Err(ModelError::Unsupported {
                key: kv_key.clone(),
                what: format!("block {i} with both attention and an FFN"),
            }),
        })
        .collect::<Result<Vec<_>, _>>()?;
    let n_kv_head = common(&kv_key, &kv)?;
    if n_kv_head == 0 {
        return Err(ModelError::Unsupported {
            key: kv_key,
            what: "a Nemotron-H model without attention blocks".into(),
        });
    }
    Ok(Blocks {
        kinds,
        n_kv_head,
        d_ff: common(&ff_key, &ff)?,
    })
}

fn count(g: &Gguf, key: &str) -> Result<usize, ModelError> {
    let v = g.get_u32(key)?;
    match usize::try_from(v) {
        Ok(v) if v > 0 => Ok(v),
        _ => Err(bad(key, format!("{v} must be a positive count"))),
    }
}

/// Reads and checks the Mamba-2 keys of `g`.
pub(crate) fn from_gguf(g: &Gguf, arch: Arch) -> Result<Mamba2Shape, ModelError> {
    let k = |key: Key| arch.key(key);
    let n_heads = count(g, &k(Key::SsmTimeStepRank))?;
    let inner_key = k(Key::SsmInnerSize);
    let inner = count(g, &inner_key)?;
    if !inner.is_multiple_of(n_heads) {
        return Err(bad(
            &inner_key,
            format!("{inner} is not {n_heads} equal heads"),
        ));
    }
    let s = Mamba2Shape {
        conv_kernel: count(g, &k(Key::SsmConvKernel))?,
        n_groups: count(g, &k(Key::SsmGroupCount))?,
        d_state: count(g, &k(Key::SsmStateSize))?,
        n_heads,
        head_dim: inner / n_heads,
    };
    if s.conv_kernel < 2 {
        return Err(bad(&k(Key::SsmConvKernel), "must be at least 2".into()));
    }
    if !s.n_heads.is_multiple_of(s.n_groups) {
        return Err(bad(
            &k(Key::SsmGroupCount),
            format!("{} groups for {n_heads} heads", s.n_groups),
        ));
    }
    Ok(s)
}

/// The floor of the time steps (`ssm.time_step_min`, ferrite's key: transformers' torch
/// path floors every step there); 0, no floor, when the file has none (llama.cpp's).
pub(crate) fn dt_min(g: &Gguf) -> Result<f32, ModelError> {
    let key = Arch::NemotronH.key(Key::SsmTimeStepMin);
    let v = match g.get(&key) {
        None => return Ok(0.0),
        Some(_) => g.get_f32(&key)?,
    };
    if !(v.is_finite() && v >= 0.0) {
        return Err(bad(&key, format!("{v} is not a finite, non-negative step")));
    }
    Ok(v)
}

/// The weights of one Mamba-2 mixer.
#[derive(Debug)]
pub(crate) struct Mamba2Weights {
    /// The gate `z`, the convolution's input and the time steps: the three row ranges of
    /// `ssm_in`.
    z: Weight,
    xbc: Weight,
    dt: Weight,
    /// `channels × kernel` taps, and one bias per channel.
    conv: Vec<f32>,
    conv_bias: Vec<f32>,
    /// `-exp(A_log)`, the skip weight `D` and the time step's bias, per head.
    a: Vec<f32>,
    d: Vec<f32>,
    dt_bias: Vec<f32>,
    /// The grouped norm's weight, `inner` values.
    norm: Vec<f32>,
    /// The time steps' floor (`ssm.time_step_min`; 0 when the file has none).
    dt_min: f32,
}

impl Mamba2Weights {
    /// Layer `i`'s weights, and its output projection (`ssm_out`).
    pub(crate) fn load(
        g: &Gguf,
        (s, d): (&Mamba2Shape, usize),
        i: usize,
        p: Precision,
    ) -> Result<(Mamba2Weights, Weight), ModelError> {
        let n = |r: TensorRole| r.weight(i);
        let (inner, c, h) = (s.inner(), s.conv_channels(), s.n_heads);
        let input = n(TensorRole::SsmIn);
        let rows = |r: std::ops::Range<usize>| matrix_rows(g, &input, s.in_rows(), r, d, p);
        let w = Mamba2Weights {
            z: rows(0..inner)?,
            xbc: rows(inner..inner + c)?,
            dt: rows(inner + c..s.in_rows())?,
            conv: vectors(g, &n(TensorRole::SsmConv1d), s.conv_kernel, c)?,
            conv_bias: vector(g, &TensorRole::SsmConv1d.bias(i), c)?,
            a: vectors(g, &TensorRole::SsmA.bare(i), 1, h)?,
            d: vectors(g, &TensorRole::SsmD.bare(i), 1, h)?,
            dt_bias: vector(g, &TensorRole::SsmDt.bias(i), h)?,
            norm: vectors(g, &n(TensorRole::SsmNorm), inner / s.n_groups, s.n_groups)?,
            dt_min: dt_min(g)?,
        };
        let out = crate::model::matrix(g, &n(TensorRole::SsmOut), d, inner, p)?;
        Ok((w, out))
    }

    /// Its matrices but the output projection.
    pub(crate) fn matrices(&self) -> [&Weight; 3] {
        [&self.z, &self.xbc, &self.dt]
    }

    /// Asks `b` for the ops of this mixer.
    pub(crate) fn require<B: Backend>(&self, b: &B, s: &Mamba2Shape) -> Result<(), ModelError> {
        for w in self.matrices() {
            b.require(&Op::MatMulShared {
                ty: w.ty(),
                cols: w.cols,
            })?;
        }
        b.require(&Op::Conv1d {
            kernel: s.conv_kernel,
            bias: true,
        })?;
        b.require(&Op::SsmScan {
            d_state: s.d_state,
            head_dim: s.head_dim,
        })?;
        b.require(&Op::GatedAct { act: Act::Silu })?;
        Ok(b.require(&Op::GroupNorm)?)
    }
}

/// Scratch of the Mamba-2 mixers for the rows of one pass.
#[derive(Debug)]
pub(crate) struct Mamba2Scratch<Buf> {
    xbc: Buf,
    conv: Buf,
    dt: Buf,
    y: Buf,
    /// The gate, then the gated, normalised output: the input of `ssm_out`.
    pub(crate) out: Buf,
}

impl<Buf> Mamba2Scratch<Buf> {
    /// Buffers for `rows` rows.
    pub(crate) fn new<B: Backend<Buf = Buf>>(
        b: &B,
        s: &Mamba2Shape,
        rows: usize,
    ) -> Result<Mamba2Scratch<Buf>, ModelError> {
        let buf = |w: usize| -> Result<Buf, ModelError> {
            let len = rows
                .checked_mul(w)
                .ok_or_else(|| ModelError::InvalidArgument("scratch size overflows".into()))?;
            Ok(b.alloc(len)?)
        };
        Ok(Mamba2Scratch {
            xbc: buf(s.conv_channels())?,
            conv: buf(s.conv_channels())?,
            dt: buf(s.n_heads)?,
            y: buf(s.inner())?,
            out: buf(s.inner())?,
        })
    }
}

/// The Mamba-2 mixer of layer `w` (state slot `slot`) over the `n` normalised rows `xn`
/// of `segs`, into `s.out`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn mixer<B: Weights>(
    b: &B,
    m: &Model,
    (shape, w): (&Mamba2Shape, &Mamba2Weights),
    slot: usize,
    xn: &B::Buf,
    n: usize,
    s: &mut Mamba2Scratch<B::Buf>,
    segs: &mut [Segment<'_, B::Kv>],
) -> Result<(), ModelError> {
    let inner = shape.inner();
    b.matmul_shared(
        [b.matrix(m, &w.z), b.matrix(m, &w.xbc), b.matrix(m, &w.dt)],
        xn,
        n,
        [&mut s.out, &mut s.xbc, &mut s.dt],
    )?;
    let bias = Some(b.param(&w.conv_bias)?);
    b.conv1d(
        shape.conv(),
        slot,
        &s.xbc,
        b.param(&w.conv)?,
        bias,
        segs,
        &mut s.conv,
    )?;
    let params = SsmParams {
        a: b.param(&w.a)?,
        d: b.param(&w.d)?,
        dt_bias: b.param(&w.dt_bias)?,
        dt_min: w.dt_min,
    };
    b.ssm_scan(shape, slot, &s.conv, &s.dt, params, segs, &mut s.y)?;
    // out = silu(z) · y, then each group of `inner / n_groups` values normalised.
    b.gated_act(Act::Silu, &mut s.out, &s.y, n, inner)?;
    let (eps, group) = (m.config().rms_eps, inner / shape.n_groups);
    b.group_norm(&mut s.out, n * inner, b.param(&w.norm)?, inner, group, eps)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{tiny_gguf, with_metadata};
    use ferrite_gguf::{Array, GgmlType, Value};

    /// The blocks `kv` and `ff` (per-block arrays, or one value for all) describe.
    fn blocks_of(kv: Value, ff: Value) -> Result<Blocks, ModelError> {
        let base = tiny_gguf("llama", GgmlType::F32, "", "");
        let bytes = with_metadata(
            base,
            vec![
                ("nemotron_h.attention.head_count_kv".into(), kv),
                ("nemotron_h.feed_forward_length".into(), ff),
            ],
        );
        blocks(&Gguf::from_bytes(bytes).unwrap(), Arch::NemotronH, 4)
    }

    fn per(v: [u32; 4]) -> Value {
        Value::Array(Array::U32(v.to_vec()))
    }

    #[test]
    fn blocks_come_from_the_per_block_arrays_and_bad_ones_are_refused() {
        use BlockKind::{Attention as A, Mamba2 as M, Mlp as F};
        let b = blocks_of(per([0, 0, 0, 2]), per([0, 128, 0, 0])).unwrap();
        assert_eq!((b.kinds, b.n_kv_head, b.d_ff), (vec![M, F, M, A], 2, 128));
        // One value for every block: all attention blocks.
        let b = blocks_of(Value::U32(2), Value::U32(0)).unwrap();
        assert_eq!(b.kinds, [A; 4]);
        for (kv, ff, named) in [
            (
                per([0, 0, 0, 2]),
                per([0, 128, 0, 64]),
                "both attention and an FFN",
            ),
            (per([0, 2, 0, 4]), per([0; 4]), "different sizes"),
            (per([0; 4]), per([0, 128, 0, 0]), "without attention blocks"),
            (
                Value::Array(Array::U32(vec![0, 2])),
                per([0; 4]),
                "2 entries for 4 blocks",
            ),
            (Value::String("2".into()), per([0; 4]), "not an integer"),
        ] {
            let e = blocks_of(kv, ff).unwrap_err().to_string();
            assert!(e.contains(named), "{named}: {e}");
        }
    }
}
