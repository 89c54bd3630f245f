//! The verify step of the generation loop on a toy timeline (no model): speculative
//! generation against plain generation of the same loop, token for token, state for state
//! and, over 100,000 draws, frequency for frequency; and the chi-square checker shown
//! failing on the textbook defect of rejection sampling.

use super::chi_square::homogeneity;
use super::{Adaptive, Draft, Lookup, Proposer};
use crate::generate::{Finish, Flow, GenerateError, Generation, Timeline, generate_with};
use crate::rng::Rng;
use crate::sampler::{Sampled, Sampler, SamplerConfig};

const VOCAB: usize = 5;

/// A toy model whose logits depend on the last two tokens held and the position, so that a
/// stale or missing KV entry changes them. Holds its "KV" as the token list; counts the
/// forward passes.
struct Toy {
    held: Vec<u32>,
    ctx: usize,
    row: Vec<f32>,
    passes: usize,
}

impl Toy {
    fn new(ctx: usize) -> Toy {
        Toy {
            held: Vec::new(),
            ctx,
            row: Vec::new(),
            passes: 0,
        }
    }

    fn logits(held: &[u32]) -> Vec<f32> {
        let n = held.len();
        let a = held.last().copied().unwrap_or(0) as usize;
        let b = n.checked_sub(2).map_or(0, |i| held[i] as usize);
        (0..VOCAB)
            .map(|j| ((a * 7 + b * 3 + j * 5 + (n % 3)) % 11) as f32 * 0.35)
            .collect()
    }

    fn push(&mut self, t: u32) -> Result<(), GenerateError> {
        if self.held.len() >= self.ctx {
            return Err(GenerateError::ContextFull {
                cached: self.held.len(),
                new: 1,
                ctx: self.ctx,
            });
        }
        self.held.push(t);
        Ok(())
    }
}

impl Timeline for Toy {
    fn eval_last(&mut self, tokens: &[u32]) -> Result<&[f32], GenerateError> {
        self.passes += 1;
        for &t in tokens {
            self.push(t)?;
        }
        self.row = Toy::logits(&self.held);
        Ok(&self.row)
    }
    fn n_past(&self) -> usize {
        self.held.len()
    }
    fn ctx(&self) -> usize {
        self.ctx
    }
    fn truncate(&mut self, n: usize) {
        self.held.truncate(n);
    }
    fn eval_all(&mut self, tokens: &[u32]) -> Result<Vec<f32>, GenerateError> {
        self.passes += 1;
        let mut out = Vec::new();
        for &t in tokens {
            self.push(t)?;
            out.extend(Toy::logits(&self.held));
        }
        Ok(out)
    }
}

/// The toy with its logits reversed: a draft model that mostly disagrees with the target.
struct Other(Toy);

impl Timeline for Other {
    fn eval_last(&mut self, tokens: &[u32]) -> Result<&[f32], GenerateError> {
        self.0.eval_last(tokens)?;
        self.0.row.reverse();
        Ok(&self.0.row)
    }
    fn n_past(&self) -> usize {
        self.0.n_past()
    }
    fn ctx(&self) -> usize {
        self.0.ctx()
    }
    fn truncate(&mut self, n: usize) {
        self.0.truncate(n);
    }
}

/// Proposes the same tokens whatever the history: mostly wrong, so rejections at every
/// depth are exercised.
struct Fixed(Vec<u32>);

impl Proposer for Fixed {
    fn propose(&mut self, _history: &[u32], max: usize) -> Vec<u32> {
        self.0.iter().copied().take(max).collect()
    }
}

fn settings() -> Vec<SamplerConfig> {
    vec![
        SamplerConfig {
            max_tokens: 60,
            ..SamplerConfig::default()
        },
        SamplerConfig {
            temperature: 0.9,
            seed: 11,
            max_tokens: 60,
            n_logprobs: 2,
            ..SamplerConfig::default()
        },
        SamplerConfig {
            temperature: 1.3,
            top_k: 3,
            repeat_penalty: 1.3,
            frequency_penalty: 0.2,
            penalty_last_n: 6,
            logit_bias: vec![(2, 0.7)],
            seed: 4,
            max_tokens: 80,
            stop_ids: vec![4],
            ..SamplerConfig::default()
        },
    ]
}

