//! Held sampling over a toy vocabulary whose logits prefer prose and an early end: the
//! output must still be one JSON object (serde_json is the oracle), end right after it,
//! and come from the best allowed token at each greedy step.

use ferrite_grammar::{Constraint, Token, Vocab};

use super::*;
use crate::sampler::SamplerConfig;

const EOS: u32 = 0;
/// Every byte JSON's structure needs has a token of its own, as in real vocabularies (byte
/// fallback), so no prefix is a dead end; the longer tokens cross several states at once.
const TOKENS: [&str; 17] = [
    "",
    "{",
    "}",
    "\"a\"",
    ": ",
    "1",
    "Hello",
    " ",
    "\"",
    "x",
    "}\n",
    ", \"b\": [",
    "]",
    ",",
    "[",
    "-",
    ":",
];

fn vocab_of(tokens: &[&str]) -> Vocab {
    let tokens = tokens
        .iter()
        .map(|t| match t {
            &"" => Token::Special("<eos>".into()),
            t => Token::Text(t.as_bytes().to_vec()),
        })
        .collect();
    Vocab::new(tokens, &[EOS]).unwrap()
}

fn held(constraint: &Constraint, tokens: &[&str], temperature: f32, seed: u64) -> Chooser {
    let cfg = SamplerConfig {
        temperature,
        seed,
        ..SamplerConfig::default()
    };
    Chooser::new(
        Sampler::new(cfg).unwrap(),
        Some(constraint),
        &vocab_of(tokens),
    )
    .unwrap()
}

/// Runs `c` until it emits EOS (returned text, true) or `steps` tokens (false).
fn run(c: &mut Chooser, row: impl Fn(usize) -> Vec<f32>, steps: usize) -> (String, bool) {
    let mut text = String::new();
    for step in 0..steps {
        let t = c.next_token(&row(step), &[]).unwrap();
        if t == EOS {
            return (text, true);
        }
        text.push_str(TOKENS[t as usize]);
    }
    (text, false)
}

#[test]
fn greedy_takes_the_best_allowed_token_and_ends_after_the_object() {
    // Preference: prose, then the end, then a space, then a key, then the separators.
    let mut row = vec![0.0f32; TOKENS.len()];
    for (id, l) in [
        (6, 9.0),
        (0, 8.0),
        (7, 5.0),
        (3, 4.0),
        (4, 3.5),
        (5, 3.0),
        (1, 2.0),
    ] {
        row[id] = l;
    }
    row[2] = 1.0;
    let mut c = held(&Constraint::json_object(), &TOKENS, 0.0, 0);
    let (text, ended) = run(&mut c, |_| row.clone(), 400);
    assert!(ended, "{text:?}");
    // The best token allowed next each step: blanks wherever JSON mode allows them, but
    // each run ends at its bound of 32 (the value is the string "a", preferred to 1; ": "
    // starts the run after the colon).
    let (run, after_colon) = (" ".repeat(32), " ".repeat(31));
    assert_eq!(
        text,
        format!("{run}{{{run}\"a\"{run}: {after_colon}\"a\"{run}}}")
    );
}

#[test]
fn a_restarted_chooser_holds_the_next_output_from_its_start() {
    let mut row = vec![0.0f32; TOKENS.len()];
    for (id, l) in [(0, 9.0), (1, 5.0), (2, 4.0)] {
        row[id] = l;
    }
    let mut chooser = held(&Constraint::json_object(), &TOKENS, 0.0, 0);
    let reply = |chooser: &mut Chooser| -> Vec<u32> {
        (0..10)
            .map(|_| chooser.next_token(&row, &[]).unwrap())
            .take_while(|&t| t != EOS)
            .collect()
    };
    assert_eq!(reply(&mut chooser), [1, 2]);
    // Whole already: without a restart only the end may follow.
    assert_eq!(reply(&mut chooser), Vec::<u32>::new());
    chooser.restart().unwrap();
    assert_eq!(reply(&mut chooser), [1, 2]);
}

#[test]
fn sampled_output_ends_only_when_whole() {
    let mut completed = 0;
    for seed in 0..100u64 {
        let mut c = held(&Constraint::json_object(), &TOKENS, 1.0, seed);
        let row = |step: usize| -> Vec<f32> {
            (0..TOKENS.len())
                .map(|i| ((i as u64 * 7919 + step as u64 * 104_729 + seed * 31) % 13) as f32 * 0.4)
                .collect()
        };
        let (text, ended) = run(&mut c, row, 300);
        if ended {
            let v: serde_json::Value =
                serde_json::from_str(&text).unwrap_or_else(|e| panic!("{text:?}: {e}"));
            assert!(v.is_object(), "{text:?}");
            completed += 1;
        }
    }
    assert!(
        completed > 50,
        "only {completed} of 100 runs closed their object"
    );
}

