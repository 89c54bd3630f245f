//! Output held to a JSON schema or a grammar in `ferrite run` (`--json-schema`,
//! `--json-schema-file`, `--grammar`, as llama.cpp's CLI takes them): the schema or grammar
//! read and compiled, and the engine's chooser that holds each token to it.
//!
//! Never samples on its own: the engine's held sampler does, over the tokenizer's bytes.

use std::path::Path;

use anyhow::Context;
use ferrite_engine::Sampler;
use ferrite_engine::grammar::Constraint;
use ferrite_engine::held::{Chooser, grammar_vocab};
use ferrite_tokenizer::Tokenizer;

/// The schema of `--json-schema` (inline text) or `--json-schema-file`, or the GBNF
/// grammar of `--grammar`, if one was given (clap lets only one through).
pub(super) fn constraint(
    inline: Option<&str>,
    file: Option<&Path>,
    grammar: Option<&str>,
) -> anyhow::Result<Option<Constraint>> {
    if let Some(grammar) = grammar {
        let c = Constraint::gbnf(grammar).context("--grammar: the grammar cannot be enforced")?;
        return Ok(Some(c));
    }
    let (text, flag) = match (inline, file) {
        (Some(text), _) => (text.to_string(), "--json-schema"),
        (None, Some(path)) => (
            std::fs::read_to_string(path)
                .with_context(|| format!("reading --json-schema-file {}", path.display()))?,
            "--json-schema-file",
        ),
        (None, None) => return Ok(None),
    };
    let value: serde_json::Value =
        serde_json::from_str(&text).with_context(|| format!("{flag} is not valid JSON"))?;
    let schema = Constraint::json_schema(&value)
        .with_context(|| format!("{flag}: the schema cannot be enforced"))?;
    Ok(Some(schema))
}

/// `sampler`, held to `schema` when there is one (over `tokenizer`'s token bytes; its
/// end-of-generation tokens may end the output once the JSON is whole).
pub(super) fn chooser(
    sampler: Sampler,
    schema: Option<Constraint>,
    tokenizer: &Tokenizer,
) -> anyhow::Result<Chooser> {
    let Some(schema) = schema else {
        return Ok(Chooser::Free(sampler));
    };
    let vocab = grammar_vocab(tokenizer).context("building the grammar vocabulary")?;
    Ok(Chooser::new(sampler, Some(&schema), &vocab)?)
}
