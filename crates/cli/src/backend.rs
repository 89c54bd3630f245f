//! Choosing the compute backend for `ferrite run`, `score` and `serve`
//! (`--backend auto|cpu|cuda`) and loading the CUDA copy of a model.
//!
//! `auto` uses CUDA when a device answers the probe and the CPU otherwise; an explicit
//! `cuda` without a device is an error, never a silent fallback. A model the CUDA model
//! does not run yet (a hybrid, say) runs the one forward pass over the CUDA backend's
//! contract ops instead, when those take every op it needs; the backend line says so
//! (`pass=contract`), and where they do not, `cuda` is an error naming both refusals
//! and `auto` runs on the CPU with a note.
//!
//! The session adapter that drives either backend for `run`, `score` and `serve` is
//! `ferrite_engine::cuda_timeline`; `FERRITE_CUDA_ACT=f32|int8|int8x2` chooses what the
//! decode products read (see `ferrite_cuda::Activations`) and
//! `FERRITE_CUDA_PREFILL=dequant|mmq` how prefill multiplies (see
//! `ferrite_cuda::PrefillProducts`); the backend line reports them as `act=`, `prefill=`
//! and `sampling=`.

use std::sync::Arc;

use anyhow::Context;
use ferrite_cuda::{CudaBackend, CudaError, CudaModel, CudaOps, DeviceInfo};
use ferrite_model::{KvType, Model, Session};

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

/// How a model runs on CUDA.
pub enum CudaPath {
    /// The device-resident CUDA model: graphs, batched steps, device sampling.
    Model(Box<CudaModel>),
    /// The one forward pass over the contract ops (weights uploaded at first use).
    Pass(CudaOps),
}

/// The CUDA side of a loaded model, when CUDA was chosen.
pub struct CudaLoaded {
    /// What runs the model.
    pub path: CudaPath,
    /// The device.
    pub backend: Arc<CudaBackend>,
    /// What the probe found.
    pub info: DeviceInfo,
}

impl CudaLoaded {
    /// The CUDA model, unless the model runs the contract pass.
    pub fn model(&self) -> Option<&CudaModel> {
        match &self.path {
            CudaPath::Model(m) => Some(m),
            CudaPath::Pass(_) => None,
        }
    }
}

/// Loads the CUDA copy of `model` if `arg` asks for it (or allows it and a device exists).
/// `kv` is the KV type the sessions will ask for (the contract pass checks it up front).
pub fn load_cuda(arg: BackendArg, model: &Model, kv: KvType) -> anyhow::Result<Option<CudaLoaded>> {
    let info = match (arg, CudaBackend::probe()) {
        (BackendArg::Cpu, _) | (BackendArg::Auto, Err(_)) => return Ok(None),
        (BackendArg::Cuda, Err(err)) => return Err(err).context("--backend cuda"),
        (_, Ok(info)) => info,
    };
    let backend: Arc<CudaBackend> = CudaBackend::new()?;
    let path = match CudaModel::load(backend.clone(), model) {
        Ok(m) => CudaPath::Model(Box::new(m)),
        Err(CudaError::UnsupportedFeature(what)) => {
            let ops = CudaOps::new(backend.clone());
            // One position is enough to ask every op; nothing is uploaded yet.
            match Session::on(model, ops.clone(), 1, kv) {
                Ok(_) => CudaPath::Pass(ops),
                Err(refusal) if arg == BackendArg::Auto => {
                    eprintln!(
                        "note: the CUDA backend does not implement {what} yet, nor does its \
                         contract pass ({refusal}); running on the CPU"
                    );
                    return Ok(None);
                }
                Err(refusal) => anyhow::bail!(
                    "--backend cuda: the CUDA model does not implement {what} yet, and the \
                     contract pass refuses the model: {refusal}"
                ),
            }
        }
        Err(e) => return Err(e).context("uploading the model to the GPU"),
    };
    Ok(Some(CudaLoaded {
        path,
        backend,
        info,
    }))
}
