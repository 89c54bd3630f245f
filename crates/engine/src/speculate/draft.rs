//! A draft model: a second model sharing the target's tokenizer (a smaller model of the
//! same family, or a more quantized copy of the same one) proposes greedily from a session
//! of its own.
//!
//! The draft session is kept in step with the target's the same way the target's KV is:
//! each proposal first cuts it back to the longest prefix it shares with the history (so a
//! rejected suffix, drafted tokens included, is dropped exactly as the target drops its
//! own) and feeds it only what it has not seen. Owns the draft session and the check that
//! two vocabularies are one; it never sees the target's logits or session, so a draft can
//! change the speed, never the output.

use ferrite_tokenizer::Tokenizer;

use super::Proposer;
use crate::generate::{GenerateError, Timeline};
use crate::sampler::argmax;

/// Why a draft model cannot draft for a target: its tokens would not mean the same.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VocabMismatch {
    /// The tokenizers hold different numbers of tokens.
    #[error("the draft's vocabulary has {draft} tokens, the target's {target}")]
    Size {
        /// The target's token count.
        target: usize,
        /// The draft's.
        draft: usize,
    },
    /// The models' logit rows have different lengths.
    #[error("the draft's logits have {draft} entries a row, the target's {target}")]
    Rows {
        /// The target's row length.
        target: usize,
        /// The draft's.
        draft: usize,
    },
    /// A token id stands for different text (or a different token type).
    #[error("token {id} is {target:?} in the target's vocabulary but {draft:?} in the draft's")]
    Token {
        /// The first id that differs.
        id: u32,
        /// Its piece (and type) in the target.
        target: String,
        /// Its piece (and type) in the draft.
        draft: String,
    },
}

/// Checks that `draft` can draft for `target`: the same number of tokens and of logits a
/// row, and every id the same piece of the same type.
pub fn check_vocab(
    target: &Tokenizer,
    target_rows: usize,
    draft: &Tokenizer,
    draft_rows: usize,
) -> Result<(), VocabMismatch> {
    if target.vocab_size() != draft.vocab_size() {
        return Err(VocabMismatch::Size {
            target: target.vocab_size(),
            draft: draft.vocab_size(),
        });
    }
    if target_rows != draft_rows {
        return Err(VocabMismatch::Rows {
            target: target_rows,
            draft: draft_rows,
        });
    }
    let describe = |t: &Tokenizer, id| format!("{:?} ({:?})", t.piece(id), t.token_type(id));
    for id in 0..target.vocab_size() as u32 {
        let (a, b) = (describe(target, id), describe(draft, id));
        if a != b {
            return Err(VocabMismatch::Token {
                id,
                target: a,
                draft: b,
            });
        }
    }
    Ok(())
}

/// The draft-model proposer (see the module documentation).
pub struct Draft<T> {
    session: T,
    /// The tokens the draft session holds, position for position.
    held: Vec<u32>,
    /// The first failure of the draft session; after one, nothing more is proposed.
    failure: Option<GenerateError>,
    /// Drafting stops before the first token less likely than this (see [`confident`]).
    p_min: f32,
}

/// The greedy pick of `logits` when its probability (softmax over the whole row) is at
/// least `p_min`, else `None`: llama.cpp's `p_min` stops a draft at the first position
/// where the draft model is unsure, since a token it doubts is likely to be rejected and
/// costs a verify row. llama.cpp measures the probability after its draft sampler's top-k
/// of 10; over the whole row it is never larger, so a draft here stops no later than the
/// threshold says. A row with NaN stops the draft too.
fn confident(logits: &[f32], p_min: f32) -> Option<u32> {
    let best = argmax(logits);
    if p_min <= 0.0 {
        return Some(best);
    }
    let top = *logits.get(best as usize)?;
    let mass: f32 = logits.iter().map(|&l| (l - top).exp()).sum();
    // p = exp(0) / mass; written so that a NaN fails the comparison and stops the draft.
    (1.0 / mass >= p_min).then_some(best)
}

impl<T: Timeline> Draft<T> {
    /// A proposer drafting with `session` (emptied first).
    pub fn new(mut session: T) -> Draft<T> {
        session.truncate(0);
        Draft {
            session,
            held: Vec::new(),
            failure: None,
            p_min: 0.0,
        }
    }

    /// The tokens the draft session holds.
    pub fn held(&self) -> &[u32] {
        &self.held
    }

    /// The draft session.
    pub fn session(&self) -> &T {
        &self.session
    }

    /// Why the draft stopped proposing, when it failed (the target's output is unaffected:
    /// the loop decodes plainly from then on).
    pub fn failure(&self) -> Option<&GenerateError> {
        self.failure.as_ref()
    }

    /// Brings the session to `history` and drafts up to `max` tokens greedily.
    fn draft(&mut self, history: &[u32], max: usize) -> Result<Vec<u32>, GenerateError> {
        // Keep the shared prefix (at least the last token is fed again: its logits give
        // the first draft token), as far as the session can keep it without recomputing.
        let shared = self
            .held
            .iter()
            .zip(history)
            .take_while(|(a, b)| a == b)
            .count()
            .min(history.len() - 1);
        let keep = self.session.reusable(shared);
        self.session.truncate(keep);
        self.held.truncate(keep);
        let fresh = &history[keep..];
        let mut next = confident(self.session.eval_last(fresh)?, self.p_min);
        self.held.extend_from_slice(fresh);
        let mut draft = Vec::new();
        while let Some(token) = next {
            draft.push(token);
            if draft.len() == max {
                break;
            }
            next = confident(self.session.eval_last(&[token])?, self.p_min);
            self.held.push(token);
        }
        Ok(draft)
    }
}

