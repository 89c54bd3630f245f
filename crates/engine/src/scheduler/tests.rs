//! Tests of the scheduler against toy models whose next token is known: batching, prefix
//! reuse, cancellation, fairness and fallbacks.

use std::cell::RefCell;
use std::rc::Rc;

use tokio::sync::mpsc::{UnboundedReceiver, unbounded_channel};

use super::*;
use crate::inference::SamplingParams;
use crate::sampler::SampleError;

mod hybrid;
mod speculate;

const V: u32 = 16;
const EOG: u32 = 15;

/// Next token = last token + 1; records the size of every eval call.
struct Toy {
    kv: Vec<u32>,
    logits: Vec<f32>,
    evals: Rc<RefCell<Vec<usize>>>,
}

impl Timeline for Toy {
    fn truncate(&mut self, n: usize) {
        self.kv.truncate(n);
    }
    fn n_past(&self) -> usize {
        self.kv.len()
    }
    fn ctx(&self) -> usize {
        usize::MAX
    }
    fn eval_last(&mut self, tokens: &[u32]) -> Result<&[f32], GenerateError> {
        self.evals.borrow_mut().push(tokens.len());
        self.kv.extend_from_slice(tokens);
        let next = (self.kv.last().copied().unwrap_or(0) + 1) % V;
        self.logits = (0..V).map(|t| if t == next { 5.0 } else { 0.0 }).collect();
        Ok(&self.logits)
    }
}

struct Greedy;
impl RowPicker for Greedy {
    fn pick(&mut self, logits: &[f32], _history: &[u32]) -> Result<Picked, GenerateError> {
        let (i, _) = logits
            .iter()
            .enumerate()
            .max_by(|a, b| a.1.total_cmp(b.1))
            .ok_or(SampleError::EmptyLogits)?;
        Ok(Picked {
            token: i as u32,
            logprob: Some(-0.1),
            top: vec![(i as u32, -0.1)],
        })
    }
    fn force(&mut self, _logits: &[f32], token: u32) -> Result<Picked, GenerateError> {
        Ok(Picked {
            token,
            logprob: Some(-0.2),
            top: vec![(token, -0.2)],
        })
    }
}

struct ToyRt;
impl Runtime for ToyRt {
    fn picker(&self, _req: &GenRequest) -> Result<Box<dyn RowPicker>, GenerateError> {
        Ok(Box::new(Greedy))
    }
    fn is_eog(&self, token: u32) -> bool {
        token == EOG
    }
    fn decode(&self, ids: &[u32]) -> String {
        ids.iter()
            .filter(|&&t| t != EOG)
            .map(|&t| (b'a' + t as u8) as char)
            .collect()
    }
    fn token_bytes(&self, id: u32) -> Vec<u8> {
        self.decode(&[id]).into_bytes()
    }
}

fn toy_sched(
    n: usize,
    n_ctx: usize,
    chunk: usize,
) -> (
    Scheduler<'static, Toy>,
    Rc<RefCell<Vec<usize>>>,
    Arc<Counters>,
) {
    let evals = Rc::new(RefCell::new(Vec::new()));
    let seqs = (0..n)
        .map(|_| Toy {
            kv: Vec::new(),
            logits: Vec::new(),
            evals: evals.clone(),
        })
        .collect();
    let counters = Arc::new(Counters::default());
    let s = Scheduler::new(
        &ToyRt,
        seqs,
        counters.clone(),
        Limits {
            n_ctx,
            prefill_chunk: chunk,
            checkpoint_every: None,
        },
    );
    (s, evals, counters)
}

fn job(
    s: &mut Scheduler<'_, Toy>,
    prompt: &[u32],
    max_tokens: usize,
    stop: &[&str],
) -> UnboundedReceiver<GenEvent> {
    let (tx, rx) = unbounded_channel();
    s.counters.inflight.fetch_add(1, Ordering::SeqCst);
    s.waiting.push_back(Job {
        req: GenRequest {
            prompt: prompt.to_vec(),
            sampling: SamplingParams::default(),
            max_tokens,
            stop: stop.iter().map(|x| x.to_string()).collect(),
            logprobs: Some(1),
            prompt_logprobs: false,
            reasoning_budget: None,
            speculative: Default::default(),
        },
        tx,
        queued_at: Instant::now(),
    });
    rx
}

