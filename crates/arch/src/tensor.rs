//! GGUF tensor names: the file-level tensors, the per-layer roles (`blk.N.<stem>.weight` or
//! `.bias`) and the parser that turns a name back into its role. Names are llama.cpp's
//! (`LLM_TENSOR_NAMES` in `llama-arch.cpp`). Only the names of architectures ferrite loads
//! live here; this module never decides which tensors a model needs beyond the parts it is
//! told of ([`LayerParts`]).

use crate::BlockKind;

/// A tensor that exists once per file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GlobalTensor {
    /// Token embedding, `n_vocab × d_model` (also the output head when tied).
    TokenEmbd,
    /// Output head, `n_vocab × d_model`; absent when tied to the embedding.
    Output,
    /// Final RMSNorm.
    OutputNorm,
    /// Llama 3 rope frequency divisors, one per rotated pair.
    RopeFreqs,
    /// LongRoPE (Phi-3) divisors for contexts past the original one.
    RopeFactorsLong,
    /// LongRoPE divisors within the original context.
    RopeFactorsShort,
}

impl GlobalTensor {
    /// Every file-level tensor.
    pub const ALL: [GlobalTensor; 6] = [
        GlobalTensor::TokenEmbd,
        GlobalTensor::Output,
        GlobalTensor::OutputNorm,
        GlobalTensor::RopeFreqs,
        GlobalTensor::RopeFactorsLong,
        GlobalTensor::RopeFactorsShort,
    ];

    /// Its GGUF name.
    pub const fn name(self) -> &'static str {
        match self {
            GlobalTensor::TokenEmbd => "token_embd.weight",
            GlobalTensor::Output => "output.weight",
            GlobalTensor::OutputNorm => "output_norm.weight",
            GlobalTensor::RopeFreqs => "rope_freqs.weight",
            GlobalTensor::RopeFactorsLong => "rope_factors_long.weight",
            GlobalTensor::RopeFactorsShort => "rope_factors_short.weight",
        }
    }
}

