//! GGUF metadata keys of the form `{arch}.{suffix}` (llama.cpp's `LLM_KV_NAMES`), the ones
//! ferrite writes or reads. This module only spells keys; which are required, and their
//! types and ranges, are the readers' business.

/// The key holding the architecture name every other key is prefixed with.
pub const ARCHITECTURE_KEY: &str = "general.architecture";

/// A per-architecture metadata key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Key {
    /// Transformer blocks.
    BlockCount,
    /// Training context length.
    ContextLength,
    /// Residual stream width.
    EmbeddingLength,
    /// Dense FFN width (Mixtral: one expert's width).
    FeedForwardLength,
    /// Query heads.
    HeadCount,
    /// Key/value heads.
    HeadCountKv,
    /// Key head size.
    KeyLength,
    /// Value head size.
    ValueLength,
    /// RMSNorm epsilon.
    LayerNormRmsEpsilon,
    /// LayerNorm epsilon (llama.cpp's `nemotron_h` requires it, and takes it for the
    /// RMSNorm's when that key is absent).
    LayerNormEpsilon,
    /// Rope frequency base.
    RopeFreqBase,
    /// Rotated dimensions per head.
    RopeDimensionCount,
    /// Rope scaling type.
    RopeScalingType,
    /// Linear rope scaling factor (positions are divided by it).
    RopeScalingFactor,
    /// LongRoPE's attention factor (scales q and k after rope).
    RopeScalingAttnFactor,
    /// The context the rope was trained for before scaling (LongRoPE's switch point, YaRN's
    /// correction range).
    RopeScalingOriginalContextLength,
    /// YaRN's fast correction (rotations), 32 when absent.
    RopeScalingYarnBetaFast,
    /// YaRN's slow correction (rotations), 1 when absent.
    RopeScalingYarnBetaSlow,
    /// Sliding-window length.
    SlidingWindow,
    /// Which layers slide (one bool per layer).
    SlidingWindowPattern,
    /// Vocabulary size (llama family).
    VocabSize,
    /// Experts per layer.
    ExpertCount,
    /// Experts each token uses.
    ExpertUsedCount,
    /// One expert's FFN width.
    ExpertFeedForwardLength,
    /// Whether the chosen experts' weights are renormalised.
    ExpertWeightsNorm,
    /// Expert gating function (llama.cpp's enum).
    ExpertGatingFunc,
    /// Scale of the expert weights.
    ExpertWeightsScale,
    /// Shared experts.
    ExpertSharedCount,
    /// Shared experts' FFN width.
    ExpertSharedFeedForwardLength,
    /// Attention logit soft-capping.
    AttnLogitSoftcapping,
    /// Final logit soft-capping.
    FinalLogitSoftcapping,
    /// Leading layers whose FFN is dense in a mixture-of-experts model (DeepSeek's and
    /// GLM's `first_k_dense_replace`).
    LeadingDenseBlockCount,
    /// Groups the experts are split into for group-limited routing (`n_group`).
    ExpertGroupCount,
    /// Groups each token's experts may come from (`topk_group`).
    ExpertGroupUsedCount,
    /// Multi-token-prediction layers at the end of the blocks (not run by the forward pass).
    NextnPredictLayers,
    /// Rank of the query's low-rank projection (MLA `q_lora_rank`; absent: one projection).
    QLoraRank,
    /// Rank of the compressed key/value latent (MLA `kv_lora_rank`).
    KvLoraRank,
    /// Key head size of MLA's decompressed heads (`qk_nope_head_dim + qk_rope_head_dim`).
    KeyLengthMla,
    /// Value head size of MLA's decompressed heads (`v_head_dim`).
    ValueLengthMla,
    /// YaRN's log multiplier of the attention scale (DeepSeek: `0.1 · mscale_all_dim`).
    RopeScalingYarnLogMultiplier,
    /// Taps of the recurrent layers' causal convolution (`linear_conv_kernel_dim`).
    SsmConvKernel,
    /// Per head, the key size of a gated DeltaNet (`linear_key_head_dim`).
    SsmStateSize,
    /// Key heads of a gated DeltaNet (`linear_num_key_heads`).
    SsmGroupCount,
    /// Value heads of a gated DeltaNet (`linear_num_value_heads`).
    SsmTimeStepRank,
    /// Values of all value heads of a gated DeltaNet (`heads × linear_value_head_dim`).
    SsmInnerSize,
    /// The floor of a Mamba-2 time step after its softplus (transformers' `time_step_min`,
    /// which its torch path applies); ferrite's own key, absent from llama.cpp's files (no
    /// floor there, as in llama.cpp and the mamba_ssm kernels).
    SsmTimeStepMin,
    /// Every how many layers one is full attention (Qwen3-Next's `full_attention_interval`).
    FullAttentionInterval,
}

