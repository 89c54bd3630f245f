//! The engine thread on the CUDA backend: the model's weights uploaded once, one
//! [`CudaSession`] per slot, and every scheduler step's one-token inputs decoded together
//! through a [`CudaBatch`] (prompt chunks go session by session through batched prefill).
//! A model the device-resident [`CudaModel`] refuses (the hybrids, LongRoPE) runs the one
//! forward pass over the contract ops ([`CudaOps`]) instead, as `ferrite run` does: one
//! `Session` per slot, every step's rows through one [`ferrite_model::Batch`], recurrent
//! checkpoints as on the CPU.
//!
//! CUDA is loaded at run time (cudarc's dynamic loading), so this module builds and the
//! server runs on machines without it; choosing it there fails at start with the probe's
//! "no CUDA device" error. The prefix cache is CPU-only for now: CUDA slots reuse only the
//! prefix their own cache still holds.

use std::sync::Arc;
use std::sync::mpsc::{Receiver, SyncSender};

use ferrite_cuda::{CudaBackend, CudaBatch, CudaError, CudaModel, CudaOps, CudaSession};

use ferrite_model::{Batch, KvType, Model, Session};
use ferrite_tokenizer::Tokenizer;

use super::cpu::{ModelRuntime, Ready, SessionBatch, limits};
use super::{EngineConfig, EngineError};
use crate::cuda_timeline::CudaTimeline;
use crate::generate::{GenerateError, Timeline};
use crate::scheduler::{BatchEval, Counters, Job, Scheduler};

/// Continuous batching on the device: the one-token inputs of a step in one
/// [`CudaBatch::step`], longer inputs (prompt chunks) through each session's prefill.
struct CudaBatcher<'m>(CudaBatch<'m>);

impl<'m> BatchEval<CudaTimeline<'m>> for CudaBatcher<'m> {
    fn eval_many(
        &mut self,
        seqs: &mut [&mut CudaTimeline<'m>],
        inputs: &[&[u32]],
        tails: &[usize],
    ) -> Result<Vec<Vec<f32>>, GenerateError> {
        if seqs.len() != inputs.len() {
            return Err(GenerateError::BatchShape {
                timelines: seqs.len(),
                inputs: inputs.len(),
            });
        }
        for (s, input) in seqs.iter().zip(inputs) {
            s.check(input)?;
        }
        let mut out = vec![Vec::new(); seqs.len()];
        let singles: Vec<usize> = (0..inputs.len())
            .filter(|&i| inputs[i].len() == 1)
            .collect();
        let tokens: Vec<u32> = singles.iter().map(|&i| inputs[i][0]).collect();
        let mut sessions: Vec<&mut CudaSession<'m>> = seqs
            .iter_mut()
            .zip(inputs)
            .filter(|(_, input)| input.len() == 1)
            .map(|(s, _)| &mut s.session)
            .collect();
        let rows = self.0.step(&mut sessions, &tokens)?;
        for (i, row) in singles.into_iter().zip(rows) {
            out[i] = row;
        }
        for (i, (s, input)) in seqs.iter_mut().zip(inputs).enumerate() {
            if tails[i] > 1 {
                let mut all = s.eval_all(input)?;
                let n_vocab = all.len() / input.len();
                out[i] = all.split_off((input.len() - tails[i]) * n_vocab);
            } else if input.len() > 1 {
                out[i] = s.session.eval(input)?;
            }
        }
        Ok(out)
    }
}

/// The device fields of a CUDA engine's backend line (the fields `ferrite run` prints).
fn device_fields(b: &CudaBackend) -> String {
    let info = b.info();
    let (major, minor) = info.compute_capability;
    format!("backend=cuda device=\"{}\" cc={major}.{minor}", info.name)
}

/// The backend line of a CUDA engine on the CUDA model.
fn backend_line(b: &CudaBackend) -> String {
    format!(
        "{} graphs=on kv=f16 act={} sampling=host batch=device",
        device_fields(b),
        b.activations().name()
    )
}

