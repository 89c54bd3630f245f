//! ferrite-model: model configurations read from GGUF metadata, the CPU forward pass and a
//! naive f64 reference forward pass.
//!
//! Staged: the config, model, session and reference modules are enabled once ferrite-quant
//! and ferrite-cpu land on main; this stage builds the f32 ops, the KV cache and attention.

#![deny(missing_docs)]

pub mod attention;
pub mod kv;
pub mod ops;

pub use kv::{KvCache, KvType};
