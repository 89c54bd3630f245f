//! Scoring the forward pass against reference fixtures: teacher-forced log-probabilities of
//! the `logits-*.jsonl` cases and windowed perplexity as in `nll-*.json`.
//!
//! Both procedures are defined in `fixtures/reference/README.md`. The scorer talks to the
//! model only through [`LogitsSource`], so a test can wrap a session with a deliberate
//! defect and check that the numbers reveal it.

use std::fmt;

use ferrite_model::{ModelError, Outputs, Session, Weights};
use serde::Deserialize;

use crate::sampler::log_sum_exp;

/// Scoring errors.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ScoreError {
    /// The forward pass failed.
    #[error(transparent)]
    Model(#[from] ModelError),
    /// Another backend's forward pass failed.
    #[error("{0}")]
    Backend(String),
    /// A fixture line is not valid JSON of the expected schema.
    #[error("fixture line {line}: {source}")]
    Fixture {
        /// 1-based line number.
        line: usize,
        /// The parse error.
        #[source]
        source: serde_json::Error,
    },
    /// A case cannot be scored (empty prompt, steps not matching the generated ids, ...).
    #[error("case {id}: {reason}")]
    BadCase {
        /// Case id.
        id: String,
        /// What is wrong.
        reason: String,
    },
    /// The logits source returned fewer rows or values than asked.
    #[error("logits source returned {got} values, expected {expected}")]
    ShortLogits {
        /// Values returned.
        got: usize,
        /// Values expected.
        expected: usize,
    },
}

/// Anything that turns a token sequence into logits: a [`Session`], or a test wrapper.
pub trait LogitsSource {
    /// Vocabulary size (values per logits row).
    fn n_vocab(&self) -> usize;
    /// Forgets all previous tokens.
    fn reset(&mut self);
    /// Appends `tokens` and returns row-major logits for tokens `from..` of this call.
    fn eval(&mut self, tokens: &[u32], from: usize) -> Result<&[f32], ScoreError>;
}

impl<B: Weights> LogitsSource for Session<'_, B> {
    fn n_vocab(&self) -> usize {
        self.model().config().n_vocab
    }

    fn reset(&mut self) {
        Session::reset(self);
    }

    fn eval(&mut self, tokens: &[u32], from: usize) -> Result<&[f32], ScoreError> {
        Ok(Session::eval(self, tokens, Outputs::From(from))?.data)
    }
}

/// One step of a logits fixture case.
#[derive(Debug, Clone, Deserialize)]
pub struct Step {
    /// The generated token.
    pub token: u32,
    /// Its reference log-probability.
    pub logprob: f64,
    /// The 20 largest reference log-probabilities, descending: `(id, logprob)`.
    pub top: Vec<(u32, f64)>,
}

/// One line of `logits-<model>-<set>.jsonl` (fields the scorer needs).
#[derive(Debug, Clone, Deserialize)]
pub struct LogitsCase {
    /// Case id.
    pub id: String,
    /// Prompt token ids.
    pub prompt_ids: Vec<u32>,
    /// The reference's greedy continuation.
    pub generated_ids: Vec<u32>,
    /// Per generated token, the reference distribution.
    pub steps: Vec<Step>,
}

/// Parses a whole `logits-*.jsonl` file (blank lines ignored).
pub fn parse_logits_fixture(text: &str) -> Result<Vec<LogitsCase>, ScoreError> {
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| {
            serde_json::from_str(l).map_err(|source| ScoreError::Fixture {
                line: i + 1,
                source,
            })
        })
        .collect()
}

/// How the teacher-forced pass is run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScoreMode {
    /// Prompt and continuation in one call (batched prefill).
    Prefill,
    /// The prompt in one call, then one token per call (decode path).
    Decode,
}

/// A reference step counts as a near tie when its top-1/top-2 gap is below this; choosing
/// either token then counts as agreement (fixtures README, caveat 5).
pub const NEAR_TIE: f64 = 1e-4;

