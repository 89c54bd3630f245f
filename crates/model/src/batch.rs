//! Several sessions of one model stepped in a single forward pass: the continuous-batching
//! primitive behind `ferrite serve` and `ferrite bench --batch`.
//!
//! Every weight matrix is streamed once for all rows of the step, while each session's rows
//! attend only over that session's own cache. A row's result never depends on the other
//! rows, so a session stepped in a batch gets the logits it would get stepped alone with
//! the same token counts — the property the batching tests pin bit for bit.
//!
//! A batch runs on whatever backend its sessions run on (`Buf` and `Angles` are that
//! backend's; the CPU's by default). On the CPU a row equals the session stepped alone bit
//! for bit; on a backend whose one-row products take another kernel than its several-row
//! ones (CUDA's contract ops: int8 decode activations) a batched row equals the same row in
//! any other batch of two or more, and the session stepped alone within rounding.

use ferrite_backend::Segment;
use ferrite_cpu::CpuAngles;

use crate::session::{Faults, Logits, Scratch, Session, forward_rows};
use crate::{ModelError, Weights};

/// Scratch for stepping up to `max_rows` new tokens in total per call, over any number of
/// sessions; allocated once and reused every step.
#[derive(Debug)]
pub struct Batch<Buf = Vec<f32>, Angles = CpuAngles> {
    max_rows: usize,
    s: Option<Scratch<Buf, Angles>>,
    logits: Vec<f32>,
    /// The step's tokens, all sessions' concatenated.
    tokens: Vec<u32>,
    /// Row indices, in the step, of the tokens whose logits are returned.
    lasts: Vec<usize>,
}

impl<Buf, Angles: Default> Batch<Buf, Angles> {
    /// A batch that evaluates at most `max_rows` tokens per [`Batch::step`].
    pub fn new(max_rows: usize) -> Result<Self, ModelError> {
        if max_rows == 0 {
            return Err(ModelError::InvalidArgument("batch of 0 rows".into()));
        }
        Ok(Batch {
            max_rows,
            s: None,
            logits: Vec::new(),
            tokens: Vec::with_capacity(max_rows),
            lasts: Vec::new(),
        })
    }

    /// Most tokens one step evaluates.
    pub fn max_rows(&self) -> usize {
        self.max_rows
    }

    /// Evaluates `inputs[i]` (one or more new tokens) in `sessions[i]` for every `i`, in
    /// one forward pass, and returns the logits of each session's last new token: row `i`
    /// belongs to `sessions[i]`. All sessions must share one model. On error no session
    /// changes.
    ///
    /// The logits stay here, not in the sessions: after a step a session has no
    /// [`Session::next_logits`] (so an export carries none), until it evaluates alone.
    /// Copying every row into its session cost 1.5–2.5 % of a 16-session decode step, for
    /// exports that no caller of batches makes.
    pub fn step<B: Weights<Buf = Buf, Angles = Angles> + Clone>(
        &mut self,
        sessions: &mut [&mut Session<'_, B>],
        inputs: &[&[u32]],
    ) -> Result<Logits<'_>, ModelError> {
        self.step_tails(sessions, inputs, &vec![1; inputs.len()])
    }

