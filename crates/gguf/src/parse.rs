//! Parsing a GGUF byte buffer into its header, metadata and tensor table.
//!
//! The design rule is that nothing is allocated that the file cannot back: every count
//! (metadata entries, tensors, array items) is checked against the bytes left divided by the
//! smallest encoding of one item, and every string length against the bytes left, before a
//! `Vec` or `String` is created. Memory use is therefore linear in the file size: arrays are
//! typed vectors (an item costs about its encoding), the worst ratio is a handful of bytes
//! per encoded byte for many tiny keys, and array nesting is capped so the stack is bounded
//! too.

use std::collections::HashMap;

use crate::tensor::{MAX_DIMS, TensorInfo, check_layout};
use crate::value::{min_encoded_size, type_id};
use crate::{Array, GgmlType, GgufError, Strings, Value};

/// The bytes every GGUF file starts with.
pub const MAGIC: [u8; 4] = *b"GGUF";

/// Alignment of tensor data when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;

/// The metadata key that sets the alignment.
pub const ALIGNMENT_KEY: &str = "general.alignment";

/// Deepest array nesting accepted (an array of arrays is depth 2). Real files use at most 2;
/// the cap keeps a small hostile file from recursing the parser off the stack.
pub const MAX_ARRAY_DEPTH: usize = 8;

/// What an array item is called in truncation errors.
const ARRAY_ITEM: &str = "array item";

/// Smallest encoding of one metadata entry: key length (8) + value type (4) + 1-byte value.
const MIN_KV_SIZE: u64 = 13;

/// Smallest encoding of one tensor info: name length (8), dimension count (4), one
/// dimension (8), type (4), offset (8).
const MIN_TENSOR_INFO_SIZE: u64 = 32;

/// Everything parsed from a file except the bytes themselves.
#[derive(Debug)]
pub(crate) struct Parsed {
    pub version: u32,
    pub alignment: u64,
    pub data_offset: u64,
    pub metadata: Vec<(String, Value)>,
    pub key_index: HashMap<String, usize>,
    pub tensors: Vec<TensorInfo>,
    pub tensor_index: HashMap<String, usize>,
}

