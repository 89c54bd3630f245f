//! Adaptive draft length: wraps a proposer and asks it for as many tokens as the measured
//! acceptance makes worth verifying, down to none at all (plain decoding) with a short
//! probe every [`PROBE_EVERY`] steps, and up to `--draft-max`.
//!
//! The outcome of each proposal is read off the next history the loop passes (the loop
//! emits the accepted draft tokens, then one token of its own), so the generation loop
//! needs no extra channel and the wrapper never sees logits: like any proposer it changes
//! how many tokens a forward pass yields, never which tokens. It must never propose more
//! than the inner proposer did.
//!
//! The length is chosen with a small cost model: with a per-token acceptance `a` (each
//! draft token accepted with probability `a` given the ones before it were), a draft of
//! `k` tokens yields `(1 - a^(k+1)) / (1 - a)` tokens per step, and a verify step of
//! `k + 1` positions costs `1 + VERIFY_COST * k` plain steps. The `k` with the most tokens
//! per unit of cost wins; `k = 0` (plain decoding) whenever no draft beats one token per
//! plain step.
//!
//! A floor (`--draft-min`, `speculative.n_min`) keeps drafts at least that long: a length
//! the cost model finds worth verifying but shorter is raised to it (the client asked for
//! no shorter drafts, not for none), a probe is at least that long, a step with no room
//! for it decodes plainly, and a proposal that comes back shorter is not verified (that
//! step decodes plainly, and teaches nothing).

use super::Proposer;

/// Cost of one more draft position in a verify step, in plain one-token steps. Read off the
/// first lookup receipt (docs/receipts/speculation-lookup-2026-12-02.md, SmolLM2 on the
/// 2-core CPU): a 9-position verify step took about 2.5 plain steps.
pub const VERIFY_COST: f64 = 0.2;

/// Plain steps between probes while speculation is off.
pub const PROBE_EVERY: usize = 16;

/// Tokens a probe proposes: enough to see a repeat starting, cheap when it is rejected.
pub const PROBE_LEN: usize = 2;

/// Weight of the evidence kept from the step before (per verify step): about the last
/// four steps decide, so a workload that starts or stops repeating is followed quickly.
const DECAY: f64 = 0.75;

/// The counts before any evidence (accepted tokens, rejections): an acceptance of 0.9,
/// optimistic so that the first proposals are long and a repeat pays off from the start,
/// and light, so that it decays away within a few steps like any other evidence.
const PRIOR: (f64, f64) = (1.8, 0.2);

/// What the adaptation did during a run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AdaptiveStats {
    /// Steps on which speculation was off (nothing asked of the inner proposer).
    pub off_steps: usize,
    /// Probes proposed while off.
    pub probes: usize,
    /// Sum of the draft lengths asked for (to average over the steps that asked).
    pub asked: usize,
    /// Steps that asked the inner proposer for at least one token.
    pub asking_steps: usize,
}

/// A proposer whose draft length follows the measured acceptance (see the module
/// documentation).
#[derive(Debug, Clone)]
pub struct Adaptive<P> {
    inner: P,
    draft_max: usize,
    /// Fewest tokens a draft must have to be verified.
    draft_min: usize,
    /// Decayed count of accepted draft tokens.
    accepted: f64,
    /// Decayed count of rejections (verify steps that stopped inside their draft).
    rejected: f64,
    /// The history and the draft of the last non-empty proposal, until its outcome is read.
    pending: Option<(Vec<u32>, Vec<u32>)>,
    /// Plain steps left before the next probe.
    off: usize,
    /// Whether the next step that finds no draft worth verifying probes instead.
    probe_due: bool,
    stats: AdaptiveStats,
}

impl<P: Proposer> Adaptive<P> {
    /// `inner`, asked for at most `draft_max` tokens a step.
    pub fn new(inner: P, draft_max: usize) -> Adaptive<P> {
        Adaptive {
            inner,
            draft_max,
            draft_min: 0,
            accepted: PRIOR.0,
            rejected: PRIOR.1,
            pending: None,
            off: 0,
            probe_due: false,
            stats: AdaptiveStats::default(),
        }
    }

    /// Verifies only drafts of at least `draft_min` tokens (0 and 1: every draft).
    pub fn with_draft_min(mut self, draft_min: usize) -> Adaptive<P> {
        self.draft_min = draft_min;
        self
    }

    /// What the adaptation did so far.
    pub fn stats(&self) -> AdaptiveStats {
        self.stats
    }

    /// The wrapped proposer.
    pub fn inner(&self) -> &P {
        &self.inner
    }