    /// [`Batch::step`], returning the logits after each of the last `tails[i]` new tokens
    /// of `sessions[i]` (`1..=inputs[i].len()`), session after session and row after row
    /// within each: what a speculative verify step needs of its `[last, drafts..]` segment
    /// while the other sessions of the step need only their last row.
    pub fn step_tails<B: Weights<Buf = Buf, Angles = Angles> + Clone>(
        &mut self,
        sessions: &mut [&mut Session<'_, B>],
        inputs: &[&[u32]],
        tails: &[usize],
    ) -> Result<Logits<'_>, ModelError> {
        let Some(first) = sessions.first() else {
            return Err(ModelError::InvalidArgument("no sessions to step".into()));
        };
        if inputs.len() != sessions.len() || tails.len() != sessions.len() {
            return Err(ModelError::InvalidArgument(format!(
                "{} inputs and {} tails for {} sessions",
                inputs.len(),
                tails.len(),
                sessions.len()
            )));
        }
        let (model, b) = (first.model(), first.backend().clone());
        let c = model.config();
        let rows: usize = inputs.iter().map(|t| t.len()).sum();
        if rows > self.max_rows {
            return Err(ModelError::InvalidArgument(format!(
                "{rows} tokens exceed the batch's {} rows",
                self.max_rows
            )));
        }
        for ((s, t), &tail) in sessions.iter().zip(inputs).zip(tails) {
            if tail == 0 || tail > t.len() {
                return Err(ModelError::InvalidArgument(format!(
                    "{tail} rows of logits asked of {} new tokens",
                    t.len()
                )));
            }
            if !std::ptr::eq(s.model(), model) {
                return Err(ModelError::InvalidArgument(
                    "a batch steps sessions of one model only".into(),
                ));
            }
            if t.is_empty() {
                return Err(ModelError::InvalidArgument("no tokens to evaluate".into()));
            }
            if s.n_past() + t.len() > s.ctx() {
                return Err(ModelError::ContextFull {
                    n_past: s.n_past(),
                    n_new: t.len(),
                    ctx: s.ctx(),
                });
            }
            if let Some(&token) = t.iter().find(|&&x| x as usize >= c.n_vocab) {
                return Err(ModelError::TokenOutOfRange {
                    token,
                    n_vocab: c.n_vocab,
                });
            }
        }
        for s in sessions.iter_mut() {
            s.restore_state()?;
        }
        self.tokens.clear();
        inputs.iter().for_each(|t| self.tokens.extend_from_slice(t));
        let scratch = match self.s.take() {
            Some(s) => s,
            None => Scratch::new(&b, c, self.max_rows)?,
        };
        let scratch = self.s.insert(scratch);
        let mut segs: Vec<Segment<'_, B::Kv>> = sessions
            .iter_mut()
            .zip(inputs)
            .map(|(s, t)| s.segment(t.len()))
            .collect();
        let res = forward_rows(
            &b,
            model,
            scratch,
            &self.tokens,
            &mut segs,
            &mut None,
            Faults::default(),
        );
        drop(segs);
        if let Err(e) = res {
            sessions.iter_mut().for_each(|s| s.state_failed());
            return Err(e);
        }
        // Only each session's last `tail` rows need logits: gather those rows to the front.
        let d = c.d_model;
        let n_vocab = c.n_vocab;
        self.lasts.clear();
        let mut end = 0;
        for (t, &tail) in inputs.iter().zip(tails) {
            end += t.len();
            self.lasts.extend(end - tail..end);
        }
        scratch.gather_rows(&b, &self.lasts, d)?;
        self.logits.resize(self.lasts.len() * n_vocab, 0.0);
        scratch.logits(&b, model, 0, self.lasts.len(), &mut self.logits)?;
        for (s, t) in sessions.iter_mut().zip(inputs) {
            s.advance(t)?;
        }
        Ok(Logits {
            first: 0,
            n_vocab,
            data: &self.logits,
        })
    }
}

#[cfg(test)]
mod tests {
    use ferrite_cpu::ThreadPool;
    use ferrite_gguf::GgmlType;

    use super::*;
    use crate::testutil::{VOCAB, tiny_model};
    use crate::{KvType, Outputs, Precision};

    fn prompt(len: usize, seed: usize) -> Vec<u32> {
        (0..len)
            .map(|i| ((i * 31 + seed * 17 + 5) % VOCAB) as u32)
            .collect()
    }

    /// Each session's next tokens, stepped alone with a cache of `kv`: the isolated oracle.
    fn alone(
        m: &crate::Model,
        pool: &ThreadPool,
        kv: KvType,
        p: &[u32],
        steps: &[&[u32]],
    ) -> Vec<Vec<f32>> {
        let mut s = Session::new(m, pool, 128, kv).unwrap();
        s.eval(p, Outputs::Last).unwrap();
        steps
            .iter()
            .map(|t| s.eval(t, Outputs::Last).unwrap().last().unwrap().to_vec())
            .collect()
    }

