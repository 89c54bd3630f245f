//! [`Array`]: a GGUF metadata array held compactly, one `Vec` of the element type, and
//! [`Strings`], an array of strings stored back to back in one buffer.
//!
//! Tokenizer vocabularies are arrays of 100k–260k strings, scores and types; held as one
//! enum value per item they cost tens of MiB of heap for as long as the file is open. This
//! module owns the representation only: parsing and validation live in `parse.rs`, encoding
//! in `writer.rs`.

use crate::Value;
use crate::value::type_id;

/// A GGUF array. Every item has the element type the variant names, so an array can never
/// be mixed, and an empty array still knows its element type.
#[derive(Debug, Clone, PartialEq)]
pub enum Array {
    /// Items of GGUF type 0.
    U8(Vec<u8>),
    /// Items of GGUF type 1.
    I8(Vec<i8>),
    /// Items of GGUF type 2.
    U16(Vec<u16>),
    /// Items of GGUF type 3.
    I16(Vec<i16>),
    /// Items of GGUF type 4.
    U32(Vec<u32>),
    /// Items of GGUF type 5.
    I32(Vec<i32>),
    /// Items of GGUF type 6.
    F32(Vec<f32>),
    /// Items of GGUF type 7.
    Bool(Vec<bool>),
    /// Items of GGUF type 8.
    String(Strings),
    /// Items of GGUF type 9: arrays, each with its own element type.
    Array(Vec<Array>),
    /// Items of GGUF type 10.
    U64(Vec<u64>),
    /// Items of GGUF type 11.
    I64(Vec<i64>),
    /// Items of GGUF type 12.
    F64(Vec<f64>),
}

impl Array {
    /// The GGUF value type id of the items.
    pub fn elem_type_id(&self) -> u32 {
        match self {
            Array::U8(_) => type_id::U8,
            Array::I8(_) => type_id::I8,
            Array::U16(_) => type_id::U16,
            Array::I16(_) => type_id::I16,
            Array::U32(_) => type_id::U32,
            Array::I32(_) => type_id::I32,
            Array::F32(_) => type_id::F32,
            Array::Bool(_) => type_id::BOOL,
            Array::String(_) => type_id::STRING,
            Array::Array(_) => type_id::ARRAY,
            Array::U64(_) => type_id::U64,
            Array::I64(_) => type_id::I64,
            Array::F64(_) => type_id::F64,
        }
    }

    /// Number of items.
    pub fn len(&self) -> usize {
        match self {
            Array::U8(v) => v.len(),
            Array::I8(v) => v.len(),
            Array::U16(v) => v.len(),
            Array::I16(v) => v.len(),
            Array::U32(v) => v.len(),
            Array::I32(v) => v.len(),
            Array::F32(v) => v.len(),
            Array::Bool(v) => v.len(),
            Array::String(v) => v.len(),
            Array::Array(v) => v.len(),
            Array::U64(v) => v.len(),
            Array::I64(v) => v.len(),
            Array::F64(v) => v.len(),
        }
    }

    /// Whether the array has no items.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Item `i` as a [`Value`] (strings and nested arrays are copied), if it exists.
    pub fn get(&self, i: usize) -> Option<Value> {
        Some(match self {
            Array::U8(v) => Value::U8(*v.get(i)?),
            Array::I8(v) => Value::I8(*v.get(i)?),
            Array::U16(v) => Value::U16(*v.get(i)?),
            Array::I16(v) => Value::I16(*v.get(i)?),
            Array::U32(v) => Value::U32(*v.get(i)?),
            Array::I32(v) => Value::I32(*v.get(i)?),
            Array::F32(v) => Value::F32(*v.get(i)?),
            Array::Bool(v) => Value::Bool(*v.get(i)?),
            Array::String(v) => Value::String(v.get(i)?.to_owned()),
            Array::Array(v) => Value::Array(v.get(i)?.clone()),
            Array::U64(v) => Value::U64(*v.get(i)?),
            Array::I64(v) => Value::I64(*v.get(i)?),
            Array::F64(v) => Value::F64(*v.get(i)?),
        })
    }