#[test]
fn a_vocabulary_that_cannot_open_an_object_is_an_error() {
    let mut c = held(&Constraint::json_object(), &["", "x", "}"], 1.0, 0);
    // llguidance reports the dead end itself (no token extends the text).
    assert!(c.next_token(&[0.0, 1.0, 2.0], &[]).is_err());
}

#[test]
fn a_framed_call_ends_right_after_its_markup() {
    let tokens = ["", "<tool_call>\n", "{}", "\n</tool_call>", "{", "}", "hi"];
    let call = Constraint::framed_json(
        "<tool_call>\n",
        &[serde_json::json!({"type": "object"})],
        "\n</tool_call>",
    )
    .unwrap();
    let mut c = held(&call, &tokens, 0.0, 0);
    let prefer_hi_then_eos = [5.0, 0.0, 1.0, 0.5, 0.0, 0.0, 9.0];
    let picked: Vec<u32> = (0..4)
        .map(|_| c.next_token(&prefer_hi_then_eos, &[]).unwrap())
        .collect();
    assert_eq!(picked, [1, 2, 3, EOS]);
}

#[test]
fn a_free_chooser_samples_exactly_as_its_sampler() {
    let cfg = SamplerConfig {
        temperature: 0.8,
        top_k: 5,
        seed: 7,
        ..SamplerConfig::default()
    };
    let vocab = vocab_of(&TOKENS);
    let mut free = Chooser::new(Sampler::new(cfg.clone()).unwrap(), None, &vocab).unwrap();
    let mut bare = Sampler::new(cfg).unwrap();
    for step in 0..50u64 {
        let row: Vec<f32> = (0..TOKENS.len() as u64)
            .map(|i| ((i * 31 + step * 17) % 11) as f32 * 0.3)
            .collect();
        assert_eq!(
            free.next_token(&row, &[]).unwrap(),
            bare.next_token(&row, &[]).unwrap()
        );
    }
}

/// A grammar of any token whose masks count themselves when computed, and a fake forward
/// pass that completes only once a given number of masks exist: the pass can complete
/// only if the mask of the position it makes a row for is computed while it runs.
mod ahead {
    use std::sync::{Arc, Condvar, Mutex};
    use std::time::Duration;

    use ferrite_grammar::GrammarError;

    use super::*;

    #[derive(Clone, Default)]
    struct Masks(Arc<(Mutex<usize>, Condvar)>);

    impl Masks {
        /// The fake pass: waits (up to a bound, so a serial order fails rather than
        /// hangs) until `n` masks were computed; whether they were.
        fn pass_waiting_for(&self, n: usize) -> bool {
            let (count, cv) = &*self.0;
            let done = cv
                .wait_timeout_while(count.lock().unwrap(), Duration::from_secs(3), |c| *c < n)
                .unwrap();
            !done.1.timed_out()
        }

        fn count(&self) -> usize {
            *self.0.0.lock().unwrap()
        }
    }

    impl Grammar for Masks {
        type Mask = ();

        fn next_mask(&mut self) -> Result<(), GrammarError> {
            let (count, cv) = &*self.0;
            *count.lock().unwrap() += 1;
            cv.notify_all();
            Ok(())
        }

        fn apply(_: &(), logits: &mut [f32]) -> usize {
            logits.len()
        }

        fn accept(&mut self, _: u32) -> Result<(), GrammarError> {
            Ok(())
        }

        fn reset(&mut self) -> Result<(), GrammarError> {
            Ok(())
        }

        fn is_accepting(&mut self) -> bool {
            true
        }
    }

    #[test]
    fn each_mask_is_computed_while_the_pass_before_its_pick_runs() {
        let masks = Masks::default();
        let sampler = Sampler::new(SamplerConfig::default()).unwrap();
        let mut held = HeldSampler::new(sampler, masks.clone()).unwrap();
        let row = [0.0, 2.0, 1.0];
        // Step n's pass (the prompt's for n = 1) needs mask n to exist to complete.
        for n in 1..=5 {
            assert!(
                masks.pass_waiting_for(n),
                "the pass before pick {n} completed with no mask computed for it"
            );
            assert_eq!(held.next_token(&row, &[]).unwrap(), 1);
        }
        // A forced token (a reasoning budget's close) and a restart also compute ahead.
        held.force(2).unwrap();
        assert!(
            masks.pass_waiting_for(7),
            "no mask ahead after a forced token"
        );
        held.restart().unwrap();
        assert!(masks.pass_waiting_for(8), "no mask ahead after a restart");
        // Every pick used the mask computed ahead: none was computed at the pick, nor
        // after asking whether the output is whole, which moves no position.
        assert!(held.is_complete());
        held.next_token(&row, &[]).unwrap();
        assert!(masks.pass_waiting_for(9));
        assert_eq!(masks.count(), 9);
    }
}
