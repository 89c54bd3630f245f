//! One inference timeline over a [`Model`]: the KV cache, the position counter and all
//! scratch buffers, allocated once in [`Session::new`] so that decode steps allocate no
//! buffers (only attention's small per-layer job lists).
//!
//! [`Session::eval`] runs the forward pass over any number of new tokens, in chunks of at most
//! [`PREFILL_CHUNK`] tokens (every weight product is one `ferrite_cpu::matmul` over the
//! chunk), and returns the logits the caller asked for.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use ferrite_cpu::{ThreadPool, matmul, matmul_shared};
use ferrite_quant::kernels::{GatedAct, gated_act};
use ferrite_quant::simd_level;

use crate::ModelError;
use crate::attention::{AttnJob, AttnShape, attend_many};
use crate::config::Activation;
use crate::kv::{KvCache, KvType, try_vec};
use crate::model::{Ffn, Model, Weight};
use crate::moe::{self, MoeScratch};
use crate::ops::{RopeTable, add_assign, rms_norm};
use crate::positions::{Rotary, rotate_and_store};

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

/// Scratch activations for the rows of one forward pass (the tokens of one chunk, or one
/// token from each session of a batch).
#[derive(Debug)]
pub(crate) struct Scratch {
    x: Vec<f32>,
    pub(crate) xn: Vec<f32>,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    att: Vec<f32>,
    o: Vec<f32>,
    gate: Vec<f32>,
    up: Vec<f32>,
    /// Rope tables of the rows of one forward pass, one per distinct rope base.
    rope: Vec<RopeTable>,
    /// Expert routing and grouping buffers (MoE models only).
    moe: Option<MoeScratch>,
}

impl Scratch {
    /// Buffers for up to `rows` rows of model `c`.
    pub(crate) fn new(c: &crate::ModelConfig, rows: usize) -> Scratch {
        Scratch {
            x: vec![0.0; rows * c.d_model],
            xn: vec![0.0; rows * c.d_model],
            q: vec![0.0; rows * c.q_dim()],
            k: vec![0.0; rows * c.kv_dim()],
            v: vec![0.0; rows * c.kv_dim()],
            att: vec![0.0; rows * c.q_dim()],
            o: vec![0.0; rows * c.d_model],
            gate: vec![0.0; rows * c.d_ff],
            up: vec![0.0; rows * c.d_ff],
            rope: Vec::new(),
            moe: c
                .moe
                .as_ref()
                .map(|m| MoeScratch::new(m, rows, c.d_model, c.d_ff)),
        }
    }

    /// Moves residual rows `rows[i]` to row `i`; `rows` must be increasing (so `rows[i] >= i`
    /// and no row is overwritten before it is read).
    pub(crate) fn gather_rows(&mut self, rows: &[usize], d: usize) {
        for (i, &r) in rows.iter().enumerate() {
            self.x.copy_within(r * d..(r + 1) * d, i * d);
        }
    }

    /// Normalizes rows `from..n` of the final residual stream into `xn[..(n - from) * d]`
    /// and writes their logits to `out`.
    pub(crate) fn logits(
        &mut self,
        m: &Model,
        pool: &ThreadPool,
        from: usize,
        n: usize,
        out: &mut [f32],
    ) -> Result<(), ModelError> {
        let c = m.config();
        let (d, rows) = (c.d_model, n - from);
        let xn = &mut self.xn[..rows * d];
        xn.copy_from_slice(&self.x[from * d..n * d]);
        rms_norm(xn, &m.output_norm, c.rms_eps);
        matmul(pool, m.matrix(m.output_weight()), xn, rows, out)?;
        Ok(())
    }
}

/// The rows of one session inside a forward pass: `len` consecutive new tokens at positions
/// `pos0..pos0 + len`, attending over (and appending to) that session's own cache.
pub(crate) struct Segment<'a> {
    pub(crate) kv: &'a mut KvCache,
    pub(crate) pos0: usize,
    pub(crate) len: usize,
}

/// Deliberate defects of the forward pass; always `Faults::default()` outside tests.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Faults {
    /// Extra positions keys are rotated by.
    rope_shift: usize,
    /// A layer whose attention residual is dropped.
    skip_attn_residual: Option<usize>,
    /// Leave out the q/k/v biases.
    drop_qkv_bias: bool,
    /// Plain rope even when the model has frequency factors.
    ignore_rope_factors: bool,
    /// Route every row to one expert instead of the top k.
    top_one_expert: bool,
}

