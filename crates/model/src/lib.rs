//! ferrite-model: model configurations read from GGUF metadata, the forward pass written once
//! over `ferrite_backend::Backend`, and a naive f64 reference forward pass.
//!
//! Design: [`Model`] owns the mapped file and validated weight views; a [`Session`] owns
//! one timeline (KV cache, position, token history, scratch allocated once, so decode steps
//! allocate nothing). Architecture differences (llama incl. Mistral/Mixtral/Llama 3, gemma3,
//! qwen2, qwen3, qwen3moe) are resolved into plain flags by [`ModelConfig::from_gguf`], so one
//! forward pass serves all; expert FFNs run grouped by expert (see `moe`). The forward pass
//! (`session::forward`) only sequences the backend contract's ops; a [`Session`] runs it on
//! `ferrite_cpu::CpuBackend` over its pool, after asking the backend for every op it needs.
//! Results are bit-identical for any thread count and for prefill vs decode.
//! [`reference::forward`] is an independent f64 implementation (no KV cache, no
//! `ferrite_cpu`) that tests use as an oracle next to the transformers fixtures.
//!
//! Main calls: [`Model::load`] (with [`Precision::F32`] to dequantize every weight at load),
//! [`Session::new`] (context size, [`KvType`]), [`Session::eval`] (append tokens; logits
//! for [`Outputs::Last`], [`Outputs::All`] or [`Outputs::From`]), [`Session::sync`] (reuse
//! the cached prefix), [`Session::truncate`], [`Session::reset`], and
//! [`Session::eval_hidden`] (per-layer residual stream, for debugging and tests).
//!
//! ```no_run
//! use ferrite_model::{KvType, LoadOptions, Model, Outputs, Session};
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let model = Model::load("model.gguf".as_ref(), LoadOptions::default())?;
//! let pool = ferrite_cpu::ThreadPool::new(2)?;
//! let mut session = Session::new(&model, &pool, 2048, KvType::F16)?;
//! let logits = session.eval(&[1, 2, 3], Outputs::Last)?;
//! println!("{} logits", logits.n_vocab);
//! # Ok(()) }
//! ```

#![deny(missing_docs)]

mod batch;
pub mod config;
mod delta_net;
mod error;
pub mod features;
mod mamba2;
mod memory;
mod mla;
mod model;
mod moe;
pub mod reference;
mod session;
mod snapshot;
mod weights_check;

#[cfg(test)]
mod fixture_tests;
#[cfg(test)]
mod testutil;

pub use batch::Batch;
pub use config::{Activation, Arch, Kept, LayerConfig, ModelConfig};
pub use error::ModelError;
pub use features::MoeConfig;
pub use ferrite_backend::KvType;
pub use ferrite_cpu::{KvCache, ops};
pub use memory::{check_kv_memory, check_slot_memory, physical_memory, session_bytes};
pub use model::{LoadOptions, Model, Precision, Weight};
pub use moe::Experts;
pub use session::{
    CHECKPOINT_EVERY, CHECKPOINTS_KEPT, Logits, Outputs, PREFILL_CHUNK, Session, Weights,
};
pub use snapshot::{Recurrent, SessionState};
pub use weights_check::check_weights;
