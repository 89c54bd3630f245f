//! ferrite-cpu: the CPU backend: [`CpuBackend`] implements `ferrite-backend`'s contract
//! over this crate's thread pool, quantized matrix products, attention over the KV cache
//! ([`KvCache`]), rope with the cache store, and the f32 row ops ([`ops`]).
//!
//! Key design choice: one path for decode and prefill. Weights are dequantized exactly
//! (bit-for-bit what gguf-py produces) a tile of rows at a time into per-thread scratch and
//! multiplied against f32 activations with register-blocked SIMD kernels (Q4_1 and Q8_0 on
//! AVX-512 VNNI: 16-bit block-quantized activations and exact integer block sums, see
//! `matmul`). Each output has one owner thread and a fixed accumulation order, so results
//! are bit-identical for any thread count and any batch composition.
//!
//! ```
//! use ferrite_cpu::{Matrix, ThreadPool, matmul};
//! use ferrite_gguf::GgmlType;
//! let pool = ThreadPool::new(2).unwrap();
//! let w: Vec<u8> = [1.0f32, 2.0, 3.0, 4.0].iter().flat_map(|v| v.to_le_bytes()).collect();
//! let m = Matrix { ty: GgmlType::F32, rows: 2, cols: 2, data: &w, packed: None };
//! let mut y = [0f32; 2];
//! matmul(&pool, m, &[1.0, 1.0], 1, &mut y).unwrap();
//! assert_eq!(y, [3.0, 7.0]);
//! ```
#![deny(missing_docs)]

pub mod attention;
mod backend;
mod kv;
mod matmul;
pub mod ops;
mod pool;
mod positions;
mod recurrent;

pub use backend::{CpuAngles, CpuBackend};
pub use ferrite_quant::kernels::q16::PackedRows;
pub use kv::{KvCache, KvRows};
pub use matmul::{Matrix, matmul, matmul_shared, matmul_with, pack};
pub use pool::{MAX_THREADS, ThreadPool, default_threads};

/// Errors of the CPU backend.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CpuError {
    /// A thread pool needs at least one thread.
    #[error("a thread pool needs at least one thread")]
    ZeroThreads,
    /// More threads than a pool takes ([`MAX_THREADS`]).
    #[error("a thread pool takes at most {max} threads, not {requested}")]
    TooManyThreads {
        /// The threads asked for.
        requested: usize,
        /// [`MAX_THREADS`].
        max: usize,
    },
    /// The OS refused to start a worker thread.
    #[error("cannot spawn a worker thread: {0}")]
    Spawn(String),
    /// Operand sizes do not agree.
    #[error("shape mismatch: {what}")]
    Shape {
        /// Which check failed.
        what: &'static str,
    },
    /// The quantization layer refused (unsupported type, unavailable SIMD level).
    #[error(transparent)]
    Quant(#[from] ferrite_quant::QuantError),
}
