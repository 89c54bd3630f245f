//! ferrite-gguf: reads and writes GGUF model files.
//!
//! Key design choice: a file is validated completely when it is opened. [`Gguf::open`]
//! memory-maps the file (the crate's only `unsafe`), [`Gguf::from_bytes`] takes a buffer;
//! both parse the header, every metadata value and the tensor table, and check every
//! tensor's shape, alignment, bounds and overlap before returning. Afterwards all accessors
//! are plain lookups, and [`Gguf::tensor_data`] hands out slices that are known to exist.
//! Hostile input never panics and never makes the parser allocate more than the file
//! could back: counts are checked against the bytes left before any allocation.
//!
//! Tensor dimensions are kept in GGUF order: `dims[0]` is the row length (ggml's `ne0`).

#![deny(missing_docs)]

mod error;
mod parse;
mod reader;
mod tensor;
mod types;
mod value;

pub use error::GgufError;
pub use parse::{ALIGNMENT_KEY, DEFAULT_ALIGNMENT, MAGIC, MAX_ARRAY_DEPTH};
pub use reader::Gguf;
pub use tensor::{MAX_DIMS, TensorInfo};
pub use types::{ALL_TYPES, GgmlType};
pub use value::Value;
