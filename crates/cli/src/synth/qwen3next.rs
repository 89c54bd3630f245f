//! The tensors and keys of a synthetic Qwen3-Next (`--arch qwen3next`): gated DeltaNet
//! layers with a gated attention layer every fourth, routed experts with a gated shared
//! expert. The DeltaNet takes its shape from the attention's: `--kv-heads` key heads and
//! `--heads` value heads of the head size, a 4-tap convolution; every expert and the shared
//! one are `--ffn` wide. Decay rates are a constant −1 so that the recurrence stays stable
//! with random weights.

use ferrite_arch::{DeltaNetShape, Key, Kind, TensorName, TensorRole};
use ferrite_gguf::{GgmlType, Value};

use super::weights::{Init, Spec};
use super::{Shape, TypeArg, matrix_type};

/// Experts per layer and experts each token uses.
pub(super) const EXPERTS: (usize, usize) = (8, 2);

/// The DeltaNet shape of `s`.
pub(super) fn delta_net(s: &Shape) -> DeltaNetShape {
    DeltaNetShape {
        conv_kernel: 4,
        k_heads: s.kv_heads,
        v_heads: s.heads,
        k_dim: s.head_dim(),
        v_dim: s.head_dim(),
        interval: 4,
    }
}

/// The tensors of layer `l`.
pub(super) fn layer(ty: TypeArg, s: &Shape, l: usize) -> Vec<Spec> {
    let hd = s.head_dim();
    let dn = delta_net(s);
    let (e, ff) = (EXPERTS.0, s.ffn);
    let name = |role: TensorRole, kind: Kind| TensorName::Layer {
        layer: l,
        role,
        kind,
    };
    let matrix = |role: TensorRole, cols: usize, rows: &[usize]| {
        let n = name(role, Kind::Weight);
        Spec {
            name: n.to_name(),
            dims: [&[cols][..], rows]
                .concat()
                .iter()
                .map(|&d| d as u64)
                .collect(),
            ty: matrix_type(ty, n, s.layers, cols),
            init: Init::Normal,
        }
    };
    let vector = |role: TensorRole, kind: Kind, len: usize, init: Init| Spec {
        name: name(role, kind).to_name(),
        dims: vec![len as u64],
        ty: GgmlType::F32,
        init,
    };
    let ones = Init::Const(1.0);
    let mut out = vec![
        vector(TensorRole::AttnNorm, Kind::Weight, s.hidden, ones),
        vector(TensorRole::PostAttentionNorm, Kind::Weight, s.hidden, ones),
        Spec {
            ty: GgmlType::F32,
            ..matrix(TensorRole::FfnGateInp, s.hidden, &[e])
        },
        matrix(TensorRole::FfnGateExps, s.hidden, &[ff, e]),
        matrix(TensorRole::FfnUpExps, s.hidden, &[ff, e]),
        matrix(TensorRole::FfnDownExps, ff, &[s.hidden, e]),
        matrix(TensorRole::FfnGateShexp, s.hidden, &[ff]),
        matrix(TensorRole::FfnUpShexp, s.hidden, &[ff]),
        matrix(TensorRole::FfnDownShexp, ff, &[s.hidden]),
        Spec {
            ty: GgmlType::F32,
            ..matrix(TensorRole::FfnGateInpShexp, s.hidden, &[1])
        },
    ];
    if dn.is_attention(l) {
        let (q, kv) = (s.heads * hd, s.kv_heads * hd);
        out.extend([
            matrix(TensorRole::AttnQ, s.hidden, &[q]),
            matrix(TensorRole::AttnK, s.hidden, &[kv]),
            matrix(TensorRole::AttnV, s.hidden, &[kv]),
            matrix(TensorRole::AttnGate, s.hidden, &[q]),
            matrix(TensorRole::AttnOutput, q, &[s.hidden]),
            vector(TensorRole::AttnQNorm, Kind::Weight, hd, ones),
            vector(TensorRole::AttnKNorm, Kind::Weight, hd, ones),
        ]);
    } else {
        let c = dn.conv_channels();
        out.extend([
            matrix(TensorRole::AttnQkv, s.hidden, &[c]),
            matrix(TensorRole::AttnGate, s.hidden, &[dn.inner()]),
            matrix(TensorRole::SsmBeta, s.hidden, &[dn.v_heads]),
            matrix(TensorRole::SsmAlpha, s.hidden, &[dn.v_heads]),
            Spec {
                ty: GgmlType::F32,
                ..matrix(TensorRole::SsmConv1d, dn.conv_kernel, &[c])
            },
            matrix(TensorRole::SsmOut, dn.inner(), &[s.hidden]),
            vector(TensorRole::SsmNorm, Kind::Weight, dn.v_dim, ones),
            vector(TensorRole::SsmA, Kind::Bare, dn.v_heads, Init::Const(-1.0)),
            vector(TensorRole::SsmDt, Kind::Bias, dn.v_heads, Init::Const(0.0)),
        ]);
    }
    out
}

/// The keys beyond the common ones.
pub(super) fn metadata(s: &Shape) -> Vec<(Key, Value)> {
    let u = |v: usize| Value::U32(u32::try_from(v).unwrap_or(u32::MAX));
    let dn = delta_net(s);
    vec![
        (Key::LayerNormRmsEpsilon, Value::F32(1e-6)),
        (Key::RopeFreqBase, Value::F32(10_000_000.0)),
        (Key::ExpertCount, u(EXPERTS.0)),
        (Key::ExpertUsedCount, u(EXPERTS.1)),
        (Key::ExpertFeedForwardLength, u(s.ffn)),
        (Key::ExpertWeightsNorm, Value::Bool(true)),
        (Key::ExpertSharedCount, u(1)),
        (Key::ExpertSharedFeedForwardLength, u(s.ffn)),
        (Key::SsmConvKernel, u(dn.conv_kernel)),
        (Key::SsmStateSize, u(dn.k_dim)),
        (Key::SsmGroupCount, u(dn.k_heads)),
        (Key::SsmTimeStepRank, u(dn.v_heads)),
        (Key::SsmInnerSize, u(dn.inner())),
        (Key::FullAttentionInterval, u(dn.interval)),
    ]
}
