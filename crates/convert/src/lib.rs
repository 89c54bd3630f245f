//! ferrite-convert: turns a Hugging Face model directory (`config.json`, `*.safetensors`,
//! `tokenizer.json`, `tokenizer_config.json`) into a GGUF file.
//!
//! Key design choice: the GGUF written is the one llama.cpp's `convert_hf_to_gguf.py` writes
//! (architecture names, metadata keys, tensor names, the Q/K row permutation of the llama
//! family, stacked 3-D expert tensors, `rope_freqs.weight` for Llama 3 rope scaling,
//! `tokenizer.ggml.*`), so ferrite's loader and llama.cpp's read it the same way; the
//! conventions are listed in `docs/gguf-conventions.md`. Layout changes are row moves on
//! the stored bytes; tensors that neither move nor change type are borrowed from the
//! memory-mapped safetensors files, so [`OutType::Stored`] costs little more than the copy.
//!
//! ```no_run
//! use ferrite_convert::{HfModel, OutType};
//! let model = HfModel::open("path/to/hf_dir".as_ref())?;
//! let (writer, summary) = model.to_gguf(OutType::F16, &mut |_| {})?;
//! writer.write_file("out.gguf".as_ref())?;
//! println!("{} tensors", summary.n_tensors);
//! # Ok::<(), ferrite_convert::ConvertError>(())
//! ```

#![deny(missing_docs)]

mod config;
mod error;
mod names;
mod spm;
mod tensors;
mod tokenizer;

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use ferrite_gguf::{GgmlType, GgufWriter, Value};
use ferrite_safetensors::{Checkpoint, Dtype, TensorRef};

pub use config::{Experts, Family, HfConfig, Llama3Rope, SlidingWindow};
pub use error::ConvertError;
use names::{ExpertPart, Mapped};

/// The tensor type of the GGUF written (vectors, norms, biases and routers are F32 in every
/// case, as llama.cpp's converter does).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutType {
    /// Matrices as f32 (`general.file_type` 0).
    F32,
    /// Matrices as IEEE half (1).
    F16,
    /// Matrices as bfloat16 (32).
    BF16,
    /// Matrices as Q8_0, F16 where a row is not a whole number of blocks (7).
    Q8_0,
    /// Matrices keep their stored float type (no rounding at all). Unlike llama.cpp's
    /// `auto`, which turns f32 checkpoints into f16.
    Stored,
}

impl OutType {
    /// Every type with its command-line name.
    pub const ALL: [(OutType, &'static str); 5] = [
        (OutType::F32, "f32"),
        (OutType::F16, "f16"),
        (OutType::BF16, "bf16"),
        (OutType::Q8_0, "q8_0"),
        (OutType::Stored, "stored"),
    ];

    /// Parses a command-line name (`f16`, `q8_0`, ...), case-insensitively.
    pub fn from_name(name: &str) -> Option<OutType> {
        let lower = name.to_ascii_lowercase();
        Self::ALL.iter().find(|(_, n)| *n == lower).map(|(t, _)| *t)
    }

    /// The command-line name.
    pub fn name(self) -> &'static str {
        Self::ALL
            .iter()
            .find(|(t, _)| *t == self)
            .map_or("?", |(_, n)| n)
    }
}

/// Progress of a conversion: sent once per tensor as it is prepared.
#[derive(Debug, Clone)]
pub struct TensorDone<'a> {
    /// Tensors prepared so far, this one included.
    pub index: usize,
    /// Tensors in the output.
    pub total: usize,
    /// GGUF name.
    pub name: &'a str,
    /// Type written.
    pub ty: GgmlType,
    /// GGUF dimensions (`dims[0]` is the row length).
    pub dims: &'a [u64],
}

/// What a conversion produced.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Summary {
    /// The GGUF architecture written.
    pub arch: String,
    /// Tensors written.
    pub n_tensors: usize,
    /// Weights written (elements over all tensors).
    pub n_params: u64,
    /// Per tensor type: number of tensors and data bytes.
    pub by_type: BTreeMap<GgmlType, (usize, u64)>,
}

