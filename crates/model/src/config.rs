//! Model hyper-parameters read from GGUF metadata, per architecture.
//!
//! Each architecture's quirks are resolved here into plain numbers and flags, so the forward
//! passes (optimized and reference) never branch on the architecture name:
//! - `llama` (SmolLM2): interleaved rope on GGUF weights (llama.cpp's converter permutes
//!   the Q/K rows of Hugging Face's rotate-half layout), SiLU-gated FFN, tied output.
//! - `gemma3` and `gemma2`: half-split rope, embeddings scaled by `sqrt(d_model)`, per-head Q/K norms,
//!   post-attention and post-FFN norms, GELU-tanh gated FFN, sliding-window attention on
//!   5 of every 6 layers with rope base 10 000 (llama.cpp and transformers both hard-code
//!   it; the GGUF stores only the global base), query scale `1/sqrt(key_length)`.
//!   RMSNorm weights are used as stored: the converter already folded Gemma's `1 + w`.
//!   Gemma 3 with linear rope scaling (`rope.scaling.type = linear`, 4B and larger) divides
//!   the positions of its global layers only, as llama.cpp and transformers do. Gemma 2 has
//!   no q/k norms, one rope base, every other layer sliding (even ones), and soft-caps its
//!   attention scores and output logits (`cap · tanh(x / cap)`, llama.cpp's defaults 50 and
//!   30 when the keys are absent). `{arch}.attention.sliding_window_pattern`, when present,
//!   names the sliding layers instead (ferrite's converter writes it from `layer_types`).
//! - `llama` also covers Mistral (optional `llama.attention.sliding_window`),
//!   Mixtral (expert layers when `llama.expert_count` is set) and Llama 3 (rope frequency
//!   factors in `rope_freqs.weight`); optional q/k/v biases are used when present.
//! - `qwen2`: half-split (NeoX) rope, q/k/v biases (required), SiLU FFN.
//! - `qwen3`: half-split rope, per-head q/k RMSNorm, no biases.
//! - `qwen3moe`: `qwen3` attention with an expert FFN on every layer.
//! - YaRN (`rope.scaling.type = yarn`, llama and qwen families): per-pair divisors from
//!   `rope.scaling.factor`, `original_context_length` and the beta corrections, and the
//!   attention factor `1 + 0.1 ln(factor)` (or `rope.scaling.attn_factor`) on q and k.
//! - `phi3`: half-split rope, SiLU FFN, fused `attn_qkv` and `ffn_up` (gate rows first),
//!   LongRoPE: `rope_factors_short.weight` divides the frequencies of a session whose context
//!   is within `rope.scaling.original_context_length`, `rope_factors_long.weight` those of a
//!   longer one (llama.cpp's rule; transformers decides by the sequence it is given, which a
//!   session of exactly that length reproduces); `rope.scaling.attn_factor` (else transformers' `sqrt(1 + ln(s)/ln(orig))`,
//!   `s = context_length / orig`) scales q and k, so the scores by its square.
//!
//! - `glm4moe` (GLM-4.5/4.6): half-split rope on the first `rope.dimension_count` values
//!   of each head (partial rotary), q/k norms and q/k/v biases where the file has them,
//!   `leading_dense_block_count` dense layers, then expert layers with sigmoid routing, a
//!   selection bias and a shared expert; the `nextn_predict_layers` blocks at the end are
//!   multi-token-prediction heads, kept in the file and never run.
//!
//! - `deepseek2` (DeepSeek V2/V3): multi-head latent attention (its keys read in
//!   [`Mla`]) with adjacent-pair rope on the rope part of each head, YaRN's scale
//!   `(1 + yarn_log_multiplier · ln(factor))²` on the scores, leading dense layers, then
//!   expert layers with shared experts (softmax routing for V2; sigmoid with a selection
//!   bias, groups and a weight scale for V3).
//!
//! - `gpt-oss`: q/k/v/o biases, half-split rope with YaRN (correction dimensions not
//!   rounded, as its reference computes them), every other layer sliding (even ones,
//!   unless `attention.sliding_window_pattern` says otherwise), a sink logit per head in
//!   each softmax, routed experts only (softmax over the top k, router and expert biases)
//!   with the clamped SwiGLU; its FFN norm is `post_attention_norm`.
//!
//! - `nemotron_h` (Nemotron-H): blocks of one part each, a Mamba-2 mixer, attention without
//!   rope (scale `1/sqrt(key_length)`) or a squared-ReLU MLP, which part read from the
//!   per-layer `attention.head_count_kv` and `feed_forward_length` arrays
//!   ([`crate::mamba2::blocks`]); no rope keys, so [`ModelConfig::rope_dim`] is 0.
//!
//! MoE, rope-factor, sliding-window and unsupported-feature keys are read in
//! [`crate::features`].

use ferrite_arch::{ARCHITECTURE_KEY, GlobalTensor, Key, Presence, TensorRole};
use ferrite_gguf::Gguf;

use crate::ModelError;
use crate::features::{self, MoeConfig};
use crate::ops::RopeStyle;
use ferrite_arch::{BlockKind, DeltaNetShape, Mamba2Shape, MlaShape};

/// A supported architecture: the rows of the architecture table (`ferrite-arch`).
pub use ferrite_arch::Arch;

/// FFN gate activation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activation {
    /// `x·sigmoid(x)`.
    Silu,
    /// GELU, tanh approximation.
    GeluTanh,
    /// gpt-oss's clamped SwiGLU (`ferrite_backend::Act::SwigluOai`).
    SwigluOai,
}

