//! Exporting and importing the state of a [`Session`]: the token ids of the used prefix,
//! every attention layer's key and value rows for those positions, a hybrid's recurrent
//! state at the last of them ([`Recurrent`]) and, when the session holds them, the logits
//! that follow the last token.
//!
//! A recurrent state describes one position only: a hybrid exports the positions where it
//! has one (its whole length, or a checkpoint the session kept, see
//! [`crate::session::CHECKPOINT_EVERY`]) and imports whole states only, so a restored
//! session never pretends to hold a prefix it would have to recompute.
//!
//! Positions are implicit: a session always holds positions `0..n` for its `n` tokens.
//! Sliding-window layers keep every row as well (the window is applied when attention
//! reads the cache), so copying all rows of the prefix is the whole window state, and a
//! restored prefix can later be truncated to any shorter length, like a computed one.
//!
//! The rows are copied as the cache stores them (f16 or f32 bits, little-endian, or q8
//! blocks as their scale's bits then their 32 quants), so an import reproduces the cache
//! bit for bit. File formats are not this crate's concern:
//! `ferrite-kvstore` writes a [`SessionState`] to disk.

use crate::{KvType, ModelError, Session};

/// The exported state of the first `n` positions of a session.
#[derive(Debug, Clone, PartialEq)]
pub struct SessionState {
    /// Element type of the rows in `kv`.
    pub kv_type: KvType,
    /// Number of layers.
    pub n_layer: usize,
    /// Stored elements per key (and per value) row ([`KvType::row_elems`]):
    /// `n_kv_head × head_dim` values, or for q8 their blocks of 32.
    pub row: usize,
    /// Token ids at positions `0..n`.
    pub tokens: Vec<u32>,
    /// For each layer in order: the `n` key rows, then the `n` value rows; each element in
    /// little-endian bytes ([`KvType::elem_bytes`] per element).
    pub kv: Vec<u8>,
    /// Logits after token `n - 1` (`n_vocab` values), when the session had them.
    pub logits: Option<Vec<f32>>,
    /// The recurrent layers' state after token `n - 1` (empty for attention-only models).
    pub recurrent: Recurrent,
}

/// The recurrent state of a hybrid's DeltaNet layers at one position: `slots` layers of
/// `len` f32 values each, laid out as [`ferrite_arch::DeltaNetShape::state_len`] says.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Recurrent {
    /// Layers with a recurrent state.
    pub slots: usize,
    /// Values of each layer's state.
    pub len: usize,
    /// `slots × len` values, slot after slot.
    pub values: Vec<f32>,
}

impl SessionState {
    /// Number of positions held.
    pub fn n_tokens(&self) -> usize {
        self.tokens.len()
    }

    /// Bytes of `kv` that `n_tokens` positions of `n_layer` layers with rows of `row` stored
    /// elements of type `ty` need (`None` on overflow).
    pub fn kv_bytes(ty: KvType, n_layer: usize, row: usize, n_tokens: usize) -> Option<usize> {
        n_layer
            .checked_mul(2)?
            .checked_mul(n_tokens)?
            .checked_mul(row)?
            .checked_mul(ty.elem_bytes())
    }

    /// Checks that `kv` has exactly the size the other fields imply.
    pub fn check(&self) -> Result<(), ModelError> {
        let want = Self::kv_bytes(self.kv_type, self.n_layer, self.row, self.n_tokens());
        if want != Some(self.kv.len()) {
            return Err(ModelError::InvalidArgument(format!(
                "session state: {} KV bytes for {} tokens, expected {want:?}",
                self.kv.len(),
                self.n_tokens()
            )));
        }
        let r = &self.recurrent;
        if r.slots.checked_mul(r.len) != Some(r.values.len()) {
            return Err(ModelError::InvalidArgument(format!(
                "session state: {} recurrent values for {} slots of {}",
                r.values.len(),
                r.slots,
                r.len
            )));
        }
        Ok(())
    }

