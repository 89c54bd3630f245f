//! The slot scheduler: up to N sequences (slots), a FIFO of waiting jobs, prefix reuse and
//! chunked prefill, one token per active slot per step.
//!
//! It is generic over [`Timeline`] (one KV timeline) and [`Runtime`] (sampling, end-of-
//! generation ids, decoding), so its state machine is tested here with a tiny deterministic
//! model, and the same code drives real sessions.
//!
//! One step = admit waiting jobs into idle slots, then advance every active slot once: a
//! decoding slot evaluates one token, prefilling slots share a budget of `prefill_chunk`
//! prompt tokens per step (oldest admission first), so the stall that long prompts cause to
//! running streams stays bounded however many arrive at once. With a [`BatchEval`] the
//! inputs of all slots of a step are evaluated in one forward pass (continuous batching);
//! a slot scoring its prompt (which needs every position's logits) runs on its own. A slot
//! whose client has gone (closed channel) is released at the step boundary.
//!
//! With proposers ([`Scheduler::with_proposers`]: prompt lookup, a draft model) a decoding
//! slot may speculate: its input is its pending token followed by the tokens its
//! [`Proposer`] drafted, and the same step returns the logits after each of them. The
//! slot then picks and emits row after row through the very code of a plain step,
//! accepting while the picked token is the draft token evaluated after it ([`Verify`], the
//! run loop's rule), and cuts its sequence back to the plain step's at the first
//! difference. Every token, event, stop,
//! grammar state and random draw is therefore the plain scheduler's; the draft decides
//! only how many tokens one step yields.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, TryRecvError};
use std::time::Instant;

use tokio::sync::mpsc::UnboundedSender;

use crate::budget::BudgetState;
use crate::generate::{GenerateError, Timeline, Verify};
use crate::inference::{
    CacheSource, FinishReason, GenEvent, GenRequest, SpecLimits, Timings, TokenLogprob, TopLogprob,
    Usage,
};
use crate::speculate::{Adaptive, Proposer};
use crate::stops::StopScanner;

/// A prefix cache shared by all slots (memory, disk): restores a prompt's longest cached
/// prefix into a slot's sequence and keeps checkpoints of finished sequences.
pub trait PrefixStore<S> {
    /// If the cache holds a prefix of `prompt` longer than `have` tokens (and shorter than
    /// the prompt), load it into `seq` and return its length and origin; `seq` then holds
    /// exactly `prompt[..n]`. On `None`, `seq` is unchanged.
    fn restore(&mut self, seq: &mut S, prompt: &[u32], have: usize)
    -> Option<(usize, CacheSource)>;
    /// Offer a checkpoint of `seq`, which holds exactly `tokens`.
    fn checkpoint(&mut self, seq: &S, tokens: &[u32]);
}

/// Evaluates several sequences in one pass: the continuous-batching hook.
pub trait BatchEval<S> {
    /// Appends `inputs[i]` to `seqs[i]` for every `i` and returns, for each in order, its
    /// logits after each of its last `tails[i]` new tokens (`1..=inputs[i].len()`), row
    /// after row. Must give each sequence the rows it would get from
    /// [`Timeline::eval_all`] alone.
    fn eval_many(
        &mut self,
        seqs: &mut [&mut S],
        inputs: &[&[u32]],
        tails: &[usize],
    ) -> Result<Vec<Vec<f32>>, GenerateError>;
}

/// One slot's work in a step: its new tokens and whether it scores its prompt.
struct Planned {
    slot: usize,
    /// Prompt tokens, or the pending token followed by `draft`.
    input: Vec<u32>,
    /// Draft tokens at the end of `input`, verified this step (empty: a plain step).
    drafted: usize,
    /// Prompt logprobs were asked for and this input is prompt: every position's logits.
    score_prompt: bool,
}

impl Planned {
    /// How many of the last inputs need their logits: all of them when scoring the prompt,
    /// the pending token's and every draft token's when speculating, else the last.
    fn tail(&self) -> usize {
        if self.score_prompt {
            self.input.len()
        } else {
            self.drafted + 1
        }
    }
}