    /// The items as [`Value`]s, in order (each made on demand, strings copied).
    pub fn values(&self) -> impl Iterator<Item = Value> + '_ {
        (0..self.len()).filter_map(|i| self.get(i))
    }

    /// The strings, if the items are strings. An empty array of any element type is an
    /// empty array of strings (writers, ferrite's before typed arrays included, store
    /// empty arrays with an arbitrary element type).
    pub fn as_strings(&self) -> Option<&Strings> {
        const EMPTY: &Strings = &Strings {
            text: String::new(),
            ends: Vec::new(),
        };
        match self {
            Array::String(s) => Some(s),
            other if other.is_empty() => Some(EMPTY),
            _ => None,
        }
    }

    /// The items as integers, if they are of an integer type (not bool, not floats); an
    /// empty array of any type gives no items.
    pub fn integers(&self) -> Option<Vec<i128>> {
        fn wide<T: Copy + Into<i128>>(v: &[T]) -> Vec<i128> {
            v.iter().map(|&x| x.into()).collect()
        }
        Some(match self {
            Array::U8(v) => wide(v),
            Array::I8(v) => wide(v),
            Array::U16(v) => wide(v),
            Array::I16(v) => wide(v),
            Array::U32(v) => wide(v),
            Array::I32(v) => wide(v),
            Array::U64(v) => wide(v),
            Array::I64(v) => wide(v),
            other if other.is_empty() => Vec::new(),
            _ => return None,
        })
    }

    /// The items as `f32`, under the rules of [`Value::as_f32`]: floats (f64 rounded to
    /// nearest) and integers; an empty array of any type gives no items.
    pub fn floats(&self) -> Option<Vec<f32>> {
        match self {
            Array::F32(v) => Some(v.clone()),
            // Narrowing is the documented intent, as for single values.
            Array::F64(v) => Some(v.iter().map(|&x| x as f32).collect()),
            _ => self
                .integers()
                .map(|v| v.into_iter().map(|x| x as f32).collect()),
        }
    }

    /// A short type description for messages: `array of string`, `array of array of u8`.
    pub fn type_name(&self) -> String {
        let elem = match self {
            Array::Array(items) => match items.first() {
                Some(first) => first.type_name(),
                None => "array".to_owned(),
            },
            other => crate::value::type_id_name(other.elem_type_id()).to_owned(),
        };
        format!("array of {elem}")
    }
}

/// An array of strings stored back to back: item `i` is `text[ends[i-1]..ends[i]]`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Strings {
    text: String,
    ends: Vec<usize>,
}

impl Strings {
    /// An empty array with room for `n` items.
    pub fn with_capacity(n: usize) -> Strings {
        Strings {
            text: String::new(),
            ends: Vec::with_capacity(n),
        }
    }

    /// Appends one item.
    pub fn push(&mut self, s: &str) {
        self.text.push_str(s);
        self.ends.push(self.text.len());
    }

    /// Number of items.
    pub fn len(&self) -> usize {
        self.ends.len()
    }

    /// Whether there are no items.
    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    /// Item `i`, if it exists.
    pub fn get(&self, i: usize) -> Option<&str> {
        let end = *self.ends.get(i)?;
        let start = if i == 0 { 0 } else { self.ends[i - 1] };
        self.text.get(start..end)
    }

    /// The items in order.
    pub fn iter(&self) -> impl DoubleEndedIterator<Item = &str> + ExactSizeIterator + '_ {
        (0..self.len()).map(|i| self.get(i).unwrap_or_default())
    }
}

impl<S: AsRef<str>> FromIterator<S> for Strings {
    fn from_iter<I: IntoIterator<Item = S>>(iter: I) -> Strings {
        let iter = iter.into_iter();
        let mut out = Strings::with_capacity(iter.size_hint().0);
        for s in iter {
            out.push(s.as_ref());
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strings_round_trip_including_empty_items() {
        let items = ["a", "", "ßé", "tail"];
        let s: Strings = items.iter().collect();
        assert_eq!(s.len(), 4);
        assert_eq!(s.iter().collect::<Vec<_>>(), items);
        assert_eq!(s.get(1), Some(""));
        assert_eq!(s.get(4), None);
    }

    #[test]
    fn views_convert_like_single_values() {
        let a = Array::I16(vec![-2, 7]);
        assert_eq!(a.integers(), Some(vec![-2, 7]));
        assert_eq!(a.floats(), Some(vec![-2.0, 7.0]));
        assert_eq!(Array::Bool(vec![true]).integers(), None);
        assert_eq!(Array::Bool(vec![]).integers(), Some(vec![]));
        assert_eq!(Array::U8(vec![]).as_strings().map(Strings::len), Some(0));
        assert_eq!(Array::U8(vec![1]).as_strings(), None);
        assert_eq!(Array::F64(vec![0.5]).floats(), Some(vec![0.5]));
        assert_eq!(a.get(1), Some(Value::I16(7)));
        assert_eq!(
            Array::String(Strings::default()).type_name(),
            "array of string"
        );
        let nested = Array::Array(vec![Array::U8(vec![1])]);
        assert_eq!(nested.type_name(), "array of array of u8");
        assert_eq!(Array::Array(vec![]).type_name(), "array of array");
    }
}
