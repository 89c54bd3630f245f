//! Checkpoint tensor names → GGUF tensor names, as llama.cpp's gguf-py tensor map spells
//! them (`token_embd`, `blk.N.attn_q`, `blk.N.ffn_gate_exps`, ...). This module owns the
//! Hugging Face side; the GGUF names come from the architecture table (`ferrite-arch`).
//!
//! Per-expert tensors (`mlp.experts.E.gate_proj.weight`, Mixtral's
//! `block_sparse_moe.experts.E.w1.weight`) and transformers 5's fused expert tensors
//! (`mlp.experts.gate_up_proj`, `mlp.experts.down_proj`) are reported as such, so the
//! caller can stack or split them into llama.cpp's 3-D `ffn_{gate,up,down}_exps`.
//! gpt-oss names its router, sinks and FFN norm its own way and stores its experts
//! transposed, gate and up interleaved, with biases (`Mapped::OssGateUp`, `OssDown`).

use ferrite_arch::{GlobalTensor, Kind, TensorRole};

use crate::Family;

/// Which expert matrix.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum ExpertPart {
    Gate,
    Up,
    Down,
}

impl ExpertPart {
    /// The stacked tensor's role.
    pub(crate) fn role(self) -> TensorRole {
        match self {
            ExpertPart::Gate => TensorRole::FfnGateExps,
            ExpertPart::Up => TensorRole::FfnUpExps,
            ExpertPart::Down => TensorRole::FfnDownExps,
        }
    }

    pub(crate) fn gguf_name(self, layer: usize) -> String {
        self.role().weight(layer)
    }
}

/// What a checkpoint tensor becomes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Mapped {
    /// One GGUF tensor of the same data.
    Plain(String),
    /// Expert `expert`'s matrix of one layer; stacked with its siblings.
    Expert {
        layer: usize,
        expert: usize,
        part: ExpertPart,
    },
    /// transformers 5's `[experts, 2·ff, d]` gate and up projections of one layer.
    FusedGateUp { layer: usize },
    /// transformers 5's `[experts, d, ff]` down projections of one layer.
    FusedDown { layer: usize },
    /// gpt-oss's `[experts, d, 2·ff]` gate and up projections (`bias`: its `[experts, 2·ff]`
    /// biases), gate and up alternating along the last dimension.
    OssGateUp { layer: usize, bias: bool },
    /// gpt-oss's `[experts, ff, d]` down projections, transposed to llama.cpp's layout.
    OssDown { layer: usize },
    /// DeepSeek's `kv_b_proj` of one layer: per head the key decompression, then the
    /// value's; split into llama.cpp's `attn_k_b` (transposed) and `attn_v_b`.
    KvB { layer: usize },
    /// Qwen3-Next's grouped `in_proj_qkvz`: split into `attn_qkv` and `attn_gate`.
    DeltaQkvz { layer: usize },
    /// Qwen3-Next's grouped `in_proj_ba`: split into `ssm_beta` and `ssm_alpha`.
    DeltaBa { layer: usize },
    /// A `[channels, 1, kernel]` depthwise convolution, stored as `[channels, kernel]`.
    Conv1d { layer: usize },
    /// `A_log`, stored as the decay rate `-exp(A_log)` (`ssm_a`), as llama.cpp does.
    DecayRate { layer: usize },
    /// Qwen3-Next's gated attention `q_proj` (per head `[query | gate]`): split into
    /// `attn_q` and `attn_gate`.
    GatedQ { layer: usize },
    /// Not model weights (rope caches).
    Skip,
}

/// The checkpoint's name of the token embedding of `family`.
pub(crate) fn embedding(family: Family) -> &'static str {
    match family {
        Family::NemotronH => crate::mamba2::EMBEDDING,
        _ => "model.embed_tokens.weight",
    }
}

/// The layer index of checkpoint tensor `name` of `family`; `None` outside the layers.
pub(crate) fn layer_of(name: &str, family: Family) -> Option<usize> {
    match family {
        Family::NemotronH => crate::mamba2::layer_of(name),
        _ => name
            .strip_prefix("model.layers.")?
            .split('.')
            .next()?
            .parse()
            .ok(),
    }
}

