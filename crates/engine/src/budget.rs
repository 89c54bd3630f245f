//! A reasoning budget: the most tokens a generation may spend inside its reasoning block
//! (`<think>…</think>`, or a harmony `analysis` message). At the limit the block is closed
//! by forcing its closing marker's tokens (for harmony: the end of the message and the
//! header of the `final` one), so the answer still follows; the answer itself is never cut
//! (only `max_tokens` does that).
//!
//! [`BudgetState`] watches the generated tokens (their ids, and their bytes for markers
//! written as text) and says when a token must be forced instead of sampled; the scheduler
//! drives it, and [`Budgeted`] wraps a [`Picker`] with it for [`crate::generate`]. It only
//! counts and forces: it must never parse reasoning for the APIs (that is
//! [`crate::output`]) nor change a token the budget does not force.

use crate::generate::{GenerateError, Picker, Timeline};
use crate::output::stream::{THINK_CLOSE, THINK_OPEN};
use crate::output::{OutputConfig, ReasoningFormat, harmony};
use crate::sampler::{Sampled, StopReason};

/// A request's reasoning budget and the marker tokens it needs (tokenized by the front end
/// with the model's tokenizer; [`ReasoningBudget::for_output`] makes one).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReasoningBudget {
    /// Most tokens inside the reasoning block, its markers not counted.
    pub tokens: usize,
    /// The prompt opened the block: the output starts inside it.
    pub starts_inside: bool,
    /// The opening marker as the model writes it (`<think>`, special tokens parsed).
    pub open: Vec<u32>,
    /// The closing marker as the model writes it (`</think>`, special tokens parsed).
    pub close: Vec<u32>,
    /// The tokens forced at the limit: the closing marker, as text where a grammar holds
    /// the output (grammars read markers as text).
    pub forced: Vec<u32>,
    /// The opening and closing markers as text, for a model that writes them in text
    /// pieces (`<think>`); `None` where they are special tokens only (harmony).
    pub text_markers: Option<(&'static str, &'static str)>,
}

impl ReasoningBudget {
    /// A budget of `tokens` for output read as `output`, its markers tokenized by
    /// `tokenize(text, parse_special)`; `held` when a grammar holds the output, so the
    /// `<think>` close is forced as text. `None` for output with no reasoning block
    /// ([`ReasoningFormat::None`]): a front end refuses a budget asked of it.
    pub fn for_output(
        tokens: usize,
        output: &OutputConfig,
        held: bool,
        tokenize: impl Fn(&str, bool) -> Vec<u32>,
    ) -> Option<ReasoningBudget> {
        match output.reasoning {
            ReasoningFormat::Think | ReasoningFormat::Auto => {
                let close = tokenize(THINK_CLOSE, true);
                Some(ReasoningBudget {
                    tokens,
                    starts_inside: output.starts_in_reasoning,
                    open: tokenize(THINK_OPEN, true),
                    forced: if held {
                        tokenize(THINK_CLOSE, false)
                    } else {
                        close.clone()
                    },
                    close,
                    text_markers: Some((THINK_OPEN, THINK_CLOSE)),
                })
            }
            ReasoningFormat::Harmony => Some(ReasoningBudget {
                tokens,
                starts_inside: false,
                open: tokenize(harmony::ANALYSIS_HEADER, true),
                close: tokenize(harmony::END, true),
                forced: tokenize(harmony::ANALYSIS_TO_FINAL, true),
                text_markers: None,
            }),
            ReasoningFormat::None => None,
        }
    }
}

/// Tokens the output may take to open its block before the budget stops looking.
const OPEN_WITHIN: usize = 8;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// The output has not opened a block yet.
    Before,
    /// Inside the block.
    Inside,
    /// At the limit: `forced[i]` is the next token.
    Closing(usize),
    /// The block is closed, or the output has none: nothing more to do.
    Done,
}

/// One generation's progress against its [`ReasoningBudget`].
#[derive(Debug)]
pub struct BudgetState {
    budget: ReasoningBudget,
    phase: Phase,
    /// Tokens taken in the current phase.
    taken: usize,
    /// The ids and bytes of the current phase, for finding the markers.
    ids: Vec<u32>,
    text: Vec<u8>,
}

