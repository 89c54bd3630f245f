//! Nemotron-H in a checkpoint: which part each block has (`layers_block_type`, or the older
//! `hybrid_override_pattern`), the Mamba-2 shape and the settings ferrite's blocks assume,
//! the names of its tensors (`backbone.*`), and the shapes llama.cpp's `nemotron_h` layout
//! gives the per-head and per-group vectors.
//!
//! Every Nemotron-H block has one norm and one part: a Mamba-2 mixer, attention without rope
//! or a squared-ReLU MLP. The GGUF says which by per-block arrays (KV heads for attention,
//! an FFN width for the MLP, both zero for Mamba-2), as llama.cpp writes them; the loader
//! reads the same arrays back. Mixture-of-experts blocks (Nemotron 3) are refused by name.
//! This module never decides the hyper-parameters of other families.

use ferrite_arch::{BlockKind, GlobalTensor, Kind, Mamba2Shape, TensorName, TensorRole};
use serde_json::{Map, Value as Json};

use crate::ConvertError;
use crate::config::{bad, get_usize, need_usize};
use crate::names::Mapped;

/// The blocks of a Nemotron-H checkpoint and the shape of its Mamba-2 mixers.
#[derive(Debug, Clone, PartialEq)]
pub struct Mamba2Hybrid {
    /// The mixers' shape.
    pub shape: Mamba2Shape,
    /// One entry per block.
    pub blocks: Vec<BlockKind>,
    /// `time_step_min`: transformers' torch path floors every time step there (its CUDA
    /// kernels, llama.cpp and vLLM do not); written as `ssm.time_step_min` so that ferrite
    /// computes what transformers' reference does.
    pub dt_min: f64,
}

/// The part of a block named `name`, in either vocabulary transformers has used.
fn kind(name: &str) -> Result<BlockKind, ConvertError> {
    match name {
        "mamba" | "linear_attention" | "M" => Ok(BlockKind::Mamba2),
        "attention" | "full_attention" | "*" => Ok(BlockKind::Attention),
        "mlp" | "-" => Ok(BlockKind::Mlp),
        "moe" | "E" => Err(ConvertError::UnsupportedFeature(
            "Nemotron-H mixture-of-experts blocks".into(),
        )),
        other => Err(bad(
            "layers_block_type",
            format!("{other:?} is not a block kind"),
        )),
    }
}

/// Which part each block has: `layers_block_type` (transformers 5) or the pattern string
/// of earlier configs, one character a block.
fn blocks(cfg: &Map<String, Json>) -> Result<Vec<BlockKind>, ConvertError> {
    if let Some(list) = cfg.get("layers_block_type") {
        let list = list
            .as_array()
            .ok_or_else(|| bad("layers_block_type", "is not a list"))?;
        return list
            .iter()
            .map(|v| {
                v.as_str()
                    .ok_or_else(|| bad("layers_block_type", format!("{v} is not a string")))
                    .and_then(kind)
            })
            .collect();
    }
    let pattern = cfg
        .get("hybrid_override_pattern")
        .and_then(Json::as_str)
        .ok_or_else(|| {
            bad(
                "layers_block_type",
                "missing (and no hybrid_override_pattern)",
            )
        })?;
    pattern
        .chars()
        .map(|c| kind(c.encode_utf8(&mut [0; 4])))
        .collect()
}

/// Refuses what ferrite's Nemotron-H blocks do not compute: other activations, biases,
/// a clamped time step.
fn check_settings(cfg: &Map<String, Json>) -> Result<(), ConvertError> {
    for (key, want) in [("mlp_hidden_act", "relu2"), ("mamba_hidden_act", "silu")] {
        let act = cfg.get(key).and_then(Json::as_str).unwrap_or(want);
        if act != want {
            return Err(ConvertError::UnsupportedFeature(format!(
                "{key} {act:?} (only {want} for Nemotron-H)"
            )));
        }
    }
    for (key, default) in [
        ("use_conv_bias", true),
        ("mamba_proj_bias", false),
        ("attention_bias", false),
        ("mlp_bias", false),
        ("use_bias", false),
    ] {
        let v = match cfg.get(key) {
            None | Some(Json::Null) => default,
            Some(Json::Bool(b)) => *b,
            Some(v) => return Err(bad(key, format!("expected a boolean, got {v}"))),
        };
        if v != default {
            return Err(ConvertError::UnsupportedFeature(format!(
                "{key} {v} (ferrite's Nemotron-H blocks assume {default})"
            )));
        }
    }
    // transformers clamps the time step to this range; (0, ∞) is no clamp at all.
    if let Some(limit) = cfg.get("time_step_limit") {
        let lower = limit.get(0).and_then(Json::as_f64);
        let upper = limit.get(1);
        let unbounded = upper.is_some_and(|u| {
            u.get("__float__").and_then(Json::as_str) == Some("Infinity")
                || u.as_f64().is_some_and(f64::is_infinite)
        });
        if lower != Some(0.0) || !unbounded {
            return Err(ConvertError::UnsupportedFeature(format!(
                "time_step_limit {limit} (only the unclamped (0, inf))"
            )));
        }
    }
    Ok(())
}

