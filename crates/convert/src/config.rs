//! `config.json` → architecture and GGUF hyper-parameter metadata.
//!
//! Which GGUF architecture a Hugging Face class becomes, and the keys written, follow
//! llama.cpp's converter (see docs/gguf-conventions.md): Llama, Mistral and Mixtral all become
//! `llama` (Q/K rows permuted for interleaved rope; Mixtral adds expert counts), Qwen 2/3
//! become `qwen2`/`qwen3`, Qwen3-MoE becomes `qwen3moe` (neox rope, no permutation), Gemma 2
//! and Gemma 3 (`Gemma3ForCausalLM`) become `gemma2`/`gemma3` (norm weights stored as
//! `1 + w`, soft caps, linear rope scaling of the global layers, the sliding layers of
//! `layer_types` as `attention.sliding_window_pattern`), gpt-oss becomes `gpt-oss` (its
//! SwiGLU constants and YaRN's `truncate` checked against what readers fix). Missing
//! optional keys take the defaults transformers' config classes use, so the GGUF describes
//! the model transformers would build. Anything that would change the computation and is
//! not handled (another activation, partial rope, a rope scaling other than llama3,
//! interleaved dense/MoE layers) is refused by name rather than dropped.

use ferrite_arch::{Arch, BlockKind, DeltaNetShape, GlobalTensor, Key, MlaShape};
use ferrite_gguf::{Array, Value};
use serde_json::{Map, Value as Json};

use crate::ConvertError;
use crate::mamba2::Mamba2Hybrid;

/// The multimodal Gemma 3 class, whose text model converts (`text_config`).
const GEMMA3_MULTIMODAL: &str = "Gemma3ForConditionalGeneration";

/// A supported Hugging Face model family.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Family {
    /// `LlamaForCausalLM`.
    Llama,
    /// `MistralForCausalLM`.
    Mistral,
    /// `MixtralForCausalLM`.
    Mixtral,
    /// `Qwen2ForCausalLM`.
    Qwen2,
    /// `Qwen3ForCausalLM`.
    Qwen3,
    /// `Qwen3MoeForCausalLM`.
    Qwen3Moe,
    /// `Gemma2ForCausalLM`.
    Gemma2,
    /// `Gemma3ForCausalLM` (the text model).
    Gemma3,
    /// `Phi3ForCausalLM`.
    Phi3,
    /// `Glm4MoeForCausalLM` (GLM-4.5, 4.6).
    Glm4Moe,
    /// `DeepseekV2ForCausalLM` (V2, V2-Lite, V2.5).
    DeepseekV2,
    /// `DeepseekV3ForCausalLM` (V3, R1).
    DeepseekV3,
    /// `GptOssForCausalLM` (gpt-oss 20B, 120B), with float experts (not MXFP4).
    GptOss,
    /// `Qwen3NextForCausalLM` (Qwen3-Next 80B-A3B): gated DeltaNet and gated attention.
    Qwen3Next,
    /// `NemotronHForCausalLM` (Nemotron-H, Nemotron Nano 2): Mamba-2, attention and MLP
    /// blocks.
    NemotronH,
}

impl Family {
    fn from_config(cfg: &Map<String, Json>) -> Result<Family, ConvertError> {
        let class = cfg
            .get("architectures")
            .and_then(Json::as_array)
            .and_then(|a| a.first())
            .and_then(Json::as_str);
        let by_class = class.and_then(|c| {
            Some(match c {
                "LlamaForCausalLM" => Family::Llama,
                "MistralForCausalLM" => Family::Mistral,
                "MixtralForCausalLM" => Family::Mixtral,
                "Qwen2ForCausalLM" => Family::Qwen2,
                "Qwen3ForCausalLM" => Family::Qwen3,
                "Qwen3MoeForCausalLM" => Family::Qwen3Moe,
                "Gemma2ForCausalLM" => Family::Gemma2,
                "Gemma3ForCausalLM" => Family::Gemma3,
                "Phi3ForCausalLM" => Family::Phi3,
                "Glm4MoeForCausalLM" => Family::Glm4Moe,
                "DeepseekV2ForCausalLM" => Family::DeepseekV2,
                "DeepseekV3ForCausalLM" => Family::DeepseekV3,
                "GptOssForCausalLM" => Family::GptOss,
                "Qwen3NextForCausalLM" => Family::Qwen3Next,
                "NemotronHForCausalLM" => Family::NemotronH,
                _ => return None,
            })
        });
        if let Some(f) = by_class {
            return Ok(f);
        }
        let model_type = cfg.get("model_type").and_then(Json::as_str);
        match (class, model_type) {
            (None, Some("llama")) => Ok(Family::Llama),
            (None, Some("mistral")) => Ok(Family::Mistral),
            (None, Some("mixtral")) => Ok(Family::Mixtral),
            (None, Some("qwen2")) => Ok(Family::Qwen2),
            (None, Some("qwen3")) => Ok(Family::Qwen3),
            (None, Some("qwen3_moe")) => Ok(Family::Qwen3Moe),
            (None, Some("gemma2")) => Ok(Family::Gemma2),
            (None, Some("gemma3_text")) => Ok(Family::Gemma3),
            (None, Some("phi3")) => Ok(Family::Phi3),
            (None, Some("glm4_moe")) => Ok(Family::Glm4Moe),
            (None, Some("deepseek_v2")) => Ok(Family::DeepseekV2),
            (None, Some("deepseek_v3")) => Ok(Family::DeepseekV3),
            (None, Some("gpt_oss")) => Ok(Family::GptOss),
            (None, Some("qwen3_next")) => Ok(Family::Qwen3Next),
            (None, Some("nemotron_h")) => Ok(Family::NemotronH),
            (Some(c), _) => Err(ConvertError::UnsupportedArchitecture(c.to_owned())),
            (None, Some(t)) => Err(ConvertError::UnsupportedArchitecture(t.to_owned())),
            (None, None) => Err(ConvertError::BadConfig {
                key: "architectures".into(),
                reason: "neither architectures nor model_type is present".into(),
            }),
        }
    }

    /// The GGUF architecture this family is written as.
    pub fn arch(self) -> Arch {
        match self {
            Family::Llama | Family::Mistral | Family::Mixtral => Arch::Llama,
            Family::Qwen2 => Arch::Qwen2,
            Family::Qwen3 => Arch::Qwen3,
            Family::Qwen3Moe => Arch::Qwen3Moe,
            Family::Gemma2 => Arch::Gemma2,
            Family::Gemma3 => Arch::Gemma3,
            Family::Phi3 => Arch::Phi3,
            Family::Glm4Moe => Arch::Glm4Moe,
            Family::DeepseekV2 | Family::DeepseekV3 => Arch::Deepseek2,
            Family::GptOss => Arch::GptOss,
            Family::Qwen3Next => Arch::Qwen3Next,
            Family::NemotronH => Arch::NemotronH,
        }
    }

    /// DeepSeek's latent-attention families.
    pub fn deepseek(self) -> bool {
        matches!(self, Family::DeepseekV2 | Family::DeepseekV3)
    }

    /// Gemma stores RMSNorm weights as offsets from 1 (`1 + w` is the scale) and names its
    /// four per-layer norms its own way.
    pub fn gemma(self) -> bool {
        matches!(self, Family::Gemma2 | Family::Gemma3)
    }

    /// Whether its RMSNorm weights are offsets from 1 (Gemma; Qwen3-Next's norms but the
    /// DeltaNet's own `ssm_norm`), which GGUF stores as the scale `1 + w`.
    pub fn offset_norms(self) -> bool {
        self.gemma() || self == Family::Qwen3Next
    }

