//! A reasoning budget through the real engine and model (SmolLM2).
//!
//! Oracle: the same request without a budget. With one, the output is that run's first
//! `budget` reasoning tokens, then exactly the closing marker's tokens, then the model's
//! own continuation (an answer, not a cut). Free sampling and a grammar-held output (the
//! close forced as text the grammar accepts) both. Skipped with a `skipped:` line when the
//! model is absent; a failure with FERRITE_TEST_MODELS=1.

use std::sync::Arc;

use ferrite_engine::grammar::Constraint;
use ferrite_engine::{
    Backend, Engine, EngineBackend, EngineConfig, GenEvent, GenRequest, OutputFormat,
    ReasoningBudget, SamplingParams,
};
use ferrite_model::KvType;

/// Generated token ids (end of generation excluded) of `req`.
fn generate(engine: &Engine, req: GenRequest) -> Vec<u32> {
    let mut rx = engine.submit(req).expect("submit");
    let mut ids = Vec::new();
    while let Some(ev) = rx.blocking_recv() {
        match ev {
            GenEvent::Token { id, .. } => ids.push(id),
            GenEvent::Done { .. } => return ids,
            GenEvent::Failed(e) => panic!("engine failed: {e}"),
            _ => {}
        }
    }
    panic!("the engine closed the stream without Done");
}

fn request(prompt: Vec<u32>, format: OutputFormat, budget: Option<ReasoningBudget>) -> GenRequest {
    GenRequest {
        prompt,
        sampling: SamplingParams {
            temperature: 0.0,
            format,
            ..SamplingParams::default()
        },
        max_tokens: 40,
        stop: Vec::new(),
        logprobs: None,
        prompt_logprobs: false,
        reasoning_budget: budget,
        speculative: Default::default(),
    }
}

fn position(haystack: &[u32], needle: &[u32]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

#[test]
fn a_budget_closes_real_reasoning_after_exactly_its_tokens() {
    let Some(path) = ferrite_testkit::real_model("SmolLM2-135M-Instruct.Q4_1.gguf") else {
        return;
    };
    let engine = Engine::start(EngineConfig {
        kv: KvType::F16,
        speculation: None,
        model_path: path,
        model_id: "smollm2".into(),
        aliases: Vec::new(),
        n_ctx: 256,
        parallel: 1,
        threads: 2,
        queue_limit: 4,
        prefill_chunk: 64,
        prefix_cache: Default::default(),
        backend: EngineBackend::Cpu,
    })
    .expect("engine starts");
    let open = engine.tokenize("<think>", false, true);
    let close = engine.tokenize("</think>", false, true);
    let text_close = engine.tokenize("</think>", false, false);
    const BUDGET: usize = 5;

    // Free: the prompt opened the block.
    let prompt = engine.tokenize("Why is the sky blue? Think first.\n<think>", true, true);
    let plain = generate(&engine, request(prompt.clone(), OutputFormat::Text, None));
    assert!(
        position(&plain[..BUDGET + close.len()], &close).is_none(),
        "the plain run must not close within the budget, or this test shows nothing"
    );
    let budget = ReasoningBudget {
        tokens: BUDGET,
        starts_inside: true,
        open: open.clone(),
        close: close.clone(),
        forced: close.clone(),
        text_markers: Some(("<think>", "</think>")),
    };
    let held = generate(
        &engine,
        request(prompt.clone(), OutputFormat::Text, Some(budget.clone())),
    );
    assert_eq!(
        held[..BUDGET],
        plain[..BUDGET],
        "untouched before the limit"
    );
    assert_eq!(
        held[BUDGET..BUDGET + close.len()],
        close[..],
        "then the close"
    );
    assert!(
        held.len() > BUDGET + close.len(),
        "then the answer: {held:?}"
    );

    // Held to a grammar after free reasoning, as the server holds a structured answer
    // of a reasoning model: the close is forced as text, which the grammar reads.
    let grammar = Constraint::regex("[A-Za-z .]+")
        .and_then(|c| c.after_reasoning("</think>"))
        .expect("grammar");
    let format = OutputFormat::Held(Arc::new(grammar));
    let plain = generate(&engine, request(prompt.clone(), format.clone(), None));
    let text = |ids: &[u32]| engine.detokenize(ids).expect("detokenize");
    assert!(
        !text(&plain[..BUDGET + 1]).contains("</"),
        "the plain run must not close within the budget: {:?}",
        text(&plain)
    );
    let budget = ReasoningBudget {
        forced: text_close.clone(),
        ..budget
    };
    let held = generate(&engine, request(prompt, format, Some(budget)));
    assert_eq!(held[..BUDGET], plain[..BUDGET]);
    assert_eq!(held[BUDGET..BUDGET + text_close.len()], text_close[..]);
    let answer = text(&held[BUDGET + text_close.len()..]);
    assert!(
        !answer.trim().is_empty()
            && answer
                .trim()
                .chars()
                .all(|c| c.is_ascii_alphabetic() || " .".contains(c)),
        "then the held answer: {answer:?}"
    );
    println!(
        "budget {BUDGET}: free and held outputs closed after exactly {BUDGET} reasoning tokens"
    );
}