/// Runs the loop with `proposer` and a callback that stops after `stop_after` tokens (a
/// stop string); returns the generation, every `Sampled` seen, the toy and the sampler.
fn run(
    cfg: &SamplerConfig,
    proposer: Option<&mut dyn Proposer>,
    ctx: usize,
    stop_after: Option<usize>,
) -> (Generation, Vec<Sampled>, Toy, Sampler) {
    let mut toy = Toy::new(ctx);
    let mut sampler = Sampler::new(cfg.clone()).unwrap();
    let mut seen = Vec::new();
    let g = generate_with(&mut toy, &mut sampler, proposer, &[1, 2, 3, 1, 2], |s| {
        seen.push(s.clone());
        if stop_after == Some(seen.len()) {
            Flow::Stop
        } else {
            Flow::Continue
        }
    })
    .unwrap();
    (g, seen, toy, sampler)
}

#[test]
fn speculation_reproduces_the_plain_loop_token_for_token_and_state_for_state() {
    // Oracle: the same loop without a proposer, in the same run. Compared: every Sampled
    // (token, logprob, top), the finish, the toy's held tokens (the KV the plain loop
    // leaves) and the sampler's random stream afterwards.
    let mut cases = 0;
    for cfg in settings() {
        for ctx in [40, 400] {
            for stop_after in [None, Some(7), Some(23)] {
                let (plain, plain_seen, plain_toy, mut plain_s) = run(&cfg, None, ctx, stop_after);
                // The sampler's next draw tells whether its random stream moved the same.
                let row = [0.1, 0.3, 0.2, 0.25, 0.15];
                let plain_next = plain_s.sample(&row, &[]).unwrap();
                let proposers: Vec<Box<dyn Proposer>> = vec![
                    Box::new(Lookup::new(4).unwrap()),
                    Box::new(Lookup::new(15).unwrap()),
                    Box::new(Fixed(vec![0, 1, 2, 3, 0, 1, 2, 3])),
                    Box::new(Adaptive::new(Lookup::new(15).unwrap(), 15)),
                    Box::new(Adaptive::new(Fixed(vec![0, 1, 2, 3, 0, 1, 2, 3]), 8)),
                    // A draft model that is the target itself, and one that is not.
                    Box::new(Draft::new(Toy::new(ctx))),
                    Box::new(Adaptive::new(Draft::new(Other(Toy::new(ctx))), 6)),
                ];
                for (pi, mut p) in proposers.into_iter().enumerate() {
                    let (spec, spec_seen, spec_toy, mut spec_s) =
                        run(&cfg, Some(p.as_mut()), ctx, stop_after);
                    let what = format!(
                        "proposer {pi} {cfg:?} ctx {ctx} stop {stop_after:?}: {:?} {} tokens {:?}",
                        spec.finish,
                        spec.tokens.len(),
                        spec.speculation
                    );
                    assert_eq!(spec.tokens, plain.tokens, "{what}");
                    assert_eq!(spec.finish, plain.finish, "{what}");
                    assert_eq!(spec_seen, plain_seen, "{what}");
                    assert_eq!(spec_toy.held, plain_toy.held, "{what}");
                    assert_eq!(spec_s.sample(&row, &[]).unwrap(), plain_next, "{what}");
                    assert!(spec.speculation.proposed > 0, "{what}");
                    cases += 1;
                }
            }
        }
    }
    println!("speculative = plain in {cases} cases");
}

