//! Items of the GPU lane: `cuda-fidelity` (the logits fixture scored in decode mode on the
//! CUDA backend, with the default-precision bounds) and `cuda-batched` (a `CudaBatch` step's
//! rows against each session stepped alone, bit for bit, as docs/ARCHITECTURE.md promises
//! below 2,048 positions). No device is `blocked` with the probe's reason; nothing here may
//! fall back to the CPU (that would report a CPU pass as CUDA): the CUDA load must hold a
//! device model, and the batch must have replayed its batched step.

use ferrite_cuda::{CudaBackend, CudaBatch, CudaSession};
use ferrite_engine::score::ScoreMode;

use super::exact::{PROMPTS, exact_proof};
use super::fidelity::{Bounds, judged, logits_cases};
use super::{Env, Outcome, Proof, Target, argmax};
use ferrite_engine::{AnySession, ScoreSession};

/// Item `cuda-fidelity`.
pub fn fidelity(env: &Env, t: &Target) -> anyhow::Result<Outcome> {
    if let Err(e) = CudaBackend::probe() {
        return Ok(Outcome::blocked(format!("no CUDA device: {e}")));
    }
    let cases = match logits_cases(env, t, 3)? {
        Ok(c) => c,
        Err(reason) => return Ok(Outcome::blocked(reason)),
    };
    let l = t.cuda(env)?;
    let session = l.any_session()?;
    anyhow::ensure!(
        matches!(session, AnySession::Cuda(_)),
        "the CUDA load returned a CPU session"
    );
    let mut src = ScoreSession {
        session,
        n_vocab: l.model.config().n_vocab,
    };
    judged(&mut src, &cases, ScoreMode::Decode, Bounds::Default)
}

/// Context of the sessions of `cuda-batched` (well below the 2,048 positions where a lone
/// session switches to the split-merging attention kernel).
const BATCH_CTX: usize = 256;

/// Item `cuda-batched`.
pub fn batched(env: &Env, t: &Target) -> anyhow::Result<Outcome> {
    if let Err(e) = CudaBackend::probe() {
        return Ok(Outcome::blocked(format!("no CUDA device: {e}")));
    }
    let l = t.cuda(env)?;
    let cm = l
        .cuda
        .as_ref()
        .and_then(|c| c.model())
        .ok_or_else(|| anyhow::anyhow!("the CUDA load holds no device model"))?;
    let steps = if env.quick { 4 } else { 12 };
    let prompts: Vec<Vec<u32>> = PROMPTS
        .iter()
        .map(|p| l.tokenizer.encode(p, true, false))
        .collect();
    // Rows of each session stepped alone, fed `inputs`.
    let alone = |inputs: &[Vec<u32>]| -> anyhow::Result<Vec<Vec<Vec<f32>>>> {
        let mut out = Vec::new();
        for (p, feed) in prompts.iter().zip(inputs) {
            let mut s = CudaSession::new(cm, BATCH_CTX)?;
            s.eval(p)?;
            let mut rows = Vec::new();
            for &tok in feed {
                rows.push(s.eval(&[tok])?);
            }
            out.push(rows);
        }
        Ok(out)
    };
    // Each session's own greedy continuation, so the batch sees what a server would feed.
    let mut inputs = Vec::new();
    for p in &prompts {
        let mut s = CudaSession::new(cm, BATCH_CTX)?;
        let mut next = argmax(&s.eval(p)?);
        let mut feed = Vec::new();
        for _ in 0..steps {
            feed.push(next);
            next = argmax(&s.eval(&[next])?);
        }
        inputs.push(feed);
    }
    let mut sessions = Vec::new();
    for p in &prompts {
        let mut s = CudaSession::new(cm, BATCH_CTX)?;
        s.eval(p)?;
        sessions.push(s);
    }
    let mut batch = CudaBatch::new(cm, sessions.len())?;
    let mut got = vec![Vec::new(); sessions.len()];
    for k in 0..steps {
        let feed: Vec<u32> = inputs.iter().map(|f| f[k]).collect();
        let mut refs: Vec<&mut CudaSession<'_>> = sessions.iter_mut().collect();
        for (rows, row) in got.iter_mut().zip(batch.step(&mut refs, &feed)?) {
            rows.push(row);
        }
    }
    let replays = batch.replays();
    let mut swapped = inputs.clone();
    swapped[0][1] = swapped[0][1].wrapping_add(1) % l.model.config().n_vocab as u32;
    let planted = exact_proof(&got, &alone(&swapped)?, "CUDA batched vs swapped-token");
    let real = exact_proof(&got, &alone(&inputs)?, "CUDA batched vs alone");
    // Path marker: steps of one session or of an unsupported model go session by session.
    let real = if replays == 0 {
        Proof::new(
            false,
            "the batch replayed no batched step (it ran session by session)",
        )
    } else {
        real
    }
    .count("batched_replays", replays as usize);
    Ok(Outcome::Judged { planted, real })
}