/// A slot's evaluation: the logits after each of its last [`Planned::tail`] new tokens.
struct Evaluated {
    rows: Vec<f32>,
}

/// A sampled token.
#[derive(Debug, Clone, PartialEq)]
pub struct Picked {
    /// Token id.
    pub token: u32,
    /// Its log-probability; `None` when the request asked for no log-probabilities.
    pub logprob: Option<f32>,
    /// Best alternatives (id, logprob), as many as requested.
    pub top: Vec<(u32, f32)>,
}

/// A per-request sampler over a host logits row.
pub trait RowPicker {
    /// Choose the next token.
    fn pick(&mut self, logits: &[f32], history: &[u32]) -> Result<Picked, GenerateError>;
    /// Take `token` next whatever the row says (a reasoning budget closing its block): a
    /// grammar advances over it, and its log-probability is read from the row.
    fn force(&mut self, logits: &[f32], token: u32) -> Result<Picked, GenerateError>;
}

/// What the scheduler needs from the model besides the sequences.
pub trait Runtime {
    /// A sampler for a request.
    fn picker(&self, req: &GenRequest) -> Result<Box<dyn RowPicker>, GenerateError>;
    /// Whether a token ends generation.
    fn is_eog(&self, token: u32) -> bool;
    /// Lossy text of token ids (special tokens hidden).
    fn decode(&self, ids: &[u32]) -> String;
    /// Exact bytes of one token (empty for hidden special tokens), for logprobs.
    fn token_bytes(&self, id: u32) -> Vec<u8>;
}

/// A token's text, bytes and log-probability as an alternative in logprobs.
fn top_logprob(rt: &dyn Runtime, id: u32, logprob: f32) -> TopLogprob {
    TopLogprob {
        token: rt.decode(&[id]),
        bytes: rt.token_bytes(id),
        logprob,
    }
}

/// A queued request.
pub struct Job {
    /// The request.
    pub req: GenRequest,
    /// Where its events go; closed means the client left.
    pub tx: UnboundedSender<GenEvent>,
    /// When it was submitted.
    pub queued_at: Instant,
}

/// Occupancy counters shared with the submitting side.
#[derive(Debug, Default)]
pub struct Counters {
    /// Submitted and not yet finished (waiting or running).
    pub inflight: AtomicUsize,
    /// Running in a slot.
    pub active: AtomicUsize,
    /// Steps that evaluated two or more slots in one batched forward pass.
    pub batched_steps: AtomicUsize,
    /// Draft tokens proposed and evaluated by speculating slots.
    pub spec_proposed: AtomicUsize,
    /// Draft tokens accepted (emitted without a forward pass of their own).
    pub spec_accepted: AtomicUsize,
}

/// Scheduler limits.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Context length of each slot.
    pub n_ctx: usize,
    /// Most prompt tokens evaluated per step, over all prefilling slots.
    pub prefill_chunk: usize,
    /// A hybrid's recurrent state exists only where a pass ends, so a prompt chunk stops
    /// on the last multiple of this it crosses (`ferrite_model::CHECKPOINT_EVERY`), where
    /// the session keeps a checkpoint the prefix cache can save; `None` for models of
    /// attention only.
    pub checkpoint_every: Option<usize>,
}

/// Incremental detokenization: text is released once it no longer ends in an incomplete
/// UTF-8 sequence, diffing two decodes so tokenizers that change leading spaces by context
/// still stream the right text.
#[derive(Debug, Default)]
struct TextTail {
    ids: Vec<u32>,
    prefix: usize,
    read: usize,
}

impl TextTail {
    fn push(&mut self, id: u32, rt: &dyn Runtime) -> String {
        self.ids.push(id);
        let before = rt.decode(&self.ids[self.prefix..self.read]);
        let after = rt.decode(&self.ids[self.prefix..]);
        if after.len() > before.len() && !after.ends_with('\u{FFFD}') && after.starts_with(&before)
        {
            self.prefix = self.read;
            self.read = self.ids.len();
            after[before.len()..].to_string()
        } else {
            String::new()
        }
    }