/// Per-layer attention settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LayerConfig {
    /// Sliding-window length; `None` for full causal attention.
    pub window: Option<usize>,
    /// Rope frequency base of this layer.
    pub rope_base: f32,
    /// Whether this layer's rope divides its frequencies by the model's
    /// [`ModelConfig::rope_freq_factors`] (Gemma 3's sliding layers are never scaled).
    pub rope_scaled: bool,
    /// The one part of a Nemotron-H block; `None` for a layer of a mixer (attention or a
    /// recurrence) and an FFN, as every other architecture's.
    pub block: Option<BlockKind>,
}

/// What a layer keeps in a session's store between passes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kept {
    /// K/V rows of each position (attention).
    Kv,
    /// A recurrent state of fixed size (a gated DeltaNet, a Mamba-2 mixer).
    State,
    /// Nothing (a Nemotron-H MLP block).
    Nothing,
}

/// Hyper-parameters of a loaded model.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    /// Architecture.
    pub arch: Arch,
    /// Transformer blocks.
    pub n_layer: usize,
    /// Residual stream width.
    pub d_model: usize,
    /// Query heads.
    pub n_head: usize,
    /// Key/value heads.
    pub n_kv_head: usize,
    /// Values per head.
    pub head_dim: usize,
    /// Values rope turns at the start of each head (`head_dim` but for partial rotary; 0 for
    /// attention without rope, whose layers' `rope_base` is then 0 too).
    pub rope_dim: usize,
    /// FFN hidden width (of one expert, for MoE models).
    pub d_ff: usize,
    /// Vocabulary size (rows of the embedding).
    pub n_vocab: usize,
    /// Context length the model was trained for (informational).
    pub ctx_train: usize,
    /// RMSNorm epsilon.
    pub rms_eps: f32,
    /// How rope pairs dimensions.
    pub rope_style: RopeStyle,
    /// Multiplier of `q·k`.
    pub attn_scale: f32,
    /// Multiplier applied to looked-up embeddings (Gemma: `sqrt(d_model)`), 1 otherwise.
    pub embed_scale: f32,
    /// FFN activation.
    pub activation: Activation,
    /// Q and K are RMS-normalised per head before rope.
    pub qk_norm: bool,
    /// Attention and FFN outputs are RMS-normalised before the residual add.
    pub post_norms: bool,
    /// Q, K and V projections add a bias.
    pub qkv_bias: bool,
    /// The attention output projection adds a bias.
    pub out_bias: bool,
    /// Rope frequency divisors, one per rotated pair (Llama 3 scaling, or linear scaling's
    /// one factor repeated); `None` for plain rope. Used by the layers marked
    /// [`LayerConfig::rope_scaled`].
    pub rope_freq_factors: Option<Vec<f32>>,
    /// LongRoPE's long divisors and the session length past which they replace
    /// [`ModelConfig::rope_freq_factors`] (Phi-3).
    pub rope_long: Option<(Vec<f32>, usize)>,
    /// Soft cap of the attention scores (after the query scale, before the mask).
    pub attn_softcap: Option<f32>,
    /// Soft cap of the output logits.
    pub final_softcap: Option<f32>,
    /// Expert FFN settings; `None` for dense FFNs.
    pub moe: Option<MoeConfig>,
    /// Multi-head latent attention (`deepseek2`): the attention then has one KV head of
    /// `head_dim = rope_dim + kv_lora_rank` values whose values are its latent, and
    /// `n_head` queries of that size (the absorbed form, see `crate::mla`).
    pub mla: Option<MlaShape>,
    /// Multi-token-prediction blocks the file holds after the [`ModelConfig::n_layer`]
    /// blocks the forward pass runs (`{arch}.nextn_predict_layers`); loaded as part of the
    /// file, never run.
    pub mtp_layers: usize,
    /// The gated DeltaNet of a hybrid (`qwen3next`): which layers are DeltaNets (the others
    /// are gated attention) and their shape.
    pub delta_net: Option<DeltaNetShape>,
    /// The Mamba-2 mixer of a hybrid (`nemotron_h`), on the layers whose
    /// [`LayerConfig::block`] says so.
    pub mamba: Option<Mamba2Shape>,
    /// One entry per layer.
    pub layers: Vec<LayerConfig>,
}

fn usize_key(g: &Gguf, key: &str) -> Result<usize, ModelError> {
    let v = g.get_u32(key)?;
    usize::try_from(v).map_err(|_| bad(key, "does not fit in usize"))
}

fn bad(key: &str, reason: &str) -> ModelError {
    ModelError::BadMetadata {
        key: key.to_owned(),
        reason: reason.to_owned(),
    }
}

fn positive(key: &str, v: usize) -> Result<usize, ModelError> {
    if v == 0 {
        Err(bad(key, "must be positive"))
    } else {
        Ok(v)
    }
}

/// Gemma 3's local (sliding-window) rope base; not stored in GGUF files.
const GEMMA3_LOCAL_ROPE_BASE: f32 = 10_000.0;
/// Gemma 3 alternates five sliding-window layers with one global layer.
const GEMMA3_GLOBAL_EVERY: usize = 6;
/// Gemma 2 alternates sliding (even) and global (odd) layers.
const GEMMA2_GLOBAL_EVERY: usize = 2;
/// gpt-oss alternates sliding (even) and full (odd) layers (llama.cpp's swa pattern 2).
const GPT_OSS_GLOBAL_EVERY: usize = 2;
/// llama.cpp's Gemma 2 soft caps when the file has no keys.
const GEMMA2_ATTN_SOFTCAP: f32 = 50.0;
const GEMMA2_FINAL_SOFTCAP: f32 = 30.0;

/// The metadata key holding the tokenizer's vocabulary.
const TOKENS_KEY: &str = "tokenizer.ggml.tokens";

