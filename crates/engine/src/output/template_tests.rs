//! Reasoning detection from real chat templates (`fixtures/templates/`): the rendered
//! prompt matches the jinja2 reference byte for byte, template variables
//! (`enable_thinking`) reach the template, and whether the output starts inside reasoning
//! follows the generation prompt the template wrote.

use std::path::PathBuf;

use ferrite_tokenizer::{ChatRequest, ChatTemplate};
use serde_json::Value;

use super::{Collected, OutputConfig, OutputParser, ReasoningFormat};

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/templates")
}

/// Every case of `renders.jsonl`, with its template's source.
fn cases() -> Vec<(String, Value)> {
    let path = dir().join("renders.jsonl");
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (fixtures/templates/generate.py)", path.display()));
    let cases: Vec<(String, Value)> = text
        .lines()
        .map(|line| {
            let case: Value = serde_json::from_str(line).unwrap();
            let name = case["template"].as_str().unwrap();
            let source = std::fs::read_to_string(dir().join(name)).unwrap();
            (source, case)
        })
        .collect();
    assert!(cases.len() >= 8, "{} cases", cases.len());
    cases
}

fn render(source: &str, case: &Value) -> String {
    let template = ChatTemplate::new(source, "", "<|im_end|>").unwrap();
    template
        .render(&ChatRequest {
            messages: case["messages"].as_array().unwrap().clone(),
            add_generation_prompt: true,
            extra: case["kwargs"].as_object().unwrap().clone(),
            ..ChatRequest::default()
        })
        .unwrap()
}

/// What the reference's template and variables promise: the thinking-only template opens
/// `<think>` unless `enable_thinking` is false; the hybrid one never opens it.
fn opens_think(case: &Value) -> bool {
    case["template"] == "qwen3-thinking.jinja" && case["kwargs"]["enable_thinking"] != false
}

#[test]
fn templates_render_as_the_reference_and_their_kwargs_change_detection() {
    for (source, case) in cases() {
        let prompt = render(&source, &case);
        assert_eq!(prompt, case["prompt"].as_str().unwrap(), "{case}");
        let config = OutputConfig::for_prompt(ReasoningFormat::Auto, &source, &prompt, None);
        assert_eq!(config.reasoning, ReasoningFormat::Think, "{case}");
        assert_eq!(config.starts_in_reasoning, opens_think(&case), "{case}");
        // `none` never starts in reasoning, whatever the template wrote.
        let none = OutputConfig::for_prompt(ReasoningFormat::None, &source, &prompt, None);
        assert!(!none.starts_in_reasoning, "{case}");
    }
}

/// The same model text means reasoning then answer when the prompt opened `<think>`, and
/// plain answer when it did not (`enable_thinking: false` closed the block in the prompt, or
/// the hybrid template leaves opening it to the model).
#[test]
fn output_is_read_as_the_prompt_left_it() {
    for (source, case) in cases() {
        let prompt = render(&source, &case);
        let config = OutputConfig::for_prompt(ReasoningFormat::Auto, &source, &prompt, None);
        let mut parser = OutputParser::new(config);
        let mut out = Collected::default();
        for piece in ["near the Seine", "</th", "ink>\n\nIn France."] {
            out.extend(parser.push(piece, false));
        }
        out.extend(parser.finish().events);
        if opens_think(&case) {
            assert_eq!(
                (out.reasoning.as_str(), out.content.as_str()),
                ("near the Seine", "In France."),
                "{case}"
            );
        } else {
            // A close with no open is a stray marker: dropped, never a reasoning end.
            assert_eq!(out.reasoning, "", "{case}");
            assert_eq!(out.content, "near the Seine\n\nIn France.", "{case}");
        }
    }
}