/// Drain a receiver: (text, done event).
fn drain(rx: &mut UnboundedReceiver<GenEvent>) -> (String, Option<GenEvent>, usize) {
    let mut text = String::new();
    let mut cached = usize::MAX;
    while let Ok(ev) = rx.try_recv() {
        match ev {
            GenEvent::Started { cached_tokens } => cached = cached_tokens,
            GenEvent::Token { text: t, .. } => text.push_str(&t),
            GenEvent::Done { ref tail, .. } => {
                text.push_str(tail);
                return (text, Some(ev), cached);
            }
            GenEvent::Failed(e) => panic!("failed: {e}"),
            GenEvent::PromptLogprobs(_) => {}
        }
    }
    (text, None, cached)
}

fn run_all(s: &mut Scheduler<'_, Toy>) {
    for _ in 0..100 {
        if s.idle() {
            return;
        }
        s.step();
    }
    panic!("scheduler did not finish");
}

/// A batcher over toys: records each batched call's width and evaluates the toys one
/// by one (so its logits are by construction those of `eval_last`); `fail` makes every
/// batched call fail.
struct ToyBatch {
    widths: Rc<RefCell<Vec<usize>>>,
    fail: bool,
}

impl BatchEval<Toy> for ToyBatch {
    fn eval_many(
        &mut self,
        seqs: &mut [&mut Toy],
        inputs: &[&[u32]],
        tails: &[usize],
    ) -> Result<Vec<Vec<f32>>, GenerateError> {
        self.widths.borrow_mut().push(seqs.len());
        if self.fail {
            return Err(GenerateError::NoRow);
        }
        seqs.iter_mut()
            .zip(inputs)
            .zip(tails)
            .map(|((s, t), &tail)| {
                let mut all = s.eval_all(t)?;
                Ok(all.split_off((t.len() - tail) * V as usize))
            })
            .collect()
    }
}

/// Texts of three overlapping jobs (different prompts and lengths), with an optional
/// batcher; also the batched calls' widths.
fn three_jobs(batcher: Option<bool>) -> (Vec<String>, Vec<usize>, usize) {
    let (s, _, counters) = toy_sched(3, 64, 4);
    let widths = Rc::new(RefCell::new(Vec::new()));
    let mut s = match batcher {
        Some(fail) => s.with_batcher(Box::new(ToyBatch {
            widths: widths.clone(),
            fail,
        })),
        None => s,
    };
    let mut rxs = [
        job(&mut s, &[1, 2, 3, 4, 5, 6, 7], 5, &[]),
        job(&mut s, &[9], 3, &[]),
        job(&mut s, &[2, 4], 6, &[]),
    ];
    run_all(&mut s);
    let texts = rxs.iter_mut().map(|rx| drain(rx).0).collect();
    let w = widths.borrow().clone();
    (texts, w, counters.batched_steps.load(Ordering::SeqCst))
}

#[test]
fn batched_steps_give_every_slot_its_sequential_answer() {
    let (alone, _, _) = three_jobs(None);
    let (batched, widths, steps) = three_jobs(Some(false));
    assert_eq!(batched, alone);
    // Path marker: slots really went through the batcher together, and were counted.
    assert!(widths.contains(&3), "{widths:?}");
    assert_eq!(steps, widths.len());
    // A failing batched pass falls back to one-by-one evaluation with the same answers.
    let (fallback, widths, steps) = three_jobs(Some(true));
    assert_eq!(fallback, alone);
    assert!(!widths.is_empty());
    assert_eq!(steps, 0);
}

fn finish_of(ev: &Option<GenEvent>) -> (FinishReason, Option<String>, Usage) {
    match ev {
        Some(GenEvent::Done {
            finish,
            stop_sequence,
            usage,
            ..
        }) => (*finish, stop_sequence.clone(), *usage),
        other => panic!("no Done: {other:?}"),
    }
}