/// The text model's name of tensor `name` of a multimodal checkpoint
/// (`Gemma3ForConditionalGeneration`): `model.language_model.*` (transformers 5) and
/// `language_model.model.*` (4.x) become `model.*`, `language_model.lm_head.*` becomes
/// `lm_head.*`; the vision tower and projector are `None` (left out). Other names stay.
pub(crate) fn text_model_name(name: &str) -> Option<String> {
    const VISION: [&str; 4] = [
        "model.vision_tower.",
        "vision_tower.",
        "model.multi_modal_projector.",
        "multi_modal_projector.",
    ];
    if VISION.iter().any(|p| name.starts_with(p)) {
        return None;
    }
    for (from, to) in [
        ("model.language_model.", "model."),
        ("language_model.model.", "model."),
        ("language_model.lm_head.", "lm_head."),
    ] {
        if let Some(rest) = name.strip_prefix(from) {
            return Some(format!("{to}{rest}"));
        }
    }
    Some(name.to_owned())
}

/// Maps one checkpoint name of `family`; `None` when it has no GGUF name. Gemma has four
/// per-layer norms (its `post_attention_layernorm` is the attention output's norm, and
/// `pre_feedforward_layernorm` the FFN input's).
pub(crate) fn map(name: &str, family: Family) -> Option<Mapped> {
    if family == Family::NemotronH {
        return crate::mamba2::map(name);
    }
    let gemma = family.gemma();
    let plain = |t: GlobalTensor| Some(Mapped::Plain(t.name().to_owned()));
    match name {
        "model.embed_tokens.weight" => return plain(GlobalTensor::TokenEmbd),
        "model.norm.weight" => return plain(GlobalTensor::OutputNorm),
        "lm_head.weight" => return plain(GlobalTensor::Output),
        _ => {}
    }
    let rest = name.strip_prefix("model.layers.")?;
    let (layer, rest) = rest.split_once('.')?;
    let layer: usize = layer.parse().ok()?;
    if rest.ends_with("rotary_emb.inv_freq") {
        return Some(Mapped::Skip);
    }
    let (stem, kind) = match rest.strip_suffix(".weight") {
        Some(s) => (s, Some(Kind::Weight)),
        None => match rest.strip_suffix(".bias") {
            Some(s) => (s, Some(Kind::Bias)),
            // transformers 5 fused experts carry no suffix.
            None => (rest, None),
        },
    };
    if family == Family::GptOss
        && let Some(m) = map_gpt_oss(layer, stem, kind)
    {
        return Some(m);
    }
    if family == Family::Qwen3Next
        && let Some(m) = crate::delta_net::map(layer, stem, kind)
    {
        return Some(m);
    }
    let moe = stem
        .strip_prefix("mlp.")
        .or_else(|| stem.strip_prefix("block_sparse_moe."));
    if let Some(moe) = moe
        && kind != Some(Kind::Bias)
        && let Some(m) = map_moe(layer, moe, kind)
    {
        return Some(m);
    }
    let role = match stem {
        "input_layernorm" => TensorRole::AttnNorm,
        "post_attention_layernorm" if gemma => TensorRole::PostAttentionNorm,
        "pre_feedforward_layernorm" if gemma => TensorRole::FfnNorm,
        "post_feedforward_layernorm" if gemma => TensorRole::PostFfwNorm,
        "post_attention_layernorm" => TensorRole::FfnNorm,
        "self_attn.q_proj" => TensorRole::AttnQ,
        "self_attn.k_proj" => TensorRole::AttnK,
        "self_attn.v_proj" => TensorRole::AttnV,
        "self_attn.o_proj" => TensorRole::AttnOutput,
        // Phi-3's fused projections, kept fused as llama.cpp does.
        "self_attn.qkv_proj" => TensorRole::AttnQkv,
        "mlp.gate_up_proj" => TensorRole::FfnUp,
        "self_attn.q_norm" => TensorRole::AttnQNorm,
        // DeepSeek's latent attention.
        "self_attn.q_a_proj" => TensorRole::AttnQA,
        "self_attn.q_a_layernorm" => TensorRole::AttnQANorm,
        "self_attn.q_b_proj" => TensorRole::AttnQB,
        "self_attn.kv_a_proj_with_mqa" => TensorRole::AttnKvAMqa,
        "self_attn.kv_a_layernorm" => TensorRole::AttnKvANorm,
        "self_attn.kv_b_proj" if kind == Some(Kind::Weight) => {
            return Some(Mapped::KvB { layer });
        }
        "self_attn.k_norm" => TensorRole::AttnKNorm,
        "mlp.gate_proj" => TensorRole::FfnGate,
        "mlp.up_proj" => TensorRole::FfnUp,
        "mlp.down_proj" => TensorRole::FfnDown,
        _ => return None,
    };
    Some(Mapped::Plain(role.name(layer, kind?)))
}