/// A read position in the buffer; every read is bounds-checked and reports the offset.
struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn offset(&self) -> u64 {
        self.pos as u64
    }

    fn remaining(&self) -> u64 {
        (self.buf.len() - self.pos) as u64
    }

    fn take(&mut self, n: u64, what: &'static str) -> Result<&'a [u8], GgufError> {
        let truncated = || GgufError::Truncated {
            offset: self.offset(),
            what,
            needed: n,
            available: self.remaining(),
        };
        let n = usize::try_from(n).map_err(|_| truncated())?;
        let bytes = self
            .buf
            .get(self.pos..)
            .and_then(|rest| rest.get(..n))
            .ok_or_else(truncated)?;
        self.pos += n;
        Ok(bytes)
    }

    fn array<const N: usize>(&mut self, what: &'static str) -> Result<[u8; N], GgufError> {
        let bytes = self.take(N as u64, what)?;
        // `take` returned exactly N bytes.
        let mut out = [0u8; N];
        out.copy_from_slice(bytes);
        Ok(out)
    }

    fn u32(&mut self, what: &'static str) -> Result<u32, GgufError> {
        self.array(what).map(u32::from_le_bytes)
    }

    fn u64(&mut self, what: &'static str) -> Result<u64, GgufError> {
        self.array(what).map(u64::from_le_bytes)
    }

    /// Reads a count and checks that the rest of the file could hold that many items of at
    /// least `min_item` bytes each.
    fn count(&mut self, what: &'static str, min_item: u64) -> Result<usize, GgufError> {
        let offset = self.offset();
        let count = self.u64(what)?;
        check_count(what, count, offset, self.remaining(), min_item)
    }

    fn string(&mut self, what: &'static str) -> Result<String, GgufError> {
        self.str(what).map(str::to_owned)
    }

    /// A length-prefixed UTF-8 string, borrowed from the buffer.
    fn str(&mut self, what: &'static str) -> Result<&'a str, GgufError> {
        let offset = self.offset();
        let len = self.u64(what)?;
        let bytes = self.take(len, what)?;
        std::str::from_utf8(bytes).map_err(|_| GgufError::InvalidUtf8 { offset })
    }

    /// `count` fixed-size little-endian items.
    fn items<T, const N: usize>(
        &mut self,
        count: usize,
        decode: fn([u8; N]) -> T,
    ) -> Result<Vec<T>, GgufError> {
        let mut out = Vec::with_capacity(count);
        for _ in 0..count {
            out.push(decode(self.array(ARRAY_ITEM)?));
        }
        Ok(out)
    }

    fn bool(&mut self, key: &str) -> Result<bool, GgufError> {
        let offset = self.offset();
        match self.array::<1>(ARRAY_ITEM)?[0] {
            0 => Ok(false),
            1 => Ok(true),
            byte => Err(GgufError::InvalidBool {
                key: key.to_owned(),
                byte,
                offset,
            }),
        }
    }

    /// An array value (element type, count, items); `ty_offset` is where its type id was
    /// read and `depth` counts the enclosing arrays.
    fn array_value(&mut self, ty_offset: u64, key: &str, depth: usize) -> Result<Array, GgufError> {
        if depth >= MAX_ARRAY_DEPTH {
            return Err(GgufError::NestingTooDeep {
                key: key.to_owned(),
                max: MAX_ARRAY_DEPTH,
                offset: ty_offset,
            });
        }
        let elem_offset = self.offset();
        let elem_ty = self.u32("array element type")?;
        let min_item = min_encoded_size(elem_ty).ok_or_else(|| GgufError::UnknownValueType {
            key: key.to_owned(),
            type_id: elem_ty,
            offset: elem_offset,
        })?;
        let count = self.count(ARRAY_ITEM, min_item)?;
        self.array_items(elem_ty, elem_offset, count, key, depth)
    }

    /// The items of an array whose element type `elem_ty` (read at `elem_offset`) and
    /// `count` have been read and checked; `depth` counts the enclosing arrays.
    fn array_items(
        &mut self,
        elem_ty: u32,
        elem_offset: u64,
        count: usize,
        key: &str,
        depth: usize,
    ) -> Result<Array, GgufError> {
        Ok(match elem_ty {
            type_id::U8 => Array::U8(self.items(count, u8::from_le_bytes)?),
            type_id::I8 => Array::I8(self.items(count, i8::from_le_bytes)?),
            type_id::U16 => Array::U16(self.items(count, u16::from_le_bytes)?),
            type_id::I16 => Array::I16(self.items(count, i16::from_le_bytes)?),
            type_id::U32 => Array::U32(self.items(count, u32::from_le_bytes)?),
            type_id::I32 => Array::I32(self.items(count, i32::from_le_bytes)?),
            type_id::F32 => Array::F32(self.items(count, f32::from_le_bytes)?),
            type_id::U64 => Array::U64(self.items(count, u64::from_le_bytes)?),
            type_id::I64 => Array::I64(self.items(count, i64::from_le_bytes)?),
            type_id::F64 => Array::F64(self.items(count, f64::from_le_bytes)?),
            type_id::BOOL => Array::Bool(
                (0..count)
                    .map(|_| self.bool(key))
                    .collect::<Result<_, _>>()?,
            ),
            type_id::STRING => {
                let mut out = Strings::with_capacity(count);
                for _ in 0..count {
                    out.push(self.str("string value")?);
                }
                Array::String(out)
            }
            type_id::ARRAY => {
                let mut out = Vec::with_capacity(count);
                for _ in 0..count {
                    out.push(self.array_value(elem_offset, key, depth + 1)?);
                }
                Array::Array(out)
            }
            _ => {
                return Err(GgufError::UnknownValueType {
                    key: key.to_owned(),
                    type_id: elem_ty,
                    offset: elem_offset,
                });
            }
        })
    }

    fn value(
        &mut self,
        ty: u32,
        ty_offset: u64,
        key: &str,
        depth: usize,
    ) -> Result<Value, GgufError> {
        const WHAT: &str = "metadata value";
        Ok(match ty {
            type_id::U8 => Value::U8(u8::from_le_bytes(self.array(WHAT)?)),
            type_id::I8 => Value::I8(i8::from_le_bytes(self.array(WHAT)?)),
            type_id::U16 => Value::U16(u16::from_le_bytes(self.array(WHAT)?)),
            type_id::I16 => Value::I16(i16::from_le_bytes(self.array(WHAT)?)),
            type_id::U32 => Value::U32(u32::from_le_bytes(self.array(WHAT)?)),
            type_id::I32 => Value::I32(i32::from_le_bytes(self.array(WHAT)?)),
            type_id::F32 => Value::F32(f32::from_le_bytes(self.array(WHAT)?)),
            type_id::U64 => Value::U64(u64::from_le_bytes(self.array(WHAT)?)),
            type_id::I64 => Value::I64(i64::from_le_bytes(self.array(WHAT)?)),
            type_id::F64 => Value::F64(f64::from_le_bytes(self.array(WHAT)?)),
            type_id::BOOL => Value::Bool(self.bool(key)?),
            type_id::STRING => Value::String(self.string("string value")?),
            type_id::ARRAY => Value::Array(self.array_value(ty_offset, key, depth)?),
            _ => {
                return Err(GgufError::UnknownValueType {
                    key: key.to_owned(),
                    type_id: ty,
                    offset: ty_offset,
                });
            }
        })
    }
}

/// `count` as a `usize`, if `remaining` bytes could hold that many items of `min_item` bytes.
fn check_count(
    what: &'static str,
    count: u64,
    offset: u64,
    remaining: u64,
    min_item: u64,
) -> Result<usize, GgufError> {
    let max = remaining / min_item;
    if count > max {
        return Err(GgufError::CountTooLarge {
            what,
            count,
            offset,
            remaining,
            max,
        });
    }
    // count <= remaining, which is a buffer length, so it fits in usize.
    usize::try_from(count).map_err(|_| GgufError::CountTooLarge {
        what,
        count,
        offset,
        remaining,
        max,
    })
}

/// Parses and validates a whole GGUF file held in `buf`.
pub(crate) fn parse(buf: &[u8]) -> Result<Parsed, GgufError> {
    let mut cur = Cursor { buf, pos: 0 };
    let magic_len = buf.len().min(MAGIC.len());
    if buf[..magic_len] != MAGIC[..magic_len] {
        return Err(GgufError::BadMagic {
            found: buf[..magic_len].to_vec(),
        });
    }
    cur.take(MAGIC.len() as u64, "magic")?;
    let version = cur.u32("version")?;
    if !(2..=3).contains(&version) {
        return Err(GgufError::UnsupportedVersion { version });
    }
    let tensor_count_offset = cur.offset();
    let tensor_count = cur.u64("tensor count")?;
    let kv_count = cur.count("metadata entry", MIN_KV_SIZE)?;
    // Checked here as well as possible, before the metadata is parsed, so a huge count
    // fails fast; the tensor table then cannot outgrow what is left.
    let tensor_count = check_count(
        "tensor",
        tensor_count,
        tensor_count_offset,
        cur.remaining(),
        MIN_TENSOR_INFO_SIZE,
    )?;

    let mut metadata = Vec::with_capacity(kv_count);
    let mut key_index = HashMap::with_capacity(kv_count);
    for _ in 0..kv_count {
        let key_offset = cur.offset();
        let key = cur.string("metadata key")?;
        if key_index.contains_key(&key) {
            return Err(GgufError::DuplicateKey {
                key,
                offset: key_offset,
            });
        }
        let ty_offset = cur.offset();
        let ty = cur.u32("metadata value type")?;
        let value = cur.value(ty, ty_offset, &key, 0)?;
        key_index.insert(key.clone(), metadata.len());
        metadata.push((key, value));
    }
    let alignment = match key_index.get(ALIGNMENT_KEY) {
        Some(&i) => alignment_from_value(&metadata[i].1)?,
        None => DEFAULT_ALIGNMENT,
    };

    // Recheck against what is left now that the metadata has been consumed.
    check_count(
        "tensor",
        tensor_count as u64,
        tensor_count_offset,
        cur.remaining(),
        MIN_TENSOR_INFO_SIZE,
    )?;
    let mut tensors = Vec::with_capacity(tensor_count);
    let mut tensor_index = HashMap::with_capacity(tensor_count);
    for _ in 0..tensor_count {
        let info = tensor_info(&mut cur)?;
        if tensor_index.contains_key(&info.0.name) {
            return Err(GgufError::DuplicateTensor {
                tensor: info.0.name,
                offset: info.1,
            });
        }
        tensor_index.insert(info.0.name.clone(), tensors.len());
        tensors.push(info.0);
    }

    let file_size = buf.len() as u64;
    let header_end = cur.offset();
    let aligned = header_end.checked_next_multiple_of(alignment);
    let data_offset = match aligned {
        Some(off) if off <= file_size => off,
        // A file without tensors needs no data section; some writers omit the padding.
        _ if tensors.is_empty() => file_size,
        _ => {
            return Err(GgufError::Truncated {
                offset: header_end,
                what: "padding before tensor data",
                needed: aligned.map_or(u64::MAX, |a| a - header_end),
                available: file_size - header_end,
            });
        }
    };
    check_layout(&tensors, alignment, file_size - data_offset)?;

    Ok(Parsed {
        version,
        alignment,
        data_offset,
        metadata,
        key_index,
        tensors,
        tensor_index,
    })
}

/// Reads one tensor info; returns it with the offset where its name starts.
fn tensor_info(cur: &mut Cursor<'_>) -> Result<(TensorInfo, u64), GgufError> {
    let name_offset = cur.offset();
    let name = cur.string("tensor name")?;
    let n_dims_offset = cur.offset();
    let n_dims = cur.u32("tensor dimension count")?;
    if n_dims as usize > MAX_DIMS {
        return Err(GgufError::TooManyDims {
            tensor: name,
            n_dims,
            offset: n_dims_offset,
        });
    }
    let mut dims = Vec::with_capacity(n_dims as usize);
    for _ in 0..n_dims {
        dims.push(cur.u64("tensor dimension")?);
    }
    let ty_offset = cur.offset();
    let type_id = cur.u32("tensor type")?;
    let Some(ty) = GgmlType::from_id(type_id) else {
        return Err(GgufError::UnknownTensorType {
            tensor: name,
            type_id,
            offset: ty_offset,
        });
    };
    let offset = cur.u64("tensor data offset")?;
    Ok((TensorInfo::new(name, ty, dims, offset)?, name_offset))
}

/// The alignment a `general.alignment` value asks for.
pub(crate) fn alignment_from_value(value: &Value) -> Result<u64, GgufError> {
    let Some(v) = value.as_integer() else {
        return Err(GgufError::WrongType {
            key: ALIGNMENT_KEY.to_owned(),
            expected: "u32",
            actual: value.type_name(),
        });
    };
    match u64::try_from(v) {
        Ok(a) if a.is_power_of_two() => Ok(a),
        _ => Err(GgufError::BadAlignment {
            value: v.to_string(),
        }),
    }
}
