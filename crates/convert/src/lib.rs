//! ferrite-convert: turns a Hugging Face model directory (`config.json`, `*.safetensors`,
//! `tokenizer.json` or `tokenizer.model`, `tokenizer_config.json`) into a GGUF file.
//!
//! Key design choice: the GGUF written is the one llama.cpp's `convert_hf_to_gguf.py` writes
//! (architecture names, metadata keys, tensor names, the Q/K row permutation of the llama
//! family, stacked 3-D expert tensors, `rope_freqs.weight` for Llama 3 rope scaling,
//! `tokenizer.ggml.*`), so ferrite's loader and llama.cpp's read it the same way; the
//! conventions are listed in `docs/gguf-conventions.md`. Layout changes are row moves on
//! the stored bytes; tensors that neither move nor change type are borrowed from the
//! memory-mapped safetensors files, so [`OutType::Stored`] costs little more than the copy,
//! and [`HfModel::write_gguf`] produces one tensor at a time.
//!
//! ```no_run
//! use ferrite_convert::{HfModel, OutType};
//! let model = HfModel::open("path/to/hf_dir".as_ref())?;
//! let summary = model.write_gguf("out.gguf".as_ref(), OutType::F16, &mut |t| {
//!     eprintln!("{}/{} {}", t.index, t.total, t.name);
//! })?;
//! println!("{} tensors, {} weights", summary.n_tensors, summary.n_params);
//! # Ok::<(), ferrite_convert::ConvertError>(())
//! ```

#![deny(missing_docs)]

mod config;
mod delta_net;
mod error;
mod mamba2;
mod names;
mod plan;
mod spm;
mod tensors;
mod tokenizer;
mod write;

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use ferrite_arch::{ARCHITECTURE_KEY, Arch};
use ferrite_gguf::{GgmlType, GgufWriter, Value};
use ferrite_safetensors::Checkpoint;

pub use config::{Experts, Family, HfConfig, Llama3Rope, LongRope, SlidingWindow, Yarn};
pub use error::ConvertError;
pub use mamba2::Mamba2Hybrid;
use plan::{Described, Plan};

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