    fn finish(&mut self, rt: &dyn Runtime) -> String {
        let before = rt.decode(&self.ids[self.prefix..self.read]);
        let after = rt.decode(&self.ids[self.prefix..]);
        after.get(before.len()..).unwrap_or("").to_string()
    }
}

struct Active {
    job: Job,
    picker: Box<dyn RowPicker>,
    /// The request's reasoning budget, when it has one.
    budget: Option<BudgetState>,
    scanner: StopScanner,
    text: TextTail,
    /// Prompt tokens already in the KV.
    fed: usize,
    cached: usize,
    source: CacheSource,
    generated: Vec<u32>,
    /// The sampled token not yet evaluated.
    pending: Option<u32>,
    /// Most draft tokens a step for this request (0: it never speculates).
    draft_max: usize,
    admitted: Instant,
    first_token: Option<Instant>,
}

struct Slot<S> {
    seq: S,
    /// Exactly the tokens whose KV the sequence holds.
    tokens: Vec<u32>,
    active: Option<Active>,
}

/// Logprobs of the prompt tokens that the rows of `all` (logits after prompt positions
/// `fed..fed + n`) predict: row `j` scores prompt token `fed + j + 1`, when there is one.
fn prompt_logprobs(
    all: &[f32],
    req: &GenRequest,
    fed: usize,
    n: usize,
    rt: &dyn Runtime,
) -> Vec<TokenLogprob> {
    let k = req.logprobs.unwrap_or(0);
    let vocab = all.len() / n.max(1);
    all.chunks_exact(vocab.max(1))
        .enumerate()
        .filter_map(|(j, row)| {
            let target = *req.prompt.get(fed + j + 1)?;
            let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let lse = max + row.iter().map(|&x| (x - max).exp()).sum::<f32>().ln();
            let mut top: Vec<usize> = (0..row.len()).collect();
            if k > 0 && k < top.len() {
                top.select_nth_unstable_by(k - 1, |&x, &y| row[y].total_cmp(&row[x]));
            }
            top.truncate(k);
            top.sort_by(|&x, &y| row[y].total_cmp(&row[x]));
            Some(TokenLogprob {
                token: rt.decode(&[target]),
                bytes: rt.token_bytes(target),
                logprob: row
                    .get(target as usize)
                    .map_or(f32::NEG_INFINITY, |&x| x - lse),
                top: top
                    .into_iter()
                    .map(|id| top_logprob(rt, id as u32, row[id] - lse))
                    .collect(),
            })
        })
        .collect()
}

fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// The scheduler state; [`Scheduler::run`] loops until the job channel closes.
pub struct Scheduler<'r, S> {
    rt: &'r dyn Runtime,
    slots: Vec<Slot<S>>,
    waiting: VecDeque<Job>,
    counters: Arc<Counters>,
    limits: Limits,
    store: Option<Box<dyn PrefixStore<S> + 'r>>,
    batcher: Option<Box<dyn BatchEval<S> + 'r>>,
    /// Slot `i`'s proposer at `i`, when the server speculates: kept across the slot's
    /// requests (a draft model's session reuses what it holds), its draft length adapted
    /// afresh for each request.
    proposers: Vec<Option<Adaptive<Box<dyn Proposer + 'r>>>>,
    /// The server's speculation bounds, each a request's default (no proposers: all 0).
    spec: SpecLimits,
}

impl<'r, S: Timeline> Scheduler<'r, S> {
    /// Adds a prefix cache shared by all slots.
    pub fn with_prefix_store(mut self, store: Box<dyn PrefixStore<S> + 'r>) -> Self {
        self.store = Some(store);
        self
    }

    /// Evaluate the slots of each step together through `batcher`.
    pub fn with_batcher(mut self, batcher: Box<dyn BatchEval<S> + 'r>) -> Self {
        self.batcher = Some(batcher);
        self
    }

    /// Speculate in slot `i` with `proposers[i]` (prompt lookup, a draft model's session),
    /// within `spec` (a request's own fields narrow it), with the run loop's adaptive draft
    /// length ([`Adaptive`]) per request. A rejected draft costs a truncation, so this is
    /// for timelines whose truncation is cheap (K/V caches, not replayed recurrent state).
    pub fn with_proposers(
        mut self,
        proposers: Vec<Box<dyn Proposer + 'r>>,
        spec: SpecLimits,
    ) -> Self {
        self.proposers = proposers
            .into_iter()
            .map(|p| Some(Adaptive::new(p, spec.draft_max)))
            .collect();
        self.spec = spec;
        self
    }

