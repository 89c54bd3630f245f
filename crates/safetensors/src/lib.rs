//! ferrite-safetensors: reads Hugging Face `*.safetensors` files and sharded checkpoints.
//!
//! Key design choice: as in ferrite-gguf, a file is validated completely when it is opened.
//! [`SafeTensors::open`] memory-maps the file (the crate's only `unsafe`) and checks the
//! header length (bounded, inside the file), the JSON header, every dtype, that each data
//! range lies inside the data section, holds exactly `shape × dtype` bytes and overlaps no
//! other range. Afterwards [`SafeTensors::data`] hands out slices that are known to exist.
//! Hostile input never panics, and the header length is checked against the file size
//! before the header is read, so a file cannot make the parser allocate more than it holds.
//!
//! [`Checkpoint`] opens a model directory: one file, several files, or shards listed by a
//! `model.safetensors.index.json` (every shard must exist and hold what the index says).
//!
//! ```
//! use ferrite_safetensors::{Dtype, SafeTensors};
//!
//! let header = br#"{"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}"#;
//! let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
//! bytes.extend_from_slice(header);
//! bytes.extend([1.0f32, 2.0].iter().flat_map(|x| x.to_le_bytes()));
//! let st = SafeTensors::from_bytes("mem", bytes)?;
//! let w = st.tensor("w").expect("present");
//! assert_eq!((w.dtype, w.shape.as_slice()), (Dtype::F32, &[2u64][..]));
//! assert_eq!(st.data(w), &[0, 0, 0x80, 0x3f, 0, 0, 0, 0x40]);
//! # Ok::<(), ferrite_safetensors::SafetensorsError>(())
//! ```

#![deny(missing_docs)]

mod checkpoint;
mod dtype;
mod error;
mod file;

pub use checkpoint::{Checkpoint, INDEX_FILE, TensorRef};
pub use dtype::Dtype;
pub use error::SafetensorsError;
pub use file::{MAX_HEADER_LEN, SafeTensors, TensorInfo};