    /// The wrapped proposer, its adaptation dropped (a server slot keeps its proposer, a
    /// draft model's session, from one request to the next, adapting afresh for each).
    pub fn into_inner(self) -> P {
        self.inner
    }

    /// The per-token acceptance estimate.
    pub fn acceptance(&self) -> f64 {
        self.accepted / (self.accepted + self.rejected)
    }

    /// Reads the outcome of the pending proposal off `history`: the loop emitted the
    /// accepted prefix of the draft, then a token of its own. A history that does not
    /// extend the one proposed after (a new prompt) teaches nothing.
    fn learn(&mut self, history: &[u32]) {
        let Some((before, draft)) = self.pending.take() else {
            return;
        };
        let Some(after) = history
            .strip_prefix(before.as_slice())
            .filter(|a| !a.is_empty())
        else {
            return;
        };
        let accepted = draft.iter().zip(after).take_while(|(d, a)| d == a).count();
        self.accepted = self.accepted * DECAY + accepted as f64;
        self.rejected = self.rejected * DECAY + f64::from(u8::from(accepted < draft.len()));
    }
}

/// The draft length in `0..=cap` with the most expected tokens per unit of verify cost at
/// per-token acceptance `a` (0: plain decoding is best).
fn best_length(a: f64, cap: usize) -> usize {
    let a = a.clamp(0.0, 1.0);
    let mut best = (0, 1.0);
    // Expected tokens of a step with a draft of `k`: 1 + a + a^2 + ... + a^k.
    let (mut tokens, mut term) = (1.0, 1.0);
    for k in 1..=cap {
        term *= a;
        tokens += term;
        let rate = tokens / (1.0 + VERIFY_COST * k as f64);
        if rate > best.1 {
            best = (k, rate);
        }
    }
    best.0
}

