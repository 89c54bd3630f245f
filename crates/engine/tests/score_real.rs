//! `score_case` / `summarize` on the two real development models against the transformers
//! logits fixtures, through a real `Session` in both scoring modes, plus a test of the test:
//! logits scaled by 1.5 (same argmax, wrong magnitude) must fail the bounds.
//!
//! Models come from `$FERRITE_HOME/models` (default `~/.cache/ferrite/models`); when absent
//! the test prints `skipped: ...` and passes, unless `FERRITE_TEST_MODELS=1` requests them.
//! Fixtures come from `FERRITE_FIXTURES` when set, else `fixtures/reference`.

use ferrite_testkit::real_model;

use ferrite_cpu::ThreadPool;
use ferrite_engine::{
    LogitsCase, LogitsSource, ScoreError, ScoreMode, parse_logits_fixture, score_case, summarize,
};
use ferrite_model::{KvType, LoadOptions, Model, Session};

fn fixture_cases(tag: &str) -> Vec<LogitsCase> {
    let file = &ferrite_testkit::logits_fixture(tag);
    let cases = parse_logits_fixture(&std::fs::read_to_string(file).expect("readable"))
        .expect("fixture parses");
    assert!(!cases.is_empty(), "{} is empty", file.display());
    cases
}

/// Multiplies every logit by a factor: the argmax survives, the distribution does not.
struct Scaled<'a, 'm> {
    inner: &'a mut Session<'m>,
    factor: f32,
    buf: Vec<f32>,
}

impl LogitsSource for Scaled<'_, '_> {
    fn n_vocab(&self) -> usize {
        self.inner.n_vocab()
    }
    fn reset(&mut self) {
        LogitsSource::reset(self.inner);
    }
    fn eval(&mut self, tokens: &[u32], from: usize) -> Result<&[f32], ScoreError> {
        let out = LogitsSource::eval(self.inner, tokens, from)?;
        self.buf.clear();
        self.buf.extend(out.iter().map(|v| v * self.factor));
        Ok(&self.buf)
    }
}

fn check(file: &str, tag: &str) {
    let Some(path) = real_model(file) else {
        return;
    };
    let model = Model::load(&path, LoadOptions::default()).expect("model loads");
    let pool = ThreadPool::new(2).expect("pool");
    let mut session = Session::new(&model, &pool, 1024, KvType::F16).expect("session");
    let cases = fixture_cases(tag);
    let short: Vec<&LogitsCase> = cases
        .iter()
        .filter(|c| c.prompt_ids.len() <= 40)
        .take(3)
        .collect();
    let mut scores = Vec::new();
    for (i, case) in short.iter().enumerate() {
        let mode = if i == 0 {
            ScoreMode::Decode
        } else {
            ScoreMode::Prefill
        };
        let s = score_case(&mut session, case, mode).expect("scores");
        println!("{tag} {mode:?} {s:?}");
        scores.push(s);
    }
    let sum = summarize(&scores);
    println!("{tag} {sum}");
    assert_eq!(sum.first_token_match, sum.cases, "{sum}");
    assert!(
        sum.mean_abs_dlogprob <= 0.08 && sum.top1_agreement >= 0.97,
        "{sum}"
    );
    assert!((sum.nll - sum.ref_nll).abs() < 0.05, "{sum}");

    let mut scaled = Scaled {
        inner: &mut session,
        factor: 1.5,
        buf: Vec::new(),
    };
    let bad = summarize(&[score_case(&mut scaled, short[1], ScoreMode::Prefill).expect("scores")]);
    println!("{tag} logits x1.5: {bad}");
    assert!(
        bad.mean_abs_dlogprob > 0.08,
        "scaled logits not caught: {bad}"
    );
}

#[test]
fn scores_smollm2_fixture_cases() {
    check("SmolLM2-135M-Instruct.Q4_1.gguf", "smollm2");
}

#[test]
fn scores_gemma3_fixture_cases() {
    check("gemma-3-270m-q4_k_m.gguf", "gemma3");
}

/// `perplexity` over the first 512-token window of the GPL-3 text against the fixture's
/// per-window NLL (`nll-<model>.json`, windows[0]). Token ids come from ferrite-tokenizer;
/// their count is checked against the fixture first so a tokenizer difference cannot pass
/// as a model difference.
fn first_window(file: &str, tag: &str) {
    use sha2::Digest;
    let Some(path) = real_model(file) else {
        return;
    };
    let dir = ferrite_testkit::fixtures_dir();
    let fx: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(dir.join(format!("nll-{tag}.json"))).expect("nll fixture"),
    )
    .expect("nll fixture parses");
    let text_path = ferrite_testkit::nll_text();
    let text = std::fs::read(&text_path)
        .unwrap_or_else(|e| panic!("text fixture {}: {e}", text_path.display()));
    let sha = format!("{:x}", sha2::Sha256::digest(&text));
    assert_eq!(
        sha,
        fx["text_file_sha256"].as_str().expect("sha"),
        "{} is not the nll fixture's text",
        text_path.display()
    );
    let model = Model::load(&path, LoadOptions::default()).expect("model loads");
    let tok = ferrite_tokenizer::Tokenizer::from_gguf(model.gguf()).expect("tokenizer");
    let ids = tok.encode(std::str::from_utf8(&text).expect("utf-8"), true, true);
    assert_eq!(
        ids.len() as u64,
        fx["n_tokens"].as_u64().expect("n_tokens"),
        "{tag} tokens"
    );
    let pool = ThreadPool::new(2).expect("pool");
    let mut session = Session::new(&model, &pool, 512, KvType::F16).expect("session");
    let p = ferrite_engine::perplexity(&mut session, &ids[..512], 512).expect("perplexity");
    let w0 = &fx["windows"][0];
    let want = w0["sum_nll"].as_f64().expect("sum_nll") / w0["n_scored"].as_f64().expect("n");
    println!("{tag} window 0: {p} (reference mean nll {want:.8})");
    assert_eq!((p.windows, p.tokens), (1, 511));
    assert!((p.nll - want).abs() < 5e-3, "{tag}: {} vs {want}", p.nll);
}

#[test]
fn perplexity_first_window_smollm2() {
    first_window("SmolLM2-135M-Instruct.Q4_1.gguf", "smollm2");
}

#[test]
fn perplexity_first_window_gemma3() {
    first_window("gemma-3-270m-q4_k_m.gguf", "gemma3");
}