/// Scores of one case.
#[derive(Debug, Clone, PartialEq)]
pub struct CaseScore {
    /// Case id.
    pub id: String,
    /// Our argmax after the prompt equals the reference's first generated token.
    pub first_token_match: bool,
    /// Leading generated tokens our greedy decoding reproduces (see [`score_case`]).
    pub greedy_prefix: usize,
    /// Steps whose argmax agrees with the reference top-1 (near ties: either of the tied).
    pub top1_agree: usize,
    /// Steps scored.
    pub steps: usize,
    /// Sum of |Δ logprob| over the reference top-20 ids of every step.
    pub sum_abs_dlogprob: f64,
    /// Number of terms in `sum_abs_dlogprob`.
    pub n_dlogprob: usize,
    /// Largest |Δ logprob| over the same ids.
    pub max_abs_dlogprob: f64,
    /// Our negative log-likelihood of the generated ids (sum).
    pub nll: f64,
    /// The reference's (sum).
    pub ref_nll: f64,
}

fn argmax(row: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in row.iter().enumerate() {
        if v > row[best] {
            best = i;
        }
    }
    best as u32
}

/// Teacher-forces `case` through `src` and compares every step with the reference.
///
/// `greedy_prefix` is the number of leading steps whose argmax equals the reference's
/// generated token: up to the first divergence the teacher-forced inputs are exactly those
/// free greedy decoding would feed, so this is the free-generation prefix without a second
/// pass.
pub fn score_case<S: LogitsSource + ?Sized>(
    src: &mut S,
    case: &LogitsCase,
    mode: ScoreMode,
) -> Result<CaseScore, ScoreError> {
    let bad = |reason: &str| ScoreError::BadCase {
        id: case.id.clone(),
        reason: reason.to_owned(),
    };
    let np = case.prompt_ids.len();
    let ns = case.steps.len();
    if np == 0 {
        return Err(bad("empty prompt"));
    }
    if ns != case.generated_ids.len() || ns == 0 {
        return Err(bad("steps and generated_ids differ in length or are empty"));
    }
    let nv = src.n_vocab();
    // A reference id past the vocabulary has no logit to compare: the fixture belongs to
    // another model, and scoring it would print an infinite difference and pass on.
    let ids = case.prompt_ids.iter().chain(&case.generated_ids);
    let top_ids = case
        .steps
        .iter()
        .flat_map(|s| s.top.iter().map(|(id, _)| id));
    if let Some(id) = ids.chain(top_ids).find(|&&id| id as usize >= nv) {
        return Err(bad(&format!(
            "token id {id} is outside the model's vocabulary of {nv}"
        )));
    }
    if case.steps.iter().any(|s| s.top.is_empty()) {
        return Err(bad("a step has no reference top logprobs"));
    }
    src.reset();
    // Logits for step i come from position np - 1 + i; the last generated id is never fed.
    let mut rows = vec![0.0f32; ns * nv];
    match mode {
        ScoreMode::Prefill => {
            let mut seq = case.prompt_ids.clone();
            seq.extend_from_slice(&case.generated_ids[..ns - 1]);
            let out = src.eval(&seq, np - 1)?;
            if out.len() < ns * nv {
                return Err(ScoreError::ShortLogits {
                    got: out.len(),
                    expected: ns * nv,
                });
            }
            rows.copy_from_slice(&out[..ns * nv]);
        }
        ScoreMode::Decode => {
            for i in 0..ns {
                let out = if i == 0 {
                    src.eval(&case.prompt_ids, np - 1)?
                } else {
                    src.eval(&case.generated_ids[i - 1..i], 0)?
                };
                if out.len() < nv {
                    return Err(ScoreError::ShortLogits {
                        got: out.len(),
                        expected: nv,
                    });
                }
                rows[i * nv..(i + 1) * nv].copy_from_slice(&out[..nv]);
            }
        }
    }
    let mut sc = CaseScore {
        id: case.id.clone(),
        first_token_match: false,
        greedy_prefix: 0,
        top1_agree: 0,
        steps: ns,
        sum_abs_dlogprob: 0.0,
        n_dlogprob: 0,
        max_abs_dlogprob: 0.0,
        nll: 0.0,
        ref_nll: 0.0,
    };
    let mut diverged = false;
    for (i, step) in case.steps.iter().enumerate() {
        let row = &rows[i * nv..(i + 1) * nv];
        let lse = log_sum_exp(row);
        let lp = |id: u32| f64::from(row[id as usize]) - lse;
        let ours = argmax(row);
        if i == 0 {
            sc.first_token_match = ours == case.generated_ids[0];
        }
        if !diverged && ours == case.generated_ids[i] {
            sc.greedy_prefix += 1;
        } else {
            diverged = true;
        }
        if let Some(&(top_id, top_lp)) = step.top.first() {
            let tied = step
                .top
                .iter()
                .any(|&(id, l)| id == ours && top_lp - l < NEAR_TIE);
            if ours == top_id || tied {
                sc.top1_agree += 1;
            }
        }
        for &(id, l) in &step.top {
            let d = (lp(id) - l).abs();
            sc.sum_abs_dlogprob += d;
            sc.n_dlogprob += 1;
            // NaN must not hide: treat it as the worst possible difference.
            sc.max_abs_dlogprob = if d.is_nan() {
                f64::INFINITY
            } else {
                sc.max_abs_dlogprob.max(d)
            };
        }
        sc.nll -= lp(case.generated_ids[i]);
        sc.ref_nll -= step.logprob;
    }
    Ok(sc)
}

