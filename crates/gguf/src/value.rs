//! Metadata values: the [`Value`] enum, the GGUF value type ids, and lossless conversions
//! used by the typed getters.
//!
//! Arrays are `Value::Array(`[`Array`]`)`: one typed vector per array, so an array is
//! homogeneous by construction and keeps its element type even when empty.

use crate::Array;

/// One metadata value as stored in a GGUF file.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// GGUF type 0.
    U8(u8),
    /// GGUF type 1.
    I8(i8),
    /// GGUF type 2.
    U16(u16),
    /// GGUF type 3.
    I16(i16),
    /// GGUF type 4.
    U32(u32),
    /// GGUF type 5.
    I32(i32),
    /// GGUF type 6.
    F32(f32),
    /// GGUF type 7 (one byte, 0 or 1).
    Bool(bool),
    /// GGUF type 8 (u64 length, UTF-8 bytes).
    String(String),
    /// GGUF type 9: element type, u64 count, items of that type.
    Array(Array),
    /// GGUF type 10.
    U64(u64),
    /// GGUF type 11.
    I64(i64),
    /// GGUF type 12.
    F64(f64),
}

/// GGUF value type ids, in id order.
pub(crate) mod type_id {
    pub const U8: u32 = 0;
    pub const I8: u32 = 1;
    pub const U16: u32 = 2;
    pub const I16: u32 = 3;
    pub const U32: u32 = 4;
    pub const I32: u32 = 5;
    pub const F32: u32 = 6;
    pub const BOOL: u32 = 7;
    pub const STRING: u32 = 8;
    pub const ARRAY: u32 = 9;
    pub const U64: u32 = 10;
    pub const I64: u32 = 11;
    pub const F64: u32 = 12;
}

/// Name of a value type id, for error messages.
pub(crate) fn type_id_name(id: u32) -> &'static str {
    match id {
        type_id::U8 => "u8",
        type_id::I8 => "i8",
        type_id::U16 => "u16",
        type_id::I16 => "i16",
        type_id::U32 => "u32",
        type_id::I32 => "i32",
        type_id::F32 => "f32",
        type_id::BOOL => "bool",
        type_id::STRING => "string",
        type_id::ARRAY => "array",
        type_id::U64 => "u64",
        type_id::I64 => "i64",
        type_id::F64 => "f64",
        _ => "unknown",
    }
}

/// Smallest number of bytes one item of value type `id` can occupy in a file; `None` for
/// an unknown type. Counts are checked against this before anything is allocated.
pub(crate) fn min_encoded_size(id: u32) -> Option<u64> {
    Some(match id {
        type_id::U8 | type_id::I8 | type_id::BOOL => 1,
        type_id::U16 | type_id::I16 => 2,
        type_id::U32 | type_id::I32 | type_id::F32 => 4,
        type_id::U64 | type_id::I64 | type_id::F64 => 8,
        // u64 length, possibly empty.
        type_id::STRING => 8,
        // u32 element type + u64 count, possibly empty.
        type_id::ARRAY => 12,
        _ => return None,
    })
}

impl Value {
    /// The GGUF value type id of this value.
    pub fn type_id(&self) -> u32 {
        match self {
            Value::U8(_) => type_id::U8,
            Value::I8(_) => type_id::I8,
            Value::U16(_) => type_id::U16,
            Value::I16(_) => type_id::I16,
            Value::U32(_) => type_id::U32,
            Value::I32(_) => type_id::I32,
            Value::F32(_) => type_id::F32,
            Value::Bool(_) => type_id::BOOL,
            Value::String(_) => type_id::STRING,
            Value::Array(_) => type_id::ARRAY,
            Value::U64(_) => type_id::U64,
            Value::I64(_) => type_id::I64,
            Value::F64(_) => type_id::F64,
        }
    }

    /// A short type description for messages: `u32`, `string`, `array of string`, ...
    pub fn type_name(&self) -> String {
        match self {
            Value::Array(items) => items.type_name(),
            other => type_id_name(other.type_id()).to_owned(),
        }
    }

    /// The value as an integer, for any integer variant (not bool, not floats).
    pub fn as_integer(&self) -> Option<i128> {
        Some(match *self {
            Value::U8(v) => v.into(),
            Value::I8(v) => v.into(),
            Value::U16(v) => v.into(),
            Value::I16(v) => v.into(),
            Value::U32(v) => v.into(),
            Value::I32(v) => v.into(),
            Value::U64(v) => v.into(),
            Value::I64(v) => v.into(),
            _ => return None,
        })
    }

    /// The value as `f32`: floats (f64 rounded to nearest) and integers (rounded to
    /// nearest).
    pub fn as_f32(&self) -> Option<f32> {
        match *self {
            Value::F32(v) => Some(v),
            // Narrowing is the documented intent: GGUF stores some hyperparameters as f64.
            Value::F64(v) => Some(v as f32),
            _ => self.as_integer().map(|v| v as f32),
        }
    }

    /// The string, if this is a string.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(s) => Some(s),
            _ => None,
        }
    }

    /// The items, if this is an array.
    pub fn as_array(&self) -> Option<&Array> {
        match self {
            Value::Array(items) => Some(items),
            _ => None,
        }
    }
}

impl std::fmt::Display for Value {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Value::U8(v) => write!(f, "{v}"),
            Value::I8(v) => write!(f, "{v}"),
            Value::U16(v) => write!(f, "{v}"),
            Value::I16(v) => write!(f, "{v}"),
            Value::U32(v) => write!(f, "{v}"),
            Value::I32(v) => write!(f, "{v}"),
            Value::F32(v) => write!(f, "{v}"),
            Value::Bool(v) => write!(f, "{v}"),
            Value::String(v) => write!(f, "{v:?}"),
            Value::Array(items) => write!(f, "[{} items of {}]", items.len(), items.type_name()),
            Value::U64(v) => write!(f, "{v}"),
            Value::I64(v) => write!(f, "{v}"),
            Value::F64(v) => write!(f, "{v}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn type_ids_match_gguf_spec_order() {
        let samples = [
            Value::U8(0),
            Value::I8(0),
            Value::U16(0),
            Value::I16(0),
            Value::U32(0),
            Value::I32(0),
            Value::F32(0.0),
            Value::Bool(false),
            Value::String(String::new()),
            Value::Array(Array::U8(vec![])),
            Value::U64(0),
            Value::I64(0),
            Value::F64(0.0),
        ];
        for (id, v) in samples.iter().enumerate() {
            assert_eq!(v.type_id() as usize, id);
            assert!(min_encoded_size(v.type_id()).is_some());
        }
        assert_eq!(min_encoded_size(13), None);
    }

    #[test]
    fn integer_and_float_views() {
        assert_eq!(Value::I8(-3).as_integer(), Some(-3));
        assert_eq!(Value::U64(u64::MAX).as_integer(), Some(u64::MAX.into()));
        assert_eq!(Value::Bool(true).as_integer(), None);
        assert_eq!(Value::F64(0.5).as_f32(), Some(0.5));
        assert_eq!(Value::U32(7).as_f32(), Some(7.0));
        assert_eq!(Value::String("x".into()).as_f32(), None);
    }

    #[test]
    fn type_names_describe_arrays() {
        let a = Array::String(["a"].into_iter().collect());
        assert_eq!(Value::Array(a.clone()).type_name(), "array of string");
        assert_eq!(
            Value::Array(Array::Array(vec![a])).type_name(),
            "array of array of string"
        );
        assert_eq!(Value::Array(Array::F32(vec![])).type_name(), "array of f32");
    }
}
