//! Qwen3-Next in a checkpoint: the gated DeltaNet's shape from `config.json`, the names of
//! its tensors, and the rows of its grouped projections in the flat order GGUF holds.
//!
//! Hugging Face stores `in_proj_qkvz` and `in_proj_ba` grouped by key head (per key head: its
//! query, its key, then the values and gates of the value heads it serves) and the gated
//! attention's `q_proj` per head as `[query | gate]`. The GGUF written keeps one tensor per
//! role with its rows in head order: `attn_qkv` (every query, every key, every value, which
//! is the convolution's channel order), `attn_gate`, `ssm_beta`, `ssm_alpha`, and `attn_q`
//! beside the attention's `attn_gate`. A file of llama.cpp's older layout (`ssm_in`,
//! `ssm_ba`, a doubled `attn_q`) is refused by the loader by name, never misread.
//! This module never decides the hyper-parameters of other families.

use std::ops::Range;

use ferrite_arch::{DeltaNetShape, Kind, TensorRole};
use serde_json::{Map, Value as Json};

use crate::ConvertError;
use crate::config::{bad, get_usize, need_usize};
use crate::names::Mapped;

/// The DeltaNet shape of a Qwen3-Next `config.json` with `n_layer` layers.
pub(crate) fn shape(
    cfg: &Map<String, Json>,
    n_layer: usize,
) -> Result<DeltaNetShape, ConvertError> {
    let types = cfg.get("layer_types").and_then(Json::as_array);
    // transformers 5 may keep only the list; its first full-attention layer gives the
    // interval, which the check below holds every layer to.
    let listed = types.and_then(|t| t.iter().position(|k| k.as_str() == Some("full_attention")));
    let interval = match get_usize(cfg, "full_attention_interval")? {
        Some(i) => i,
        None => listed.map_or(4, |i| i + 1),
    };
    let s = DeltaNetShape {
        conv_kernel: need_usize(cfg, "linear_conv_kernel_dim")?,
        k_heads: need_usize(cfg, "linear_num_key_heads")?,
        v_heads: need_usize(cfg, "linear_num_value_heads")?,
        k_dim: need_usize(cfg, "linear_key_head_dim")?,
        v_dim: need_usize(cfg, "linear_value_head_dim")?,
        interval,
    };
    if s.interval == 0 {
        return Err(bad("full_attention_interval", "must be positive"));
    }
    if s.conv_kernel < 2 {
        return Err(bad("linear_conv_kernel_dim", "must be at least 2"));
    }
    if !s.v_heads.is_multiple_of(s.k_heads) {
        return Err(bad(
            "linear_num_value_heads",
            "must be a multiple of linear_num_key_heads",
        ));
    }
    // transformers 5 lists the layer kinds; they must be the interval's.
    if let Some(types) = types {
        let want = (0..n_layer).map(|i| {
            if s.is_attention(i) {
                "full_attention"
            } else {
                "linear_attention"
            }
        });
        if types.len() != n_layer || !types.iter().map(Json::as_str).eq(want.map(Some)) {
            return Err(ConvertError::UnsupportedFeature(format!(
                "layer_types other than one full_attention layer every {} (GGUF has only the interval)",
                s.interval
            )));
        }
    }
    Ok(s)
}

/// What a Qwen3-Next tensor of layer `layer` becomes, for the names this family has of its
/// own (`None`: the common names apply).
pub(crate) fn map(layer: usize, stem: &str, kind: Option<Kind>) -> Option<Mapped> {
    let plain = |role: TensorRole, kind: Kind| Some(Mapped::Plain(role.name(layer, kind)));
    let w = Some(Kind::Weight);
    match (stem, kind) {
        ("linear_attn.in_proj_qkvz", k) if k == w => Some(Mapped::DeltaQkvz { layer }),
        ("linear_attn.in_proj_ba", k) if k == w => Some(Mapped::DeltaBa { layer }),
        ("linear_attn.conv1d", k) if k == w => Some(Mapped::Conv1d { layer }),
        ("linear_attn.A_log", None) => Some(Mapped::DecayRate { layer }),
        ("linear_attn.dt_bias", None) => plain(TensorRole::SsmDt, Kind::Bias),
        ("linear_attn.norm", k) if k == w => plain(TensorRole::SsmNorm, Kind::Weight),
        ("linear_attn.out_proj", k) if k == w => plain(TensorRole::SsmOut, Kind::Weight),
        ("self_attn.q_proj", k) if k == w => Some(Mapped::GatedQ { layer }),
        ("post_attention_layernorm", k) if k == w => {
            plain(TensorRole::PostAttentionNorm, Kind::Weight)
        }
        ("mlp.shared_expert.gate_proj", k) if k == w => {
            plain(TensorRole::FfnGateShexp, Kind::Weight)
        }
        ("mlp.shared_expert.up_proj", k) if k == w => plain(TensorRole::FfnUpShexp, Kind::Weight),
        ("mlp.shared_expert.down_proj", k) if k == w => {
            plain(TensorRole::FfnDownShexp, Kind::Weight)
        }
        ("mlp.shared_expert_gate", k) if k == w => plain(TensorRole::FfnGateInpShexp, Kind::Weight),
        _ => None,
    }
}

/// How the rows of a grouped projection are taken: `blocks` blocks of `block_rows` rows,
/// and of each block the ranges `parts`, part after part (all blocks' first range, then
/// all blocks' second, ...).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Rows {
    pub blocks: usize,
    pub block_rows: usize,
    pub parts: Vec<Range<usize>>,
}

impl Rows {
    /// Rows of the result.
    pub fn len(&self) -> usize {
        self.blocks * self.parts.iter().map(ExactSizeIterator::len).sum::<usize>()
    }
}

