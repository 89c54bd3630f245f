//! The ops of the contract as data, for [`crate::Backend::supports`]: one enum, matched
//! exhaustively (no `_ =>`), so that a new op fails to compile until every backend and the
//! conformance harness handle it.

use ferrite_gguf::GgmlType;

use crate::{Act, KvType, RopeStyle, Values};

/// One op of the contract with what decides whether a backend can run it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Op {
    /// Embedding rows of a token table of `ty` ([`crate::Backend::embed`]).
    Embed {
        /// The table's type.
        ty: GgmlType,
        /// Values per row of the weight (the width a backend's kernels may need whole
        /// units of).
        cols: usize,
    },
    /// Weight × activation rows, for any number of rows ([`crate::Backend::matmul`]).
    MatMul {
        /// The weight's type.
        ty: GgmlType,
        /// Values per row of the weight (the width a backend's kernels may need whole
        /// units of).
        cols: usize,
    },
    /// Several weights of `ty` times one input ([`crate::Backend::matmul_shared`]; fused).
    MatMulShared {
        /// The weights' type.
        ty: GgmlType,
        /// Values per row of the weight (the width a backend's kernels may need whole
        /// units of).
        cols: usize,
    },
    /// The output projection into host logits ([`crate::Backend::logits`]).
    Logits {
        /// The weight's type.
        ty: GgmlType,
        /// Values per row of the weight (the width a backend's kernels may need whole
        /// units of).
        cols: usize,
    },
    /// Row-wise RMS normalisation in place ([`crate::Backend::rms_norm`]).
    RmsNorm,
    /// Copy then RMS normalisation into another buffer ([`crate::Backend::norm_into`];
    /// fused).
    NormInto,
    /// Residual add then normalisation of the sum ([`crate::Backend::add_norm`]; fused).
    AddNorm,
    /// Element-wise `x += y` ([`crate::Backend::add`]).
    Add,
    /// A bias row added to every row ([`crate::Backend::add_bias`]).
    AddBias,
    /// A range of values between buffers or within one ([`crate::Backend::copy`]).
    Copy,
    /// Rotary embedding of rows at their segments' positions ([`crate::Backend::rope`]).
    Rope {
        /// Pairing.
        style: RopeStyle,
        /// With per-pair frequency factors.
        scaled: bool,
        /// With LongRoPE's second factor set ([`crate::Rope::long`]).
        long: bool,
    },
    /// Key and value rows into their sessions' KV stores ([`crate::Backend::kv_store`]).
    KvStore {
        /// The store's type.
        kv: KvType,
    },
    /// Rope of queries and keys, then the keys and values stored
    /// ([`crate::Backend::rope_store`]; fused).
    RopeStore {
        /// Pairing.
        style: RopeStyle,
        /// With per-pair frequency factors.
        scaled: bool,
        /// With LongRoPE's second factor set ([`crate::Rope::long`]).
        long: bool,
        /// The store's type.
        kv: KvType,
    },
    /// Causal (optionally windowed) attention of each segment's rows over its own KV store
    /// ([`crate::Backend::attention`]).
    Attention {
        /// The store's type.
        kv: KvType,
        /// Values per head.
        head_dim: usize,
        /// With soft-capped scores ([`crate::AttnShape::softcap`]).
        softcap: bool,
        /// Where the values come from ([`crate::AttnShape::values`]).
        values: Values,
        /// With a sink logit per query head ([`crate::Backend::attention`]'s `sinks`).
        sinks: bool,
    },
    /// The gated FFN activation ([`crate::Backend::gated_act`]).
    GatedAct {
        /// Which activation.
        act: Act,
    },
    /// Rows scaled by the sigmoid of one value each ([`crate::Backend::row_gate`]).
    RowGate,
    /// RMS normalisation gated by `silu(z)` ([`crate::Backend::gated_norm`]).
    GatedNorm,
    /// Squared ReLU in place ([`crate::Backend::relu_sq`]).
    ReluSq,
    /// RMS normalisation over groups of each row ([`crate::Backend::group_norm`]).
    GroupNorm,
    /// A recurrent layer's causal convolution with its state ([`crate::Backend::conv1d`]).
    Conv1d {
        /// Taps.
        kernel: usize,
        /// With a bias per channel.
        bias: bool,
    },
    /// The gated delta rule with its state ([`crate::Backend::delta_rule`]).
    DeltaRule {
        /// Values per key head.
        k_dim: usize,
        /// Values per value head.
        v_dim: usize,
    },
    /// The Mamba-2 selective scan with its state ([`crate::Backend::ssm_scan`]).
    SsmScan {
        /// Values of each group's B and C.
        d_state: usize,
        /// Values per head.
        head_dim: usize,
    },
    /// Expert routing of router logits ([`crate::Backend::moe_route`]).
    MoeRoute {
        /// Experts in the layer.
        n_expert: usize,
    },
    /// The routed experts' gated FFNs and their weighted sum
    /// ([`crate::Backend::moe_experts`]).
    MoeExperts {
        /// The expert weights' type.
        ty: GgmlType,
        /// Which activation.
        act: Act,
        /// With biases of the products ([`crate::ExpertFfn::bias`]).
        bias: bool,
        /// Values per row of the expert matrix asked about (the model's width for gate and
        /// up, the experts' hidden width for down).
        cols: usize,
    },
    /// The `k` largest logits of one row ([`crate::Backend::top_k`]); `k = 1` is greedy.
    TopK {
        /// Candidates asked for.
        k: usize,
    },
}