/// Aggregate over cases; [`fmt::Display`] prints the `summary:` line of `ferrite score`.
#[derive(Debug, Clone, PartialEq)]
pub struct ScoreSummary {
    /// Cases scored.
    pub cases: usize,
    /// Cases whose first token matched.
    pub first_token_match: usize,
    /// Mean greedy prefix length.
    pub greedy_prefix_mean: f64,
    /// Fraction of all steps with top-1 agreement.
    pub top1_agreement: f64,
    /// Mean |Δ logprob| over all reference top-20 entries.
    pub mean_abs_dlogprob: f64,
    /// Largest |Δ logprob|.
    pub max_abs_dlogprob: f64,
    /// Our mean NLL per generated token.
    pub nll: f64,
    /// The reference's mean NLL per generated token.
    pub ref_nll: f64,
}

/// Aggregates case scores (token-weighted means).
pub fn summarize(scores: &[CaseScore]) -> ScoreSummary {
    let cases = scores.len();
    let steps: usize = scores.iter().map(|s| s.steps).sum();
    let terms: usize = scores.iter().map(|s| s.n_dlogprob).sum();
    let div = |a: f64, b: usize| if b == 0 { 0.0 } else { a / b as f64 };
    ScoreSummary {
        cases,
        first_token_match: scores.iter().filter(|s| s.first_token_match).count(),
        greedy_prefix_mean: div(scores.iter().map(|s| s.greedy_prefix as f64).sum(), cases),
        top1_agreement: div(scores.iter().map(|s| s.top1_agree as f64).sum(), steps),
        mean_abs_dlogprob: div(scores.iter().map(|s| s.sum_abs_dlogprob).sum(), terms),
        max_abs_dlogprob: scores
            .iter()
            .map(|s| s.max_abs_dlogprob)
            .fold(0.0, f64::max),
        nll: div(scores.iter().map(|s| s.nll).sum(), steps),
        ref_nll: div(scores.iter().map(|s| s.ref_nll).sum(), steps),
    }
}

impl fmt::Display for ScoreSummary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "summary: cases={} first_token_match={}/{} greedy_prefix_mean={:.3} top1_agreement={:.4} mean_abs_dlogprob={:.6} max_abs_dlogprob={:.6} nll={:.6} ref_nll={:.6}",
            self.cases,
            self.first_token_match,
            self.cases,
            self.greedy_prefix_mean,
            self.top1_agreement,
            self.mean_abs_dlogprob,
            self.max_abs_dlogprob,
            self.nll,
            self.ref_nll
        )
    }
}

