//! ferrite-arch: the architecture table. Every GGUF architecture ferrite loads, with its
//! `general.architecture` name and the features that decide which tensors its files hold;
//! the GGUF tensor names of every role ([`GlobalTensor`], [`TensorRole`]); and the
//! `{arch}.*` metadata keys ([`Key`]). These are llama.cpp's conventions (its
//! `llama-arch.cpp` tables); ferrite writes and reads them in one place so that the loaders
//! (`ferrite-model`, `ferrite-cuda`), `ferrite-convert`, `ferrite-quantize`, `ferrite synth`,
//! `ferrite inspect` and `ferrite-kvstore` cannot disagree on a name.
//!
//! Key design choice: this crate depends on nothing. The converter and the quantizer must not
//! depend on `ferrite-model` (it pulls the CPU kernels in), and names, keys and features are
//! plain strings and flags, so a leaf crate is the one place every reader can reach. It must
//! never read files or hold model math: what a feature computes belongs to the model crate.
//!
//! Adding an architecture needs: a variant of [`Arch`] with its entry in [`ARCHES`] (name and
//! [`Features`]; any new tensor role or key goes into [`TensorRole`] or [`Key`] here), the
//! pinned lists in this crate's tests, and one model file that reads its hyper-parameters
//! and runs its layers, with that file's tests. Converter, quantizer, synth, inspect and
//! the KV store need nothing more: they read names, keys and features from here. (Until the
//! forward pass is written once over a backend contract, "one model file" is the
//! architecture's arm of `ferrite-model`'s `config.rs`, plus the CPU and CUDA layer code
//! where it brings math they lack.)
//!
//! ```
//! use ferrite_arch::{Arch, GlobalTensor, Key, Presence, TensorRole};
//!
//! let arch = Arch::from_name("qwen3").expect("a known architecture");
//! assert_eq!(arch.features().qk_norm, Presence::Required);
//! assert_eq!(arch.key(Key::HeadCountKv), "qwen3.attention.head_count_kv");
//! assert_eq!(TensorRole::AttnQNorm.weight(3), "blk.3.attn_q_norm.weight");
//! assert_eq!(GlobalTensor::TokenEmbd.name(), "token_embd.weight");
//! ```

#![deny(missing_docs)]

mod key;
mod tensor;

pub use key::{ARCHITECTURE_KEY, Key};
pub use tensor::{GlobalTensor, Kind, LayerParts, NORM_SUFFIX, TensorName, TensorRole, layer_of};

/// A GGUF architecture ferrite loads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Arch {
    /// Llama family (SmolLM2, Llama 3, Mistral, Mixtral).
    Llama,
    /// Gemma 3 text models.
    Gemma3,
    /// Gemma 2 (soft-capped attention and output logits).
    Gemma2,
    /// Qwen 2 / 2.5 (q/k/v biases).
    Qwen2,
    /// Qwen 3 dense (q/k norms).
    Qwen3,
    /// Qwen 3 mixture of experts.
    Qwen3Moe,
    /// Phi-3 (fused projections, LongRoPE).
    Phi3,
    /// GLM-4.5 / 4.6 mixture of experts (partial rotary, shared expert, sigmoid routing).
    Glm4Moe,
    /// DeepSeek V2 / V3 (multi-head latent attention, shared and routed experts).
    Deepseek2,
    /// OpenAI's gpt-oss (attention sinks, alternating sliding layers, biased experts with a
    /// clamped SwiGLU).
    GptOss,
    /// Qwen3-Next: gated DeltaNet layers with a gated full-attention layer every
    /// `full_attention_interval`, routed experts with a sigmoid-gated shared expert.
    Qwen3Next,
    /// Nemotron-H: a hybrid of Mamba-2 blocks, attention blocks without rope and squared-ReLU
    /// MLP blocks, one part a block ([`BlockKind`]).
    NemotronH,
}

/// Whether the layers of an architecture have a part.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Presence {
    /// Never: a file that has its tensors is refused (they would be ignored).
    Never,
    /// When the file has it (its tensors or keys).
    IfPresent,
    /// Always: a file without it is refused.
    Required,
}

