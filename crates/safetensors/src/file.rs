//! [`SafeTensors`]: one opened, fully validated `*.safetensors` file.
//!
//! Layout: a little-endian `u64` header length `n`, `n` bytes of UTF-8 JSON mapping each
//! tensor name to `{"dtype", "shape", "data_offsets": [begin, end]}` (plus an optional
//! `"__metadata__"` map of strings), then the data section, to which the offsets are
//! relative. Every check happens in [`SafeTensors::open`] / [`SafeTensors::from_bytes`]: the
//! header length is bounded before anything is allocated, every range must lie inside the
//! data section, hold exactly `shape × dtype` bytes, and share no byte with another range.
//! Gaps between ranges are allowed (the data is simply never read).

use std::collections::HashMap;
use std::path::Path;

use serde_json::Value;

use crate::{Dtype, SafetensorsError};

/// Largest header accepted, in bytes. The reference implementation uses the same bound; a
/// real header is a few hundred bytes per tensor.
pub const MAX_HEADER_LEN: u64 = 100_000_000;

/// Where the file's bytes live.
enum Storage {
    Mmap(memmap2::Mmap),
    Bytes(Vec<u8>),
}

/// One tensor's entry in a header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorInfo {
    /// The tensor's name, e.g. `model.layers.0.self_attn.q_proj.weight`.
    pub name: String,
    /// Element type.
    pub dtype: Dtype,
    /// Shape, outermost dimension first (row-major, as PyTorch writes it). May be empty (a
    /// scalar) or contain zeros (an empty tensor).
    pub shape: Vec<u64>,
    /// Byte range of the data, relative to the data section.
    pub begin: u64,
    /// End of the byte range (exclusive).
    pub end: u64,
}

impl TensorInfo {
    /// Number of elements (product of the shape; cannot overflow, checked on open).
    pub fn n_elements(&self) -> u64 {
        self.shape.iter().product()
    }
}

/// A validated safetensors file.
pub struct SafeTensors {
    name: String,
    storage: Storage,
    data_start: usize,
    tensors: Vec<TensorInfo>,
    index: HashMap<String, usize>,
    metadata: Vec<(String, String)>,
}

impl std::fmt::Debug for SafeTensors {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SafeTensors")
            .field("name", &self.name)
            .field("tensors", &self.tensors.len())
            .finish_non_exhaustive()
    }
}

impl SafeTensors {
    /// Memory-maps and validates the file at `path`.
    pub fn open(path: &Path) -> Result<SafeTensors, SafetensorsError> {
        let io = |source| SafetensorsError::Io {
            path: path.display().to_string(),
            source,
        };
        let file = std::fs::File::open(path).map_err(io)?;
        // SAFETY: the map is read-only and lives as long as `SafeTensors`. Undefined behaviour
        // is only possible if another process truncates or rewrites the file while it is
        // mapped; checkpoint files are treated as immutable while open, as every mmap-based
        // loader (and ferrite-gguf) does, and that cannot be prevented from inside this process.
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(io)?;
        Self::with_storage(path.display().to_string(), Storage::Mmap(map))
    }

    /// Validates a file held in memory; `name` is used in error messages.
    pub fn from_bytes(name: &str, bytes: Vec<u8>) -> Result<SafeTensors, SafetensorsError> {
        Self::with_storage(name.to_owned(), Storage::Bytes(bytes))
    }

    fn with_storage(name: String, storage: Storage) -> Result<SafeTensors, SafetensorsError> {
        let buf: &[u8] = match &storage {
            Storage::Mmap(m) => m,
            Storage::Bytes(b) => b,
        };
        let parsed = parse(&name, buf)?;
        Ok(SafeTensors {
            name,
            storage,
            data_start: parsed.data_start,
            index: parsed
                .tensors
                .iter()
                .enumerate()
                .map(|(i, t)| (t.name.clone(), i))
                .collect(),
            tensors: parsed.tensors,
            metadata: parsed.metadata,
        })
    }

    /// The name given on open (the path for [`SafeTensors::open`]).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Every tensor, in header order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    /// The tensor called `name`.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.index.get(name).map(|&i| &self.tensors[i])
    }

    /// The `__metadata__` entries, in header order.
    pub fn metadata(&self) -> &[(String, String)] {
        &self.metadata
    }

    /// The data bytes of `info`, which must come from this file's [`SafeTensors::tensors`]
    /// (an info from elsewhere gets an empty slice if its range is not inside this file).
    pub fn data(&self, info: &TensorInfo) -> &[u8] {
        let buf: &[u8] = match &self.storage {
            Storage::Mmap(m) => m,
            Storage::Bytes(b) => b,
        };
        let range = usize::try_from(info.begin)
            .ok()
            .zip(usize::try_from(info.end).ok())
            .and_then(|(b, e)| {
                Some(self.data_start.checked_add(b)?..self.data_start.checked_add(e)?)
            });
        range.and_then(|r| buf.get(r)).unwrap_or(&[])
    }
}

struct Parsed {
    data_start: usize,
    tensors: Vec<TensorInfo>,
    metadata: Vec<(String, String)>,
}

fn bad_header(file: &str, reason: impl Into<String>) -> SafetensorsError {
    SafetensorsError::BadHeader {
        file: file.to_owned(),
        reason: reason.into(),
    }
}