/// Runs the scheduler over CUDA sessions of `model` until the job channel closes; reports
/// readiness (or why it failed) on `ready` first.
pub(super) fn run(
    cfg: &EngineConfig,
    model: &Model,
    tokenizer: &Arc<Tokenizer>,
    n_ctx: usize,
    ready: SyncSender<Ready>,
    jobs: &Receiver<Job>,
    counters: Arc<Counters>,
) {
    let fail = |e: EngineError| {
        let _ = ready.send(Err(e));
    };
    let backend = match CudaBackend::new() {
        Ok(b) => b,
        Err(e) => return fail(EngineError::Load(e.to_string())),
    };
    let line = backend_line(&backend);
    let cm = match CudaModel::load(backend.clone(), model) {
        Ok(m) => m,
        Err(CudaError::UnsupportedFeature(what)) => {
            let line = format!(
                "{} pass=contract graphs=off kv=f16 act={} sampling=host batch=contract",
                device_fields(&backend),
                backend.activations().name()
            );
            let ops = CudaOps::new(backend);
            return run_pass(
                cfg,
                model,
                tokenizer,
                n_ctx,
                (ready, jobs, counters),
                (ops, what, line),
            );
        }
        Err(e) => {
            return fail(EngineError::Load(format!(
                "uploading the model to the GPU: {e}"
            )));
        }
    };
    let seqs: Result<Vec<CudaTimeline<'_>>, _> = (0..cfg.parallel)
        .map(|_| CudaTimeline::new(&cm, n_ctx))
        .collect();
    let seqs = match seqs {
        Ok(s) => s,
        Err(e) => return fail(EngineError::Load(format!("creating sessions: {e}"))),
    };
    let batch = match CudaBatch::new(&cm, cfg.parallel) {
        Ok(b) => b,
        Err(e) => return fail(EngineError::Load(format!("creating the batch: {e}"))),
    };
    if ready.send(Ok((tokenizer.clone(), n_ctx, line))).is_err() {
        return;
    }
    let rt = ModelRuntime::new(tokenizer);
    Scheduler::new(&rt, seqs, counters, limits(cfg, model, n_ctx))
        .with_batcher(Box::new(CudaBatcher(batch)))
        .run(jobs);
}

/// The scheduler over contract-pass sessions on the device (`ops`), for a model the CUDA
/// model refused for `what`, reporting `line` when ready; a model the contract refuses too
/// fails naming both.
fn run_pass(
    cfg: &EngineConfig,
    model: &Model,
    tokenizer: &Arc<Tokenizer>,
    n_ctx: usize,
    (ready, jobs, counters): (SyncSender<Ready>, &Receiver<Job>, Arc<Counters>),
    (ops, what, line): (CudaOps, &str, String),
) {
    let fail = |e: String| {
        let _ = ready.send(Err(EngineError::Load(e)));
    };
    let sessions: Result<Vec<Session<'_, CudaOps>>, _> = (0..cfg.parallel)
        .map(|_| Session::on(model, ops.clone(), n_ctx, KvType::F16))
        .collect();
    let sessions = match sessions {
        Ok(s) => s,
        Err(e) => {
            return fail(format!(
                "the CUDA model does not implement {what} yet, and the contract pass refuses \
                 the model: {e}"
            ));
        }
    };
    // A step holds at most the prefill budget plus one decode token per slot.
    let batch = match Batch::new(cfg.prefill_chunk.max(1) + cfg.parallel) {
        Ok(b) => b,
        Err(e) => return fail(format!("creating the batch: {e}")),
    };
    if ready.send(Ok((tokenizer.clone(), n_ctx, line))).is_err() {
        return;
    }
    let rt = ModelRuntime::new(tokenizer);
    Scheduler::new(&rt, sessions, counters, limits(cfg, model, n_ctx))
        .with_batcher(Box::new(SessionBatch(batch)))
        .run(jobs);
}