#[test]
fn accepted_drafts_save_forward_passes_and_every_finish_is_reached() {
    // Oracle: the plain run's finish and pass count; greedy on the toy is periodic, so
    // lookup must accept and need fewer passes.
    let cfg = &settings()[0];
    let (plain, _, plain_toy, _) = run(cfg, None, 400, None);
    let mut lookup = Lookup::new(8).unwrap();
    let (spec, _, spec_toy, _) = run(cfg, Some(&mut lookup), 400, None);
    let st = spec.speculation;
    println!(
        "passes plain {} speculative {}; {st:?}; {:.2} tokens per step",
        plain_toy.passes,
        spec_toy.passes,
        st.tokens_per_step(spec.tokens.len())
    );
    assert_eq!(plain.finish, Finish::Sampler(crate::StopReason::MaxTokens));
    assert!(st.accepted > 0 && st.accepted <= st.proposed, "{st:?}");
    assert!(spec_toy.passes < plain_toy.passes);
    assert_eq!(spec_toy.passes, st.steps + 1);
    assert_eq!(plain.speculation.proposed, 0);
    // A context of 20 fills before the limit, with or without speculation.
    let (plain, ..) = run(cfg, None, 20, None);
    let (spec, ..) = run(cfg, Some(&mut lookup), 20, None);
    assert_eq!(plain.finish, Finish::ContextFull);
    assert_eq!(spec.tokens, plain.tokens);
    assert_eq!(spec.finish, Finish::ContextFull);
}

/// Cell of the first three generated tokens.
fn cell(tokens: &[u32]) -> usize {
    tokens
        .iter()
        .take(3)
        .fold(0, |c, &t| c * VOCAB + t as usize)
}

#[test]
fn speculative_sampling_frequencies_match_plain_sampling_by_chi_square() {
    // Oracle: plain sampling through the same loop with independent seeds; homogeneity
    // of the first three tokens' joint frequencies (125 cells) over 100,000 draws each.
    // The same seeds would give identical streams (the test above), which says nothing
    // about the distribution; independent seeds make this a real two-sample test.
    const DRAWS: u64 = 100_000;
    let cfg = SamplerConfig {
        temperature: 1.0,
        max_tokens: 3,
        ..SamplerConfig::default()
    };
    let mut plain = vec![0u64; VOCAB.pow(3)];
    let mut spec = vec![0u64; VOCAB.pow(3)];
    let mut accepted = 0;
    let mut lookup = Lookup::new(3).unwrap();
    for i in 0..DRAWS {
        let p = run(
            &SamplerConfig {
                seed: i,
                ..cfg.clone()
            },
            None,
            64,
            None,
        );
        plain[cell(&p.0.tokens)] += 1;
        let s = run(
            &SamplerConfig {
                seed: DRAWS + i,
                ..cfg.clone()
            },
            Some(&mut lookup),
            64,
            None,
        );
        accepted += s.0.speculation.accepted;
        spec[cell(&s.0.tokens)] += 1;
    }
    let (stat, df, p) = homogeneity(&plain, &spec);
    println!("speculative vs plain: chi2 {stat:.1} df {df} p {p:.4}; {accepted} drafts accepted");
    assert!(
        accepted > DRAWS as usize / 10,
        "the drafts were rarely accepted"
    );
    assert!(p > 1e-3, "p {p}");
}

/// The textbook verify rule for a draft distribution `q`: draw d from `q`, accept it with
/// probability `accept(p, q, d)`, else draw from the residual normalize(max(0, p − q)).
fn rejection_draw(
    p: &[f64],
    q: &[f64],
    accept: fn(&[f64], &[f64], usize) -> f64,
    rng: &mut Rng,
) -> usize {
    let draw = |w: &[f64], rng: &mut Rng| {
        let total: f64 = w.iter().sum();
        let mut r = rng.next_f64() * total;
        for (i, x) in w.iter().enumerate() {
            r -= x;
            if r < 0.0 {
                return i;
            }
        }
        w.len() - 1
    };
    let d = draw(q, rng);
    if rng.next_f64() < accept(p, q, d) {
        return d;
    }
    let residual: Vec<f64> = p.iter().zip(q).map(|(a, b)| (a - b).max(0.0)).collect();
    draw(&residual, rng)
}

