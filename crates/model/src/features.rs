//! Architecture features beyond the dense llama/gemma3 block, read from GGUF metadata with
//! the keys and tensors llama.cpp's converter writes:
//!
//! - mixture of experts: `{arch}.expert_count`, `{arch}.expert_used_count`,
//!   `{arch}.expert_feed_forward_length` (qwen3moe; mixtral stores the expert width in
//!   `{arch}.feed_forward_length`), optional `{arch}.expert_weights_norm` (whether the
//!   selected experts' weights are renormalised to sum 1: Hugging Face's `norm_topk_prob`;
//!   absent means true, as llama.cpp hard-codes for mixtral and qwen3moe);
//!   `{arch}.expert_gating_func` (1 softmax, the default; 2 sigmoid),
//!   `{arch}.expert_weights_scale` (a multiplier of the weights, 1 when absent),
//!   `{arch}.expert_group_count` / `expert_group_used_count` (group-limited choice),
//!   the `exp_probs_b.bias` selection bias when the file has it, shared experts
//!   (`{arch}.expert_shared_count`, of `expert_shared_feed_forward_length`, else
//!   `count × expert_feed_forward_length`, wide) and `{arch}.leading_dense_block_count`
//!   dense layers first (of `feed_forward_length`);
//! - Llama 3 rope scaling: the `rope_freqs.weight` tensor (`head_dim / 2` divisors of the
//!   rope frequencies, computed by the converter from `rope_scaling`); linear rope scaling:
//!   `{arch}.rope.scaling.type = linear` with `{arch}.rope.scaling.factor`, the same divisor
//!   for every pair; YaRN (`= yarn`): divisors from the factor, the original context and
//!   the beta corrections, and an attention factor;
//! - sliding window (Mistral, Qwen with `use_sliding_window`): `{arch}.attention.sliding_window`,
//!   on every layer or, with the bool array `{arch}.attention.sliding_window_pattern`, on the
//!   layers marked true.
//!
//! Features ferrite does not implement (other rope scaling types, other gating functions,
//! soft-capping outside Gemma 2, ...) are refused with [`ModelError::Unsupported`] naming the key,
//! rather than silently producing wrong logits.

use ferrite_arch::{Arch, GlobalTensor, Key, TensorRole};
use ferrite_backend::{Gating, RouteRule};
use ferrite_gguf::{Array, Gguf, Value};

use crate::ModelError;

/// Mixture-of-experts settings: expert FFNs on every layer past the leading dense ones.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MoeConfig {
    /// Experts per layer.
    pub n_expert: usize,
    /// Experts each token uses (top-k).
    pub n_expert_used: usize,
    /// How a token chooses and weighs its experts.
    pub rule: RouteRule,
    /// The router adds a per-expert bias (`exp_probs_b.bias`) to the scores to choose.
    pub selection_bias: bool,
    /// Leading layers whose FFN is dense, of [`MoeConfig::dense_ff`] width.
    pub leading_dense: usize,
    /// Width of the leading dense FFNs (0 without them).
    pub dense_ff: usize,
    /// Width of the shared expert every expert layer runs beside the routed ones; 0 for none.
    pub shared_ff: usize,
}

impl MoeConfig {
    /// Whether layer `l` is an expert layer.
    pub fn is_expert_layer(&self, l: usize) -> bool {
        l >= self.leading_dense
    }
}

fn unsupported(key: &str, what: &str) -> ModelError {
    ModelError::Unsupported {
        key: key.to_owned(),
        what: what.to_owned(),
    }
}

fn count(g: &Gguf, key: &str) -> Result<Option<usize>, ModelError> {
    match g.get(key) {
        None => Ok(None),
        Some(_) => {
            let v = g.get_u32(key)?;
            usize::try_from(v)
                .map(Some)
                .map_err(|_| ModelError::BadMetadata {
                    key: key.to_owned(),
                    reason: "does not fit in usize".into(),
                })
        }
    }
}

