//! The per-tensor type rule: which tensors a mix quantizes and to which type.
//!
//! This is our reading of llama.cpp's named mixes (`src/llama-quant.cpp`), written down in
//! `docs/quantize.md`; the tests pin it against the tensor types of a file llama.cpp made.
//! In short:
//!
//! 1. Only weight matrices are quantized: a tensor with at least 2 dimensions whose name ends
//!    in `weight` and is not a norm (`_norm.weight`), an MoE router (`ffn_gate_inp.weight`) or
//!    one of a few small position/convolution tables. Everything else is copied unchanged.
//! 2. Float mixes (F32/F16/BF16) give every weight matrix the mix type, nothing more.
//! 3. Quantized mixes start from the mix's default type, then:
//!    - the output head (`output.weight`, or `token_embd.weight` when the model has no
//!      `output.weight`, i.e. tied embeddings) gets Q6_K, unless the mix is Q8_0 (kept) or its
//!      rows do not fit the default type's blocks (Q8_0);
//!    - in Q4_K_M and Q5_K_M, `attn_v` (and fused `attn_qkv`/`attn_kv_b`) and `ffn_down` get
//!      Q6_K in the "more bits" layers: the first and last eighth of the layers and every
//!      third layer between ([`more_bits`]);
//!    - models with exactly 8 experts get Q8_0 `attn_v`/`attn_k` (and Q5_K `attn_output` in
//!      Q4_K_M); 80-layer llama models (the 70B class) get Q5_K instead of Q4_K for `attn_v`.
//! 4. A row length that is not a whole number of the chosen type's blocks falls back:
//!    Q4_K → Q5_0, Q5_K → Q5_1, Q6_K → Q8_0, and to F16 when even 32-value blocks do not fit.

use ferrite_arch::{ARCHITECTURE_KEY, Arch, GlobalTensor, Key, Kind, NORM_SUFFIX, TensorRole};
use ferrite_gguf::{GgmlType, Gguf};

use crate::Mix;

/// What the rule needs to know about the model besides tensor names and shapes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ModelInfo {
    /// `general.architecture` (empty when unknown).
    pub arch: String,
    /// `{arch}.block_count` (0 when unknown: the highest `blk.N.` index + 1 is used).
    pub block_count: u64,
    /// `{arch}.expert_count` (0 for dense models).
    pub expert_count: u64,
}

impl ModelInfo {
    /// Reads the architecture, block count and expert count from GGUF metadata; missing keys
    /// give the defaults documented on the fields.
    pub fn from_gguf(g: &Gguf) -> ModelInfo {
        let arch = g.get_str(ARCHITECTURE_KEY).unwrap_or("").to_owned();
        let num = |key: Key| g.get_u64(&key.of(&arch)).unwrap_or(0);
        ModelInfo {
            block_count: num(Key::BlockCount),
            expert_count: num(Key::ExpertCount),
            arch,
        }
    }
}

/// Why a tensor got its type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Reason {
    /// Not a weight matrix (norm, bias, router, 1-D): copied unchanged.
    Kept,
    /// The mix's default type.
    MixDefault,
    /// The output head (or tied token embedding) rule.
    OutputHead,
    /// A "more bits" layer of a `_M` mix.
    MoreBits,
    /// The 8-expert promotion.
    ManyExperts,
    /// The 70B-class `attn_v` promotion.
    LargeModel,
}

/// The rule's decision for one tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Choice {
    /// Output type; `None` means the tensor is written unchanged in its input type.
    pub ty: Option<GgmlType>,
    /// Why.
    pub reason: Reason,
    /// The type the rule wanted before the block-size fallback replaced it.
    pub fallback_from: Option<GgmlType>,
}

/// Broad tensor roles the rule distinguishes (by name, across architectures).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Category {
    Output,
    TokenEmbd,
    AttnV,
    AttnK,
    AttnOutput,
    FfnDown,
    Other,
}

