//! [`Checkpoint`]: the tensors of a Hugging Face model directory, one file or many shards.
//!
//! A directory with `model.safetensors.index.json` is opened through the index: its
//! `weight_map` names, for each tensor, the shard file holding it. Every shard must be a
//! plain file name inside the directory and exist, and every tensor the index names must be
//! in the shard it names. Tensors a shard holds but the index does not name are not
//! exposed (transformers does not load them either). Without an index, every
//! `*.safetensors` file in the directory is opened and a name appearing twice is an error.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::{SafeTensors, SafetensorsError, TensorInfo};

/// The file name of a sharding index.
pub const INDEX_FILE: &str = "model.safetensors.index.json";

/// Largest index file read, in bytes (a real one is well under a megabyte).
const MAX_INDEX_LEN: u64 = 64 << 20;

/// An opened checkpoint: its shard files and where each tensor lives.
#[derive(Debug)]
pub struct Checkpoint {
    files: Vec<SafeTensors>,
    /// Tensor name → (file, index in that file's table), in a stable order.
    order: Vec<(String, usize, usize)>,
    lookup: HashMap<String, usize>,
}

/// One tensor of a checkpoint: its header entry and its bytes.
#[derive(Debug, Clone, Copy)]
pub struct TensorRef<'a> {
    /// The header entry.
    pub info: &'a TensorInfo,
    /// The data bytes (little-endian, row-major).
    pub data: &'a [u8],
}

impl Checkpoint {
    /// Opens the safetensors weights of the model directory `dir`.
    pub fn open_dir(dir: &Path) -> Result<Checkpoint, SafetensorsError> {
        let index = dir.join(INDEX_FILE);
        if index.is_file() {
            return Self::open_index(&index);
        }
        let io = |source| SafetensorsError::Io {
            path: dir.display().to_string(),
            source,
        };
        let mut paths: Vec<PathBuf> = std::fs::read_dir(dir)
            .map_err(io)?
            .map(|e| e.map(|e| e.path()))
            .collect::<Result<_, _>>()
            .map_err(io)?;
        paths.retain(|p| p.extension().is_some_and(|e| e == "safetensors") && p.is_file());
        paths.sort();
        if paths.is_empty() {
            return Err(SafetensorsError::NoWeights {
                dir: dir.display().to_string(),
            });
        }
        let files = paths
            .iter()
            .map(|p| SafeTensors::open(p))
            .collect::<Result<Vec<_>, _>>()?;
        Self::from_files(files)
    }

    /// Opens a checkpoint through its sharding index file.
    pub fn open_index(index: &Path) -> Result<Checkpoint, SafetensorsError> {
        let shown = index.display().to_string();
        let bad = |reason: String| SafetensorsError::BadIndex {
            file: shown.clone(),
            reason,
        };
        let text = read_bounded(index)?;
        let json: Value = serde_json::from_str(&text).map_err(|e| bad(e.to_string()))?;
        let Some(Value::Object(map)) = json.get("weight_map") else {
            return Err(bad("no weight_map object".into()));
        };
        let dir = index.parent().unwrap_or(Path::new("."));
        let mut shard_ids: HashMap<&str, usize> = HashMap::new();
        let mut files: Vec<SafeTensors> = Vec::new();
        let mut order = Vec::with_capacity(map.len());
        let mut lookup = HashMap::with_capacity(map.len());
        for (tensor, shard) in map {
            let Some(shard) = shard.as_str() else {
                return Err(bad(format!("weight_map entry {tensor:?} is not a string")));
            };
            let file_id = match shard_ids.get(shard) {
                Some(&id) => id,
                None => {
                    if !is_plain_file_name(shard) {
                        return Err(bad(format!(
                            "shard {shard:?} is not a file name in the index's directory"
                        )));
                    }
                    let path = dir.join(shard);
                    if !path.is_file() {
                        return Err(SafetensorsError::MissingShard {
                            index: shown.clone(),
                            shard: shard.to_owned(),
                            tensor: tensor.clone(),
                        });
                    }
                    files.push(SafeTensors::open(&path)?);
                    shard_ids.insert(shard, files.len() - 1);
                    files.len() - 1
                }
            };
            let Some(pos) = files[file_id]
                .tensors()
                .iter()
                .position(|t| t.name == *tensor)
            else {
                return Err(SafetensorsError::MissingTensor {
                    index: shown.clone(),
                    tensor: tensor.clone(),
                    shard: shard.to_owned(),
                });
            };
            lookup.insert(tensor.clone(), order.len());
            order.push((tensor.clone(), file_id, pos));
        }
        Ok(Checkpoint {
            files,
            order,
            lookup,
        })
    }