impl<P: Proposer> Proposer for Adaptive<P> {
    fn propose(&mut self, history: &[u32], max: usize) -> Vec<u32> {
        self.learn(history);
        if self.off > 0 {
            self.off -= 1;
            self.stats.off_steps += 1;
            return Vec::new();
        }
        let cap = max.min(self.draft_max);
        if cap < self.draft_min {
            // No room for a draft long enough (near a token limit or the context's end).
            return Vec::new();
        }
        let mut k = best_length(self.acceptance(), cap);
        if k > 0 {
            k = k.max(self.draft_min);
        }
        let probing = k == 0 && self.probe_due;
        if probing {
            k = PROBE_LEN.max(self.draft_min).min(cap);
        }
        if k == 0 {
            // Off: this step and the next PROBE_EVERY - 1 decode plainly, then a probe.
            self.off = PROBE_EVERY - 1;
            self.probe_due = true;
            self.stats.off_steps += 1;
            return Vec::new();
        }
        let mut draft = self.inner.propose(history, k);
        draft.truncate(k);
        self.stats.asked += k;
        self.stats.asking_steps += 1;
        if draft.len() < self.draft_min {
            draft.clear();
        }
        if !draft.is_empty() {
            // A probe that found nothing to propose stays due.
            self.stats.probes += usize::from(probing);
            self.probe_due = false;
            self.pending = Some((history.to_vec(), draft.clone()));
        }
        draft
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Oracles: the cost model's optimum computed by hand at a few acceptances; a scripted
    // proposer whose drafts are always right, or always wrong, against a loop simulated
    // by hand (accepted prefix, then one token of the loop's own).

    #[test]
    fn the_best_length_follows_the_cost_model() {
        // a = 0.1: one draft token yields 1.1 tokens for 1.2 steps, worse than plain.
        assert_eq!(best_length(0.1, 15), 0);
        // a = 0.5: 1.5 / 1.2 = 1.25 for one token, 1.75 / 1.4 = 1.25 for two (not more),
        // 1.875 / 1.6 for three: one wins (the first of equals).
        assert_eq!(best_length(0.5, 15), 1);
        // a = 1: k + 1 tokens for 1 + 0.2 k steps grows with k: the cap wins.
        assert_eq!(best_length(1.0, 15), 15);
        assert_eq!(best_length(1.0, 4), 4);
        assert_eq!(best_length(1.0, 0), 0);
    }

    /// Proposes `max` tokens: the true continuation (`right`) or tokens that never occur.
    struct Scripted {
        right: bool,
        calls: usize,
    }

    impl Proposer for Scripted {
        fn propose(&mut self, history: &[u32], max: usize) -> Vec<u32> {
            self.calls += 1;
            let next = history.len() as u32;
            (0..max as u32)
                .map(|i| if self.right { next + i } else { 1_000_000 })
                .collect()
        }
    }

    /// A scripted proposer, right or wrong, under a draft-max of 8.
    fn scripted(right: bool) -> Adaptive<Scripted> {
        Adaptive::new(Scripted { right, calls: 0 }, 8)
    }

    /// Drives `p` as the generation loop would over `steps` steps of a sequence whose
    /// token at position i is i; returns the draft lengths proposed.
    fn drive(p: &mut Adaptive<Scripted>, steps: usize) -> Vec<usize> {
        let mut history: Vec<u32> = (0..10).collect();
        let mut lengths = Vec::new();
        for _ in 0..steps {
            let draft = p.propose(&history, 100);
            lengths.push(draft.len());
            let base = history.len() as u32;
            let accepted = draft
                .iter()
                .enumerate()
                .take_while(|&(i, &d)| d == base + i as u32)
                .count();
            let emitted = accepted + 1;
            history.extend((0..emitted as u32).map(|i| base + i));
        }
        lengths
    }

    #[test]
    fn always_right_drafts_grow_to_draft_max() {
        let mut p = scripted(true);
        let lengths = drive(&mut p, 10);
        assert!(lengths.iter().all(|&k| k <= 8), "{lengths:?}");
        assert_eq!(lengths[3..], [8; 7], "{lengths:?}");
        assert_eq!(p.stats().off_steps, 0);
    }

    #[test]
    fn always_wrong_drafts_turn_speculation_off_with_periodic_probes() {
        let mut p = scripted(false);
        let lengths = drive(&mut p, 200);
        // A few shrinking drafts, then plain decoding but for a probe every PROBE_EVERY.
        let first_off = lengths.iter().position(|&k| k == 0).expect("turned off");
        assert!(first_off <= 5, "{lengths:?}");
        let speculating: Vec<usize> = (first_off..200).filter(|&i| lengths[i] > 0).collect();
        assert!(
            speculating.iter().all(|&i| lengths[i] == PROBE_LEN),
            "{lengths:?}"
        );
        let expected_probes = (200 - first_off) / (PROBE_EVERY + 1);
        assert!(
            speculating.len().abs_diff(expected_probes) <= 1,
            "{} probes in {} steps: {lengths:?}",
            speculating.len(),
            200 - first_off
        );
        assert_eq!(p.stats().probes, speculating.len());
        assert_eq!(p.inner.calls, first_off + speculating.len());
    }

    #[test]
    fn a_probe_that_is_accepted_turns_speculation_back_on() {
        let mut p = scripted(false);
        drive(&mut p, 40);
        p.inner.right = true;
        let lengths = drive(&mut p, 40);
        assert_eq!(lengths[lengths.len() - 5..], [8; 5], "{lengths:?}");
    }

    /// Proposes the true continuation, but only `history.len() % 5` tokens of it.
    struct Ragged;

    impl Proposer for Ragged {
        fn propose(&mut self, history: &[u32], max: usize) -> Vec<u32> {
            let next = history.len() as u32;
            (0..(history.len() % 5).min(max) as u32)
                .map(|i| next + i)
                .collect()
        }
    }

    #[test]
    fn drafts_shorter_than_draft_min_are_not_verified() {
        // Oracle: Ragged's lengths by hand; without a floor some drafts are 1 or 2 long,
        // with a floor of 3 every draft returned is empty or at least 3, and the short
        // ones were dropped, not lengthened (no draft longer than Ragged gave).
        let lengths = |min: usize| {
            let mut p = Adaptive::new(Ragged, 8).with_draft_min(min);
            let mut history: Vec<u32> = (0..10).collect();
            let mut out = Vec::new();
            for _ in 0..60 {
                let draft = p.propose(&history, 100);
                out.push((history.len() % 5, draft.len()));
                // Every draft is right: the loop emits it and one token of its own.
                let base = history.len() as u32;
                history.extend(base..=base + draft.len() as u32);
            }
            out
        };
        let free = lengths(0);
        assert!(free.iter().any(|&(_, k)| k == 1 || k == 2), "{free:?}");
        let floored = lengths(3);
        assert!(
            floored.iter().all(|&(_, k)| k == 0 || k >= 3),
            "{floored:?}"
        );
        assert!(floored.iter().all(|&(gave, k)| k <= gave), "{floored:?}");
        assert!(floored.iter().any(|&(_, k)| k >= 3), "{floored:?}");
    }

    #[test]
    fn probes_are_at_least_draft_min_long() {
        let mut p = Adaptive::new(
            Scripted {
                right: false,
                calls: 0,
            },
            8,
        )
        .with_draft_min(3);
        let lengths = drive(&mut p, 200);
        assert!(lengths.iter().all(|&k| k == 0 || k >= 3), "{lengths:?}");
        assert!(p.stats().probes > 0, "{:?}", p.stats());
    }
}
