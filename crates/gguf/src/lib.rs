//! ferrite-gguf: reads and writes GGUF model files.
//!
//! Not filled in yet: the reader and writer land with issue 2.

#![deny(missing_docs)]

mod types;

pub use types::{ALL_TYPES, GgmlType};
