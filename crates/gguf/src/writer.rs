//! [`GgufWriter`]: builds a GGUF v3 file from metadata and tensors.
//!
//! Everything is checked as it is added (duplicate keys and names, homogeneous arrays,
//! nesting depth, tensor shapes and data lengths), with the same rules the reader enforces,
//! so anything the writer emits reads back. Tensor data is borrowed where possible
//! (`Cow`), so a converter can pass tensors straight from a memory-mapped source file.

use std::borrow::Cow;
use std::collections::HashSet;
use std::io::Write;
use std::path::Path;

use crate::parse::{
    ALIGNMENT_KEY, DEFAULT_ALIGNMENT, MAGIC, MAX_ARRAY_DEPTH, alignment_from_value,
};
use crate::tensor::{TensorInfo, checked_n_bytes};
use crate::{Array, GgmlType, GgufError, Value};

/// The format version the writer emits.
pub const WRITE_VERSION: u32 = 3;

/// Collects metadata and tensors, then writes them as one GGUF v3 file.
///
/// The alignment of tensor data is 32 unless a `general.alignment` entry is added, in which
/// case that value (a nonzero power of two) is used.
#[derive(Default)]
pub struct GgufWriter<'a> {
    metadata: Vec<(String, Value)>,
    keys: HashSet<String>,
    /// Infos with `offset` still 0: offsets depend on the final alignment.
    tensors: Vec<(TensorInfo, Cow<'a, [u8]>)>,
    names: HashSet<String>,
    alignment: Option<u64>,
}

impl std::fmt::Debug for GgufWriter<'_> {
    // Tensor bytes can be gigabytes; show the table, not the data.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufWriter")
            .field("alignment", &self.alignment())
            .field("metadata", &self.metadata)
            .field("tensors", &self.tensor_infos())
            .finish()
    }
}

impl<'a> GgufWriter<'a> {
    /// An empty writer.
    pub fn new() -> Self {
        Self::default()
    }

    /// Alignment the tensor data will be written with.
    pub fn alignment(&self) -> u64 {
        self.alignment.unwrap_or(DEFAULT_ALIGNMENT)
    }

    /// Appends a metadata entry. Fails on a duplicate key, an array mixing item types, arrays
    /// nested deeper than [`MAX_ARRAY_DEPTH`], or a bad `general.alignment`.
    pub fn add_metadata(
        &mut self,
        key: impl Into<String>,
        value: Value,
    ) -> Result<&mut Self, GgufError> {
        let key = key.into();
        if self.keys.contains(&key) {
            return Err(GgufError::DuplicateKey { key, offset: 0 });
        }
        check_value(&key, &value, 0)?;
        if key == ALIGNMENT_KEY {
            self.alignment = Some(alignment_from_value(&value)?);
        }
        self.keys.insert(key.clone());
        self.metadata.push((key, value));
        Ok(self)
    }

    /// Appends a tensor. `dims` are in GGUF order (`dims[0]` is the row length); `data` must
    /// be exactly the bytes the type and shape need.
    pub fn add_tensor(
        &mut self,
        name: impl Into<String>,
        ty: GgmlType,
        dims: &[u64],
        data: impl Into<Cow<'a, [u8]>>,
    ) -> Result<&mut Self, GgufError> {
        let name = name.into();
        let data = data.into();
        if self.names.contains(&name) {
            return Err(GgufError::DuplicateTensor {
                tensor: name,
                offset: 0,
            });
        }
        let expected = checked_n_bytes(&name, ty, dims)?;
        if data.len() as u64 != expected {
            return Err(GgufError::TensorDataSize {
                tensor: name,
                expected,
                actual: data.len() as u64,
            });
        }
        self.names.insert(name.clone());
        let info = TensorInfo {
            name,
            ty,
            dims: dims.to_vec(),
            offset: 0,
            n_bytes: expected,
        };
        self.tensors.push((info, data));
        Ok(self)
    }

    /// The tensor table as it will be written (offsets relative to the data section).
    pub fn tensor_infos(&self) -> Vec<TensorInfo> {
        let alignment = self.alignment();
        let mut offset = 0u64;
        self.tensors
            .iter()
            .map(|(pending, _)| {
                let info = TensorInfo {
                    offset,
                    ..pending.clone()
                };
                offset = (offset + info.n_bytes).next_multiple_of(alignment);
                info
            })
            .collect()
    }

