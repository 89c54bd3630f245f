//! Held sampling: a request's or run's tokens drawn free, or held to a grammar
//! ([`ferrite_grammar::Constraint`], compiled by llguidance over the model's vocabulary).
//!
//! Each held step masks a copy of the row (every token the grammar refuses set to `-inf`)
//! and samples that copy, so greedy decoding takes the best allowed token and sampling
//! draws from the masked distribution, top-k, top-p and min-p cuts included. End-of-
//! generation tokens survive the mask only where the text is whole. The mask of each
//! position is computed on a worker thread while the forward pass makes its row
//! (`ahead.rs`), so the pick waits only for whichever finishes last.
//!
//! Never changes the logits a caller reports (log-probabilities stay those of the raw row),
//! and never touches a free sampler's path: without a grammar, sampling is bit-identical.

mod ahead;

use ferrite_grammar::{Constraint, GrammarError, Matcher, Token, Vocab};
use ferrite_tokenizer::Tokenizer;

use ahead::Ahead;
pub use ahead::Grammar;

use crate::sampler::{SampleError, Sampler, argmax};

/// The grammar vocabulary of `tokenizer`'s model: text tokens by their bytes (a
/// byte-fallback token is its byte), control tokens by their piece, never as text; the
/// end-of-generation tokens end a whole text. Build it once per model.
pub fn grammar_vocab(tokenizer: &Tokenizer) -> Result<Vocab, GrammarError> {
    let tokens = (0..tokenizer.vocab_size() as u32)
        .map(|id| match tokenizer.token_bytes(id) {
            Some(bytes) if !bytes.is_empty() => Token::Text(bytes.to_vec()),
            _ => Token::Special(tokenizer.piece(id).unwrap_or_default().to_string()),
        })
        .collect();
    Vocab::new(tokens, &tokenizer.end_of_generation_ids())
}

/// Held sampling's errors.
#[derive(Debug, thiserror::Error, PartialEq)]
#[non_exhaustive]
pub enum HeldError {
    /// The sampler failed on the row.
    #[error(transparent)]
    Sample(#[from] SampleError),
    /// The grammar refused a token or could not be compiled over the vocabulary.
    #[error(transparent)]
    Grammar(#[from] GrammarError),
    /// No token of the vocabulary continues the text.
    #[error("structured output: no token of the vocabulary can continue the text")]
    NoToken,
    /// The thread that computes the grammar's masks could not start or stopped.
    #[error("structured output: the grammar's mask worker: {0}")]
    Worker(String),
}

/// What a request or a run draws its tokens with: a sampler, free or held to a grammar.
// One per request or run, made once and never copied: the variants' sizes do not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub enum Chooser {
    /// Any token the sampler draws.
    Free(Sampler),
    /// Tokens held to a grammar.
    Held(HeldSampler),
}

impl Chooser {
    /// `sampler`, held to `constraint` over `vocab` when there is one.
    pub fn new(
        sampler: Sampler,
        constraint: Option<&Constraint>,
        vocab: &Vocab,
    ) -> Result<Chooser, HeldError> {
        Ok(match constraint {
            None => Chooser::Free(sampler),
            Some(c) => Chooser::Held(HeldSampler::new(sampler, Matcher::new(vocab, c)?)?),
        })
    }

    /// The next token from a row of logits ([`Sampler::next_token`] or
    /// [`HeldSampler::next_token`]).
    pub fn next_token(&mut self, logits: &[f32], history: &[u32]) -> Result<u32, HeldError> {
        match self {
            Chooser::Free(s) => Ok(s.next_token(logits, history)?),
            Chooser::Held(s) => s.next_token(logits, history),
        }
    }

    /// Take `token` as the next token without sampling (a reasoning budget closing its
    /// block): a held chooser's grammar must accept it.
    pub fn force(&mut self, token: u32) -> Result<(), HeldError> {
        match self {
            Chooser::Free(_) => Ok(()),
            Chooser::Held(s) => s.force(token),
        }
    }

    /// Ready for a fresh output, such as the next reply of a chat: a held chooser's grammar
    /// starts over; the sampler's random stream carries on, as it does for a free one.
    pub fn restart(&mut self) -> Result<(), HeldError> {
        match self {
            Chooser::Free(_) => Ok(()),
            Chooser::Held(s) => s.restart(),
        }
    }

    /// The sampler that draws each token.
    pub fn sampler(&self) -> &Sampler {
        match self {
            Chooser::Free(s) => s,
            Chooser::Held(s) => &s.sampler,
        }
    }
}

/// A sampler held to a grammar ([`Matcher`]; tests hold it to fakes).
#[derive(Debug)]
pub struct HeldSampler<G: Grammar = Matcher> {
    sampler: Sampler,
    ahead: Ahead<G>,
    masked: Vec<f32>,
}

impl<G: Grammar> HeldSampler<G> {
    /// Holds `sampler` to `grammar`, whose first mask the worker starts computing now.
    pub fn new(sampler: Sampler, grammar: G) -> Result<HeldSampler<G>, HeldError> {
        Ok(HeldSampler {
            sampler,
            ahead: Ahead::new(grammar)?,
            masked: Vec::new(),
        })
    }

    /// The next token (see the module documentation). `history` is as for
    /// [`Sampler::next_token`]. Once the token is taken, the worker computes the next
    /// position's mask while the caller evaluates the token.
    pub fn next_token(&mut self, logits: &[f32], history: &[u32]) -> Result<u32, HeldError> {
        let mask = self.ahead.mask()?;
        self.masked.clear();
        self.masked.extend_from_slice(logits);
        if G::apply(&mask, &mut self.masked) == 0 {
            return Err(HeldError::NoToken);
        }
        let drawn = self.sampler.next_token(&self.masked, history)?;
        // A draw's rounding can land past the last candidate with weight, on a masked one:
        // the best allowed token (greedy's choice on the masked row) stands in for it.
        let token = if self
            .masked
            .get(drawn as usize)
            .is_some_and(|l| l.is_finite())
        {
            drawn
        } else {
            argmax(&self.masked)
        };
        self.force(token)?;
        Ok(token)
    }

    /// Takes `token` as the next one without sampling; the worker then computes the next
    /// position's mask.
    pub fn force(&mut self, token: u32) -> Result<(), HeldError> {
        self.ahead.grammar()?.accept(token)?;
        self.ahead.compute_ahead();
        Ok(())
    }

    /// Back to the start of the output (the grammar's; the sampler's random stream goes on).
    pub fn restart(&mut self) -> Result<(), HeldError> {
        self.ahead.grammar()?.reset()?;
        self.ahead.compute_ahead();
        Ok(())
    }

    /// Whether the output so far is whole.
    pub fn is_complete(&mut self) -> bool {
        self.ahead.is_accepting().unwrap_or(false)
    }
}

#[cfg(test)]
mod tests;
