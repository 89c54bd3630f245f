//! One inference timeline over a [`Model`] on one backend: the KV cache, the position
//! counter and all scratch buffers, allocated once in [`Session::new`] (the CPU) or
//! [`Session::on`] (any backend implementing [`Weights`]) so that decode steps allocate no
//! buffers (only attention's small per-layer job lists).
//!
//! [`Session::eval`] runs the one forward pass (`forward`) over any number of new tokens,
//! in chunks of at most [`PREFILL_CHUNK`] tokens (every weight product is one product over
//! the chunk), and returns the logits the caller asked for. The session never computes a
//! value itself: what it keeps beside the backend's store is positions, token history and
//! host copies of a hybrid's recurrent state at checkpoints.

use ferrite_backend::{KvType, Segment};
use ferrite_cpu::{CpuBackend, ThreadPool};

use crate::ModelError;
use crate::model::Model;

mod forward;

pub use forward::Weights;
pub(crate) use forward::{Faults, Scratch, forward_rows};

/// Most tokens one forward chunk processes; bounds the scratch memory of long prompts.
pub const PREFILL_CHUNK: usize = 256;

/// Which positions of an [`Session::eval`] call get logits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outputs {
    /// Only the last token (generation).
    Last,
    /// Every token (scoring a whole sequence).
    All,
    /// Tokens `i..` of the call (teacher-forced scoring of a continuation).
    From(usize),
}

/// Logits returned by [`Session::eval`]: `n_rows()` rows of `n_vocab` values, row `r`
/// belonging to token `first + r` of the call.
#[derive(Debug, Clone, Copy)]
pub struct Logits<'a> {
    /// Index (within the call's tokens) of the first row.
    pub first: usize,
    /// Values per row.
    pub n_vocab: usize,
    /// Row-major logits.
    pub data: &'a [f32],
}

impl<'a> Logits<'a> {
    /// Number of rows.
    pub fn n_rows(&self) -> usize {
        self.data.len() / self.n_vocab.max(1)
    }

    /// Row `r` (`None` past the end).
    pub fn row(&self, r: usize) -> Option<&'a [f32]> {
        self.data.get(r * self.n_vocab..(r + 1) * self.n_vocab)
    }

    /// The last row.
    pub fn last(&self) -> Option<&'a [f32]> {
        self.n_rows().checked_sub(1).and_then(|r| self.row(r))
    }
}

/// A hybrid keeps its recurrent state at every position that is a multiple of this (the
/// disk prefix cache's block size), so that a truncation or an export lands on one.
pub const CHECKPOINT_EVERY: usize = 64;

/// Recurrent-state checkpoints a session keeps, the latest ones: their memory is this many
/// times the state's (for Qwen3-Next 80B, 36 layers of about 2.1 MiB: 75 MiB each), and
/// a truncation to before the oldest replays from position 0.
pub const CHECKPOINTS_KEPT: usize = 4;

/// A KV cache plus positions over one model on backend `B` (the CPU's by default): the
/// state of one conversation.
pub struct Session<'m, B: Weights = CpuBackend<'m>> {
    model: &'m Model,
    b: B,
    pub(crate) kv: B::Kv,
    ctx: usize,
    /// Whether the model keeps recurrent state (a hybrid).
    recurrent: bool,
    pub(crate) n_past: usize,
    /// The tokens at positions `0..n_past` (capacity `ctx`, allocated once).
    pub(crate) history: Vec<u32>,
    chunk: usize,
    s: forward::ScratchOf<B>,
    pub(crate) logits: Vec<f32>,
    /// `Some(end)` when `logits[end - n_vocab..end]` are the logits after token `n_past - 1`
    /// (kept for snapshots; see `crate::snapshot`).
    pub(crate) next_logits_end: Option<usize>,
    /// Whether the recurrent state of a hybrid's DeltaNet layers must be rebuilt before the
    /// next pass. The state cannot be rolled back, so shortening the session (or a pass
    /// that failed part way) leaves it describing positions the session no longer has; the
    /// next pass restores the latest checkpoint at or before `n_past` (position 0: the
    /// zero state) and replays the kept tokens after it.
    state_stale: bool,
    /// Copies of the recurrent state at positions that are multiples of
    /// [`CHECKPOINT_EVERY`], oldest first, at most [`CHECKPOINTS_KEPT`] (empty for models
    /// of attention only).
    checkpoints: Vec<(usize, Vec<f32>)>,
    #[cfg(test)]
    pub(crate) mutation: Option<crate::session::Mutation>,
}

