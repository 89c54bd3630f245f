//! The vendors' chat templates of every tool-call family ferrite parses
//! (`fixtures/templates/*.jinja`) rendered by ferrite byte for byte as transformers'
//! `apply_chat_template` renders them (`tool-renders.jsonl`, written by
//! `fixtures/templates/generate.py` with jinja2 configured as transformers configures it).
//!
//! A case the reference could not render (the template raised) must fail in ferrite too.
//! `FERRITE_TEMPLATE_FIXTURES` names another fixture directory; one that is missing or holds
//! no renders is a failure, never a skip. Known differences (a jinja2 behaviour minijinja
//! lacks) are listed in [`KNOWN`] with their first differing byte and are held to exactly
//! that byte, so a fix or a new difference in them fails too.

use std::path::PathBuf;

use ferrite_tokenizer::{ChatRequest, ChatTemplate};
use serde_json::Value;

/// (template, case, first differing byte offset) where ferrite is known to differ from the
/// reference; `None` where ferrite renders a case the reference refused.
/// fixtures/templates/README.md says why.
const KNOWN: &[(&str, &str, Option<usize>)] = &[
    (HERMES_2_PRO, "plain", None),
    (HERMES_2_PRO, "answered-no-generation-prompt", None),
    (HERMES_2_PRO, "reasoning-history", None),
    (HERMES_2_PRO, "think-in-content-history", None),
    (
        HERMES_2_PRO,
        "reasoning-last-turn-no-generation-prompt",
        None,
    ),
];

/// Loops over `tools` unguarded: jinja2 raises on `tools = None`, minijinja loops zero times.
const HERMES_2_PRO: &str = "NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use.jinja";

fn dir() -> PathBuf {
    ferrite_testkit::template_fixtures_dir()
}

fn cases() -> Vec<Value> {
    let path = dir().join("tool-renders.jsonl");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e} (run fixtures/templates/generate.py)",
            path.display()
        )
    });
    let cases: Vec<Value> = text
        .lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{path:?}: {e}")))
        .collect();
    assert!(!cases.is_empty(), "{} holds no renders", path.display());
    cases
}

fn text<'a>(case: &'a Value, key: &str) -> &'a str {
    case[key].as_str().unwrap_or_default()
}

/// Ferrite's render of one reference case, its template read from the fixture directory.
fn render(case: &Value) -> Result<String, String> {
    let name = text(case, "template");
    let source = std::fs::read_to_string(dir().join(name))
        .unwrap_or_else(|e| panic!("template {name}: {e}"));
    let template = ChatTemplate::new(&source, text(case, "bos_token"), text(case, "eos_token"))
        .map_err(|e| e.to_string())?
        .with_fixed_time(case["now_unix"].as_i64().expect("now_unix"));
    template
        .render(&ChatRequest {
            messages: case["messages"].as_array().expect("messages").clone(),
            add_generation_prompt: case["add_generation_prompt"].as_bool().expect("flag"),
            tools: Some(case["tools"].clone()).filter(|t| !t.is_null()),
            extra: case["kwargs"].as_object().expect("kwargs").clone(),
            ..ChatRequest::default()
        })
        .map_err(|e| e.to_string())
}

/// Byte offset of the first difference, with a window of both texts around it.
fn first_difference(got: &str, want: &str) -> Option<(usize, String)> {
    let at = got
        .bytes()
        .zip(want.bytes())
        .position(|(a, b)| a != b)
        .or_else(|| (got.len() != want.len()).then(|| got.len().min(want.len())))?;
    let window = |s: &str| {
        let bytes = &s.as_bytes()[at.saturating_sub(40).min(s.len())..(at + 40).min(s.len())];
        String::from_utf8_lossy(bytes).into_owned()
    };
    Some((
        at,
        format!("ferrite {:?}\n   reference {:?}", window(got), window(want)),
    ))
}