/// The MoE settings of architecture `a` (`None` for a dense model) and the FFN width the
/// forward pass uses (the expert width for MoE models, `dense_ff` otherwise).
pub(crate) fn moe(
    g: &Gguf,
    a: &str,
    required: bool,
    dense_ff: Option<usize>,
) -> Result<(Option<MoeConfig>, Option<usize>), ModelError> {
    let k = |key: Key| key.of(a);
    let n_expert = count(g, &k(Key::ExpertCount))?.filter(|&n| n > 0);
    let Some(n_expert) = n_expert else {
        if required {
            return Err(ModelError::BadMetadata {
                key: k(Key::ExpertCount),
                reason: "missing: this architecture is a mixture of experts".into(),
            });
        }
        return Ok((None, dense_ff));
    };
    let used_key = k(Key::ExpertUsedCount);
    let n_expert_used = count(g, &used_key)?.ok_or_else(|| ModelError::BadMetadata {
        key: used_key.clone(),
        reason: "missing".into(),
    })?;
    if n_expert_used == 0 || n_expert_used > n_expert {
        return Err(ModelError::BadMetadata {
            key: used_key,
            reason: format!("must be in 1..={n_expert}"),
        });
    }
    let norm_key = k(Key::ExpertWeightsNorm);
    let norm_topk = match g.get(&norm_key) {
        None => true,
        Some(_) => g.get_bool(&norm_key)?,
    };
    let gating_key = k(Key::ExpertGatingFunc);
    // llama.cpp's enum: 1 softmax, 2 sigmoid, 3 softmax over the chosen logits (gpt-oss),
    // which is softmax renormalised over the chosen experts.
    let softmax_of_chosen = g.get(&gating_key).and_then(Value::as_integer) == Some(3);
    let norm_topk = norm_topk || softmax_of_chosen;
    let gating = match g.get(&gating_key).map(Value::as_integer) {
        None | Some(Some(1 | 3)) => Gating::Softmax,
        Some(Some(2)) => Gating::Sigmoid,
        Some(_) => {
            return Err(unsupported(
                &gating_key,
                "expert gating other than softmax or sigmoid",
            ));
        }
    };
    let scale = positive_f32(g, &k(Key::ExpertWeightsScale), Some(1.0))?;
    let groups = match count(g, &k(Key::ExpertGroupCount))? {
        None | Some(0 | 1) => None,
        Some(n) => {
            let kept_key = k(Key::ExpertGroupUsedCount);
            let kept = count(g, &kept_key)?.ok_or_else(|| ModelError::BadMetadata {
                key: kept_key,
                reason: "missing: expert groups need the count each token keeps".into(),
            })?;
            Some((n, kept))
        }
    };
    let rule = RouteRule {
        gating,
        norm_topk,
        scale,
        groups,
    };
    rule.check(n_expert, n_expert_used)
        .map_err(|reason| ModelError::BadMetadata {
            key: k(Key::ExpertGroupCount),
            reason,
        })?;
    let ff = count(g, &k(Key::ExpertFeedForwardLength))?.or(dense_ff);
    let dense_key = k(Key::LeadingDenseBlockCount);
    let leading_dense = count(g, &dense_key)?.unwrap_or(0);
    let dense_width = if leading_dense > 0 {
        dense_ff
            .filter(|&w| w > 0)
            .ok_or_else(|| ModelError::BadMetadata {
                key: k(Key::FeedForwardLength),
                reason: format!("missing: {dense_key} = {leading_dense} needs the dense FFN width"),
            })?
    } else {
        0
    };
    let shared = count(g, &k(Key::ExpertSharedCount))?.unwrap_or(0);
    let shared_ff = match count(g, &k(Key::ExpertSharedFeedForwardLength))? {
        Some(w) if shared > 0 => w,
        _ => shared * ff.unwrap_or(0),
    };
    let selection_bias = g
        .tensor(&TensorRole::ExpProbsB.bias(leading_dense))
        .is_some();
    Ok((
        Some(MoeConfig {
            n_expert,
            n_expert_used,
            rule,
            selection_bias,
            leading_dense,
            dense_ff: dense_width,
            shared_ff,
        }),
        ff,
    ))
}