impl Presence {
    /// Whether a model has the part, given whether its file has it: a part that is
    /// [`Presence::Required`] is looked for (and its absence reported) even when missing.
    pub fn resolve(self, in_file: bool) -> bool {
        match self {
            Presence::Never => false,
            Presence::IfPresent => in_file,
            Presence::Required => true,
        }
    }
}

/// The features of an architecture that decide its tensors and their layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Features {
    /// Q/K rows are stored for interleaved (adjacent-pair) rope: llama.cpp's converter
    /// permutes Hugging Face's rotate-half rows. Otherwise they stay in Hugging Face's
    /// order and the model uses half-split (NeoX) rope.
    pub interleaved_rope: bool,
    /// Per-head RMSNorm of Q and K before rope (`attn_q_norm`, `attn_k_norm`).
    pub qk_norm: Presence,
    /// RMSNorm of the attention and FFN outputs before the residual add
    /// (`post_attention_norm`, `post_ffw_norm`).
    pub post_norms: bool,
    /// Q, K and V projection biases.
    pub qkv_bias: Presence,
    /// Attention output projection bias.
    pub out_bias: Presence,
    /// Expert FFNs (`{arch}.expert_count` and the `ffn_*_exps` stacks) instead of dense ones.
    pub experts: Presence,
    /// Fused projections: `attn_qkv` for Q/K/V, one `ffn_up` for gate and up ([`LayerParts`]).
    pub fused: bool,
    /// Multi-head latent attention ([`LayerParts::mla`]) instead of Q/K/V projections.
    pub mla: bool,
    /// One learned logit per query head (`attn_sinks`) that joins every softmax of its
    /// scores and takes a share of the weight without a value.
    pub sinks: bool,
    /// The router and the three expert stacks have biases (`ffn_gate_inp.bias`,
    /// `ffn_{gate,up,down}_exps.bias`).
    pub expert_bias: bool,
    /// The role the norm before the FFN is stored under: [`TensorRole::FfnNorm`], or
    /// [`TensorRole::PostAttentionNorm`] where llama.cpp names Hugging Face's
    /// `post_attention_layernorm` so (gpt-oss); not a norm of the attention's output there.
    pub ffn_norm: TensorRole,
    /// A hybrid of gated DeltaNet layers and gated attention (Qwen3-Next): layer `i` is
    /// attention when `(i + 1) % full_attention_interval == 0`, else linear attention
    /// ([`LayerParts::delta_net`]); attention heads and the shared expert are gated.
    pub delta_net: bool,
    /// Blocks of one part each, Mamba-2, attention or MLP (Nemotron-H, [`BlockKind`]): the
    /// per-layer `attention.head_count_kv` and `feed_forward_length` arrays say which
    /// (heads for attention, a width for the MLP, both zero for Mamba-2), as llama.cpp
    /// writes them. The one norm of a block is `attn_norm`.
    pub mamba2: bool,
}

/// The one part of a block of a [`Features::mamba2`] model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BlockKind {
    /// A Mamba-2 mixer ([`Mamba2Shape`]).
    Mamba2,
    /// Attention without rope.
    Attention,
    /// A squared-ReLU MLP, `down(relu(up · x)²)`.
    Mlp,
}

/// The shape of DeepSeek's multi-head latent attention, as its configs name it (read from
/// `config.json` by the converter, from the `attention.*` keys by the loader).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MlaShape {
    /// Rank of the query's low-rank pair (`q_lora_rank`); `None` for one projection.
    pub q_lora_rank: Option<usize>,
    /// Values of the compressed key/value latent (`kv_lora_rank`).
    pub kv_lora_rank: usize,
    /// Per head, the query and key values without rope (`qk_nope_head_dim`).
    pub nope_dim: usize,
    /// Per head and in the shared key, the values with rope (`qk_rope_head_dim`).
    pub rope_dim: usize,
    /// Per head, the value's size (`v_head_dim`).
    pub v_dim: usize,
}