/// An opened Hugging Face model directory, ready to convert.
#[derive(Debug)]
pub struct HfModel {
    dir: PathBuf,
    config: HfConfig,
    checkpoint: Checkpoint,
    tokenizer: Vec<(String, Value)>,
}

/// Whether `path` looks like a Hugging Face model directory (a directory with
/// `config.json`).
pub fn is_hf_dir(path: &Path) -> bool {
    path.is_dir() && path.join("config.json").is_file()
}

/// One output tensor before its data is produced.
enum Item {
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
}

impl HfModel {
    /// Reads `config.json` and the tokenizer files and opens (and validates) the weights.
    pub fn open(dir: &Path) -> Result<HfModel, ConvertError> {
        let config_path = dir.join("config.json");
        let Some(config_json) = tokenizer::read_json(&config_path)? else {
            return Err(ConvertError::MissingFile {
                path: config_path.display().to_string(),
            });
        };
        let config = HfConfig::from_json(&config_json.to_string())?;
        let map = config_json.as_object().cloned().unwrap_or_default();
        let tokenizer = tokenizer::metadata(
            dir,
            &map,
            config.n_vocab,
            config.family.gguf_arch() == "llama",
            // llama.cpp's Qwen3-MoE converter reads only tokenizer.json.
            config.family != Family::Qwen3Moe,
        )?;
        let checkpoint = Checkpoint::open_dir(dir)?;
        Ok(HfModel {
            dir: dir.to_owned(),
            config,
            checkpoint,
            tokenizer,
        })
    }

    /// The parsed configuration.
    pub fn config(&self) -> &HfConfig {
        &self.config
    }

    /// The opened weights.
    pub fn checkpoint(&self) -> &Checkpoint {
        &self.checkpoint
    }