/// The rope frequency divisors of `arch`'s file: linear scaling's factor for every pair,
/// or Llama 3's `rope_freqs.weight`; `None` for plain rope. A file asking for both is
/// refused (no model combines them).
pub(crate) fn rope_factors(
    g: &Gguf,
    arch: Arch,
    head_dim: usize,
    base: f32,
) -> Result<Option<Vec<f32>>, ModelError> {
    const NAME: &str = GlobalTensor::RopeFreqs.name();
    let kind = scaling(g, arch);
    if matches!(kind, Some("yarn" | "linear")) && g.tensor(NAME).is_some() {
        return Err(unsupported(
            &arch.key(Key::RopeScalingType),
            "rope scaling together with rope_freqs.weight",
        ));
    }
    if kind == Some("yarn") {
        return yarn_divisors(g, arch, head_dim, base).map(Some);
    }
    if kind == Some("linear") {
        let factor = positive_f32(g, &arch.key(Key::RopeScalingFactor), None)?;
        return Ok((factor != 1.0).then(|| vec![factor; head_dim / 2]));
    }
    if g.tensor(GlobalTensor::RopeFactorsLong.name()).is_some() {
        return divisors(g, GlobalTensor::RopeFactorsShort, head_dim).map(Some);
    }
    if g.tensor(NAME).is_none() {
        return Ok(None);
    }
    divisors(g, GlobalTensor::RopeFreqs, head_dim).map(Some)
}

/// `{arch}.rope.scaling.type`, when the file has it as a string.
fn scaling(g: &Gguf, arch: Arch) -> Option<&str> {
    g.get(&arch.key(Key::RopeScalingType))
        .and_then(Value::as_str)
}

/// A positive finite f32 of key `key`, `default` when absent.
fn positive_f32(g: &Gguf, key: &str, default: Option<f32>) -> Result<f32, ModelError> {
    let v = match (g.get(key), default) {
        (None, Some(d)) => d,
        _ => g.get_f32(key)?,
    };
    if v.is_finite() && v > 0.0 {
        Ok(v)
    } else {
        Err(ModelError::BadMetadata {
            key: key.into(),
            reason: format!("{v} is not a finite, positive number"),
        })
    }
}

/// YaRN's per-pair divisors, as transformers' `_compute_yarn_parameters` and llama.cpp's
/// `ggml_rope_yarn_corr_dims` compute them: pairs below the fast correction dimension keep
/// their frequency (extrapolation), pairs past the slow one are divided by the factor
/// (interpolation), with a linear ramp between.
fn yarn_divisors(g: &Gguf, arch: Arch, head_dim: usize, base: f32) -> Result<Vec<f32>, ModelError> {
    let factor = f64::from(positive_f32(g, &arch.key(Key::RopeScalingFactor), None)?);
    let orig_key = arch.key(Key::RopeScalingOriginalContextLength);
    let orig = count(g, &orig_key)?.ok_or_else(|| ModelError::BadMetadata {
        key: orig_key.clone(),
        reason: "missing: YaRN needs the original context".into(),
    })? as f64;
    let fast = f64::from(positive_f32(
        g,
        &arch.key(Key::RopeScalingYarnBetaFast),
        Some(32.0),
    )?);
    let slow = f64::from(positive_f32(
        g,
        &arch.key(Key::RopeScalingYarnBetaSlow),
        Some(1.0),
    )?);
    let (dim, ln_base) = (head_dim as f64, f64::from(base).ln());
    // The dimension whose wavelength makes `rotations` turns over the original context.
    let corr = |rotations: f64| {
        dim * (orig / (rotations * 2.0 * std::f64::consts::PI)).ln() / (2.0 * ln_base)
    };
    // gpt-oss's reference (`truncate = false`) keeps the correction dimensions as they
    // are; every other model's, and llama.cpp for all, round them outward.
    let (low, high) = if arch == Arch::GptOss {
        (corr(fast), corr(slow))
    } else {
        (corr(fast).floor(), corr(slow).ceil())
    };
    let (low, high) = (low.max(0.0), high.min(dim - 1.0));
    let span = if high == low { 0.001 } else { high - low };
    Ok((0..head_dim / 2)
        .map(|i| {
            let extrapolate = 1.0 - ((i as f64 - low) / span).clamp(0.0, 1.0);
            (1.0 / ((1.0 - extrapolate) / factor + extrapolate)) as f32
        })
        .collect())
}