fn min_p_over_q(p: &[f64], q: &[f64], d: usize) -> f64 {
    (p[d] / q[d]).min(1.0)
}

/// The planted defect: the draft's own probability as the acceptance probability.
fn draft_probability(_p: &[f64], q: &[f64], d: usize) -> f64 {
    q[d]
}

#[test]
fn the_chi_square_check_rejects_accepting_with_the_drafts_probability() {
    // Test the test: the checker above must pass the correct rule min(1, p/q) and reject
    // the defect that accepts with q(d), both for a spread draft (a draft model's) and a
    // point mass (prompt lookup's, where q(d) = 1 accepts every draft). Oracle: direct
    // draws from p with an independent stream.
    const DRAWS: usize = 100_000;
    let p = [0.4, 0.3, 0.15, 0.1, 0.05];
    let spread = [0.1, 0.2, 0.3, 0.25, 0.15];
    let point = [0.0, 0.0, 1.0, 0.0, 0.0];
    let mut direct = vec![0u64; VOCAB];
    let mut rng = Rng::new(1);
    for _ in 0..DRAWS {
        direct[rejection_draw(&p, &p, min_p_over_q, &mut rng)] += 1;
    }
    for (name, q) in [("spread", spread), ("point mass", point)] {
        for (rule, accept, good) in [
            (
                "min(1, p/q)",
                min_p_over_q as fn(&[f64], &[f64], usize) -> f64,
                true,
            ),
            ("q(d)", draft_probability, false),
        ] {
            let mut rng = Rng::new(2);
            let mut counts = vec![0u64; VOCAB];
            for _ in 0..DRAWS {
                counts[rejection_draw(&p, &q, accept, &mut rng)] += 1;
            }
            let (stat, df, pv) = homogeneity(&direct, &counts);
            println!("{name} draft, accept with {rule}: chi2 {stat:.1} df {df} p {pv:.3e}");
            if good {
                assert!(pv > 1e-3, "{name} {rule}: p {pv}");
            } else {
                assert!(
                    pv < 1e-6,
                    "{name} {rule}: the checker missed the defect (p {pv})"
                );
            }
        }
    }
}

#[test]
fn a_grammar_masks_every_verified_position_in_order() {
    use crate::held::Chooser;
    use ferrite_grammar::{Constraint, Token, Vocab};
    // Oracle: the plain loop with the same held picker, and the regex itself (after "a"
    // only "b", after "c" only "a"). Drafts that break the grammar must be rejected by the
    // masked pick, never emitted.
    let mut tokens = vec![Token::Special("<eos>".into())];
    tokens.extend(["a", "b", "c", "d"].map(|t| Token::Text(t.as_bytes().to_vec())));
    let vocab = Vocab::new(tokens, &[0]).unwrap();
    let rx = Constraint::regex("(ab|ca|d)*").unwrap();
    let text = |ts: &[u32]| {
        ts.iter()
            .map(|&t| b"_abcd"[t as usize] as char)
            .collect::<String>()
    };
    for cfg in settings().into_iter().take(2) {
        // Biases hold back the end token (for some length) and "d" (so that the words the
        // grammar constrains come up).
        let cfg = SamplerConfig {
            stop_ids: vec![0],
            logit_bias: vec![(0, -3.0), (4, -1.5), (1, 0.8), (3, 0.8)],
            ..cfg
        };
        let held = || Chooser::new(Sampler::new(cfg.clone()).unwrap(), Some(&rx), &vocab).unwrap();
        let mut plain_toy = Toy::new(200);
        let plain = generate_with(&mut plain_toy, &mut held(), None, &[1, 2, 3, 1, 2], |_| {
            Flow::Continue
        })
        .unwrap();
        let proposers: Vec<Box<dyn Proposer>> = vec![
            Box::new(Lookup::new(6).unwrap()),
            Box::new(Fixed(vec![3, 3, 1, 1, 4])),
        ];
        for mut p in proposers {
            let mut toy = Toy::new(200);
            let spec = generate_with(
                &mut toy,
                &mut held(),
                Some(p.as_mut()),
                &[1, 2, 3, 1, 2],
                |_| Flow::Continue,
            )
            .unwrap();
            let out = text(&spec.tokens);
            let cut_short = spec.finish != Finish::Sampler(crate::StopReason::StopToken(0));
            assert_eq!(out, text(&plain.tokens), "{cfg:?}");
            assert_eq!(toy.held, plain_toy.held);
            let mut rest = out.as_str();
            // A token limit may cut the last word short.
            while !rest.is_empty() && !(cut_short && (rest == "a" || rest == "c")) {
                rest = ["ab", "ca", "d"]
                    .iter()
                    .find_map(|w| rest.strip_prefix(w))
                    .unwrap_or_else(|| panic!("{out} breaks the grammar"));
            }
            println!("held output {out:?} ({:?})", spec.speculation);
            assert!(spec.speculation.proposed > 0);
        }
    }
}

