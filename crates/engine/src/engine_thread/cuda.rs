//! The engine thread on the CUDA backend: the model's weights uploaded once, one
//! [`CudaSession`] per slot, and every scheduler step's one-token inputs decoded together
//! through a [`CudaBatch`] (prompt chunks go session by session through batched prefill).
//!
//! CUDA is loaded at run time (cudarc's dynamic loading), so this module builds and the
//! server runs on machines without it; choosing it there fails at start with the probe's
//! "no CUDA device" error. The prefix cache is CPU-only for now: CUDA slots reuse only the
//! prefix their own cache still holds.

use std::sync::Arc;
use std::sync::mpsc::{Receiver, SyncSender};

use ferrite_cuda::{CudaBackend, CudaBatch, CudaModel, CudaSession};
use ferrite_model::Model;
use ferrite_tokenizer::Tokenizer;

use super::cpu::{ModelRuntime, Ready};
use super::{EngineConfig, EngineError};
use crate::scheduler::{BatchEval, Counters, Job, Limits, Scheduler, Sequence};

/// A slot's CUDA session and the logits of its last evaluation (the scheduler borrows them).
struct CudaSeq<'m> {
    session: CudaSession<'m>,
    ctx: usize,
    n_vocab: usize,
    logits: Vec<f32>,
}

impl CudaSeq<'_> {
    /// Whether `tokens` fit the session (vocabulary, context), checked before anything
    /// runs so a failed batched step has advanced no session.
    fn check(&self, tokens: &[u32]) -> Result<(), String> {
        if tokens.is_empty() {
            return Err("no tokens to evaluate".into());
        }
        if self.session.n_past() + tokens.len() > self.ctx {
            return Err(format!(
                "context full: {} cached + {} new > {}",
                self.session.n_past(),
                tokens.len(),
                self.ctx
            ));
        }
        match tokens.iter().find(|&&t| t as usize >= self.n_vocab) {
            Some(t) => Err(format!(
                "token {t} outside a vocabulary of {}",
                self.n_vocab
            )),
            None => Ok(()),
        }
    }
}

impl Sequence for CudaSeq<'_> {
    fn truncate(&mut self, n: usize) {
        self.session.truncate(n);
    }

    fn eval_last(&mut self, tokens: &[u32]) -> Result<&[f32], String> {
        self.logits = self.session.eval(tokens).map_err(|e| e.to_string())?;
        Ok(&self.logits)
    }
}

/// Continuous batching on the device: the one-token inputs of a step in one
/// [`CudaBatch::step`], longer inputs (prompt chunks) through each session's prefill.
struct CudaBatcher<'m>(CudaBatch<'m>);

impl<'m> BatchEval<CudaSeq<'m>> for CudaBatcher<'m> {
    fn eval_many(
        &mut self,
        seqs: &mut [&mut CudaSeq<'m>],
        inputs: &[&[u32]],
    ) -> Result<Vec<Vec<f32>>, String> {
        if seqs.len() != inputs.len() {
            return Err("sequences and inputs differ in number".into());
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
        let rows = self
            .0
            .step(&mut sessions, &tokens)
            .map_err(|e| e.to_string())?;
        for (i, row) in singles.into_iter().zip(rows) {
            out[i] = row;
        }
        for (i, (s, input)) in seqs.iter_mut().zip(inputs).enumerate() {
            if input.len() > 1 {
                out[i] = s.session.eval(input).map_err(|e| e.to_string())?;
            }
        }
        Ok(out)
    }
}

/// The backend line of a CUDA engine (the fields `ferrite run` prints for CUDA).
fn backend_line(b: &CudaBackend) -> String {
    let info = b.info();
    let (major, minor) = info.compute_capability;
    format!(
        "backend=cuda device=\"{}\" cc={major}.{minor} graphs=on kv=f16 act={} sampling=host batch=device",
        info.name,
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
    let cm = match CudaModel::load(backend, model) {
        Ok(m) => m,
        Err(e) => {
            return fail(EngineError::Load(format!(
                "uploading the model to the GPU: {e}"
            )));
        }
    };
    let n_vocab = cm.config().n_vocab;
    let seqs: Result<Vec<CudaSeq<'_>>, _> = (0..cfg.parallel)
        .map(|_| {
            CudaSession::new(&cm, n_ctx).map(|session| CudaSeq {
                session,
                ctx: n_ctx,
                n_vocab,
                logits: Vec::new(),
            })
        })
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
    let limits = Limits {
        n_ctx,
        prefill_chunk: cfg.prefill_chunk,
    };
    Scheduler::new(&rt, seqs, counters, limits)
        .with_batcher(Box::new(CudaBatcher(batch)))
        .run(jobs);
}