/// YaRN's attention factor on q and k: `rope.scaling.attn_factor`, else `1 + 0.1 ln(factor)`
/// (1 for a factor of at most 1, and without YaRN).
pub(crate) fn yarn_attn_factor(g: &Gguf, arch: Arch) -> Result<f32, ModelError> {
    if scaling(g, arch) != Some("yarn") {
        return Ok(1.0);
    }
    let key = arch.key(Key::RopeScalingAttnFactor);
    if g.get(&key).is_some() {
        return positive_f32(g, &key, None);
    }
    let factor = positive_f32(g, &arch.key(Key::RopeScalingFactor), None)?;
    Ok(if factor <= 1.0 {
        1.0
    } else {
        1.0 + 0.1 * factor.ln()
    })
}

/// LongRoPE (Phi-3): the long divisors, the switch point and the attention factor.
#[derive(Debug)]
pub(crate) struct LongRope {
    pub(crate) factors: Vec<f32>,
    pub(crate) after: usize,
    pub(crate) attn_factor: f32,
}

/// `head_dim / 2` positive divisors from tensor `t` of `g`.
fn divisors(g: &Gguf, t: GlobalTensor, head_dim: usize) -> Result<Vec<f32>, ModelError> {
    let name = t.name();
    let tensor = g
        .tensor(name)
        .ok_or_else(|| ModelError::MissingTensor(name.into()))?;
    if tensor.dims != [(head_dim / 2) as u64] {
        return Err(ModelError::TensorShape {
            name: name.into(),
            got: tensor.dims.clone(),
            expected: vec![(head_dim / 2) as u64],
        });
    }
    let f = crate::model::dequantize_tensor(g, name)?;
    if f.iter().any(|v| !v.is_finite() || *v <= 0.0) {
        return Err(ModelError::BadMetadata {
            key: name.into(),
            reason: "rope frequency factors must be finite and positive".into(),
        });
    }
    Ok(f)
}

/// LongRoPE's settings when the file has `rope_factors_long.weight` (then the short
/// factors, as [`rope_factors`] reads them, and the original context are required).
pub(crate) fn long_rope(
    g: &Gguf,
    arch: Arch,
    head_dim: usize,
    ctx_train: usize,
) -> Result<Option<LongRope>, ModelError> {
    if g.tensor(GlobalTensor::RopeFactorsLong.name()).is_none() {
        return Ok(None);
    }
    let factors = divisors(g, GlobalTensor::RopeFactorsLong, head_dim)?;
    let orig_key = arch.key(Key::RopeScalingOriginalContextLength);
    let after = count(g, &orig_key)?
        .filter(|&n| n > 1)
        .ok_or_else(|| ModelError::BadMetadata {
            key: orig_key.clone(),
            reason: "LongRoPE needs the original context (more than 1 position)".into(),
        })?;
    let key = arch.key(Key::RopeScalingAttnFactor);
    let attn_factor = match g.get(&key) {
        Some(_) => g.get_f32(&key)?,
        // transformers' LongRoPE default.
        None if ctx_train > after => {
            let s = ctx_train as f64 / after as f64;
            (1.0 + s.ln() / (after as f64).ln()).sqrt() as f32
        }
        None => 1.0,
    };
    if !(attn_factor.is_finite() && attn_factor > 0.0) {
        return Err(ModelError::BadMetadata {
            key,
            reason: format!("{attn_factor} is not a finite, positive factor"),
        });
    }
    Ok(Some(LongRope {
        factors,
        after,
        attn_factor,
    }))
}

