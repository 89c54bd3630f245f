//! `generate` on SmolLM2 through the decode path: greedy output against the transformers
//! fixture (up to the first near tie, fixtures README caveat 5), seeded sampling identical
//! across thread counts, and each way generation can end.
//!
//! The model comes from `$FERRITE_HOME/models` (default `~/.cache/ferrite/models`); when
//! absent the test prints `skipped: ...` and passes, unless `FERRITE_TEST_MODELS=1`.

use ferrite_cpu::ThreadPool;
use ferrite_engine::{
    Finish, Flow, LogitsCase, Sampler, SamplerConfig, StopReason, generate, parse_logits_fixture,
};
use ferrite_model::{KvType, LoadOptions, Model, Session};

fn model() -> Option<Model> {
    let path = ferrite_testkit::real_model(ferrite_testkit::SMOLLM2)?;
    Some(Model::load(&path, LoadOptions::default()).expect("model loads"))
}

fn cases() -> Vec<LogitsCase> {
    let file = &ferrite_testkit::logits_fixture("smollm2");
    let c =
        parse_logits_fixture(&std::fs::read_to_string(file).expect("readable")).expect("parses");
    assert!(!c.is_empty(), "{} is empty", file.display());
    c
}

#[test]
fn greedy_generation_reproduces_fixture_tokens_and_every_finish_reason() {
    let Some(m) = model() else {
        return;
    };
    let pool = ThreadPool::new(2).expect("pool");
    let mut s = Session::new(&m, &pool, 256, KvType::F16).expect("session");
    for case in cases().iter().filter(|c| c.prompt_ids.len() <= 40).take(2) {
        // Compare up to the first reference step whose top-1/top-2 gap is below 1e-3.
        let n = case
            .steps
            .iter()
            .position(|st| st.top.len() > 1 && st.top[0].1 - st.top[1].1 < 1e-3)
            .unwrap_or(case.steps.len());
        let mut sampler = Sampler::new(SamplerConfig {
            max_tokens: n,
            n_logprobs: 3,
            ..SamplerConfig::default()
        })
        .expect("sampler");
        s.reset();
        let mut seen = 0;
        let g = generate(&mut s, &mut sampler, &case.prompt_ids, |t| {
            assert_eq!(t.top.len(), 3);
            assert_eq!(t.top[0].0, t.token, "greedy picks the top raw token");
            seen += 1;
            Flow::Continue
        })
        .expect("generates");
        println!("{}: {} of {} tokens compared", case.id, n, case.steps.len());
        assert_eq!(g.tokens, case.generated_ids[..n], "{}", case.id);
        assert_eq!(g.finish, Finish::Sampler(StopReason::MaxTokens));
        assert_eq!((seen, s.n_past()), (n, case.prompt_ids.len() + n - 1));
    }

    let case = &cases()[0];
    let stop = case.generated_ids[3];
    let first = case
        .generated_ids
        .iter()
        .position(|&t| t == stop)
        .expect("present");
    let mut sampler = Sampler::new(SamplerConfig {
        stop_ids: vec![stop],
        ..SamplerConfig::default()
    })
    .expect("sampler");
    s.reset();
    let g = generate(&mut s, &mut sampler, &case.prompt_ids, |_| Flow::Continue).expect("gen");
    assert_eq!(g.finish, Finish::Sampler(StopReason::StopToken(stop)));
    assert_eq!(g.tokens, case.generated_ids[..first]);

    let mut sampler = Sampler::new(SamplerConfig::default()).expect("sampler");
    s.reset();
    let mut k = 0;
    let g = generate(&mut s, &mut sampler, &case.prompt_ids, |_| {
        k += 1;
        if k == 2 { Flow::Stop } else { Flow::Continue }
    })
    .expect("gen");
    assert_eq!((g.finish, g.tokens.len()), (Finish::Caller, 2));

    let mut small = Session::new(&m, &pool, case.prompt_ids.len() + 3, KvType::F16).expect("s");
    let g = generate(&mut small, &mut sampler, &case.prompt_ids, |_| {
        Flow::Continue
    })
    .expect("gen");
    assert_eq!((g.finish, g.tokens.len()), (Finish::ContextFull, 4));
}

#[test]
fn seeded_sampling_is_identical_across_thread_counts() {
    let Some(m) = model() else {
        return;
    };
    let prompt = &cases()[0].prompt_ids;
    let run = |threads: usize, seed: u64| {
        let pool = ThreadPool::new(threads).expect("pool");
        let mut s = Session::new(&m, &pool, 256, KvType::F16).expect("session");
        let mut sampler = Sampler::new(SamplerConfig {
            temperature: 0.9,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.02,
            repeat_penalty: 1.1,
            seed,
            max_tokens: 12,
            ..SamplerConfig::default()
        })
        .expect("sampler");
        generate(&mut s, &mut sampler, prompt, |_| Flow::Continue)
            .expect("gen")
            .tokens
    };
    let a = run(1, 42);
    let b = run(2, 42);
    println!("seed 42: {a:?}");
    assert_eq!(a, b);
    assert_eq!(a.len(), 12);
}