impl MlaShape {
    /// Per head, the query's (and decompressed key's) values: `nope_dim + rope_dim`.
    pub fn qk_dim(self) -> usize {
        self.nope_dim + self.rope_dim
    }

    /// Values of one cached row in the absorbed form, `[rope key | latent]`.
    pub fn cache_row(self) -> usize {
        self.rope_dim + self.kv_lora_rank
    }
}

/// The shape of a gated DeltaNet layer (Qwen3-Next's linear attention), as its configs name
/// it (read from `config.json` by the converter, from the `ssm.*` keys by the loader).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DeltaNetShape {
    /// Taps of the causal convolution over q, k and v (`linear_conv_kernel_dim`).
    pub conv_kernel: usize,
    /// Key (and query) heads (`linear_num_key_heads`).
    pub k_heads: usize,
    /// Value heads (`linear_num_value_heads`), a multiple of the key heads: each key head
    /// serves `v_heads / k_heads` consecutive value heads.
    pub v_heads: usize,
    /// Values per key head (`linear_key_head_dim`).
    pub k_dim: usize,
    /// Values per value head (`linear_value_head_dim`).
    pub v_dim: usize,
    /// Every how many layers one is full attention (`full_attention_interval`).
    pub interval: usize,
}

impl DeltaNetShape {
    /// Channels of the convolution: the queries, keys and values of every head.
    pub fn conv_channels(self) -> usize {
        2 * self.k_heads * self.k_dim + self.v_heads * self.v_dim
    }

    /// Values of the output of every value head.
    pub fn inner(self) -> usize {
        self.v_heads * self.v_dim
    }

    /// Whether layer `i` is full attention rather than a DeltaNet.
    pub fn is_attention(self, i: usize) -> bool {
        (i + 1).is_multiple_of(self.interval)
    }

    /// f32 values of one layer's recurrent state: the last `conv_kernel - 1` inputs of
    /// every channel, then each value head's `k_dim × v_dim` matrix.
    pub fn state_len(self) -> usize {
        (self.conv_kernel - 1) * self.conv_channels() + self.v_heads * self.k_dim * self.v_dim
    }

    /// Its convolution.
    pub fn conv(self) -> ConvShape {
        ConvShape {
            channels: self.conv_channels(),
            kernel: self.conv_kernel,
            state_len: self.state_len(),
        }
    }
}

/// The shape of a Mamba-2 mixer, as Nemotron-H's configs name it (read from `config.json` by
/// the converter, from the `ssm.*` keys by the loader).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Mamba2Shape {
    /// Taps of the causal convolution over x, B and C (`conv_kernel`).
    pub conv_kernel: usize,
    /// Groups of B and C (`n_groups`): each serves `n_heads / n_groups` consecutive heads.
    pub n_groups: usize,
    /// Values of each group's B and C, the state's width (`ssm_state_size`).
    pub d_state: usize,
    /// Heads (`mamba_num_heads`).
    pub n_heads: usize,
    /// Values per head (`mamba_head_dim`).
    pub head_dim: usize,
}

impl Mamba2Shape {
    /// Values of the heads' input `x` (and of the gate `z`, and of the output).
    pub fn inner(self) -> usize {
        self.n_heads * self.head_dim
    }

    /// Channels of the convolution: `x`, then every group's B, then every group's C.
    pub fn conv_channels(self) -> usize {
        self.inner() + 2 * self.n_groups * self.d_state
    }

    /// Rows of the input projection `ssm_in`: `z`, the convolution's channels, then one
    /// time step per head.
    pub fn in_rows(self) -> usize {
        self.inner() + self.conv_channels() + self.n_heads
    }

    /// f32 values of one layer's recurrent state: the last `conv_kernel - 1` inputs of
    /// every channel, then each head's `head_dim × d_state` matrix.
    pub fn state_len(self) -> usize {
        (self.conv_kernel - 1) * self.conv_channels() + self.inner() * self.d_state
    }

    /// Its convolution.
    pub fn conv(self) -> ConvShape {
        ConvShape {
            channels: self.conv_channels(),
            kernel: self.conv_kernel,
            state_len: self.state_len(),
        }
    }
}