    /// Checks, before anything is written, that the first `n` positions of this state fit a
    /// cache of `kv_type` with `n_layer` layers of `row`-value rows, a context of `ctx` and a
    /// vocabulary of `n_vocab`; returns the logits to restore (only when `n` is the whole
    /// state). Every backend's import runs this same check.
    #[allow(clippy::too_many_arguments)]
    pub fn fit(
        &self,
        kv_type: KvType,
        (n_layer, row): (usize, usize),
        (slots, len): (usize, usize),
        ctx: usize,
        n_vocab: usize,
        n: usize,
    ) -> Result<Option<&[f32]>, ModelError> {
        self.check()?;
        let bad = |what: String| {
            Err(ModelError::InvalidArgument(format!(
                "session state: {what}"
            )))
        };
        if self.kv_type != kv_type {
            return bad(format!(
                "KV type {:?}, the cache holds {kv_type:?}",
                self.kv_type
            ));
        }
        if (self.n_layer, self.row) != (n_layer, row) {
            return bad(format!(
                "{} layers of {}-value rows, model has {n_layer} of {row}",
                self.n_layer, self.row
            ));
        }
        if n > self.n_tokens() || n > ctx {
            return bad(format!(
                "{n} positions requested, state holds {}, context {ctx}",
                self.n_tokens()
            ));
        }
        let r = &self.recurrent;
        if (r.slots, r.len) != (slots, len) {
            return bad(format!(
                "{} recurrent states of {} values, model has {slots} of {len}",
                r.slots, r.len
            ));
        }
        if slots > 0 && n != self.n_tokens() {
            return bad(format!(
                "{n} of {} positions: a recurrent state restores only the position it was \
                 saved at",
                self.n_tokens()
            ));
        }
        if let Some(&token) = self.tokens[..n].iter().find(|&&t| t as usize >= n_vocab) {
            return Err(ModelError::TokenOutOfRange { token, n_vocab });
        }
        match &self.logits {
            Some(l) if n == self.n_tokens() && n > 0 => {
                if l.len() != n_vocab {
                    return bad(format!("{} logits, vocabulary {n_vocab}", l.len()));
                }
                Ok(Some(l))
            }
            _ => Ok(None),
        }
    }

    /// Bytes of one block of rows (the keys or the values of one layer) for `n` positions.
    fn block(&self, n: usize) -> usize {
        n * self.row * self.kv_type.elem_bytes()
    }
}