/// A tensor of every transformer block (`blk.N.<stem>.weight`, some also `.bias`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TensorRole {
    /// RMSNorm before attention.
    AttnNorm,
    /// Query projection.
    AttnQ,
    /// Key projection.
    AttnK,
    /// Value projection.
    AttnV,
    /// Attention output projection.
    AttnOutput,
    /// Query, key and value projections as one matrix (their rows in that order; Phi-3).
    AttnQkv,
    /// Per-head query RMSNorm.
    AttnQNorm,
    /// Per-head key RMSNorm.
    AttnKNorm,
    /// RMSNorm of the attention output (Gemma 3).
    PostAttentionNorm,
    /// RMSNorm before the FFN.
    FfnNorm,
    /// Dense FFN gate projection.
    FfnGate,
    /// Dense FFN up projection.
    FfnUp,
    /// Dense FFN down projection.
    FfnDown,
    /// MoE router, `n_expert × d_model`.
    FfnGateInp,
    /// Stacked expert gate projections.
    FfnGateExps,
    /// Stacked expert up projections.
    FfnUpExps,
    /// Stacked expert down projections.
    FfnDownExps,
    /// RMSNorm of the FFN output (Gemma 3).
    PostFfwNorm,
    /// Shared expert gate (`ffn_gate_shexp`): a dense FFN every token runs beside its
    /// routed experts.
    FfnGateShexp,
    /// Shared expert up projection (`ffn_up_shexp`).
    FfnUpShexp,
    /// Shared expert down projection (`ffn_down_shexp`).
    FfnDownShexp,
    /// The router's per-expert selection bias (`exp_probs_b.bias`: DeepSeek V3's and
    /// GLM-4.5's `e_score_correction_bias`), added to the scores only to pick experts.
    ExpProbsB,
    /// MLA's query down-projection to `q_lora_rank` (`attn_q_a`).
    AttnQA,
    /// RMSNorm of the query latent (`attn_q_a_norm`).
    AttnQANorm,
    /// MLA's query up-projection from the latent to every head (`attn_q_b`).
    AttnQB,
    /// MLA's joint projection to the key/value latent and the shared rope key
    /// (`attn_kv_a_mqa`: `kv_lora_rank` rows, then `qk_rope_head_dim`).
    AttnKvAMqa,
    /// RMSNorm of the key/value latent (`attn_kv_a_norm`).
    AttnKvANorm,
    /// Per head, the transposed key decompression (`attn_k_b`, GGUF dims
    /// `[qk_nope_head_dim, kv_lora_rank, n_head]`): it turns a query's non-rope part into
    /// the latent's space.
    AttnKB,
    /// Per head, the value decompression (`attn_v_b`, dims `[kv_lora_rank, v_head_dim,
    /// n_head]`).
    AttnVB,
    /// One attention-sink logit per query head (`attn_sinks`, gpt-oss).
    AttnSinks,
    /// The output gate of a layer's heads (`attn_gate`): Qwen3-Next's attention multiplies
    /// each head's output by `sigmoid(gate · x)`, its gated DeltaNet normalises its output
    /// and multiplies it by `silu(gate · x)`.
    AttnGate,
    /// The gated DeltaNet's causal convolution (`ssm_conv1d`, GGUF dims `[kernel,
    /// channels]`): one filter per channel of the concatenated q, k and v.
    SsmConv1d,
    /// The per-head decay rate `A = -exp(A_log)` (`ssm_a`, a bare name as llama.cpp's).
    SsmA,
    /// The per-head time-step bias (`ssm_dt.bias`).
    SsmDt,
    /// The projection to the per-head update strength before its sigmoid (`ssm_beta`).
    SsmBeta,
    /// The projection to the per-head decay input before its softplus (`ssm_alpha`).
    SsmAlpha,
    /// The RMSNorm of each DeltaNet head's output before its gate (`ssm_norm`).
    SsmNorm,
    /// The DeltaNet's output projection (`ssm_out`).
    SsmOut,
    /// The shared expert's scalar gate, `1 × d_model` (`ffn_gate_inp_shexp`): the shared
    /// expert's output is multiplied by `sigmoid(gate · x)`.
    FfnGateInpShexp,
    /// Mamba-2's input projection (`ssm_in`): the gate `z`, the convolution's channels and
    /// one time step per head ([`crate::Mamba2Shape::in_rows`]).
    SsmIn,
    /// Mamba-2's per-head skip weight `D` (`ssm_d`, a bare name as llama.cpp's).
    SsmD,
}

/// The end of every norm weight's name, in ferrite's architectures and llama.cpp's others.
pub const NORM_SUFFIX: &str = "_norm.weight";

impl TensorRole {
    /// Every per-layer role.
    pub const ALL: [TensorRole; 41] = [
        TensorRole::AttnNorm,
        TensorRole::AttnQ,
        TensorRole::AttnK,
        TensorRole::AttnV,
        TensorRole::AttnOutput,
        TensorRole::AttnQkv,
        TensorRole::AttnQNorm,
        TensorRole::AttnKNorm,
        TensorRole::PostAttentionNorm,
        TensorRole::FfnNorm,
        TensorRole::FfnGate,
        TensorRole::FfnUp,
        TensorRole::FfnDown,
        TensorRole::FfnGateInp,
        TensorRole::FfnGateExps,
        TensorRole::FfnUpExps,
        TensorRole::FfnDownExps,
        TensorRole::PostFfwNorm,
        TensorRole::FfnGateShexp,
        TensorRole::FfnUpShexp,
        TensorRole::FfnDownShexp,
        TensorRole::ExpProbsB,
        TensorRole::AttnQA,
        TensorRole::AttnQANorm,
        TensorRole::AttnQB,
        TensorRole::AttnKvAMqa,
        TensorRole::AttnKvANorm,
        TensorRole::AttnKB,
        TensorRole::AttnVB,
        TensorRole::AttnSinks,
        TensorRole::AttnGate,
        TensorRole::SsmConv1d,
        TensorRole::SsmA,
        TensorRole::SsmDt,
        TensorRole::SsmBeta,
        TensorRole::SsmAlpha,
        TensorRole::SsmNorm,
        TensorRole::SsmOut,
        TensorRole::FfnGateInpShexp,
        TensorRole::SsmIn,
        TensorRole::SsmD,
    ];