impl<T: Timeline> Proposer for Draft<T> {
    fn propose(&mut self, history: &[u32], max: usize) -> Vec<u32> {
        // Feeding the history and all but the last draft token must fit the context.
        let room = (self.session.ctx() + 1).saturating_sub(history.len());
        let max = max.min(room);
        if max == 0 || history.is_empty() || self.failure.is_some() {
            return Vec::new();
        }
        match self.draft(history, max) {
            Ok(d) => d,
            Err(e) => {
                // What the session holds after a failed pass is unknown: start it over.
                self.session.truncate(0);
                self.held.clear();
                self.failure = Some(e);
                Vec::new()
            }
        }
    }

    fn set_p_min(&mut self, p_min: f32) {
        self.p_min = p_min;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferrite_tokenizer::TokenizerSpec;

    // Oracle: vocabularies written out below, identical but for the one change named.

    fn vocab(tokens: &[&str], types: Vec<i32>) -> Tokenizer {
        Tokenizer::from_spec(TokenizerSpec {
            model: "gpt2".into(),
            pre: Some("gpt-2".into()),
            tokens: tokens.iter().copied().collect(),
            token_types: Some(types),
            merges: vec!["h i".into()],
            ..TokenizerSpec::default()
        })
        .expect("tokenizer")
    }

    #[test]
    fn only_the_same_vocabulary_may_draft() {
        let target = vocab(&["<|end|>", "h", "i", "hi"], vec![3, 1, 1, 1]);
        let same = vocab(&["<|end|>", "h", "i", "hi"], vec![3, 1, 1, 1]);
        assert_eq!(check_vocab(&target, 4, &same, 4), Ok(()));
        let longer = vocab(&["<|end|>", "h", "i", "hi", "ih"], vec![3, 1, 1, 1, 1]);
        assert_eq!(
            check_vocab(&target, 4, &longer, 5),
            Err(VocabMismatch::Size {
                target: 4,
                draft: 5
            })
        );
        assert_eq!(
            check_vocab(&target, 4, &same, 8),
            Err(VocabMismatch::Rows {
                target: 4,
                draft: 8
            })
        );
        let swapped = vocab(&["<|end|>", "i", "h", "hi"], vec![3, 1, 1, 1]);
        let err = check_vocab(&target, 4, &swapped, 4).unwrap_err();
        assert!(matches!(err, VocabMismatch::Token { id: 1, .. }), "{err}");
        assert!(err.to_string().contains("token 1 is"), "{err}");
        // The same text as a control token is another token.
        let retyped = vocab(&["<|end|>", "h", "i", "hi"], vec![1, 1, 1, 1]);
        assert!(matches!(
            check_vocab(&target, 4, &retyped, 4),
            Err(VocabMismatch::Token { id: 0, .. })
        ));
    }

    /// Four tokens; the next token is always the last one plus 1 (mod 4), with logit 8
    /// against 0 for the rest (probability e^8 / (e^8 + 3) = 0.99899) except after a
    /// position whose index is a multiple of 5, where it is 1 against 0 (e / (e + 3) =
    /// 0.47537).
    struct Wavering {
        kv: Vec<u32>,
        logits: Vec<f32>,
    }

    impl Timeline for Wavering {
        fn eval_last(&mut self, tokens: &[u32]) -> Result<&[f32], GenerateError> {
            self.kv.extend_from_slice(tokens);
            let next = (self.kv.last().copied().unwrap_or(0) + 1) % 4;
            let top = if (self.kv.len() - 1).is_multiple_of(5) {
                1.0
            } else {
                8.0
            };
            self.logits = (0..4).map(|t| if t == next { top } else { 0.0 }).collect();
            Ok(&self.logits)
        }
        fn n_past(&self) -> usize {
            self.kv.len()
        }
        fn ctx(&self) -> usize {
            64
        }
        fn truncate(&mut self, n: usize) {
            self.kv.truncate(n);
        }
    }

    fn wavering() -> Draft<Wavering> {
        Draft::new(Wavering {
            kv: Vec::new(),
            logits: Vec::new(),
        })
    }

    #[test]
    fn p_min_stops_a_draft_before_its_first_unsure_token() {
        // Oracle: the probabilities above by hand. History of 2 tokens (positions 0, 1);
        // the draft's tokens sit at positions 2, 3, ...; the row after position 5 is the
        // unsure one, so the token at position 6 is the first below 0.9.
        let history = [0, 1];
        let mut d = wavering();
        assert_eq!(d.propose(&history, 8), vec![2, 3, 0, 1, 2, 3, 0, 1]);
        for (p_min, want) in [
            (0.0, vec![2, 3, 0, 1, 2, 3, 0, 1]),
            (0.47, vec![2, 3, 0, 1, 2, 3, 0, 1]),
            (0.9, vec![2, 3, 0, 1]),
            (0.998, vec![2, 3, 0, 1]),
            (0.9991, vec![]),
        ] {
            let mut d = wavering();
            d.set_p_min(p_min);
            assert_eq!(d.propose(&history, 8), want, "p_min {p_min}");
            // The session holds what was fed: every draft token whose successor was
            // looked at (all but the last of a full draft), never the one it stopped before.
            assert_eq!(d.held(), &d.session().kv[..], "p_min {p_min}");
            let fed = if want.len() == 8 { 7 } else { want.len() };
            assert_eq!(d.held().len(), history.len() + fed, "p_min {p_min}");
        }
        // The next step goes on from the accepted history (its row after position 10 is
        // unsure: the token at position 11 is where it stops).
        let mut d = wavering();
        d.set_p_min(0.9);
        d.propose(&history, 8);
        assert_eq!(d.propose(&[0, 1, 2, 3, 0, 1, 2], 8), vec![3, 0, 1, 2]);
    }
}