/// gpt-oss's own names (llama.cpp's: the norm before its FFN is `post_attention_norm`).
fn map_gpt_oss(layer: usize, stem: &str, kind: Option<Kind>) -> Option<Mapped> {
    let plain = |role: TensorRole, kind: Kind| Some(Mapped::Plain(role.name(layer, kind)));
    match (stem, kind) {
        ("post_attention_layernorm", Some(Kind::Weight)) => {
            plain(TensorRole::PostAttentionNorm, Kind::Weight)
        }
        ("self_attn.sinks", None) => plain(TensorRole::AttnSinks, Kind::Weight),
        ("mlp.router", Some(k)) => plain(TensorRole::FfnGateInp, k),
        ("mlp.experts.gate_up_proj", None) => Some(Mapped::OssGateUp { layer, bias: false }),
        ("mlp.experts.gate_up_proj_bias", None) => Some(Mapped::OssGateUp { layer, bias: true }),
        ("mlp.experts.down_proj", None) => Some(Mapped::OssDown { layer }),
        ("mlp.experts.down_proj_bias", None) => plain(TensorRole::FfnDownExps, Kind::Bias),
        _ => None,
    }
}

fn map_moe(layer: usize, moe: &str, kind: Option<Kind>) -> Option<Mapped> {
    match (moe, kind) {
        ("gate", Some(Kind::Weight)) => {
            return Some(Mapped::Plain(TensorRole::FfnGateInp.weight(layer)));
        }
        // DeepSeek V3's and GLM-4.5's selection bias: a buffer, without a suffix.
        ("gate.e_score_correction_bias", None) => {
            return Some(Mapped::Plain(TensorRole::ExpProbsB.bias(layer)));
        }
        ("shared_experts.gate_proj", Some(Kind::Weight)) => {
            return Some(Mapped::Plain(TensorRole::FfnGateShexp.weight(layer)));
        }
        ("shared_experts.up_proj", Some(Kind::Weight)) => {
            return Some(Mapped::Plain(TensorRole::FfnUpShexp.weight(layer)));
        }
        ("shared_experts.down_proj", Some(Kind::Weight)) => {
            return Some(Mapped::Plain(TensorRole::FfnDownShexp.weight(layer)));
        }
        ("experts.gate_up_proj", _) => return Some(Mapped::FusedGateUp { layer }),
        ("experts.down_proj", _) => return Some(Mapped::FusedDown { layer }),
        _ => {}
    }
    if kind != Some(Kind::Weight) {
        return None;
    }
    let (expert, part) = moe.strip_prefix("experts.")?.split_once('.')?;
    let expert: usize = expert.parse().ok()?;
    let part = match part {
        "gate_proj" | "w1" => ExpertPart::Gate,
        "up_proj" | "w3" => ExpertPart::Up,
        "down_proj" | "w2" => ExpertPart::Down,
        _ => return None,
    };
    Some(Mapped::Expert {
        layer,
        expert,
        part,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map_llama(name: &str) -> Option<Mapped> {
        map(name, Family::Llama)
    }

    #[test]
    fn text_model_names_of_multimodal_gemma3() {
        for (hf, text) in [
            (
                "model.language_model.layers.1.mlp.up_proj.weight",
                Some("model.layers.1.mlp.up_proj.weight"),
            ),
            (
                "language_model.model.norm.weight",
                Some("model.norm.weight"),
            ),
            ("language_model.lm_head.weight", Some("lm_head.weight")),
            ("lm_head.weight", Some("lm_head.weight")),
            (
                "model.vision_tower.vision_model.post_layernorm.weight",
                None,
            ),
            ("multi_modal_projector.mm_input_projection_weight", None),
        ] {
            assert_eq!(text_model_name(hf).as_deref(), text, "{hf}");
        }
    }

    #[test]
    fn maps_gemma_norms_like_gguf_py() {
        for (hf, gguf) in [
            ("input_layernorm", "attn_norm"),
            ("post_attention_layernorm", "post_attention_norm"),
            ("pre_feedforward_layernorm", "ffn_norm"),
            ("post_feedforward_layernorm", "post_ffw_norm"),
        ] {
            let name = format!("model.layers.2.{hf}.weight");
            assert_eq!(
                map(&name, Family::Gemma3),
                plain(&format!("blk.2.{gguf}.weight"))
            );
        }
        assert_eq!(
            map(
                "model.layers.0.pre_feedforward_layernorm.weight",
                Family::Llama
            ),
            None
        );
    }

    fn plain(s: &str) -> Option<Mapped> {
        Some(Mapped::Plain(s.into()))
    }

    #[test]
    fn maps_dense_names_like_gguf_py() {
        assert_eq!(
            map_llama("model.embed_tokens.weight"),
            plain("token_embd.weight")
        );
        assert_eq!(
            map_llama("model.layers.3.self_attn.q_proj.bias"),
            plain("blk.3.attn_q.bias")
        );
        assert_eq!(
            map_llama("model.layers.0.self_attn.k_norm.weight"),
            plain("blk.0.attn_k_norm.weight")
        );
        assert_eq!(
            map_llama("model.layers.1.post_attention_layernorm.weight"),
            plain("blk.1.ffn_norm.weight")
        );
        assert_eq!(
            map_llama("model.layers.1.self_attn.rotary_emb.inv_freq"),
            Some(Mapped::Skip)
        );
        assert_eq!(map_llama("model.layers.x.mlp.up_proj.weight"), None);
        assert_eq!(map_llama("vision_tower.weight"), None);
    }

    #[test]
    fn maps_expert_names_of_both_moe_families() {
        assert_eq!(
            map_llama("model.layers.2.block_sparse_moe.gate.weight"),
            plain("blk.2.ffn_gate_inp.weight")
        );
        assert_eq!(
            map_llama("model.layers.2.mlp.gate.weight"),
            plain("blk.2.ffn_gate_inp.weight")
        );
        assert_eq!(
            map_llama("model.layers.2.block_sparse_moe.experts.7.w3.weight"),
            Some(Mapped::Expert {
                layer: 2,
                expert: 7,
                part: ExpertPart::Up
            })
        );
        assert_eq!(
            map_llama("model.layers.0.mlp.experts.1.down_proj.weight"),
            Some(Mapped::Expert {
                layer: 0,
                expert: 1,
                part: ExpertPart::Down
            })
        );
        assert_eq!(
            map_llama("model.layers.5.mlp.experts.gate_up_proj"),
            Some(Mapped::FusedGateUp { layer: 5 })
        );
        assert_eq!(ExpertPart::Gate.gguf_name(4), "blk.4.ffn_gate_exps.weight");
    }

    /// gguf-py's names for gpt-oss's own tensors.
    #[test]
    fn maps_gpt_oss_names_like_gguf_py() {
        let oss = |n: &str| map(&format!("model.layers.1.{n}"), Family::GptOss);
        for (hf, gguf) in [
            (
                "post_attention_layernorm.weight",
                "blk.1.post_attention_norm.weight",
            ),
            ("self_attn.sinks", "blk.1.attn_sinks.weight"),
            ("mlp.router.weight", "blk.1.ffn_gate_inp.weight"),
            ("mlp.router.bias", "blk.1.ffn_gate_inp.bias"),
            ("mlp.experts.down_proj_bias", "blk.1.ffn_down_exps.bias"),
            ("self_attn.o_proj.bias", "blk.1.attn_output.bias"),
        ] {
            assert_eq!(oss(hf), plain(gguf), "{hf}");
        }
        assert_eq!(
            oss("mlp.experts.gate_up_proj_bias"),
            Some(Mapped::OssGateUp {
                layer: 1,
                bias: true
            })
        );
        assert_eq!(
            oss("mlp.experts.down_proj"),
            Some(Mapped::OssDown { layer: 1 })
        );
        // MXFP4 blocks are not mapped: the converter refuses them by name.
        assert_eq!(oss("mlp.experts.gate_up_proj_blocks"), None);
    }

    /// gguf-py's names for DeepSeek V3's and GLM-4.5's shared experts and selection bias.
    #[test]
    fn maps_shared_experts_and_the_selection_bias() {
        for (hf, gguf) in [
            (
                "model.layers.1.mlp.gate.e_score_correction_bias",
                "blk.1.exp_probs_b.bias",
            ),
            (
                "model.layers.1.mlp.shared_experts.gate_proj.weight",
                "blk.1.ffn_gate_shexp.weight",
            ),
            (
                "model.layers.2.mlp.shared_experts.up_proj.weight",
                "blk.2.ffn_up_shexp.weight",
            ),
            (
                "model.layers.3.mlp.shared_experts.down_proj.weight",
                "blk.3.ffn_down_shexp.weight",
            ),
        ] {
            assert_eq!(map_llama(hf), Some(Mapped::Plain(gguf.into())), "{hf}");
        }
    }
}
