//! Sampler tests: greedy choice and its ties, each filter and penalty against its
//! definition, draws against the softmax, seeded determinism, log-probabilities, stops and
//! bad settings.

use super::*;

fn cfg() -> SamplerConfig {
    SamplerConfig::default()
}

fn counts(cfg: SamplerConfig, logits: &[f32], n: usize) -> Vec<usize> {
    let mut s = Sampler::new(cfg).unwrap();
    let mut c = vec![0; logits.len()];
    for _ in 0..n {
        c[s.sample(logits, &[]).unwrap().token as usize] += 1;
    }
    c
}

#[test]
fn argmax_orders_as_total_cmp_across_chunks() {
    // The oracle is the compare loop `argmax` replaced; zeros of both signs, infinities
    // and ties, with the winner in the first, a middle and the last chunk.
    let reference = |x: &[f32]| {
        let mut best = 0;
        for (i, l) in x.iter().enumerate().skip(1) {
            if l.total_cmp(&x[best]).is_gt() {
                best = i;
            }
        }
        best as u32
    };
    let mut x: Vec<f32> = (0..300).map(|i| -((i * 37 % 101) as f32)).collect();
    for (at, v) in [
        (5, 0.0),
        (130, 0.5),
        (299, 0.75),
        (7, 0.75),
        (200, f32::INFINITY),
    ] {
        x[at] = v;
        assert_eq!(argmax(&x), reference(&x), "after x[{at}] = {v}");
    }
    assert_eq!(argmax(&[-0.0, 0.0, -0.0]), 1);
    assert_eq!(argmax(&[-0.0, -0.0]), 0);
    assert_eq!(argmax(&[f32::NEG_INFINITY; 3]), 0);
    assert_eq!(argmax(&[f32::NEG_INFINITY, -f32::MAX]), 1);
    let mut nan = vec![0.0f32; 200];
    nan[130] = f32::NAN;
    nan[190] = f32::NAN;
    assert_eq!(first_where(&nan, f32::is_nan), Some(130));
    assert_eq!(first_where(&nan[..100], f32::is_nan), None);
}

#[test]
fn greedy_picks_argmax_and_breaks_ties_to_lowest_id() {
    let mut s = Sampler::new(cfg()).unwrap();
    assert_eq!(s.sample(&[0.1, 2.0, -1.0, 1.9], &[]).unwrap().token, 1);
    assert_eq!(s.sample(&[0.1, 2.0, -1.0, 2.0], &[]).unwrap().token, 1);
    assert_eq!(s.sample(&[f32::NEG_INFINITY, -3.0], &[]).unwrap().token, 1);
}

#[test]
fn rejects_empty_nan_and_bad_settings() {
    let mut s = Sampler::new(cfg()).unwrap();
    assert_eq!(s.sample(&[], &[]), Err(SampleError::EmptyLogits));
    assert_eq!(
        s.sample(&[0.0, f32::NAN], &[]),
        Err(SampleError::NanLogit { index: 1 })
    );
    for bad in [
        SamplerConfig {
            top_p: 0.0,
            ..cfg()
        },
        SamplerConfig {
            min_p: 1.5,
            ..cfg()
        },
        SamplerConfig {
            repeat_penalty: 0.0,
            ..cfg()
        },
        SamplerConfig {
            temperature: f32::NAN,
            ..cfg()
        },
    ] {
        assert!(matches!(
            Sampler::new(bad),
            Err(SampleError::InvalidSetting { .. })
        ));
    }
}

#[test]
fn temperature_sampling_follows_the_softmax() {
    // p = softmax([ln 1, ln 2, ln 7]) = [0.1, 0.2, 0.7].
    let logits = [0.0f32, 2f32.ln(), 7f32.ln()];
    let c = counts(
        SamplerConfig {
            temperature: 1.0,
            ..cfg()
        },
        &logits,
        20_000,
    );
    for (i, p) in [0.1, 0.2, 0.7].iter().enumerate() {
        let f = c[i] as f64 / 20_000.0;
        assert!((f - p).abs() < 0.015, "token {i}: {f} vs {p}");
    }
    // A tiny temperature is effectively greedy; a huge one is near uniform.
    let c = counts(
        SamplerConfig {
            temperature: 0.01,
            ..cfg()
        },
        &logits,
        500,
    );
    assert_eq!(c[2], 500);
    let c = counts(
        SamplerConfig {
            temperature: 100.0,
            ..cfg()
        },
        &logits,
        9000,
    );
    assert!(c.iter().all(|&n| (2600..3400).contains(&n)), "{c:?}");
}

