//! The plain data the ops of the contract are described by: KV element types, rope layouts,
//! attention shapes, activations, host weight views and the session segments of a forward
//! pass. Nothing here computes.

use ferrite_gguf::GgmlType;

use crate::BackendError;

/// Element type of a KV store.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KvType {
    /// IEEE half precision (default).
    #[default]
    F16,
    /// IEEE single precision.
    F32,
    /// Blocks of 32 values: signed bytes `q = round(x · (1 / d))` (ties away from zero) with
    /// `d = max|x| / 127` over the block, read back as `d · q`. Needs head sizes that are
    /// multiples of 32.
    Q8,
}

impl KvType {
    /// The name the command line uses.
    pub fn name(self) -> &'static str {
        match self {
            KvType::F16 => "f16",
            KvType::F32 => "f32",
            KvType::Q8 => "q8",
        }
    }

    /// Bytes of one stored element (of [`KvType::row_elems`]); a q8 block is its f32 scale
    /// and 32 signed bytes.
    pub fn elem_bytes(self) -> usize {
        match self {
            KvType::F16 => 2,
            KvType::F32 => 4,
            KvType::Q8 => 36,
        }
    }

    /// Stored elements of one position's keys (or values) for `n_kv_head` heads of
    /// `head_dim` values: the values, or for q8 their blocks (`None` on overflow, or for q8
    /// when `head_dim` is not a multiple of 32).
    pub fn row_elems(self, n_kv_head: usize, head_dim: usize) -> Option<usize> {
        let values = n_kv_head.checked_mul(head_dim)?;
        match self {
            KvType::F16 | KvType::F32 => Some(values),
            KvType::Q8 => head_dim.is_multiple_of(32).then_some(values / 32),
        }
    }

    /// [`KvType::row_elems`], or the error that says why a store of this type cannot hold
    /// such rows.
    pub fn check_row(self, heads: usize, head_dim: usize) -> Result<usize, BackendError> {
        self.row_elems(heads, head_dim)
            .ok_or(BackendError::KvShape {
                ty: self.name(),
                heads,
                head_dim,
            })
    }
}

/// How rotary embedding pairs the dimensions of one head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RopeStyle {
    /// Adjacent pairs `(2i, 2i+1)`. llama.cpp stores llama Q/K rows permuted so that this
    /// layout on GGUF weights equals Hugging Face's rotate-half on the original weights.
    Interleaved,
    /// Half-split pairs `(i, i + d/2)` (GPT-NeoX, Gemma).
    HalfSplit,
}

/// The gated activation of a feed-forward block: `gate = act(gate) · up`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Act {
    /// SiLU / swish (llama).
    Silu,
    /// GELU with the tanh approximation (Gemma).
    GeluTanh,
    /// gpt-oss's clamped SwiGLU: with `g = min(gate, 7)` and `u = clamp(up, -7, 7)`,
    /// `g · sigmoid(1.702 g) · (u + 1)` (the constants of its reference and of llama.cpp,
    /// which no file stores).
    SwigluOai,
    /// The logistic sigmoid of the gate (Qwen3-Next's attention output gate:
    /// `gate = sigmoid(gate) · up`).
    Sigmoid,
}

impl Act {
    /// The clamp limit of [`Act::SwigluOai`].
    pub const SWIGLU_OAI_LIMIT: f32 = 7.0;
    /// The sigmoid's slope of [`Act::SwigluOai`].
    pub const SWIGLU_OAI_ALPHA: f32 = 1.702;
}

/// Where attention's value rows come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Values {
    /// Rows of their own beside the keys, `head_dim` values a head.
    #[default]
    Own,
    /// Values `at..at + dim` of each key head. A store of such rows keeps no value rows:
    /// MLA's compressed latent is both the non-rope part of its key and its value.
    InKeys {
        /// First value in each key head.
        at: usize,
        /// Values per head.
        dim: usize,
    },
}

impl Values {
    /// Values per head that attention over keys of `head_dim` values writes.
    pub fn dim(self, head_dim: usize) -> usize {
        match self {
            Values::Own => head_dim,
            Values::InKeys { dim, .. } => dim,
        }
    }

    /// Whether a store keeps value rows of its own.
    pub fn stored(self) -> bool {
        self == Values::Own
    }

    /// Why values cannot be read from key heads of `head_dim` values, if they cannot.
    pub fn check(self, head_dim: usize) -> Result<(), String> {
        match self {
            Values::InKeys { at, dim }
                if dim == 0 || at.checked_add(dim).is_none_or(|end| end > head_dim) =>
            {
                Err(format!(
                    "values at {at}, {dim} wide, of key heads of {head_dim}"
                ))
            }
            _ => Ok(()),
        }
    }
}

