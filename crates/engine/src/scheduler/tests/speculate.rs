//! The scheduler speculating over the toy model with prompt lookup, a draft model (a toy
//! session of its own per slot) and a planted bad draft. Oracle: the same jobs without
//! speculation, event for event (token ids, text, log-probabilities, finish, usage),
//! greedy and sampled, batched and one by one; after every job its sequence holds exactly
//! what the plain scheduler's holds (a rejected draft leaves no trace). Path markers: drafts
//! were accepted and rejected, and speculating slots shared batched steps. A request's own
//! draft length (`speculative.n_max`) bounds its drafts, and 0 turns them off; its floor
//! (`speculative.n_min`) and confidence (`speculative.p_min`), or the server's, change
//! which drafts are verified and never an event.

use super::*;
use crate::inference::{SpecLimits, SpecRequest};
use crate::speculate::{Draft, Lookup};
use crate::{Sampler, SamplerConfig};

/// Draws with the real sampler over the toy's rows at temperature 1: the favoured token
/// has about 90 % of the mass, so a seeded stream sometimes leaves the draft's path.
struct Drawn(Sampler);

impl RowPicker for Drawn {
    fn pick(&mut self, logits: &[f32], history: &[u32]) -> Result<Picked, GenerateError> {
        let s = self.0.sample(logits, history)?;
        Ok(Picked {
            token: s.token,
            logprob: Some(s.logprob),
            top: s.top,
        })
    }
    fn force(&mut self, logits: &[f32], token: u32) -> Result<Picked, GenerateError> {
        Greedy.force(logits, token)
    }
}

/// [`ToyRt`] with a seeded sampler per request (the seed from the request).
struct DrawnRt;
impl Runtime for DrawnRt {
    fn picker(&self, req: &GenRequest) -> Result<Box<dyn RowPicker>, GenerateError> {
        let cfg = SamplerConfig {
            temperature: 1.0,
            seed: req.sampling.seed,
            n_logprobs: 2,
            frequency_penalty: 0.1,
            ..SamplerConfig::default()
        };
        Ok(Box::new(Drawn(Sampler::new(cfg)?)))
    }
    fn is_eog(&self, token: u32) -> bool {
        ToyRt.is_eog(token)
    }
    fn decode(&self, ids: &[u32]) -> String {
        ToyRt.decode(ids)
    }
    fn token_bytes(&self, id: u32) -> Vec<u8> {
        ToyRt.token_bytes(id)
    }
}

/// Prompts that repeat (lookup drafts from them) and one that does not, with token limits
/// and stop strings that end some of them inside a draft (`d` is token 3, `hi` tokens 7 8).
const JOBS: [(&[u32], usize, &[&str]); 5] = [
    (&[5, 6, 7, 8, 9, 10, 11, 12, 5, 6], 20, &[]),
    (&[1, 2, 3, 4, 1, 2], 9, &[]),
    (&[9], 3, &[]),
    (&[2, 3, 4, 5, 6, 2, 3, 4], 12, &["hi"]),
    (&[4, 5, 6, 4, 5], 4, &[]),
];

/// What a client sees of one job, timings left out.
fn seen(rx: &mut UnboundedReceiver<GenEvent>) -> Vec<String> {
    let mut out = Vec::new();
    while let Ok(ev) = rx.try_recv() {
        out.push(match ev {
            GenEvent::Token { id, text, logprob } => format!("{id} {text:?} {logprob:?}"),
            GenEvent::Done {
                finish,
                stop_sequence,
                tail,
                usage,
                ..
            } => format!("done {finish:?} {stop_sequence:?} {tail:?} {usage:?}"),
            other => format!("{other:?}"),
        });
    }
    out
}

/// Runs [`JOBS`] at once (one slot each) with `lookup` drafts of at most that many
/// tokens: each job's events, each slot's final sequence, the counters, and the widths of
/// the batched calls.
struct Outcome {
    events: Vec<Vec<String>>,
    kv: Vec<Vec<u32>>,
    proposed: usize,
    accepted: usize,
    widths: Vec<usize>,
}