    /// A checkpoint made of already opened files (no index): names must be unique.
    pub fn from_files(files: Vec<SafeTensors>) -> Result<Checkpoint, SafetensorsError> {
        let mut order: Vec<(String, usize, usize)> = Vec::new();
        let mut lookup: HashMap<String, usize> = HashMap::new();
        for (f, file) in files.iter().enumerate() {
            for (i, t) in file.tensors().iter().enumerate() {
                if let Some(&prev) = lookup.get(&t.name) {
                    return Err(SafetensorsError::DuplicateTensor {
                        tensor: t.name.clone(),
                        first: files[order[prev].1].name().to_owned(),
                        second: file.name().to_owned(),
                    });
                }
                lookup.insert(t.name.clone(), order.len());
                order.push((t.name.clone(), f, i));
            }
        }
        Ok(Checkpoint {
            files,
            order,
            lookup,
        })
    }

    /// Tensor names: index order when opened through an index, else file then header order.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.order.iter().map(|(n, _, _)| n.as_str())
    }

    /// Number of tensors.
    pub fn len(&self) -> usize {
        self.order.len()
    }

    /// Whether the checkpoint holds no tensor.
    pub fn is_empty(&self) -> bool {
        self.order.is_empty()
    }

    /// The tensor called `name`.
    pub fn get(&self, name: &str) -> Option<TensorRef<'_>> {
        let &k = self.lookup.get(name)?;
        let (_, f, i) = &self.order[k];
        let file = &self.files[*f];
        let info = &file.tensors()[*i];
        Some(TensorRef {
            info,
            data: file.data(info),
        })
    }

    /// The same checkpoint with each tensor under the name `rename` gives it, and without
    /// those it gives none (the text model of a multimodal checkpoint, under a text model's
    /// names). Two tensors given one name are an error.
    pub fn renamed(
        self,
        rename: impl Fn(&str) -> Option<String>,
    ) -> Result<Checkpoint, SafetensorsError> {
        let mut order = Vec::new();
        let mut lookup: HashMap<String, usize> = HashMap::new();
        // The original name of each kept tensor, for the error naming both.
        let mut from: Vec<&String> = Vec::new();
        for (name, f, i) in &self.order {
            let Some(new) = rename(name) else {
                continue;
            };
            if let Some(&prev) = lookup.get(&new) {
                return Err(SafetensorsError::DuplicateTensor {
                    tensor: new,
                    first: from[prev].clone(),
                    second: name.clone(),
                });
            }
            lookup.insert(new.clone(), order.len());
            order.push((new, *f, *i));
            from.push(name);
        }
        Ok(Checkpoint {
            files: self.files,
            order,
            lookup,
        })
    }

    /// The opened files.
    pub fn files(&self) -> &[SafeTensors] {
        &self.files
    }
}

/// A shard name must not reach outside the index's directory.
fn is_plain_file_name(name: &str) -> bool {
    let p = Path::new(name);
    let mut parts = p.components();
    matches!(
        (parts.next(), parts.next()),
        (Some(std::path::Component::Normal(_)), None)
    )
}

fn read_bounded(path: &Path) -> Result<String, SafetensorsError> {
    use std::io::Read;
    let shown = path.display().to_string();
    let io = |source| SafetensorsError::Io {
        path: shown.clone(),
        source,
    };
    let file = std::fs::File::open(path).map_err(io)?;
    let mut text = String::new();
    file.take(MAX_INDEX_LEN + 1)
        .read_to_string(&mut text)
        .map_err(io)?;
    if text.len() as u64 > MAX_INDEX_LEN {
        return Err(SafetensorsError::BadIndex {
            file: shown,
            reason: format!("larger than {MAX_INDEX_LEN} bytes"),
        });
    }
    Ok(text)
}