#[test]
fn prompt_logprobs_score_every_prompt_token_and_skip_the_cache() {
    let (mut s, _, _) = toy_sched(1, 64, 2);
    let prompt = [1u32, 2, 3, 7];
    // Warm the slot with the same prompt: a scoring request must not reuse it.
    let mut warm = job(&mut s, &prompt, 1, &[]);
    run_all(&mut s);
    drain(&mut warm);
    let (tx, mut rx) = unbounded_channel();
    s.counters.inflight.fetch_add(1, Ordering::SeqCst);
    s.waiting.push_back(Job {
        req: GenRequest {
            prompt: prompt.to_vec(),
            sampling: SamplingParams::default(),
            max_tokens: 1,
            stop: Vec::new(),
            logprobs: Some(1),
            prompt_logprobs: true,
            reasoning_budget: None,
            speculative: Default::default(),
        },
        tx,
        queued_at: Instant::now(),
    });
    run_all(&mut s);
    let mut items = Vec::new();
    let mut cached = None;
    while let Ok(ev) = rx.try_recv() {
        match ev {
            GenEvent::Started { cached_tokens } => cached = Some(cached_tokens),
            GenEvent::PromptLogprobs(v) => {
                assert!(items.len() < 3, "prompt logprobs after the first token");
                items.extend(v);
            }
            _ => {}
        }
    }
    assert_eq!(cached, Some(0));
    // Toy logits: 5 for last+1, 0 for the 15 others (independent f64 log-softmax).
    let lse = (5f64.exp() + 15.0).ln();
    let want = [("c", 5.0 - lse), ("d", 5.0 - lse), ("h", -lse)];
    assert_eq!(items.len(), want.len());
    for (got, (tok, lp)) in items.iter().zip(want) {
        assert_eq!(got.token, tok);
        assert!((f64::from(got.logprob) - lp).abs() < 1e-5, "{got:?}");
        assert_eq!(got.top.len(), 1);
    }
    assert_eq!(items[2].top[0].token, "e");
}

#[test]
fn generates_until_end_of_generation() {
    let (mut s, _, c) = toy_sched(1, 64, 8);
    let mut rx = job(&mut s, &[1, 2, 3], 100, &[]);
    run_all(&mut s);
    let (text, done, cached) = drain(&mut rx);
    assert_eq!(text, "efghijklmno");
    let (finish, _, usage) = finish_of(&done);
    assert_eq!(finish, FinishReason::Stop);
    assert_eq!(usage.completion_tokens, 11);
    assert_eq!(cached, 0);
    assert_eq!(c.inflight.load(Ordering::SeqCst), 0);
    assert_eq!(c.active.load(Ordering::SeqCst), 0);
}

#[test]
fn max_tokens_context_and_stop_strings() {
    let (mut s, _, _) = toy_sched(1, 64, 8);
    let mut rx = job(&mut s, &[1, 2, 3], 3, &[]);
    run_all(&mut s);
    let (text, done, _) = drain(&mut rx);
    assert_eq!(
        (text.as_str(), finish_of(&done).0),
        ("efg", FinishReason::Length)
    );
    let mut rx = job(&mut s, &[1, 2, 3], 100, &["gh"]);
    run_all(&mut s);
    let (text, done, _) = drain(&mut rx);
    assert_eq!(text, "ef");
    assert_eq!(finish_of(&done).1.as_deref(), Some("gh"));
    // n_ctx 8 with a 5-token prompt: the KV fills at 7 evaluated tokens.
    let (mut s, _, _) = toy_sched(1, 8, 8);
    let mut rx = job(&mut s, &[0, 1, 2, 3, 4], 100, &[]);
    run_all(&mut s);
    let (text, done, _) = drain(&mut rx);
    assert_eq!(finish_of(&done).0, FinishReason::Length);
    assert_eq!(text, "fgh");
}

