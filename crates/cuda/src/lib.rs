//! ferrite-cuda: the CUDA backend.
//!
//! CUDA is loaded at run time through cudarc's dynamic loading, so the workspace builds,
//! lints and tests on machines with no CUDA toolkit or driver: [`CudaBackend::probe`] checks
//! for the driver library before any CUDA call and answers [`CudaError::NoDevice`] instead
//! of panicking.
//!
//! Key design choice: weights stay in their GGUF block layout on the device and every
//! matrix–vector kernel dequantizes in registers (one warp per row), so a model costs its
//! file size in device memory. Kernels live in `kernels/*.cu`, are compiled by NVRTC for the
//! device's architecture at first use and cached on disk (see [`CompileReport`]).
//!
//! API: [`CudaBackend::probe`] / [`CudaBackend::new`] find the device and load the kernels;
//! [`CudaModel::load`] uploads a host [`ferrite_model::Model`]'s weights once;
//! [`CudaSession::eval`] runs tokens through an f16 KV cache and returns the last token's
//! logits. Each decode step is captured once as a CUDA graph and replayed; a prompt of several
//! tokens goes through batched prefill (weights as f16, cuBLAS GEMMs, one attention launch per
//! layer for all its queries). Qwen 2's attention biases, Llama 3's rope frequency factors
//! and mixture-of-experts layers (routing on the device, only the selected experts read)
//! run on the device too. [`CudaBackend::launch_counts`] are path markers.
//!
//! Decode products of Q4_1, Q8_0, Q4_K and Q6_K weights read their input vector quantized
//! once per product input to int8 blocks of 32 and use integer dot products (dp4a):
//! [`Activations::Int8x2`] (the default: two int8 planes, about 15 bits, within the f32
//! path's bounds everywhere), [`Activations::Int8`] (one plane: fastest, about 0.5 % noise
//! per product) or [`Activations::F32`], chosen by `FERRITE_CUDA_ACT` or
//! [`CudaBackend::set_activations`]. [`CudaSession::eval_greedy`] picks the next token on the
//! device (the CPU sampler's greedy rule) and copies back one id instead of the logits.
//! [`CudaBatch::step`] advances several sessions by one token each in one forward pass
//! (every weight read once for up to eight of them; each session's logits equal its
//! single-session step's). [`CudaSession::export_state`] / [`CudaSession::import_state`] copy a session's tokens,
//! f16 KV rows and next-token logits to and from a host [`ferrite_model::SessionState`]
//! (what `ferrite-kvstore` writes to disk).
//!
//! ```
//! match ferrite_cuda::CudaBackend::probe() {
//!     Ok(info) => println!("{} sm_{}{}", info.name, info.compute_capability.0, info.compute_capability.1),
//!     Err(e) => assert!(e.to_string().starts_with("no CUDA device")),
//! }
//! ```
#![deny(missing_docs)]

mod arch_ops;
mod attn_ops;
mod compile;
mod contract;
mod decode;
mod device;
mod error;
mod gemm;
mod host;
mod model;
mod ops;
mod recurrent;

pub use attn_ops::AttnShape;
pub use compile::CompileReport;
pub use contract::{CudaKv, CudaOps, MatrixId, VectorId};
pub use device::{
    ACT_ENV, Activations, CudaBackend, DEFAULT_ACTIVATIONS, DeviceInfo, kernel_suffix,
};
pub use error::CudaError;
pub use gemm::{DEFAULT_PREFILL, PREFILL_ENV, PrefillProducts};
pub use host::{AttnOutput, QuantizedAct};
pub use model::{CudaBatch, CudaModel, CudaSession, Greedy, TOPK_MAX, TopCandidates};