/// Name fragments of llama.cpp's other architectures (not in ferrite's architecture table)
/// that its rule treats like these roles: fused QKV and MLA's `kv_b` like `attn_v`, Gemma 3n's
/// per-layer embedding like `token_embd`.
const FOREIGN_ATTN_V: [&str; 2] = ["attn_qkv.weight", "attn_kv_b.weight"];
const FOREIGN_TOKEN_EMBD: &str = "per_layer_token_embd.weight";

/// `role`'s weight, as a fragment of any layer's (or architecture's) name.
fn weight_fragment(role: TensorRole) -> String {
    format!("{}.{}", role.stem(), Kind::Weight.suffix())
}

fn category(name: &str) -> Category {
    // Fragments rather than parsed names: the rule applies to every architecture's files,
    // whose names may carry prefixes of their own (llama.cpp matches them the same way).
    if name == GlobalTensor::Output.name() {
        Category::Output
    } else if name == GlobalTensor::TokenEmbd.name() || name == FOREIGN_TOKEN_EMBD {
        Category::TokenEmbd
    } else if name.contains(&weight_fragment(TensorRole::AttnV))
        || FOREIGN_ATTN_V.iter().any(|s| name.contains(s))
    {
        Category::AttnV
    } else if name.contains(&weight_fragment(TensorRole::AttnK)) {
        Category::AttnK
    } else if name.contains(&weight_fragment(TensorRole::AttnOutput)) {
        Category::AttnOutput
    } else if name.contains(TensorRole::FfnDown.stem()) {
        Category::FfnDown
    } else {
        Category::Other
    }
}

/// Name fragments of llama.cpp's other architectures' weight tensors that stay unquantized
/// (besides norms and the MoE router): position and token-type tables, and small
/// convolution/bias tables that are cheap to keep exact.
const FOREIGN_KEEP_FRAGMENTS: [&str; 8] = [
    "position_embd",
    "pos_embd",
    "token_types",
    "ssm_conv1d",
    "attn_rel_b.weight",
    "altup",
    "laurel",
    "per_layer_model_proj",
];

/// Whether a tensor is a weight matrix the mixes quantize (rule 1 of the module doc).
pub fn is_quantizable(name: &str, dims: &[u64]) -> bool {
    dims.len() >= 2
        && name.ends_with(Kind::Weight.suffix())
        && !name.contains(NORM_SUFFIX)
        && !name.contains(&weight_fragment(TensorRole::FfnGateInp))
        && !FOREIGN_KEEP_FRAGMENTS.iter().any(|f| name.contains(f))
}

/// llama.cpp's "more bits" layers: the first and last eighth of `n` layers and every third
/// layer between them.
pub fn more_bits(layer: u64, n: u64) -> bool {
    layer < n / 8 || layer >= 7 * n / 8 || (layer - n / 8) % 3 == 2
}

/// The `N` of a `blk.N.` name.
fn layer_of(name: &str) -> Option<u64> {
    ferrite_arch::layer_of(name).map(|l| l as u64)
}

/// Replaces `ty` by a type whose blocks divide rows of `cols` values (rule 4).
fn fit(ty: GgmlType, cols: u64) -> (GgmlType, Option<GgmlType>) {
    if cols.is_multiple_of(ty.block_size()) {
        return (ty, None);
    }
    let alt = match ty {
        GgmlType::Q4_K => GgmlType::Q5_0,
        GgmlType::Q5_K => GgmlType::Q5_1,
        GgmlType::Q6_K => GgmlType::Q8_0,
        other => other,
    };
    let alt = if cols.is_multiple_of(alt.block_size()) {
        alt
    } else {
        GgmlType::F16
    };
    (alt, Some(ty))
}