    /// The GGUF `general.architecture` this family is written as.
    pub fn gguf_arch(self) -> &'static str {
        self.arch().name()
    }

    /// Whether llama.cpp permutes this family's Q/K rows (interleaved rope in GGUF):
    /// DeepSeek's rope already pairs adjacent values, so its rows stay as they are.
    pub fn permutes_qk(self) -> bool {
        self.arch().features().interleaved_rope && !self.deepseek()
    }

    /// transformers' default `rope_theta`.
    fn default_rope_theta(self) -> f64 {
        match self {
            Family::Mixtral | Family::Gemma3 => 1e6,
            Family::GptOss => 150_000.0,
            _ => 1e4,
        }
    }

    /// transformers' default `max_position_embeddings`.
    fn default_ctx(self) -> u64 {
        match self {
            Family::Llama => 2048,
            Family::NemotronH => 4096,
            Family::Mistral | Family::Mixtral => 4096 * 32,
            Family::Qwen2 | Family::Qwen3 | Family::Qwen3Moe => 32768,
            Family::Qwen3Next => 262_144,
            Family::Gemma2 => 8192,
            Family::Phi3 => 4096,
            Family::Gemma3 | Family::Glm4Moe | Family::GptOss => 131_072,
            Family::DeepseekV2 => 2048,
            Family::DeepseekV3 => 4096,
        }
    }

    /// transformers' default `rms_norm_eps`.
    fn default_rms_eps(self) -> f64 {
        match self {
            Family::Mixtral
            | Family::Phi3
            | Family::Glm4Moe
            | Family::GptOss
            | Family::NemotronH => 1e-5,
            _ => 1e-6,
        }
    }
}

/// Llama 3 rope scaling parameters (`rope_scaling.rope_type = "llama3"`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Llama3Rope {
    /// `factor`.
    pub factor: f64,
    /// `low_freq_factor`.
    pub low_freq_factor: f64,
    /// `high_freq_factor`.
    pub high_freq_factor: f64,
    /// `original_max_position_embeddings`.
    pub original_ctx: f64,
}

/// LongRoPE (`rope_scaling.type = "longrope"`, Phi-3): two divisor sets and the context
/// where the long one takes over.
#[derive(Debug, Clone, PartialEq)]
pub struct LongRope {
    /// `short_factor`, one per rotated pair.
    pub short: Vec<f32>,
    /// `long_factor`, one per rotated pair.
    pub long: Vec<f32>,
    /// `original_max_position_embeddings`.
    pub original_ctx: u64,
    /// `attention_factor`, else transformers' `sqrt(1 + ln(s) / ln(original_ctx))` with
    /// `s = max_position_embeddings / original_ctx` (1 when `s <= 1`).
    pub attn_factor: f64,
}

/// YaRN (`rope_type = "yarn"`): frequencies past the slow correction divided by `factor`,
/// a ramp down to the fast one, and an attention factor.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Yarn {
    /// `factor`.
    pub factor: f64,
    /// `original_max_position_embeddings`.
    pub original_ctx: u64,
    /// `beta_fast` (32 when absent).
    pub beta_fast: f64,
    /// `beta_slow` (1 when absent).
    pub beta_slow: f64,
    /// `attention_factor`, when given (readers default to `1 + 0.1 ln(factor)`).
    pub attn_factor: Option<f64>,
    /// DeepSeek's `0.1 · mscale_all_dim`: the attention scale's YaRN factor is
    /// `1 + log_multiplier · ln(factor)`, squared.
    pub log_multiplier: Option<f64>,
}

/// How a config scales its rope.
enum Scaling {
    None,
    Llama3(Llama3Rope),
    Linear(f64),
    Long(LongRope),
    Yarn(Yarn),
}

/// Mixture-of-experts settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Experts {
    /// Experts per layer.
    pub count: usize,
    /// Experts chosen per token.
    pub used: usize,
    /// Hidden width of one expert when it differs from `intermediate_size` (Qwen3-MoE).
    pub ff: Option<usize>,
    /// Whether the chosen experts' weights are renormalised to sum to 1 (Qwen3-MoE's
    /// `norm_topk_prob`; Mixtral always renormalises and has no key).
    pub norm_topk: Option<bool>,
    /// Shared experts every token runs (`n_shared_experts`; 0 for none).
    pub shared: usize,
    /// The shared expert's width when it is not `shared` experts' (Qwen3-Next's
    /// `shared_expert_intermediate_size`).
    pub shared_ff: Option<usize>,
    /// Leading layers with a dense FFN (`first_k_dense_replace`).
    pub leading_dense: usize,
    /// Sigmoid scores instead of softmax (GLM-4.5, DeepSeek V3).
    pub sigmoid: bool,
    /// Multiplier of the chosen experts' weights (`routed_scaling_factor`).
    pub scale: Option<f64>,
    /// `(n_group, topk_group)` of group-limited routing, when there is more than one group.
    pub groups: Option<(usize, usize)>,
}

impl Experts {
    /// Softmax routing without shared experts, dense layers, scale or groups (Mixtral,
    /// Qwen3-MoE): the fields the other families leave as they are.
    const SOFTMAX: Experts = Experts {
        count: 0,
        used: 0,
        ff: None,
        norm_topk: None,
        shared: 0,
        shared_ff: None,
        leading_dense: 0,
        sigmoid: false,
        scale: None,
        groups: None,
    };
}

/// Sliding-window attention settings.
#[derive(Debug, Clone, PartialEq)]
pub struct SlidingWindow {
    /// Window length in tokens.
    pub window: usize,
    /// Per layer: whether it uses the window (all true for Mistral).
    pub layers: Vec<bool>,
}

/// A parsed `config.json`: the family and every hyper-parameter the GGUF needs.
#[derive(Debug, Clone, PartialEq)]
pub struct HfConfig {
    /// Model family.
    pub family: Family,
    /// Transformer blocks.
    pub n_layer: usize,
    /// Residual width.
    pub d_model: usize,
    /// FFN hidden width (of a dense FFN, or of each Mixtral expert).
    pub d_ff: usize,
    /// Query heads.
    pub n_head: usize,
    /// Key/value heads.
    pub n_kv_head: usize,
    /// Values per head.
    pub head_dim: usize,
    /// Values rope turns at the start of each head (`partial_rotary_factor × head_dim`).
    pub rope_dim: usize,
    /// Whether `head_dim` was given explicitly (then `key_length`/`value_length` are written).
    pub head_dim_explicit: bool,
    /// `vocab_size`.
    pub n_vocab: usize,
    /// Training context length.
    pub ctx: u64,
    /// RMSNorm epsilon.
    pub rms_eps: f64,
    /// Rope base.
    pub rope_theta: f64,
    /// Llama 3 rope scaling, if configured.
    pub llama3_rope: Option<Llama3Rope>,
    /// Linear rope scaling's factor (positions divided by it; Gemma 3: global layers only).
    pub linear_rope: Option<f64>,
    /// LongRoPE, if configured.
    pub long_rope: Option<LongRope>,
    /// YaRN, if configured.
    pub yarn: Option<Yarn>,
    /// Gemma 2's soft caps of the attention scores and of the output logits.
    pub softcaps: [Option<f64>; 2],
    /// Output projection shares the embedding matrix.
    pub tie_embeddings: bool,
    /// MoE settings, for MoE families.
    pub experts: Option<Experts>,
    /// Latent attention (DeepSeek): then `n_kv_head` is 1 and `head_dim` the cached row's
    /// `rope_dim + kv_lora_rank`, as llama.cpp writes the absorbed form.
    pub mla: Option<MlaShape>,
    /// Sliding-window attention, if any layer uses it.
    pub sliding_window: Option<SlidingWindow>,
    /// The gated DeltaNet of a hybrid (Qwen3-Next), with its interval of attention layers.
    pub delta_net: Option<DeltaNetShape>,
    /// The blocks and Mamba-2 mixers of a Mamba-2 hybrid (Nemotron-H).
    pub mamba2: Option<Mamba2Hybrid>,
    /// The text model of a multimodal checkpoint (`Gemma3ForConditionalGeneration`): its
    /// weights carry a `language_model` prefix and the vision weights are left out.
    pub multimodal: bool,
}