/// A slot's proposer, made afresh for each slot.
type Make = fn(usize) -> Box<dyn Proposer>;

/// Prompt lookup of at most `n` tokens.
fn lookup(n: usize) -> Box<dyn Proposer> {
    Box::new(Lookup::new(n).unwrap())
}

/// The toy as a draft model: a session of its own, whose guess is the toy's own next
/// token (so greedy drafts are always right).
fn toy_draft(_: usize) -> Box<dyn Proposer> {
    Box::new(Draft::new(Bounded(Toy {
        kv: Vec::new(),
        logits: Vec::new(),
        evals: Rc::new(RefCell::new(Vec::new())),
    })))
}

/// The planted defect: the toy draft with every other token it proposes corrupted.
fn corrupted_draft(n: usize) -> Box<dyn Proposer> {
    Box::new(Corrupt(toy_draft(n)))
}

struct Corrupt(Box<dyn Proposer>);

impl Proposer for Corrupt {
    fn propose(&mut self, history: &[u32], max: usize) -> Vec<u32> {
        let mut d = self.0.propose(history, max);
        for t in d.iter_mut().skip(1).step_by(2) {
            *t = (*t + 3) % V;
        }
        d
    }
}

/// The toy with a context a draft can measure (the toy's own is unbounded).
struct Bounded(Toy);

impl Timeline for Bounded {
    fn truncate(&mut self, n: usize) {
        self.0.truncate(n);
    }
    fn n_past(&self) -> usize {
        self.0.n_past()
    }
    fn ctx(&self) -> usize {
        1024
    }
    fn eval_last(&mut self, tokens: &[u32]) -> Result<&[f32], GenerateError> {
        self.0.eval_last(tokens)
    }
}

fn run_jobs(
    rt: &'static dyn Runtime,
    lookup_max: Option<usize>,
    batched: bool,
    n_ctx: usize,
) -> Outcome {
    run_with(
        rt,
        lookup_max.map(|n| (lookup as Make, server(n))),
        batched,
        n_ctx,
        SpecRequest::default(),
    )
}

/// A server's speculation of at most `draft_max` tokens a step, with no floor or
/// confidence threshold.
fn server(draft_max: usize) -> SpecLimits {
    SpecLimits {
        draft_max,
        draft_min: 0,
        p_min: 0.0,
        draft_model: true,
    }
}

/// Every request asking for at most `n_max` draft tokens.
fn n_max(n_max: Option<usize>) -> SpecRequest {
    SpecRequest {
        n_max,
        ..SpecRequest::default()
    }
}

/// As [`run_jobs`], with each slot's proposer made by `spec`'s function under its
/// server bounds, and every request's own speculation fields `request`.
fn run_with(
    rt: &'static dyn Runtime,
    spec: Option<(Make, SpecLimits)>,
    batched: bool,
    n_ctx: usize,
    request: SpecRequest,
) -> Outcome {
    let (s, _, counters) = toy_sched(JOBS.len(), n_ctx, 4);
    let mut s = Scheduler { rt, ..s };
    let widths = Rc::new(RefCell::new(Vec::new()));
    if batched {
        s = s.with_batcher(Box::new(ToyBatch {
            widths: widths.clone(),
            fail: false,
        }));
    }
    if let Some((make, limits)) = spec {
        s = s.with_proposers(
            (0..JOBS.len()).map(|_| make(limits.draft_max)).collect(),
            limits,
        );
    }
    let mut rxs: Vec<_> = JOBS
        .iter()
        .enumerate()
        .map(|(k, &(prompt, max, stop))| {
            let rx = job(&mut s, prompt, max, stop);
            if let Some(queued) = s.waiting.back_mut() {
                queued.req.sampling.seed = 7 + k as u64;
                queued.req.speculative = request;
            }
            rx
        })
        .collect();
    run_all(&mut s);
    for slot in &s.slots {
        assert_eq!(
            slot.tokens, slot.seq.kv,
            "the slot's tokens are its sequence's"
        );
    }
    let w = widths.borrow().clone();
    Outcome {
        events: rxs.iter_mut().map(seen).collect(),
        kv: s.slots.iter().map(|slot| slot.seq.kv.clone()).collect(),
        proposed: counters.spec_proposed.load(Ordering::SeqCst),
        accepted: counters.spec_accepted.load(Ordering::SeqCst),
        widths: w,
    }
}