/// Deliberate defects used by the tests to prove the fixture comparison catches them.
#[cfg(test)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mutation {
    /// Drop the attention residual of this layer.
    SkipAttnResidual(usize),
    /// Rope with twice the model's base (a misread `rope_theta`): every relative angle
    /// but zero turns wrong.
    RopeWrongBase,
    /// Leave out the q/k/v biases.
    DropQkvBias,
    /// Ignore the rope frequency factors (plain rope).
    IgnoreRopeFactors,
    /// Route every token to its single best expert instead of the top k.
    TopOneExpert,
    /// Attention scores without their soft cap.
    DropAttnSoftcap,
    /// Attention without its sink logits.
    DropSinks,
    /// Router and expert products without their biases.
    DropExpertBias,
}

impl<B: Weights> std::fmt::Debug for Session<'_, B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("backend", &self.b.name())
            .field("ctx", &self.ctx)
            .field("n_past", &self.n_past)
            .field("checkpoints", &self.checkpoints.len())
            .finish_non_exhaustive()
    }
}

impl<'m> Session<'m> {
    /// A session of `ctx` positions with a KV cache of type `kv`, on the CPU.
    pub fn new(
        model: &'m Model,
        pool: &'m ThreadPool,
        ctx: usize,
        kv: KvType,
    ) -> Result<Session<'m>, ModelError> {
        Session::on(model, CpuBackend::new(pool), ctx, kv)
    }
}

impl<'m, B: Weights> Session<'m, B> {
    /// A session of `ctx` positions with a KV cache of type `kv` on backend `b`, which
    /// serves `model` alone ([`Weights`]). Every op the model needs is asked of `b` first:
    /// an op it refuses is an error here, before anything runs.
    pub fn on(model: &'m Model, b: B, ctx: usize, kv: KvType) -> Result<Self, ModelError> {
        if ctx == 0 {
            return Err(ModelError::InvalidArgument("context size 0".into()));
        }
        let c = model.config();
        let chunk = PREFILL_CHUNK.min(ctx);
        forward::require_ops(&b, model, kv)?;
        let s = Scratch::new(&b, c, chunk)?;
        let mut history = Vec::new();
        history
            .try_reserve_exact(ctx)
            .map_err(|_| ModelError::InvalidArgument("cannot allocate the token history".into()))?;
        let (slots, len) = c.state_slots();
        let mut store = b.kv(
            kv,
            c.kv_layers(),
            ctx,
            (c.n_kv_head, c.head_dim),
            c.kv_values(),
        )?;
        b.kv_state(&mut store, slots, len)?;
        Ok(Session {
            model,
            b,
            kv: store,
            ctx,
            recurrent: slots * len > 0,
            n_past: 0,
            history,
            chunk,
            s,
            logits: vec![0.0; c.n_vocab],
            next_logits_end: None,
            state_stale: false,
            checkpoints: Vec::new(),
            #[cfg(test)]
            mutation: None,
        })
    }

    /// Tokens in the cache (the position of the next token).
    pub fn n_past(&self) -> usize {
        self.n_past
    }

    /// Context size.
    pub fn ctx(&self) -> usize {
        self.ctx
    }

    /// The backend this session runs on.
    pub fn backend(&self) -> &B {
        &self.b
    }

