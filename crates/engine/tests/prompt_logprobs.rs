//! Prompt logprobs from the real engine against an independent computation.
//!
//! Oracle: `ferrite-model`'s forward pass over the whole prompt (`Outputs::All`) with a
//! log-softmax done here in f64. The engine computes them during its chunked prefill
//! (chunk 8, so the prompt is split) and must agree. Needs SmolLM2 (skipped with a
//! `skipped:` line when absent; a failure with FERRITE_TEST_MODELS=1).

use ferrite_engine::{
    Backend, Engine, EngineBackend, EngineConfig, GenEvent, GenRequest, SamplingParams,
    TokenLogprob,
};
use ferrite_model::{KvType, LoadOptions, Model, Outputs, Session};

fn score(engine: &Engine, prompt: &[u32]) -> (usize, Vec<TokenLogprob>) {
    let mut rx = engine
        .submit(GenRequest {
            prompt: prompt.to_vec(),
            sampling: SamplingParams {
                temperature: 0.0,
                ..SamplingParams::default()
            },
            max_tokens: 1,
            stop: Vec::new(),
            logprobs: Some(2),
            prompt_logprobs: true,
            reasoning_budget: None,
            speculative: Default::default(),
        })
        .expect("submit");
    let (mut cached, mut items) = (usize::MAX, Vec::new());
    while let Some(ev) = rx.blocking_recv() {
        match ev {
            GenEvent::Started { cached_tokens } => cached = cached_tokens,
            GenEvent::PromptLogprobs(v) => items.extend(v),
            GenEvent::Done { .. } => return (cached, items),
            GenEvent::Failed(e) => panic!("engine failed: {e}"),
            _ => {}
        }
    }
    panic!("the engine closed the stream without Done");
}

#[test]
fn engine_prompt_logprobs_match_a_full_forward_pass() {
    let Some(path) = ferrite_testkit::real_model("SmolLM2-135M-Instruct.Q4_1.gguf") else {
        return;
    };
    let engine = Engine::start(EngineConfig {
        kv: KvType::F16,
        speculation: None,
        model_path: path.clone(),
        model_id: "smollm2".into(),
        aliases: Vec::new(),
        n_ctx: 256,
        parallel: 1,
        threads: 2,
        queue_limit: 4,
        prefill_chunk: 8,
        prefix_cache: Default::default(),
        backend: EngineBackend::Cpu,
    })
    .expect("engine starts");
    let prompt = engine.tokenize(
        "The capital of France is Paris. The capital of Italy is Rome. The capital of Spain is",
        true,
        true,
    );
    assert!(prompt.len() > 16, "prompt spans several prefill chunks");
    let (cached, first) = score(&engine, &prompt);
    assert_eq!(cached, 0);
    assert_eq!(first.len(), prompt.len() - 1);
    // Again: the slot now holds this prompt, yet nothing may be reused or change.
    let (cached, again) = score(&engine, &prompt);
    assert_eq!(cached, 0);
    assert_eq!(first, again);

    let model = Model::load(&path, LoadOptions::default()).expect("model");
    let pool = ferrite_cpu::ThreadPool::new(2).expect("pool");
    let mut s = Session::new(&model, &pool, 256, KvType::F16).expect("session");
    let logits = s.eval(&prompt, Outputs::All).expect("eval");
    let mut worst = 0f64;
    for (j, item) in first.iter().enumerate() {
        let row = logits.row(j).expect("row");
        let max = row
            .iter()
            .fold(f64::NEG_INFINITY, |m, &x| m.max(f64::from(x)));
        let lse = max
            + row
                .iter()
                .map(|&x| (f64::from(x) - max).exp())
                .sum::<f64>()
                .ln();
        let want = f64::from(row[prompt[j + 1] as usize]) - lse;
        worst = worst.max((f64::from(item.logprob) - want).abs());
        assert_eq!(item.top.len(), 2);
        assert!(item.top[0].logprob >= item.top[1].logprob);
        assert!(
            f64::from(item.top[0].logprob) >= want - 1e-4,
            "top beats the target"
        );
    }
    println!(
        "{} prompt tokens scored, worst |d logprob| {worst:.2e}",
        first.len()
    );
    assert!(worst < 1e-3, "worst |d logprob| {worst}");
}