pub(crate) fn bad(key: &str, reason: impl Into<String>) -> ConvertError {
    ConvertError::BadConfig {
        key: key.to_owned(),
        reason: reason.into(),
    }
}

/// A count of `config.json`. Counts are written as GGUF u32 values, so a larger one is
/// refused here rather than truncated on the way out.
pub(crate) fn get_usize(cfg: &Map<String, Json>, key: &str) -> Result<Option<usize>, ConvertError> {
    match cfg.get(key) {
        None | Some(Json::Null) => Ok(None),
        Some(v) => v
            .as_u64()
            .filter(|&n| n <= u64::from(u32::MAX))
            .and_then(|n| usize::try_from(n).ok())
            .map(Some)
            .ok_or_else(|| {
                bad(
                    key,
                    format!("expected a non-negative integer below 2^32, got {v}"),
                )
            }),
    }
}

pub(crate) fn need_usize(cfg: &Map<String, Json>, key: &str) -> Result<usize, ConvertError> {
    match get_usize(cfg, key)? {
        Some(0) => Err(bad(key, "must be positive")),
        Some(n) => Ok(n),
        None => Err(bad(key, "missing")),
    }
}

fn get_f64(cfg: &Map<String, Json>, key: &str) -> Result<Option<f64>, ConvertError> {
    match cfg.get(key) {
        None | Some(Json::Null) => Ok(None),
        Some(v) => v
            .as_f64()
            .map(Some)
            .ok_or_else(|| bad(key, format!("expected a number, got {v}"))),
    }
}

fn get_bool(cfg: &Map<String, Json>, key: &str) -> Result<Option<bool>, ConvertError> {
    match cfg.get(key) {
        None | Some(Json::Null) => Ok(None),
        Some(Json::Bool(b)) => Ok(Some(*b)),
        Some(v) => Err(bad(key, format!("expected a boolean, got {v}"))),
    }
}

impl HfConfig {
    /// Parses the text of a `config.json`.
    pub fn from_json(text: &str) -> Result<HfConfig, ConvertError> {
        let json: Json = serde_json::from_str(text).map_err(|e| ConvertError::Json {
            path: "config.json".into(),
            reason: e.to_string(),
        })?;
        let Json::Object(cfg) = json else {
            return Err(bad("", "config.json is not a JSON object"));
        };
        Self::from_map(&cfg)
    }

    fn from_map(cfg: &Map<String, Json>) -> Result<HfConfig, ConvertError> {
        let class = cfg
            .get("architectures")
            .and_then(Json::as_array)
            .and_then(|a| a.first())
            .and_then(Json::as_str);
        if class != Some(GEMMA3_MULTIMODAL) {
            return Self::from_text_map(cfg);
        }
        // The text model's config, as Gemma3ForCausalLM would have it.
        let Some(Json::Object(text)) = cfg.get("text_config") else {
            return Err(bad(
                "text_config",
                format!("missing: {GEMMA3_MULTIMODAL} keeps its text model's config there"),
            ));
        };
        let mut text = text.clone();
        text.insert("architectures".into(), Json::from(["Gemma3ForCausalLM"]));
        if let Some(tie) = cfg.get("tie_word_embeddings") {
            text.entry("tie_word_embeddings")
                .or_insert_with(|| tie.clone());
        }
        Ok(HfConfig {
            multimodal: true,
            ..Self::from_text_map(&text)?
        })
    }

    fn from_text_map(cfg: &Map<String, Json>) -> Result<HfConfig, ConvertError> {
        let family = Family::from_config(cfg)?;
        // Nemotron-H names its activations per part; `mamba2::hybrid` checks them.
        let mamba2 = match family {
            Family::NemotronH => Some(crate::mamba2::hybrid(cfg)?),
            _ => None,
        };
        let (act_key, want) = if family.gemma() {
            ("hidden_activation", "gelu_pytorch_tanh")
        } else {
            ("hidden_act", "silu")
        };
        let act = cfg
            .get(act_key)
            .or_else(|| cfg.get("hidden_act"))
            .and_then(Json::as_str)
            .unwrap_or(want);
        if act != want && mamba2.is_none() {
            return Err(ConvertError::UnsupportedFeature(format!(
                "{act_key} {act:?} (only {want} for this family)"
            )));
        }
        if family == Family::GptOss {
            // The clamped SwiGLU's constants are fixed in every reader.
            for (key, want) in [("swiglu_limit", 7.0), ("swiglu_alpha", 1.702)] {
                if let Some(v) = get_f64(cfg, key)?
                    && v != want
                {
                    return Err(ConvertError::UnsupportedFeature(format!(
                        "{key} {v} (readers fix it at {want})"
                    )));
                }
            }
        }
        let n_layer = match &mamba2 {
            Some(h) => h.blocks.len(),
            None => need_usize(cfg, "num_hidden_layers")?,
        };
        let d_model = need_usize(cfg, "hidden_size")?;
        let d_ff = need_usize(cfg, "intermediate_size")?;
        let n_head = need_usize(cfg, "num_attention_heads")?;
        let n_kv_head = get_usize(cfg, "num_key_value_heads")?.unwrap_or(n_head);
        if n_kv_head == 0 || n_head % n_kv_head != 0 {
            return Err(bad(
                "num_key_value_heads",
                "must be positive and divide num_attention_heads",
            ));
        }
        let explicit = get_usize(cfg, "head_dim")?;
        let head_dim = match explicit {
            Some(0) => return Err(bad("head_dim", "must be positive")),
            Some(h) => h,
            None if d_model % n_head == 0 => d_model / n_head,
            None => {
                return Err(bad(
                    "hidden_size",
                    "not a multiple of num_attention_heads and no head_dim",
                ));
            }
        };
        if head_dim % 2 != 0 {
            return Err(bad("head_dim", "must be even for rope"));
        }
        // ferrite's Gemma scales queries by 1/sqrt(head_dim), as every Gemma but 2 27B and
        // 3 27B does; those would need a key no reader has.
        if family.gemma()
            && let Some(s) = get_f64(cfg, "query_pre_attn_scalar")?
            && s != head_dim as f64
        {
            return Err(ConvertError::UnsupportedFeature(format!(
                "query_pre_attn_scalar {s} other than head_dim {head_dim}"
            )));
        }
        let n_vocab = need_usize(cfg, "vocab_size")?;
        let ctx =
            get_usize(cfg, "max_position_embeddings")?.map_or(family.default_ctx(), |c| c as u64);
        let eps_key = if mamba2.is_some() {
            "layer_norm_epsilon"
        } else {
            "rms_norm_eps"
        };
        let rms_eps = get_f64(cfg, eps_key)?.unwrap_or(family.default_rms_eps());
        // The loader refuses these too; refusing here keeps a file it cannot load unwritten.
        if !(rms_eps.is_finite() && rms_eps >= 0.0) {
            return Err(bad(eps_key, "must be a finite number ≥ 0"));
        }
        let mla = if family.deepseek() {
            let q_lora_rank = get_usize(cfg, "q_lora_rank")?.filter(|&r| r > 0);
            Some(MlaShape {
                q_lora_rank,
                kv_lora_rank: need_usize(cfg, "kv_lora_rank")?,
                nope_dim: need_usize(cfg, "qk_nope_head_dim")?,
                rope_dim: need_usize(cfg, "qk_rope_head_dim")?,
                v_dim: need_usize(cfg, "v_head_dim")?,
            })
        } else {
            None
        };
        if let Some(m) = &mla {
            if m.rope_dim % 2 != 0 {
                return Err(bad("qk_rope_head_dim", "must be even for rope"));
            }
            // transformers' `rope_interleave = false` would rotate halves of the rope part.
            if get_bool(cfg, "rope_interleave")? == Some(false) {
                return Err(ConvertError::UnsupportedFeature(
                    "rope_interleave false (half-split rope on DeepSeek's rope part)".into(),
                ));
            }
        }
        let (n_kv_head, head_dim) = match &mla {
            Some(m) => (1, m.cache_row()),
            None => (n_kv_head, head_dim),
        };
        let rope_dim = match &mla {
            Some(m) => m.rope_dim,
            None => rope_dim(cfg, family, head_dim)?,
        };
        let (rope_theta, scaling) = rope(cfg, family, rope_dim, ctx)?;
        let (mut llama3_rope, mut linear_rope, mut long_rope, mut yarn) = (None, None, None, None);
        match scaling {
            Scaling::None => {}
            Scaling::Llama3(r) => llama3_rope = Some(r),
            Scaling::Linear(f) => linear_rope = Some(f),
            Scaling::Long(r) => long_rope = Some(r),
            Scaling::Yarn(r) => yarn = Some(r),
        }
        if !(rope_theta.is_finite() && rope_theta > 0.0) {
            return Err(bad("rope_theta", "must be a finite number > 0"));
        }
        let tie_embeddings = get_bool(cfg, "tie_word_embeddings")?.unwrap_or(family.gemma());
        let mut softcaps = [None; 2];
        for (cap, key) in softcaps
            .iter_mut()
            .zip(["attn_logit_softcapping", "final_logit_softcapping"])
        {
            *cap = match get_f64(cfg, key)? {
                None => None,
                Some(c) if family == Family::Gemma2 && c.is_finite() && c > 0.0 => Some(c),
                Some(c) if family == Family::Gemma2 => {
                    return Err(bad(key, format!("{c} is not a positive cap")));
                }
                Some(_) => {
                    return Err(ConvertError::UnsupportedFeature(format!(
                        "{key} outside Gemma 2"
                    )));
                }
            };
        }
        let experts = experts(cfg, family)?;
        let sliding_window = sliding_window(cfg, family, n_layer)?;
        let delta_net = match family {
            Family::Qwen3Next => Some(crate::delta_net::shape(cfg, n_layer)?),
            _ => None,
        };
        Ok(HfConfig {
            family,
            n_layer,
            d_model,
            d_ff,
            n_head,
            n_kv_head,
            head_dim,
            rope_dim,
            head_dim_explicit: explicit.is_some() && mla.is_none(),
            n_vocab,
            ctx,
            rms_eps,
            rope_theta,
            llama3_rope,
            linear_rope,
            long_rope,
            yarn,
            softcaps,
            tie_embeddings,
            experts,
            mla,
            sliding_window,
            delta_net,
            mamba2,
            multimodal: false,
        })
    }