    /// Writes the file to `out`; returns the number of bytes written.
    pub fn write_to<W: Write>(&self, out: W) -> Result<u64, GgufError> {
        self.write_impl(out).map_err(|source| GgufError::Io {
            path: String::new(),
            source,
        })
    }

    /// The whole file as bytes.
    pub fn to_bytes(&self) -> Result<Vec<u8>, GgufError> {
        let mut out = Vec::new();
        self.write_to(&mut out)?;
        Ok(out)
    }

    /// Writes the file to `path`, replacing any file there.
    pub fn write_file(&self, path: &Path) -> Result<u64, GgufError> {
        let io = |source| GgufError::Io {
            path: path.display().to_string(),
            source,
        };
        let file = std::fs::File::create(path).map_err(io)?;
        let mut out = std::io::BufWriter::new(file);
        let n = self.write_impl(&mut out).map_err(io)?;
        out.flush().map_err(io)?;
        Ok(n)
    }

    fn write_impl<W: Write>(&self, mut out: W) -> std::io::Result<u64> {
        let alignment = self.alignment();
        let infos = self.tensor_infos();
        let mut head = Vec::new();
        head.extend_from_slice(&MAGIC);
        head.extend_from_slice(&WRITE_VERSION.to_le_bytes());
        head.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        head.extend_from_slice(&(self.metadata.len() as u64).to_le_bytes());
        for (key, value) in &self.metadata {
            put_string(&mut head, key);
            head.extend_from_slice(&value.type_id().to_le_bytes());
            put_value(&mut head, value);
        }
        for info in &infos {
            put_string(&mut head, &info.name);
            head.extend_from_slice(&(info.dims.len() as u32).to_le_bytes());
            for d in &info.dims {
                head.extend_from_slice(&d.to_le_bytes());
            }
            head.extend_from_slice(&info.ty.id().to_le_bytes());
            head.extend_from_slice(&info.offset.to_le_bytes());
        }
        let data_offset = (head.len() as u64).next_multiple_of(alignment);
        out.write_all(&head)?;
        let mut pos = head.len() as u64;
        pad(&mut out, &mut pos, data_offset)?;
        for (info, (_, data)) in infos.iter().zip(&self.tensors) {
            pad(&mut out, &mut pos, data_offset + info.offset)?;
            out.write_all(data)?;
            pos += info.n_bytes;
        }
        // Pad the end too, so the file size is a multiple of the alignment as ggml's writer
        // leaves it.
        let end = pos.next_multiple_of(alignment);
        pad(&mut out, &mut pos, end)?;
        Ok(pos)
    }
}

/// Writes zeros until `*pos == target`.
fn pad<W: Write>(out: &mut W, pos: &mut u64, target: u64) -> std::io::Result<()> {
    const ZEROS: [u8; 4096] = [0; 4096];
    while *pos < target {
        let n = (target - *pos).min(ZEROS.len() as u64);
        out.write_all(&ZEROS[..n as usize])?;
        *pos += n;
    }
    Ok(())
}

