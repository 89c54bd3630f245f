//! Top-k selection on the device for sampling (`topk_f32` in topk.cu): the `k` best logits
//! of the step's row, in the CPU sampler's order (largest first by `f32::total_cmp`, ties
//! to the lower id), with the row's log-sum-exp and first NaN, copied back as `4 + 2k`
//! words instead of the row. `ferrite_engine::Sampler::sample_candidates` turns them into
//! exactly the token the host sampler would pick from the whole row, for the settings it
//! accepts (greedy, or a top-k cut of at most [`TOPK_MAX`] with no penalties).

use cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};

use super::CudaSession;
use crate::{CudaBackend, CudaError};

/// Most candidates one selection returns (the kernel's shared-memory sort).
pub const TOPK_MAX: usize = 256;

/// Words of the selection's output for `k` candidates.
pub(super) fn out_len(k: usize) -> usize {
    4 + 2 * k
}

/// The device's selection from one logits row.
#[derive(Debug, Clone, PartialEq)]
pub struct TopCandidates {
    /// `(id, logit)` of the best non-NaN values, largest first, ties to the lower id:
    /// `min(k, non-NaN count)` of them.
    pub best: Vec<(u32, f32)>,
    /// `log(Σ exp(logit))` over the row's non-NaN values, in f64.
    pub lse: f64,
    /// The first NaN's index, if any.
    pub first_nan: Option<usize>,
    /// Length of the row.
    pub n_vocab: usize,
}

impl CudaSession<'_> {
    /// Runs `tokens` as [`CudaSession::eval`] does and selects the `k` best logits of the
    /// last row on the device (`1 <= k <= TOPK_MAX`); the logits stay on the device.
    pub fn eval_candidates(
        &mut self,
        tokens: &[u32],
        k: usize,
    ) -> Result<TopCandidates, CudaError> {
        self.run(tokens)?;
        self.model
            .backend
            .top_candidates(&self.buf.logits, k, &self.buf.cand)
    }
}

impl CudaBackend {
    /// The `k` best of `logits` through `out` ([`out_len`] of `k` words at least).
    pub(crate) fn top_candidates(
        &self,
        logits: &CudaSlice<f32>,
        k: usize,
        out: &CudaSlice<u32>,
    ) -> Result<TopCandidates, CudaError> {
        if !(1..=TOPK_MAX).contains(&k) || out.len() < out_len(k) {
            return Err(CudaError::InvalidArgument(format!(
                "top-k selection of {k} (1..={TOPK_MAX})"
            )));
        }
        let n = i32::try_from(logits.len())
            .map_err(|_| CudaError::InvalidArgument("logits row too long".into()))?;
        if n == 0 {
            return Err(CudaError::InvalidArgument("empty logits row".into()));
        }
        let k32 = k as i32;
        let cfg = LaunchConfig {
            grid_dim: (1, 1, 1),
            block_dim: (1024, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut l = self.kernel("topk_f32")?;
        l.arg(logits).arg(&n).arg(&k32).arg(out);
        // SAFETY: reads the n values of `logits`, writes out_len(k) words of `out` (checked).
        unsafe { l.launch(cfg) }?;
        let words = self.stream.clone_dtoh(&out.slice(..out_len(k)))?;
        Ok(decode(&words, k, logits.len()))
    }

    /// The device top-k selection over a host row (the decode path's `topk_f32`).
    pub fn top_candidates_host(
        &self,
        logits: &[f32],
        k: usize,
    ) -> Result<TopCandidates, CudaError> {
        let x = self.stream.clone_htod(logits)?;
        let out = self.stream.alloc_zeros::<u32>(out_len(k.max(1)))?;
        self.top_candidates(&x, k, &out)
    }
}

/// The kernel's output words: `[first NaN or u32::MAX, taken, lse low, lse high, ids[k],
/// logit bits[k]]`.
fn decode(words: &[u32], k: usize, n_vocab: usize) -> TopCandidates {
    let taken = (words[1] as usize).min(k);
    TopCandidates {
        best: (0..taken)
            .map(|i| (words[4 + i], f32::from_bits(words[4 + k + i])))
            .collect(),
        lse: f64::from_bits(u64::from(words[2]) | (u64::from(words[3]) << 32)),
        first_nan: (words[0] != u32::MAX).then_some(words[0] as usize),
        n_vocab,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_words_decode() {
        let lse = (-1.25f64).to_bits();
        let words = [
            u32::MAX,
            2,
            lse as u32,
            (lse >> 32) as u32,
            7,
            3,
            0,
            2.5f32.to_bits(),
            (-0.0f32).to_bits(),
            0,
        ];
        let c = decode(&words, 3, 10);
        assert_eq!(c.best, vec![(7, 2.5), (3, -0.0)]);
        assert_eq!(c.lse, -1.25);
        assert_eq!(c.first_nan, None);
        let mut nan = words;
        nan[0] = 9;
        assert_eq!(decode(&nan, 3, 10).first_nan, Some(9));
    }
}