/// The causal depthwise convolution at the head of a recurrent layer, and the size of the
/// state slot whose first `(kernel - 1) × channels` values keep its last inputs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ConvShape {
    /// Channels, each with its own `kernel` taps.
    pub channels: usize,
    /// Taps.
    pub kernel: usize,
    /// f32 values of the layer's whole state slot.
    pub state_len: usize,
}

/// One row of the architecture table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ArchEntry {
    /// The architecture.
    pub arch: Arch,
    /// `general.architecture` in GGUF files, and the prefix of its metadata keys.
    pub name: &'static str,
    /// Its features.
    pub features: Features,
}

/// The table, in the order of [`Arch`]'s variants.
pub const ARCHES: [ArchEntry; 12] = [
    ArchEntry {
        arch: Arch::Llama,
        name: "llama",
        features: Features {
            interleaved_rope: true,
            qk_norm: Presence::Never,
            post_norms: false,
            qkv_bias: Presence::IfPresent,
            out_bias: Presence::IfPresent,
            experts: Presence::IfPresent,
            fused: false,
            mla: false,
            sinks: false,
            expert_bias: false,
            ffn_norm: TensorRole::FfnNorm,
            delta_net: false,
            mamba2: false,
        },
    },
    ArchEntry {
        arch: Arch::Gemma3,
        name: "gemma3",
        features: Features {
            interleaved_rope: false,
            qk_norm: Presence::Required,
            post_norms: true,
            qkv_bias: Presence::Never,
            out_bias: Presence::Never,
            experts: Presence::Never,
            fused: false,
            mla: false,
            sinks: false,
            expert_bias: false,
            ffn_norm: TensorRole::FfnNorm,
            delta_net: false,
            mamba2: false,
        },
    },
    ArchEntry {
        arch: Arch::Gemma2,
        name: "gemma2",
        features: Features {
            interleaved_rope: false,
            qk_norm: Presence::Never,
            post_norms: true,
            qkv_bias: Presence::Never,
            out_bias: Presence::Never,
            experts: Presence::Never,
            fused: false,
            mla: false,
            sinks: false,
            expert_bias: false,
            ffn_norm: TensorRole::FfnNorm,
            delta_net: false,
            mamba2: false,
        },
    },
    ArchEntry {
        arch: Arch::Qwen2,
        name: "qwen2",
        features: Features {
            interleaved_rope: false,
            qk_norm: Presence::Never,
            post_norms: false,
            qkv_bias: Presence::Required,
            out_bias: Presence::IfPresent,
            experts: Presence::IfPresent,
            fused: false,
            mla: false,
            sinks: false,
            expert_bias: false,
            ffn_norm: TensorRole::FfnNorm,
            delta_net: false,
            mamba2: false,
        },
    },
    ArchEntry {
        arch: Arch::Qwen3,
        name: "qwen3",
        features: Features {
            interleaved_rope: false,
            qk_norm: Presence::Required,
            post_norms: false,
            qkv_bias: Presence::IfPresent,
            out_bias: Presence::IfPresent,
            experts: Presence::IfPresent,
            fused: false,
            mla: false,
            sinks: false,
            expert_bias: false,
            ffn_norm: TensorRole::FfnNorm,
            delta_net: false,
            mamba2: false,
        },
    },
    ArchEntry {
        arch: Arch::Qwen3Moe,
        name: "qwen3moe",
        features: Features {
            interleaved_rope: false,
            qk_norm: Presence::Required,
            post_norms: false,
            qkv_bias: Presence::IfPresent,
            out_bias: Presence::IfPresent,
            experts: Presence::Required,
            fused: false,
            mla: false,
            sinks: false,
            expert_bias: false,
            ffn_norm: TensorRole::FfnNorm,
            delta_net: false,
            mamba2: false,
        },
    },
    ArchEntry {
        arch: Arch::Phi3,
        name: "phi3",
        features: Features {
            interleaved_rope: false,
            qk_norm: Presence::Never,
            post_norms: false,
            qkv_bias: Presence::Never,
            out_bias: Presence::Never,
            experts: Presence::Never,
            fused: true,
            mla: false,
            sinks: false,
            expert_bias: false,
            ffn_norm: TensorRole::FfnNorm,
            delta_net: false,
            mamba2: false,
        },
    },
    ArchEntry {
        arch: Arch::Glm4Moe,
        name: "glm4moe",
        features: Features {
            interleaved_rope: false,
            // GLM-4.5's `use_qk_norm`; llama.cpp loads the norms where the file has them.
            qk_norm: Presence::IfPresent,
            post_norms: false,
            qkv_bias: Presence::IfPresent,
            out_bias: Presence::Never,
            experts: Presence::Required,
            fused: false,
            mla: false,
            sinks: false,
            expert_bias: false,
            ffn_norm: TensorRole::FfnNorm,
            delta_net: false,
            mamba2: false,
        },
    },
    ArchEntry {
        arch: Arch::Deepseek2,
        name: "deepseek2",
        features: Features {
            // llama.cpp's converter keeps Hugging Face's rows: DeepSeek's rope already
            // pairs adjacent values.
            interleaved_rope: true,
            qk_norm: Presence::Never,
            post_norms: false,
            qkv_bias: Presence::Never,
            out_bias: Presence::Never,
            experts: Presence::Required,
            fused: false,
            mla: true,
            sinks: false,
            expert_bias: false,
            ffn_norm: TensorRole::FfnNorm,
            delta_net: false,
            mamba2: false,
        },
    },
    ArchEntry {
        arch: Arch::GptOss,
        name: "gpt-oss",
        features: Features {
            interleaved_rope: false,
            qk_norm: Presence::Never,
            post_norms: false,
            qkv_bias: Presence::Required,
            out_bias: Presence::Required,
            experts: Presence::Required,
            fused: false,
            mla: false,
            sinks: true,
            expert_bias: true,
            ffn_norm: TensorRole::PostAttentionNorm,
            delta_net: false,
            mamba2: false,
        },
    },
    ArchEntry {
        arch: Arch::Qwen3Next,
        name: "qwen3next",
        features: Features {
            interleaved_rope: false,
            qk_norm: Presence::Required,
            post_norms: false,
            qkv_bias: Presence::Never,
            out_bias: Presence::Never,
            experts: Presence::Required,
            fused: false,
            mla: false,
            sinks: false,
            expert_bias: false,
            ffn_norm: TensorRole::PostAttentionNorm,
            delta_net: true,
            mamba2: false,
        },
    },
    ArchEntry {
        arch: Arch::NemotronH,
        name: "nemotron_h",
        features: Features {
            interleaved_rope: false,
            qk_norm: Presence::Never,
            post_norms: false,
            qkv_bias: Presence::Never,
            out_bias: Presence::Never,
            experts: Presence::Never,
            fused: false,
            mla: false,
            sinks: false,
            expert_bias: false,
            ffn_norm: TensorRole::AttnNorm,
            delta_net: false,
            mamba2: true,
        },
    },
];

