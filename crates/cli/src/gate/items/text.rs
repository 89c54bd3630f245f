//! Items `tokenizer` and `template`: every line of every `tokenizer-<model>-*.jsonl` /
//! `chat-<model>-*.jsonl` fixture through `gate tokenizer|template`'s own line checks.
//! The planted defect is a corrupted expectation in a copy of the first line; nothing here
//! may edit a fixture file.

use anyhow::Context;
use ferrite_model::Precision;
use serde_json::Value;

use super::{Env, Outcome, Proof, Target};
use crate::gate::fixture::{FixtureKind, check_lines, read_fixture};

/// Item `tokenizer`.
pub fn tokenizer(env: &Env, t: &Target) -> anyhow::Result<Outcome> {
    run(env, t, FixtureKind::Tokenizer)
}

/// Item `template`.
pub fn template(env: &Env, t: &Target) -> anyhow::Result<Outcome> {
    run(env, t, FixtureKind::Template)
}

/// The first line of a fixture with one expectation changed.
fn plant(kind: FixtureKind, line: &Value) -> anyhow::Result<Value> {
    let mut line = line.clone();
    match kind {
        FixtureKind::Tokenizer => {
            let first = line
                .get_mut("ids")
                .and_then(Value::as_array_mut)
                .and_then(|ids| ids.first_mut())
                .context("the first tokenizer fixture line has no ids")?;
            let bumped = first.as_u64().unwrap_or(0) + 1;
            *first = bumped.into();
        }
        FixtureKind::Template => {
            let rendered = line
                .get_mut("rendered")
                .context("the first chat fixture line has no rendering")?;
            let text = rendered.as_str().unwrap_or("").to_owned();
            *rendered = format!("X{text}").into();
        }
    }
    Ok(line)
}

fn run(env: &Env, t: &Target, kind: FixtureKind) -> anyhow::Result<Outcome> {
    let tag = match t.tag() {
        Ok(tag) => tag,
        Err(reason) => return Ok(Outcome::blocked(reason)),
    };
    let prefix = match kind {
        FixtureKind::Tokenizer => "tokenizer",
        FixtureKind::Template => "chat",
    };
    let pattern = format!("{prefix}-{tag}-*.jsonl");
    let files = env.fixtures.matching(&pattern);
    if files.is_empty() {
        // A base model without a template has nothing to render: say so, not only that the
        // fixture is missing (no reference can exist for it).
        let why = if kind == FixtureKind::Template && !t.has_chat_template(env)? {
            " (the model file has no chat template, so there is nothing to render)"
        } else {
            ""
        };
        return Ok(Outcome::blocked(format!(
            "no {pattern} in {}{why}",
            env.fixtures.dir.display()
        )));
    }
    let tok = &t.cpu(env, Precision::Default)?.tokenizer;
    let mut sets = Vec::new();
    for f in &files {
        sets.push((f, read_fixture(f)?));
    }
    let planted_line = plant(kind, &sets[0].1[0])?;
    let planted = check_lines(kind, tok, &[planted_line])?;
    let planted = Proof::new(
        planted.failures.is_empty(),
        planted
            .failures
            .first()
            .cloned()
            .unwrap_or_else(|| "the corrupted line passed".into()),
    );
    let (mut passed, mut failures) = (0, Vec::new());
    for (f, lines) in &sets {
        let tally = check_lines(kind, tok, lines)?;
        passed += tally.passed;
        let name = f
            .file_name()
            .map(|n| n.to_string_lossy())
            .unwrap_or_default();
        failures.extend(tally.failures.into_iter().map(|l| format!("{name}: {l}")));
    }
    let detail = match failures.first() {
        None => format!("{passed} lines of {} files exact", files.len()),
        Some(first) => format!(
            "{} of {} lines differ; {first}",
            failures.len(),
            passed + failures.len()
        ),
    };
    let real = Proof::new(failures.is_empty(), detail)
        .count("files", files.len())
        .count("lines_passed", passed)
        .count("lines_failed", failures.len());
    Ok(Outcome::Judged { planted, real })
}