/// Tokens per call in [`perplexity`].
const PPL_PIECE: usize = 64;

/// Result of [`perplexity`]; [`fmt::Display`] prints the `perplexity:` line.
#[derive(Debug, Clone, PartialEq)]
pub struct Perplexity {
    /// Windows evaluated.
    pub windows: usize,
    /// Tokens scored (every token but the first of each window).
    pub tokens: usize,
    /// Mean NLL per scored token (nats).
    pub nll: f64,
    /// `exp(nll)`.
    pub ppl: f64,
}

impl fmt::Display for Perplexity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "perplexity: windows={} tokens={} nll={:.8} ppl={:.6}",
            self.windows, self.tokens, self.nll, self.ppl
        )
    }
}

/// Perplexity of `ids` by the fixture procedure: non-overlapping windows of `window` tokens,
/// each an independent pass from position 0; token `j ≥ 1` of a window is scored by the
/// logits at `j - 1`; sums in f64.
pub fn perplexity<S: LogitsSource + ?Sized>(
    src: &mut S,
    ids: &[u32],
    window: usize,
) -> Result<Perplexity, ScoreError> {
    let nv = src.n_vocab();
    let (mut windows, mut tokens, mut sum) = (0, 0, 0.0f64);
    for w in ids.chunks(window.max(1)) {
        windows += 1;
        if w.len() < 2 {
            continue;
        }
        src.reset();
        // Feed the window in pieces so the logits buffer stays small on large vocabularies;
        // the cache makes this the same computation as one pass over the window.
        let inputs = &w[..w.len() - 1];
        let mut at = 0;
        for piece in inputs.chunks(PPL_PIECE) {
            let out = src.eval(piece, 0)?;
            let need = piece.len() * nv;
            if out.len() < need {
                return Err(ScoreError::ShortLogits {
                    got: out.len(),
                    expected: need,
                });
            }
            for (r, row) in out[..need].chunks_exact(nv).enumerate() {
                let target = w[at + r + 1];
                let l = row
                    .get(target as usize)
                    .copied()
                    .unwrap_or(f32::NEG_INFINITY);
                sum += log_sum_exp(row) - f64::from(l);
                tokens += 1;
            }
            at += piece.len();
        }
    }
    let nll = if tokens == 0 {
        0.0
    } else {
        sum / tokens as f64
    };
    Ok(Perplexity {
        windows,
        tokens,
        nll,
        ppl: nll.exp(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fake model: the logits at every position are `table[last input token]`, so the
    /// expected log-probabilities are known exactly.
    struct Table {
        table: Vec<Vec<f32>>,
        last: Option<u32>,
        out: Vec<f32>,
        calls: usize,
    }

    impl Table {
        fn new(nv: usize) -> Table {
            let table = (0..nv)
                .map(|t| {
                    (0..nv)
                        .map(|i| ((i * 3 + t * 5) % nv) as f32 * 0.5)
                        .collect()
                })
                .collect();
            Table {
                table,
                last: None,
                out: Vec::new(),
                calls: 0,
            }
        }
    }

    impl LogitsSource for Table {
        fn n_vocab(&self) -> usize {
            self.table.len()
        }
        fn reset(&mut self) {
            self.last = None;
        }
        fn eval(&mut self, tokens: &[u32], from: usize) -> Result<&[f32], ScoreError> {
            self.calls += 1;
            self.out.clear();
            for &t in &tokens[from..] {
                self.out.extend_from_slice(&self.table[t as usize]);
            }
            self.last = tokens.last().copied();
            Ok(&self.out)
        }
    }

    fn log_softmax(row: &[f32]) -> Vec<f64> {
        let lse = log_sum_exp(row);
        row.iter().map(|&l| f64::from(l) - lse).collect()
    }

    /// A case whose reference is exactly what `Table` computes, greedy continuation included.
    fn exact_case(src: &Table, prompt: Vec<u32>, n: usize) -> LogitsCase {
        let mut prev = *prompt.last().unwrap();
        let (mut generated, mut steps) = (Vec::new(), Vec::new());
        for _ in 0..n {
            let lp = log_softmax(&src.table[prev as usize]);
            let mut top: Vec<(u32, f64)> =
                lp.iter().enumerate().map(|(i, &l)| (i as u32, l)).collect();
            top.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
            top.truncate(4);
            let token = top[0].0;
            steps.push(Step {
                token,
                logprob: top[0].1,
                top,
            });
            generated.push(token);
            prev = token;
        }
        LogitsCase {
            id: "c".into(),
            prompt_ids: prompt,
            generated_ids: generated,
            steps,
        }
    }

    #[test]
    fn exact_source_scores_perfectly_in_both_modes() {
        let mut src = Table::new(11);
        let case = exact_case(&src, vec![1, 2, 3], 5);
        for mode in [ScoreMode::Prefill, ScoreMode::Decode] {
            let s = score_case(&mut src, &case, mode).unwrap();
            assert!(s.first_token_match);
            assert_eq!((s.greedy_prefix, s.top1_agree, s.steps), (5, 5, 5));
            assert!(
                s.max_abs_dlogprob < 1e-12,
                "{mode:?}: {}",
                s.max_abs_dlogprob
            );
            assert!((s.nll - s.ref_nll).abs() < 1e-12);
            assert_eq!(s.n_dlogprob, 20);
        }
        // Prefill is one call; decode one per step.
        src.calls = 0;
        score_case(&mut src, &case, ScoreMode::Prefill).unwrap();
        assert_eq!(src.calls, 1);
        src.calls = 0;
        score_case(&mut src, &case, ScoreMode::Decode).unwrap();
        assert_eq!(src.calls, 5);
    }

    #[test]
    fn a_case_of_another_vocabulary_or_without_reference_tops_is_refused() {
        let mut src = Table::new(11);
        let good = exact_case(&src, vec![1, 2], 3);
        let mut beyond_top = good.clone();
        beyond_top.steps[1].top[2].0 = 11;
        let mut beyond_prompt = good.clone();
        beyond_prompt.prompt_ids[0] = 99;
        let mut no_top = good.clone();
        no_top.steps[2].top.clear();
        for (case, says) in [
            (
                beyond_top,
                "token id 11 is outside the model's vocabulary of 11",
            ),
            (beyond_prompt, "token id 99"),
            (no_top, "no reference top logprobs"),
        ] {
            let err = score_case(&mut src, &case, ScoreMode::Prefill).unwrap_err();
            assert!(err.to_string().contains(says), "{err}");
        }
        assert!(score_case(&mut src, &good, ScoreMode::Prefill).is_ok());
    }

    #[test]
    fn perturbed_reference_is_detected() {
        let mut src = Table::new(11);
        let mut case = exact_case(&src, vec![4], 6);
        // Change the reference's last token (never fed back, so other steps are unaffected)
        // and shift one reference log-probability.
        case.generated_ids[5] = (case.generated_ids[5] + 1) % 11;
        case.steps[3].top[0].1 -= 0.25;
        let s = score_case(&mut src, &case, ScoreMode::Prefill).unwrap();
        assert_eq!(s.greedy_prefix, 5);
        assert!((s.max_abs_dlogprob - 0.25).abs() < 1e-9);
        assert!(s.nll > s.ref_nll);
        let sum = summarize(&[s]);
        assert!(sum.mean_abs_dlogprob > 0.0);
    }

    #[test]
    fn near_ties_count_either_token_as_agreement() {
        let mut src = Table::new(5);
        let mut case = exact_case(&src, vec![0], 1);
        let (a, b) = (case.steps[0].top[0], case.steps[0].top[1]);
        // Pretend the reference preferred the runner-up by less than NEAR_TIE.
        case.steps[0].top[0] = (b.0, a.1);
        case.steps[0].top[1] = (a.0, a.1 - NEAR_TIE / 2.0);
        let s = score_case(&mut src, &case, ScoreMode::Prefill).unwrap();
        assert_eq!(s.top1_agree, 1);
        case.steps[0].top[1] = (a.0, a.1 - 10.0 * NEAR_TIE);
        let s = score_case(&mut src, &case, ScoreMode::Prefill).unwrap();
        assert_eq!(s.top1_agree, 0);
    }

    #[test]
    fn summary_line_format() {
        let s = ScoreSummary {
            cases: 2,
            first_token_match: 1,
            greedy_prefix_mean: 16.5,
            top1_agreement: 0.96875,
            mean_abs_dlogprob: 0.0123,
            max_abs_dlogprob: 0.5,
            nll: 1.25,
            ref_nll: 1.5,
        };
        assert_eq!(
            s.to_string(),
            "summary: cases=2 first_token_match=1/2 greedy_prefix_mean=16.500 top1_agreement=0.9688 mean_abs_dlogprob=0.012300 max_abs_dlogprob=0.500000 nll=1.250000 ref_nll=1.500000"
        );
    }

    #[test]
    fn perplexity_of_uniform_logits_is_vocab_size_and_windows_skip_first_token() {
        struct Uniform(Vec<f32>);
        impl LogitsSource for Uniform {
            fn n_vocab(&self) -> usize {
                8
            }
            fn reset(&mut self) {}
            fn eval(&mut self, tokens: &[u32], from: usize) -> Result<&[f32], ScoreError> {
                self.0 = vec![0.0; (tokens.len() - from) * 8];
                Ok(&self.0)
            }
        }
        let ids: Vec<u32> = (0..1100).map(|i| i % 8).collect();
        let p = perplexity(&mut Uniform(Vec::new()), &ids, 512).unwrap();
        assert_eq!((p.windows, p.tokens), (3, 1100 - 3));
        assert!((p.ppl - 8.0).abs() < 1e-9);
        assert!(
            p.to_string()
                .starts_with("perplexity: windows=3 tokens=1097 nll=2.07944154")
        );
    }

    #[test]
    fn perplexity_scores_the_next_token() {
        let mut src = Table::new(7);
        let ids = [1u32, 5, 2, 6, 0];
        let p = perplexity(&mut src, &ids, 3).unwrap();
        let mut want = 0.0;
        for (a, b) in [(1, 5), (5, 2), (6, 0)] {
            want -= log_softmax(&src.table[a])[b];
        }
        assert_eq!((p.windows, p.tokens), (2, 3));
        assert!((p.nll - want / 3.0).abs() < 1e-12);
    }

    #[test]
    fn parses_fixture_lines_and_reports_bad_ones() {
        let good = r#"{"id":"x","prompt_ids":[1],"generated_ids":[2],"steps":[{"token":2,"logprob":-0.1,"top":[[2,-0.1],[3,-2.5]]}],"extra":true}"#;
        let cases = parse_logits_fixture(&format!("{good}\n\n{good}\n")).unwrap();
        assert_eq!(cases.len(), 2);
        assert_eq!(cases[0].steps[0].top[1], (3, -2.5));
        let err = parse_logits_fixture(&format!("{good}\n{{\"id\":1}}")).unwrap_err();
        assert!(matches!(err, ScoreError::Fixture { line: 2, .. }), "{err}");
    }

    #[test]
    fn rejects_inconsistent_cases() {
        let mut src = Table::new(5);
        let mut case = exact_case(&src, vec![0], 2);
        case.generated_ids.pop();
        assert!(matches!(
            score_case(&mut src, &case, ScoreMode::Prefill),
            Err(ScoreError::BadCase { .. })
        ));
        case.prompt_ids.clear();
        assert!(score_case(&mut src, &case, ScoreMode::Decode).is_err());
    }
}