/// What ferrite's render of `case` did that the reference did not; `None` when they agree.
fn mismatch(case: &Value, ours: &Result<String, String>) -> Option<(Option<usize>, String)> {
    match (ours, case.get("prompt").and_then(Value::as_str)) {
        (Ok(got), Some(want)) => first_difference(got, want).map(|(at, window)| (Some(at), window)),
        (Err(_), None) => None,
        (Err(e), Some(_)) => Some((None, format!("ferrite failed: {e}"))),
        (Ok(got), None) => Some((
            None,
            format!(
                "the reference failed ({}) but ferrite rendered {} bytes",
                text(case, "error"),
                got.len()
            ),
        )),
    }
}

#[test]
fn every_family_renders_as_transformers_does() {
    let cases = cases();
    let mut failures = Vec::new();
    let (mut exact, mut refused) = (0, 0);
    for case in &cases {
        let (name, id) = (text(case, "template"), text(case, "case"));
        let ours = render(case);
        let known = KNOWN.iter().find(|k| k.0 == name && k.1 == id).map(|k| k.2);
        match (mismatch(case, &ours), known) {
            (None, None) if ours.is_ok() => exact += 1,
            (None, None) => refused += 1,
            (Some((at, _)), Some(byte)) if at == byte && (at.is_some() || ours.is_ok()) => {}
            (found, known) => failures.push(format!(
                "{name} / {id}: {}{}",
                found.map_or_else(
                    || "matches the reference".to_string(),
                    |(at, why)| format!("first difference at byte {at:?}\n   {why}")
                ),
                known.map_or(String::new(), |b| format!(" (listed as known: {b:?})")),
            )),
        }
    }
    println!(
        "{} cases from {}: {exact} byte-exact, {refused} refused as the reference refused, {} known differences",
        cases.len(),
        dir().display(),
        KNOWN.len()
    );
    assert!(
        failures.is_empty(),
        "{} failing:\n{}",
        failures.len(),
        failures.join("\n")
    );
    assert_eq!(exact + refused + KNOWN.len(), cases.len());
}

/// The families the fixture must cover: a fixture that lost one fails here, not silently.
#[test]
fn every_tool_call_family_is_in_the_fixture() {
    let cases = cases();
    for template in [
        "Qwen3-Coder.jinja",
        "meta-llama-Llama-3.1-8B-Instruct.jinja",
        "meta-llama-Llama-3.2-3B-Instruct.jinja",
        "mistralai-Mistral-Nemo-Instruct-2407.jinja",
        "Mistral-Small-3.2-24B-Instruct-2506.jinja",
        "deepseek-ai-DeepSeek-V3.1.jinja",
        "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja",
        "deepseek-ai-DeepSeek-R1-Distill-Llama-8B.jinja",
        "GLM-4.6.jinja",
        "openai-gpt-oss-120b.jinja",
        "NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use.jinja",
    ] {
        let rendered = cases
            .iter()
            .filter(|c| c["template"] == template && c.get("prompt").is_some())
            .count();
        let with_calls = cases
            .iter()
            .filter(|c| c["template"] == template && c.get("prompt").is_some())
            .filter(|c| c["messages"].to_string().contains("tool_calls"))
            .count();
        assert!(
            rendered >= 8 && with_calls >= 2,
            "{template}: {rendered} renders, {with_calls} with calls"
        );
    }
}

/// The comparison catches a one-byte change in a reference render.
#[test]
fn a_changed_byte_in_a_reference_is_caught() {
    let cases = cases();
    let case = cases
        .iter()
        .find(|c| c["case"] == "call-dict-one-result" && c["template"] == "GLM-4.6.jinja")
        .expect("GLM-4.6 call-dict-one-result");
    let ours = render(case);
    assert!(mismatch(case, &ours).is_none());
    let mut planted = case.clone();
    let mut prompt = text(case, "prompt").to_string();
    let at = prompt.find(": ").expect("a tojson key separator");
    prompt.replace_range(at..at + 2, ":_");
    planted["prompt"] = Value::from(prompt);
    assert_eq!(mismatch(&planted, &ours).and_then(|m| m.0), Some(at + 1));
}