#[test]
fn speculating_slots_give_the_plain_events_and_sequences() {
    for (name, rt) in [
        ("greedy", &ToyRt as &'static dyn Runtime),
        ("drawn", &DrawnRt),
    ] {
        for n_ctx in [64, 14] {
            let plain = run_jobs(rt, None, true, n_ctx);
            assert_eq!((plain.proposed, plain.accepted), (0, 0));
            for (draft_max, batched) in [(4, true), (15, true), (3, false)] {
                let spec = run_jobs(rt, Some(draft_max), batched, n_ctx);
                let label = format!("{name} ctx {n_ctx} draft {draft_max} batched {batched}");
                assert_eq!(spec.events, plain.events, "{label}");
                assert_eq!(spec.kv, plain.kv, "{label}: sequences after the jobs");
                // Path markers: drafts were verified, some accepted and some rejected.
                assert!(spec.accepted > 0, "{label}: nothing accepted");
                assert!(spec.proposed > spec.accepted, "{label}: nothing rejected");
                if batched {
                    assert!(
                        spec.widths.iter().any(|&w| w > 1),
                        "{label}: {:?}",
                        spec.widths
                    );
                }
                println!(
                    "{label}: proposed {} accepted {}",
                    spec.proposed, spec.accepted
                );
            }
        }
    }
}

#[test]
fn a_draft_model_gives_the_plain_events_and_a_bad_draft_only_lowers_acceptance() {
    for (name, rt) in [
        ("greedy", &ToyRt as &'static dyn Runtime),
        ("drawn", &DrawnRt),
    ] {
        let plain = run_jobs(rt, None, true, 64);
        let good = run_with(rt, Some((toy_draft, server(6))), true, 64, n_max(None));
        let bad = run_with(
            rt,
            Some((corrupted_draft, server(6))),
            true,
            64,
            n_max(None),
        );
        for (which, spec) in [("draft", &good), ("corrupted draft", &bad)] {
            assert_eq!(spec.events, plain.events, "{name} {which}");
            assert_eq!(
                spec.kv, plain.kv,
                "{name} {which}: sequences after the jobs"
            );
            assert!(spec.accepted > 0, "{name} {which}: nothing accepted");
        }
        let rate = |o: &Outcome| o.accepted as f64 / o.proposed as f64;
        println!(
            "{name}: draft accepted {}/{} ({:.2}), corrupted {}/{} ({:.2})",
            good.accepted,
            good.proposed,
            rate(&good),
            bad.accepted,
            bad.proposed,
            rate(&bad)
        );
        // Drafts past an end of generation, a stop string or a token limit are rejected
        // even when right, so not every draft token of the good draft is accepted.
        assert!(
            rate(&bad) < rate(&good),
            "{name}: the bad draft was not worse"
        );
    }
}

thread_local! {
    /// The longest draft any [`asked_draft`] proposer of this thread was asked for.
    static MOST_ASKED: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// The toy draft, recording the longest draft asked of it in [`MOST_ASKED`].
fn asked_draft(n: usize) -> Box<dyn Proposer> {
    Box::new(Asked(toy_draft(n)))
}

struct Asked(Box<dyn Proposer>);

impl Proposer for Asked {
    fn propose(&mut self, history: &[u32], max: usize) -> Vec<u32> {
        MOST_ASKED.with(|m| m.set(m.get().max(max)));
        self.0.propose(history, max)
    }
}

#[test]
fn a_requests_draft_length_bounds_its_drafts_and_zero_turns_them_off() {
    let plain = run_jobs(&ToyRt, None, true, 64);
    let mut most = Vec::new();
    for request_max in [Some(0), Some(2), Some(9), None] {
        MOST_ASKED.with(|m| m.set(0));
        let o = run_with(
            &ToyRt,
            Some((asked_draft, server(6))),
            true,
            64,
            n_max(request_max),
        );
        assert_eq!(o.events, plain.events, "n_max {request_max:?}");
        let asked = MOST_ASKED.with(std::cell::Cell::get);
        println!(
            "n_max {request_max:?}: proposed {}, longest asked {asked}",
            o.proposed
        );
        most.push((o.proposed, asked));
    }
    // 0: nothing proposed, the proposer never asked; 2: drafts of 2 at most; 9 is capped
    // to the server's 6, as is no n_max.
    assert_eq!(most[0], (0, 0));
    assert!(most[1].0 > 0 && most[1].1 == 2, "{most:?}");
    assert_eq!(most[2].1, 6, "{most:?}");
    assert_eq!(most[3].1, 6, "{most:?}");
}

#[test]
fn a_draft_floor_and_confidence_change_the_drafts_never_the_events() {
    // Oracles: the plain events; the toy draft's confidence by hand (its favoured token
    // has logit 5 against 0 for 15 others: e^5 / (e^5 + 15) = 0.908); a floor equal to
    // the draft length admits only drafts of exactly that length, so the proposed count
    // is a multiple of it.
    for (name, rt) in [
        ("greedy", &ToyRt as &'static dyn Runtime),
        ("drawn", &DrawnRt),
    ] {
        let plain = run_jobs(rt, None, true, 64);
        let free = run_with(rt, Some((toy_draft, server(6))), true, 64, n_max(None));
        let run = |limits: SpecLimits, request: SpecRequest| {
            let o = run_with(rt, Some((toy_draft, limits)), true, 64, request);
            assert_eq!(o.events, plain.events, "{name} {limits:?} {request:?}");
            assert_eq!(o.kv, plain.kv, "{name} {limits:?} {request:?}");
            println!(
                "{name} {limits:?} {request:?}: proposed {} accepted {}",
                o.proposed, o.accepted
            );
            o.proposed
        };
        let floored = |n: usize| SpecRequest {
            n_min: Some(n),
            ..SpecRequest::default()
        };
        let sure = |p: f32| SpecRequest {
            p_min: Some(p),
            ..SpecRequest::default()
        };
        println!("{name}: no floor or threshold: proposed {}", free.proposed);
        // Below the draft's confidence nothing changes; above it nothing is drafted.
        assert_eq!(run(server(6), sure(0.9)), free.proposed);
        assert_eq!(run(server(6), sure(0.95)), 0);
        // The same from the server's default, and a request's own value overrides it.
        let strict = SpecLimits {
            p_min: 0.95,
            ..server(6)
        };
        assert_eq!(run(strict, SpecRequest::default()), 0);
        assert_eq!(run(strict, sure(0.0)), free.proposed);
        // A floor of 6: only whole drafts; so from the server.
        let whole = run(server(6), floored(6));
        assert!(whole > 0 && whole % 6 == 0, "{name}: proposed {whole}");
        let from_server = SpecLimits {
            draft_min: 6,
            ..server(6)
        };
        assert_eq!(run(from_server, SpecRequest::default()), whole);
        // A request's shorter n_max clamps the server's floor (as llama.cpp does).
        let short = run(from_server, n_max(Some(2)));
        assert!(short > 0 && short % 2 == 0, "{name}: proposed {short}");
    }
}