#[test]
fn top_k_keeps_only_the_k_best() {
    let logits = [1.0f32, 3.0, 2.0, 0.5];
    let c = counts(
        SamplerConfig {
            temperature: 5.0,
            top_k: 2,
            ..cfg()
        },
        &logits,
        2000,
    );
    assert_eq!(c[0] + c[3], 0, "{c:?}");
    assert!(c[1] > 0 && c[2] > 0);
    let c = counts(
        SamplerConfig {
            temperature: 5.0,
            top_k: 1,
            ..cfg()
        },
        &logits,
        200,
    );
    assert_eq!(c[1], 200);
}

#[test]
fn top_p_keeps_the_nucleus() {
    // p = [0.5, 0.3, 0.15, 0.05]: top_p 0.75 keeps the first two, 0.85 the first three.
    let logits: Vec<f32> = [0.5f32, 0.3, 0.15, 0.05].iter().map(|p| p.ln()).collect();
    let c = counts(
        SamplerConfig {
            temperature: 1.0,
            top_p: 0.75,
            ..cfg()
        },
        &logits,
        3000,
    );
    assert_eq!(c[2] + c[3], 0, "{c:?}");
    let c = counts(
        SamplerConfig {
            temperature: 1.0,
            top_p: 0.85,
            ..cfg()
        },
        &logits,
        3000,
    );
    assert_eq!(c[3], 0, "{c:?}");
    assert!(c[2] > 0);
}

#[test]
fn min_p_drops_tokens_far_below_the_best() {
    let logits: Vec<f32> = [0.6f32, 0.3, 0.05, 0.05].iter().map(|p| p.ln()).collect();
    // 0.05 / 0.6 < 0.1 ≤ 0.3 / 0.6.
    let c = counts(
        SamplerConfig {
            temperature: 1.0,
            min_p: 0.1,
            ..cfg()
        },
        &logits,
        3000,
    );
    assert_eq!(c[2] + c[3], 0, "{c:?}");
    assert!(c[1] > 0);
}

#[test]
fn repetition_penalty_divides_positive_and_multiplies_negative() {
    let mut s = Sampler::new(SamplerConfig {
        repeat_penalty: 2.0,
        ..cfg()
    })
    .unwrap();
    // Token 0 (3.0 → 1.5) loses to token 1 (2.0).
    assert_eq!(s.sample(&[3.0, 2.0, -1.0], &[0]).unwrap().token, 1);
    // Negative logits become more negative: token 1 (-1 → -2) loses to token 2 (-1.5).
    assert_eq!(s.sample(&[-5.0, -1.0, -1.5], &[1]).unwrap().token, 2);
    // Outside the window (last 1 token) the penalty does not apply.
    let mut s = Sampler::new(SamplerConfig {
        repeat_penalty: 2.0,
        penalty_last_n: 1,
        ..cfg()
    })
    .unwrap();
    assert_eq!(s.sample(&[3.0, 2.0, -1.0], &[0, 2]).unwrap().token, 0);
}

#[test]
fn frequency_and_presence_penalties_subtract() {
    let mut s = Sampler::new(SamplerConfig {
        frequency_penalty: 0.4,
        ..cfg()
    })
    .unwrap();
    // Token 0 seen 3 times: 3.0 - 1.2 = 1.8 < 2.0.
    assert_eq!(s.sample(&[3.0, 2.0], &[0, 0, 0]).unwrap().token, 1);
    assert_eq!(s.sample(&[3.0, 2.0], &[0, 0]).unwrap().token, 0);
    let mut s = Sampler::new(SamplerConfig {
        presence_penalty: 1.5,
        ..cfg()
    })
    .unwrap();
    assert_eq!(s.sample(&[3.0, 2.0], &[0]).unwrap().token, 1);
    // Ids outside the vocabulary in the history are ignored, not a panic.
    assert_eq!(s.sample(&[3.0, 2.0], &[9]).unwrap().token, 0);
}

#[test]
fn stop_ids_and_max_tokens() {
    let s = Sampler::new(SamplerConfig {
        stop_ids: vec![2, 7],
        max_tokens: 3,
        ..cfg()
    })
    .unwrap();
    assert_eq!(s.stop_reason(5, 1), None);
    assert_eq!(s.stop_reason(7, 1), Some(StopReason::StopToken(7)));
    assert_eq!(s.stop_reason(5, 3), Some(StopReason::MaxTokens));
    assert_eq!(s.stop_reason(2, 3), Some(StopReason::StopToken(2)));
    let unlimited = Sampler::new(cfg()).unwrap();
    assert_eq!(unlimited.stop_reason(5, 1_000_000), None);
}

#[test]
fn same_seed_same_tokens_other_seed_differs() {
    let logits: Vec<f32> = (0..50).map(|i| (i % 7) as f32 * 0.3).collect();
    let run = |seed| {
        let mut s = Sampler::new(SamplerConfig {
            temperature: 1.0,
            seed,
            top_k: 30,
            top_p: 0.95,
            ..cfg()
        })
        .unwrap();
        (0..40)
            .map(|_| s.sample(&logits, &[]).unwrap().token)
            .collect::<Vec<_>>()
    };
    assert_eq!(run(11), run(11));
    assert_ne!(run(11), run(12));
}