/// Shape and masking of one layer's attention.
#[derive(Debug, Clone, Copy)]
pub struct AttnShape {
    /// Query heads.
    pub n_head: usize,
    /// Key/value heads; `n_head` is a multiple of it.
    pub n_kv_head: usize,
    /// Values per head.
    pub head_dim: usize,
    /// Multiplier applied to `q·k`.
    pub scale: f32,
    /// Sliding-window length, `None` for full causal attention. A query at position `p`
    /// sees keys at `kv <= p` with `p - kv < w`.
    pub window: Option<usize>,
    /// Soft cap of the scaled scores, `cap · tanh(s / cap)` before the mask and softmax
    /// (Gemma 2); `None` for plain scores.
    pub softcap: Option<f32>,
    /// Where the values come from; the output has [`Values::dim`] values a head.
    pub values: Values,
}

/// How one layer rotates its query and key rows.
#[derive(Debug, Clone, Copy)]
pub struct Rope<V> {
    /// Values per head.
    pub head_dim: usize,
    /// Values rotated at the start of each head (`head_dim` for full rope; fewer for
    /// partial rotary, whose frequencies are those of a `rot_dim` head and whose other
    /// values pass through). Even.
    pub rot_dim: usize,
    /// Rope base (theta).
    pub base: f32,
    /// Pairing of a head's dimensions.
    pub style: RopeStyle,
    /// Per-pair frequency divisors (Llama 3 scaling): pair `i` turns by
    /// `pos · base^(-2i/rot_dim) / factors[i]`.
    pub factors: Option<V>,
    /// LongRoPE (Phi-3): the divisors `(long, after)` that replace `factors` for the rows of
    /// every segment whose KV store holds more than `after` positions (llama.cpp's rule: a
    /// session's context decides, so chunking, batching and decode order change nothing).
    /// Requires `factors`.
    pub long: Option<(V, usize)>,
}

/// A weight matrix in host memory, as the file stores it: `rows` rows of `cols` values
/// (GGUF dims `[cols, rows]`), row-major blocks of `ty`.
#[derive(Debug, Clone, Copy)]
pub struct HostMatrix<'a> {
    /// Element type of the stored rows.
    pub ty: GgmlType,
    /// Number of rows (output features).
    pub rows: usize,
    /// Values per row (input features).
    pub cols: usize,
    /// The raw rows, `rows * ty.row_bytes(cols)` bytes.
    pub data: &'a [u8],
}

/// The rows of one session inside a forward pass: `len` consecutive new tokens at
/// positions `pos0..pos0 + len`, attending over (and appending to) that session's own KV
/// store `kv`. A pass's rows are its segments' rows in order.
#[derive(Debug)]
pub struct Segment<'a, K> {
    /// The session's KV store.
    pub kv: &'a mut K,
    /// Position of the first row.
    pub pos0: usize,
    /// Rows.
    pub len: usize,
}

/// The per-head parameters of a Mamba-2 scan ([`crate::Backend::ssm_scan`]).
#[derive(Debug, Clone, Copy)]
pub struct SsmParams<V> {
    /// Decay rates, `a = -exp(A_log)`.
    pub a: V,
    /// Skip weights `D`.
    pub d: V,
    /// Time-step biases.
    pub dt_bias: V,
    /// The floor of every time step after its softplus: transformers' `time_step_min`,
    /// which its torch path applies; 0 for none (llama.cpp, the mamba_ssm kernels).
    pub dt_min: f32,
}

/// One expert's FFN for [`crate::Backend::moe_experts`]: its gate, up and down matrices
/// and, where the model has them (gpt-oss), a bias of each product.
#[derive(Debug, Clone, Copy)]
pub struct ExpertFfn<W, V> {
    /// Gate, up and down.
    pub mats: [W; 3],
    /// Biases of the gate and up products (`d_ff` values) and of the down product
    /// (`d_model`), added before the activation and before the weighted sum.
    pub bias: Option<[V; 3]>,
}

/// Scratch of [`crate::Backend::moe_experts`]: the rows routed to one expert and their
/// products, and every (token, slot) output, sized for a pass's rows once.
#[derive(Debug)]
pub struct ExpertBufs<B> {
    /// The gathered input rows of one expert (`rows × d_model`).
    pub x: B,
    /// Gate products (`rows × d_ff`).
    pub gate: B,
    /// Up products (`rows × d_ff`).
    pub up: B,
    /// Down products (`rows × d_model`).
    pub y: B,
    /// Output of each (token, slot) (`rows × k × d_model`).
    pub slots: B,
}