#[test]
fn reuses_the_longest_cached_prefix() {
    let (mut s, evals, _) = toy_sched(2, 64, 64);
    let mut a = job(&mut s, &[1, 2, 3, 4], 2, &[]);
    run_all(&mut s);
    drain(&mut a);
    let mut b = job(&mut s, &[9, 9, 9], 2, &[]);
    run_all(&mut s);
    drain(&mut b);
    evals.borrow_mut().clear();
    // Slot 0 holds 1 2 3 4 5 (the 6 was sampled, never evaluated).
    let mut c = job(&mut s, &[1, 2, 3, 4, 5, 6, 7], 1, &[]);
    run_all(&mut s);
    let (_, done, cached) = drain(&mut c);
    assert_eq!(cached, 5);
    assert_eq!(finish_of(&done).2.cached_tokens, 5);
    assert_eq!(
        evals.borrow()[0],
        2,
        "only the uncached suffix is evaluated"
    );
    // An identical prompt still re-evaluates its last token for fresh logits.
    let mut d = job(&mut s, &[9, 9, 9], 1, &[]);
    run_all(&mut s);
    assert_eq!(drain(&mut d).2, 2);
}

#[test]
fn long_prefill_is_chunked_and_does_not_stall_decoding() {
    let (mut s, evals, _) = toy_sched(2, 64, 4);
    let mut short = job(&mut s, &[1], 100, &[]);
    s.step();
    let mut long = job(&mut s, &[0; 10], 100, &[]);
    s.step();
    // The short job decoded a token in the same step the long one prefilled 4 tokens.
    assert_eq!(evals.borrow().as_slice(), &[1, 1, 4]);
    s.step();
    s.step();
    assert_eq!(evals.borrow().as_slice(), &[1, 1, 4, 1, 4, 1, 2]);
    run_all(&mut s);
    assert_eq!(drain(&mut short).0, "cdefghijklmno");
    assert_eq!(drain(&mut long).0, "bcdefghijklmno");
}

#[test]
fn prefill_budget_is_shared_oldest_first() {
    let (mut s, evals, _) = toy_sched(3, 64, 4);
    let mut short = job(&mut s, &[1], 100, &[]);
    s.step();
    let mut a = job(&mut s, &[0; 6], 100, &[]);
    let mut b = job(&mut s, &[0; 6], 100, &[]);
    s.step();
    // The decoding slot advances; the older long prompt takes the whole budget.
    assert_eq!(evals.borrow().as_slice(), &[1, 1, 4]);
    s.step();
    assert_eq!(evals.borrow()[3..], [1, 2, 2]);
    s.step();
    assert_eq!(evals.borrow()[6..], [1, 1, 4]);
    run_all(&mut s);
    assert_eq!(drain(&mut short).0, "cdefghijklmno");
    assert_eq!(drain(&mut a).0, "bcdefghijklmno");
    assert_eq!(drain(&mut b).0, "bcdefghijklmno");
}

#[test]
fn dropped_client_frees_the_slot_at_the_next_step() {
    let (mut s, _, c) = toy_sched(1, 64, 8);
    let mut rx = job(&mut s, &[1], 100, &[]);
    s.step();
    s.step();
    assert_eq!(c.active.load(Ordering::SeqCst), 1);
    let (text, done, _) = drain(&mut rx);
    assert_eq!((text.as_str(), done), ("cd", None));
    drop(rx);
    s.step();
    assert_eq!(c.active.load(Ordering::SeqCst), 0);
    assert_eq!(c.inflight.load(Ordering::SeqCst), 0);
    assert!(s.idle());
    // A waiting job whose client left is skipped without taking a slot.
    let rx = job(&mut s, &[1], 100, &[]);
    drop(rx);
    s.step();
    assert!(s.idle());
    assert_eq!(c.inflight.load(Ordering::SeqCst), 0);
}

#[test]
fn waiting_jobs_are_served_in_order() {
    let (mut s, _, _) = toy_sched(1, 64, 8);
    let mut a = job(&mut s, &[1], 2, &[]);
    let mut b = job(&mut s, &[5], 2, &[]);
    let mut c = job(&mut s, &[9], 2, &[]);
    s.step();
    assert!(b.try_recv().is_err(), "b must wait for a free slot");
    run_all(&mut s);
    assert_eq!(drain(&mut a).0, "cd");
    assert_eq!(drain(&mut b).0, "gh");
    assert_eq!(drain(&mut c).0, "kl");
}