/// Refuses metadata that asks for behaviour the forward pass of `arch` does not implement.
pub(crate) fn check_unsupported(g: &Gguf, arch: Arch) -> Result<(), ModelError> {
    let k = |key: Key| arch.key(key);
    let key = k(Key::RopeScalingType);
    if let Some(v) = g.get(&key)
        && !matches!(v.as_str(), Some("none" | "linear" | "yarn"))
    {
        return Err(unsupported(
            &key,
            &format!("rope scaling {v:?} (only linear, YaRN and Llama 3 frequency factors)"),
        ));
    }
    if matches!(arch, Arch::Gemma2 | Arch::Gemma3) && scaling(g, arch) == Some("yarn") {
        // Gemma's local layers would need their own YaRN parameters.
        return Err(unsupported(&key, "YaRN on a Gemma model"));
    }
    let mut refused = Vec::new();
    if arch != Arch::Gemma2 {
        refused.push((Key::AttnLogitSoftcapping, "attention logit soft-capping"));
        refused.push((Key::FinalLogitSoftcapping, "final logit soft-capping"));
    }
    for (s, what) in refused {
        let key = k(s);
        if let Some(v) = g.get(&key)
            && !is_neutral(v)
        {
            return Err(unsupported(&key, what));
        }
    }
    Ok(())
}

/// Per-layer sliding windows: `{arch}.attention.sliding_window` (absent: none), on every
/// layer, or on the layers whose entry of the bool array
/// `{arch}.attention.sliding_window_pattern` is true (Qwen's `layer_types`).
pub(crate) fn sliding_windows(
    g: &Gguf,
    a: &str,
    n_layer: usize,
) -> Result<Vec<Option<usize>>, ModelError> {
    let key = Key::SlidingWindow.of(a);
    let Some(w) = count(g, &key)? else {
        return Ok(vec![None; n_layer]);
    };
    if w == 0 {
        return Err(ModelError::BadMetadata {
            key,
            reason: "must be positive".into(),
        });
    }
    let pkey = Key::SlidingWindowPattern.of(a);
    match g.get(&pkey) {
        None => Ok(vec![Some(w); n_layer]),
        Some(Value::Array(Array::Bool(per_layer))) if per_layer.len() == n_layer => Ok(per_layer
            .iter()
            .map(|&windowed| windowed.then_some(w))
            .collect()),
        Some(_) => Err(unsupported(
            &pkey,
            "a window pattern that is not a bool per layer",
        )),
    }
}

/// Per-layer windows of a model whose every `every`-th layer is global (Gemma, gpt-oss):
/// the window `{arch}.attention.sliding_window` is required, on the layers the pattern
/// names when the file has one.
pub(crate) fn alternating_windows(
    g: &Gguf,
    a: &str,
    n_layer: usize,
    every: usize,
) -> Result<Vec<Option<usize>>, ModelError> {
    // A missing window is reported by name; zero is refused by `sliding_windows`.
    let window = g.get_u32(&Key::SlidingWindow.of(a))? as usize;
    if g.get(&Key::SlidingWindowPattern.of(a)).is_some() || window == 0 {
        return sliding_windows(g, a, n_layer);
    }
    Ok((0..n_layer)
        .map(|i| (i % every != every - 1).then_some(window))
        .collect())
}

/// A value that asks for nothing: zero (a disabled cap or count) or an empty array.
fn is_neutral(v: &Value) -> bool {
    match v {
        Value::Array(a) => a.is_empty(),
        _ => v.as_integer() == Some(0) || matches!(v.as_f32(), Some(x) if x == 0.0),
    }
}
