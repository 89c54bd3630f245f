//! `ferrite gate tokenizer|template`: exact comparison of the tokenizer and the chat template
//! against reference fixtures, as a command of its own and as the first items of `ferrite gate
//! release`.
//!
//! The commands print one line per failing fixture line and end with exactly `N passed, N
//! failed`; the exit code is 1 when anything failed, and an empty or unreadable fixture is an
//! error, so a gate can never pass by checking nothing. Nothing here may decide a line passes
//! without comparing every field the fixture holds.

use std::path::{Path, PathBuf};

use anyhow::Context;
use ferrite_tokenizer::{ChatRequest, ChatTemplate, Tokenizer};
use serde_json::Value;

use crate::models::DEFAULT_MODEL;
use crate::tokenize::load;

/// Which fixture a file holds.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum FixtureKind {
    /// `tokenizer-<model>-*.jsonl`: ids, ids with special tokens, decoded text.
    Tokenizer,
    /// `chat-<model>-*.jsonl`: rendered chat templates and their ids.
    Template,
}

/// Arguments of `ferrite gate tokenizer` and `ferrite gate template`.
#[derive(clap::Args)]
pub struct GateFileArgs {
    /// Model: a known name or a path to a .gguf file.
    #[arg(short, long, default_value = DEFAULT_MODEL)]
    pub model: String,
    /// The fixture file (JSON lines).
    #[arg(long)]
    pub fixture: PathBuf,
}

/// Checks one fixture line; returns its problems (empty when it passes).
type LineCheck<'a> = dyn Fn(&Value) -> anyhow::Result<Vec<String>> + 'a;

/// The outcome of checking every line of one fixture.
pub struct Tally {
    /// Lines that matched in every field.
    pub passed: usize,
    /// One `FAIL <id>: <problems>` line per failing line.
    pub failures: Vec<String>,
}

/// Checks every line of a fixture of `kind` with `tok`.
pub fn check_lines(kind: FixtureKind, tok: &Tokenizer, lines: &[Value]) -> anyhow::Result<Tally> {
    let check: Box<LineCheck> = match kind {
        FixtureKind::Tokenizer => Box::new(|line| check_tokenizer_line(tok, line)),
        FixtureKind::Template => {
            // A model without a template fails here, once, with the library's clear message.
            let template = tok.chat_template_renderer()?;
            Box::new(move |line| check_template_line(tok, &template, line))
        }
    };
    let mut tally = Tally {
        passed: 0,
        failures: Vec::new(),
    };
    for (n, line) in lines.iter().enumerate() {
        let id = line_id(line, n);
        match check(line) {
            Ok(problems) if problems.is_empty() => tally.passed += 1,
            Ok(problems) => tally
                .failures
                .push(format!("FAIL {id}: {}", problems.join("; "))),
            Err(err) => tally.failures.push(format!("FAIL {id}: {err:#}")),
        }
    }
    Ok(tally)
}

/// Run `ferrite gate tokenizer|template`; returns the process exit code.
pub fn run_file(kind: FixtureKind, files: &GateFileArgs) -> anyhow::Result<i32> {
    let (path, tok) = load(&files.model)?;
    let lines = read_fixture(&files.fixture)?;
    println!(
        "gate: model {} ({} tokens), fixture {} ({} lines)",
        path.display(),
        tok.vocab_size(),
        files.fixture.display(),
        lines.len()
    );
    let tally = check_lines(kind, &tok, &lines)?;
    for line in &tally.failures {
        println!("{line}");
    }
    println!("{} passed, {} failed", tally.passed, tally.failures.len());
    Ok(i32::from(!tally.failures.is_empty()))
}

/// Read a JSON-lines fixture; a missing, empty or malformed file is an error.
pub fn read_fixture(path: &Path) -> anyhow::Result<Vec<Value>> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading fixture {}", path.display()))?;
    let lines = text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| {
            serde_json::from_str(l)
                .with_context(|| format!("{}: line {} is not JSON", path.display(), i + 1))
        })
        .collect::<anyhow::Result<Vec<Value>>>()?;
    anyhow::ensure!(!lines.is_empty(), "fixture {} has no lines", path.display());
    Ok(lines)
}