/// A KV cache plus positions over one model: the state of one conversation.
#[derive(Debug)]
pub struct Session<'m> {
    model: &'m Model,
    pool: &'m ThreadPool,
    pub(crate) kv: KvCache,
    pub(crate) n_past: usize,
    /// The tokens at positions `0..n_past` (capacity `ctx`, allocated once).
    pub(crate) history: Vec<u32>,
    chunk: usize,
    s: Scratch,
    pub(crate) logits: Vec<f32>,
    /// `Some(end)` when `logits[end - n_vocab..end]` are the logits after token `n_past - 1`
    /// (kept for snapshots; see `crate::snapshot`).
    pub(crate) next_logits_end: Option<usize>,
    #[cfg(test)]
    pub(crate) mutation: Option<crate::session::Mutation>,
}

/// Deliberate defects used by the tests to prove the fixture comparison catches them.
#[cfg(test)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mutation {
    /// Drop the attention residual of this layer.
    SkipAttnResidual(usize),
    /// Rotate keys one position too far (shifting queries and keys together would be
    /// invisible: rope attention depends only on relative positions).
    RopeKeysOffByOne,
    /// Leave out the q/k/v biases.
    DropQkvBias,
    /// Ignore the rope frequency factors (plain rope).
    IgnoreRopeFactors,
    /// Route every token to its single best expert instead of the top k.
    TopOneExpert,
}

impl<'m> Session<'m> {
    /// A session of `ctx` positions with a KV cache of type `kv`.
    pub fn new(
        model: &'m Model,
        pool: &'m ThreadPool,
        ctx: usize,
        kv: KvType,
    ) -> Result<Session<'m>, ModelError> {
        if ctx == 0 {
            return Err(ModelError::InvalidArgument("context size 0".into()));
        }
        let c = model.config();
        let chunk = PREFILL_CHUNK.min(ctx);
        let s = Scratch::new(c, chunk);
        Ok(Session {
            model,
            pool,
            kv: KvCache::new(kv, c.n_layer, ctx, c.n_kv_head, c.head_dim)?,
            n_past: 0,
            history: {
                let mut h = try_vec(Some(ctx), 0u32, "token history")?;
                h.clear();
                h
            },
            chunk,
            s,
            logits: vec![0.0; c.n_vocab],
            next_logits_end: None,
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
        self.kv.ctx()
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
        }
        self.n_past = self.n_past.min(n);
        self.history.truncate(self.n_past);
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
        let start_past = self.n_past;
        self.next_logits_end = None;
        let mut done = 0;
        while done < n {
            let len = self.chunk.min(n - done);
            let chunk = &tokens[done..done + len];
            let res =
                self.forward_chunk(chunk, first.saturating_sub(done), done, first, &mut hidden);
            if let Err(e) = res {
                // Leave the session as it was: the partly written cache rows are unreachable.
                self.truncate(start_past);
                return Err(e);
            }
            self.n_past += len;
            self.history.extend_from_slice(chunk);
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
        let mut segment = [Segment {
            kv: &mut self.kv,
            pos0: self.n_past,
            len: n,
        }];
        forward_rows(
            self.model,
            self.pool,
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
            self.s.logits(self.model, self.pool, out_from, n, y)?;
        }
        Ok(())
    }

    /// The defects a test planted in this session.
    fn faults(&self) -> Faults {
        #[cfg(test)]
        return Faults {
            rope_shift: usize::from(self.mutation == Some(Mutation::RopeKeysOffByOne)),
            skip_attn_residual: match self.mutation {
                Some(Mutation::SkipAttnResidual(l)) => Some(l),
                _ => None,
            },
            drop_qkv_bias: self.mutation == Some(Mutation::DropQkvBias),
            ignore_rope_factors: self.mutation == Some(Mutation::IgnoreRopeFactors),
            top_one_expert: self.mutation == Some(Mutation::TopOneExpert),
        };
        #[cfg(not(test))]
        Faults::default()
    }

    /// The thread pool this session computes on.
    pub(crate) fn pool(&self) -> &'m ThreadPool {
        self.pool
    }

