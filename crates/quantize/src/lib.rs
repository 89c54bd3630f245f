//! ferrite-quantize: GGUF → GGUF quantization with llama.cpp-style named mixes.
//!
//! Key design choice: the *type rule* is a pure function of tensor names, shapes and three
//! model facts ([`rule::choose_types`]), separate from the byte work ([`convert_tensor`]).
//! [`quantize_file`] glues them for GGUF input; a converter that starts from another format
//! (safetensors) calls the same two pieces, so every path picks identical types. The block
//! quantizers themselves live in `ferrite-quant`; this crate never encodes a block.
//!
//! The rule is documented in `docs/quantize.md` and in [`rule`]; it is pinned in tests against
//! the tensor types of a file llama.cpp produced.
//!
//! ```
//! use ferrite_gguf::{GgmlType, Gguf, GgufWriter, Value};
//! use ferrite_quantize::{Mix, QuantizeOptions, quantize_file};
//!
//! let m: Vec<u8> = (0..256 * 2).flat_map(|i| (i as f32 / 512.0).to_le_bytes()).collect();
//! let mut w = GgufWriter::new();
//! w.add_metadata("general.architecture", Value::String("llama".into()))?
//!     .add_tensor("blk.0.ffn_up.weight", GgmlType::F32, &[256, 2], m)?;
//! let input = Gguf::from_bytes(w.to_bytes()?)?;
//!
//! let dir = tempfile::tempdir()?;
//! let out = dir.path().join("q.gguf");
//! let opts = QuantizeOptions { mix: Mix::Q4_K_M, threads: 2, allow_requantize: false };
//! let summary = quantize_file(&input, &out, &opts, &mut |_| {})?;
//! assert_eq!(Gguf::open(&out)?.tensors()[0].ty, GgmlType::Q4_K);
//! assert_eq!(summary.converted, 1);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![deny(missing_docs)]

mod error;
mod file;
mod mix;
pub mod rule;

pub use error::QuantizeError;
pub use file::{
    Progress, QUANTIZATION_VERSION, QuantizeOptions, Summary, TensorPlan, TypeTotals,
    convert_tensor, plan, quantize_file,
};
pub use mix::Mix;
pub use rule::{Choice, ModelInfo, Reason, choose_types};