    /// The middle of its names (`attn_q` in `blk.N.attn_q.weight`).
    pub const fn stem(self) -> &'static str {
        match self {
            TensorRole::AttnNorm => "attn_norm",
            TensorRole::AttnQ => "attn_q",
            TensorRole::AttnK => "attn_k",
            TensorRole::AttnV => "attn_v",
            TensorRole::AttnOutput => "attn_output",
            TensorRole::AttnQkv => "attn_qkv",
            TensorRole::AttnQNorm => "attn_q_norm",
            TensorRole::AttnKNorm => "attn_k_norm",
            TensorRole::PostAttentionNorm => "post_attention_norm",
            TensorRole::FfnNorm => "ffn_norm",
            TensorRole::FfnGate => "ffn_gate",
            TensorRole::FfnUp => "ffn_up",
            TensorRole::FfnDown => "ffn_down",
            TensorRole::FfnGateInp => "ffn_gate_inp",
            TensorRole::FfnGateExps => "ffn_gate_exps",
            TensorRole::FfnUpExps => "ffn_up_exps",
            TensorRole::FfnDownExps => "ffn_down_exps",
            TensorRole::PostFfwNorm => "post_ffw_norm",
            TensorRole::FfnGateShexp => "ffn_gate_shexp",
            TensorRole::FfnUpShexp => "ffn_up_shexp",
            TensorRole::FfnDownShexp => "ffn_down_shexp",
            TensorRole::ExpProbsB => "exp_probs_b",
            TensorRole::AttnQA => "attn_q_a",
            TensorRole::AttnQANorm => "attn_q_a_norm",
            TensorRole::AttnQB => "attn_q_b",
            TensorRole::AttnKvAMqa => "attn_kv_a_mqa",
            TensorRole::AttnKvANorm => "attn_kv_a_norm",
            TensorRole::AttnKB => "attn_k_b",
            TensorRole::AttnVB => "attn_v_b",
            TensorRole::AttnSinks => "attn_sinks",
            TensorRole::AttnGate => "attn_gate",
            TensorRole::SsmConv1d => "ssm_conv1d",
            TensorRole::SsmA => "ssm_a",
            TensorRole::SsmDt => "ssm_dt",
            TensorRole::SsmBeta => "ssm_beta",
            TensorRole::SsmAlpha => "ssm_alpha",
            TensorRole::SsmNorm => "ssm_norm",
            TensorRole::SsmOut => "ssm_out",
            TensorRole::FfnGateInpShexp => "ffn_gate_inp_shexp",
            TensorRole::SsmIn => "ssm_in",
            TensorRole::SsmD => "ssm_d",
        }
    }

    /// The role whose stem is `stem`.
    pub fn from_stem(stem: &str) -> Option<TensorRole> {
        TensorRole::ALL.into_iter().find(|r| r.stem() == stem)
    }

    /// The name of its `kind` tensor in layer `layer`: `blk.{layer}.{stem}.{kind}`.
    pub fn name(self, layer: usize, kind: Kind) -> String {
        match kind {
            Kind::Bare => format!("{BLK}{layer}.{}", self.stem()),
            _ => format!("{BLK}{layer}.{}.{}", self.stem(), kind.suffix()),
        }
    }

    /// The name of its bare tensor in layer `layer`: `blk.{layer}.{stem}`.
    pub fn bare(self, layer: usize) -> String {
        self.name(layer, Kind::Bare)
    }

    /// The name of its weight in layer `layer`.
    pub fn weight(self, layer: usize) -> String {
        self.name(layer, Kind::Weight)
    }

    /// The name of its bias in layer `layer`.
    pub fn bias(self, layer: usize) -> String {
        self.name(layer, Kind::Bias)
    }

    /// Whether it is an RMSNorm weight vector.
    pub fn is_norm(self) -> bool {
        matches!(
            self,
            TensorRole::AttnNorm
                | TensorRole::AttnQNorm
                | TensorRole::AttnKNorm
                | TensorRole::PostAttentionNorm
                | TensorRole::FfnNorm
                | TensorRole::PostFfwNorm
                | TensorRole::AttnQANorm
                | TensorRole::AttnKvANorm
                | TensorRole::SsmNorm
        )
    }
}

