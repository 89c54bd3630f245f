//! The tensors and keys of a synthetic Nemotron-H (`--arch nemotron_h`): blocks of one part
//! each, a squared-ReLU MLP of `--ffn` in every odd block, attention (`--heads` /
//! `--kv-heads`, no rope) in every block `l` with `l % 8 == 6`, a Mamba-2 mixer in the rest,
//! as Nemotron-H 8B alternates them. The mixer has twice `--heads` heads of the head size
//! in `--kv-heads` groups, a state of 128 and a 4-tap convolution, so its inner width is
//! twice the hidden one (Nemotron-H's `expand` 2). `A` is a constant −1 and `D` 1, so that
//! the recurrence stays stable with random weights.

use ferrite_arch::{BlockKind, Key, Kind, Mamba2Shape, TensorName, TensorRole};
use ferrite_gguf::{Array, GgmlType, Value};

use super::weights::{Init, Spec};
use super::{Shape, TypeArg, matrix_type};

/// The part of block `l`.
pub(super) fn block(l: usize) -> BlockKind {
    match l {
        l if l % 2 == 1 => BlockKind::Mlp,
        l if l % 8 == 6 => BlockKind::Attention,
        _ => BlockKind::Mamba2,
    }
}

/// The Mamba-2 shape of `s`.
pub(super) fn mamba2(s: &Shape) -> Mamba2Shape {
    Mamba2Shape {
        conv_kernel: 4,
        n_groups: s.kv_heads,
        d_state: 128,
        n_heads: 2 * s.heads,
        head_dim: s.head_dim(),
    }
}

/// The tensors of block `l`.
pub(super) fn layer(ty: TypeArg, s: &Shape, l: usize) -> Vec<Spec> {
    let m = mamba2(s);
    let name = |role: TensorRole, kind: Kind| TensorName::Layer {
        layer: l,
        role,
        kind,
    };
    let matrix = |role: TensorRole, cols: usize, rows: usize| {
        let n = name(role, Kind::Weight);
        Spec {
            name: n.to_name(),
            dims: vec![cols as u64, rows as u64],
            ty: matrix_type(ty, n, s.layers, cols),
            init: Init::Normal,
        }
    };
    let f32s = |role: TensorRole, kind: Kind, dims: &[usize], init: Init| Spec {
        name: name(role, kind).to_name(),
        dims: dims.iter().map(|&d| d as u64).collect(),
        ty: GgmlType::F32,
        init,
    };
    let ones = Init::Const(1.0);
    let mut out = vec![f32s(TensorRole::AttnNorm, Kind::Weight, &[s.hidden], ones)];
    match block(l) {
        BlockKind::Mlp => out.extend([
            matrix(TensorRole::FfnUp, s.hidden, s.ffn),
            matrix(TensorRole::FfnDown, s.ffn, s.hidden),
        ]),
        BlockKind::Attention => {
            let (q, kv) = (s.heads * s.head_dim(), s.kv_heads * s.head_dim());
            out.extend([
                matrix(TensorRole::AttnQ, s.hidden, q),
                matrix(TensorRole::AttnK, s.hidden, kv),
                matrix(TensorRole::AttnV, s.hidden, kv),
                matrix(TensorRole::AttnOutput, q, s.hidden),
            ]);
        }
        BlockKind::Mamba2 => {
            let (c, h) = (m.conv_channels(), m.n_heads);
            out.extend([
                matrix(TensorRole::SsmIn, s.hidden, m.in_rows()),
                f32s(TensorRole::SsmConv1d, Kind::Weight, &[4, c], Init::Normal),
                f32s(TensorRole::SsmConv1d, Kind::Bias, &[c], Init::Const(0.0)),
                f32s(TensorRole::SsmDt, Kind::Bias, &[h], Init::Const(0.0)),
                f32s(TensorRole::SsmA, Kind::Bare, &[1, h], Init::Const(-1.0)),
                f32s(TensorRole::SsmD, Kind::Bare, &[1, h], ones),
                f32s(
                    TensorRole::SsmNorm,
                    Kind::Weight,
                    &[m.inner() / m.n_groups, m.n_groups],
                    ones,
                ),
                matrix(TensorRole::SsmOut, m.inner(), s.hidden),
            ]);
        }
    }
    out
}

/// The keys beyond the common ones: per block, the FFN width of the MLP blocks and the KV
/// heads of the attention blocks (zero elsewhere), the epsilons and the Mamba-2 shape.
pub(super) fn metadata(s: &Shape) -> Vec<(Key, Value)> {
    let u = |v: usize| Value::U32(u32::try_from(v).unwrap_or(u32::MAX));
    let per_block = |part: BlockKind, v: usize| {
        let values = (0..s.layers).map(|l| if block(l) == part { v as u32 } else { 0 });
        Value::Array(Array::U32(values.collect()))
    };
    let m = mamba2(s);
    vec![
        (Key::FeedForwardLength, per_block(BlockKind::Mlp, s.ffn)),
        (
            Key::HeadCountKv,
            per_block(BlockKind::Attention, s.kv_heads),
        ),
        (Key::LayerNormRmsEpsilon, Value::F32(1e-5)),
        (Key::LayerNormEpsilon, Value::F32(1e-5)),
        (Key::SsmConvKernel, u(m.conv_kernel)),
        (Key::SsmStateSize, u(m.d_state)),
        (Key::SsmGroupCount, u(m.n_groups)),
        (Key::SsmTimeStepRank, u(m.n_heads)),
        (Key::SsmInnerSize, u(m.inner())),
    ]
}
