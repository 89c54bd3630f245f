//! Greedy decoding on the device: the next token is picked from the logits where they are
//! made (`argmax_f32` in ops.cu), so a step copies back three numbers instead of the
//! vocabulary-wide row. The choice follows the CPU sampler's greedy rule exactly (largest
//! logit in `f32::total_cmp` order, ties to the lowest id, any NaN an error at its first
//! index) and the log-probability is computed in f64 like `ferrite_engine::log_sum_exp`.

use cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};

use super::CudaSession;
use crate::{CudaBackend, CudaError};

/// Blocks of the greedy kernel: each takes a slice of the row, the last to finish combines.
const ARGMAX_BLOCKS: usize = 64;

/// Words of the greedy kernel's `pick` buffer: the three results, the arrival counter and an
/// 8-word record per block (argmax_f32 in ops.cu).
pub(crate) const ARGMAX_PICK_WORDS: usize = 4 + 8 * ARGMAX_BLOCKS;

/// The device's greedy choice after a step.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Greedy {
    /// The chosen token (the lowest id among equal largest logits).
    pub token: u32,
    /// Its log-probability under the raw logits.
    pub logprob: f32,
    /// The first NaN logit's index, if any (the CPU sampler refuses such a row).
    pub first_nan: Option<usize>,
}

impl CudaSession<'_> {
    /// Runs `tokens` as [`CudaSession::eval`] does and picks the next token greedily on the
    /// device; the logits stay on the device (exported with the session state as usual).
    pub fn eval_greedy(&mut self, tokens: &[u32]) -> Result<Greedy, CudaError> {
        self.run(tokens)?;
        self.model.backend.argmax(&self.buf.logits, &self.buf.pick)
    }
}

impl CudaBackend {
    /// The greedy choice over all of `logits`, through `pick` (ARGMAX_PICK_WORDS values, the
    /// counter among them zero between launches).
    pub(crate) fn argmax(
        &self,
        logits: &CudaSlice<f32>,
        pick: &CudaSlice<i32>,
    ) -> Result<Greedy, CudaError> {
        let n = i32::try_from(logits.len())
            .map_err(|_| CudaError::InvalidArgument("logits row too long".into()))?;
        if n == 0 || pick.len() < ARGMAX_PICK_WORDS {
            return Err(CudaError::InvalidArgument(
                "empty logits row or short pick buffer".into(),
            ));
        }
        let cfg = LaunchConfig {
            grid_dim: (ARGMAX_BLOCKS as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut l = self.kernel("argmax_f32")?;
        l.arg(logits).arg(&n).arg(pick);
        // SAFETY: reads the n values of `logits` and writes the first ARGMAX_PICK_WORDS values
        // of `pick` (checked), leaving its counter at zero.
        unsafe { l.launch(cfg) }?;
        let mut out = [0i32; 3];
        self.stream.memcpy_dtoh(&pick.slice(..3), &mut out)?;
        let (token, nan, bits) = (out[0], out[1], out[2]);
        Ok(Greedy {
            token: u32::try_from(token).unwrap_or(0),
            logprob: f32::from_bits(bits as u32),
            first_nan: usize::try_from(nan).ok(),
        })
    }
}