/// The blocks and Mamba-2 shape of a Nemotron-H `config.json`.
pub(crate) fn hybrid(cfg: &Map<String, Json>) -> Result<Mamba2Hybrid, ConvertError> {
    check_settings(cfg)?;
    let blocks = blocks(cfg)?;
    if blocks.is_empty() {
        return Err(bad("layers_block_type", "lists no block"));
    }
    if let Some(n) = get_usize(cfg, "num_hidden_layers")?
        && n != blocks.len()
    {
        return Err(bad(
            "num_hidden_layers",
            format!("{n}, but the block list has {}", blocks.len()),
        ));
    }
    if !blocks.contains(&BlockKind::Attention) {
        return Err(ConvertError::UnsupportedFeature(
            "a Nemotron-H model without attention blocks".into(),
        ));
    }
    let shape = Mamba2Shape {
        conv_kernel: need_usize(cfg, "conv_kernel")?,
        n_groups: need_usize(cfg, "n_groups")?,
        d_state: need_usize(cfg, "ssm_state_size")?,
        n_heads: need_usize(cfg, "mamba_num_heads")?,
        head_dim: need_usize(cfg, "mamba_head_dim")?,
    };
    if shape.conv_kernel < 2 {
        return Err(bad("conv_kernel", "must be at least 2"));
    }
    if !shape.n_heads.is_multiple_of(shape.n_groups) {
        return Err(bad("n_groups", "must divide mamba_num_heads"));
    }
    let dt_min = match cfg.get("time_step_min") {
        None | Some(Json::Null) => 0.001,
        Some(v) => v
            .as_f64()
            .filter(|v| v.is_finite() && *v >= 0.0)
            .ok_or_else(|| bad("time_step_min", format!("{v} is not a step ≥ 0")))?,
    };
    Ok(Mamba2Hybrid {
        shape,
        blocks,
        dt_min,
    })
}

/// The checkpoint's name of the token embedding.
pub(crate) const EMBEDDING: &str = "backbone.embeddings.weight";

/// The block index of a Nemotron-H tensor name.
pub(crate) fn layer_of(name: &str) -> Option<usize> {
    name.strip_prefix("backbone.layers.")?
        .split('.')
        .next()?
        .parse()
        .ok()
}

/// What a Nemotron-H tensor becomes; `None` for a name it does not have.
pub(crate) fn map(name: &str) -> Option<Mapped> {
    let global = |t: GlobalTensor| Some(Mapped::Plain(t.name().to_owned()));
    match name {
        EMBEDDING => return global(GlobalTensor::TokenEmbd),
        "backbone.norm_f.weight" => return global(GlobalTensor::OutputNorm),
        "lm_head.weight" => return global(GlobalTensor::Output),
        _ => {}
    }
    let layer = layer_of(name)?;
    let stem = name.strip_prefix("backbone.layers.")?.split_once('.')?.1;
    let (role, kind) = match stem {
        "norm.weight" => (TensorRole::AttnNorm, Kind::Weight),
        "mixer.in_proj.weight" => (TensorRole::SsmIn, Kind::Weight),
        "mixer.conv1d.weight" => return Some(Mapped::Conv1d { layer }),
        "mixer.conv1d.bias" => (TensorRole::SsmConv1d, Kind::Bias),
        "mixer.dt_bias" => (TensorRole::SsmDt, Kind::Bias),
        "mixer.A_log" => return Some(Mapped::DecayRate { layer }),
        "mixer.D" => (TensorRole::SsmD, Kind::Bare),
        "mixer.norm.weight" => (TensorRole::SsmNorm, Kind::Weight),
        "mixer.out_proj.weight" => (TensorRole::SsmOut, Kind::Weight),
        "mixer.q_proj.weight" => (TensorRole::AttnQ, Kind::Weight),
        "mixer.k_proj.weight" => (TensorRole::AttnK, Kind::Weight),
        "mixer.v_proj.weight" => (TensorRole::AttnV, Kind::Weight),
        "mixer.o_proj.weight" => (TensorRole::AttnOutput, Kind::Weight),
        "mixer.up_proj.weight" => (TensorRole::FfnUp, Kind::Weight),
        "mixer.down_proj.weight" => (TensorRole::FfnDown, Kind::Weight),
        _ => return None,
    };
    Some(Mapped::Plain(role.name(layer, kind)))
}