#[test]
fn text_tail_holds_incomplete_utf8() {
    struct Bytes;
    impl Runtime for Bytes {
        fn picker(&self, _req: &GenRequest) -> Result<Box<dyn RowPicker>, GenerateError> {
            Ok(Box::new(Greedy))
        }
        fn is_eog(&self, _token: u32) -> bool {
            false
        }
        fn decode(&self, ids: &[u32]) -> String {
            String::from_utf8_lossy(&ids.iter().map(|&i| i as u8).collect::<Vec<_>>()).into_owned()
        }
        fn token_bytes(&self, id: u32) -> Vec<u8> {
            vec![id as u8]
        }
    }
    let mut t = TextTail::default();
    let e = "é".as_bytes();
    assert_eq!(t.push(b'a' as u32, &Bytes), "a");
    assert_eq!(t.push(e[0] as u32, &Bytes), "");
    assert_eq!(t.push(e[1] as u32, &Bytes), "é");
    assert_eq!(t.push(e[0] as u32, &Bytes), "");
    assert_eq!(t.finish(&Bytes), "\u{FFFD}");
}

/// Next token = sum of the whole KV mod 15, so any stale or missing KV entry after a
/// prefix reuse changes the output.
struct SumSeq {
    kv: Vec<u32>,
    logits: Vec<f32>,
}

impl Timeline for SumSeq {
    fn truncate(&mut self, n: usize) {
        self.kv.truncate(n);
    }
    fn n_past(&self) -> usize {
        self.kv.len()
    }
    fn ctx(&self) -> usize {
        usize::MAX
    }
    fn eval_last(&mut self, tokens: &[u32]) -> Result<&[f32], GenerateError> {
        self.kv.extend_from_slice(tokens);
        let next = self.kv.iter().sum::<u32>() % EOG;
        self.logits = (0..V).map(|t| if t == next { 5.0 } else { 0.0 }).collect();
        Ok(&self.logits)
    }
}

/// Prompt, max_tokens, receiver (None once the client left) and events seen so far.
type TrackedJob = (
    Vec<u32>,
    usize,
    Option<UnboundedReceiver<GenEvent>>,
    Vec<GenEvent>,
);

fn sum_sched(n: usize) -> Scheduler<'static, SumSeq> {
    let seqs = (0..n)
        .map(|_| SumSeq {
            kv: Vec::new(),
            logits: Vec::new(),
        })
        .collect();
    let limits = Limits {
        n_ctx: 40,
        prefill_chunk: 3,
        checkpoint_every: None,
    };
    Scheduler::new(&ToyRt, seqs, Arc::new(Counters::default()), limits)
}

/// A greedy job without logprobs, queued on any scheduler.
fn sum_job<S: Timeline>(
    s: &mut Scheduler<'_, S>,
    prompt: &[u32],
    max_tokens: usize,
) -> UnboundedReceiver<GenEvent> {
    let (tx, rx) = unbounded_channel();
    s.counters.inflight.fetch_add(1, Ordering::SeqCst);
    let req = GenRequest {
        prompt: prompt.to_vec(),
        sampling: SamplingParams::default(),
        max_tokens,
        stop: Vec::new(),
        logprobs: None,
        prompt_logprobs: false,
        reasoning_budget: None,
        speculative: Default::default(),
    };
    s.waiting.push_back(Job {
        req,
        tx,
        queued_at: Instant::now(),
    });
    rx
}