    /// Builds the GGUF (metadata and tensors) in memory; `progress` is called per tensor.
    /// Tensors that are not re-encoded or moved borrow from the mapped checkpoint.
    pub fn to_gguf(
        &self,
        out: OutType,
        progress: &mut dyn FnMut(TensorDone<'_>),
    ) -> Result<(GgufWriter<'_>, Summary), ConvertError> {
        let (items, stacks) = self.plan()?;
        let c = &self.config;
        let mut w = GgufWriter::new();
        let arch = c.family.gguf_arch();
        let name = self
            .dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        w.add_metadata("general.architecture", Value::String(arch.into()))?;
        w.add_metadata("general.type", Value::String("model".into()))?;
        w.add_metadata("general.name", Value::String(name))?;
        for (k, v) in c.metadata() {
            w.add_metadata(k, v)?;
        }
        w.add_metadata("general.file_type", Value::U32(self.file_type(out, &items)))?;
        w.add_metadata("general.quantization_version", Value::U32(2))?;
        for (k, v) in &self.tokenizer {
            w.add_metadata(k.clone(), v.clone())?;
        }
        let rope_freqs = c.rope_freqs();
        let mut summary = Summary {
            arch: arch.to_owned(),
            ..Summary::default()
        };
        let total = items.len() + usize::from(rope_freqs.is_some());
        let mut record = |gguf: &str, ty: GgmlType, dims: &[u64], n_bytes: usize| {
            let entry = summary.by_type.entry(ty).or_default();
            entry.0 += 1;
            entry.1 += n_bytes as u64;
            summary.n_tensors += 1;
            summary.n_params += dims.iter().product::<u64>();
            progress(TensorDone {
                index: summary.n_tensors,
                total,
                name: gguf,
                ty,
                dims,
            });
        };
        if let Some(f) = rope_freqs {
            let bytes: Vec<u8> = f.iter().flat_map(|x| x.to_le_bytes()).collect();
            let dims = [f.len() as u64];
            record("rope_freqs.weight", GgmlType::F32, &dims, bytes.len());
            w.add_tensor("rope_freqs.weight", GgmlType::F32, &dims, bytes)?;
        }
        for item in &items {
            let (gguf, src, shape, bytes) = self.materialize(item, &stacks)?;
            let target = tensors::target_type(&gguf, &shape, out, src);
            let data = tensors::encode(&gguf, src, bytes, target)?;
            // GGUF lists dimensions innermost first: the reverse of PyTorch's shape.
            let mut dims: Vec<u64> = shape.iter().rev().copied().collect();
            if dims.is_empty() {
                dims.push(1);
            }
            record(&gguf, target, &dims, data.len());
            w.add_tensor(gguf, target, &dims, data)?;
        }
        Ok((w, summary))
    }

    /// Converts and writes `out_path`; returns the summary.
    pub fn write_gguf(
        &self,
        out_path: &Path,
        out: OutType,
        progress: &mut dyn FnMut(TensorDone<'_>),
    ) -> Result<Summary, ConvertError> {
        let (w, summary) = self.to_gguf(out, progress)?;
        w.write_file(out_path)?;
        Ok(summary)
    }

    /// One output tensor: GGUF name, stored type, row-major shape and bytes.
    fn materialize<'s>(
        &'s self,
        item: &Item,
        stacks: &Stacks,
    ) -> Result<Prepared<'s>, ConvertError> {
        let c = &self.config;
        match item {
            Item::Plain { gguf, hf } => {
                let t = self.tensor(hf)?;
                let src = float_type(hf, &t)?;
                let shape = t.info.shape.clone();
                let heads = if !c.family.permutes_qk() {
                    None
                } else if is_blk_tensor(gguf, "attn_q") {
                    Some(c.n_head)
                } else if is_blk_tensor(gguf, "attn_k") {
                    Some(c.n_kv_head)
                } else {
                    None
                };
                let bytes = match heads {
                    None => Cow::Borrowed(t.data),
                    Some(n_head) => {
                        let rows = shape.first().copied().unwrap_or(0) as usize;
                        if rows != n_head * c.head_dim {
                            return Err(ConvertError::BadTensor {
                                tensor: hf.clone(),
                                reason: format!(
                                    "{rows} rows, expected {n_head} heads of {}",
                                    c.head_dim
                                ),
                            });
                        }
                        Cow::Owned(tensors::permute_rows(t.data, rows, n_head))
                    }
                };
                Ok((gguf.clone(), src, shape, bytes))
            }
            Item::Stack { layer, part } => {
                let names = stacks
                    .get(&(*layer, *part))
                    .map(Vec::as_slice)
                    .unwrap_or_default();
                let mut src = None;
                let mut shape: Option<Vec<u64>> = None;
                let mut data = Vec::new();
                for hf in names.iter().flatten() {
                    let t = self.tensor(hf)?;
                    let ty = float_type(hf, &t)?;
                    if *src.get_or_insert(ty) != ty
                        || *shape.get_or_insert_with(|| t.info.shape.clone()) != t.info.shape
                        || t.info.shape.len() != 2
                    {
                        return Err(ConvertError::BadTensor {
                            tensor: hf.clone(),
                            reason:
                                "experts of one layer differ in dtype or shape, or are not matrices"
                                    .into(),
                        });
                    }
                    data.extend_from_slice(t.data);
                }
                let (Some(src), Some(shape)) = (src, shape) else {
                    return Err(ConvertError::MissingTensor(part.gguf_name(*layer)));
                };
                let full = [vec![names.len() as u64], shape].concat();
                Ok((part.gguf_name(*layer), src, full, Cow::Owned(data)))
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
                let ff = two_ff / 2;
                let (from, to) = if *gate { (0, ff) } else { (ff, two_ff) };
                let data = tensors::slice_rows_per_block(
                    t.data,
                    e as usize,
                    two_ff as usize,
                    from as usize,
                    to as usize,
                );
                let part = if *gate {
                    ExpertPart::Gate
                } else {
                    ExpertPart::Up
                };
                Ok((
                    part.gguf_name(*layer),
                    src,
                    vec![e, ff, d],
                    Cow::Owned(data),
                ))
            }
            Item::FusedDown { layer, hf } => {
                let t = self.tensor(hf)?;
                let src = float_type(hf, &t)?;
                if t.info.shape.len() != 3 {
                    return Err(fused_shape(hf));
                }
                Ok((
                    ExpertPart::Down.gguf_name(*layer),
                    src,
                    t.info.shape.clone(),
                    Cow::Borrowed(t.data),
                ))
            }
        }
    }