    /// This session's part of a batched forward pass: `len` new tokens at its next
    /// positions.
    pub(crate) fn segment(&mut self, len: usize) -> Segment<'_> {
        Segment {
            kv: &mut self.kv,
            pos0: self.n_past,
            len,
        }
    }

    /// Records `tokens` as evaluated after a batched forward pass wrote their cache rows.
    /// The pass's logits stay with the batch, so this session has none to report.
    pub(crate) fn advance(&mut self, tokens: &[u32]) {
        self.n_past += tokens.len();
        self.history.extend_from_slice(tokens);
        self.next_logits_end = None;
    }
}

/// The transformer layers over `tokens`, which are the rows of `segs` in order. Leaves the
/// final residual stream in the scratch for [`Scratch::logits`]. Every row's result depends
/// only on its own token, position and session cache, never on the other rows.
pub(crate) fn forward_rows(
    m: &Model,
    pool: &ThreadPool,
    s: &mut Scratch,
    tokens: &[u32],
    segs: &mut [Segment<'_>],
    hidden: &mut Option<&mut Vec<Vec<f32>>>,
    faults: Faults,
) -> Result<(), ModelError> {
    let c = m.config();
    let n = tokens.len();
    let d = c.d_model;
    let rope_shift = faults.rope_shift;
    let rope_factors = c
        .rope_freq_factors
        .as_ref()
        .filter(|_| !faults.ignore_rope_factors);
    let moe_cfg = c.moe.map(|mut moe| {
        if faults.top_one_expert {
            moe.n_expert_used = 1;
        }
        moe
    });

    for (t, &tok) in tokens.iter().enumerate() {
        let row = &mut s.x[t * d..(t + 1) * d];
        m.embed_row(tok, row)?;
        if c.embed_scale != 1.0 {
            row.iter_mut().for_each(|v| *v *= c.embed_scale);
        }
    }
    // One rope table per distinct base for these rows' positions (reusing memory).
    let mut n_tables = 0;
    for lc in &c.layers {
        let have = s.rope[..n_tables]
            .iter()
            .any(|r| r.covers(c.head_dim, lc.rope_base, n));
        if !have {
            if n_tables == s.rope.len() {
                s.rope.push(RopeTable::default());
            }
            let positions = segs.iter().flat_map(|g| g.pos0..g.pos0 + g.len);
            s.rope[n_tables].fill(c.head_dim, lc.rope_base, positions);
            n_tables += 1;
        }
    }
    let mm = |w: &Weight, x: &[f32], y: &mut [f32]| -> Result<(), ModelError> {
        matmul(pool, m.matrix(w), x, n, y)?;
        Ok(())
    };
    for (l, lw) in m.layers.iter().enumerate() {
        let lc = &c.layers[l];
        let (x, xn) = (&mut s.x[..n * d], &mut s.xn[..n * d]);
        xn.copy_from_slice(x);
        rms_norm(xn, &lw.attn_norm, c.rms_eps);
        let (q, k, v) = (
            &mut s.q[..n * c.q_dim()],
            &mut s.k[..n * c.kv_dim()],
            &mut s.v[..n * c.kv_dim()],
        );
        let qkv = [m.matrix(&lw.wq), m.matrix(&lw.wk), m.matrix(&lw.wv)];
        matmul_shared(pool, &qkv, xn, n, &mut [&mut *q, &mut *k, &mut *v])?;
        let bias = lw.qkv_bias.as_ref().filter(|_| !faults.drop_qkv_bias);
        if let Some([bq, bk, bv]) = bias {
            for (y, b) in [(&mut *q, bq), (&mut *k, bk), (&mut *v, bv)] {
                for row in y.chunks_exact_mut(b.len()) {
                    add_assign(row, b);
                }
            }
        }
        if let (Some(qn), Some(kn)) = (&lw.q_norm, &lw.k_norm) {
            rms_norm(q, qn, c.rms_eps);
            rms_norm(k, kn, c.rms_eps);
        }
        // Scaled-frequency rope (rope_factors) computes its own angles.
        let table = match rope_factors {
            Some(_) => None,
            None => Some(
                s.rope[..n_tables]
                    .iter()
                    .find(|r| r.covers(c.head_dim, lc.rope_base, n))
                    .ok_or_else(|| ModelError::InvalidArgument("rope table missing".into()))?,
            ),
        };
        let rotary = Rotary {
            head_dim: c.head_dim,
            q_dim: c.q_dim(),
            kv_dim: c.kv_dim(),
            base: lc.rope_base,
            style: c.rope_style,
            factors: rope_factors.map(Vec::as_slice),
            table,
            key_shift: rope_shift,
        };
        rotate_and_store(pool, &rotary, l, q, k, v, segs);
        let shape = AttnShape {
            n_head: c.n_head,
            n_kv_head: c.n_kv_head,
            head_dim: c.head_dim,
            scale: c.attn_scale,
            window: lc.window,
        };
        // All sessions' attention in one pass over the pool (see `attend_many`).
        let qd = c.q_dim();
        let (mut qs, mut att) = (&q[..n * qd], &mut s.att[..n * qd]);
        let mut jobs: Vec<AttnJob<'_>> = Vec::with_capacity(segs.len());
        for seg in segs.iter_mut() {
            let (q_seg, q_rest) = qs.split_at(seg.len * qd);
            let (att_seg, att_rest) = att.split_at_mut(seg.len * qd);
            (qs, att) = (q_rest, att_rest);
            jobs.push(AttnJob {
                cache: &*seg.kv,
                pos0: seg.pos0,
                q: q_seg,
                out: att_seg,
            });
        }
        attend_many(pool, &shape, l, &mut jobs);
        drop(jobs);
        let att = &s.att[..n * c.q_dim()];
        let o = &mut s.o[..n * d];
        mm(&lw.wo, att, o)?;
        if let Some(b) = &lw.out_bias {
            for row in o.chunks_exact_mut(d) {
                add_assign(row, b);
            }
        }
        if let Some(w) = &lw.post_attn_norm {
            rms_norm(o, w, c.rms_eps);
        }
        if faults.skip_attn_residual != Some(l) {
            add_assign(x, o);
        }

        xn.copy_from_slice(x);
        rms_norm(xn, &lw.ffn_norm, c.rms_eps);
        match &lw.ffn {
            Ffn::Dense {
                gate: w_gate,
                up: w_up,
                down: w_down,
            } => {
                let (gate, up) = (&mut s.gate[..n * c.d_ff], &mut s.up[..n * c.d_ff]);
                let gate_up = [m.matrix(w_gate), m.matrix(w_up)];
                matmul_shared(pool, &gate_up, xn, n, &mut [&mut *gate, &mut *up])?;
                let act = match c.activation {
                    Activation::Silu => GatedAct::Silu,
                    Activation::GeluTanh => GatedAct::GeluTanh,
                };
                // Element-wise, the same bits wherever an element falls, so the split
                // over the pool (disjoint ranges, a multiple of 16) does not depend on
                // the thread count.
                let level = simd_level();
                if n == 1 {
                    gated_act(level, act, gate, up).map_err(ferrite_cpu::CpuError::from)?;
                } else {
                    let per = gate.len().div_ceil(16 * pool.n_threads()).max(1) * 16;
                    let parts = Mutex::new(gate.chunks_mut(per).zip(up.chunks(per)));
                    let failed = AtomicBool::new(false);
                    pool.run(|_, _| {
                        while let Some((g, u)) = parts.lock().ok().and_then(|mut it| it.next()) {
                            if gated_act(level, act, g, u).is_err() {
                                failed.store(true, Ordering::Relaxed);
                            }
                        }
                    });
                    if failed.into_inner() {
                        return Err(ModelError::InvalidArgument(
                            "activation kernel rejected its level".into(),
                        ));
                    }
                }
                mm(w_down, gate, o)?;
            }
            Ffn::Moe(mw) => {
                let (Some(cfg), Some(ms)) = (&moe_cfg, s.moe.as_mut()) else {
                    return Err(ModelError::InvalidArgument(
                        "expert weights without expert settings".into(),
                    ));
                };
                moe::ffn(pool, m, mw, cfg, c.activation, xn, n, o, ms)?;
            }
        }
        if let Some(w) = &lw.post_ffn_norm {
            rms_norm(o, w, c.rms_eps);
        }
        add_assign(x, o);
        if let Some(h) = hidden.as_deref_mut() {
            h[l].extend_from_slice(x);
        }
    }
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests;