fn put_string(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

fn put_value(out: &mut Vec<u8>, value: &Value) {
    match value {
        Value::U8(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::I8(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::U16(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::I16(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::U32(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::I32(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::F32(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::Bool(v) => out.push(u8::from(*v)),
        Value::String(s) => put_string(out, s),
        Value::Array(items) => put_array(out, items),
        Value::U64(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::I64(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::F64(v) => out.extend_from_slice(&v.to_le_bytes()),
    }
}

fn put_array(out: &mut Vec<u8>, array: &Array) {
    fn each<T: Copy, const N: usize>(out: &mut Vec<u8>, items: &[T], le: fn(T) -> [u8; N]) {
        for &item in items {
            out.extend_from_slice(&le(item));
        }
    }
    out.extend_from_slice(&array.elem_type_id().to_le_bytes());
    out.extend_from_slice(&(array.len() as u64).to_le_bytes());
    match array {
        Array::U8(v) => out.extend_from_slice(v),
        Array::I8(v) => each(out, v, i8::to_le_bytes),
        Array::U16(v) => each(out, v, u16::to_le_bytes),
        Array::I16(v) => each(out, v, i16::to_le_bytes),
        Array::U32(v) => each(out, v, u32::to_le_bytes),
        Array::I32(v) => each(out, v, i32::to_le_bytes),
        Array::F32(v) => each(out, v, f32::to_le_bytes),
        Array::Bool(v) => out.extend(v.iter().map(|&b| u8::from(b))),
        Array::String(v) => v.iter().for_each(|s| put_string(out, s)),
        Array::Array(v) => v.iter().for_each(|a| put_array(out, a)),
        Array::U64(v) => each(out, v, u64::to_le_bytes),
        Array::I64(v) => each(out, v, i64::to_le_bytes),
        Array::F64(v) => each(out, v, f64::to_le_bytes),
    }
}

/// Checks that arrays in `value` nest no deeper than the reader accepts. `depth` counts
/// the arrays enclosing `value`.
fn check_value(key: &str, value: &Value, depth: usize) -> Result<(), GgufError> {
    match value {
        Value::Array(a) => check_array(key, a, depth),
        _ => Ok(()),
    }
}

fn check_array(key: &str, array: &Array, depth: usize) -> Result<(), GgufError> {
    if depth >= MAX_ARRAY_DEPTH {
        return Err(GgufError::NestingTooDeep {
            key: key.to_owned(),
            max: MAX_ARRAY_DEPTH,
            offset: 0,
        });
    }
    match array {
        Array::Array(items) => items
            .iter()
            .try_for_each(|a| check_array(key, a, depth + 1)),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Gguf;

    #[test]
    fn writes_what_the_reader_reads() {
        let mut w = GgufWriter::new();
        w.add_metadata("general.architecture", Value::String("llama".into()))
            .unwrap()
            .add_metadata("n", Value::U32(7))
            .unwrap();
        let f32s: Vec<u8> = (0..6u32).flat_map(|i| (i as f32).to_le_bytes()).collect();
        w.add_tensor("a", GgmlType::F32, &[3, 2], f32s.as_slice())
            .unwrap();
        w.add_tensor("b", GgmlType::Q8_0, &[32], vec![1u8; 34])
            .unwrap();
        let bytes = w.to_bytes().unwrap();
        assert_eq!(bytes.len() % 32, 0);
        let g = Gguf::from_bytes(bytes).unwrap();
        assert_eq!(g.version(), 3);
        assert_eq!(g.get_str("general.architecture").unwrap(), "llama");
        assert_eq!(g.tensors(), w.tensor_infos().as_slice());
        assert_eq!(g.tensor_data(g.tensor("a").unwrap()), f32s.as_slice());
        assert_eq!(g.tensor_data(g.tensor("b").unwrap()), &[1u8; 34][..]);
    }

    #[test]
    fn honours_general_alignment() {
        let mut w = GgufWriter::new();
        w.add_metadata(ALIGNMENT_KEY, Value::U32(64)).unwrap();
        w.add_tensor("a", GgmlType::F32, &[1], vec![0u8; 4])
            .unwrap();
        w.add_tensor("b", GgmlType::F32, &[1], vec![0u8; 4])
            .unwrap();
        let g = Gguf::from_bytes(w.to_bytes().unwrap()).unwrap();
        assert_eq!(g.alignment(), 64);
        assert_eq!(g.data_offset() % 64, 0);
        assert_eq!(g.tensor("b").unwrap().offset, 64);
    }

    #[test]
    fn refuses_what_the_reader_would_refuse() {
        let mut w = GgufWriter::new();
        w.add_metadata("k", Value::U8(1)).unwrap();
        assert!(matches!(
            w.add_metadata("k", Value::U8(2)).unwrap_err(),
            GgufError::DuplicateKey { .. }
        ));
        let mut deep = Array::U8(vec![]);
        for _ in 0..MAX_ARRAY_DEPTH {
            deep = Array::Array(vec![deep]);
        }
        let deep = Value::Array(deep);
        assert!(matches!(
            w.add_metadata("deep", deep).unwrap_err(),
            GgufError::NestingTooDeep { .. }
        ));
        assert!(matches!(
            w.add_metadata(ALIGNMENT_KEY, Value::U32(48)).unwrap_err(),
            GgufError::BadAlignment { .. }
        ));
        w.add_tensor("t", GgmlType::F32, &[2], vec![0u8; 8])
            .unwrap();
        assert!(matches!(
            w.add_tensor("t", GgmlType::F32, &[2], vec![0u8; 8])
                .unwrap_err(),
            GgufError::DuplicateTensor { .. }
        ));
        assert!(matches!(
            w.add_tensor("u", GgmlType::F32, &[2], vec![0u8; 7])
                .unwrap_err(),
            GgufError::TensorDataSize {
                expected: 8,
                actual: 7,
                ..
            }
        ));
        assert!(matches!(
            w.add_tensor("v", GgmlType::Q4_0, &[31], vec![])
                .unwrap_err(),
            GgufError::PartialBlock { .. }
        ));
    }
}