#[test]
fn a_draft_model_of_the_target_itself_is_always_accepted_under_greedy() {
    // Oracle: the plain loop (tokens, KV), and the draft's greedy picks being the target's
    // own: every proposed token is accepted but for the last step's, which the token limit
    // may cut short.
    let cfg = &settings()[0];
    let (plain, _, plain_toy, _) = run(cfg, None, 400, None);
    let mut draft = Adaptive::new(Draft::new(Toy::new(400)), 8);
    let (spec, _, spec_toy, _) = run(cfg, Some(&mut draft), 400, None);
    let st = spec.speculation;
    assert_eq!(spec.tokens, plain.tokens);
    assert_eq!(spec_toy.held, plain_toy.held);
    assert!(st.proposed > 0 && st.accepted + 8 >= st.proposed, "{st:?}");
    assert!(spec_toy.passes * 4 < plain_toy.passes, "{st:?}");
    let draft = draft.inner();
    assert!(draft.failure().is_none());
    assert_eq!(draft.held(), draft.session().held.as_slice());
    // The draft holds the history (prompt and output) up to the last step's drafted
    // tokens, which it keeps until the next proposal cuts them back.
    let history: Vec<u32> = [&[1, 2, 3, 1, 2][..], &spec.tokens].concat();
    let shared = draft
        .held()
        .iter()
        .zip(&history)
        .take_while(|(a, b)| a == b)
        .count();
    assert!(shared + 9 >= history.len(), "{shared} of {}", history.len());
}

#[test]
fn a_rejected_draft_suffix_leaves_the_draft_session_as_if_never_seen() {
    // Oracle: a toy fed only the history, and the toy's logits, which depend on the last
    // two held tokens and the position, so a stale drafted token would change the next
    // draft.
    let history: Vec<u32> = vec![1, 2, 3, 1, 2, 4, 0];
    let mut draft = Draft::new(Toy::new(64));
    let first = draft.propose(&history, 5);
    assert_eq!(first.len(), 5);
    // The draft session holds the history and all drafted tokens but the last.
    assert_eq!(draft.session().held, [&history[..], &first[..4]].concat());
    for accepted in 0..first.len() {
        // The target accepted `accepted` tokens, then picked a token of its own.
        let own = (first[accepted] + 1) % VOCAB as u32;
        let next: Vec<u32> = [&history[..], &first[..accepted], &[own]].concat();
        let mut rolled = Draft::new(Toy::new(64));
        rolled.propose(&history, 5);
        let again = rolled.propose(&next, 3);
        let mut fresh = Draft::new(Toy::new(64));
        let expected = fresh.propose(&next, 3);
        assert_eq!(again, expected, "accepted {accepted}");
        assert_eq!(
            rolled.session().held,
            fresh.session().held,
            "accepted {accepted}"
        );
        assert_eq!(rolled.held(), rolled.session().held.as_slice());
        // Only what it had not seen was fed: the shared prefix was kept, not recomputed.
        assert_eq!(
            rolled.session().passes,
            1 + 4 + 1 + 2,
            "accepted {accepted}"
        );
    }
}
