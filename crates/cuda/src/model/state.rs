//! Exporting and importing a [`CudaSession`]'s state as a [`SessionState`], the type the
//! CPU backend exports and `ferrite-kvstore` writes to disk.
//!
//! The device cache and the state share one row layout: a layer's key cache is `ctx` rows
//! of `n_kv_head × head_dim` f16 values, position-major (row `p` at `p × kv_dim`, keys after
//! rope), the value cache likewise. A state holds, per layer, the first `n` key rows and
//! then the first `n` value rows, so each block is one contiguous copy each way and no
//! transposition is needed. The rows travel as the cache holds them (f16 bits), so an
//! import reproduces the device cache bit for bit.
//!
//! An import writes the caches, the token history and the next-token logits in place: the
//! captured decode graph and the prefill buffers keep pointing at the same allocations and
//! read the position from `tp`, which every step rewrites, so both keep working.

use ferrite_model::{KvType, SessionState};

use super::CudaSession;
use crate::CudaError;

impl CudaSession<'_> {
    /// The token ids at positions `0..n_past`.
    pub fn tokens(&self) -> &[u32] {
        &self.history
    }

    /// Copies the state of the first `n` cached positions to the host: token ids, every
    /// layer's key and value rows (f16) and, when `n` is the whole cache and the last
    /// evaluation's logits are still current, those logits.
    pub fn export_state(&self, n: usize) -> Result<SessionState, CudaError> {
        if n > self.n_past {
            return Err(CudaError::InvalidArgument(format!(
                "cannot export {n} positions of a session holding {}",
                self.n_past
            )));
        }
        let c = &self.model.config;
        let s = &self.model.backend.stream;
        let row = c.kv_dim();
        let size = SessionState::kv_bytes(KvType::F16, c.n_layer, row, n)
            .ok_or_else(|| CudaError::InvalidArgument("session state too large".into()))?;
        let mut kv = Vec::new();
        kv.try_reserve_exact(size)
            .map_err(|_| CudaError::InvalidArgument("cannot allocate the session state".into()))?;
        for (kc, vc) in &self.kv {
            for cache in [kc, vc] {
                let rows = s.clone_dtoh(&cache.slice(..n * row))?;
                kv.extend(rows.iter().flat_map(|x| x.to_le_bytes()));
            }
        }
        let logits = if n == self.n_past && n > 0 && self.has_logits {
            Some(s.clone_dtoh(&self.buf.logits)?)
        } else {
            None
        };
        Ok(SessionState {
            kv_type: KvType::F16,
            n_layer: c.n_layer,
            row,
            tokens: self.history[..n].to_vec(),
            kv,
            logits,
            recurrent: Default::default(),
        })
    }

    /// Replaces the session's contents with the first `n` positions of `state` (all of
    /// them when `n` is `state.n_tokens()`, which also restores the logits it carries).
    /// The state must hold f16 rows of this model's layer count and row width and fit the
    /// context; every check runs before anything is written, so a rejected state leaves
    /// the session unchanged ([`CudaError::SessionState`]).
    pub fn import_state(&mut self, state: &SessionState, n: usize) -> Result<(), CudaError> {
        let c = &self.model.config;
        let logits = state
            .fit(
                KvType::F16,
                (c.n_layer, c.kv_dim()),
                (0, 0),
                self.ctx,
                c.n_vocab,
                n,
            )
            .map_err(CudaError::SessionState)?;
        let tokens = &state.tokens[..n];
        self.reset();
        let s = self.model.backend.stream.clone();
        let row = state.row;
        // One block (a layer's keys or values) holds `n_tokens` rows of 2-byte elements.
        let block = state.n_tokens() * row * 2;
        let mut bits: Vec<u16> = Vec::with_capacity(n * row);
        for (l, (kc, vc)) in self.kv.iter_mut().enumerate() {
            for (i, cache) in [kc, vc].into_iter().enumerate() {
                let at = (2 * l + i) * block;
                bits.clear();
                bits.extend(
                    state.kv[at..at + n * row * 2]
                        .chunks_exact(2)
                        .map(|b| u16::from_le_bytes([b[0], b[1]])),
                );
                s.memcpy_htod(&bits[..], &mut cache.slice_mut(..n * row))?;
            }
        }
        if let Some(l) = logits {
            s.memcpy_htod(l, &mut self.buf.logits)?;
        }
        self.history.extend_from_slice(tokens);
        self.n_past = n;
        self.has_logits = logits.is_some();
        Ok(())
    }

    /// The logits after the last cached token, copied from the device, when the last
    /// evaluation (or an import that carried them) left them current.
    pub fn next_logits(&self) -> Result<Option<Vec<f32>>, CudaError> {
        if !self.has_logits || self.n_past == 0 {
            return Ok(None);
        }
        Ok(Some(
            self.model.backend.stream.clone_dtoh(&self.buf.logits)?,
        ))
    }
}
