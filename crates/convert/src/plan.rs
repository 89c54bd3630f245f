//! The tensor plan: which GGUF tensors a checkpoint becomes, their shapes and stored types
//! (known from the safetensors headers alone), and, one tensor at a time, their bytes.
//!
//! Describing and producing are separate so a writer can lay out the whole file (header,
//! offsets) before reading any weight, then produce and write one tensor at a time.

use std::borrow::Cow;
use std::collections::BTreeMap;

use ferrite_arch::{GlobalTensor, Kind, TensorName, TensorRole};
use ferrite_gguf::GgmlType;
use ferrite_safetensors::{Checkpoint, TensorRef};

use crate::delta_net::{self, Split};
use crate::names::{self, ExpertPart, Mapped};
use crate::{ConvertError, HfConfig, tensors};

/// One output tensor before its data is produced.
pub(crate) enum Item {
    Plain {
        gguf: String,
        hf: String,
    },
    Stack {
        layer: usize,
        part: ExpertPart,
    },
    FusedHalf {
        layer: usize,
        gate: bool,
        hf: String,
    },
    FusedDown {
        layer: usize,
        hf: String,
    },
    /// gpt-oss's gate (`gate`) or up columns of its fused `gate_up_proj` (or of its bias),
    /// transposed to llama.cpp's `[experts, ff, d]`.
    OssHalf {
        layer: usize,
        gate: bool,
        bias: bool,
        hf: String,
    },
    /// gpt-oss's `down_proj`, transposed to `[experts, d, ff]`.
    OssDown {
        layer: usize,
        hf: String,
    },
    /// One half of DeepSeek's `kv_b_proj`: the keys' (`attn_k_b`) or the values'.
    KvBHalf {
        layer: usize,
        key: bool,
        hf: String,
    },
    /// One role's rows of a grouped Qwen3-Next projection, in head order.
    Split {
        layer: usize,
        split: Split,
        hf: String,
    },
    /// A depthwise convolution without its middle dimension of 1.
    Conv1d {
        layer: usize,
        hf: String,
    },
    /// `-exp(A_log)` in f32 (`ssm_a`).
    DecayRate {
        layer: usize,
        hf: String,
    },
}

/// What an item becomes: GGUF name, stored type and row-major (PyTorch-order) shape.
pub(crate) struct Described {
    pub gguf: String,
    pub src: GgmlType,
    pub shape: Vec<u64>,
}

/// Per (layer, expert matrix): the checkpoint name of each expert's tensor.
pub(crate) type Stacks = BTreeMap<(usize, ExpertPart), Vec<Option<String>>>;

/// The items of a checkpoint, in checkpoint order (a stacked expert tensor where its first
/// expert appears), with the set checked for completeness.
pub(crate) struct Plan<'a> {
    c: &'a HfConfig,
    checkpoint: &'a Checkpoint,
    pub items: Vec<Item>,
    stacks: Stacks,
}