/// Checks that the tokenizer's vocabulary, when the file has one, has one token per row of
/// the embedding: llama.cpp sizes the embedding from this list, and ferrite's converter pads
/// the list to `vocab_size`. A shorter list lets the model sample ids that cannot be
/// decoded; a longer one lets a prompt hold ids the embedding has no row for. A list of the
/// wrong type is left to the tokenizer, which names it.
fn check_token_count(g: &Gguf, n_vocab: usize) -> Result<(), ModelError> {
    match g.get(TOKENS_KEY).and_then(|v| v.as_array()) {
        Some(tokens) if tokens.len() != n_vocab => Err(bad(
            TOKENS_KEY,
            &format!(
                "{} tokens, but {} has {n_vocab} rows",
                tokens.len(),
                GlobalTensor::TokenEmbd.name()
            ),
        )),
        _ => Ok(()),
    }
}

/// Fewest positions a usable context has: a prompt token and the one it predicts.
const MIN_CONTEXT: usize = 2;

/// Checks the keys that restate the vocabulary and context against what the file holds:
/// `ARCH.vocab_size` (when present) is the embedding's row count, `ARCH.context_length`
/// holds at least [`MIN_CONTEXT`] positions, and every special token id
/// (`tokenizer.ggml.*_token_id`) names a row of the embedding. Each of these loaded and made
/// text before (issue 35); a model with a padding id past its vocabulary would hand that id
/// to the embedding.
fn check_vocab_and_context(
    g: &Gguf,
    arch: &str,
    n_vocab: usize,
    ctx_train: usize,
) -> Result<(), ModelError> {
    let vocab_key = format!("{arch}.vocab_size");
    if g.get(&vocab_key).is_some() {
        let v = usize_key(g, &vocab_key)?;
        if v != n_vocab {
            return Err(bad(
                &vocab_key,
                &format!("{v}, but token_embd.weight has {n_vocab} rows"),
            ));
        }
    }
    if ctx_train < MIN_CONTEXT {
        return Err(bad(
            &format!("{arch}.context_length"),
            &format!("{ctx_train} positions cannot hold a prompt and a next token"),
        ));
    }
    for (key, value) in g.metadata() {
        if !(key.starts_with("tokenizer.ggml.") && key.ends_with("_token_id")) {
            continue;
        }
        match value.as_integer() {
            Some(id) if (0..n_vocab as i128).contains(&id) => {}
            Some(id) => {
                return Err(bad(
                    key,
                    &format!("token id {id} is outside the vocabulary of {n_vocab}"),
                ));
            }
            None => return Err(bad(key, "is not an integer")),
        }
    }
    Ok(())
}