/// Random arrivals, disconnects and prompts sharing prefixes: the counters always match
/// the slots and the queue, every kept job gets Started, tokens and exactly one Done,
/// and its text equals the same job run alone on a fresh scheduler.
#[test]
fn random_traffic_keeps_counters_and_outputs_exact() {
    let mut rng = 0x2545_f491_4f6c_dd1du64;
    let mut next = |m: u64| {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng % m
    };
    let mut s = sum_sched(3);
    let mut jobs: Vec<TrackedJob> = Vec::new();
    let base: Vec<u32> = vec![3, 1, 4, 1, 5, 9, 2, 6];
    for _ in 0..400 {
        if next(3) == 0 {
            let keep = next(base.len() as u64) as usize;
            let mut prompt = base[..keep].to_vec();
            prompt.extend((0..1 + next(6)).map(|_| next(EOG as u64) as u32));
            let max_tokens = 1 + next(12) as usize;
            let rx = sum_job(&mut s, &prompt, max_tokens);
            jobs.push((prompt, max_tokens, Some(rx), Vec::new()));
        }
        if next(10) == 0 && !jobs.is_empty() {
            let k = next(jobs.len() as u64) as usize;
            jobs[k].2 = None;
        }
        step_and_collect(&mut s, &mut jobs);
    }
    run_all_sum(&mut s);
    assert_eq!(s.counters.inflight.load(Ordering::SeqCst), 0);
    let mut checked = 0;
    let mut reused = 0;
    for (prompt, max_tokens, rx, mut events) in jobs {
        let Some(mut rx) = rx else { continue };
        while let Ok(ev) = rx.try_recv() {
            events.push(ev);
        }
        let mut alone = sum_sched(1);
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
        let dones = events
            .iter()
            .filter(|e| matches!(e, GenEvent::Done { .. }))
            .count();
        assert_eq!(dones, 1, "{events:?}");
        assert!(matches!(events.last(), Some(GenEvent::Done { .. })));
        let tokens = |evs: &[GenEvent]| -> Vec<u32> {
            evs.iter()
                .filter_map(|e| match e {
                    GenEvent::Token { id, .. } => Some(*id),
                    _ => None,
                })
                .collect()
        };
        assert_eq!(tokens(&events), tokens(&expected), "prompt {prompt:?}");
        checked += 1;
    }
    assert!(
        checked > 20,
        "too few jobs kept to mean anything: {checked}"
    );
    assert!(
        reused > 5,
        "prefix reuse barely exercised: {reused} of {checked}"
    );
}

/// One step, then every live job's events collected; the counters must match the slots
/// and the queue after it.
fn step_and_collect<S: Timeline>(s: &mut Scheduler<'_, S>, jobs: &mut [TrackedJob]) {
    s.step();
    for j in jobs.iter_mut() {
        if let Some(rx) = j.2.as_mut() {
            while let Ok(ev) = rx.try_recv() {
                j.3.push(ev);
            }
        }
    }
    let active = s.slots.iter().filter(|x| x.active.is_some()).count();
    assert_eq!(s.counters.active.load(Ordering::SeqCst), active);
    assert_eq!(
        s.counters.inflight.load(Ordering::SeqCst),
        active + s.waiting.len()
    );
}

fn run_all_sum<S: Timeline>(s: &mut Scheduler<'_, S>) {
    for _ in 0..10_000 {
        if s.idle() {
            return;
        }
        s.step();
    }
    panic!("scheduler did not finish");
}