impl<'a> Plan<'a> {
    /// Maps every checkpoint tensor and checks the set is complete.
    pub fn new(c: &'a HfConfig, checkpoint: &'a Checkpoint) -> Result<Plan<'a>, ConvertError> {
        let mut items = Vec::new();
        let mut stacks = Stacks::new();
        let n_experts = c.experts.map_or(0, |e| e.count);
        for hf in checkpoint.names() {
            let mapped =
                names::map(hf, c.family).ok_or_else(|| ConvertError::UnmappedTensor(hf.into()))?;
            let layer = names::layer_of(hf, c.family);
            if layer.is_some_and(|l| l >= c.n_layer) {
                return Err(ConvertError::BadTensor {
                    tensor: hf.into(),
                    reason: format!("layer index beyond num_hidden_layers {}", c.n_layer),
                });
            }
            let expert_tensor = matches!(
                mapped,
                Mapped::Expert { .. }
                    | Mapped::FusedGateUp { .. }
                    | Mapped::FusedDown { .. }
                    | Mapped::OssGateUp { .. }
                    | Mapped::OssDown { .. }
            );
            if expert_tensor && n_experts == 0 {
                // Expert weights in a model whose config declares no experts.
                return Err(ConvertError::UnmappedTensor(hf.into()));
            }
            if let Some(h) = &c.mamba2 {
                let gguf = match &mapped {
                    Mapped::Plain(gguf) => Some(gguf.clone()),
                    Mapped::Conv1d { layer } => Some(TensorRole::SsmConv1d.weight(*layer)),
                    Mapped::DecayRate { layer } => Some(TensorRole::SsmA.bare(*layer)),
                    _ => None,
                };
                if let Some(gguf) = gguf {
                    h.check_tensor(&gguf, hf)?;
                }
            }
            match mapped {
                Mapped::Skip => {}
                Mapped::Plain(gguf) => {
                    if gguf == GlobalTensor::Output.name() && c.tie_embeddings {
                        continue;
                    }
                    items.push(Item::Plain {
                        gguf,
                        hf: hf.into(),
                    });
                }
                Mapped::Expert {
                    layer,
                    expert,
                    part,
                } => {
                    if expert >= n_experts {
                        return Err(ConvertError::BadTensor {
                            tensor: hf.into(),
                            reason: format!("expert index beyond num_experts {n_experts}"),
                        });
                    }
                    let slots = stacks.entry((layer, part)).or_insert_with(|| {
                        items.push(Item::Stack { layer, part });
                        vec![None; n_experts]
                    });
                    slots[expert] = Some(hf.into());
                }
                Mapped::FusedGateUp { layer } => {
                    for gate in [true, false] {
                        items.push(Item::FusedHalf {
                            layer,
                            gate,
                            hf: hf.into(),
                        });
                    }
                }
                Mapped::FusedDown { layer } => items.push(Item::FusedDown {
                    layer,
                    hf: hf.into(),
                }),
                Mapped::OssGateUp { layer, bias } => {
                    for gate in [true, false] {
                        items.push(Item::OssHalf {
                            layer,
                            gate,
                            bias,
                            hf: hf.into(),
                        });
                    }
                }
                Mapped::OssDown { layer } => items.push(Item::OssDown {
                    layer,
                    hf: hf.into(),
                }),
                Mapped::DeltaQkvz { layer }
                | Mapped::DeltaBa { layer }
                | Mapped::GatedQ { layer } => {
                    let splits = match mapped {
                        Mapped::DeltaQkvz { .. } => [Split::Qkv, Split::Z],
                        Mapped::DeltaBa { .. } => [Split::Beta, Split::Alpha],
                        _ => [Split::Query, Split::QueryGate],
                    };
                    for split in splits {
                        items.push(Item::Split {
                            layer,
                            split,
                            hf: hf.into(),
                        });
                    }
                }
                Mapped::Conv1d { layer } => items.push(Item::Conv1d {
                    layer,
                    hf: hf.into(),
                }),
                Mapped::DecayRate { layer } => items.push(Item::DecayRate {
                    layer,
                    hf: hf.into(),
                }),
                Mapped::KvB { layer } => {
                    if c.mla.is_none() {
                        return Err(ConvertError::UnmappedTensor(hf.into()));
                    }
                    for key in [true, false] {
                        items.push(Item::KvBHalf {
                            layer,
                            key,
                            hf: hf.into(),
                        });
                    }
                }
            }
        }
        for ((layer, part), slots) in &stacks {
            if let Some(missing) = slots.iter().position(Option::is_none) {
                return Err(ConvertError::MissingTensor(format!(
                    "layer {layer} expert {missing} {part:?} projection"
                )));
            }
        }
        if !c.tie_embeddings && checkpoint.get("lm_head.weight").is_none() {
            return Err(ConvertError::MissingTensor(
                "lm_head.weight (tie_word_embeddings is false)".into(),
            ));
        }
        Ok(Plan {
            c,
            checkpoint,
            items,
            stacks,
        })
    }

    fn tensor(&self, hf: &str) -> Result<TensorRef<'a>, ConvertError> {
        self.checkpoint
            .get(hf)
            .ok_or_else(|| ConvertError::MissingTensor(hf.to_owned()))
    }

    fn expert_names(&self, layer: usize, part: ExpertPart) -> impl Iterator<Item = &String> {
        self.stacks
            .get(&(layer, part))
            .map(Vec::as_slice)
            .unwrap_or_default()
            .iter()
            .flatten()
    }

    /// Rope heads of a tensor whose rows llama.cpp permutes (Q and K of the llama family).
    fn permute_heads(&self, gguf: &str) -> Option<usize> {
        if !self.c.family.permutes_qk() {
            None
        } else {
            match TensorName::parse(gguf) {
                Some(TensorName::Layer {
                    role: TensorRole::AttnQ,
                    ..
                }) => Some(self.c.n_head),
                Some(TensorName::Layer {
                    role: TensorRole::AttnK,
                    ..
                }) => Some(self.c.n_kv_head),
                _ => None,
            }
        }
    }

    /// Whether `gguf` is a norm weight of a family of offset norms (Gemma, Qwen3-Next),
    /// which GGUF stores as the scale `1 + w` (as llama.cpp's converter writes it) rather
    /// than Hugging Face's offset `w`. Qwen3-Next's DeltaNet norm is a plain scale.
    fn offset_norm(&self, gguf: &str) -> bool {
        self.c.family.offset_norms()
            && match TensorName::parse(gguf) {
                Some(TensorName::Global(g)) => g == GlobalTensor::OutputNorm,
                Some(TensorName::Layer { role, kind, .. }) => {
                    kind == Kind::Weight && role.is_norm() && role != TensorRole::SsmNorm
                }
                None => false,
            }
    }

    /// The rows `split` takes, after checking `hf` has the grouped projection's shape.
    fn split_rows(&self, split: Split, hf: &str) -> Result<delta_net::Rows, ConvertError> {
        let s = self
            .c
            .delta_net
            .ok_or_else(|| ConvertError::UnmappedTensor(hf.into()))?;
        let rows = split.rows(s, self.c.n_head, self.c.head_dim);
        check_shape(
            hf,
            &self.tensor(hf)?,
            &[rows.blocks * rows.block_rows, self.c.d_model],
        )?;
        Ok(rows)
    }

    /// Name, stored type and shape of `item`, from the headers only; every check on dtypes
    /// and shapes happens here.
    pub fn describe(&self, item: &Item) -> Result<Described, ConvertError> {
        match item {
            Item::Plain { gguf, hf } => {
                let t = self.tensor(hf)?;
                let src = float_type(hf, &t)?;
                if let Some(n_head) = self.permute_heads(gguf) {
                    let rows = t.info.shape.first().copied().unwrap_or(0);
                    if rows != (n_head * self.c.head_dim) as u64 {
                        return Err(ConvertError::BadTensor {
                            tensor: hf.clone(),
                            reason: format!(
                                "{rows} rows, expected {n_head} heads of {}",
                                self.c.head_dim
                            ),
                        });
                    }
                }
                Ok(Described {
                    gguf: gguf.clone(),
                    // `1 + w` is computed, so it is held in f32 whatever the stored type.
                    src: if self.offset_norm(gguf) {
                        GgmlType::F32
                    } else {
                        src
                    },
                    shape: self.stored_shape(gguf, &t.info.shape),
                })
            }
            Item::Stack { layer, part } => {
                let mut first: Option<(GgmlType, Vec<u64>)> = None;
                let mut n = 0u64;
                for hf in self.expert_names(*layer, *part) {
                    let t = self.tensor(hf)?;
                    let ty = float_type(hf, &t)?;
                    let (src, shape) = first.get_or_insert_with(|| (ty, t.info.shape.clone()));
                    if *src != ty || *shape != t.info.shape || shape.len() != 2 {
                        return Err(ConvertError::BadTensor {
                            tensor: hf.clone(),
                            reason:
                                "experts of one layer differ in dtype or shape, or are not matrices"
                                    .into(),
                        });
                    }
                    n += 1;
                }
                let Some((src, shape)) = first else {
                    return Err(ConvertError::MissingTensor(part.gguf_name(*layer)));
                };
                Ok(Described {
                    gguf: part.gguf_name(*layer),
                    src,
                    shape: [vec![n], shape].concat(),
                })
            }
            Item::FusedHalf { layer, gate, hf } => {
                let t = self.tensor(hf)?;
                let src = float_type(hf, &t)?;
                let &[e, two_ff, d] = t.info.shape.as_slice() else {
                    return Err(fused_shape(hf));
                };
                if two_ff % 2 != 0 {
                    return Err(fused_shape(hf));
                }
                let part = if *gate {
                    ExpertPart::Gate
                } else {
                    ExpertPart::Up
                };
                Ok(Described {
                    gguf: part.gguf_name(*layer),
                    src,
                    shape: vec![e, two_ff / 2, d],
                })
            }
            Item::OssHalf {
                layer,
                gate,
                bias,
                hf,
            } => {
                let t = self.tensor(hf)?;
                let src = float_type(hf, &t)?;
                let (e, d, ff) = (self.n_experts(), self.c.d_model, self.c.d_ff);
                let (want, shape) = if *bias {
                    (vec![e, 2 * ff], vec![e, ff])
                } else {
                    (vec![e, d, 2 * ff], vec![e, ff, d])
                };
                check_shape(hf, &t, &want)?;
                let part = if *gate {
                    ExpertPart::Gate
                } else {
                    ExpertPart::Up
                };
                Ok(Described {
                    gguf: if *bias {
                        part.role().bias(*layer)
                    } else {
                        part.gguf_name(*layer)
                    },
                    src,
                    shape: shape.iter().map(|&n| n as u64).collect(),
                })
            }
            Item::OssDown { layer, hf } => {
                let t = self.tensor(hf)?;
                let src = float_type(hf, &t)?;
                let (e, d, ff) = (self.n_experts(), self.c.d_model, self.c.d_ff);
                check_shape(hf, &t, &[e, ff, d])?;
                Ok(Described {
                    gguf: ExpertPart::Down.gguf_name(*layer),
                    src,
                    shape: [e, d, ff].map(|n| n as u64).to_vec(),
                })
            }
            Item::KvBHalf { layer, key, hf } => {
                let t = self.tensor(hf)?;
                let src = float_type(hf, &t)?;
                let (nh, (nope, v, rank)) = (self.c.n_head, self.kv_b_dims());
                if t.info.shape != [(nh * (nope + v)) as u64, rank as u64] {
                    return Err(ConvertError::BadTensor {
                        tensor: hf.clone(),
                        reason: format!(
                            "shape {:?}, expected [{nh} heads × ({nope} + {v}), {rank}]",
                            t.info.shape
                        ),
                    });
                }
                let (role, shape) = if *key {
                    (TensorRole::AttnKB, [nh, rank, nope])
                } else {
                    (TensorRole::AttnVB, [nh, v, rank])
                };
                Ok(Described {
                    gguf: role.weight(*layer),
                    src,
                    shape: shape.map(|n| n as u64).to_vec(),
                })
            }
            Item::Split { layer, split, hf } => {
                let rows = self.split_rows(*split, hf)?;
                Ok(Described {
                    gguf: split.role().weight(*layer),
                    src: float_type(hf, &self.tensor(hf)?)?,
                    shape: vec![rows.len() as u64, self.c.d_model as u64],
                })
            }
            Item::Conv1d { layer, hf } => {
                let t = self.tensor(hf)?;
                let &[channels, 1, kernel] = t.info.shape.as_slice() else {
                    return Err(ConvertError::BadTensor {
                        tensor: hf.clone(),
                        reason: format!("shape {:?}, expected [channels, 1, kernel]", t.info.shape),
                    });
                };
                Ok(Described {
                    gguf: TensorRole::SsmConv1d.weight(*layer),
                    src: float_type(hf, &t)?,
                    shape: vec![channels, kernel],
                })
            }
            Item::DecayRate { layer, hf } => {
                let t = self.tensor(hf)?;
                float_type(hf, &t)?;
                let gguf = TensorRole::SsmA.bare(*layer);
                Ok(Described {
                    shape: self.stored_shape(&gguf, &t.info.shape),
                    gguf,
                    src: GgmlType::F32,
                })
            }
            Item::FusedDown { layer, hf } => {
                let t = self.tensor(hf)?;
                let src = float_type(hf, &t)?;
                if t.info.shape.len() != 3 {
                    return Err(fused_shape(hf));
                }
                Ok(Described {
                    gguf: ExpertPart::Down.gguf_name(*layer),
                    src,
                    shape: t.info.shape.clone(),
                })
            }
        }
    }

    /// The stored-type bytes of `item` (described as `d`), in GGUF layout: borrowed from the
    /// mapped file when nothing moves.
    pub fn bytes(&self, item: &Item, d: &Described) -> Result<Cow<'a, [u8]>, ConvertError> {
        Ok(match item {
            Item::Plain { gguf, hf } if self.offset_norm(gguf) => {
                let t = self.tensor(hf)?;
                let src = float_type(hf, &t)?;
                Cow::Owned(tensors::plus_one(gguf, src, t.data)?)
            }
            Item::Plain { gguf, hf } => {
                let data = self.tensor(hf)?.data;
                match self.permute_heads(gguf) {
                    None => Cow::Borrowed(data),
                    Some(n_head) => {
                        let rows = d.shape.first().copied().unwrap_or(0) as usize;
                        Cow::Owned(tensors::permute_rows(data, rows, n_head))
                    }
                }
            }
            Item::Stack { layer, part } => {
                let mut data = Vec::new();
                for hf in self.expert_names(*layer, *part) {
                    data.extend_from_slice(self.tensor(hf)?.data);
                }
                Cow::Owned(data)
            }
            Item::FusedHalf { gate, hf, .. } => {
                let (e, ff) = (d.shape[0] as usize, d.shape[1] as usize);
                let (from, to) = if *gate { (0, ff) } else { (ff, 2 * ff) };
                Cow::Owned(tensors::slice_rows_per_block(
                    self.tensor(hf)?.data,
                    e,
                    2 * ff,
                    from,
                    to,
                ))
            }
            Item::FusedDown { hf, .. } | Item::Conv1d { hf, .. } => {
                Cow::Borrowed(self.tensor(hf)?.data)
            }
            Item::Split { split, hf, .. } => Cow::Owned(delta_net::take_rows(
                self.tensor(hf)?.data,
                &self.split_rows(*split, hf)?,
            )),
            Item::DecayRate { hf, .. } => {
                let t = self.tensor(hf)?;
                Cow::Owned(tensors::map_values(
                    &d.gguf,
                    float_type(hf, &t)?,
                    t.data,
                    |a| -a.exp(),
                )?)
            }
            Item::OssHalf { gate, bias, hf, .. } => {
                let (e, ff) = (self.n_experts(), self.c.d_ff);
                let rows = if *bias { 1 } else { self.c.d_model };
                Cow::Owned(tensors::transposed_columns(
                    self.tensor(hf)?.data,
                    (e, rows, 2 * ff),
                    usize::from(!*gate),
                    d.src.type_size() as usize,
                ))
            }
            Item::OssDown { hf, .. } => Cow::Owned(tensors::transpose_blocks(
                self.tensor(hf)?.data,
                self.n_experts(),
                self.c.d_ff,
                d.src.type_size() as usize,
            )),
            Item::KvBHalf { key, hf, .. } => {
                let (nh, (nope, v, _)) = (self.c.n_head, self.kv_b_dims());
                let data = self.tensor(hf)?.data;
                if *key {
                    let rows = tensors::slice_rows_per_block(data, nh, nope + v, 0, nope);
                    Cow::Owned(tensors::transpose_blocks(
                        &rows,
                        nh,
                        nope,
                        d.src.type_size() as usize,
                    ))
                } else {
                    Cow::Owned(tensors::slice_rows_per_block(
                        data,
                        nh,
                        nope + v,
                        nope,
                        nope + v,
                    ))
                }
            }
        })
    }

    /// The shape `gguf` is stored in, for checkpoint shape `shape` (a Mamba-2 hybrid's
    /// per-head and per-group vectors are reshaped; the data stays as it is).
    fn stored_shape(&self, gguf: &str, shape: &[u64]) -> Vec<u64> {
        match &self.c.mamba2 {
            Some(h) => h.stored_shape(gguf, shape),
            None => shape.to_vec(),
        }
    }

    /// Experts per layer (0 for a dense model).
    fn n_experts(&self) -> usize {
        self.c.experts.map_or(0, |e| e.count)
    }

    /// `(qk_nope_head_dim, v_head_dim, kv_lora_rank)` of a latent-attention model.
    fn kv_b_dims(&self) -> (usize, usize, usize) {
        self.c
            .mla
            .map_or((0, 0, 0), |m| (m.nope_dim, m.v_dim, m.kv_lora_rank))
    }
}

fn float_type(hf: &str, t: &TensorRef<'_>) -> Result<GgmlType, ConvertError> {
    tensors::ggml_of(t.info.dtype).ok_or_else(|| ConvertError::BadTensor {
        tensor: hf.to_owned(),
        reason: format!(
            "dtype {} (only F32, F16 and BF16 weights convert)",
            t.info.dtype
        ),
    })
}

/// Refuses tensor `hf` unless its shape is `want`.
fn check_shape(hf: &str, t: &TensorRef<'_>, want: &[usize]) -> Result<(), ConvertError> {
    if t.info
        .shape
        .iter()
        .map(|&n| n as usize)
        .eq(want.iter().copied())
    {
        Ok(())
    } else {
        Err(ConvertError::BadTensor {
            tensor: hf.to_owned(),
            reason: format!("shape {:?}, expected {want:?}", t.info.shape),
        })
    }
}

fn fused_shape(hf: &str) -> ConvertError {
    ConvertError::BadTensor {
        tensor: hf.to_owned(),
        reason: "fused expert tensor must be [experts, 2·ff, d] (gate_up) or 3-D (down)".into(),
    }
}