#[test]
fn logprobs_are_log_softmax_of_raw_logits() {
    let logits = [1.0f32, 3.0, 2.0, 3.0];
    let mut s = Sampler::new(SamplerConfig {
        n_logprobs: 3,
        repeat_penalty: 10.0,
        ..cfg()
    })
    .unwrap();
    // The penalty changes the choice but not the reported log-probabilities.
    let out = s.sample(&logits, &[1, 3]).unwrap();
    let z: f64 = logits.iter().map(|&l| f64::from(l).exp()).sum();
    let lp = |i: usize| (f64::from(logits[i]) - z.ln()) as f32;
    assert_eq!(out.token, 2);
    assert!((out.logprob - lp(2)).abs() < 1e-6);
    let ids: Vec<u32> = out.top.iter().map(|x| x.0).collect();
    assert_eq!(ids, [1, 3, 2]);
    for &(i, l) in &out.top {
        assert!((l - lp(i as usize)).abs() < 1e-6);
    }
    assert_eq!(raw_logprobs(&logits, 2, 3), (out.logprob, out.top));
    assert_eq!(raw_logprobs(&logits, 2, 0).1, []);
    assert_eq!(raw_logprobs(&logits, 9, 9).0, f32::NEG_INFINITY);
}

#[test]
fn stop_string_helpers() {
    let stops = vec!["</s>".to_string(), "\n\n".to_string(), String::new()];
    assert_eq!(find_stop_string("ab\n\ncd</s>", &stops), Some((2, 1)));
    assert_eq!(find_stop_string("abc", &stops), None);
    assert_eq!(partial_stop_len("hello </", &stops), 2);
    assert_eq!(partial_stop_len("hello\n", &stops), 1);
    assert_eq!(partial_stop_len("hello", &stops), 0);
    let uni = vec!["é!".to_string()];
    assert_eq!(partial_stop_len("café", &uni), 2);
}

#[test]
fn logit_biases_move_the_choice_before_the_penalties() {
    let logits = [1.0f32, 3.0, 2.0, 0.5];
    let pick = |logit_bias: Vec<(u32, f32)>, history: &[u32], frequency_penalty| {
        let mut s = Sampler::new(SamplerConfig {
            logit_bias,
            frequency_penalty,
            n_logprobs: 1,
            ..cfg()
        })
        .unwrap();
        let out = s.sample(&logits, history).unwrap();
        assert_eq!(s.next_token(&logits, history).unwrap(), out.token);
        out
    };
    assert_eq!(pick(vec![], &[], 0.0).token, 1);
    // -100 bans the best token; +100 lifts the worst; an id past the row is ignored.
    assert_eq!(pick(vec![(1, -100.0)], &[], 0.0).token, 2);
    assert_eq!(pick(vec![(3, 100.0)], &[], 0.0).token, 3);
    assert_eq!(pick(vec![(9, 100.0)], &[], 0.0).token, 1);
    // An id listed twice gets both biases (2 + 0.6 + 0.6 > 3).
    assert_eq!(pick(vec![(2, 0.6), (2, 0.6)], &[], 0.0).token, 2);
    assert_eq!(pick(vec![(2, 0.6)], &[], 0.0).token, 1);
    // Biases come first, penalties after: 2 + 1.5 - 1 = 2.5 < 3 keeps token 1, where the
    // penalty on token 1 (3 - 1 = 2 < 2 + 1.5) hands the choice to 2.
    assert_eq!(pick(vec![(2, 1.5)], &[2], 1.0).token, 1);
    assert_eq!(pick(vec![(2, 1.5)], &[1], 1.0).token, 2);
    // Reported log-probabilities stay those of the raw logits.
    let biased = pick(vec![(3, 100.0)], &[], 0.0);
    assert_eq!(biased.top[0].0, 1);
    assert_eq!(raw_logprobs(&logits, 3, 1), (biased.logprob, biased.top));
}

#[test]
fn biases_need_the_full_row_and_must_be_finite() {
    let biased = Sampler::new(SamplerConfig {
        logit_bias: vec![(0, 1.0)],
        ..cfg()
    })
    .unwrap();
    assert!(!biased.is_plain_greedy());
    assert_eq!(biased.candidates_needed(), None);
    for bad in [f32::NAN, f32::INFINITY] {
        let err = Sampler::new(SamplerConfig {
            logit_bias: vec![(0, 1.0), (4, bad)],
            ..cfg()
        })
        .unwrap_err();
        assert!(matches!(
            err,
            SampleError::InvalidSetting {
                name: "logit_bias",
                ..
            }
        ));
    }
}