    /// The `{arch}.*` hyper-parameter metadata, in llama.cpp's order.
    pub fn metadata(&self) -> Vec<(String, Value)> {
        let arch = self.family.arch();
        let k = |key: Key| arch.key(key);
        let u = |n: usize| Value::U32(n as u32);
        let mut m = vec![
            (k(Key::BlockCount), u(self.n_layer)),
            (k(Key::ContextLength), Value::U32(self.ctx as u32)),
            (k(Key::EmbeddingLength), u(self.d_model)),
        ];
        match &self.mamba2 {
            // Per block: an FFN width for the MLP blocks, KV heads for the attention
            // blocks, zero for the rest; no rope.
            Some(h) => {
                let per_block = |part: BlockKind, n: usize| {
                    let values = h
                        .blocks
                        .iter()
                        .map(|&b| if b == part { n as u32 } else { 0 });
                    Value::Array(Array::U32(values.collect()))
                };
                m.extend([
                    (
                        k(Key::FeedForwardLength),
                        per_block(BlockKind::Mlp, self.d_ff),
                    ),
                    (k(Key::HeadCount), u(self.n_head)),
                    (
                        k(Key::HeadCountKv),
                        per_block(BlockKind::Attention, self.n_kv_head),
                    ),
                ]);
            }
            None => m.extend([
                (k(Key::FeedForwardLength), u(self.d_ff)),
                (k(Key::HeadCount), u(self.n_head)),
                (k(Key::HeadCountKv), u(self.n_kv_head)),
                (k(Key::RopeFreqBase), Value::F32(self.rope_theta as f32)),
            ]),
        }
        m.push((k(Key::LayerNormRmsEpsilon), Value::F32(self.rms_eps as f32)));
        if self.mamba2.is_some() {
            // llama.cpp's nemotron_h loader requires it.
            m.push((k(Key::LayerNormEpsilon), Value::F32(self.rms_eps as f32)));
        }
        if let Some(e) = &self.experts {
            m.push((k(Key::ExpertCount), u(e.count)));
            m.push((k(Key::ExpertUsedCount), u(e.used)));
        }
        if self.head_dim_explicit {
            m.push((k(Key::KeyLength), u(self.head_dim)));
            m.push((k(Key::ValueLength), u(self.head_dim)));
        }
        if arch == Arch::Llama {
            m.push((k(Key::VocabSize), u(self.n_vocab)));
        }
        if matches!(
            arch,
            Arch::Llama | Arch::Phi3 | Arch::Glm4Moe | Arch::Deepseek2 | Arch::Qwen3Next
        ) {
            m.push((k(Key::RopeDimensionCount), u(self.rope_dim)));
        }
        if let Some(a) = &self.mla {
            if let Some(r) = a.q_lora_rank {
                m.push((k(Key::QLoraRank), u(r)));
            }
            m.push((k(Key::KvLoraRank), u(a.kv_lora_rank)));
            m.push((k(Key::KeyLength), u(self.head_dim)));
            m.push((k(Key::ValueLength), u(a.kv_lora_rank)));
            m.push((k(Key::KeyLengthMla), u(a.qk_dim())));
            m.push((k(Key::ValueLengthMla), u(a.v_dim)));
        }
        if let Some(e) = &self.experts {
            if let Some(ff) = e.ff {
                m.push((k(Key::ExpertFeedForwardLength), u(ff)));
            }
            if let Some(norm) = e.norm_topk {
                m.push((k(Key::ExpertWeightsNorm), Value::Bool(norm)));
            }
            if e.shared > 0 {
                m.push((k(Key::ExpertSharedCount), u(e.shared)));
            }
            if let Some(ff) = e.shared_ff {
                m.push((k(Key::ExpertSharedFeedForwardLength), u(ff)));
            }
            if e.leading_dense > 0 {
                m.push((k(Key::LeadingDenseBlockCount), u(e.leading_dense)));
            }
            if let Some(scale) = e.scale {
                m.push((k(Key::ExpertWeightsScale), Value::F32(scale as f32)));
            }
            if e.sigmoid {
                // llama.cpp's LLAMA_EXPERT_GATING_FUNC_TYPE_SIGMOID.
                m.push((k(Key::ExpertGatingFunc), Value::U32(2)));
            }
            if let Some((groups, kept)) = e.groups {
                m.push((k(Key::ExpertGroupCount), u(groups)));
                m.push((k(Key::ExpertGroupUsedCount), u(kept)));
            }
        }
        if let Some(r) = &self.long_rope {
            m.push((
                k(Key::RopeScalingAttnFactor),
                Value::F32(r.attn_factor as f32),
            ));
            m.push((
                k(Key::RopeScalingOriginalContextLength),
                Value::U32(r.original_ctx as u32),
            ));
        }
        if let Some(y) = &self.yarn {
            m.push((k(Key::RopeScalingType), Value::String("yarn".into())));
            m.push((k(Key::RopeScalingFactor), Value::F32(y.factor as f32)));
            m.push((
                k(Key::RopeScalingOriginalContextLength),
                Value::U32(y.original_ctx as u32),
            ));
            m.push((
                k(Key::RopeScalingYarnBetaFast),
                Value::F32(y.beta_fast as f32),
            ));
            m.push((
                k(Key::RopeScalingYarnBetaSlow),
                Value::F32(y.beta_slow as f32),
            ));
            if let Some(a) = y.attn_factor {
                m.push((k(Key::RopeScalingAttnFactor), Value::F32(a as f32)));
            }
            if let Some(l) = y.log_multiplier {
                m.push((k(Key::RopeScalingYarnLogMultiplier), Value::F32(l as f32)));
            }
        }
        if let Some(f) = self.linear_rope {
            m.push((k(Key::RopeScalingType), Value::String("linear".into())));
            m.push((k(Key::RopeScalingFactor), Value::F32(f as f32)));
        }
        for (key, cap) in [Key::AttnLogitSoftcapping, Key::FinalLogitSoftcapping]
            .into_iter()
            .zip(self.softcaps)
        {
            if let Some(c) = cap {
                m.push((k(key), Value::F32(c as f32)));
            }
        }
        if let Some(s) = &self.delta_net {
            m.push((k(Key::SsmConvKernel), u(s.conv_kernel)));
            m.push((k(Key::SsmStateSize), u(s.k_dim)));
            m.push((k(Key::SsmGroupCount), u(s.k_heads)));
            m.push((k(Key::SsmTimeStepRank), u(s.v_heads)));
            m.push((k(Key::SsmInnerSize), u(s.inner())));
            m.push((k(Key::FullAttentionInterval), u(s.interval)));
        }
        if let Some(h) = &self.mamba2 {
            let s = h.shape;
            m.push((k(Key::SsmConvKernel), u(s.conv_kernel)));
            m.push((k(Key::SsmStateSize), u(s.d_state)));
            m.push((k(Key::SsmGroupCount), u(s.n_groups)));
            m.push((k(Key::SsmTimeStepRank), u(s.n_heads)));
            m.push((k(Key::SsmInnerSize), u(s.inner())));
            m.push((k(Key::SsmTimeStepMin), Value::F32(h.dt_min as f32)));
        }
        if let Some(sw) = &self.sliding_window {
            m.push((k(Key::SlidingWindow), u(sw.window)));
            if !sw.layers.iter().all(|&l| l) {
                m.push((
                    k(Key::SlidingWindowPattern),
                    Value::Array(Array::Bool(sw.layers.clone())),
                ));
            }
        }
        m
    }