/// The prefix of every per-layer name.
const BLK: &str = "blk.";

/// Whether a per-layer tensor is the weight or the bias of its role, or a bare name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    /// `.weight`.
    Weight,
    /// `.bias`.
    Bias,
    /// No suffix (`blk.N.ssm_a`, as llama.cpp names the SSM decay).
    Bare,
}

impl Kind {
    /// The last part of the name (empty for [`Kind::Bare`]).
    pub const fn suffix(self) -> &'static str {
        match self {
            Kind::Weight => "weight",
            Kind::Bias => "bias",
            Kind::Bare => "",
        }
    }
}

/// What a GGUF tensor name is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TensorName {
    /// A file-level tensor.
    Global(GlobalTensor),
    /// A tensor of a block.
    Layer {
        /// Block index (`N` of `blk.N.`).
        layer: usize,
        /// Its role.
        role: TensorRole,
        /// Weight or bias.
        kind: Kind,
    },
}

impl TensorName {
    /// Reads `name`; `None` for a name that is not one of this table's. The block index is
    /// read as a decimal `usize`.
    pub fn parse(name: &str) -> Option<TensorName> {
        if let Some(g) = GlobalTensor::ALL.into_iter().find(|g| g.name() == name) {
            return Some(TensorName::Global(g));
        }
        let (idx, tail) = name.strip_prefix(BLK)?.split_once('.')?;
        let layer = idx.parse().ok()?;
        let (stem, kind) = match tail.rsplit_once('.') {
            Some((stem, suffix)) => (
                stem,
                [Kind::Weight, Kind::Bias]
                    .into_iter()
                    .find(|k| k.suffix() == suffix)?,
            ),
            None => (tail, Kind::Bare),
        };
        Some(TensorName::Layer {
            layer,
            role: TensorRole::from_stem(stem)?,
            kind,
        })
    }

    /// The GGUF name (the inverse of [`TensorName::parse`]).
    pub fn to_name(self) -> String {
        match self {
            TensorName::Global(g) => g.name().to_owned(),
            TensorName::Layer { layer, role, kind } => role.name(layer, kind),
        }
    }
}

/// The block index `N` of any `blk.N.…` name, also of roles this table does not know.
pub fn layer_of(name: &str) -> Option<usize> {
    name.strip_prefix(BLK)?.split('.').next()?.parse().ok()
}

/// The optional parts a model's layers have, as its loader resolved them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LayerParts {
    /// Expert FFNs (router and stacks) instead of dense ones.
    pub experts: bool,
    /// A shared expert beside the routed ones (expert layers only).
    pub shared_expert: bool,
    /// The router's selection bias (expert layers only).
    pub selection_bias: bool,
    /// Per-head Q/K norms.
    pub qk_norm: bool,
    /// Post-attention and post-FFN norms.
    pub post_norms: bool,
    /// Q, K and V biases.
    pub qkv_bias: bool,
    /// Attention output bias.
    pub out_bias: bool,
    /// Q/K/V as one `attn_qkv` and the dense gate and up as one `ffn_up` of twice the
    /// width (gate rows first), as Phi-3 files hold them.
    pub fused: bool,
    /// Multi-head latent attention (DeepSeek's MLA) instead of Q/K/V projections: `Some`
    /// with whether the query has its low-rank pair (`attn_q_a`, `attn_q_b`) rather than
    /// one `attn_q`.
    pub mla: Option<bool>,
    /// Attention-sink logits (`attn_sinks`).
    pub sinks: bool,
    /// Router and expert biases (expert layers only).
    pub expert_bias: bool,
    /// The role of the norm before the FFN ([`crate::Features::ffn_norm`]).
    pub ffn_norm: TensorRole,
    /// A gated DeltaNet layer (Qwen3-Next's linear attention) instead of attention:
    /// `attn_qkv` (q, k and v of every head, in that order), `attn_gate`, `ssm_conv1d`,
    /// `ssm_a`, `ssm_dt.bias`, `ssm_beta`, `ssm_alpha`, `ssm_norm` and `ssm_out`.
    pub delta_net: bool,
    /// The attention's output gate (`attn_gate`; Qwen3-Next's full-attention layers).
    pub attn_gate: bool,
    /// The shared expert's sigmoid gate (`ffn_gate_inp_shexp`; expert layers only).
    pub shared_expert_gate: bool,
    /// A block of one part (Nemotron-H, [`crate::Features::mamba2`]), whose tensors are
    /// its `attn_norm` and that part's alone; the other fields are then unused.
    pub block: Option<BlockKind>,
}

