//! Prompt lookup: the n-gram proposer. The last few tokens of the history are looked up
//! earlier in the history, and the tokens that followed their most recent earlier
//! occurrence are proposed. Costs no model and pays off where the output repeats its
//! context (editing code, quoting, repeating text).
//!
//! Owns only the search; it never sees logits, so a bad guess costs a wasted position of
//! the verify step, never a wrong token.

use super::{DRAFT_MAX_LIMIT, Proposer};

/// Longest n-gram looked up; shorter ones are tried when it does not occur earlier. Three
/// tokens keep a match specific without needing a long exact repeat.
pub const NGRAM_MAX: usize = 3;

/// A draft length outside `1..=DRAFT_MAX_LIMIT`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("draft length {0} is outside 1..={DRAFT_MAX_LIMIT}")]
pub struct LookupError(pub usize);

/// The prompt-lookup proposer (see the module documentation).
#[derive(Debug, Clone)]
pub struct Lookup {
    draft_max: usize,
}

impl Lookup {
    /// A proposer of at most `draft_max` tokens a step (`1..=DRAFT_MAX_LIMIT`).
    pub fn new(draft_max: usize) -> Result<Lookup, LookupError> {
        if !(1..=DRAFT_MAX_LIMIT).contains(&draft_max) {
            return Err(LookupError(draft_max));
        }
        Ok(Lookup { draft_max })
    }

    /// Most tokens proposed a step.
    pub fn draft_max(&self) -> usize {
        self.draft_max
    }
}

impl Proposer for Lookup {
    fn propose(&mut self, history: &[u32], max: usize) -> Vec<u32> {
        let max = max.min(self.draft_max);
        let len = history.len();
        if max == 0 {
            return Vec::new();
        }
        for n in (1..=NGRAM_MAX.min(len.saturating_sub(1))).rev() {
            let tail = &history[len - n..];
            // Starts before the tail's own, latest first: the most recent occurrence is
            // the likeliest to continue the same way.
            if let Some(start) = (0..len - n).rev().find(|&s| &history[s..s + n] == tail) {
                let from = start + n;
                return history[from..len.min(from + max)].to_vec();
            }
        }
        Vec::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Oracle: the expected drafts are read off the hand-written histories below.

    #[test]
    fn proposes_what_followed_the_most_recent_earlier_occurrence() {
        let mut l = Lookup::new(8).unwrap();
        // "1 2 3" occurs at 0 (followed by 4 5) and at 5 (followed by 9 9): the later wins.
        let h = [1, 2, 3, 4, 5, 1, 2, 3, 9, 9, 7, 1, 2, 3];
        assert_eq!(l.propose(&h, 8), [9, 9, 7, 1, 2, 3]);
    }

    #[test]
    fn falls_back_to_shorter_ngrams_and_then_to_nothing() {
        let mut l = Lookup::new(8).unwrap();
        // "5 6" never occurred before, "6" did (followed by 7 8).
        assert_eq!(l.propose(&[6, 7, 8, 5, 6], 8), [7, 8, 5, 6]);
        // The last token occurs nowhere earlier.
        assert_eq!(l.propose(&[1, 2, 3, 4], 8), Vec::<u32>::new());
        // Too short to hold an earlier occurrence.
        assert_eq!(l.propose(&[1], 8), Vec::<u32>::new());
        assert_eq!(l.propose(&[], 8), Vec::<u32>::new());
    }

    #[test]
    fn a_draft_is_bounded_by_draft_max_and_by_the_room_given() {
        let h: Vec<u32> = (0..20).chain(0..3).collect();
        let mut l = Lookup::new(4).unwrap();
        assert_eq!(l.propose(&h, 10), [3, 4, 5, 6]);
        assert_eq!(l.propose(&h, 2), [3, 4]);
        assert_eq!(l.propose(&h, 0), Vec::<u32>::new());
        let mut wide = Lookup::new(DRAFT_MAX_LIMIT).unwrap();
        assert_eq!(wide.propose(&h, 100).len(), DRAFT_MAX_LIMIT);
    }

    #[test]
    fn draft_lengths_outside_the_limit_are_refused() {
        assert_eq!(Lookup::new(0).unwrap_err(), LookupError(0));
        assert_eq!(
            Lookup::new(DRAFT_MAX_LIMIT + 1).unwrap_err(),
            LookupError(DRAFT_MAX_LIMIT + 1)
        );
        assert_eq!(Lookup::new(DRAFT_MAX_LIMIT).unwrap().draft_max(), 15);
    }
}