    /// The rope divisor tensors the GGUF holds: Llama 3's `rope_freqs.weight`, LongRoPE's
    /// `rope_factors_long.weight` and `rope_factors_short.weight`.
    pub fn rope_tensors(&self) -> Vec<(GlobalTensor, Vec<f32>)> {
        let mut out: Vec<_> = self
            .rope_freqs()
            .map(|f| (GlobalTensor::RopeFreqs, f))
            .into_iter()
            .collect();
        if let Some(r) = &self.long_rope {
            out.push((GlobalTensor::RopeFactorsLong, r.long.clone()));
            out.push((GlobalTensor::RopeFactorsShort, r.short.clone()));
        }
        out
    }

    /// The `rope_freqs.weight` values (one per rotated pair) for Llama 3 rope scaling:
    /// the divisor applied to each base frequency, as llama.cpp computes it (in f32).
    pub fn rope_freqs(&self) -> Option<Vec<f32>> {
        let r = self.llama3_rope?;
        let dim = self.head_dim;
        let base = self.rope_theta as f32;
        let low_wavelen = (r.original_ctx / r.low_freq_factor) as f32;
        let high_wavelen = (r.original_ctx / r.high_freq_factor) as f32;
        let factor = r.factor as f32;
        Some(
            (0..dim / 2)
                .map(|i| {
                    let freq = 1.0 / base.powf((2 * i) as f32 / dim as f32);
                    let wavelen = 2.0 * std::f32::consts::PI / freq;
                    if wavelen < high_wavelen {
                        1.0
                    } else if wavelen > low_wavelen {
                        factor
                    } else {
                        let smooth = (r.original_ctx as f32 / wavelen - r.low_freq_factor as f32)
                            / (r.high_freq_factor - r.low_freq_factor) as f32;
                        1.0 / ((1.0 - smooth) / factor + smooth)
                    }
                })
                .collect(),
        )
    }
}

/// Rope base and scaling. transformers 5 writes `rope_parameters` (with `rope_theta` inside);
/// older configs write `rope_theta` and `rope_scaling` (`type` or `rope_type`).
fn rope(
    cfg: &Map<String, Json>,
    family: Family,
    head_dim: usize,
    ctx: u64,
) -> Result<(f64, Scaling), ConvertError> {
    let empty = Map::new();
    let (key, params) = match (cfg.get("rope_parameters"), cfg.get("rope_scaling")) {
        (Some(Json::Object(p)), _) => ("rope_parameters", p),
        (_, Some(Json::Object(p))) => ("rope_scaling", p),
        (None | Some(Json::Null), None | Some(Json::Null)) => ("rope_scaling", &empty),
        _ => return Err(bad("rope_scaling", "expected an object or null")),
    };
    let (key, params) = match family {
        Family::Gemma3 => gemma3_global_rope(cfg, key, params)?,
        _ => (key, params),
    };
    let theta = match get_f64(params, "rope_theta")? {
        Some(t) => t,
        None => get_f64(cfg, "rope_theta")?.unwrap_or(family.default_rope_theta()),
    };
    let kind = params
        .get("rope_type")
        .or_else(|| params.get("type"))
        .and_then(Json::as_str)
        .unwrap_or("default");
    if kind == "linear" {
        let factor = get_f64(params, "factor")?
            .filter(|f| f.is_finite() && *f > 0.0)
            .ok_or_else(|| bad(&format!("{key}.factor"), "linear rope needs a factor > 0"))?;
        return Ok((theta, Scaling::Linear(factor)));
    }
    if kind == "yarn" {
        if family.gemma() {
            return Err(ConvertError::UnsupportedFeature(format!(
                "{key} type \"yarn\" on a Gemma model"
            )));
        }
        return Ok((theta, Scaling::Yarn(yarn(cfg, family, key, params)?)));
    }
    if kind == "longrope" {
        return Ok((
            theta,
            Scaling::Long(long_rope(cfg, key, params, head_dim, ctx)?),
        ));
    }
    let scaling = match kind {
        "default" => None,
        "llama3" => {
            let f = |k: &str, default: f64| -> Result<f64, ConvertError> {
                Ok(get_f64(params, k)
                    .map_err(|_| bad(&format!("{key}.{k}"), "expected a number"))?
                    .unwrap_or(default))
            };
            let r = Llama3Rope {
                factor: f("factor", 8.0)?,
                low_freq_factor: f("low_freq_factor", 1.0)?,
                high_freq_factor: f("high_freq_factor", 4.0)?,
                original_ctx: f("original_max_position_embeddings", 8192.0)?,
            };
            if r.high_freq_factor <= r.low_freq_factor || r.factor <= 0.0 {
                return Err(bad(
                    key,
                    "llama3 rope needs high_freq_factor > low_freq_factor and factor > 0",
                ));
            }
            Some(r)
        }
        other => {
            return Err(ConvertError::UnsupportedFeature(format!(
                "{key} type {other:?} (supported: default, linear, llama3)"
            )));
        }
    };
    Ok((theta, scaling.map_or(Scaling::None, Scaling::Llama3)))
}

/// The values rope turns per head: `partial_rotary_factor × head_dim` (top level, or in
/// `rope_parameters` as transformers 5 writes it), for the families whose readers take it.
fn rope_dim(
    cfg: &Map<String, Json>,
    family: Family,
    head_dim: usize,
) -> Result<usize, ConvertError> {
    const KEY: &str = "partial_rotary_factor";
    let nested = match cfg.get("rope_parameters") {
        Some(Json::Object(p)) => get_f64(p, KEY)?,
        _ => None,
    };
    let Some(f) = get_f64(cfg, KEY)?.or(nested).filter(|&f| f != 1.0) else {
        return Ok(head_dim);
    };
    if !matches!(family, Family::Glm4Moe | Family::Qwen3Next) {
        return Err(ConvertError::UnsupportedFeature(format!("{KEY} {f}")));
    }
    let dims = f * head_dim as f64;
    if !(dims >= 2.0
        && dims <= head_dim as f64
        && dims.fract() == 0.0
        && (dims as usize).is_multiple_of(2))
    {
        return Err(bad(
            KEY,
            format!("{f} of {head_dim} values is not an even number of them"),
        ));
    }
    Ok(dims as usize)
}