impl BudgetState {
    /// The state at the start of the output.
    pub fn new(budget: ReasoningBudget) -> BudgetState {
        let mut state = BudgetState {
            phase: if budget.starts_inside {
                Phase::Inside
            } else {
                Phase::Before
            },
            budget,
            taken: 0,
            ids: Vec::new(),
            text: Vec::new(),
        };
        state.check_limit();
        state
    }

    /// The token that must come next instead of a sampled one, if any.
    pub fn forced(&self) -> Option<u32> {
        match self.phase {
            Phase::Closing(i) => self.budget.forced.get(i).copied(),
            _ => None,
        }
    }

    /// Take the next output token: its id and its bytes (empty for a special token).
    pub fn observe(&mut self, id: u32, bytes: &[u8]) {
        match self.phase {
            Phase::Done => {}
            Phase::Closing(i) => {
                self.phase = if i + 1 >= self.budget.forced.len() {
                    Phase::Done
                } else {
                    Phase::Closing(i + 1)
                };
            }
            Phase::Before => {
                self.push(id, bytes);
                let text = self.text.trim_ascii_start();
                let open = self.budget.text_markers.map(|(open, _)| open.as_bytes());
                if self.ids.ends_with(&self.budget.open)
                    || open.is_some_and(|open| text.starts_with(open))
                {
                    self.enter(Phase::Inside);
                    self.check_limit();
                } else if open.is_some_and(|open| !text.is_empty() && !open.starts_with(text))
                    || self.taken >= OPEN_WITHIN
                {
                    self.phase = Phase::Done;
                }
            }
            Phase::Inside => {
                self.push(id, bytes);
                let close = self.budget.text_markers.map(|(_, close)| close.as_bytes());
                let closed = !self.budget.close.is_empty()
                    && self.ids.ends_with(&self.budget.close)
                    || close.is_some_and(|c| self.text.windows(c.len()).any(|w| w == c));
                if closed {
                    self.phase = Phase::Done;
                } else {
                    // A marker split across tokens needs at most its length less one byte
                    // of what came before: the rest is dropped, so a long block costs no
                    // more per token than a short one.
                    let keep = close.map_or(0, |c| c.len() - 1);
                    if self.text.len() > keep {
                        self.text.drain(..self.text.len() - keep);
                    }
                    self.check_limit();
                }
            }
        }
    }

    fn push(&mut self, id: u32, bytes: &[u8]) {
        self.taken += 1;
        self.ids.push(id);
        self.text.extend_from_slice(bytes);
        let keep = self.budget.open.len().max(self.budget.close.len());
        if self.ids.len() > keep {
            self.ids.drain(..self.ids.len() - keep);
        }
    }

    fn enter(&mut self, phase: Phase) {
        self.phase = phase;
        self.taken = 0;
        self.ids.clear();
        self.text.clear();
    }

    fn check_limit(&mut self) {
        if self.phase == Phase::Inside && self.taken >= self.budget.tokens {
            self.phase = if self.budget.forced.is_empty() {
                Phase::Done
            } else {
                Phase::Closing(0)
            };
        }
    }
}

/// A [`Picker`] under a reasoning budget, for [`crate::generate`]: the inner picker's
/// tokens, except where the budget forces its closing marker; a forced token still
/// advances the inner picker (its grammar) and reports its log-probability from the raw
/// row. `token_bytes` gives a token's bytes (empty for a special token).
pub struct Budgeted<'p, P, B> {
    inner: &'p mut P,
    state: Option<BudgetState>,
    token_bytes: B,
}

impl<'p, P: Picker, B: Fn(u32) -> Vec<u8>> Budgeted<'p, P, B> {
    /// `inner` held to `budget` from the start of an output; with no budget, the inner
    /// picker's tokens throughout.
    pub fn new(inner: &'p mut P, budget: Option<ReasoningBudget>, token_bytes: B) -> Self {
        Budgeted {
            inner,
            state: budget.map(BudgetState::new),
            token_bytes,
        }
    }

    fn forced(&self) -> Option<u32> {
        self.state.as_ref().and_then(BudgetState::forced)
    }

    fn observed(&mut self, s: Sampled) -> Sampled {
        if let Some(state) = self.state.as_mut() {
            state.observe(s.token, &(self.token_bytes)(s.token));
        }
        s
    }
}