impl Mamba2Hybrid {
    /// Refuses GGUF tensor `gguf` unless its block's part has it (a checkpoint whose
    /// tensors and block list disagree would load as another model or not at all).
    pub(crate) fn check_tensor(&self, gguf: &str, hf: &str) -> Result<(), ConvertError> {
        let Some(TensorName::Layer { layer, role, kind }) = TensorName::parse(gguf) else {
            return Ok(());
        };
        let block = self.blocks.get(layer).copied();
        if block.is_some_and(|b| b.tensors().contains(&(role, kind))) {
            return Ok(());
        }
        Err(ConvertError::BadTensor {
            tensor: hf.to_owned(),
            reason: format!("block {layer} is {block:?} in the config, which has no such tensor"),
        })
    }

    /// The row-major shape llama.cpp's layout stores `gguf` in, for a tensor of checkpoint
    /// shape `shape`: `A` and `D` as `[heads, 1]`, the mixer's norm as `[groups, inner /
    /// groups]`; the data stays as it is.
    pub(crate) fn stored_shape(&self, gguf: &str, shape: &[u64]) -> Vec<u64> {
        let s = self.shape;
        match TensorName::parse(gguf) {
            Some(TensorName::Layer {
                role: TensorRole::SsmA | TensorRole::SsmD,
                ..
            }) if shape == [s.n_heads as u64] => vec![s.n_heads as u64, 1],
            Some(TensorName::Layer {
                role: TensorRole::SsmNorm,
                ..
            }) if shape == [s.inner() as u64] => {
                vec![s.n_groups as u64, (s.inner() / s.n_groups) as u64]
            }
            _ => shape.to_vec(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hybrid_of(extra: &str) -> Result<Mamba2Hybrid, ConvertError> {
        let text = format!(
            r#"{{"conv_kernel": 4, "n_groups": 2, "ssm_state_size": 16, "mamba_num_heads": 4,
                "mamba_head_dim": 16 {extra}}}"#
        );
        let Json::Object(cfg) = serde_json::from_str(&text).unwrap() else {
            unreachable!()
        };
        hybrid(&cfg)
    }

    #[test]
    fn blocks_come_from_either_vocabulary_and_bad_ones_are_refused() {
        use BlockKind::{Attention as A, Mamba2 as M, Mlp as F};
        let listed = hybrid_of(
            r#", "layers_block_type": ["linear_attention", "mlp", "mamba", "full_attention"]"#,
        )
        .unwrap();
        assert_eq!(listed.blocks, [M, F, M, A]);
        let pattern = hybrid_of(r#", "hybrid_override_pattern": "M-M*""#).unwrap();
        assert_eq!(pattern, listed);
        assert_eq!(pattern.shape.inner(), 64);
        assert_eq!(pattern.dt_min, 0.001, "transformers' default");
        for (extra, named) in [
            (
                r#", "hybrid_override_pattern": "M-E*""#,
                "mixture-of-experts",
            ),
            (
                r#", "hybrid_override_pattern": "M-X*""#,
                "\"X\" is not a block kind",
            ),
            (r#", "hybrid_override_pattern": "M-M""#, "without attention"),
            (r#", "hybrid_override_pattern": """#, "lists no block"),
            ("", "no hybrid_override_pattern"),
            (
                r#", "hybrid_override_pattern": "M*", "num_hidden_layers": 3"#,
                "the block list has 2",
            ),
            (
                r#", "hybrid_override_pattern": "M*", "mlp_hidden_act": "silu""#,
                "only relu2",
            ),
            (
                r#", "hybrid_override_pattern": "M*", "use_conv_bias": false"#,
                "use_conv_bias false",
            ),
            (
                r#", "hybrid_override_pattern": "M*", "time_step_limit": [0.0, 1.0]"#,
                "time_step_limit",
            ),
            (
                r#", "hybrid_override_pattern": "M*", "n_groups": 3"#,
                "must divide mamba_num_heads",
            ),
        ] {
            let e = hybrid_of(extra).unwrap_err().to_string();
            assert!(e.contains(named), "{extra}: {e}");
        }
        let unclamped = r#", "hybrid_override_pattern": "M*",
            "time_step_limit": [0.0, {"__float__": "Infinity"}]"#;
        assert!(hybrid_of(unclamped).is_ok());
    }

    #[test]
    fn maps_names_like_llama_cpp_and_checks_them_against_the_blocks() {
        let plain = |s: &str| Some(Mapped::Plain(s.into()));
        for (hf, want) in [
            (EMBEDDING, plain("token_embd.weight")),
            ("backbone.norm_f.weight", plain("output_norm.weight")),
            ("lm_head.weight", plain("output.weight")),
            (
                "backbone.layers.0.norm.weight",
                plain("blk.0.attn_norm.weight"),
            ),
            (
                "backbone.layers.0.mixer.in_proj.weight",
                plain("blk.0.ssm_in.weight"),
            ),
            (
                "backbone.layers.0.mixer.conv1d.weight",
                Some(Mapped::Conv1d { layer: 0 }),
            ),
            (
                "backbone.layers.0.mixer.conv1d.bias",
                plain("blk.0.ssm_conv1d.bias"),
            ),
            (
                "backbone.layers.0.mixer.dt_bias",
                plain("blk.0.ssm_dt.bias"),
            ),
            (
                "backbone.layers.0.mixer.A_log",
                Some(Mapped::DecayRate { layer: 0 }),
            ),
            ("backbone.layers.0.mixer.D", plain("blk.0.ssm_d")),
            (
                "backbone.layers.0.mixer.norm.weight",
                plain("blk.0.ssm_norm.weight"),
            ),
            (
                "backbone.layers.0.mixer.out_proj.weight",
                plain("blk.0.ssm_out.weight"),
            ),
            (
                "backbone.layers.3.mixer.q_proj.weight",
                plain("blk.3.attn_q.weight"),
            ),
            (
                "backbone.layers.3.mixer.o_proj.weight",
                plain("blk.3.attn_output.weight"),
            ),
            (
                "backbone.layers.1.mixer.up_proj.weight",
                plain("blk.1.ffn_up.weight"),
            ),
            (
                "backbone.layers.1.mixer.down_proj.weight",
                plain("blk.1.ffn_down.weight"),
            ),
            ("backbone.layers.1.mixer.gate_proj.weight", None),
            ("model.layers.0.self_attn.q_proj.weight", None),
        ] {
            assert_eq!(map(hf), want, "{hf}");
        }
        let h = hybrid_of(r#", "hybrid_override_pattern": "M-M*""#).unwrap();
        assert!(h.check_tensor("blk.1.ffn_up.weight", "up").is_ok());
        assert!(h.check_tensor("token_embd.weight", "embd").is_ok());
        for wrong in [
            "blk.0.ffn_up.weight",
            "blk.3.ssm_in.weight",
            "blk.4.attn_norm.weight",
        ] {
            let e = h.check_tensor(wrong, "x").unwrap_err().to_string();
            assert!(e.contains("no such tensor"), "{wrong}: {e}");
        }
        assert_eq!(h.stored_shape("blk.0.ssm_a", &[4]), [4, 1]);
        assert_eq!(h.stored_shape("blk.0.ssm_d", &[4]), [4, 1]);
        assert_eq!(h.stored_shape("blk.0.ssm_norm.weight", &[64]), [2, 32]);
        assert_eq!(h.stored_shape("blk.0.ssm_in.weight", &[196, 64]), [196, 64]);
    }
}