/// `original_max_position_embeddings` of a scaled rope: in its parameters, else at the top
/// level of `cfg`; at least 2 positions.
fn original_ctx(cfg: &Map<String, Json>, params: &Map<String, Json>) -> Result<u64, ConvertError> {
    const KEY: &str = "original_max_position_embeddings";
    let n = match get_usize(params, KEY)? {
        Some(n) => n,
        None => need_usize(cfg, KEY)?,
    };
    if n < 2 {
        return Err(bad(KEY, "must be at least 2"));
    }
    Ok(n as u64)
}

/// YaRN's parameters from `params` (named `key`), the original context there or at the top
/// level of `cfg`. DeepSeek's `mscale` / `mscale_all_dim` are read for DeepSeek only, and
/// only equal: transformers scales the rope values by their ratio, which no reader does.
fn yarn(
    cfg: &Map<String, Json>,
    family: Family,
    key: &str,
    params: &Map<String, Json>,
) -> Result<Yarn, ConvertError> {
    let (mscale, all_dim) = (
        get_f64(params, "mscale")?.unwrap_or(0.0),
        get_f64(params, "mscale_all_dim")?.unwrap_or(0.0),
    );
    let log_multiplier = if family.deepseek() {
        if mscale != all_dim {
            return Err(ConvertError::UnsupportedFeature(format!(
                "{key}.mscale {mscale} other than mscale_all_dim {all_dim}"
            )));
        }
        (all_dim != 0.0).then_some(0.1 * all_dim)
    } else {
        for (k, m) in [("mscale", mscale), ("mscale_all_dim", all_dim)] {
            if m != 0.0 {
                return Err(ConvertError::UnsupportedFeature(format!(
                    "{key}.{k} (YaRN as DeepSeek scales it) outside DeepSeek"
                )));
            }
        }
        None
    };
    let num = |k: &str, default: f64| -> Result<f64, ConvertError> {
        match get_f64(params, k)? {
            None => Ok(default),
            Some(v) if v.is_finite() && v > 0.0 => Ok(v),
            Some(v) => Err(bad(&format!("{key}.{k}"), format!("{v} is not positive"))),
        }
    };
    // transformers rounds the correction dimensions outward unless `truncate` is false;
    // the loader does so for every family but gpt-oss, whose reference never does.
    let truncate = get_bool(params, "truncate")?.unwrap_or(true);
    if truncate != (family != Family::GptOss) {
        return Err(ConvertError::UnsupportedFeature(format!(
            "{key}.truncate {truncate} for this family"
        )));
    }
    let factor = num("factor", 0.0)?;
    if factor <= 0.0 {
        return Err(bad(&format!("{key}.factor"), "YaRN needs a factor > 0"));
    }
    let original_ctx = original_ctx(cfg, params)?;
    let attn_factor = match get_f64(params, "attention_factor")? {
        None => None,
        Some(_) => Some(num("attention_factor", 1.0)?),
    };
    Ok(Yarn {
        factor,
        original_ctx,
        beta_fast: num("beta_fast", 32.0)?,
        beta_slow: num("beta_slow", 1.0)?,
        attn_factor,
        log_multiplier,
    })
}

/// LongRoPE's parameters from `params` (the `rope_scaling` / `rope_parameters` object named
/// `key`), with the original context there or at the top level of `cfg`.
fn long_rope(
    cfg: &Map<String, Json>,
    key: &str,
    params: &Map<String, Json>,
    head_dim: usize,
    ctx: u64,
) -> Result<LongRope, ConvertError> {
    let list = |name: &str| -> Result<Vec<f32>, ConvertError> {
        let field = format!("{key}.{name}");
        let values = params
            .get(name)
            .and_then(Json::as_array)
            .ok_or_else(|| bad(&field, "missing: LongRoPE needs both factor lists"))?;
        let f: Option<Vec<f32>> = values
            .iter()
            .map(|v| {
                v.as_f64()
                    .filter(|x| x.is_finite() && *x > 0.0)
                    .map(|x| x as f32)
            })
            .collect();
        match f {
            Some(f) if f.len() == head_dim / 2 => Ok(f),
            _ => Err(bad(
                &field,
                format!(
                    "expected {} positive numbers (one per rotated pair)",
                    head_dim / 2
                ),
            )),
        }
    };
    let original_ctx = original_ctx(cfg, params)?;
    let attn_factor = match get_f64(params, "attention_factor")? {
        Some(f) if f.is_finite() && f > 0.0 => f,
        Some(f) => {
            return Err(bad(
                &format!("{key}.attention_factor"),
                format!("{f} is not positive"),
            ));
        }
        None if ctx > original_ctx => {
            let s = ctx as f64 / original_ctx as f64;
            (1.0 + s.ln() / (original_ctx as f64).ln()).sqrt()
        }
        None => 1.0,
    };
    Ok(LongRope {
        short: list("short_factor")?,
        long: list("long_factor")?,
        original_ctx,
        attn_factor,
    })
}

/// Gemma 3's local rope base: GGUF has no key for it, so readers hard-code it.
const GEMMA3_LOCAL_ROPE_BASE: f64 = 10_000.0;

/// The rope parameters of Gemma 3's global layers: transformers 5 nests them per layer type
/// (`rope_parameters.full_attention`), older configs are flat with `rope_local_base_freq`.
/// The sliding layers' rope must be the plain 10 000 base every reader assumes.
fn gemma3_global_rope<'c>(
    cfg: &'c Map<String, Json>,
    key: &'static str,
    params: &'c Map<String, Json>,
) -> Result<(&'static str, &'c Map<String, Json>), ConvertError> {
    let local = match params.get("sliding_attention") {
        Some(Json::Object(p)) => {
            let kind = p
                .get("rope_type")
                .and_then(Json::as_str)
                .unwrap_or("default");
            if kind != "default" {
                return Err(ConvertError::UnsupportedFeature(format!(
                    "{key}.sliding_attention type {kind:?} (only default)"
                )));
            }
            get_f64(p, "rope_theta")?
        }
        _ => get_f64(cfg, "rope_local_base_freq")?,
    };
    if let Some(b) = local
        && b != GEMMA3_LOCAL_ROPE_BASE
    {
        return Err(ConvertError::UnsupportedFeature(format!(
            "a local rope base of {b} (readers assume {GEMMA3_LOCAL_ROPE_BASE})"
        )));
    }
    match params.get("full_attention") {
        Some(Json::Object(p)) => Ok(("rope_parameters.full_attention", p)),
        Some(_) => Err(bad(&format!("{key}.full_attention"), "expected an object")),
        None => Ok((key, params)),
    }
}