impl ModelConfig {
    /// Reads the configuration of `g`. A missing key is reported by name.
    pub fn from_gguf(g: &Gguf) -> Result<ModelConfig, ModelError> {
        let arch_name = g.get_str(ARCHITECTURE_KEY)?;
        let arch = Arch::from_name(arch_name)
            .ok_or_else(|| ModelError::UnknownArchitecture(arch_name.to_owned()))?;
        let a = arch_name;
        let f = arch.features();
        let k = |key: Key| arch.key(key);
        let blocks = positive(&k(Key::BlockCount), usize_key(g, &k(Key::BlockCount))?)?;
        let mtp_key = k(Key::NextnPredictLayers);
        let mtp_layers = match g.get(&mtp_key) {
            Some(_) => usize_key(g, &mtp_key)?,
            None => 0,
        };
        if mtp_layers >= blocks {
            return Err(bad(
                &mtp_key,
                &format!("{mtp_layers} prediction blocks leave none of the {blocks} to run"),
            ));
        }
        let n_layer = blocks - mtp_layers;
        // Per-layer tables are sized by this count before any block's tensors are looked
        // up; every block has tensors, so the file's tensor table bounds it.
        if blocks > g.tensors().len() {
            return Err(bad(
                &k(Key::BlockCount),
                &format!(
                    "{blocks} blocks, but the file has only {} tensors",
                    g.tensors().len()
                ),
            ));
        }
        let d_model = positive(
            &k(Key::EmbeddingLength),
            usize_key(g, &k(Key::EmbeddingLength))?,
        )?;
        let n_head = positive(&k(Key::HeadCount), usize_key(g, &k(Key::HeadCount))?)?;
        // Nemotron-H says per block which part it has, in per-layer KV-head and FFN-width
        // arrays; every other architecture has both parts in every layer.
        let (kinds, n_kv_head, dense_ff) = if f.mamba2 {
            let b = crate::mamba2::blocks(g, arch, blocks)?;
            let kinds = b.kinds[..n_layer].iter().copied().map(Some).collect();
            (kinds, b.n_kv_head, Some(b.d_ff))
        } else {
            let kv = positive(&k(Key::HeadCountKv), usize_key(g, &k(Key::HeadCountKv))?)?;
            let ff = match g.get(&k(Key::FeedForwardLength)) {
                Some(_) => Some(usize_key(g, &k(Key::FeedForwardLength))?),
                None => None,
            };
            (vec![None; n_layer], kv, ff)
        };
        if n_head % n_kv_head != 0 {
            return Err(bad(
                &k(Key::HeadCountKv),
                "must divide attention.head_count",
            ));
        }
        // Every architecture refuses what its forward pass lacks (YaRN rope, shared
        // experts, ...); experts are read for the architectures that have them.
        features::check_unsupported(g, arch)?;
        let (moe, d_ff) = if f.experts == Presence::Never {
            (None, dense_ff)
        } else {
            features::moe(g, a, f.experts == Presence::Required, dense_ff)?
        };
        let ff_key = if moe.is_some() && g.get(&k(Key::ExpertFeedForwardLength)).is_some() {
            k(Key::ExpertFeedForwardLength)
        } else {
            k(Key::FeedForwardLength)
        };
        let d_ff = match d_ff {
            Some(v) => positive(&ff_key, v)?,
            // Reports the missing key by name.
            None => positive(&ff_key, usize_key(g, &ff_key)?)?,
        };
        let ctx_train = usize_key(g, &k(Key::ContextLength))?;
        // Values that would make every activation NaN are refused here, by key, rather than
        // surfacing as NaN logits at the first token.
        // llama.cpp's nemotron_h files may give the norms' epsilon as the LayerNorm key only.
        let eps_key = match g.get(&k(Key::LayerNormRmsEpsilon)) {
            None if f.mamba2 => k(Key::LayerNormEpsilon),
            _ => k(Key::LayerNormRmsEpsilon),
        };
        let rms_eps = g.get_f32(&eps_key)?;
        if !(rms_eps.is_finite() && rms_eps >= 0.0) {
            return Err(bad(
                &eps_key,
                &format!("{rms_eps} is not a finite, non-negative number"),
            ));
        }
        // Nemotron-H's attention has no rope, and its files no rope keys.
        let roped = !f.mamba2;
        let rope_base = if roped {
            g.get_f32(&k(Key::RopeFreqBase))?
        } else {
            0.0
        };
        if roped && !(rope_base.is_finite() && rope_base > 0.0) {
            return Err(bad(
                &k(Key::RopeFreqBase),
                &format!("{rope_base} is not a finite, positive number"),
            ));
        }
        let head_dim = match g.get(&k(Key::KeyLength)) {
            Some(_) => positive(&k(Key::KeyLength), usize_key(g, &k(Key::KeyLength))?)?,
            None => {
                if d_model % n_head != 0 {
                    return Err(bad(
                        &k(Key::EmbeddingLength),
                        "not a multiple of head_count",
                    ));
                }
                d_model / n_head
            }
        };
        if head_dim % 2 != 0 {
            return Err(bad(&k(Key::KeyLength), "head dim must be even"));
        }
        // Latent attention's values are its latent, checked with its other keys.
        if !f.mla
            && g.get(&k(Key::ValueLength)).is_some()
            && usize_key(g, &k(Key::ValueLength))? != head_dim
        {
            return Err(bad(&k(Key::ValueLength), "must equal key_length"));
        }
        let rope_dim = match g.get(&k(Key::RopeDimensionCount)) {
            _ if !roped => 0,
            None => head_dim,
            Some(_) => usize_key(g, &k(Key::RopeDimensionCount))?,
        };
        if roped && (rope_dim < 2 || rope_dim > head_dim || !rope_dim.is_multiple_of(2)) {
            return Err(bad(
                &k(Key::RopeDimensionCount),
                &format!(
                    "{rope_dim} must be even, at least 2 and at most the head size {head_dim}"
                ),
            ));
        }
        if let Some(m) = &moe
            && m.leading_dense > n_layer
        {
            return Err(bad(
                &k(Key::LeadingDenseBlockCount),
                &format!("{} dense blocks of {n_layer}", m.leading_dense),
            ));
        }
        let embd_name = GlobalTensor::TokenEmbd.name();
        let embd = g
            .tensor(embd_name)
            .ok_or_else(|| ModelError::MissingTensor(embd_name.into()))?;
        let n_vocab = match embd.dims.as_slice() {
            [_, v] => usize::try_from(*v).map_err(|_| bad(embd_name, "too large"))?,
            _ => {
                return Err(ModelError::TensorShape {
                    name: embd.name.clone(),
                    got: embd.dims.clone(),
                    expected: vec![d_model as u64, 0],
                });
            }
        };
        check_token_count(g, n_vocab)?;
        check_vocab_and_context(g, a, n_vocab, ctx_train)?;
        let rope_factors = if roped {
            features::rope_factors(g, arch, rope_dim, rope_base)?
        } else {
            None
        };
        let qk_norm = f
            .qk_norm
            .resolve(g.tensor(&TensorRole::AttnQNorm.weight(0)).is_some());
        let cfg = match arch {
            Arch::Llama
            | Arch::Qwen2
            | Arch::Qwen3
            | Arch::Qwen3Moe
            | Arch::Phi3
            | Arch::Glm4Moe
            | Arch::Deepseek2
            | Arch::GptOss
            | Arch::Qwen3Next => {
                let windows = if arch == Arch::GptOss {
                    features::alternating_windows(g, a, n_layer, GPT_OSS_GLOBAL_EVERY)?
                } else {
                    features::sliding_windows(g, a, n_layer)?
                };
                let long = features::long_rope(g, arch, rope_dim, ctx_train)?;
                let mla = if f.mla {
                    Some(crate::mla::from_gguf(
                        g,
                        arch,
                        (n_kv_head, head_dim, rope_dim),
                    )?)
                } else {
                    None
                };
                let attn_factor = match &long {
                    Some(l) => l.attn_factor,
                    None => features::yarn_attn_factor(g, arch)?,
                };
                ModelConfig {
                    arch,
                    n_layer,
                    d_model,
                    n_head,
                    n_kv_head,
                    head_dim,
                    rope_dim,
                    d_ff,
                    n_vocab,
                    ctx_train,
                    rms_eps,
                    // llama.cpp permutes llama Q/K rows for interleaved rope; Qwen keeps
                    // Hugging Face's layout (NeoX rope).
                    rope_style: if f.interleaved_rope {
                        RopeStyle::Interleaved
                    } else {
                        RopeStyle::HalfSplit
                    },
                    attn_scale: match &mla {
                        Some((_, scale)) => *scale,
                        None => attn_factor * attn_factor / (head_dim as f32).sqrt(),
                    },
                    embed_scale: 1.0,
                    activation: if arch == Arch::GptOss {
                        Activation::SwigluOai
                    } else {
                        Activation::Silu
                    },
                    qk_norm,
                    post_norms: f.post_norms,
                    // Qwen 2 always has them (the table says so); llama/qwen3 checkpoints
                    // with `attention_bias = true` carry them too.
                    qkv_bias: f
                        .qkv_bias
                        .resolve(g.tensor(&TensorRole::AttnQ.bias(0)).is_some()),
                    out_bias: f
                        .out_bias
                        .resolve(g.tensor(&TensorRole::AttnOutput.bias(0)).is_some()),
                    rope_freq_factors: rope_factors.clone(),
                    rope_long: long.map(|l| (l.factors, l.after)),
                    attn_softcap: None,
                    final_softcap: None,
                    moe,
                    mla: mla.map(|(shape, _)| shape),
                    mtp_layers,
                    delta_net: if f.delta_net {
                        Some(crate::delta_net::from_gguf(g, arch)?)
                    } else {
                        None
                    },
                    mamba: None,
                    layers: windows
                        .into_iter()
                        .map(|window| LayerConfig {
                            window,
                            rope_base,
                            rope_scaled: rope_factors.is_some(),
                            block: None,
                        })
                        .collect(),
                }
            }
            Arch::Gemma3 | Arch::Gemma2 => {
                let gemma2 = arch == Arch::Gemma2;
                let every = if gemma2 {
                    GEMMA2_GLOBAL_EVERY
                } else {
                    GEMMA3_GLOBAL_EVERY
                };
                let sliding = features::alternating_windows(g, a, n_layer, every)?;
                let layers = sliding
                    .into_iter()
                    .map(|window| LayerConfig {
                        window,
                        // Gemma 3's local layers have their own base and no scaling.
                        rope_base: match window {
                            Some(_) if !gemma2 => GEMMA3_LOCAL_ROPE_BASE,
                            _ => rope_base,
                        },
                        rope_scaled: window.is_none() && rope_factors.is_some(),
                        block: None,
                    })
                    .collect();
                let cap = |key: Key, default: f32| -> Result<Option<f32>, ModelError> {
                    if !gemma2 {
                        return Ok(None);
                    }
                    let v = match g.get(&k(key)) {
                        Some(_) => g.get_f32(&k(key))?,
                        None => default,
                    };
                    if !(v.is_finite() && v >= 0.0) {
                        return Err(bad(&k(key), &format!("{v} is not a finite cap ≥ 0")));
                    }
                    Ok((v > 0.0).then_some(v))
                };
                ModelConfig {
                    arch,
                    n_layer,
                    d_model,
                    n_head,
                    n_kv_head,
                    head_dim,
                    rope_dim,
                    d_ff,
                    n_vocab,
                    ctx_train,
                    rms_eps,
                    rope_style: RopeStyle::HalfSplit,
                    // query_pre_attn_scalar = key_length for every released Gemma 3 size.
                    attn_scale: 1.0 / (head_dim as f32).sqrt(),
                    embed_scale: (d_model as f32).sqrt(),
                    activation: Activation::GeluTanh,
                    qk_norm,
                    post_norms: f.post_norms,
                    qkv_bias: false,
                    out_bias: false,
                    rope_freq_factors: rope_factors,
                    rope_long: None,
                    attn_softcap: cap(Key::AttnLogitSoftcapping, GEMMA2_ATTN_SOFTCAP)?,
                    final_softcap: cap(Key::FinalLogitSoftcapping, GEMMA2_FINAL_SOFTCAP)?,
                    moe: None,
                    mla: None,
                    mtp_layers,
                    delta_net: None,
                    mamba: None,
                    layers,
                }
            }
            Arch::NemotronH => ModelConfig {
                arch,
                n_layer,
                d_model,
                n_head,
                n_kv_head,
                head_dim,
                rope_dim,
                d_ff,
                n_vocab,
                ctx_train,
                rms_eps,
                // Unused: no layer turns its heads.
                rope_style: RopeStyle::HalfSplit,
                attn_scale: 1.0 / (head_dim as f32).sqrt(),
                embed_scale: 1.0,
                // The Mamba-2 gate's; no block has a gated FFN (its MLP is the squared
                // ReLU of `BlockKind::Mlp`).
                activation: Activation::Silu,
                qk_norm: false,
                post_norms: false,
                qkv_bias: false,
                out_bias: false,
                rope_freq_factors: None,
                rope_long: None,
                attn_softcap: None,
                final_softcap: None,
                moe: None,
                mla: None,
                mtp_layers,
                delta_net: None,
                mamba: Some(crate::mamba2::from_gguf(g, arch)?),
                layers: features::sliding_windows(g, a, n_layer)?
                    .into_iter()
                    .zip(kinds)
                    .map(|(window, block)| LayerConfig {
                        window,
                        rope_base,
                        rope_scaled: false,
                        block,
                    })
                    .collect(),
            },
        };
        Ok(cfg)
    }

