//! The scheduler speculating with prompt lookup over the toy model. Oracle: the same jobs
//! without speculation, event for event (token ids, text, log-probabilities, finish, usage),
//! greedy and sampled, batched and one by one; after every job its sequence holds exactly
//! what the plain scheduler's holds (a rejected draft leaves no trace). Path markers: drafts
//! were accepted and rejected, and speculating slots shared batched steps.

use super::*;
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

fn run_jobs(
    rt: &'static dyn Runtime,
    lookup: Option<usize>,
    batched: bool,
    n_ctx: usize,
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
    if let Some(n) = lookup {
        s = s.with_lookup(Lookup::new(n).unwrap());
    }
    let mut rxs: Vec<_> = JOBS
        .iter()
        .enumerate()
        .map(|(k, &(prompt, max, stop))| {
            let rx = job(&mut s, prompt, max, stop);
            if let Some(queued) = s.waiting.back_mut() {
                queued.req.sampling.seed = 7 + k as u64;
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
