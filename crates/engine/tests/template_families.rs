//! What ferrite reads from the vendors' real chat templates (`fixtures/templates`, rendered
//! by transformers' rules in `tool-renders.jsonl`): the tool syntax a prompt rendered with
//! tools teaches the model, and whether the generation prompt leaves the output inside
//! reasoning. The renders themselves are held byte-exact by ferrite-tokenizer's
//! `template_renders` test; this one holds the detection that runs on them.

use ferrite_engine::output::{OutputConfig, ReasoningFormat, ToolSyntax};
use serde_json::Value;

fn cases() -> Vec<Value> {
    let path = ferrite_testkit::template_fixtures_dir().join("tool-renders.jsonl");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e} (run fixtures/templates/generate.py)",
            path.display()
        )
    });
    text.lines()
        .map(|line| serde_json::from_str(line).expect("a JSON line"))
        .collect()
}

/// The reference prompt of one template's case; a missing case is a failure.
fn prompt<'a>(cases: &'a [Value], template: &str, case: &str) -> &'a str {
    cases
        .iter()
        .find(|c| c["template"] == template && c["case"] == case)
        .and_then(|c| c["prompt"].as_str())
        .unwrap_or_else(|| panic!("{template} / {case}: no rendered prompt in the fixture"))
}

fn source(template: &str) -> String {
    let path = ferrite_testkit::template_fixtures_dir().join(template);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn each_family_prompt_teaches_its_own_tool_syntax() {
    let cases = cases();
    // (template, case whose prompt is read, the syntax it must select)
    let expected = [
        ("Qwen3-Coder.jinja", "tools", ToolSyntax::Qwen3Coder),
        (
            "meta-llama-Llama-3.1-8B-Instruct.jinja",
            "tools",
            ToolSyntax::Llama3,
        ),
        (
            "meta-llama-Llama-3.1-8B-Instruct.jinja",
            "builtin-tool-call",
            ToolSyntax::Llama3,
        ),
        (
            "meta-llama-Llama-3.2-3B-Instruct.jinja",
            "tools",
            ToolSyntax::Llama3,
        ),
        (
            "mistralai-Mistral-Nemo-Instruct-2407.jinja",
            "tools",
            ToolSyntax::Mistral,
        ),
        (
            "Mistral-Small-3.2-24B-Instruct-2506.jinja",
            "tools",
            ToolSyntax::Mistral,
        ),
        ("GLM-4.6.jinja", "tools", ToolSyntax::Glm45),
        ("openai-gpt-oss-120b.jinja", "tools", ToolSyntax::Harmony),
        (
            "NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use.jinja",
            "tools",
            ToolSyntax::Hermes,
        ),
        // DeepSeek's templates do not render `tools`; their markers appear only in a
        // history that holds a call.
        (
            "deepseek-ai-DeepSeek-V3.1.jinja",
            "call-dict-one-result",
            ToolSyntax::DeepSeek,
        ),
        (
            "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja",
            "call-dict-one-result",
            ToolSyntax::DeepSeek,
        ),
        (
            "deepseek-ai-DeepSeek-R1-Distill-Llama-8B.jinja",
            "call-string-one-result",
            ToolSyntax::DeepSeek,
        ),
    ];
    for (template, case, syntax) in expected {
        let prompt = prompt(&cases, template, case);
        assert_eq!(
            ToolSyntax::detect(prompt),
            Some(syntax),
            "{template} / {case}"
        );
    }
}

/// The DeepSeek templates drop `tools`: the prompt with tools equals the one without, which
/// is what the server's refusal of unrenderable tools compares.
#[test]
fn deepseek_templates_render_no_tools() {
    let cases = cases();
    for template in [
        "deepseek-ai-DeepSeek-V3.1.jinja",
        "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja",
        "deepseek-ai-DeepSeek-R1-Distill-Llama-8B.jinja",
    ] {
        assert_eq!(
            prompt(&cases, template, "tools"),
            prompt(&cases, template, "plain"),
            "{template}"
        );
    }
}

#[test]
fn the_generation_prompt_decides_where_the_output_starts() {
    let cases = cases();
    // (template, case, reasoning format resolved from the source, output starts in reasoning)
    let expected = [
        // R1-Distill-Llama always opens `<think>\n`.
        (
            "deepseek-ai-DeepSeek-R1-Distill-Llama-8B.jinja",
            "plain",
            ReasoningFormat::Think,
            true,
        ),
        // llama.cpp's R1-Distill-Qwen copy closes the block unless `enable_thinking` is true.
        (
            "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja",
            "plain",
            ReasoningFormat::Think,
            false,
        ),
        (
            "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja",
            "plain+enable_thinking-on",
            ReasoningFormat::Think,
            true,
        ),
        (
            "deepseek-ai-DeepSeek-V3.1.jinja",
            "plain",
            ReasoningFormat::Think,
            false,
        ),
        (
            "deepseek-ai-DeepSeek-V3.1.jinja",
            "plain+thinking-on",
            ReasoningFormat::Think,
            true,
        ),
        (
            "deepseek-ai-DeepSeek-V3.1.jinja",
            "plain+enable_thinking-on",
            ReasoningFormat::Think,
            true,
        ),
        // GLM lets the model open `<think>` itself; off writes the closed empty block.
        ("GLM-4.6.jinja", "plain", ReasoningFormat::Think, false),
        (
            "GLM-4.6.jinja",
            "plain+enable_thinking-off",
            ReasoningFormat::Think,
            false,
        ),
        (
            "openai-gpt-oss-120b.jinja",
            "plain",
            ReasoningFormat::Harmony,
            false,
        ),
        ("Qwen3-Coder.jinja", "plain", ReasoningFormat::Think, false),
    ];
    for (template, case, format, starts) in expected {
        let prompt = prompt(&cases, template, case);
        let config =
            OutputConfig::for_prompt(ReasoningFormat::Auto, &source(template), prompt, None);
        assert_eq!(
            (config.reasoning, config.starts_in_reasoning),
            (format, starts),
            "{template} / {case}"
        );
    }
}