/// Checks that the embedding has `vocab_size` rows.
fn check_vocab(config: &HfConfig, checkpoint: &Checkpoint) -> Result<(), ConvertError> {
    let name = names::embedding(config.family);
    let Some(embed) = checkpoint.get(name) else {
        return Err(ConvertError::MissingTensor(name.into()));
    };
    match embed.info.shape.first() {
        Some(&rows) if rows == config.n_vocab as u64 => Ok(()),
        _ => Err(ConvertError::BadConfig {
            key: "vocab_size".into(),
            reason: format!(
                "{} tokens, but {name} has shape {:?} (one row per token)",
                config.n_vocab, embed.info.shape
            ),
        }),
    }
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
        // The token table is padded to `vocab_size`, so the claim is checked against the
        // weights before anything is sized by it.
        let mut checkpoint = Checkpoint::open_dir(dir)?;
        if config.multimodal {
            checkpoint = checkpoint.renamed(names::text_model_name)?;
        }
        check_vocab(&config, &checkpoint)?;
        let tokenizer = tokenizer::metadata(
            dir,
            &map,
            config.n_vocab,
            config.family.arch() == Arch::Llama,
            // llama.cpp's Qwen3-MoE converter reads only tokenizer.json.
            config.family != Family::Qwen3Moe,
        )?;
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
    /// Tensors that are not re-encoded or moved borrow from the mapped checkpoint, the
    /// others are held until the writer is dropped ([`HfModel::write_gguf`] streams instead).
    pub fn to_gguf(
        &self,
        out: OutType,
        progress: &mut dyn FnMut(TensorDone<'_>),
    ) -> Result<(GgufWriter<'_>, Summary), ConvertError> {
        let layout = self.layout(out)?;
        let mut w = GgufWriter::new();
        for (k, v) in &layout.metadata {
            w.add_metadata(k.clone(), v.clone())?;
        }
        let mut summary = layout.summary();
        for t in &layout.tensors {
            let data = layout.data(t)?;
            summary.record(t, layout.tensors.len(), progress);
            w.add_tensor(t.name.clone(), t.ty, &t.dims, data)?;
        }
        Ok((w, summary))
    }

    /// Converts into the file `out_path`, producing and writing one tensor at a time, so
    /// memory holds at most one re-encoded tensor; returns the summary. The file's bytes are
    /// those [`HfModel::to_gguf`] would give. The file is written atomically
    /// (`ferrite_files::write_atomic`): a failed or killed conversion leaves no partial
    /// model under `out_path`.
    pub fn write_gguf(
        &self,
        out_path: &Path,
        out: OutType,
        progress: &mut dyn FnMut(TensorDone<'_>),
    ) -> Result<Summary, ConvertError> {
        let layout = self.layout(out)?;
        let mut summary = layout.summary();
        ferrite_files::write_atomic(out_path, |w| {
            write::stream(&layout, w, out_path, &mut summary, progress)
        })?;
        Ok(summary)
    }

    /// Everything about the output except the tensor bytes.
    fn layout(&self, out: OutType) -> Result<Layout<'_>, ConvertError> {
        let plan = Plan::new(&self.config, &self.checkpoint)?;
        let c = &self.config;
        let arch = c.family.gguf_arch();
        let mut tensors = Vec::with_capacity(plan.items.len() + 1);
        for (t, f) in c.rope_tensors() {
            tensors.push(OutTensor {
                name: t.name().into(),
                ty: GgmlType::F32,
                dims: vec![f.len() as u64],
                n_bytes: 4 * f.len() as u64,
                source: Source::Computed(f.iter().flat_map(|x| x.to_le_bytes()).collect()),
            });
        }
        let mut first_matrix = None;
        for (i, item) in plan.items.iter().enumerate() {
            let d = plan.describe(item)?;
            if d.shape.len() >= 2 {
                first_matrix.get_or_insert(d.src);
            }
            let ty = tensors::target_type(&d.gguf, &d.shape, out, d.src);
            // GGUF lists dimensions innermost first: the reverse of PyTorch's shape.
            let mut dims: Vec<u64> = d.shape.iter().rev().copied().collect();
            if dims.is_empty() {
                dims.push(1);
            }
            let n_bytes = tensor_bytes(ty, &dims).ok_or_else(|| ConvertError::BadTensor {
                tensor: d.gguf.clone(),
                reason: format!("shape {dims:?} does not fit whole {ty:?} blocks"),
            })?;
            tensors.push(OutTensor {
                name: d.gguf.clone(),
                ty,
                dims,
                n_bytes,
                source: Source::Item(i, d),
            });
        }
        // `general.file_type` as llama.cpp numbers it; `Stored` follows the first matrix.
        let file_type = match (out, first_matrix) {
            (OutType::F32, _) => 0,
            (OutType::F16, _) | (OutType::Stored, Some(GgmlType::F16)) => 1,
            (OutType::BF16, _) | (OutType::Stored, Some(GgmlType::BF16)) => 32,
            (OutType::Q8_0, _) => 7,
            (OutType::Stored, _) => 0,
        };
        let name = self
            .dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let mut metadata = vec![
            (ARCHITECTURE_KEY.to_owned(), Value::String(arch.into())),
            ("general.type".to_owned(), Value::String("model".into())),
            ("general.name".to_owned(), Value::String(name)),
        ];
        metadata.extend(c.metadata());
        metadata.push(("general.file_type".into(), Value::U32(file_type)));
        metadata.push(("general.quantization_version".into(), Value::U32(2)));
        metadata.extend(self.tokenizer.iter().cloned());
        Ok(Layout {
            arch,
            plan,
            metadata,
            tensors,
        })
    }
}

/// Bytes of a tensor of type `ty` with GGUF dims `dims`.
fn tensor_bytes(ty: GgmlType, dims: &[u64]) -> Option<u64> {
    let rows: u64 = dims
        .get(1..)?
        .iter()
        .try_fold(1u64, |a, &d| a.checked_mul(d))?;
    ty.row_bytes(*dims.first()?)?.checked_mul(rows)
}

/// Where an output tensor's bytes come from.
enum Source {
    /// Computed from the config (rope divisors).
    Computed(Vec<u8>),
    /// Plan item `.0`, described as `.1`.
    Item(usize, Described),
}

/// One tensor of the output file, before its bytes are produced.
struct OutTensor {
    name: String,
    ty: GgmlType,
    dims: Vec<u64>,
    n_bytes: u64,
    source: Source,
}

/// The whole output but the tensor bytes: metadata in order and the tensor table.
struct Layout<'a> {
    arch: &'static str,
    plan: Plan<'a>,
    metadata: Vec<(String, Value)>,
    tensors: Vec<OutTensor>,
}

impl<'a> Layout<'a> {
    /// The bytes of `t` in its output type.
    fn data(&self, t: &OutTensor) -> Result<Cow<'a, [u8]>, ConvertError> {
        let data = match &t.source {
            Source::Computed(bytes) => Cow::Owned(bytes.clone()),
            Source::Item(i, d) => {
                let bytes = self.plan.bytes(&self.plan.items[*i], d)?;
                tensors::encode(&t.name, d.src, bytes, t.ty)?
            }
        };
        if data.len() as u64 != t.n_bytes {
            return Err(ConvertError::BadTensor {
                tensor: t.name.clone(),
                reason: format!("produced {} bytes, expected {}", data.len(), t.n_bytes),
            });
        }
        Ok(data)
    }

    fn summary(&self) -> Summary {
        Summary {
            arch: self.arch.to_owned(),
            ..Summary::default()
        }
    }
}

impl Summary {
    /// Counts `t` and reports it to `progress`.
    fn record(&mut self, t: &OutTensor, total: usize, progress: &mut dyn FnMut(TensorDone<'_>)) {
        let entry = self.by_type.entry(t.ty).or_default();
        entry.0 += 1;
        entry.1 += t.n_bytes;
        self.n_tensors += 1;
        self.n_params += t.dims.iter().product::<u64>();
        progress(TensorDone {
            index: self.n_tensors,
            total,
            name: &t.name,
            ty: t.ty,
            dims: &t.dims,
        });
    }
}