    /// This session's part of a batched forward pass: `len` new tokens at its next
    /// positions.
    pub(crate) fn segment(&mut self, len: usize) -> Segment<'_, B::Kv> {
        Segment {
            kv: &mut self.kv,
            pos0: self.n_past,
            len,
        }
    }

    /// The model.
    pub fn model(&self) -> &'m Model {
        self.model
    }

    /// Path marker of MoE models: `(expert FFN runs, token rows they processed)` since the
    /// session was created; `None` for dense models. A decode step of a top-k model adds
    /// exactly `(k, k)` per layer: only the selected experts ran.
    pub fn experts_run(&self) -> Option<(usize, usize)> {
        self.s.moe.as_ref().map(|m| (m.experts_run, m.expert_rows))
    }

    /// Forgets every cached token after the first `n` (no-op when `n >= n_past`). Entries
    /// past `n` are overwritten by the next `eval`, so nothing needs clearing.
    pub fn truncate(&mut self, n: usize) {
        if n < self.n_past {
            self.next_logits_end = None;
            self.checkpoints.retain(|(at, _)| *at <= n);
            if self.recurrent {
                self.state_stale = true;
            }
        }
        // Position 0 is the zero state, also after a failed first pass (a device that
        // cannot clear it leaves it stale, for the next pass to clear or report).
        if n == 0 && self.recurrent {
            self.state_stale = self.b.state_set(&mut self.kv, None).is_err();
        }
        self.n_past = self.n_past.min(n);
        self.history.truncate(self.n_past);
    }

    /// The longest prefix of at most `n` held positions that [`Session::truncate`] keeps
    /// without replaying any of it: `n` itself, unless the model is a hybrid, whose state is
    /// kept at its current position and its checkpoints only.
    pub fn reusable(&self, n: usize) -> usize {
        let n = n.min(self.n_past);
        if !self.recurrent || (n == self.n_past && !self.state_stale) {
            return n;
        }
        self.checkpoints
            .iter()
            .rev()
            .map(|(at, _)| *at)
            .find(|&at| at <= n)
            .unwrap_or(0)
    }

    /// Marks the recurrent state as not describing `history` (a pass failed part way).
    pub(crate) fn state_failed(&mut self) {
        if self.recurrent {
            self.state_stale = true;
        }
    }

    /// Keeps a copy of the recurrent state, which describes position `at`, when that is a
    /// checkpoint position, replacing the oldest copy once [`CHECKPOINTS_KEPT`] are held.
    fn checkpoint(&mut self, at: usize) -> Result<(), ModelError> {
        if !self.recurrent || self.state_stale || at == 0 || !at.is_multiple_of(CHECKPOINT_EVERY) {
            return Ok(());
        }
        if self.checkpoints.last().is_some_and(|(p, _)| *p == at) {
            return Ok(());
        }
        let mut copy = if self.checkpoints.len() == CHECKPOINTS_KEPT {
            self.checkpoints.remove(0).1
        } else {
            Vec::new()
        };
        self.b.state_get(&self.kv, &mut copy)?;
        self.checkpoints.push((at, copy));
        Ok(())
    }

    /// Rebuilds a stale recurrent state: the latest checkpoint at or before `n_past` (or
    /// the zero state), then the kept tokens after it replayed.
    pub(crate) fn restore_state(&mut self) -> Result<(), ModelError> {
        if !self.state_stale {
            return Ok(());
        }
        let end = self.n_past;
        let from = match self.checkpoints.iter().rev().find(|(at, _)| *at <= end) {
            Some((at, values)) => {
                self.b.state_set(&mut self.kv, Some(values))?;
                *at
            }
            None => {
                self.b.state_set(&mut self.kv, None)?;
                0
            }
        };
        let kept = std::mem::take(&mut self.history);
        self.n_past = from;
        self.state_stale = false;
        let mut res = Ok(());
        while self.n_past < end {
            let len = self.chunk_len(end - self.n_past, end);
            let chunk = &kept[self.n_past..self.n_past + len];
            // No logits: a chunk's outputs start past its rows.
            res = self.forward_chunk(chunk, len, 0, 0, &mut None);
            if res.is_err() {
                break;
            }
            self.n_past += len;
            res = self.checkpoint(self.n_past);
            if res.is_err() {
                break;
            }
        }
        self.n_past = end;
        self.history = kept;
        self.state_stale = res.is_err();
        res
    }

    /// Rows of the next chunk of a pass with `left` rows to go that ends at position
    /// `end`: the prefill chunk, cut short for a hybrid so that it stops on each checkpoint
    /// position among the last [`CHECKPOINTS_KEPT`] before `end` (the ones it will keep).
    fn chunk_len(&self, left: usize, end: usize) -> usize {
        let len = self.chunk.min(left);
        if !self.recurrent {
            return len;
        }
        let keep_from = end.saturating_sub(CHECKPOINTS_KEPT * CHECKPOINT_EVERY);
        let first =
            self.n_past.max(keep_from) / CHECKPOINT_EVERY * CHECKPOINT_EVERY + CHECKPOINT_EVERY;
        if first < self.n_past + len {
            first - self.n_past
        } else {
            len
        }
    }

    /// The recurrent state at position `n`: the current one, a checkpoint's, or the zero
    /// state at 0 (empty for models of attention only).
    pub(crate) fn recurrent_at(&self, n: usize) -> Result<crate::Recurrent, ModelError> {
        let (slots, len) = self.model.config().state_slots();
        if slots == 0 {
            return Ok(crate::Recurrent::default());
        }
        let values = if n == self.n_past && !self.state_stale {
            let mut v = Vec::new();
            self.b.state_get(&self.kv, &mut v)?;
            v
        } else if n == 0 {
            vec![0.0; slots * len]
        } else {
            match self.checkpoints.iter().find(|(at, _)| *at == n) {
                Some((_, v)) => v.clone(),
                None => {
                    return Err(ModelError::InvalidArgument(format!(
                        "no recurrent state at position {n} (kept: {:?} and {})",
                        self.checkpoints.iter().map(|c| c.0).collect::<Vec<_>>(),
                        self.n_past
                    )));
                }
            }
        };
        Ok(crate::Recurrent { slots, len, values })
    }

    /// Sets the recurrent state of a session just reset for an import of `n` positions.
    pub(crate) fn restore_recurrent(&mut self, n: usize, values: &[f32]) -> Result<(), ModelError> {
        if !self.recurrent {
            return Ok(());
        }
        self.b.state_set(&mut self.kv, Some(values))?;
        self.state_stale = false;
        self.checkpoint(n)
    }

    /// Forgets all cached tokens.
    pub fn reset(&mut self) {
        self.truncate(0);
    }

    /// The tokens in the cache, position by position.
    pub fn tokens(&self) -> &[u32] {
        &self.history
    }

    /// Makes the cache hold exactly `tokens`, reusing the longest cached prefix and
    /// evaluating only the rest, and returns the last token's logits. At least the last
    /// token is always evaluated, since its logits are not kept.
    pub fn sync(&mut self, tokens: &[u32]) -> Result<Logits<'_>, ModelError> {
        if tokens.is_empty() {
            return Err(ModelError::InvalidArgument("no tokens to evaluate".into()));
        }
        let common = self
            .history
            .iter()
            .zip(tokens)
            .take_while(|(a, b)| a == b)
            .count()
            .min(tokens.len().saturating_sub(1));
        self.truncate(common);
        self.eval(&tokens[common..], Outputs::Last)
    }

    /// Runs `tokens` at positions `n_past..n_past+len` and returns the requested logits.
    pub fn eval(&mut self, tokens: &[u32], outputs: Outputs) -> Result<Logits<'_>, ModelError> {
        self.eval_inner(tokens, outputs, None)
    }

    /// Like [`Session::eval`] with [`Outputs::All`], also returning the residual stream after
    /// every layer: `hidden[l]` holds `tokens.len() × d_model` values after layer `l`. For
    /// comparing layer by layer with [`crate::reference`].
    pub fn eval_hidden(
        &mut self,
        tokens: &[u32],
    ) -> Result<(Logits<'_>, Vec<Vec<f32>>), ModelError> {
        let mut hidden = vec![Vec::new(); self.model.config().n_layer];
        let logits = self.eval_inner(tokens, Outputs::All, Some(&mut hidden))?;
        Ok((logits, hidden))
    }

    fn eval_inner(
        &mut self,
        tokens: &[u32],
        outputs: Outputs,
        mut hidden: Option<&mut Vec<Vec<f32>>>,
    ) -> Result<Logits<'_>, ModelError> {
        let n = tokens.len();
        if n == 0 {
            return Err(ModelError::InvalidArgument("no tokens to evaluate".into()));
        }
        if self.n_past + n > self.ctx() {
            return Err(ModelError::ContextFull {
                n_past: self.n_past,
                n_new: n,
                ctx: self.ctx(),
            });
        }
        let n_vocab = self.model.config().n_vocab;
        if let Some(&token) = tokens.iter().find(|&&t| t as usize >= n_vocab) {
            return Err(ModelError::TokenOutOfRange { token, n_vocab });
        }
        let first = match outputs {
            Outputs::Last => n - 1,
            Outputs::All => 0,
            Outputs::From(i) if i < n => i,
            Outputs::From(i) => {
                return Err(ModelError::InvalidArgument(format!(
                    "logits requested from token {i} of {n}"
                )));
            }
        };
        let need = (n - first) * n_vocab;
        if self.logits.len() < need {
            // Asking for all logits of a long input on a large vocabulary can need gigabytes:
            // report it instead of aborting.
            self.logits
                .try_reserve_exact(need - self.logits.len())
                .map_err(|_| {
                    ModelError::InvalidArgument(format!(
                        "cannot allocate logits for {} positions; request fewer",
                        n - first
                    ))
                })?;
            self.logits.resize(need, 0.0);
        }
        self.restore_state()?;
        let start_past = self.n_past;
        self.next_logits_end = None;
        let mut done = 0;
        while done < n {
            let len = self.chunk_len(n - done, start_past + n);
            let chunk = &tokens[done..done + len];
            let res =
                self.forward_chunk(chunk, first.saturating_sub(done), done, first, &mut hidden);
            if let Err(e) = res {
                // Leave the session as it was: the partly written cache rows are unreachable,
                // and a recurrent state is rebuilt by the next pass.
                self.truncate(start_past);
                self.state_failed();
                return Err(e);
            }
            self.n_past += len;
            self.history.extend_from_slice(chunk);
            if let Err(e) = self.checkpoint(self.n_past) {
                self.truncate(start_past);
                self.state_failed();
                return Err(e);
            }
            done += len;
        }
        self.next_logits_end = Some(need);
        Ok(Logits {
            first,
            n_vocab,
            data: &self.logits[..need],
        })
    }

    /// One chunk at positions `n_past..n_past+len`. Logits are produced for chunk rows
    /// `out_from..` and written at row `(done + r) - first` of the logits buffer.
    fn forward_chunk(
        &mut self,
        tokens: &[u32],
        out_from: usize,
        done: usize,
        first: usize,
        hidden: &mut Option<&mut Vec<Vec<f32>>>,
    ) -> Result<(), ModelError> {
        let n = tokens.len();
        let faults = self.faults();
        let b = &self.b;
        let mut segment = [Segment {
            kv: &mut self.kv,
            pos0: self.n_past,
            len: n,
        }];
        forward_rows(
            b,
            self.model,
            &mut self.s,
            tokens,
            &mut segment,
            hidden,
            faults,
        )?;
        if out_from < n {
            let n_vocab = self.model.config().n_vocab;
            let at = (done + out_from - first) * n_vocab;
            let y = &mut self.logits[at..at + (n - out_from) * n_vocab];
            self.s.logits(b, self.model, out_from, n, y)?;
        }
        Ok(())
    }

    /// The defects a test planted in this session.
    fn faults(&self) -> Faults {
        #[cfg(test)]
        return Faults {
            wrong_rope_base: self.mutation == Some(Mutation::RopeWrongBase),
            skip_attn_residual: match self.mutation {
                Some(Mutation::SkipAttnResidual(l)) => Some(l),
                _ => None,
            },
            drop_qkv_bias: self.mutation == Some(Mutation::DropQkvBias),
            ignore_rope_factors: self.mutation == Some(Mutation::IgnoreRopeFactors),
            top_one_expert: self.mutation == Some(Mutation::TopOneExpert),
            drop_attn_softcap: self.mutation == Some(Mutation::DropAttnSoftcap),
            drop_sinks: self.mutation == Some(Mutation::DropSinks),
            drop_expert_bias: self.mutation == Some(Mutation::DropExpertBias),
        };
        #[cfg(not(test))]
        Faults::default()
    }

    /// Records `tokens` as evaluated after a batched forward pass wrote their cache rows.
    /// The pass's logits stay with the batch, so this session has none to report.
    pub(crate) fn advance(&mut self, tokens: &[u32]) -> Result<(), ModelError> {
        self.n_past += tokens.len();
        self.history.extend_from_slice(tokens);
        self.next_logits_end = None;
        self.checkpoint(self.n_past)
    }
}

#[cfg(test)]
pub(crate) mod tests;
