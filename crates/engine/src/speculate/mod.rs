//! Speculative decoding's proposers: what guesses the next few tokens cheaply, so that the
//! target model can verify several of them in one batched step.
//!
//! A [`Proposer`] only guesses. Verification lives in the one generation loop
//! ([`crate::generate::generate_with`]), which picks every position with the caller's own
//! sampler and accepts a draft token only where the picked token equals it: what a
//! proposer returns can change the speed, never the output. A proposer must never read
//! the target's logits or touch the target's session.
//!
//! [`Lookup`] is prompt lookup (n-gram matching over the tokens so far); [`Draft`] is a
//! draft model with a session of its own; a multi-token-prediction head implements the
//! same trait later. [`Adaptive`] wraps any of them and sets the draft length from the
//! measured acceptance.

mod adaptive;
mod draft;
mod lookup;

pub use adaptive::{Adaptive, AdaptiveStats, PROBE_EVERY, PROBE_LEN, VERIFY_COST};
pub use draft::{Draft, VocabMismatch, check_vocab};
pub use lookup::{Lookup, LookupError, NGRAM_MAX};

/// Most draft tokens a proposer may be asked for in one step (`--draft-max`): a verify
/// step evaluates one token more than this.
pub const DRAFT_MAX_LIMIT: usize = 15;

/// Guesses the tokens that follow a history.
///
/// Takes `&mut self` so that a proposer with state (a draft model's own session, an index
/// over the context) can keep it between steps; `history` is always the whole sequence the
/// loop has seen (prompt and emitted tokens), so a proposer may also rebuild from it.
pub trait Proposer {
    /// Up to `max` tokens guessed to follow `history`, most likely continuation first;
    /// empty when the proposer has no guess (the loop then decodes one token plainly).
    fn propose(&mut self, history: &[u32], max: usize) -> Vec<u32>;

    /// Stop each draft before its first token whose probability under the proposer's own
    /// distribution is below `p_min` (llama.cpp's `speculative.p_min`; 0: never). Only a
    /// proposer with a distribution (a draft model) has anything to compare: prompt lookup
    /// keeps this default, which does nothing, and the server refuses a positive `p_min`
    /// where only lookup proposes, so no request's `p_min` is ignored unannounced.
    fn set_p_min(&mut self, p_min: f32) {
        let _ = p_min;
    }
}

/// A boxed proposer proposes as the one inside it: the server keeps proposers of different
/// kinds (prompt lookup, a draft model's session) behind one type.
impl<P: Proposer + ?Sized> Proposer for Box<P> {
    fn propose(&mut self, history: &[u32], max: usize) -> Vec<u32> {
        (**self).propose(history, max)
    }
    fn set_p_min(&mut self, p_min: f32) {
        (**self).set_p_min(p_min);
    }
}

/// What speculation did during one [`crate::generate::generate_with`] call.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    /// Forward passes after the prompt's: plain one-token steps and verify steps alike.
    pub steps: usize,
    /// Steps that verified at least one draft token.
    pub verify_steps: usize,
    /// Draft tokens proposed and evaluated.
    pub proposed: usize,
    /// Draft tokens accepted (the picked token equalled the draft).
    pub accepted: usize,
}

impl Stats {
    /// Accepted over proposed (0 when nothing was proposed).
    pub fn acceptance(&self) -> f64 {
        if self.proposed == 0 {
            0.0
        } else {
            self.accepted as f64 / self.proposed as f64
        }
    }

    /// Tokens emitted per forward pass after the prompt, given `generated` tokens in all
    /// (the first of which came from the prompt's pass).
    pub fn tokens_per_step(&self, generated: usize) -> f64 {
        if self.steps == 0 {
            0.0
        } else {
            generated.saturating_sub(1) as f64 / self.steps as f64
        }
    }
}

#[cfg(test)]
mod chi_square;
#[cfg(test)]
mod verify_tests;