    fn tensor(&self, hf: &str) -> Result<TensorRef<'_>, ConvertError> {
        self.checkpoint
            .get(hf)
            .ok_or_else(|| ConvertError::MissingTensor(hf.to_owned()))
    }

    /// `general.file_type` as llama.cpp numbers it; `Stored` follows the first matrix.
    fn file_type(&self, out: OutType, items: &[Item]) -> u32 {
        match out {
            OutType::F32 => 0,
            OutType::F16 => 1,
            OutType::BF16 => 32,
            OutType::Q8_0 => 7,
            OutType::Stored => {
                let first = items.iter().find_map(|i| match i {
                    Item::Plain { hf, .. } => self.checkpoint.get(hf),
                    _ => None,
                });
                match first.map(|t| t.info.dtype) {
                    Some(Dtype::F16) => 1,
                    Some(Dtype::BF16) => 32,
                    _ => 0,
                }
            }
        }
    }

    /// Maps every checkpoint tensor and checks the set is complete.
    fn plan(&self) -> Result<(Vec<Item>, Stacks), ConvertError> {
        let c = &self.config;
        let mut items = Vec::new();
        let mut stacks = Stacks::new();
        let n_experts = c.experts.map_or(0, |e| e.count);
        for hf in self.checkpoint.names() {
            let mapped = names::map(hf).ok_or_else(|| ConvertError::UnmappedTensor(hf.into()))?;
            let layer = hf
                .strip_prefix("model.layers.")
                .and_then(|r| r.split('.').next())
                .and_then(|l| l.parse::<usize>().ok());
            if layer.is_some_and(|l| l >= c.n_layer) {
                return Err(ConvertError::BadTensor {
                    tensor: hf.into(),
                    reason: format!("layer index beyond num_hidden_layers {}", c.n_layer),
                });
            }
            let expert_tensor = matches!(
                mapped,
                Mapped::Expert { .. } | Mapped::FusedGateUp { .. } | Mapped::FusedDown { .. }
            );
            if expert_tensor && n_experts == 0 {
                // Expert weights in a model whose config declares no experts.
                return Err(ConvertError::UnmappedTensor(hf.into()));
            }
            match mapped {
                Mapped::Skip => {}
                Mapped::Plain(gguf) => {
                    if gguf == "output.weight" && c.tie_embeddings {
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
            }
        }
        for ((layer, part), slots) in &stacks {
            if let Some(missing) = slots.iter().position(Option::is_none) {
                return Err(ConvertError::MissingTensor(format!(
                    "layer {layer} expert {missing} {part:?} projection"
                )));
            }
        }
        if self.checkpoint.get("model.embed_tokens.weight").is_none() {
            return Err(ConvertError::MissingTensor(
                "model.embed_tokens.weight".into(),
            ));
        }
        if !c.tie_embeddings && self.checkpoint.get("lm_head.weight").is_none() {
            return Err(ConvertError::MissingTensor(
                "lm_head.weight (tie_word_embeddings is false)".into(),
            ));
        }
        Ok((items, stacks))
    }
}

/// An output tensor before encoding: GGUF name, stored type, row-major shape, bytes.
type Prepared<'a> = (String, GgmlType, Vec<u64>, Cow<'a, [u8]>);

/// Per (layer, expert matrix): the checkpoint name of each expert's tensor.
type Stacks = BTreeMap<(usize, ExpertPart), Vec<Option<String>>>;

/// Whether `gguf` is `blk.N.<role>.weight` or `.bias`.
fn is_blk_tensor(gguf: &str, role: &str) -> bool {
    gguf.starts_with("blk.")
        && (gguf.ends_with(&format!(".{role}.weight")) || gguf.ends_with(&format!(".{role}.bias")))
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

fn fused_shape(hf: &str) -> ConvertError {
    ConvertError::BadTensor {
        tensor: hf.to_owned(),
        reason: "fused expert tensor must be [experts, 2·ff, d] (gate_up) or 3-D (down)".into(),
    }
}