    /// Whether layer `l` is a gated DeltaNet rather than attention.
    pub fn is_delta_net(&self, l: usize) -> bool {
        self.delta_net.is_some_and(|s| !s.is_attention(l))
    }

    /// What layer `l` keeps in a session's store.
    pub fn kept(&self, l: usize) -> Kept {
        match self.layers[l].block {
            Some(BlockKind::Mamba2) => Kept::State,
            Some(BlockKind::Mlp) => Kept::Nothing,
            Some(BlockKind::Attention) => Kept::Kv,
            None if self.is_delta_net(l) => Kept::State,
            None => Kept::Kv,
        }
    }

    /// Layer `l`'s slot in a session's store: its index among the layers that keep what it
    /// keeps (the attention layers' K/V rows, the recurrent layers' states).
    pub fn slot(&self, l: usize) -> usize {
        (0..l).filter(|&i| self.kept(i) == self.kept(l)).count()
    }

    /// Layers that keep K/V rows.
    pub fn kv_layers(&self) -> usize {
        (0..self.n_layer)
            .filter(|&l| self.kept(l) == Kept::Kv)
            .count()
    }

    /// Layers that keep a recurrent state, and the values of each one's state.
    pub fn state_slots(&self) -> (usize, usize) {
        let len = match (self.delta_net, self.mamba) {
            (Some(s), _) => s.state_len(),
            (None, Some(s)) => s.state_len(),
            (None, None) => return (0, 0),
        };
        let slots = (0..self.n_layer)
            .filter(|&l| self.kept(l) == Kept::State)
            .count();
        (slots, len)
    }