impl Key {
    /// Every key.
    pub const ALL: [Key; 47] = [
        Key::BlockCount,
        Key::ContextLength,
        Key::EmbeddingLength,
        Key::FeedForwardLength,
        Key::HeadCount,
        Key::HeadCountKv,
        Key::KeyLength,
        Key::ValueLength,
        Key::LayerNormRmsEpsilon,
        Key::LayerNormEpsilon,
        Key::RopeFreqBase,
        Key::RopeDimensionCount,
        Key::RopeScalingType,
        Key::RopeScalingFactor,
        Key::RopeScalingAttnFactor,
        Key::RopeScalingOriginalContextLength,
        Key::RopeScalingYarnBetaFast,
        Key::RopeScalingYarnBetaSlow,
        Key::SlidingWindow,
        Key::SlidingWindowPattern,
        Key::VocabSize,
        Key::ExpertCount,
        Key::ExpertUsedCount,
        Key::ExpertFeedForwardLength,
        Key::ExpertWeightsNorm,
        Key::ExpertGatingFunc,
        Key::ExpertWeightsScale,
        Key::ExpertSharedCount,
        Key::ExpertSharedFeedForwardLength,
        Key::AttnLogitSoftcapping,
        Key::FinalLogitSoftcapping,
        Key::LeadingDenseBlockCount,
        Key::ExpertGroupCount,
        Key::ExpertGroupUsedCount,
        Key::NextnPredictLayers,
        Key::QLoraRank,
        Key::KvLoraRank,
        Key::KeyLengthMla,
        Key::ValueLengthMla,
        Key::RopeScalingYarnLogMultiplier,
        Key::SsmConvKernel,
        Key::SsmStateSize,
        Key::SsmGroupCount,
        Key::SsmTimeStepRank,
        Key::SsmInnerSize,
        Key::SsmTimeStepMin,
        Key::FullAttentionInterval,
    ];

