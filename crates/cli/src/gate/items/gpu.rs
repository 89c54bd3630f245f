//! Item `cuda-fidelity` (GPU lane): the logits fixture scored in decode mode on the CUDA
//! backend, with the default-precision bounds. No device is `blocked` with the probe's
//! reason; nothing here may fall back to the CPU (that would report a CPU pass as CUDA).

use ferrite_cuda::CudaBackend;
use ferrite_engine::score::ScoreMode;

use super::fidelity::{Bounds, judged, logits_cases};
use super::{Env, Outcome, Target};
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
