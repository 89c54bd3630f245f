//! Choosing the compute backend for `ferrite run`, `score` and `serve`
//! (`--backend auto|cpu|cuda`) and loading the CUDA copy of a model.
//!
//! `auto` uses CUDA when a device answers the probe and the CPU otherwise; an explicit
//! `cuda` without a device is an error, never a silent fallback.
//!
//! The session adapter that drives either backend for `run`, `score` and `serve` is
//! `ferrite_engine::cuda_timeline`; `FERRITE_CUDA_ACT=f32|int8|int8x2` chooses what the
//! decode products read (see `ferrite_cuda::Activations`) and
//! `FERRITE_CUDA_PREFILL=dequant|mmq` how prefill multiplies (see
//! `ferrite_cuda::PrefillProducts`); the backend line reports them as `act=`, `prefill=`
//! and `sampling=`.

use std::sync::Arc;

use anyhow::Context;
use ferrite_cuda::{CudaBackend, CudaError, CudaModel, DeviceInfo};
use ferrite_model::Model;

/// The parser of every `--threads` flag: 1 to [`ferrite_cpu::MAX_THREADS`], so a count the
/// CPU pool would refuse (or, in `quantize`, that would start a hundred thousand threads) is
/// a usage error before anything loads.
pub fn threads_arg() -> clap::builder::RangedU64ValueParser<usize> {
    clap::builder::RangedU64ValueParser::new().range(1..=ferrite_cpu::MAX_THREADS as u64)
}

/// `--backend` on the command line.
#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum BackendArg {
    /// CUDA when a device is present, else CPU.
    Auto,
    /// The CPU backend.
    Cpu,
    /// The CUDA backend (fails when no device is present).
    Cuda,
}

/// The CUDA side of a loaded model, when CUDA was chosen.
pub struct CudaLoaded {
    /// The device-resident model.
    pub model: CudaModel,
    /// What the probe found.
    pub info: DeviceInfo,
}

/// Loads the CUDA copy of `model` if `arg` asks for it (or allows it and a device exists).
pub fn load_cuda(arg: BackendArg, model: &Model) -> anyhow::Result<Option<CudaLoaded>> {
    let info = match (arg, CudaBackend::probe()) {
        (BackendArg::Cpu, _) | (BackendArg::Auto, Err(_)) => return Ok(None),
        (BackendArg::Cuda, Err(err)) => return Err(err).context("--backend cuda"),
        (_, Ok(info)) => info,
    };
    let backend: Arc<CudaBackend> = CudaBackend::new()?;
    let model = match CudaModel::load(backend, model) {
        Ok(m) => m,
        Err(CudaError::UnsupportedFeature(what)) if arg == BackendArg::Auto => {
            eprintln!("note: the CUDA backend does not implement {what} yet; running on the CPU");
            return Ok(None);
        }
        Err(e) => return Err(e).context("uploading the model to the GPU"),
    };
    Ok(Some(CudaLoaded { model, info }))
}
