//! The scheduler over a toy hybrid: a timeline whose state, like a recurrent layer's, is
//! kept only where a pass ended on a checkpoint position, so that a truncation anywhere else
//! would recompute tokens. Oracle under random traffic with clients leaving mid-prefill and
//! mid-decode: the scheduler never truncates a slot between its checkpoints (so nothing it
//! reports as cached is recomputed), the tokens of every kept job equal the same job run
//! alone, and the counters match the slots.

use std::cell::Cell;

use super::*;

/// Checkpoint interval of the toy.
const EVERY: usize = 4;

/// Next token = sum of the history mod `EOG`, as `SumSeq`; its state is the running sum,
/// saved at the end of each pass that stops on a multiple of `EVERY` (the latest
/// `CHECKPOINTS_KEPT` kept, as the CPU session keeps them).
struct HybridSum {
    kv: Vec<u32>,
    logits: Vec<f32>,
    /// Checkpoint positions, oldest first.
    checkpoints: Vec<usize>,
    /// Truncations that would have replayed tokens (to a position neither held whole nor
    /// checkpointed).
    replays: Rc<Cell<usize>>,
}

impl Timeline for HybridSum {
    fn truncate(&mut self, n: usize) {
        if n < self.kv.len() && n > 0 && !self.checkpoints.contains(&n) {
            self.replays.set(self.replays.get() + 1);
        }
        self.kv.truncate(n);
        self.checkpoints.retain(|&c| c <= n);
    }
    fn reusable(&self, n: usize) -> usize {
        if n >= self.kv.len() {
            return self.kv.len();
        }
        self.checkpoints
            .iter()
            .copied()
            .filter(|&c| c <= n)
            .max()
            .unwrap_or(0)
    }
    fn n_past(&self) -> usize {
        self.kv.len()
    }
    fn ctx(&self) -> usize {
        usize::MAX
    }
    fn eval_last(&mut self, tokens: &[u32]) -> Result<&[f32], GenerateError> {
        self.kv.extend_from_slice(tokens);
        let n = self.kv.len();
        if n.is_multiple_of(EVERY) {
            self.checkpoints.push(n);
            let excess = self
                .checkpoints
                .len()
                .saturating_sub(ferrite_model::CHECKPOINTS_KEPT);
            self.checkpoints.drain(..excess);
        }
        let next = self.kv.iter().sum::<u32>() % EOG;
        self.logits = (0..V).map(|t| if t == next { 5.0 } else { 0.0 }).collect();
        Ok(&self.logits)
    }
}

fn hybrid_sched(n: usize, replays: &Rc<Cell<usize>>) -> Scheduler<'static, HybridSum> {
    let seqs = (0..n)
        .map(|_| HybridSum {
            kv: Vec::new(),
            logits: Vec::new(),
            checkpoints: Vec::new(),
            replays: replays.clone(),
        })
        .collect();
    let limits = Limits {
        n_ctx: 40,
        prefill_chunk: 3,
        checkpoint_every: Some(EVERY),
    };
    Scheduler::new(&ToyRt, seqs, Arc::new(Counters::default()), limits)
}

fn tokens(evs: &[GenEvent]) -> Vec<u32> {
    evs.iter()
        .filter_map(|e| match e {
            GenEvent::Token { id, .. } => Some(*id),
            _ => None,
        })
        .collect()
}

#[test]
fn hybrid_slots_left_mid_prefill_reuse_only_checkpoints_and_stay_exact() {
    let mut rng = 0x6a09_e667_f3bc_c908u64;
    let mut next = |m: u64| {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng % m
    };
    let replays = Rc::new(Cell::new(0));
    let mut s = hybrid_sched(3, &replays);
    let mut jobs: Vec<TrackedJob> = Vec::new();
    let base: Vec<u32> = vec![3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8];
    let mut left_mid_prefill = 0;
    for _ in 0..600 {
        if next(3) == 0 {
            let keep = next(base.len() as u64) as usize;
            let mut prompt = base[..keep].to_vec();
            prompt.extend((0..1 + next(8)).map(|_| next(EOG as u64) as u32));
            let max_tokens = 1 + next(10) as usize;
            let rx = sum_job(&mut s, &prompt, max_tokens);
            // The job's id, to find its slot.
            s.waiting.back_mut().unwrap().req.sampling.seed = jobs.len() as u64;
            jobs.push((prompt, max_tokens, Some(rx), Vec::new()));
        }
        // Clients leave anywhere (queued, decoding) and, more often, mid-prefill.
        if next(10) == 0 && !jobs.is_empty() {
            let k = next(jobs.len() as u64) as usize;
            jobs[k].2 = None;
        }
        let prefilling: Vec<usize> = s
            .slots
            .iter()
            .filter_map(|x| x.active.as_ref())
            .filter(|a| a.fed > 0 && a.fed < a.job.req.prompt.len())
            .map(|a| a.job.req.sampling.seed as usize)
            .collect();
        if next(3) == 0 && !prefilling.is_empty() {
            let k = prefilling[next(prefilling.len() as u64) as usize];
            left_mid_prefill += usize::from(jobs[k].2.take().is_some());
        }
        step_and_collect(&mut s, &mut jobs);
    }
    run_all_sum(&mut s);
    assert_eq!(s.counters.inflight.load(Ordering::SeqCst), 0);
    assert_eq!(replays.get(), 0, "a slot was truncated between checkpoints");
    let (mut checked, mut reused) = (0, 0);
    for (prompt, max_tokens, rx, mut events) in jobs {
        let Some(mut rx) = rx else { continue };
        while let Ok(ev) = rx.try_recv() {
            events.push(ev);
        }
        let mut alone = hybrid_sched(1, &Rc::new(Cell::new(0)));
        let mut arx = sum_job(&mut alone, &prompt, max_tokens);
        run_all_sum(&mut alone);
        let mut expected = Vec::new();
        while let Ok(ev) = arx.try_recv() {
            expected.push(ev);
        }
        match events.first() {
            Some(GenEvent::Started { cached_tokens }) => reused += usize::from(*cached_tokens > 0),
            other => panic!("first event {other:?}"),
        }
        assert_eq!(tokens(&events), tokens(&expected), "prompt {prompt:?}");
        checked += 1;
    }
    assert!(checked > 30, "too few jobs kept: {checked}");
    assert!(reused > 5, "reuse barely exercised: {reused} of {checked}");
    assert!(
        left_mid_prefill > 5,
        "clients barely left mid-prefill: {left_mid_prefill}"
    );
}