impl<P: Picker, B: Fn(u32) -> Vec<u8>> Picker for Budgeted<'_, P, B> {
    fn eval_pick<T: Timeline + ?Sized>(
        &mut self,
        session: &mut T,
        tokens: &[u32],
        history: &[u32],
    ) -> Result<Sampled, GenerateError> {
        let s = match self.forced() {
            Some(token) => {
                let row = session.eval_last(tokens)?;
                self.inner.pick_forced(row, token)?
            }
            None => self.inner.eval_pick(session, tokens, history)?,
        };
        Ok(self.observed(s))
    }

    fn pick_row(&mut self, row: &[f32], history: &[u32]) -> Result<Sampled, GenerateError> {
        let s = match self.forced() {
            Some(token) => self.inner.pick_forced(row, token)?,
            None => self.inner.pick_row(row, history)?,
        };
        Ok(self.observed(s))
    }

    fn pick_forced(&mut self, row: &[f32], token: u32) -> Result<Sampled, GenerateError> {
        let s = self.inner.pick_forced(row, token)?;
        Ok(self.observed(s))
    }

    fn stop_reason(&self, token: u32, n_generated: usize) -> Option<StopReason> {
        self.inner.stop_reason(token, n_generated)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // A toy vocabulary: 1 = `<think>` (special), 2 = `</think>` (special), 3 = "x",
    // 4 = "</", 5 = "think>", 6 = " " (blank), 7 = "<think", 8 = ">", 9 = "x</think>\n".
    fn bytes(id: u32) -> &'static [u8] {
        match id {
            3 => b"x",
            4 => b"</",
            5 => b"think>",
            6 => b" ",
            7 => b"<think",
            8 => b">",
            9 => b"x</think>\n",
            _ => b"",
        }
    }

    fn budget(tokens: usize, starts_inside: bool) -> ReasoningBudget {
        ReasoningBudget {
            tokens,
            starts_inside,
            open: vec![1],
            close: vec![2],
            forced: vec![4, 5],
            text_markers: Some((THINK_OPEN, THINK_CLOSE)),
        }
    }

    /// Drives the state over `model`'s tokens, taking the forced ones where it forces:
    /// returns the output.
    fn run(b: ReasoningBudget, model: &[u32]) -> Vec<u32> {
        let mut s = BudgetState::new(b);
        let mut out = Vec::new();
        let mut model = model.iter();
        loop {
            let t = match s.forced() {
                Some(t) => t,
                None => match model.next() {
                    Some(&t) => t,
                    None => return out,
                },
            };
            s.observe(t, bytes(t));
            out.push(t);
        }
    }

    // Oracle: the budget's definition, counted by hand on each toy output.
    #[test]
    fn a_block_the_prompt_opened_is_closed_after_exactly_the_budget() {
        assert_eq!(
            run(budget(3, true), &[3, 3, 3, 3, 3]),
            [3, 3, 3, 4, 5, 3, 3]
        );
    }

    #[test]
    fn a_zero_budget_closes_at_once() {
        assert_eq!(run(budget(0, true), &[3]), [4, 5, 3]);
        assert_eq!(run(budget(0, false), &[1, 3]), [1, 4, 5, 3]);
    }

    #[test]
    fn a_block_the_model_opens_is_counted_from_its_marker() {
        assert_eq!(run(budget(2, false), &[1, 3, 3, 3]), [1, 3, 3, 4, 5, 3]);
        // Written as text, after a blank.
        assert_eq!(
            run(budget(1, false), &[6, 7, 8, 3, 3]),
            [6, 7, 8, 3, 4, 5, 3]
        );
    }

    #[test]
    fn a_block_closed_within_the_budget_is_left_alone() {
        assert_eq!(run(budget(3, true), &[3, 2, 3, 3, 3]), [3, 2, 3, 3, 3]);
        assert_eq!(run(budget(3, true), &[3, 4, 5, 3, 3]), [3, 4, 5, 3, 3]);
    }

    #[test]
    fn output_without_a_block_is_never_touched() {
        assert_eq!(run(budget(1, false), &[3, 3, 1, 3, 3]), [3, 3, 1, 3, 3]);
    }

    #[test]
    fn a_close_marker_split_across_tokens_is_found() {
        // "</" then "think>" closes the block even though no id sequence matches `close`.
        assert_eq!(run(budget(3, true), &[4, 5, 3, 3, 3]), [4, 5, 3, 3, 3]);
        // Inside one token with text on both sides.
        assert_eq!(run(budget(2, true), &[3, 9, 3, 3]), [3, 9, 3, 3]);
    }

    // Harmony: markers are id sequences only (special tokens have no bytes). 20 21 22 =
    // `<|channel|>analysis<|message|>`, 23 = `<|end|>`, 24 25 = the `final` header.
    fn harmony(tokens: usize) -> ReasoningBudget {
        ReasoningBudget {
            tokens,
            starts_inside: false,
            open: vec![20, 21, 22],
            close: vec![23],
            forced: vec![23, 24, 25],
            text_markers: None,
        }
    }

    #[test]
    fn a_harmony_analysis_message_is_ended_and_the_final_one_opened() {
        assert_eq!(
            run(harmony(2), &[20, 21, 22, 3, 3, 3, 3]),
            [20, 21, 22, 3, 3, 23, 24, 25, 3, 3]
        );
        // Ended within the budget, or not opened within the first tokens (a `final`
        // message first): untouched.
        assert_eq!(
            run(harmony(2), &[20, 21, 22, 3, 23, 3]),
            [20, 21, 22, 3, 23, 3]
        );
        let final_first = [20, 30, 22, 3, 3, 3, 3, 3, 20, 21, 22, 3, 3, 3];
        assert_eq!(run(harmony(1), &final_first), final_first);
    }

    /// A toy timeline whose next token is the number of positions it holds, mod 16.
    struct Counting {
        n: usize,
        row: Vec<f32>,
    }

    fn one_hot(n: usize) -> Vec<f32> {
        (0..16).map(|i| f32::from(u8::from(i == n % 16))).collect()
    }

    impl Timeline for Counting {
        fn eval_last(&mut self, tokens: &[u32]) -> Result<&[f32], GenerateError> {
            self.n += tokens.len();
            self.row = one_hot(self.n);
            Ok(&self.row)
        }
        fn n_past(&self) -> usize {
            self.n
        }
        fn ctx(&self) -> usize {
            64
        }
        fn truncate(&mut self, n: usize) {
            self.n = n;
        }
        fn eval_all(&mut self, tokens: &[u32]) -> Result<Vec<f32>, GenerateError> {
            let start = self.n;
            self.n += tokens.len();
            Ok((start + 1..=self.n).flat_map(one_hot).collect())
        }
    }

    /// Guesses the toy's own continuation, so every draft the budget breaks is rejected.
    struct Continuation;

    impl crate::speculate::Proposer for Continuation {
        fn propose(&mut self, history: &[u32], max: usize) -> Vec<u32> {
            (0..max.min(4))
                .map(|i| ((history.len() + i) % 16) as u32)
                .collect()
        }
    }

    // Oracle: the toy's continuation counted by hand, the forced close spliced in after
    // exactly the budget, and the speculating loop giving the plain loop's tokens.
    #[test]
    fn a_budgeted_picker_forces_the_close_in_plain_and_speculating_loops() {
        let cfg = crate::SamplerConfig {
            temperature: 0.0,
            max_tokens: 8,
            ..crate::SamplerConfig::default()
        };
        let toy = || Counting {
            n: 0,
            row: Vec::new(),
        };
        // Markers the toy never writes by itself before the limit.
        let budget = ReasoningBudget {
            open: vec![14],
            close: vec![15],
            forced: vec![10, 11],
            ..budget(3, true)
        };
        let mut outputs = Vec::new();
        for speculate in [false, true] {
            let mut sampler = crate::Sampler::new(cfg.clone()).unwrap();
            let mut picker =
                Budgeted::new(&mut sampler, Some(budget.clone()), |id| bytes(id).to_vec());
            let mut proposer = Continuation;
            let proposer =
                speculate.then_some(&mut proposer as &mut dyn crate::speculate::Proposer);
            let g = crate::generate_with(&mut toy(), &mut picker, proposer, &[0], |_| {
                crate::Flow::Continue
            })
            .unwrap();
            outputs.push(g.tokens);
        }
        assert_eq!(outputs[0], [1, 2, 3, 10, 11, 6, 7, 8]);
        assert_eq!(outputs[1], outputs[0]);
    }
}