impl LayerParts {
    /// Every tensor each layer of such a model has.
    pub fn tensors(self) -> Vec<(TensorRole, Kind)> {
        use TensorRole as R;
        if let Some(kind) = self.block {
            return kind.tensors();
        }
        let mut roles = vec![R::AttnNorm];
        if self.delta_net {
            roles.extend([
                R::AttnQkv,
                R::AttnGate,
                R::SsmConv1d,
                R::SsmBeta,
                R::SsmAlpha,
                R::SsmNorm,
                R::SsmOut,
            ]);
        } else if let Some(q_lora) = self.mla {
            if q_lora {
                roles.extend([R::AttnQA, R::AttnQANorm, R::AttnQB]);
            } else {
                roles.push(R::AttnQ);
            }
            roles.extend([R::AttnKvAMqa, R::AttnKvANorm, R::AttnKB, R::AttnVB]);
        } else if self.fused {
            roles.push(R::AttnQkv);
        } else {
            roles.extend([R::AttnQ, R::AttnK, R::AttnV]);
        }
        if !self.delta_net {
            roles.push(R::AttnOutput);
        }
        if self.attn_gate {
            roles.push(R::AttnGate);
        }
        roles.push(self.ffn_norm);
        if self.sinks {
            roles.push(R::AttnSinks);
        }
        if self.experts {
            roles.extend([R::FfnGateInp, R::FfnGateExps, R::FfnUpExps, R::FfnDownExps]);
            if self.shared_expert {
                roles.extend([R::FfnGateShexp, R::FfnUpShexp, R::FfnDownShexp]);
            }
            if self.shared_expert && self.shared_expert_gate {
                roles.push(R::FfnGateInpShexp);
            }
        } else if self.fused {
            roles.extend([R::FfnUp, R::FfnDown]);
        } else {
            roles.extend([R::FfnGate, R::FfnUp, R::FfnDown]);
        }
        if self.qk_norm && !self.delta_net {
            roles.extend([R::AttnQNorm, R::AttnKNorm]);
        }
        if self.post_norms {
            roles.extend([R::PostAttentionNorm, R::PostFfwNorm]);
        }
        let mut out: Vec<(TensorRole, Kind)> =
            roles.into_iter().map(|r| (r, Kind::Weight)).collect();
        if self.qkv_bias {
            out.extend([R::AttnQ, R::AttnK, R::AttnV].map(|r| (r, Kind::Bias)));
        }
        if self.out_bias {
            out.push((R::AttnOutput, Kind::Bias));
        }
        if self.delta_net {
            out.extend([(R::SsmA, Kind::Bare), (R::SsmDt, Kind::Bias)]);
        }
        if self.experts && self.selection_bias {
            out.push((R::ExpProbsB, Kind::Bias));
        }
        if self.experts && self.expert_bias {
            out.extend(
                [R::FfnGateInp, R::FfnGateExps, R::FfnUpExps, R::FfnDownExps]
                    .map(|r| (r, Kind::Bias)),
            );
        }
        out
    }
}

