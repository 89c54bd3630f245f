//! Output held to a JSON schema in `ferrite run` (`--json-schema`, `--json-schema-file`,
//! as llama.cpp's CLI takes them): the schema read and compiled, and the engine's chooser
//! that holds each token to it.
//!
//! Never samples on its own: the engine's JSON sampler does, over the tokenizer's bytes.

use std::path::Path;
use std::sync::Arc;

use anyhow::Context;
use ferrite_engine::Sampler;
use ferrite_engine::json_mode::{Chooser, JsonGrammar, JsonSampler, JsonVocab};
use ferrite_engine::json_schema::JsonSchema;
use ferrite_tokenizer::Tokenizer;

/// The schema of `--json-schema` (inline text) or `--json-schema-file`, if one was given.
pub(super) fn schema(
    inline: Option<&str>,
    file: Option<&Path>,
) -> anyhow::Result<Option<JsonSchema>> {
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
    let schema = JsonSchema::compile(&value)
        .with_context(|| format!("{flag}: the schema cannot be enforced"))?;
    Ok(Some(schema))
}

/// `sampler`, held to `schema` when there is one (over `tokenizer`'s token bytes; its
/// end-of-generation tokens may end the output once the JSON is whole).
pub(super) fn chooser(
    sampler: Sampler,
    schema: Option<JsonSchema>,
    tokenizer: &Tokenizer,
) -> Chooser {
    let Some(schema) = schema else {
        return Chooser::Free(sampler);
    };
    let vocab = Arc::new(JsonVocab::new(
        tokenizer.all_token_bytes(),
        tokenizer.end_of_generation_ids(),
    ));
    Chooser::Held(JsonSampler::new(
        sampler,
        vocab,
        JsonGrammar::new(Arc::new(schema)),
    ))
}