impl Session<'_> {
    /// The logits after the last cached token, when the last evaluation produced them and
    /// nothing was truncated since (also after an import that carried them).
    pub fn next_logits(&self) -> Option<&[f32]> {
        let n_vocab = self.model().config().n_vocab;
        let end = self.next_logits_end?;
        self.logits.get(end.checked_sub(n_vocab)?..end)
    }

    /// Copies the state of the first `n` cached positions. The logits are included when
    /// `n` is the whole cache and [`Session::next_logits`] has them.
    pub fn export_state(&self, n: usize) -> Result<SessionState, ModelError> {
        if n > self.n_past {
            return Err(ModelError::InvalidArgument(format!(
                "cannot export {n} positions of a session holding {}",
                self.n_past
            )));
        }
        let recurrent = self.recurrent_at(n)?;
        let ty = self.kv.ty();
        let row = self.kv.row();
        let n_layer = self.kv.n_layer();
        let size = SessionState::kv_bytes(ty, n_layer, row, n)
            .ok_or_else(|| ModelError::InvalidArgument("session state too large".into()))?;
        let mut kv = Vec::new();
        kv.try_reserve_exact(size)
            .map_err(|_| ModelError::InvalidArgument("cannot allocate the session state".into()))?;
        for layer in 0..n_layer {
            for value in [false, true] {
                self.kv.export_rows(layer, value, n, &mut kv);
            }
        }
        let logits = if n == self.n_past {
            self.next_logits().map(<[f32]>::to_vec)
        } else {
            None
        };
        Ok(SessionState {
            kv_type: ty,
            n_layer,
            row,
            tokens: self.history[..n].to_vec(),
            kv,
            logits,
            recurrent,
        })
    }

    /// Replaces the session's contents with the first `n` positions of `state` (all of
    /// them when `n` is `state.n_tokens()`, which also restores the logits it carries).
    /// The state must come from the same model shape and KV type; every check runs before
    /// anything is written, so on error the session is unchanged.
    pub fn import_state(&mut self, state: &SessionState, n: usize) -> Result<(), ModelError> {
        let c = self.model().config();
        let n_layer = self.kv.n_layer();
        let logits = state.fit(
            self.kv.ty(),
            (n_layer, self.kv.row()),
            c.state_slots(),
            self.ctx(),
            c.n_vocab,
            n,
        )?;
        let tokens = &state.tokens[..n];
        self.reset();
        self.restore_recurrent(n, &state.recurrent.values)?;
        let full = state.block(state.n_tokens());
        let part = state.block(n);
        for layer in 0..n_layer {
            for value in [false, true] {
                let at = (layer * 2 + usize::from(value)) * full;
                let src = &state.kv[at..at + part];
                self.kv.import_rows(layer, value, n, src);
            }
        }
        self.history.extend_from_slice(tokens);
        self.n_past = n;
        if let Some(l) = logits {
            self.logits[..l.len()].copy_from_slice(l);
            self.next_logits_end = Some(l.len());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use ferrite_cpu::ThreadPool;
    use ferrite_gguf::GgmlType;

    use super::*;
    use crate::testutil::{VOCAB, tiny_model};
    use crate::{Outputs, Precision};

    fn tokens(n: usize) -> Vec<u32> {
        (0..n).map(|i| ((i * 53 + 7) % VOCAB) as u32).collect()
    }

    /// Logits of every position from `prefix` on: a session that restored the first
    /// `prefix` positions of `state` evaluates the rest.
    fn continued(
        s: &mut Session<'_>,
        state: &SessionState,
        prefix: usize,
        all: &[u32],
    ) -> Vec<f32> {
        s.import_state(state, prefix).unwrap();
        assert_eq!((s.n_past(), s.tokens()), (prefix, &all[..prefix]));
        s.eval(&all[prefix..], Outputs::All).unwrap().data.to_vec()
    }

    #[test]
    fn restored_prefixes_continue_bit_identically() {
        // Oracle: a fresh full computation. Matmul and attention compute each token's
        // outputs independently of the other tokens of a call, so the continued logits must
        // be equal bit for bit, not just close. Gemma's tiny window is 4: prefixes on both
        // sides of it, and one token before the end.
        let pool = ThreadPool::new(2).unwrap();
        for arch in ["llama", "gemma3", "gemma2", "gemma3_linear", "phi3"] {
            let m = tiny_model(arch, GgmlType::Q8_0, Precision::Default);
            // q8 needs head sizes of whole blocks: the tiny gemma3 has them.
            let q8 = (arch == "gemma3").then_some(KvType::Q8);
            for ty in [KvType::F16, KvType::F32].into_iter().chain(q8) {
                let all = tokens(40);
                let mut fresh = Session::new(&m, &pool, 64, ty).unwrap();
                let want = fresh.eval(&all, Outputs::All).unwrap().data.to_vec();
                let state = fresh.export_state(all.len()).unwrap();
                assert_eq!(state.logits.as_deref(), Some(&want[39 * VOCAB..]));
                let mut s = Session::new(&m, &pool, 64, ty).unwrap();
                for prefix in [1, 3, 4, 5, 17, 39] {
                    let got = continued(&mut s, &state, prefix, &all);
                    assert!(
                        got.iter()
                            .zip(&want[prefix * VOCAB..])
                            .all(|(a, b)| a.to_bits() == b.to_bits()),
                        "{arch} {ty:?} prefix {prefix}"
                    );
                }
                // Importing everything brings the logits back without evaluating.
                s.import_state(&state, all.len()).unwrap();
                assert_eq!(s.next_logits(), Some(&want[39 * VOCAB..]));
            }
        }
    }

    #[test]
    fn a_perturbed_key_row_breaks_bit_identity() {
        // Test of the test: one changed key bit at a visible position must change the
        // continued logits, so the comparison above can fail.
        let pool = ThreadPool::new(1).unwrap();
        let m = tiny_model("llama", GgmlType::F32, Precision::Default);
        let all = tokens(12);
        let mut s = Session::new(&m, &pool, 32, KvType::F16).unwrap();
        let want = s.eval(&all, Outputs::All).unwrap().data.to_vec();
        let mut state = s.export_state(12).unwrap();
        // Layer 0, key row of position 2: flip a low mantissa bit of its first element.
        let at = 2 * state.row * 2;
        state.kv[at] ^= 1;
        let got = continued(&mut s, &state, 8, &all);
        assert_ne!(got, want[8 * VOCAB..].to_vec());
    }

    #[test]
    fn export_import_is_exact_and_partial_states_carry_no_logits() {
        let pool = ThreadPool::new(1).unwrap();
        let m = tiny_model("gemma3", GgmlType::F32, Precision::Default);
        let mut a = Session::new(&m, &pool, 32, KvType::F32).unwrap();
        a.eval(&tokens(10), Outputs::Last).unwrap();
        let whole = a.export_state(10).unwrap();
        let part = a.export_state(6).unwrap();
        assert!(part.logits.is_none() && whole.logits.is_some());
        let mut b = Session::new(&m, &pool, 32, KvType::F32).unwrap();
        b.import_state(&whole, 10).unwrap();
        assert_eq!(b.export_state(10).unwrap(), whole);
        b.import_state(&whole, 6).unwrap();
        assert_eq!(b.export_state(6).unwrap(), part);
        assert!(b.next_logits().is_none());
        a.truncate(9);
        assert!(
            a.next_logits().is_none(),
            "truncation invalidates the logits"
        );
        assert!(a.export_state(10).is_err());
    }

    #[test]
    fn mismatched_states_are_rejected_and_leave_the_session_usable() {
        let pool = ThreadPool::new(1).unwrap();
        let m = tiny_model("llama", GgmlType::F32, Precision::Default);
        let mut s = Session::new(&m, &pool, 16, KvType::F16).unwrap();
        s.eval(&tokens(8), Outputs::Last).unwrap();
        let good = s.export_state(8).unwrap();
        let mut f32s = Session::new(&m, &pool, 16, KvType::F32).unwrap();
        assert!(f32s.import_state(&good, 8).is_err(), "KV type");
        let mut small = Session::new(&m, &pool, 4, KvType::F16).unwrap();
        assert!(small.import_state(&good, 8).is_err(), "context");
        let mut cases = Vec::new();
        let mut c = good.clone();
        c.kv.pop();
        cases.push(c);
        let mut c = good.clone();
        c.n_layer += 1;
        cases.push(c);
        let mut c = good.clone();
        c.tokens[3] = VOCAB as u32;
        cases.push(c);
        let mut c = good.clone();
        c.logits = Some(vec![0.0; 3]);
        cases.push(c);
        let mut c = good.clone();
        c.recurrent = Recurrent {
            slots: 1,
            len: 2,
            values: vec![0.0; 2],
        };
        cases.push(c);
        for (i, bad) in cases.iter().enumerate() {
            assert!(s.import_state(bad, bad.n_tokens()).is_err(), "case {i}");
        }
        assert!(s.import_state(&good, 9).is_err());
        s.import_state(&good, 8).unwrap();
        assert_eq!(s.tokens(), &tokens(8)[..]);
    }
}