fn line_id(line: &Value, n: usize) -> String {
    line.get("id")
        .and_then(Value::as_str)
        .map_or_else(|| format!("line {}", n + 1), str::to_owned)
}

fn field<'a>(line: &'a Value, key: &str) -> anyhow::Result<&'a Value> {
    line.get(key)
        .with_context(|| format!("fixture line has no {key:?}"))
}

fn str_field<'a>(line: &'a Value, key: &str) -> anyhow::Result<&'a str> {
    field(line, key)?
        .as_str()
        .with_context(|| format!("fixture field {key:?} is not a string"))
}

fn ids_field(line: &Value, key: &str) -> anyhow::Result<Vec<u32>> {
    field(line, key)?
        .as_array()
        .with_context(|| format!("fixture field {key:?} is not an array"))?
        .iter()
        .map(|v| {
            v.as_u64()
                .and_then(|x| u32::try_from(x).ok())
                .with_context(|| format!("fixture field {key:?} holds a non-id {v}"))
        })
        .collect()
}

/// Describe how two id sequences differ, or `None` when they are equal.
fn compare_ids(tok: &Tokenizer, what: &str, want: &[u32], got: &[u32]) -> Option<String> {
    if want == got {
        return None;
    }
    let at = want
        .iter()
        .zip(got)
        .position(|(a, b)| a != b)
        .unwrap_or(want.len().min(got.len()));
    let show = |ids: &[u32]| -> String {
        ids.get(at..(at + 4).min(ids.len()))
            .unwrap_or_default()
            .iter()
            .map(|&id| format!("{id}{:?}", tok.piece(id).unwrap_or("?")))
            .collect::<Vec<_>>()
            .join(" ")
    };
    Some(format!(
        "{what} differ at index {at} (want {} ids, got {}): want [{}] got [{}]",
        want.len(),
        got.len(),
        show(want),
        show(got)
    ))
}

fn check_tokenizer_line(tok: &Tokenizer, line: &Value) -> anyhow::Result<Vec<String>> {
    let text = str_field(line, "text")?;
    let ids = ids_field(line, "ids")?;
    let ids_with_special = ids_field(line, "ids_with_special")?;
    let decoded = str_field(line, "decoded")?;
    let mut problems = Vec::new();
    problems.extend(compare_ids(
        tok,
        "ids",
        &ids,
        &tok.encode(text, false, true),
    ));
    problems.extend(compare_ids(
        tok,
        "ids_with_special",
        &ids_with_special,
        &tok.encode(text, true, true),
    ));
    let got = tok.decode(&ids, true)?;
    if got != decoded {
        problems.push(format!("decoded: want {decoded:?} got {got:?}"));
    }
    Ok(problems)
}

fn check_template_line(
    tok: &Tokenizer,
    template: &ChatTemplate,
    line: &Value,
) -> anyhow::Result<Vec<String>> {
    let messages = field(line, "messages")?
        .as_array()
        .context("fixture field \"messages\" is not an array")?
        .clone();
    let req = ChatRequest {
        messages,
        add_generation_prompt: line
            .get("add_generation_prompt")
            .and_then(Value::as_bool)
            .unwrap_or(false),
        tools: line.get("tools").cloned(),
        documents: line.get("documents").cloned(),
        ..ChatRequest::default()
    };
    let want = str_field(line, "rendered")?;
    let ids = ids_field(line, "ids")?;
    let rendered = template.render(&req)?;
    let mut problems = Vec::new();
    if rendered != want {
        let at = rendered
            .char_indices()
            .zip(want.chars())
            .find(|((_, a), b)| a != b)
            .map_or(rendered.len().min(want.len()), |((i, _), _)| i);
        problems.push(format!(
            "rendered differs at byte {at}: want {:?} got {:?}",
            want.get(at..)
                .unwrap_or("")
                .chars()
                .take(40)
                .collect::<String>(),
            rendered
                .get(at..)
                .unwrap_or("")
                .chars()
                .take(40)
                .collect::<String>()
        ));
    }
    problems.extend(compare_ids(
        tok,
        "ids",
        &ids,
        &tok.encode(&rendered, false, true),
    ));
    Ok(problems)
}
