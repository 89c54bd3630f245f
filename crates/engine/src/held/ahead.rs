//! The grammar's next mask, computed off the critical path: once a token is taken, the
//! grammar goes to a worker thread that computes the mask of the next position while the
//! caller runs the forward pass that makes the next row; the pick then waits only for
//! whichever of the two finishes last.
//!
//! The mask depends only on the tokens taken, never on the row, so it is the very mask the
//! serial order (row first, then mask) would compute: held output is bit-identical. The
//! grammar is always in one place, here or at the worker, never shared.
//!
//! Never samples, and never computes a mask for a grammar that changed after the mask was
//! asked for: every change goes through [`Ahead::grammar`], which drops the mask in hand.

use std::fmt;
use std::sync::mpsc::{Receiver, SendError, Sender, channel};
use std::thread;

use ferrite_grammar::{GrammarError, Mask, Matcher};

use super::HeldError;

/// What held sampling needs of a grammar: its next mask (computed on the worker) and the
/// changes a pick makes. [`Matcher`] is the one grammar; tests use fakes that show when a
/// mask is computed.
pub trait Grammar: Send + 'static {
    /// The tokens that may come next, as computed before the row exists.
    type Mask: Send + 'static;
    /// The mask of the next position.
    fn next_mask(&mut self) -> Result<Self::Mask, GrammarError>;
    /// Sets the logits `mask` refuses to `-inf`; returns how many tokens remain.
    fn apply(mask: &Self::Mask, logits: &mut [f32]) -> usize;
    /// Takes `token` as the next one.
    fn accept(&mut self, token: u32) -> Result<(), GrammarError>;
    /// Back to the start of the output.
    fn reset(&mut self) -> Result<(), GrammarError>;
    /// Whether the text so far is whole.
    fn is_accepting(&mut self) -> bool;
}

impl Grammar for Matcher {
    type Mask = Mask;

    fn next_mask(&mut self) -> Result<Mask, GrammarError> {
        Matcher::next_mask(self)
    }

    fn apply(mask: &Mask, logits: &mut [f32]) -> usize {
        mask.apply(logits)
    }

    fn accept(&mut self, token: u32) -> Result<(), GrammarError> {
        Matcher::accept(self, token)
    }

    fn reset(&mut self) -> Result<(), GrammarError> {
        Matcher::reset(self)
    }

    fn is_accepting(&mut self) -> bool {
        Matcher::is_accepting(self)
    }
}

type Computed<G> = (G, Result<<G as Grammar>::Mask, GrammarError>);

/// A grammar and its worker thread (see the module documentation). The worker ends when
/// this is dropped.
pub(crate) struct Ahead<G: Grammar> {
    /// The grammar when it is here; `None` while the worker has it.
    home: Option<G>,
    /// The mask of `home`'s position, computed by the worker and not yet used.
    mask: Option<Result<G::Mask, GrammarError>>,
    to_worker: Sender<G>,
    from_worker: Receiver<Computed<G>>,
}

impl<G: Grammar> fmt::Debug for Ahead<G> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Ahead")
            .field("at_worker", &self.home.is_none())
            .finish()
    }
}

impl<G: Grammar> Ahead<G> {
    /// `grammar` with a worker of its own, already computing the first mask (while the
    /// prompt is evaluated).
    pub(crate) fn new(grammar: G) -> Result<Ahead<G>, HeldError> {
        let (to_worker, jobs) = channel::<G>();
        let (done, from_worker) = channel();
        thread::Builder::new()
            .name("ferrite-mask".into())
            .spawn(move || {
                for mut grammar in jobs {
                    let mask = grammar.next_mask();
                    if done.send((grammar, mask)).is_err() {
                        return;
                    }
                }
            })
            .map_err(|e| HeldError::Worker(e.to_string()))?;
        let mut ahead = Ahead {
            home: Some(grammar),
            mask: None,
            to_worker,
            from_worker,
        };
        ahead.compute_ahead();
        Ok(ahead)
    }

    /// Sends the grammar to the worker to compute the mask of its position; call it right
    /// after the grammar changed, before the forward pass.
    pub(crate) fn compute_ahead(&mut self) {
        if let Some(grammar) = self.home.take() {
            self.mask = None;
            // A worker that is gone (it panicked) leaves the mask to be computed here.
            if let Err(SendError(grammar)) = self.to_worker.send(grammar) {
                self.home = Some(grammar);
            }
        }
    }

    /// The mask of the grammar's position: the worker's, waited for, or computed here
    /// when none is in hand.
    pub(crate) fn mask(&mut self) -> Result<G::Mask, HeldError> {
        self.fetch()?;
        match (self.mask.take(), self.home.as_mut()) {
            (Some(mask), _) => Ok(mask?),
            (None, Some(grammar)) => Ok(grammar.next_mask()?),
            (None, None) => Err(HeldError::Worker("the grammar is lost".into())),
        }
    }

    /// The grammar, to change it (any mask in hand is dropped: it was of the position
    /// before the change).
    pub(crate) fn grammar(&mut self) -> Result<&mut G, HeldError> {
        self.fetch()?;
        self.mask = None;
        self.home
            .as_mut()
            .ok_or_else(|| HeldError::Worker("the grammar is lost".into()))
    }

    /// Whether the grammar's text so far is whole: a question that moves no position, so
    /// the mask in hand stays for the next pick.
    pub(crate) fn is_accepting(&mut self) -> Result<bool, HeldError> {
        self.fetch()?;
        self.home
            .as_mut()
            .map(G::is_accepting)
            .ok_or_else(|| HeldError::Worker("the grammar is lost".into()))
    }

    /// Brings the grammar back from the worker, with the mask it computed.
    fn fetch(&mut self) -> Result<(), HeldError> {
        if self.home.is_none() {
            let (grammar, mask) = self
                .from_worker
                .recv()
                .map_err(|_| HeldError::Worker("the mask worker stopped".into()))?;
            self.home = Some(grammar);
            self.mask = Some(mask);
        }
        Ok(())
    }
}