    #[test]
    fn batched_steps_equal_isolated_steps_bit_for_bit() {
        let pool = ThreadPool::new(2).unwrap();
        for (arch, ty, kv) in [
            ("llama", GgmlType::Q4_1, KvType::F16),
            ("gemma3", GgmlType::Q5_0, KvType::F16),
            // Expert FFNs group a batch's rows by expert: still row-independent.
            ("mixtral", GgmlType::Q8_0, KvType::F16),
            ("qwen3moe", GgmlType::Q4_1, KvType::F16),
            ("qwen2", GgmlType::Q8_0, KvType::F16),
            ("llama3", GgmlType::Q8_0, KvType::F16),
            // Soft-capped scores and logits, and rope scaled on some layers only.
            ("gemma2", GgmlType::Q8_0, KvType::F16),
            ("gemma3_linear", GgmlType::Q4_1, KvType::F16),
            // LongRoPE (these sessions' contexts are past the switch point; segments on
            // both sides of it in one call are a backend_ops case).
            ("phi3", GgmlType::Q8_0, KvType::F16),
            // An 8-bit cache scales each block of a row on its own, so rows stay independent
            // too (the tiny models with head sizes of whole blocks).
            ("qwen3", GgmlType::Q4_1, KvType::Q8),
            ("gemma3", GgmlType::Q5_0, KvType::Q8),
        ] {
            let m = tiny_model(arch, ty, Precision::Default);
            // Prompts of different lengths; the third session takes a 5-token chunk in the
            // second step while the others decode one token (continuous batching).
            let prompts = [prompt(3, 0), prompt(40, 1), prompt(17, 2), prompt(1, 3)];
            let steps: [[Vec<u32>; 4]; 3] = [
                [vec![7], vec![8], vec![9], vec![10]],
                [vec![11], vec![12], prompt(5, 9), vec![13]],
                [vec![14], vec![15], vec![16], vec![17]],
            ];
            let want: Vec<Vec<Vec<f32>>> = (0..4)
                .map(|i| {
                    let mine: Vec<&[u32]> = steps.iter().map(|st| st[i].as_slice()).collect();
                    alone(&m, &pool, kv, &prompts[i], &mine)
                })
                .collect();
            let mut sessions: Vec<Session<'_>> = prompts
                .iter()
                .map(|_| Session::new(&m, &pool, 128, kv).unwrap())
                .collect();
            let mut batch = Batch::new(64).unwrap();
            // The prompts themselves go through one batched step too.
            {
                let mut refs: Vec<&mut Session<'_>> = sessions.iter_mut().collect();
                let inputs: Vec<&[u32]> = prompts.iter().map(Vec::as_slice).collect();
                batch.step(&mut refs, &inputs).unwrap();
            }
            for (k, st) in steps.iter().enumerate() {
                let mut refs: Vec<&mut Session<'_>> = sessions.iter_mut().collect();
                let inputs: Vec<&[u32]> = st.iter().map(Vec::as_slice).collect();
                let got = batch.step(&mut refs, &inputs).unwrap();
                assert_eq!(got.n_rows(), 4);
                for (i, w) in want.iter().enumerate() {
                    assert!(
                        got.row(i).unwrap() == w[k].as_slice(),
                        "{arch} {kv:?}: session {i} step {k} differs from its isolated run"
                    );
                }
            }
            for (s, p) in sessions.iter().zip(&prompts) {
                assert_eq!(s.n_past(), p.len() + 2 + if p.len() == 17 { 5 } else { 1 });
                // A batched step leaves its logits with the batch: none to export.
                assert!(s.next_logits().is_none());
                assert!(s.export_state(s.n_past()).unwrap().logits.is_none());
            }
        }
    }

    #[test]
    fn a_segments_tail_rows_equal_one_token_steps_bit_for_bit() {
        // A speculative verify step: session `a` evaluates four tokens and needs the logits
        // after each, session `b` one token beside it; every row must be the one-token
        // decode's, or verification would not reproduce plain decoding.
        let pool = ThreadPool::new(2).unwrap();
        for (arch, ty) in [("llama", GgmlType::Q4_1), ("gemma3", GgmlType::Q5_0)] {
            let m = tiny_model(arch, ty, Precision::Default);
            let seg = [7u32, 8, 9, 10];
            let steps: Vec<&[u32]> = seg.chunks(1).collect();
            let want_a = alone(&m, &pool, KvType::F16, &prompt(12, 0), &steps);
            let want_b = alone(&m, &pool, KvType::F16, &prompt(5, 1), &[&[3]]);
            let mut a = Session::new(&m, &pool, 64, KvType::F16).unwrap();
            let mut b = Session::new(&m, &pool, 64, KvType::F16).unwrap();
            a.eval(&prompt(12, 0), Outputs::Last).unwrap();
            b.eval(&prompt(5, 1), Outputs::Last).unwrap();
            let mut batch = Batch::new(8).unwrap();
            let got = batch
                .step_tails(&mut [&mut b, &mut a], &[&[3], &seg], &[1, 4])
                .unwrap();
            assert_eq!(got.n_rows(), 5);
            assert!(got.row(0).unwrap() == want_b[0].as_slice(), "{arch}: b");
            for (k, w) in want_a.iter().enumerate() {
                assert!(got.row(1 + k).unwrap() == w.as_slice(), "{arch}: a row {k}");
            }
            // Fewer tail rows are the last ones of the same.
            a.truncate(12);
            let got = batch.step_tails(&mut [&mut a], &[&seg], &[2]).unwrap();
            assert!(
                got.row(0).unwrap() == want_a[2].as_slice(),
                "{arch}: tail 2"
            );
            assert!(
                got.row(1).unwrap() == want_a[3].as_slice(),
                "{arch}: tail 2"
            );
            for bad in [0, 5] {
                a.truncate(12);
                assert!(batch.step_tails(&mut [&mut a], &[&seg], &[bad]).is_err());
                assert_eq!(a.n_past(), 12);
            }
        }
    }