fn experts(cfg: &Map<String, Json>, family: Family) -> Result<Option<Experts>, ConvertError> {
    match family {
        Family::GptOss => Ok(Some(Experts {
            count: need_usize(cfg, "num_local_experts")?,
            used: need_usize(cfg, "num_experts_per_tok")?,
            // Its `intermediate_size` is one expert's width, as llama.cpp writes it.
            ff: Some(need_usize(cfg, "intermediate_size")?),
            ..Experts::SOFTMAX
        })),
        Family::Mixtral => Ok(Some(Experts {
            count: need_usize(cfg, "num_local_experts")?,
            used: need_usize(cfg, "num_experts_per_tok")?,
            ff: None,
            norm_topk: None,
            ..Experts::SOFTMAX
        })),
        Family::DeepseekV2 | Family::DeepseekV3 => {
            // V3 always routes by `noaux_tc`; V2's default is plain softmax top-k.
            let method = cfg.get("topk_method").and_then(Json::as_str);
            let method = method.unwrap_or(if family == Family::DeepseekV3 {
                "noaux_tc"
            } else {
                "greedy"
            });
            if method == "noaux_tc" {
                return sigmoid_experts(cfg).and_then(checked_experts);
            }
            if method != "greedy" {
                return Err(ConvertError::UnsupportedFeature(format!(
                    "topk_method {method:?} (greedy and noaux_tc only)"
                )));
            }
            if cfg
                .get("scoring_func")
                .and_then(Json::as_str)
                .is_some_and(|f| f != "softmax")
            {
                return Err(ConvertError::UnsupportedFeature(
                    "greedy routing with scores other than softmax".into(),
                ));
            }
            routed_experts(cfg, false).map(Some)
        }
        Family::Glm4Moe => {
            let method = cfg.get("topk_method").and_then(Json::as_str);
            if method.is_some_and(|m| m != "noaux_tc") {
                return Err(ConvertError::UnsupportedFeature(
                    "topk_method other than noaux_tc (sigmoid scores, selection bias)".into(),
                ));
            }
            sigmoid_experts(cfg)
        }
        Family::Qwen3Moe | Family::Qwen3Next => {
            if get_usize(cfg, "decoder_sparse_step")?.unwrap_or(1) != 1 {
                return Err(ConvertError::UnsupportedFeature(
                    "decoder_sparse_step other than 1 (dense layers between MoE layers)".into(),
                ));
            }
            if cfg
                .get("mlp_only_layers")
                .and_then(Json::as_array)
                .is_some_and(|a| !a.is_empty())
            {
                return Err(ConvertError::UnsupportedFeature(
                    "mlp_only_layers (dense layers in a MoE model)".into(),
                ));
            }
            // transformers 5 renamed `num_experts` to `num_local_experts`; accept both.
            let count = match get_usize(cfg, "num_experts")? {
                Some(n) if n > 0 => n,
                _ => need_usize(cfg, "num_local_experts")?,
            };
            let shared_ff = match family {
                Family::Qwen3Next => Some(need_usize(cfg, "shared_expert_intermediate_size")?),
                _ => None,
            };
            Ok(Some(Experts {
                count,
                used: need_usize(cfg, "num_experts_per_tok")?,
                ff: Some(need_usize(cfg, "moe_intermediate_size")?),
                norm_topk: Some(get_bool(cfg, "norm_topk_prob")?.unwrap_or(false)),
                shared: usize::from(shared_ff.is_some()),
                shared_ff,
                ..Experts::SOFTMAX
            }))
        }
        _ => Ok(None),
    }
    .and_then(checked_experts)
}

/// Refuses expert settings that choose no experts, or more than there are.
fn checked_experts(e: Option<Experts>) -> Result<Option<Experts>, ConvertError> {
    match e {
        Some(e) if e.used == 0 || e.used > e.count => Err(bad(
            "num_experts_per_tok",
            "must be between 1 and the expert count",
        )),
        other => Ok(other),
    }
}

/// `noaux_tc` routing (GLM-4.5, DeepSeek V3): sigmoid scores with a selection bias,
/// optionally group-limited, the chosen weights renormalised and scaled.
fn sigmoid_experts(cfg: &Map<String, Json>) -> Result<Option<Experts>, ConvertError> {
    let groups = match get_usize(cfg, "n_group")?.unwrap_or(1) {
        0 => return Err(bad("n_group", "must be positive")),
        1 => None,
        n => Some((n, need_usize(cfg, "topk_group")?)),
    };
    Ok(Some(Experts {
        groups,
        ..routed_experts(cfg, true)?
    }))
}

/// The routed and shared experts of the DeepSeek-style configs (GLM-4.5, DeepSeek V2/V3):
/// softmax or `sigmoid` scores, the weights renormalised when `norm_topk_prob` says so
/// (transformers' default: with sigmoid scores only) and scaled by
/// `routed_scaling_factor`; no groups.
fn routed_experts(cfg: &Map<String, Json>, sigmoid: bool) -> Result<Experts, ConvertError> {
    let scale = get_f64(cfg, "routed_scaling_factor")?.unwrap_or(1.0);
    if !(scale.is_finite() && scale > 0.0) {
        return Err(bad("routed_scaling_factor", "must be a finite number > 0"));
    }
    Ok(Experts {
        count: need_usize(cfg, "n_routed_experts")?,
        used: need_usize(cfg, "num_experts_per_tok")?,
        ff: Some(need_usize(cfg, "moe_intermediate_size")?),
        norm_topk: Some(get_bool(cfg, "norm_topk_prob")?.unwrap_or(sigmoid)),
        shared: get_usize(cfg, "n_shared_experts")?.unwrap_or(0),
        shared_ff: None,
        leading_dense: get_usize(cfg, "first_k_dense_replace")?.unwrap_or(0),
        sigmoid,
        scale: Some(scale),
        groups: None,
    })
}

/// The layers `layer_types` marks `sliding_attention`, when the config has the list.
fn sliding_layers(
    cfg: &Map<String, Json>,
    n_layer: usize,
) -> Result<Option<Vec<bool>>, ConvertError> {
    match cfg.get("layer_types").and_then(Json::as_array) {
        Some(types) if types.len() == n_layer => Ok(Some(
            types
                .iter()
                .map(|t| t.as_str() == Some("sliding_attention"))
                .collect(),
        )),
        Some(_) => Err(bad("layer_types", "length differs from num_hidden_layers")),
        None => Ok(None),
    }
}