    /// A scheduler over these sequences.
    pub fn new(rt: &'r dyn Runtime, seqs: Vec<S>, counters: Arc<Counters>, limits: Limits) -> Self {
        Scheduler {
            rt,
            slots: seqs
                .into_iter()
                .map(|seq| Slot {
                    seq,
                    tokens: Vec::new(),
                    active: None,
                })
                .collect(),
            waiting: VecDeque::new(),
            counters,
            limits,
            store: None,
            batcher: None,
            proposers: Vec::new(),
            spec: SpecLimits {
                draft_max: 0,
                draft_min: 0,
                p_min: 0.0,
                draft_model: false,
            },
        }
    }

    /// Serve jobs until the sending side is dropped and all work is done.
    pub fn run(&mut self, jobs: &Receiver<Job>) {
        loop {
            if self.idle() {
                match jobs.recv() {
                    Ok(job) => self.waiting.push_back(job),
                    Err(_) => return,
                }
            }
            loop {
                match jobs.try_recv() {
                    Ok(job) => self.waiting.push_back(job),
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) if self.idle() => return,
                    Err(TryRecvError::Disconnected) => break,
                }
            }
            self.step();
        }
    }

    fn idle(&self) -> bool {
        self.waiting.is_empty() && self.slots.iter().all(|s| s.active.is_none())
    }

    fn end_job(&self) {
        self.counters.inflight.fetch_sub(1, Ordering::SeqCst);
    }

    /// Admit waiting jobs, then advance every active slot once.
    pub fn step(&mut self) {
        self.admit();
        let mut order: Vec<usize> = (0..self.slots.len()).collect();
        order.sort_by_key(|&i| self.slots[i].active.as_ref().map(|a| a.admitted));
        let mut budget = self.limits.prefill_chunk.max(1);
        let planned: Vec<Planned> = order
            .into_iter()
            .filter_map(|i| self.plan(i, &mut budget))
            .collect();
        let results = self.evaluate(&planned);
        for (p, r) in planned.into_iter().zip(results) {
            match r {
                Ok(ev) => self.advance(p, ev),
                Err(e) => self.fail(p.slot, e),
            }
        }
    }

    /// Evaluate every planned input: the plain ones together through the batcher when there
    /// is one (falling back to one by one if the batched pass fails, so an error lands on
    /// the slot that caused it), prompt-scoring ones alone.
    fn evaluate(&mut self, planned: &[Planned]) -> Vec<Result<Evaluated, GenerateError>> {
        let mut out: Vec<Option<Result<Evaluated, GenerateError>>> =
            planned.iter().map(|_| None).collect();
        let batchable: Vec<usize> = (0..planned.len())
            .filter(|&k| !planned[k].score_prompt)
            .collect();
        if let Some(batcher) = self.batcher.as_mut()
            && batchable.len() > 1
        {
            let mut by_slot: Vec<Option<usize>> = vec![None; self.slots.len()];
            for &k in &batchable {
                by_slot[planned[k].slot] = Some(k);
            }
            let mut seqs = Vec::with_capacity(batchable.len());
            let mut inputs = Vec::with_capacity(batchable.len());
            let mut tails = Vec::with_capacity(batchable.len());
            let mut which = Vec::with_capacity(batchable.len());
            for (slot, k) in self.slots.iter_mut().zip(&by_slot) {
                if let Some(k) = *k {
                    seqs.push(&mut slot.seq);
                    inputs.push(planned[k].input.as_slice());
                    tails.push(planned[k].tail());
                    which.push(k);
                }
            }
            if let Ok(rows) = batcher.eval_many(&mut seqs, &inputs, &tails) {
                self.counters.batched_steps.fetch_add(1, Ordering::Relaxed);
                for (k, rows) in which.into_iter().zip(rows) {
                    out[k] = Some(Ok(Evaluated { rows }));
                }
            }
        }
        for (k, p) in planned.iter().enumerate() {
            if out[k].is_some() {
                continue;
            }
            let seq = &mut self.slots[p.slot].seq;
            out[k] = Some(if p.tail() > 1 {
                seq.eval_all(&p.input).map(|mut all| {
                    let n_vocab = all.len() / p.input.len();
                    Evaluated {
                        rows: all.split_off((p.input.len() - p.tail()) * n_vocab),
                    }
                })
            } else {
                seq.eval_last(&p.input)
                    .map(|l| Evaluated { rows: l.to_vec() })
            });
        }
        out.into_iter()
            .map(|r| r.unwrap_or(Err(GenerateError::NoRow)))
            .collect()
    }

    /// FIFO admission into idle slots; each job takes the idle slot sharing the longest
    /// prefix with its prompt.
    fn admit(&mut self) {
        while let Some(job) = self.waiting.pop_front() {
            if job.tx.is_closed() {
                self.end_job();
                continue;
            }
            let best = self
                .slots
                .iter()
                .enumerate()
                .filter(|(_, s)| s.active.is_none())
                // Ties go to the slot holding the least (so other caches survive), then the
                // lowest index.
                .max_by_key(|(i, s)| {
                    let shared = common_prefix(&s.tokens, &job.req.prompt);
                    (shared, usize::MAX - s.tokens.len(), usize::MAX - i)
                })
                .map(|(i, _)| i);
            let Some(i) = best else {
                self.waiting.push_front(job);
                return;
            };
            let picker = match self.rt.picker(&job.req) {
                Ok(p) => p,
                Err(e) => {
                    self.end_job();
                    let _ = job.tx.send(GenEvent::Failed(e.to_string()));
                    continue;
                }
            };
            let slot = &mut self.slots[i];
            // The last prompt token is always evaluated again: its logits pick the first token.
            // Prompt logprobs need the logits of every prompt position: nothing is reused.
            let reuse = !job.req.prompt_logprobs;
            // A hybrid keeps its recurrent state at checkpoints only: the reuse stops at the
            // nearest one, so what is reported cached is never recomputed.
            let mut cached = if reuse {
                let shared = common_prefix(&slot.tokens, &job.req.prompt);
                slot.seq.reusable(shared.min(job.req.prompt.len() - 1))
            } else {
                0
            };
            slot.seq.truncate(cached);
            slot.tokens.truncate(cached);
            let mut source = if cached > 0 {
                CacheSource::Memory
            } else {
                CacheSource::None
            };
            if let Some((n, from)) = self
                .store
                .as_mut()
                .filter(|_| reuse)
                .and_then(|st| st.restore(&mut slot.seq, &job.req.prompt, cached))
            {
                slot.tokens = job.req.prompt[..n].to_vec();
                (cached, source) = (n, from);
            }
            if job
                .tx
                .send(GenEvent::Started {
                    cached_tokens: cached,
                })
                .is_err()
            {
                self.end_job();
                continue;
            }
            self.counters.active.fetch_add(1, Ordering::SeqCst);
            // The request may ask for shorter drafts than the server's, or none, and for its
            // own floor and confidence; the server's floor never exceeds the request's
            // draft length (as llama.cpp clamps it).
            let asked = job.req.speculative;
            let draft_max = asked
                .n_max
                .map_or(self.spec.draft_max, |n| n.min(self.spec.draft_max));
            let draft_min = asked.n_min.unwrap_or(self.spec.draft_min).min(draft_max);
            let p_min = asked.p_min.unwrap_or(self.spec.p_min);
            if let Some(p) = self.proposers.get_mut(i) {
                *p = p.take().map(|a| {
                    let mut inner = a.into_inner();
                    inner.set_p_min(p_min);
                    Adaptive::new(inner, draft_max).with_draft_min(draft_min)
                });
            }
            slot.active = Some(Active {
                scanner: StopScanner::new(&job.req.stop),
                budget: job.req.reasoning_budget.clone().map(BudgetState::new),
                job,
                picker,
                text: TextTail::default(),
                fed: cached,
                cached,
                source,
                generated: Vec::new(),
                pending: None,
                draft_max,
                admitted: Instant::now(),
                first_token: None,
            });
        }
    }

    /// Free slot `i`. The counters drop before the caller sends the final event, so a
    /// client that reacts to it at once never finds its own finished job still counted
    /// (which could answer its next request with 429).
    fn release(&mut self, i: usize) -> Option<Active> {
        let active = self.slots[i].active.take();
        if active.is_some() {
            self.counters.active.fetch_sub(1, Ordering::SeqCst);
            self.end_job();
        }
        active
    }

    fn fail(&mut self, i: usize, err: GenerateError) {
        // The KV may be partly written; forget it rather than reuse it.
        self.slots[i].seq.truncate(0);
        self.slots[i].tokens.clear();
        if let Some(a) = self.release(i) {
            let _ = a.job.tx.send(GenEvent::Failed(err.to_string()));
        }
    }

    /// What slot `i` evaluates this step (prompt tokens within the prefill budget, or its
    /// pending token and its draft); releases it when its client has gone.
    fn plan(&mut self, i: usize, budget: &mut usize) -> Option<Planned> {
        let held = self.slots[i].tokens.len();
        let a = self.slots[i].active.as_mut()?;
        if a.job.tx.is_closed() {
            self.release(i);
            return None;
        }
        let prompt_len = a.job.req.prompt.len();
        let mut drafted = 0;
        let input: Vec<u32> = if a.fed < prompt_len {
            if *budget == 0 {
                return None;
            }
            let mut end = prompt_len.min(a.fed + *budget);
            if let Some(every) = self.limits.checkpoint_every.filter(|&e| e > 0) {
                let at = end / every * every;
                if at > a.fed && at < end {
                    end = at;
                }
            }
            *budget -= end - a.fed;
            a.job.req.prompt[a.fed..end].to_vec()
        } else {
            let mut input = vec![a.pending.take()?];
            if let Some(p) = self
                .proposers
                .get_mut(i)
                .and_then(Option::as_mut)
                .filter(|_| a.draft_max > 0)
            {
                // Every verified row emits a token: no more rows than the token limit and
                // the context (whose last position ends the output) can still take.
                let room = (a.job.req.max_tokens.saturating_sub(a.generated.len()))
                    .min(self.limits.n_ctx.saturating_sub(held + 1))
                    .saturating_sub(1);
                if room > 0 {
                    let mut history = a.job.req.prompt.clone();
                    history.extend_from_slice(&a.generated);
                    input.extend(p.propose(&history, room));
                    drafted = input.len() - 1;
                    self.counters
                        .spec_proposed
                        .fetch_add(drafted, Ordering::Relaxed);
                }
            }
            input
        };
        Some(Planned {
            slot: i,
            input,
            drafted,
            score_prompt: a.job.req.prompt_logprobs && a.fed < prompt_len,
        })
    }

    /// Takes slot `p.slot`'s evaluated input: reports prompt logprobs, then, once the
    /// prompt is in, samples and streams the next token, and each next one while it is the
    /// draft token evaluated after it ([`Verify`]), cutting the sequence back to the last
    /// token a plain step would hold; or finishes the job.
    fn advance(&mut self, p: Planned, ev: Evaluated) {
        let i = p.slot;
        let tail = p.tail();
        let slot = &mut self.slots[i];
        let Some(a) = slot.active.as_mut() else {
            return;
        };
        let prompt_len = a.job.req.prompt.len();
        let fed = a.fed;
        let base = slot.tokens.len();
        slot.tokens.extend_from_slice(&p.input);
        if p.score_prompt {
            let items = prompt_logprobs(&ev.rows, &a.job.req, fed, p.input.len(), self.rt);
            let _ = a.job.tx.send(GenEvent::PromptLogprobs(items));
        }
        if a.fed < prompt_len {
            a.fed += p.input.len();
            if a.fed < prompt_len {
                return;
            }
        }
        // The rows to pick from: the last input's, then each draft token's.
        let first = p.input.len() - (p.drafted + 1);
        let mut rows = ev.rows;
        let n_vocab = rows.len() / tail;
        let mut v = Verify {
            base: base + first,
            inputs: p.input[first..].to_vec(),
            rows: rows.split_off((tail - p.drafted - 1) * n_vocab),
            at: 0,
        };
        loop {
            let Some(token) = self.emit(i, v.row(), v.held()) else {
                return;
            };
            if v.accepts(token) {
                v.at += 1;
                self.counters.spec_accepted.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            let slot = &mut self.slots[i];
            if slot.tokens.len() > v.held() {
                slot.seq.truncate(v.held());
                slot.tokens.truncate(v.held());
            }
            if let Some(a) = slot.active.as_mut() {
                a.pending = Some(token);
            }
            return;
        }
    }

    /// Picks slot `i`'s next token from `logits`, with its sequence holding (or about to be
    /// cut back to) `held` tokens, and streams it; returns it when the slot goes on. When
    /// the job finishes (or fails) the slot is released, its sequence cut back to `held`.
    fn emit(&mut self, i: usize, logits: &[f32], held: usize) -> Option<u32> {
        let limits = self.limits;
        let slot = &mut self.slots[i];
        let a = slot.active.as_mut()?;
        let prompt_len = a.job.req.prompt.len();
        let mut history = a.job.req.prompt.clone();
        history.extend_from_slice(&a.generated);
        let picked = match a.budget.as_ref().and_then(BudgetState::forced) {
            Some(token) => a.picker.force(logits, token),
            None => a.picker.pick(logits, &history),
        };
        let picked = match picked {
            Ok(p) => p,
            Err(e) => {
                self.fail(i, e);
                return None;
            }
        };
        let rt = self.rt;
        if let Some(b) = a.budget.as_mut() {
            b.observe(picked.token, &rt.token_bytes(picked.token));
        }
        let now = Instant::now();
        a.first_token.get_or_insert(now);
        let (finish, stop_sequence) = if rt.is_eog(picked.token) {
            (FinishReason::Stop, None)
        } else {
            a.generated.push(picked.token);
            let piece = a.text.push(picked.token, rt);
            let scanned = a.scanner.push(&piece);
            let logprob = a
                .job
                .req
                .logprobs
                .zip(picked.logprob)
                .map(|(k, lp)| TokenLogprob {
                    token: rt.decode(&[picked.token]),
                    bytes: rt.token_bytes(picked.token),
                    logprob: lp,
                    top: picked
                        .top
                        .iter()
                        .take(k)
                        .map(|&(id, lp)| top_logprob(rt, id, lp))
                        .collect(),
                });
            let _ = a.job.tx.send(GenEvent::Token {
                id: picked.token,
                text: scanned.text,
                logprob,
            });
            if let Some(stop) = scanned.stop {
                (FinishReason::Stop, Some(stop))
            } else if a.generated.len() >= a.job.req.max_tokens || held + 1 >= limits.n_ctx {
                (FinishReason::Length, None)
            } else {
                return Some(picked.token);
            }
        };
        let tail = if stop_sequence.is_some() {
            String::new()
        } else {
            let rest = a.text.finish(rt);
            let mut tail = a.scanner.push(&rest).text;
            tail.push_str(&a.scanner.finish());
            tail
        };
        let first = a.first_token.unwrap_or(now);
        let done = GenEvent::Done {
            finish,
            stop_sequence,
            tail,
            usage: Usage {
                prompt_tokens: prompt_len,
                cached_tokens: a.cached,
                completion_tokens: a.generated.len(),
                cache_source: a.source,
            },
            timings: Timings {
                queue: a.admitted.duration_since(a.job.queued_at),
                prefill: first.duration_since(a.admitted),
                decode: now.duration_since(first),
            },
        };
        if slot.tokens.len() > held {
            slot.seq.truncate(held);
            slot.tokens.truncate(held);
        }
        if let Some(a) = self.release(i) {
            let _ = a.job.tx.send(done);
        }
        // After the answer went out: the client does not wait for the checkpoint.
        if let Some(store) = self.store.as_mut() {
            let slot = &self.slots[i];
            store.checkpoint(&slot.seq, &slot.tokens);
        }
        None
    }
}

#[cfg(test)]
mod tests;