    #[test]
    fn a_batched_step_leaves_no_stale_logits_in_its_sessions() {
        let pool = ThreadPool::new(1).unwrap();
        let m = tiny_model("llama", GgmlType::Q8_0, Precision::Default);
        let mut a = Session::new(&m, &pool, 32, KvType::F16).unwrap();
        a.eval(&prompt(6, 0), Outputs::Last).unwrap();
        assert!(a.next_logits().is_some());
        let mut batch = Batch::new(4).unwrap();
        batch.step(&mut [&mut a], &[&[3]]).unwrap();
        // The logits before the step are no longer the next token's: none are kept.
        assert!(a.next_logits().is_none());
        assert!(a.export_state(a.n_past()).unwrap().logits.is_none());
        let alone = a
            .eval(&[4], Outputs::Last)
            .unwrap()
            .last()
            .unwrap()
            .to_vec();
        assert_eq!(a.next_logits(), Some(alone.as_slice()));
    }

    #[test]
    fn a_row_from_the_wrong_session_is_detected() {
        // Planted defect for the oracle above: swapping two sessions' tokens must change
        // their logits, or the bit-for-bit comparison would prove nothing.
        let pool = ThreadPool::new(1).unwrap();
        let m = tiny_model("llama", GgmlType::Q8_0, Precision::Default);
        let want = alone(&m, &pool, KvType::F16, &prompt(6, 0), &[&[3]]);
        let mut a = Session::new(&m, &pool, 32, KvType::F16).unwrap();
        let mut b = Session::new(&m, &pool, 32, KvType::F16).unwrap();
        a.eval(&prompt(6, 0), Outputs::Last).unwrap();
        b.eval(&prompt(6, 1), Outputs::Last).unwrap();
        let mut batch = Batch::new(4).unwrap();
        let got = batch.step(&mut [&mut b, &mut a], &[&[3], &[3]]).unwrap();
        assert!(got.row(1).unwrap() == want[0].as_slice());
        assert!(got.row(0).unwrap() != want[0].as_slice());
    }

    #[test]
    fn bad_steps_are_errors_and_change_nothing() {
        let pool = ThreadPool::new(1).unwrap();
        let m = tiny_model("llama", GgmlType::Q8_0, Precision::Default);
        let other = tiny_model("llama", GgmlType::Q8_0, Precision::Default);
        let mut a = Session::new(&m, &pool, 8, KvType::F16).unwrap();
        let mut b = Session::new(&other, &pool, 8, KvType::F16).unwrap();
        let mut batch = Batch::new(4).unwrap();
        assert!(Batch::<Vec<f32>>::new(0).is_err());
        let none: &mut [&mut Session<'_>] = &mut [];
        assert!(batch.step(none, &[]).is_err());
        assert!(batch.step(&mut [&mut a], &[]).is_err());
        assert!(batch.step(&mut [&mut a], &[&[]]).is_err());
        assert!(batch.step(&mut [&mut a], &[&[1, 2, 3, 4, 5]]).is_err());
        assert!(batch.step(&mut [&mut a], &[&[VOCAB as u32]]).is_err());
        assert!(batch.step(&mut [&mut a, &mut b], &[&[1], &[1]]).is_err());
        a.eval(&prompt(8, 0), Outputs::Last).unwrap();
        assert!(matches!(
            batch.step(&mut [&mut a], &[&[1]]),
            Err(ModelError::ContextFull { .. })
        ));
        assert_eq!((a.n_past(), b.n_past()), (8, 0));
    }
}