    /// Width of one token's keys (or values): `n_kv_head × head_dim`.
    pub fn kv_dim(&self) -> usize {
        self.n_kv_head * self.head_dim
    }

    /// The widest FFN hidden row of any layer: experts, leading dense layers, shared expert.
    pub fn ffn_width(&self) -> usize {
        let m = self.moe.as_ref();
        let extra = m.map_or(0, |m| m.dense_ff.max(m.shared_ff));
        self.d_ff.max(extra)
    }

    /// Width of one token's queries: `n_head × head_dim`.
    pub fn q_dim(&self) -> usize {
        self.n_head * self.head_dim
    }

    /// Width of the attention output projection's input: every head's value
    /// (`n_head × v_dim` for latent attention, else [`ModelConfig::q_dim`]).
    pub fn attn_out_dim(&self) -> usize {
        match &self.mla {
            Some(m) => self.n_head * m.v_dim,
            None => self.q_dim(),
        }
    }

    /// Where attention's values come from: rows of their own, or the latent inside the
    /// cached keys.
    pub fn kv_values(&self) -> ferrite_backend::Values {
        self.mla.map_or(ferrite_backend::Values::Own, |m| {
            ferrite_backend::Values::InKeys {
                at: m.rope_dim,
                dim: m.kv_lora_rank,
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{tiny_gguf, with_metadata};
    use ferrite_gguf::{Array, GgmlType, Value};

    fn cfg(arch: &str, skip_key: &str) -> Result<ModelConfig, ModelError> {
        let g = Gguf::from_bytes(tiny_gguf(arch, GgmlType::F32, skip_key, "")).unwrap();
        ModelConfig::from_gguf(&g)
    }

    #[test]
    fn llama_config_from_metadata() {
        let c = cfg("llama", "").unwrap();
        assert_eq!(c.arch, Arch::Llama);
        assert_eq!((c.n_layer, c.d_model, c.n_head, c.n_kv_head), (2, 64, 4, 2));
        assert_eq!((c.head_dim, c.d_ff, c.n_vocab), (16, 128, 97));
        assert_eq!(c.rope_style, RopeStyle::Interleaved);
        assert_eq!(c.attn_scale, 0.25);
        assert_eq!(c.embed_scale, 1.0);
        assert!(!c.qk_norm && !c.post_norms);
        assert!(
            c.layers
                .iter()
                .all(|l| l.window.is_none() && l.rope_base == 1e4)
        );
    }

    #[test]
    fn gemma3_config_alternates_sliding_and_global_layers() {
        let c = cfg("gemma3", "").unwrap();
        assert_eq!(c.arch, Arch::Gemma3);
        assert_eq!((c.head_dim, c.n_kv_head), (32, 1));
        assert_eq!(c.rope_style, RopeStyle::HalfSplit);
        assert_eq!(c.embed_scale, 8.0);
        assert_eq!(c.attn_scale, 1.0 / 32f32.sqrt());
        assert_eq!(c.activation, Activation::GeluTanh);
        for (i, l) in c.layers.iter().enumerate() {
            if i == 5 {
                assert_eq!((l.window, l.rope_base), (None, 1e6));
            } else {
                assert_eq!((l.window, l.rope_base), (Some(4), 1e4));
            }
        }
    }

    #[test]
    fn gemma2_caps_and_alternation_and_gemma3_linear_scaling() {
        let g2 = cfg("gemma2", "").unwrap();
        assert_eq!(g2.arch, Arch::Gemma2);
        assert!(!g2.qk_norm && g2.post_norms);
        assert_eq!((g2.attn_softcap, g2.final_softcap), (Some(1.5), Some(3.0)));
        for (i, l) in g2.layers.iter().enumerate() {
            let window = (i % 2 == 0).then_some(4);
            assert_eq!((l.window, l.rope_base, l.rope_scaled), (window, 1e6, false));
        }
        // llama.cpp's defaults when the keys are absent; a zero cap is none.
        let g2 = cfg("gemma2", "gemma2.final_logit_softcapping").unwrap();
        assert_eq!(g2.final_softcap, Some(30.0));
        let g2 = cfg_with(
            "gemma2",
            vec![("gemma2.attn_logit_softcapping".into(), Value::F32(0.0))],
        )
        .unwrap();
        assert_eq!(g2.attn_softcap, None);
        let g3 = cfg("gemma3_linear", "").unwrap();
        assert_eq!(g3.rope_freq_factors.as_deref(), Some(&[4.0; 16][..]));
        assert!(g3.attn_softcap.is_none() && g3.final_softcap.is_none());
        for (i, l) in g3.layers.iter().enumerate() {
            // Only the global layer (5) is scaled.
            assert_eq!(l.rope_scaled, i == 5, "layer {i}");
        }
        let err = cfg("gemma3_linear", "gemma3.rope.scaling.factor").unwrap_err();
        assert!(
            err.to_string().contains("gemma3.rope.scaling.factor"),
            "{err}"
        );
    }

    #[test]
    fn unknown_architecture_is_named() {
        let err = cfg("mamba", "").unwrap_err();
        assert!(
            matches!(err, ModelError::UnknownArchitecture(ref a) if a == "mamba"),
            "{err}"
        );
    }

    #[test]
    fn missing_key_is_named() {
        for key in [
            "llama.attention.head_count_kv",
            "llama.rope.freq_base",
            "llama.attention.layer_norm_rms_epsilon",
        ] {
            let err = cfg("llama", key).unwrap_err();
            assert!(err.to_string().contains(key), "{key}: {err}");
        }
        let err = cfg("gemma3", "gemma3.attention.sliding_window").unwrap_err();
        assert!(
            err.to_string().contains("gemma3.attention.sliding_window"),
            "{err}"
        );
    }

    fn cfg_with(variant: &str, extra: Vec<(String, Value)>) -> Result<ModelConfig, ModelError> {
        let bytes = with_metadata(tiny_gguf(variant, GgmlType::F32, "", ""), extra);
        ModelConfig::from_gguf(&Gguf::from_bytes(bytes).unwrap())
    }

    #[test]
    fn qwen_configs_use_neox_rope_and_their_own_features() {
        let q2 = cfg("qwen2", "").unwrap();
        assert_eq!(
            (q2.arch, q2.rope_style),
            (Arch::Qwen2, RopeStyle::HalfSplit)
        );
        assert!(q2.qkv_bias && !q2.qk_norm && q2.moe.is_none());
        let q3 = cfg("qwen3", "").unwrap();
        assert_eq!((q3.arch, q3.head_dim, q3.q_dim()), (Arch::Qwen3, 32, 128));
        assert!(q3.qk_norm && !q3.qkv_bias);
        let moe = cfg("qwen3moe", "").unwrap();
        assert_eq!(moe.arch, Arch::Qwen3Moe);
        assert_eq!(
            moe.moe,
            Some(MoeConfig {
                n_expert: 4,
                n_expert_used: 2,
                rule: ferrite_backend::RouteRule::softmax(false),
                selection_bias: false,
                leading_dense: 0,
                dense_ff: 0,
                shared_ff: 0,
            })
        );
        // The expert width comes from expert_feed_forward_length, not feed_forward_length.
        assert_eq!(moe.d_ff, 32);
        let err = cfg("qwen3moe", "qwen3moe.expert_count").unwrap_err();
        assert!(err.to_string().contains("qwen3moe.expert_count"), "{err}");
    }

    #[test]
    fn llama_variants_mistral_mixtral_llama3() {
        let mistral = cfg("mistral", "").unwrap();
        assert_eq!(mistral.arch, Arch::Llama);
        assert!(mistral.layers.iter().all(|l| l.window == Some(4)));
        let mixtral = cfg("mixtral", "").unwrap();
        let m = mixtral.moe.unwrap();
        // No expert_weights_norm key: renormalise, as llama.cpp does for mixtral.
        assert_eq!(
            (m.n_expert, m.n_expert_used, m.rule.norm_topk),
            (4, 2, true)
        );
        assert_eq!(mixtral.d_ff, 32);
        let l3 = cfg("llama3", "").unwrap();
        let f = l3.rope_freq_factors.unwrap();
        assert_eq!((f.len(), f[0], f[7]), (8, 1.0, 8.0));
        assert!(cfg("llama", "").unwrap().rope_freq_factors.is_none());
        let err = cfg("mixtral", "llama.expert_used_count").unwrap_err();
        assert!(err.to_string().contains("llama.expert_used_count"), "{err}");
        let err = cfg_with(
            "mixtral",
            vec![("llama.expert_used_count".into(), Value::U32(5))],
        )
        .unwrap_err();
        assert!(err.to_string().contains("1..=4"), "{err}");
    }

    #[test]
    fn sliding_window_pattern_selects_layers() {
        let pattern = Value::Array(Array::Bool(vec![false, true]));
        let c = cfg_with(
            "qwen2",
            vec![
                ("qwen2.attention.sliding_window".into(), Value::U32(6)),
                ("qwen2.attention.sliding_window_pattern".into(), pattern),
            ],
        )
        .unwrap();
        assert_eq!(c.layers[0].window, None);
        assert_eq!(c.layers[1].window, Some(6));
        let err = cfg_with(
            "qwen2",
            vec![
                ("qwen2.attention.sliding_window".into(), Value::U32(6)),
                (
                    "qwen2.attention.sliding_window_pattern".into(),
                    Value::U32(3),
                ),
            ],
        )
        .unwrap_err();
        assert!(
            err.to_string()
                .contains("qwen2.attention.sliding_window_pattern"),
            "{err}"
        );
    }

    /// Regression: `block_count` = u32::MAX made the loader allocate a 64 GiB per-layer
    /// table (and abort) before any tensor was looked up. A block needs tensors, so a count
    /// beyond the file's tensor table is refused before anything is sized by it.
    #[test]
    fn rejects_more_blocks_than_the_file_has_tensors() {
        for n in [u32::MAX, 1 << 20] {
            for variant in ["llama", "gemma3"] {
                let key = format!("{variant}.block_count");
                let err = cfg_with(variant, vec![(key.clone(), Value::U32(n))]).unwrap_err();
                assert!(
                    matches!(&err, ModelError::BadMetadata { key: k, .. } if *k == key),
                    "{variant} {n}: {err}"
                );
            }
        }
    }

    /// Regression: a NaN, negative or zero rope base and a NaN or negative RMSNorm epsilon
    /// were accepted, and every logit came out NaN at the first token ("logit 0 is NaN"),
    /// an error that does not name the bad key.
    #[test]
    fn rejects_unusable_epsilon_and_rope_base() {
        let eps = "llama.attention.layer_norm_rms_epsilon";
        let base = "llama.rope.freq_base";
        for (key, v) in [
            (eps, f32::NAN),
            (eps, -1e-5),
            (eps, f32::INFINITY),
            (base, f32::NAN),
            (base, 0.0),
            (base, -10_000.0),
            (base, f32::INFINITY),
        ] {
            let err = cfg_with("llama", vec![(key.into(), Value::F32(v))]).unwrap_err();
            assert!(
                matches!(&err, ModelError::BadMetadata { key: k, .. } if k == key),
                "{key} = {v}: {err}"
            );
        }
        // Zero epsilon is usable (llama.cpp accepts it too).
        cfg_with("llama", vec![(eps.into(), Value::F32(0.0))]).unwrap();
    }

    /// Regression: a tokenizer with fewer tokens than the embedding has rows let the model
    /// sample ids the tokenizer cannot decode (the run failed mid-answer); one with more let
    /// the prompt hold ids the embedding has no row for. llama.cpp sizes the embedding from
    /// the token list, so both are malformed files, refused at load.
    #[test]
    fn rejects_a_token_list_that_disagrees_with_the_embedding() {
        let key = "tokenizer.ggml.tokens";
        let tokens = |n: usize| {
            let names: Vec<String> = (0..n).map(|i| format!("t{i}")).collect();
            Value::Array(Array::String(names.iter().map(String::as_str).collect()))
        };
        for n in [crate::testutil::VOCAB - 1, crate::testutil::VOCAB + 1] {
            let err = cfg_with("llama", vec![(key.into(), tokens(n))]).unwrap_err();
            assert!(
                matches!(&err, ModelError::BadMetadata { key: k, .. } if k == key),
                "{n} tokens: {err}"
            );
        }
        let c = cfg_with("llama", vec![(key.into(), tokens(crate::testutil::VOCAB))]).unwrap();
        assert_eq!(c.n_vocab, crate::testutil::VOCAB);
    }

    /// Regression (issue 35): a vocabulary size, context length or special token id that
    /// contradicts the file loaded and produced text.
    #[test]
    fn rejects_vocab_context_and_token_ids_that_contradict_the_file() {
        let vocab = crate::testutil::VOCAB as u32;
        for (key, value) in [
            ("llama.vocab_size", Value::U32(0)),
            ("llama.vocab_size", Value::U32(vocab + 1)),
            ("llama.context_length", Value::U32(0)),
            ("llama.context_length", Value::U32(1)),
            ("tokenizer.ggml.padding_token_id", Value::U32(1 << 31)),
            ("tokenizer.ggml.padding_token_id", Value::U32(vocab)),
            ("tokenizer.ggml.eos_token_id", Value::I32(-1)),
            ("tokenizer.ggml.bos_token_id", Value::String("1".into())),
        ] {
            let err = cfg_with("llama", vec![(key.into(), value.clone())]).unwrap_err();
            assert!(
                matches!(&err, ModelError::BadMetadata { key: k, .. } if k == key),
                "{key} = {value:?}: {err}"
            );
        }
        for (key, value) in [
            ("llama.vocab_size", Value::U32(vocab)),
            ("llama.context_length", Value::U32(2)),
            ("tokenizer.ggml.padding_token_id", Value::U32(vocab - 1)),
        ] {
            cfg_with("llama", vec![(key.into(), value)]).unwrap();
        }
    }

    #[test]
    fn unsupported_features_are_named() {
        for (variant, key, value) in [
            (
                "llama",
                "llama.rope.scaling.type",
                Value::String("dynamic".into()),
            ),
            ("mixtral", "llama.expert_gating_func", Value::U32(4)),
            ("qwen2", "qwen2.final_logit_softcapping", Value::F32(30.0)),
            // Regression: gemma3 skipped these checks, so a file asking for soft-capping
            // loaded and ran without it, giving other logits than transformers.
            (
                "gemma3",
                "gemma3.rope.scaling.type",
                Value::String("yarn".into()),
            ),
            ("gemma3", "gemma3.final_logit_softcapping", Value::F32(30.0)),
            ("gemma3", "gemma3.attn_logit_softcapping", Value::F32(50.0)),
        ] {
            let err = cfg_with(variant, vec![(key.into(), value)]).unwrap_err();
            assert!(
                matches!(err, ModelError::Unsupported { key: ref k, .. } if k == key),
                "{key}: {err}"
            );
        }
        // Neutral values ask for nothing.
        for (variant, key, value) in [
            (
                "llama",
                "llama.rope.scaling.type",
                Value::String("none".into()),
            ),
            ("mixtral", "llama.expert_gating_func", Value::U32(1)),
            ("qwen3moe", "qwen3moe.expert_shared_count", Value::U32(0)),
        ] {
            cfg_with(variant, vec![(key.into(), value)]).unwrap();
        }
        // The routing keys of DeepSeek V3 and GLM-4.5 are read, and checked.
        let c = cfg_with(
            "qwen3moe",
            vec![
                ("qwen3moe.expert_gating_func".into(), Value::U32(2)),
                ("qwen3moe.expert_weights_scale".into(), Value::F32(2.5)),
                ("qwen3moe.expert_group_count".into(), Value::U32(2)),
                ("qwen3moe.expert_group_used_count".into(), Value::U32(1)),
            ],
        )
        .unwrap();
        let rule = c.moe.unwrap().rule;
        assert_eq!(
            (rule.gating, rule.scale, rule.groups),
            (ferrite_backend::Gating::Sigmoid, 2.5, Some((2, 1)))
        );
        for (key, value) in [
            ("qwen3moe.expert_weights_scale", Value::F32(0.0)),
            ("qwen3moe.expert_group_count", Value::U32(3)),
        ] {
            let err = cfg_with("qwen3moe", vec![(key.into(), value)]).unwrap_err();
            assert!(
                matches!(err, ModelError::BadMetadata { .. }),
                "{key}: {err}"
            );
        }
    }
}