/// The type of every tensor of a model under `mix`; `tensors` are (name, GGUF dims) in any
/// order, and the result is in the same order. The rule needs the whole list: whether the
/// embedding is tied and the ordinal of each `attn_v` depend on the other tensors.
pub fn choose_types(mix: Mix, model: &ModelInfo, tensors: &[(&str, &[u64])]) -> Vec<Choice> {
    let tied = !tensors
        .iter()
        .any(|(n, _)| *n == GlobalTensor::Output.name());
    let n_layer = if model.block_count > 0 {
        model.block_count
    } else {
        tensors
            .iter()
            .filter_map(|(n, _)| layer_of(n))
            .max()
            .map_or(0, |l| l + 1)
    };
    // attn_v tensors are numbered in (layer, name) order, as llama.cpp visits them.
    let mut attn_v: Vec<(u64, &str)> = tensors
        .iter()
        .filter(|(n, _)| category(n) == Category::AttnV)
        .map(|(n, _)| (layer_of(n).unwrap_or(u64::MAX), *n))
        .collect();
    attn_v.sort_unstable();
    let n_attn_v = attn_v.len() as u64;
    let attn_v_ordinal =
        |name: &str| attn_v.iter().position(|(_, n)| *n == name).unwrap_or(0) as u64;

    tensors
        .iter()
        .map(|&(name, dims)| {
            if !is_quantizable(name, dims) {
                return Choice {
                    ty: None,
                    reason: Reason::Kept,
                    fallback_from: None,
                };
            }
            let def = mix.default_type();
            if !mix.is_quantized() {
                return Choice {
                    ty: Some(def),
                    reason: Reason::MixDefault,
                    fallback_from: None,
                };
            }
            let cols = dims[0];
            let k_m = matches!(mix, Mix::Q4_K_M | Mix::Q5_K_M);
            let (want, reason) = match category(name) {
                Category::Output | Category::TokenEmbd
                    if category(name) == Category::Output || tied =>
                {
                    let t = if !cols.is_multiple_of(def.block_size()) || def == GgmlType::Q8_0 {
                        GgmlType::Q8_0
                    } else {
                        GgmlType::Q6_K
                    };
                    (t, Reason::OutputHead)
                }
                Category::AttnV => {
                    let mut pick = (def, Reason::MixDefault);
                    if k_m && more_bits(attn_v_ordinal(name), n_attn_v) {
                        pick = (GgmlType::Q6_K, Reason::MoreBits);
                    }
                    if model.arch == Arch::Llama.name() && n_layer == 80 && pick.0 == GgmlType::Q4_K
                    {
                        pick = (GgmlType::Q5_K, Reason::LargeModel);
                    }
                    if model.expert_count == 8 {
                        pick = (GgmlType::Q8_0, Reason::ManyExperts);
                    }
                    pick
                }
                Category::AttnK if model.expert_count == 8 => (GgmlType::Q8_0, Reason::ManyExperts),
                Category::AttnOutput if model.expert_count == 8 && mix == Mix::Q4_K_M => {
                    (GgmlType::Q5_K, Reason::ManyExperts)
                }
                Category::FfnDown
                    if k_m && layer_of(name).is_some_and(|l| more_bits(l, n_layer)) =>
                {
                    (GgmlType::Q6_K, Reason::MoreBits)
                }
                _ => (def, Reason::MixDefault),
            };
            let (ty, fallback_from) = fit(want, cols);
            Choice {
                ty: Some(ty),
                reason,
                fallback_from,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn types(mix: Mix, model: &ModelInfo, tensors: &[(String, Vec<u64>)]) -> Vec<Option<GgmlType>> {
        let list: Vec<(&str, &[u64])> = tensors
            .iter()
            .map(|(n, d)| (n.as_str(), d.as_slice()))
            .collect();
        choose_types(mix, model, &list)
            .into_iter()
            .map(|c| c.ty)
            .collect()
    }

    /// The tensor table of gemma-3-270m (18 layers, 640 wide, tied embedding), as read with
    /// gguf-py from `gemma-3-270m-q4_k_m.gguf`.
    fn gemma_270m() -> Vec<(String, Vec<u64>)> {
        let mut t = vec![
            ("output_norm.weight".to_owned(), vec![640]),
            ("token_embd.weight".to_owned(), vec![640, 262_144]),
        ];
        for l in 0..18 {
            let n = |s: &str| format!("blk.{l}.{s}.weight");
            t.extend([
                (n("attn_k"), vec![640, 256]),
                (n("attn_k_norm"), vec![256]),
                (n("attn_norm"), vec![640]),
                (n("attn_output"), vec![1024, 640]),
                (n("attn_q"), vec![640, 1024]),
                (n("attn_q_norm"), vec![256]),
                (n("attn_v"), vec![640, 256]),
                (n("ffn_down"), vec![2048, 640]),
                (n("ffn_gate"), vec![640, 2048]),
                (n("ffn_norm"), vec![640]),
                (n("ffn_up"), vec![640, 2048]),
                (n("post_attention_norm"), vec![640]),
                (n("post_ffw_norm"), vec![640]),
            ]);
        }
        t
    }

    /// The types llama.cpp gave the gemma-3-270m tensors in its Q4_K_M file (read with
    /// gguf-py from `gemma-3-270m-q4_k_m.gguf`): the oracle for the rule.
    fn gemma_270m_q4_k_m_types() -> Vec<Option<GgmlType>> {
        use GgmlType as T;
        let promoted = [0, 1, 4, 7, 10, 13, 15, 16, 17];
        let mut t = vec![None, Some(T::Q8_0)];
        for l in 0..18 {
            let more = promoted.contains(&l);
            t.extend([
                Some(T::Q5_0),
                None,
                None,
                Some(T::Q4_K),
                Some(T::Q5_0),
                None,
                Some(if more { T::Q8_0 } else { T::Q5_0 }),
                Some(if more { T::Q6_K } else { T::Q4_K }),
                Some(T::Q5_0),
                None,
                Some(T::Q5_0),
                None,
                None,
            ]);
        }
        t
    }

    fn gemma_info() -> ModelInfo {
        ModelInfo {
            arch: "gemma3".into(),
            block_count: 18,
            expert_count: 0,
        }
    }

    #[test]
    fn q4_k_m_matches_the_file_llama_cpp_made() {
        let got = types(Mix::Q4_K_M, &gemma_info(), &gemma_270m());
        let want = gemma_270m_q4_k_m_types();
        let names = gemma_270m();
        for ((g, w), (n, _)) in got.iter().zip(&want).zip(&names) {
            assert_eq!(g, w, "{n}");
        }
        assert_eq!(got.len(), want.len());
    }

    #[test]
    fn the_gemma_oracle_catches_a_rule_that_quantizes_norms() {
        // Test the test: a rule that also quantized 1-D norms would put Some(Q5_0) where the
        // file has None; the comparison above must see that.
        let mut mutated = types(Mix::Q4_K_M, &gemma_info(), &gemma_270m());
        mutated[0] = Some(GgmlType::Q5_0);
        assert_ne!(mutated, gemma_270m_q4_k_m_types());
    }

    #[test]
    fn more_bits_matches_the_eighths_rule() {
        let picked: Vec<u64> = (0..32).filter(|&l| more_bits(l, 32)).collect();
        assert_eq!(
            picked,
            [0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 27, 28, 29, 30, 31]
        );
    }

    #[test]
    fn legacy_mixes_promote_only_the_output_head() {
        let tensors = vec![
            ("token_embd.weight".to_owned(), vec![4096, 1000]),
            ("output.weight".to_owned(), vec![4096, 1000]),
            ("blk.0.attn_v.weight".to_owned(), vec![4096, 1024]),
            ("blk.0.ffn_down.weight".to_owned(), vec![4096, 4096]),
            ("blk.0.attn_norm.weight".to_owned(), vec![4096]),
        ];
        let info = ModelInfo::default();
        use GgmlType as T;
        let q4 = types(Mix::Q4_0, &info, &tensors);
        assert_eq!(
            q4,
            [
                Some(T::Q4_0),
                Some(T::Q6_K),
                Some(T::Q4_0),
                Some(T::Q4_0),
                None
            ]
        );
        let q8 = types(Mix::Q8_0, &info, &tensors);
        assert_eq!(
            q8,
            [
                Some(T::Q8_0),
                Some(T::Q8_0),
                Some(T::Q8_0),
                Some(T::Q8_0),
                None
            ]
        );
        let f16 = types(Mix::F16, &info, &tensors);
        assert_eq!(
            f16,
            [Some(T::F16), Some(T::F16), Some(T::F16), Some(T::F16), None]
        );
    }

    #[test]
    fn tied_embedding_of_smollm2_falls_back_from_q6_k_to_q8_0() {
        // SmolLM2-135M's Q4_1 file (made by llama.cpp) has token_embd Q8_0: the tied head
        // wants Q6_K, 576 is not a multiple of 256.
        let tensors = [
            ("token_embd.weight".to_owned(), vec![576, 49152]),
            ("blk.0.attn_v.weight".to_owned(), vec![576, 192]),
        ];
        let list: Vec<(&str, &[u64])> = tensors
            .iter()
            .map(|(n, d)| (n.as_str(), d.as_slice()))
            .collect();
        let c = choose_types(Mix::Q4_1, &ModelInfo::default(), &list);
        assert_eq!(c[0].ty, Some(GgmlType::Q8_0));
        assert_eq!(c[0].reason, Reason::OutputHead);
        assert_eq!(c[0].fallback_from, Some(GgmlType::Q6_K));
        assert_eq!(c[1].ty, Some(GgmlType::Q4_1));
    }

    #[test]
    fn fallbacks_follow_the_block_size_chain() {
        assert_eq!(fit(GgmlType::Q4_K, 4096), (GgmlType::Q4_K, None));
        assert_eq!(fit(GgmlType::Q4_K, 576).0, GgmlType::Q5_0);
        assert_eq!(fit(GgmlType::Q5_K, 576).0, GgmlType::Q5_1);
        assert_eq!(fit(GgmlType::Q6_K, 576).0, GgmlType::Q8_0);
        assert_eq!(fit(GgmlType::Q6_K, 48).0, GgmlType::F16);
        assert_eq!(
            fit(GgmlType::Q4_0, 48),
            (GgmlType::F16, Some(GgmlType::Q4_0))
        );
    }

    #[test]
    fn eight_expert_models_keep_attention_at_q8_0() {
        let tensors = vec![
            ("output.weight".to_owned(), vec![256, 100]),
            ("blk.0.attn_v.weight".to_owned(), vec![256, 256]),
            ("blk.0.attn_k.weight".to_owned(), vec![256, 256]),
            ("blk.0.attn_output.weight".to_owned(), vec![256, 256]),
            ("blk.0.ffn_gate_inp.weight".to_owned(), vec![256, 8]),
            ("blk.0.ffn_down_exps.weight".to_owned(), vec![512, 256, 8]),
        ];
        let info = ModelInfo {
            arch: "mixtral".into(),
            block_count: 32,
            expert_count: 8,
        };
        use GgmlType as T;
        assert_eq!(
            types(Mix::Q4_K_M, &info, &tensors),
            [
                Some(T::Q6_K),
                Some(T::Q8_0),
                Some(T::Q8_0),
                Some(T::Q5_K),
                None,
                Some(T::Q6_K)
            ]
        );
    }

    #[test]
    fn large_llama_attn_v_gets_q5_k_outside_more_bits_layers() {
        let tensors: Vec<(String, Vec<u64>)> = (0..80)
            .map(|l| (format!("blk.{l}.attn_v.weight"), vec![8192, 1024]))
            .collect();
        let info = ModelInfo {
            arch: "llama".into(),
            block_count: 80,
            expert_count: 0,
        };
        let t = types(Mix::Q4_K_M, &info, &tensors);
        assert_eq!(t[0], Some(GgmlType::Q6_K));
        assert_eq!(t[10], Some(GgmlType::Q5_K));
    }
}