fn parse(file: &str, buf: &[u8]) -> Result<Parsed, SafetensorsError> {
    let len = buf.len() as u64;
    let Some((len_field, rest)) = buf.split_first_chunk::<8>() else {
        return Err(SafetensorsError::TooShort {
            file: file.to_owned(),
            len,
        });
    };
    let header_len = u64::from_le_bytes(*len_field);
    let available = rest.len() as u64;
    if header_len > available || header_len > MAX_HEADER_LEN {
        return Err(SafetensorsError::HeaderLength {
            file: file.to_owned(),
            header_len,
            available,
            limit: MAX_HEADER_LEN,
        });
    }
    // Both fit in usize: header_len <= rest.len().
    let (header, data) = rest.split_at(header_len as usize);
    let header =
        std::str::from_utf8(header).map_err(|e| bad_header(file, format!("not UTF-8: {e}")))?;
    let Entries(entries) =
        serde_json::from_str(header).map_err(|e| bad_header(file, e.to_string()))?;
    let mut seen = std::collections::HashSet::with_capacity(entries.len());
    if let Some((dup, _)) = entries.iter().find(|(k, _)| !seen.insert(k.as_str())) {
        return Err(SafetensorsError::DuplicateTensor {
            tensor: dup.clone(),
            first: file.to_owned(),
            second: file.to_owned(),
        });
    }
    let data_len = data.len() as u64;
    let mut tensors = Vec::with_capacity(entries.len());
    let mut metadata = Vec::new();
    for (name, entry) in entries {
        if name == "__metadata__" {
            metadata = parse_metadata(file, entry)?;
            continue;
        }
        let info = parse_entry(file, name, entry)?;
        check_range(file, &info, data_len)?;
        tensors.push(info);
    }
    check_disjoint(file, &tensors)?;
    Ok(Parsed {
        data_start: 8 + header_len as usize,
        tensors,
        metadata,
    })
}

/// The header's top-level entries in file order, duplicates kept (a plain JSON map would
/// silently keep only the last of two entries with the same name).
struct Entries(Vec<(String, Value)>);

impl<'de> serde::Deserialize<'de> for Entries {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visit;
        impl<'de> serde::de::Visitor<'de> for Visit {
            type Value = Entries;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<Entries, A::Error> {
                let mut out = Vec::new();
                while let Some(entry) = map.next_entry::<String, Value>()? {
                    out.push(entry);
                }
                Ok(Entries(out))
            }
        }
        d.deserialize_map(Visit)
    }
}

fn parse_metadata(file: &str, entry: Value) -> Result<Vec<(String, String)>, SafetensorsError> {
    let Value::Object(map) = entry else {
        return Err(bad_header(file, "__metadata__ is not an object"));
    };
    map.into_iter()
        .map(|(k, v)| match v {
            Value::String(s) => Ok((k, s)),
            _ => Err(bad_header(
                file,
                format!("__metadata__ value {k:?} is not a string"),
            )),
        })
        .collect()
}

fn parse_entry(file: &str, name: String, entry: Value) -> Result<TensorInfo, SafetensorsError> {
    let Value::Object(mut fields) = entry else {
        return Err(bad_header(
            file,
            format!("tensor {name:?} is not an object"),
        ));
    };
    let dtype_name = match fields.remove("dtype") {
        Some(Value::String(s)) => s,
        _ => {
            return Err(bad_header(
                file,
                format!("tensor {name:?}: dtype is missing or not a string"),
            ));
        }
    };
    let Some(dtype) = Dtype::from_name(&dtype_name) else {
        return Err(SafetensorsError::UnknownDtype {
            file: file.to_owned(),
            tensor: name,
            dtype: dtype_name,
        });
    };
    let shape = u64_array(fields.remove("shape")).ok_or_else(|| {
        bad_header(
            file,
            format!("tensor {name:?}: shape is not an array of integers"),
        )
    })?;
    let offsets = u64_array(fields.remove("data_offsets"));
    let Some([begin, end]) = offsets
        .as_deref()
        .and_then(|o| <[u64; 2]>::try_from(o).ok())
    else {
        return Err(bad_header(
            file,
            format!("tensor {name:?}: data_offsets is not two integers"),
        ));
    };
    if let Some(extra) = fields.keys().next() {
        return Err(bad_header(
            file,
            format!("tensor {name:?}: unknown field {extra:?}"),
        ));
    }
    let expected = shape
        .iter()
        .try_fold(dtype.size(), |acc, &d| acc.checked_mul(d))
        .unwrap_or(u64::MAX);
    let actual = end.wrapping_sub(begin);
    if end >= begin && expected != actual {
        return Err(SafetensorsError::SizeMismatch {
            file: file.to_owned(),
            tensor: name,
            dtype,
            shape,
            expected,
            actual,
        });
    }
    Ok(TensorInfo {
        name,
        dtype,
        shape,
        begin,
        end,
    })
}

/// The items of a JSON array of non-negative integers.
fn u64_array(v: Option<Value>) -> Option<Vec<u64>> {
    match v? {
        Value::Array(items) => items.iter().map(Value::as_u64).collect(),
        _ => None,
    }
}

fn check_range(file: &str, t: &TensorInfo, data_len: u64) -> Result<(), SafetensorsError> {
    if t.begin > t.end || t.end > data_len {
        return Err(SafetensorsError::OutOfBounds {
            file: file.to_owned(),
            tensor: t.name.clone(),
            begin: t.begin,
            end: t.end,
            data_len,
        });
    }
    Ok(())
}

/// No two non-empty ranges share a byte. Sorting by start makes it one pass.
fn check_disjoint(file: &str, tensors: &[TensorInfo]) -> Result<(), SafetensorsError> {
    let mut order: Vec<&TensorInfo> = tensors.iter().filter(|t| t.end > t.begin).collect();
    order.sort_by_key(|t| (t.begin, t.end));
    for pair in order.windows(2) {
        if pair[1].begin < pair[0].end {
            return Err(SafetensorsError::Overlap {
                file: file.to_owned(),
                first: pair[0].name.clone(),
                second: pair[1].name.clone(),
            });
        }
    }
    Ok(())
}
