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
//!
//! [`GgufWriter`] writes GGUF v3 under the same rules, so its output always reads back:
//!
//! ```
//! use ferrite_gguf::{GgmlType, Gguf, GgufWriter, Value};
//!
//! let weights: Vec<u8> = [1.0f32, 2.0, 3.0, 4.0].iter().flat_map(|x| x.to_le_bytes()).collect();
//! let mut w = GgufWriter::new();
//! w.add_metadata("general.architecture", Value::String("llama".into()))?
//!     .add_metadata("llama.block_count", Value::U32(2))?
//!     .add_tensor("output.weight", GgmlType::F32, &[2, 2], weights.as_slice())?;
//!
//! let g = Gguf::from_bytes(w.to_bytes()?)?;
//! assert_eq!(g.get_str("general.architecture")?, "llama");
//! assert_eq!(g.get_u64("llama.block_count")?, 2);
//! let t = g.tensor("output.weight").expect("written above");
//! assert_eq!((t.ty, t.dims.as_slice(), t.n_elements()), (GgmlType::F32, &[2, 2][..], 4));
//! assert_eq!(g.tensor_data(t), weights.as_slice());
//! # Ok::<(), ferrite_gguf::GgufError>(())
//! ```

#![deny(missing_docs)]

mod array;
mod error;
mod parse;
mod reader;
mod tensor;
mod types;
mod value;
mod writer;

pub use array::{Array, Strings};
pub use error::GgufError;
pub use parse::{ALIGNMENT_KEY, DEFAULT_ALIGNMENT, MAGIC, MAX_ARRAY_DEPTH};
pub use reader::Gguf;
pub use tensor::{MAX_DIMS, TensorInfo};
pub use types::{ALL_TYPES, GgmlType};
pub use value::Value;
pub use writer::{GgufWriter, WRITE_VERSION};