/// Which output tensor of a grouped Qwen3-Next projection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Split {
    /// `in_proj_qkvz` → `attn_qkv`.
    Qkv,
    /// `in_proj_qkvz` → `attn_gate` (the DeltaNet's output gate `z`).
    Z,
    /// `in_proj_ba` → `ssm_beta`.
    Beta,
    /// `in_proj_ba` → `ssm_alpha`.
    Alpha,
    /// The gated attention's `q_proj` → `attn_q`.
    Query,
    /// The gated attention's `q_proj` → `attn_gate`.
    QueryGate,
}

impl Split {
    /// The GGUF role written.
    pub fn role(self) -> TensorRole {
        match self {
            Split::Qkv => TensorRole::AttnQkv,
            Split::Z | Split::QueryGate => TensorRole::AttnGate,
            Split::Beta => TensorRole::SsmBeta,
            Split::Alpha => TensorRole::SsmAlpha,
            Split::Query => TensorRole::AttnQ,
        }
    }

    /// The rows taken, for a DeltaNet of shape `s` and attention of `n_head` heads of
    /// `head_dim`.
    // Lists of one range are lists of parts, not ranges to expand.
    #[allow(clippy::single_range_in_vec_init)]
    pub fn rows(self, s: DeltaNetShape, n_head: usize, head_dim: usize) -> Rows {
        let r = s.v_heads / s.k_heads;
        let (dk, vr) = (s.k_dim, r * s.v_dim);
        let group = 2 * dk + 2 * vr;
        let (blocks, block_rows, parts) = match self {
            Split::Qkv => (
                s.k_heads,
                group,
                vec![0..dk, dk..2 * dk, 2 * dk..2 * dk + vr],
            ),
            Split::Z => (s.k_heads, group, vec![2 * dk + vr..group]),
            Split::Beta => (s.k_heads, 2 * r, vec![0..r]),
            Split::Alpha => (s.k_heads, 2 * r, vec![r..2 * r]),
            Split::Query => (n_head, 2 * head_dim, vec![0..head_dim]),
            Split::QueryGate => (n_head, 2 * head_dim, vec![head_dim..2 * head_dim]),
        };
        Rows {
            blocks,
            block_rows,
            parts,
        }
    }
}

/// The rows `rows` of the matrix `bytes`, in their order.
pub(crate) fn take_rows(bytes: &[u8], rows: &Rows) -> Vec<u8> {
    let row_bytes = bytes.len() / (rows.blocks * rows.block_rows);
    let mut out = Vec::with_capacity(rows.len() * row_bytes);
    for part in &rows.parts {
        for b in 0..rows.blocks {
            let at = b * rows.block_rows;
            out.extend_from_slice(
                &bytes[(at + part.start) * row_bytes..(at + part.end) * row_bytes],
            );
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const SHAPE: DeltaNetShape = DeltaNetShape {
        conv_kernel: 4,
        k_heads: 2,
        v_heads: 4,
        k_dim: 3,
        v_dim: 2,
        interval: 2,
    };

    /// The oracle: transformers' `fix_query_key_value_ordering`, spelled out on row
    /// labels: per key head `[q(3) k(3) v(2 heads × 2) z(2 × 2)]`, 14 rows a group.
    #[test]
    fn grouped_rows_come_out_in_head_order() {
        let labels: Vec<u8> = (0..28).collect();
        let take = |s: Split| take_rows(&labels, &s.rows(SHAPE, 2, 3));
        assert_eq!(
            take(Split::Qkv),
            [
                0, 1, 2, 14, 15, 16, 3, 4, 5, 17, 18, 19, 6, 7, 8, 9, 20, 21, 22, 23
            ]
        );
        assert_eq!(take(Split::Z), [10, 11, 12, 13, 24, 25, 26, 27]);
        // `in_proj_ba`: per key head `[b(2) a(2)]`.
        let ba: Vec<u8> = (0..8).collect();
        assert_eq!(take_rows(&ba, &Split::Beta.rows(SHAPE, 2, 3)), [0, 1, 4, 5]);
        assert_eq!(
            take_rows(&ba, &Split::Alpha.rows(SHAPE, 2, 3)),
            [2, 3, 6, 7]
        );
        // `q_proj`: per head `[q(3) gate(3)]`.
        let q: Vec<u8> = (0..12).collect();
        assert_eq!(
            take_rows(&q, &Split::Query.rows(SHAPE, 2, 3)),
            [0, 1, 2, 6, 7, 8]
        );
        assert_eq!(
            take_rows(&q, &Split::QueryGate.rows(SHAPE, 2, 3)),
            [3, 4, 5, 9, 10, 11]
        );
        assert_eq!(Split::Qkv.rows(SHAPE, 2, 3).len(), SHAPE.conv_channels());
    }

    #[test]
    fn layer_kinds_must_follow_the_interval() {
        let cfg = |types: &str| {
            let j: Json = serde_json::from_str(&format!(
                r#"{{"linear_conv_kernel_dim":4,"linear_num_key_heads":2,"linear_num_value_heads":4,
                "linear_key_head_dim":3,"linear_value_head_dim":2,"full_attention_interval":2,
                "layer_types":{types}}}"#
            ))
            .unwrap();
            j.as_object().unwrap().clone()
        };
        let ok = cfg(r#"["linear_attention","full_attention"]"#);
        assert_eq!(shape(&ok, 2).unwrap(), SHAPE);
        let swapped = cfg(r#"["full_attention","linear_attention"]"#);
        assert!(matches!(
            shape(&swapped, 2),
            Err(ConvertError::UnsupportedFeature(_))
        ));
    }
}