impl BlockKind {
    /// Every tensor a Nemotron-H block of this kind has: its `attn_norm` and its part's,
    /// llama.cpp's `nemotron_h` layout.
    pub fn tensors(self) -> Vec<(TensorRole, Kind)> {
        use TensorRole as R;
        let parts: &[(TensorRole, Kind)] = match self {
            BlockKind::Mamba2 => &[
                (R::SsmIn, Kind::Weight),
                (R::SsmConv1d, Kind::Weight),
                (R::SsmConv1d, Kind::Bias),
                (R::SsmDt, Kind::Bias),
                (R::SsmA, Kind::Bare),
                (R::SsmD, Kind::Bare),
                (R::SsmNorm, Kind::Weight),
                (R::SsmOut, Kind::Weight),
            ],
            BlockKind::Attention => &[
                (R::AttnQ, Kind::Weight),
                (R::AttnK, Kind::Weight),
                (R::AttnV, Kind::Weight),
                (R::AttnOutput, Kind::Weight),
            ],
            BlockKind::Mlp => &[(R::FfnUp, Kind::Weight), (R::FfnDown, Kind::Weight)],
        };
        std::iter::once((R::AttnNorm, Kind::Weight))
            .chain(parts.iter().copied())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Arch;

    /// The oracle: llama.cpp's names, spelled out (as ferrite's loaders, converter and synth
    /// spelled them before this table).
    #[test]
    fn names_are_pinned() {
        let globals = [
            "token_embd.weight",
            "output.weight",
            "output_norm.weight",
            "rope_freqs.weight",
            "rope_factors_long.weight",
            "rope_factors_short.weight",
        ];
        assert_eq!(GlobalTensor::ALL.map(GlobalTensor::name), globals);
        let layer = [
            "blk.7.attn_norm.weight",
            "blk.7.attn_q.weight",
            "blk.7.attn_k.weight",
            "blk.7.attn_v.weight",
            "blk.7.attn_output.weight",
            "blk.7.attn_qkv.weight",
            "blk.7.attn_q_norm.weight",
            "blk.7.attn_k_norm.weight",
            "blk.7.post_attention_norm.weight",
            "blk.7.ffn_norm.weight",
            "blk.7.ffn_gate.weight",
            "blk.7.ffn_up.weight",
            "blk.7.ffn_down.weight",
            "blk.7.ffn_gate_inp.weight",
            "blk.7.ffn_gate_exps.weight",
            "blk.7.ffn_up_exps.weight",
            "blk.7.ffn_down_exps.weight",
            "blk.7.post_ffw_norm.weight",
            "blk.7.ffn_gate_shexp.weight",
            "blk.7.ffn_up_shexp.weight",
            "blk.7.ffn_down_shexp.weight",
            "blk.7.exp_probs_b.weight",
            "blk.7.attn_q_a.weight",
            "blk.7.attn_q_a_norm.weight",
            "blk.7.attn_q_b.weight",
            "blk.7.attn_kv_a_mqa.weight",
            "blk.7.attn_kv_a_norm.weight",
            "blk.7.attn_k_b.weight",
            "blk.7.attn_v_b.weight",
            "blk.7.attn_sinks.weight",
            "blk.7.attn_gate.weight",
            "blk.7.ssm_conv1d.weight",
            "blk.7.ssm_a.weight",
            "blk.7.ssm_dt.weight",
            "blk.7.ssm_beta.weight",
            "blk.7.ssm_alpha.weight",
            "blk.7.ssm_norm.weight",
            "blk.7.ssm_out.weight",
            "blk.7.ffn_gate_inp_shexp.weight",
            "blk.7.ssm_in.weight",
            "blk.7.ssm_d.weight",
        ];
        assert_eq!(TensorRole::ALL.map(|r| r.weight(7)), layer);
        assert_eq!(TensorRole::AttnQ.bias(12), "blk.12.attn_q.bias");
        assert_eq!(TensorRole::AttnOutput.bias(0), "blk.0.attn_output.bias");
        assert_eq!(TensorRole::SsmA.bare(3), "blk.3.ssm_a");
        for r in TensorRole::ALL {
            assert_eq!(r.is_norm(), r.weight(0).ends_with(NORM_SUFFIX), "{r:?}");
        }
    }

    /// Per architecture, the tensors of a layer of a file with the parts it must have and
    /// without those it may have, spelled out.
    #[test]
    fn each_architecture_layer_is_pinned() {
        // Every layer starts with the attention block and the FFN norm.
        let attn = "attn_norm.weight attn_q.weight attn_k.weight attn_v.weight \
                    attn_output.weight ffn_norm.weight";
        let dense = "ffn_gate.weight ffn_up.weight ffn_down.weight";
        let pinned = [
            (Arch::Llama, format!("{attn} {dense}")),
            (
                Arch::Gemma3,
                format!(
                    "{attn} {dense} attn_q_norm.weight attn_k_norm.weight \
                     post_attention_norm.weight post_ffw_norm.weight"
                ),
            ),
            (
                Arch::Gemma2,
                format!("{attn} {dense} post_attention_norm.weight post_ffw_norm.weight"),
            ),
            (
                Arch::Qwen2,
                format!("{attn} {dense} attn_q.bias attn_k.bias attn_v.bias"),
            ),
            (
                Arch::Phi3,
                "attn_norm.weight attn_qkv.weight attn_output.weight ffn_norm.weight \
                 ffn_up.weight ffn_down.weight"
                    .to_owned(),
            ),
            (
                Arch::Qwen3,
                format!("{attn} {dense} attn_q_norm.weight attn_k_norm.weight"),
            ),
            (
                Arch::Qwen3Moe,
                format!(
                    "{attn} ffn_gate_inp.weight ffn_gate_exps.weight ffn_up_exps.weight \
                     ffn_down_exps.weight attn_q_norm.weight attn_k_norm.weight"
                ),
            ),
            (
                Arch::Glm4Moe,
                format!(
                    "{attn} ffn_gate_inp.weight ffn_gate_exps.weight ffn_up_exps.weight \
                     ffn_down_exps.weight ffn_gate_shexp.weight ffn_up_shexp.weight \
                     ffn_down_shexp.weight exp_probs_b.bias"
                ),
            ),
            (
                Arch::Deepseek2,
                "attn_norm.weight attn_q_a.weight attn_q_a_norm.weight attn_q_b.weight \
                 attn_kv_a_mqa.weight attn_kv_a_norm.weight attn_k_b.weight attn_v_b.weight \
                 attn_output.weight ffn_norm.weight ffn_gate_inp.weight ffn_gate_exps.weight \
                 ffn_up_exps.weight ffn_down_exps.weight ffn_gate_shexp.weight \
                 ffn_up_shexp.weight ffn_down_shexp.weight exp_probs_b.bias"
                    .to_owned(),
            ),
            (
                // llama.cpp's names: the FFN's norm is `post_attention_norm`.
                Arch::GptOss,
                "attn_norm.weight attn_q.weight attn_k.weight attn_v.weight \
                 attn_output.weight post_attention_norm.weight attn_sinks.weight \
                 ffn_gate_inp.weight ffn_gate_exps.weight ffn_up_exps.weight \
                 ffn_down_exps.weight attn_q.bias attn_k.bias attn_v.bias attn_output.bias \
                 ffn_gate_inp.bias ffn_gate_exps.bias ffn_up_exps.bias ffn_down_exps.bias"
                    .to_owned(),
            ),
            (
                // A linear-attention layer; the gated attention layers are pinned below.
                Arch::Qwen3Next,
                "attn_norm.weight attn_qkv.weight attn_gate.weight ssm_conv1d.weight \
                 ssm_beta.weight ssm_alpha.weight ssm_norm.weight ssm_out.weight \
                 post_attention_norm.weight ffn_gate_inp.weight ffn_gate_exps.weight \
                 ffn_up_exps.weight ffn_down_exps.weight ffn_gate_shexp.weight \
                 ffn_up_shexp.weight ffn_down_shexp.weight ffn_gate_inp_shexp.weight \
                 ssm_a ssm_dt.bias"
                    .to_owned(),
            ),
            (
                // A Mamba-2 block; the attention and MLP blocks are pinned below.
                Arch::NemotronH,
                "attn_norm.weight ssm_in.weight ssm_conv1d.weight ssm_conv1d.bias \
                 ssm_dt.bias ssm_a ssm_d ssm_norm.weight ssm_out.weight"
                    .to_owned(),
            ),
        ];
        assert_eq!(pinned.len(), Arch::ALL.len());
        for (arch, tails) in pinned {
            let f = arch.features();
            let parts = LayerParts {
                experts: f.experts.resolve(false),
                shared_expert: matches!(arch, Arch::Glm4Moe | Arch::Deepseek2 | Arch::Qwen3Next),
                selection_bias: matches!(arch, Arch::Glm4Moe | Arch::Deepseek2),
                qk_norm: f.qk_norm.resolve(false),
                post_norms: f.post_norms,
                qkv_bias: f.qkv_bias.resolve(false),
                out_bias: f.out_bias.resolve(false),
                fused: f.fused,
                mla: f.mla.then_some(true),
                sinks: f.sinks,
                expert_bias: f.expert_bias,
                ffn_norm: f.ffn_norm,
                delta_net: f.delta_net,
                attn_gate: false,
                shared_expert_gate: f.delta_net,
                block: f.mamba2.then_some(BlockKind::Mamba2),
            };
            let got: Vec<String> = parts
                .tensors()
                .into_iter()
                .map(|(r, k)| r.name(2, k))
                .collect();
            let want: Vec<String> = tails
                .split_whitespace()
                .map(|t| format!("blk.2.{t}"))
                .collect();
            assert_eq!(got, want, "{}", arch.name());
        }
        let gated_attention = LayerParts {
            experts: true,
            shared_expert: true,
            selection_bias: false,
            qk_norm: true,
            post_norms: false,
            qkv_bias: false,
            out_bias: false,
            fused: false,
            mla: None,
            sinks: false,
            expert_bias: false,
            ffn_norm: TensorRole::PostAttentionNorm,
            delta_net: false,
            attn_gate: true,
            shared_expert_gate: true,
            block: None,
        };
        let got: Vec<String> = gated_attention
            .tensors()
            .into_iter()
            .map(|(r, k)| r.name(3, k))
            .collect();
        let want = "attn_norm.weight attn_q.weight attn_k.weight attn_v.weight \
                    attn_output.weight attn_gate.weight post_attention_norm.weight \
                    ffn_gate_inp.weight ffn_gate_exps.weight ffn_up_exps.weight \
                    ffn_down_exps.weight ffn_gate_shexp.weight ffn_up_shexp.weight \
                    ffn_down_shexp.weight ffn_gate_inp_shexp.weight attn_q_norm.weight \
                    attn_k_norm.weight";
        let want: Vec<String> = want
            .split_whitespace()
            .map(|t| format!("blk.3.{t}"))
            .collect();
        assert_eq!(got, want);
        let single = |kind| LayerParts {
            block: Some(kind),
            ..gated_attention
        };
        for (kind, want) in [
            (
                BlockKind::Attention,
                "attn_norm.weight attn_q.weight attn_k.weight attn_v.weight attn_output.weight",
            ),
            (
                BlockKind::Mlp,
                "attn_norm.weight ffn_up.weight ffn_down.weight",
            ),
        ] {
            let got: Vec<String> = single(kind)
                .tensors()
                .into_iter()
                .map(|(r, k)| r.name(0, k))
                .collect();
            let want: Vec<String> = want
                .split_whitespace()
                .map(|t| format!("blk.0.{t}"))
                .collect();
            assert_eq!(got, want, "{kind:?}");
        }
    }

    #[test]
    fn parse_inverts_every_name() {
        for g in GlobalTensor::ALL {
            assert_eq!(TensorName::parse(g.name()), Some(TensorName::Global(g)));
        }
        for role in TensorRole::ALL {
            for kind in [Kind::Weight, Kind::Bias, Kind::Bare] {
                let n = TensorName::Layer {
                    layer: 31,
                    role,
                    kind,
                };
                assert_eq!(TensorName::parse(&n.to_name()), Some(n));
            }
        }
        for bad in [
            "blk.x.attn_q.weight",
            "blk.0.attn_q.weight.extra",
            "blk.0.attn_q.scale",
            "blk.-1.attn_q.weight",
            "token_embd.bias",
            "enc.blk.0.attn_q.weight",
        ] {
            assert_eq!(TensorName::parse(bad), None, "{bad}");
        }
        assert_eq!(layer_of("blk.17.attn_qkv.weight"), Some(17));
        assert_eq!(layer_of("output.weight"), None);
    }
}
