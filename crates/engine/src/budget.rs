//! A reasoning budget: the most tokens a generation may spend inside its `<think>` block.
//! At the limit the block is closed by forcing its closing marker's tokens, so the answer
//! still follows; the answer itself is never cut (only `max_tokens` does that).
//!
//! [`BudgetState`] watches the generated tokens (their ids, and their bytes for markers
//! written as text) and says when a token must be forced instead of sampled. It only
//! counts and forces: it must never parse reasoning for the APIs (that is
//! [`crate::output`]) nor change a token the budget does not force.

/// A request's reasoning budget and the marker tokens it needs (tokenized by the front end
/// with the model's tokenizer).
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
}

/// The opening and closing markers as text, for markers the model writes in text pieces.
const OPEN: &[u8] = b"<think>";
const CLOSE: &[u8] = b"</think>";

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
                if self.ids.ends_with(&self.budget.open) || text.starts_with(OPEN) {
                    self.enter(Phase::Inside);
                    self.check_limit();
                } else if !text.is_empty() && !OPEN.starts_with(text) || self.taken >= OPEN_WITHIN {
                    self.phase = Phase::Done;
                }
            }
            Phase::Inside => {
                self.push(id, bytes);
                let closed = !self.budget.close.is_empty()
                    && self.ids.ends_with(&self.budget.close)
                    || self.text.windows(CLOSE.len()).any(|w| w == CLOSE);
                if closed {
                    self.phase = Phase::Done;
                } else {
                    // A marker split across tokens needs at most its length less one byte
                    // of what came before: the rest is dropped, so a long block costs no
                    // more per token than a short one.
                    let keep = CLOSE.len() - 1;
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
}