    /// The part after `{arch}.`.
    pub const fn suffix(self) -> &'static str {
        match self {
            Key::BlockCount => "block_count",
            Key::ContextLength => "context_length",
            Key::EmbeddingLength => "embedding_length",
            Key::FeedForwardLength => "feed_forward_length",
            Key::HeadCount => "attention.head_count",
            Key::HeadCountKv => "attention.head_count_kv",
            Key::KeyLength => "attention.key_length",
            Key::ValueLength => "attention.value_length",
            Key::LayerNormRmsEpsilon => "attention.layer_norm_rms_epsilon",
            Key::LayerNormEpsilon => "attention.layer_norm_epsilon",
            Key::RopeFreqBase => "rope.freq_base",
            Key::RopeDimensionCount => "rope.dimension_count",
            Key::RopeScalingType => "rope.scaling.type",
            Key::RopeScalingFactor => "rope.scaling.factor",
            Key::RopeScalingAttnFactor => "rope.scaling.attn_factor",
            Key::RopeScalingOriginalContextLength => "rope.scaling.original_context_length",
            Key::RopeScalingYarnBetaFast => "rope.scaling.yarn_beta_fast",
            Key::RopeScalingYarnBetaSlow => "rope.scaling.yarn_beta_slow",
            Key::SlidingWindow => "attention.sliding_window",
            Key::SlidingWindowPattern => "attention.sliding_window_pattern",
            Key::VocabSize => "vocab_size",
            Key::ExpertCount => "expert_count",
            Key::ExpertUsedCount => "expert_used_count",
            Key::ExpertFeedForwardLength => "expert_feed_forward_length",
            Key::ExpertWeightsNorm => "expert_weights_norm",
            Key::ExpertGatingFunc => "expert_gating_func",
            Key::ExpertWeightsScale => "expert_weights_scale",
            Key::ExpertSharedCount => "expert_shared_count",
            Key::ExpertSharedFeedForwardLength => "expert_shared_feed_forward_length",
            Key::AttnLogitSoftcapping => "attn_logit_softcapping",
            Key::FinalLogitSoftcapping => "final_logit_softcapping",
            Key::LeadingDenseBlockCount => "leading_dense_block_count",
            Key::ExpertGroupCount => "expert_group_count",
            Key::ExpertGroupUsedCount => "expert_group_used_count",
            Key::NextnPredictLayers => "nextn_predict_layers",
            Key::QLoraRank => "attention.q_lora_rank",
            Key::KvLoraRank => "attention.kv_lora_rank",
            Key::KeyLengthMla => "attention.key_length_mla",
            Key::ValueLengthMla => "attention.value_length_mla",
            Key::RopeScalingYarnLogMultiplier => "rope.scaling.yarn_log_multiplier",
            Key::SsmConvKernel => "ssm.conv_kernel",
            Key::SsmStateSize => "ssm.state_size",
            Key::SsmGroupCount => "ssm.group_count",
            Key::SsmTimeStepRank => "ssm.time_step_rank",
            Key::SsmInnerSize => "ssm.inner_size",
            Key::SsmTimeStepMin => "ssm.time_step_min",
            Key::FullAttentionInterval => "full_attention_interval",
        }
    }

    /// The key of architecture `arch` (any `general.architecture`, also one ferrite does
    /// not load, e.g. for `ferrite inspect`).
    pub fn of(self, arch: &str) -> String {
        format!("{arch}.{}", self.suffix())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The oracle: llama.cpp's key names (`LLM_KV_NAMES`), spelled out.
    #[test]
    fn keys_are_pinned() {
        let pinned = [
            "llama.block_count",
            "llama.context_length",
            "llama.embedding_length",
            "llama.feed_forward_length",
            "llama.attention.head_count",
            "llama.attention.head_count_kv",
            "llama.attention.key_length",
            "llama.attention.value_length",
            "llama.attention.layer_norm_rms_epsilon",
            "llama.attention.layer_norm_epsilon",
            "llama.rope.freq_base",
            "llama.rope.dimension_count",
            "llama.rope.scaling.type",
            "llama.rope.scaling.factor",
            "llama.rope.scaling.attn_factor",
            "llama.rope.scaling.original_context_length",
            "llama.rope.scaling.yarn_beta_fast",
            "llama.rope.scaling.yarn_beta_slow",
            "llama.attention.sliding_window",
            "llama.attention.sliding_window_pattern",
            "llama.vocab_size",
            "llama.expert_count",
            "llama.expert_used_count",
            "llama.expert_feed_forward_length",
            "llama.expert_weights_norm",
            "llama.expert_gating_func",
            "llama.expert_weights_scale",
            "llama.expert_shared_count",
            "llama.expert_shared_feed_forward_length",
            "llama.attn_logit_softcapping",
            "llama.final_logit_softcapping",
            "llama.leading_dense_block_count",
            "llama.expert_group_count",
            "llama.expert_group_used_count",
            "llama.nextn_predict_layers",
            "llama.attention.q_lora_rank",
            "llama.attention.kv_lora_rank",
            "llama.attention.key_length_mla",
            "llama.attention.value_length_mla",
            "llama.rope.scaling.yarn_log_multiplier",
            "llama.ssm.conv_kernel",
            "llama.ssm.state_size",
            "llama.ssm.group_count",
            "llama.ssm.time_step_rank",
            "llama.ssm.inner_size",
            // ferrite's own (no llama.cpp reader has it).
            "llama.ssm.time_step_min",
            "llama.full_attention_interval",
        ];
        assert_eq!(Key::ALL.map(|k| k.of("llama")), pinned);
        assert_eq!(
            crate::Arch::Qwen3Moe.key(Key::ExpertCount),
            "qwen3moe.expert_count"
        );
        assert_eq!(ARCHITECTURE_KEY, "general.architecture");
    }
}