impl Arch {
    /// Every architecture, in table order.
    pub const ALL: [Arch; 12] = [
        Arch::Llama,
        Arch::Gemma3,
        Arch::Gemma2,
        Arch::Qwen2,
        Arch::Qwen3,
        Arch::Qwen3Moe,
        Arch::Phi3,
        Arch::Glm4Moe,
        Arch::Deepseek2,
        Arch::GptOss,
        Arch::Qwen3Next,
        Arch::NemotronH,
    ];

    /// The architecture whose `general.architecture` is `name`; `None` for one ferrite does
    /// not load.
    pub fn from_name(name: &str) -> Option<Arch> {
        ARCHES.iter().find(|e| e.name == name).map(|e| e.arch)
    }

    /// Its row of [`ARCHES`].
    pub fn entry(self) -> &'static ArchEntry {
        // The table follows the variants' order; a test checks it.
        &ARCHES[self as usize]
    }

    /// `general.architecture` of its files.
    pub fn name(self) -> &'static str {
        self.entry().name
    }

    /// Its features.
    pub fn features(self) -> Features {
        self.entry().features
    }

    /// Its metadata key `key` (`{name}.{suffix}`).
    pub fn key(self, key: Key) -> String {
        key.of(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_follows_the_variants_order() {
        for (i, a) in Arch::ALL.into_iter().enumerate() {
            assert_eq!(ARCHES[i].arch, a);
            assert_eq!(a.entry().arch, a);
            assert_eq!(Arch::from_name(a.name()), Some(a));
        }
        assert_eq!(Arch::from_name("mamba"), None);
        assert_eq!(Arch::from_name("Llama"), None);
    }

    /// The oracle: llama.cpp's `general.architecture` names and the features each of these
    /// architectures has in its files (llama.cpp's `llm_build_*` graphs), spelled out.
    #[test]
    fn names_and_features_are_pinned() {
        use Presence::{IfPresent, Never, Required};
        let pinned = [
            (
                Arch::Llama,
                "llama",
                true,
                Never,
                false,
                IfPresent,
                IfPresent,
                IfPresent,
            ),
            (
                Arch::Gemma3,
                "gemma3",
                false,
                Required,
                true,
                Never,
                Never,
                Never,
            ),
            (
                Arch::Gemma2,
                "gemma2",
                false,
                Never,
                true,
                Never,
                Never,
                Never,
            ),
            (
                Arch::Qwen2,
                "qwen2",
                false,
                Never,
                false,
                Required,
                IfPresent,
                IfPresent,
            ),
            (
                Arch::Qwen3,
                "qwen3",
                false,
                Required,
                false,
                IfPresent,
                IfPresent,
                IfPresent,
            ),
            (
                Arch::Qwen3Moe,
                "qwen3moe",
                false,
                Required,
                false,
                IfPresent,
                IfPresent,
                Required,
            ),
            (Arch::Phi3, "phi3", false, Never, false, Never, Never, Never),
            (
                Arch::Glm4Moe,
                "glm4moe",
                false,
                IfPresent,
                false,
                IfPresent,
                Never,
                Required,
            ),
            (
                Arch::Deepseek2,
                "deepseek2",
                true,
                Never,
                false,
                Never,
                Never,
                Required,
            ),
            (
                Arch::GptOss,
                "gpt-oss",
                false,
                Never,
                false,
                Required,
                Required,
                Required,
            ),
            (
                Arch::Qwen3Next,
                "qwen3next",
                false,
                Required,
                false,
                Never,
                Never,
                Required,
            ),
            (
                Arch::NemotronH,
                "nemotron_h",
                false,
                Never,
                false,
                Never,
                Never,
                Never,
            ),
        ];
        assert_eq!(pinned.len(), Arch::ALL.len());
        for (arch, name, rope, qk, post, qkv, out, experts) in pinned {
            assert_eq!(arch.name(), name);
            assert_eq!(arch.features().fused, arch == Arch::Phi3, "{name}");
            assert_eq!(arch.features().mla, arch == Arch::Deepseek2, "{name}");
            let gpt_oss = arch == Arch::GptOss;
            assert_eq!(arch.features().sinks, gpt_oss, "{name}");
            assert_eq!(arch.features().expert_bias, gpt_oss, "{name}");
            assert_eq!(arch.features().delta_net, arch == Arch::Qwen3Next, "{name}");
            assert_eq!(arch.features().mamba2, arch == Arch::NemotronH, "{name}");
            let ffn_norm = match arch {
                Arch::GptOss | Arch::Qwen3Next => TensorRole::PostAttentionNorm,
                Arch::NemotronH => TensorRole::AttnNorm,
                _ => TensorRole::FfnNorm,
            };
            assert_eq!(arch.features().ffn_norm, ffn_norm, "{name}");
            let f = arch.features();
            assert_eq!(
                (f.interleaved_rope, f.qk_norm, f.post_norms),
                (rope, qk, post),
                "{name}"
            );
            assert_eq!(
                (f.qkv_bias, f.out_bias, f.experts),
                (qkv, out, experts),
                "{name}"
            );
        }
    }
}