/// Mistral and Mixtral slide on every layer when `sliding_window` is set; Qwen only with
/// `use_sliding_window`, on the layers `layer_types` marks (else from `max_window_layers`
/// on), as transformers decides.
fn sliding_window(
    cfg: &Map<String, Json>,
    family: Family,
    n_layer: usize,
) -> Result<Option<SlidingWindow>, ConvertError> {
    let window = get_usize(cfg, "sliding_window")?;
    let layers = match family {
        Family::Llama
        | Family::Glm4Moe
        | Family::DeepseekV2
        | Family::DeepseekV3
        | Family::Qwen3Next => {
            return Ok(None);
        }
        Family::NemotronH if window.is_some() => {
            return Err(ConvertError::UnsupportedFeature(
                "sliding_window on Nemotron-H".into(),
            ));
        }
        Family::NemotronH => return Ok(None),
        Family::Gemma2 | Family::Gemma3 | Family::GptOss => {
            if window.is_none() {
                return Err(bad(
                    "sliding_window",
                    "missing (this family slides on most layers)",
                ));
            }
            match sliding_layers(cfg, n_layer)? {
                Some(layers) => layers,
                // transformers' defaults: Gemma 2 and gpt-oss alternate, Gemma 3 has one
                // global layer in every `sliding_window_pattern` (6).
                None => {
                    let every = match family {
                        Family::Gemma2 | Family::GptOss => 2,
                        _ => get_usize(cfg, "sliding_window_pattern")?
                            .unwrap_or(6)
                            .max(1),
                    };
                    (0..n_layer).map(|i| (i + 1) % every != 0).collect()
                }
            }
        }
        Family::Mistral | Family::Mixtral | Family::Phi3 => vec![true; n_layer],
        Family::Qwen2 | Family::Qwen3 | Family::Qwen3Moe => {
            if !get_bool(cfg, "use_sliding_window")?.unwrap_or(false) {
                return Ok(None);
            }
            match sliding_layers(cfg, n_layer)? {
                Some(layers) => layers,
                None => {
                    let from = get_usize(cfg, "max_window_layers")?.unwrap_or(n_layer);
                    (0..n_layer).map(|i| i >= from).collect()
                }
            }
        }
    };
    Ok(match window {
        Some(w) if w > 0 && layers.iter().any(|&l| l) => Some(SlidingWindow { window: w, layers }),
        _ => None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(extra: &str) -> Result<HfConfig, ConvertError> {
        HfConfig::from_json(&format!(
            r#"{{"architectures":["LlamaForCausalLM"],"num_hidden_layers":2,"hidden_size":64,
            "intermediate_size":128,"num_attention_heads":4,"num_key_value_heads":2,
            "vocab_size":100{extra}}}"#
        ))
    }

    #[test]
    fn llama_defaults_and_keys() {
        let c = cfg("").unwrap();
        assert_eq!((c.head_dim, c.rope_theta, c.ctx), (16, 1e4, 2048));
        let m = c.metadata();
        let keys: Vec<&str> = m.iter().map(|(k, _)| k.as_str()).collect();
        assert!(keys.contains(&"llama.rope.dimension_count"));
        assert!(!keys.contains(&"llama.attention.key_length"));
    }

    #[test]
    fn unknown_architecture_and_rope_type_are_named() {
        let e = HfConfig::from_json(r#"{"architectures":["GPTNeoXForCausalLM"]}"#).unwrap_err();
        assert!(e.to_string().contains("GPTNeoXForCausalLM"), "{e}");
        let e = cfg(r#","rope_scaling":{"type":"dynamic","factor":4.0}"#).unwrap_err();
        assert!(e.to_string().contains("\"dynamic\""), "{e}");
        let e = cfg(r#","hidden_act":"gelu""#).unwrap_err();
        assert!(e.to_string().contains("gelu"), "{e}");
    }

    fn gemma(class: &str, extra: &str) -> Result<HfConfig, ConvertError> {
        HfConfig::from_json(&format!(
            r#"{{"architectures":["{class}"],"num_hidden_layers":4,"hidden_size":64,
            "intermediate_size":128,"num_attention_heads":4,"num_key_value_heads":2,
            "head_dim":16,"vocab_size":100,"sliding_window":8,
            "hidden_activation":"gelu_pytorch_tanh"{extra}}}"#
        ))
    }

    fn value<'m>(m: &'m [(String, Value)], key: &str) -> Option<&'m Value> {
        m.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    #[test]
    fn gemma_families_write_caps_scaling_and_layer_pattern() {
        let g2 = gemma(
            "Gemma2ForCausalLM",
            r#","attn_logit_softcapping":50.0,"final_logit_softcapping":30.0"#,
        )
        .unwrap();
        assert!(g2.tie_embeddings, "Gemma ties its output by default");
        let m = g2.metadata();
        assert_eq!(
            value(&m, "gemma2.attn_logit_softcapping"),
            Some(&Value::F32(50.0))
        );
        assert_eq!(
            value(&m, "gemma2.final_logit_softcapping"),
            Some(&Value::F32(30.0))
        );
        // transformers' rule without layer_types: Gemma 2 alternates, sliding first.
        let pattern = Value::Array(Array::Bool(vec![true, false, true, false]));
        assert_eq!(
            value(&m, "gemma2.attention.sliding_window_pattern"),
            Some(&pattern)
        );
        // transformers 5's nested rope of Gemma 3: the global layers' scaling is written.
        let g3 = gemma(
            "Gemma3ForCausalLM",
            r#","layer_types":["sliding_attention","full_attention","sliding_attention",
            "full_attention"],"rope_parameters":{"full_attention":{"rope_type":"linear",
            "factor":8.0,"rope_theta":1000000.0},"sliding_attention":{"rope_type":"default",
            "rope_theta":10000.0}}"#,
        )
        .unwrap();
        assert_eq!((g3.rope_theta, g3.linear_rope), (1e6, Some(8.0)));
        let m = g3.metadata();
        assert_eq!(
            value(&m, "gemma3.rope.scaling.type"),
            Some(&Value::String("linear".into()))
        );
        assert_eq!(
            value(&m, "gemma3.rope.scaling.factor"),
            Some(&Value::F32(8.0))
        );
        assert_eq!(value(&m, "gemma3.attn_logit_softcapping"), None);
        // What no reader can express is refused by name.
        for (class, extra, named) in [
            (
                "Gemma3ForCausalLM",
                r#","rope_local_base_freq":20000.0"#,
                "local rope base",
            ),
            (
                "Gemma3ForCausalLM",
                r#","query_pre_attn_scalar":168"#,
                "query_pre_attn_scalar",
            ),
            (
                "Gemma3ForCausalLM",
                r#","final_logit_softcapping":30.0"#,
                "final_logit_softcapping",
            ),
            (
                "Gemma2ForCausalLM",
                r#","hidden_activation":"silu""#,
                "hidden_activation",
            ),
        ] {
            let e = gemma(class, extra).unwrap_err();
            assert!(e.to_string().contains(named), "{class} {extra}: {e}");
        }
    }

    #[test]
    fn llama3_rope_factors_follow_the_published_formula() {
        // Independent f64 evaluation of the Llama 3 formula for one head of 16.
        let c = cfg(
            r#","rope_theta":500000.0,"rope_scaling":{"rope_type":"llama3","factor":8.0,
            "low_freq_factor":1.0,"high_freq_factor":4.0,"original_max_position_embeddings":64}"#,
        )
        .unwrap();
        let got = c.rope_freqs().unwrap();
        assert_eq!(got.len(), 8);
        for (i, g) in got.iter().enumerate() {
            let freq = 500000f64.powf(-(2.0 * i as f64) / 16.0);
            let wl = 2.0 * std::f64::consts::PI / freq;
            let want = if wl < 16.0 {
                1.0
            } else if wl > 64.0 {
                8.0
            } else {
                let s = (64.0 / wl - 1.0) / 3.0;
                1.0 / ((1.0 - s) / 8.0 + s)
            };
            assert!(
                (f64::from(*g) - want).abs() < 1e-4 * want,
                "{i}: {g} vs {want}"
            );
        }
        assert!(got.contains(&1.0) && got.contains(&8.0), "{got:?}");
    }

    #[test]
    fn qwen_sliding_window_only_when_enabled() {
        let q = |extra: &str| {
            HfConfig::from_json(&format!(
                r#"{{"architectures":["Qwen2ForCausalLM"],"num_hidden_layers":4,"hidden_size":64,
                "intermediate_size":128,"num_attention_heads":4,"vocab_size":100,
                "sliding_window":32,"max_window_layers":2{extra}}}"#
            ))
            .unwrap()
        };
        assert_eq!(q("").sliding_window, None);
        let sw = q(r#","use_sliding_window":true"#).sliding_window.unwrap();
        assert_eq!(sw.layers, [false, false, true, true]);
    }

    #[test]
    fn gpt_oss_keys_and_refusals() {
        let oss = |extra: &str| {
            HfConfig::from_json(&format!(
                r#"{{"architectures":["GptOssForCausalLM"],"num_hidden_layers":3,"hidden_size":64,
                "intermediate_size":32,"num_attention_heads":4,"num_key_value_heads":2,
                "head_dim":16,"vocab_size":100,"num_local_experts":4,"num_experts_per_tok":2,
                "sliding_window":8{extra}}}"#
            ))
        };
        let yarn = r#","rope_parameters":{"rope_type":"yarn","factor":32.0,
            "original_max_position_embeddings":4096,"rope_theta":150000.0,"truncate":false}"#;
        let c = oss(yarn).unwrap();
        assert_eq!(c.family.gguf_arch(), "gpt-oss");
        assert_eq!(c.sliding_window.unwrap().layers, [true, false, true]);
        assert_eq!(c.experts.unwrap().ff, Some(32));
        assert_eq!(c.yarn.unwrap().factor, 32.0);
        // transformers rounds the correction dimensions unless told not to; the loader
        // never rounds them for gpt-oss, so a config asking for it is refused.
        let e = oss(&yarn.replace("false", "true")).unwrap_err();
        assert!(e.to_string().contains("truncate"), "{e}");
        let e = oss(&format!("{yarn},\"swiglu_limit\":10.0")).unwrap_err();
        assert!(e.to_string().contains("swiglu_limit"), "{e}");
        // Every other family rounds: `truncate = false` there is refused.
        let e = cfg(r#","rope_scaling":{"rope_type":"yarn","factor":4.0,
            "original_max_position_embeddings":32,"truncate":false}"#)
        .unwrap_err();
        assert!(e.to_string().contains("truncate"), "{e}");
    }
}