/// Regression (issue 35, defect 7): under overload some requests waited longer than FIFO
/// order explains. Bursts of arrivals beyond what three slots drain, mixing short and long
/// prompts, prompts that share a slot's cached prefix, `n = 2` pairs (the same prompt
/// twice in a row), prompt scoring and clients leaving while queued or running. Each job's
/// id is its sampling seed, in submission order. Oracle, checked after every admission:
/// jobs start in submission order; no slot is idle while a live job waits; and every
/// running job was submitted before every waiting one, so a job waits only for the jobs
/// ahead of it.
#[test]
fn admission_is_fifo_and_a_wait_is_bounded_by_the_jobs_ahead() {
    let mut rng = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = |m: u64| {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng % m
    };
    let (s, _, _) = toy_sched(3, 64, 4);
    let mut s = s.with_batcher(Box::new(ToyBatch {
        widths: Rc::new(RefCell::new(Vec::new())),
        fail: false,
    }));
    let mut rxs: Vec<Option<UnboundedReceiver<GenEvent>>> = Vec::new();
    let mut started: Vec<u64> = Vec::new();
    let mut recent: Vec<u32> = vec![1, 2, 3, 4, 5, 6, 7, 8];
    let seed_of = |j: &Job| j.req.sampling.seed;
    for step in 0..20_000 {
        // Bursts for the first 400 steps, then the queue drains.
        if step >= 400 && s.idle() {
            break;
        }
        let arrivals = if step < 400 { next(3) } else { 0 };
        for _ in 0..arrivals {
            let kind = next(5);
            let prompt: Vec<u32> = match kind {
                0 => vec![next(V as u64) as u32],
                1 => (0..10 + next(20)).map(|_| next(V as u64) as u32).collect(),
                // A prefix some slot probably still holds: a cache hit if admitted there.
                _ => {
                    let keep = 1 + next(recent.len().min(12) as u64) as usize;
                    let mut p = recent[..keep].to_vec();
                    p.push(next(V as u64) as u32);
                    p
                }
            };
            recent = prompt.clone();
            let copies = if kind == 4 { 2 } else { 1 };
            for _ in 0..copies {
                let id = rxs.len() as u64;
                let rx = job(&mut s, &prompt, 1 + next(8) as usize, &[]);
                let last = s.waiting.back_mut().unwrap();
                last.req.sampling.seed = id;
                last.req.prompt_logprobs = next(7) == 0;
                // Leave before being served: must not hold anyone up.
                if next(8) == 0 {
                    drop(rx);
                    rxs.push(None);
                    continue;
                }
                rxs.push(Some(rx));
            }
        }
        // Leave while queued or running.
        if next(12) == 0 && !rxs.is_empty() {
            let k = next(rxs.len() as u64) as usize;
            rxs[k] = None;
        }
        s.admit();
        let live_waiting: Vec<u64> = s
            .waiting
            .iter()
            .filter(|j| !j.tx.is_closed())
            .map(seed_of)
            .collect();
        let running: Vec<u64> = s
            .slots
            .iter()
            .filter_map(|x| x.active.as_ref().map(|a| seed_of(&a.job)))
            .collect();
        if !live_waiting.is_empty() {
            assert_eq!(
                running.len(),
                3,
                "a slot is idle while {live_waiting:?} wait"
            );
        }
        if let (Some(newest), Some(oldest)) = (running.iter().max(), live_waiting.iter().min()) {
            assert!(
                newest < oldest,
                "step {step}: job {newest} runs while earlier job {oldest} waits"
            );
        }
        for (id, rx) in rxs.iter_mut().enumerate() {
            if let Some(rx) = rx {
                while let Ok(ev) = rx.try_recv() {
                    if matches!(ev, GenEvent::Started { .. }) {
                        started.push(id as u64);
                    }
                }
            }
        }
        s.step();
    }
    assert!(s.idle(), "the queue never drained");
    assert!(
        started.windows(2).all(|w| w[0] < w[1]),
        "jobs started out of submission order: {started:?}"
    );
    let kept: Vec<u64> = (0..rxs.len() as u64)
        .filter(|&id| rxs[id as usize].is_some())
        .collect();
    assert!(
        kept.iter().all(|id| started.contains(id)),
        "every job whose client stayed was served"
    );
    assert!(
        kept.len() > 200,
        "too little traffic to mean anything: {}",
        kept.len()
    );
}

/// Oracle: the toy model's known continuation (last token + 1), with the forced close
/// marker's tokens spliced in after exactly the budget.
#[test]
fn a_reasoning_budget_closes_the_block_and_the_answer_follows() {
    let (mut s, _, _) = toy_sched(1, 64, 8);
    let mut rx = job(&mut s, &[0], 8, &[]);
    s.waiting.back_mut().unwrap().req.reasoning_budget = Some(crate::ReasoningBudget {
        tokens: 3,
        starts_inside: true,
        open: vec![13],
        close: vec![14],
        forced: vec![10, 11],
        text_markers: Some(("<think>", "</think>")),
    });
    run_all(&mut s);
    // 1, 2, 3 of reasoning, then the forced 10, 11, then the model's own 12, 13, 14.
    assert_eq!(drain(&mut rx).0, "bcdklmno");
    let mut plain = job(&mut s, &[0], 8, &[]);
    run_all(&mut s);
    assert_eq!(drain(&mut plain).0, "bcdefghi", "no budget: untouched");
}