impl Op {
    /// The op's name, as errors and the conformance table print it.
    pub fn name(&self) -> &'static str {
        match self {
            Op::Embed { .. } => "embed",
            Op::MatMul { .. } => "matmul",
            Op::MatMulShared { .. } => "matmul_shared",
            Op::Logits { .. } => "logits",
            Op::RmsNorm => "rms_norm",
            Op::NormInto => "norm_into",
            Op::AddNorm => "add_norm",
            Op::Add => "add",
            Op::AddBias => "add_bias",
            Op::Copy => "copy",
            Op::Rope { .. } => "rope",
            Op::KvStore { .. } => "kv_store",
            Op::RopeStore { .. } => "rope_store",
            Op::Attention { .. } => "attention",
            Op::GatedAct { .. } => "gated_act",
            Op::RowGate => "row_gate",
            Op::GatedNorm => "gated_norm",
            Op::ReluSq => "relu_sq",
            Op::GroupNorm => "group_norm",
            Op::Conv1d { .. } => "conv1d",
            Op::DeltaRule { .. } => "delta_rule",
            Op::SsmScan { .. } => "ssm_scan",
            Op::MoeRoute { .. } => "moe_route",
            Op::MoeExperts { .. } => "moe_experts",
            Op::TopK { .. } => "top_k",
        }
    }

    /// The data type the op is asked for, as [`crate::BackendError::Unsupported`] names it.
    pub fn dtype(&self) -> String {
        match self {
            Op::Embed { ty, .. }
            | Op::MatMul { ty, .. }
            | Op::MatMulShared { ty, .. }
            | Op::Logits { ty, .. }
            | Op::MoeExperts { ty, .. } => ty.to_string(),
            Op::RmsNorm
            | Op::NormInto
            | Op::AddNorm
            | Op::Add
            | Op::AddBias
            | Op::Copy
            | Op::Rope { .. }
            | Op::GatedAct { .. }
            | Op::RowGate
            | Op::GatedNorm
            | Op::ReluSq
            | Op::GroupNorm
            | Op::Conv1d { .. }
            | Op::DeltaRule { .. }
            | Op::SsmScan { .. }
            | Op::MoeRoute { .. }
            | Op::TopK { .. } => "f32".to_owned(),
            Op::KvStore { kv } | Op::RopeStore { kv, .. } | Op::Attention { kv, .. } => {
                format!("{} KV", kv.name())
            }
        }
    }
}

/// A backend's answer to [`crate::Backend::supports`], given before evaluation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Support {
    /// The backend runs the op with its own kernel.
    Native,
    /// The backend runs a fused op as the contract's default composition of basic ops.
    Composed,
    /// The backend refuses the op; the reason says why. Calling it returns
    /// [`crate::BackendError::Unsupported`], never a slower fallback.
    Unsupported(String),
}

impl Support {
    /// Whether the op runs at all.
    pub fn runs(&self) -> bool {
        !matches!(self, Support::Unsupported(_))
    }
}
