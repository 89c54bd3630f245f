//! `ferrite tokenize` (ids and pieces of a text) and `ferrite gate tokenizer|template` (exact
//! comparison of the tokenizer and chat template against reference fixtures).
//!
//! The gates print one line per failing fixture line and end with exactly `N passed, N failed`;
//! the exit code is 1 when anything failed, and an empty or unreadable fixture is an error, so a
//! gate can never pass by checking nothing.

use std::path::{Path, PathBuf};

use anyhow::Context;
use ferrite_gguf::Gguf;
use ferrite_tokenizer::{ChatRequest, ChatTemplate, Tokenizer};
use serde_json::{Value, json};

use crate::models::DEFAULT_MODEL;

/// Arguments of `ferrite tokenize`.
#[derive(clap::Args)]
pub struct TokenizeArgs {
    /// Model: a known name or a path to a .gguf file.
    #[arg(short, long, default_value = DEFAULT_MODEL)]
    model: String,
    /// Parse special-token text (e.g. `<|im_start|>`) as the special token.
    #[arg(long)]
    special: bool,
    /// Do not add BOS/EOS even where the model's metadata asks for them.
    #[arg(long)]
    no_bos: bool,
    /// Print `{"ids": [...], "pieces": [...]}` instead of a table.
    #[arg(long)]
    json: bool,
    /// The text to tokenize.
    text: String,
}

/// Arguments of `ferrite gate`.
#[derive(clap::Args)]
pub struct GateArgs {
    #[command(subcommand)]
    kind: GateKind,
}

#[derive(clap::Subcommand)]
enum GateKind {
    /// Check ids, ids with special tokens and decoded text against a tokenizer fixture.
    Tokenizer(GateFileArgs),
    /// Check rendered chat templates and their ids against a chat fixture.
    Template(GateFileArgs),
}

#[derive(clap::Args)]
struct GateFileArgs {
    /// Model: a known name or a path to a .gguf file.
    #[arg(short, long, default_value = DEFAULT_MODEL)]
    model: String,
    /// The fixture file (JSON lines).
    #[arg(long)]
    fixture: PathBuf,
}

/// Load the tokenizer of a model given as `-m`.
fn load(model: &str) -> anyhow::Result<(PathBuf, Tokenizer)> {
    let path = crate::models::resolve(model)?;
    let gguf = Gguf::open(&path).with_context(|| format!("reading {}", path.display()))?;
    let tok = Tokenizer::from_gguf(&gguf)
        .with_context(|| format!("building the tokenizer of {}", path.display()))?;
    Ok((path, tok))
}

/// Checks one fixture line; returns its problems (empty when it passes).
type LineCheck<'a> = dyn Fn(&Value) -> anyhow::Result<Vec<String>> + 'a;

/// Run `ferrite tokenize`; returns the process exit code.
pub fn run_tokenize(args: TokenizeArgs) -> anyhow::Result<i32> {
    let (_, tok) = load(&args.model)?;
    let ids = tok.encode(&args.text, !args.no_bos, args.special);
    let pieces: Vec<&str> = ids.iter().map(|&id| tok.piece(id).unwrap_or("")).collect();
    if args.json {
        println!("{}", json!({ "ids": ids, "pieces": pieces }));
        return Ok(0);
    }
    for (&id, piece) in ids.iter().zip(&pieces) {
        let text = tok.decode(&[id], true)?;
        println!("{id:>7}  {piece:?}  {text:?}");
    }
    println!("{} tokens", ids.len());
    Ok(0)
}

/// Run `ferrite gate`; returns the process exit code.
pub fn run_gate(args: GateArgs) -> anyhow::Result<i32> {
    let files = match &args.kind {
        GateKind::Tokenizer(f) | GateKind::Template(f) => f,
    };
    let (path, tok) = load(&files.model)?;
    let lines = read_fixture(&files.fixture)?;
    println!(
        "gate: model {} ({} tokens), fixture {} ({} lines)",
        path.display(),
        tok.vocab_size(),
        files.fixture.display(),
        lines.len()
    );
    let check: Box<LineCheck> = match &args.kind {
        GateKind::Tokenizer(_) => Box::new(|line| check_tokenizer_line(&tok, line)),
        GateKind::Template(_) => {
            // A model without a template fails here, once, with the library's clear message.
            let template = tok.chat_template_renderer()?;
            Box::new(move |line| check_template_line(&tok, &template, line))
        }
    };
    let (mut passed, mut failed) = (0usize, 0usize);
    for (n, line) in lines.iter().enumerate() {
        let id = line_id(line, n);
        match check(line) {
            Ok(problems) if problems.is_empty() => passed += 1,
            Ok(problems) => {
                failed += 1;
                println!("FAIL {id}: {}", problems.join("; "));
            }
            Err(err) => {
                failed += 1;
                println!("FAIL {id}: {err:#}");
            }
        }
    }
    println!("{passed} passed, {failed} failed");
    Ok(i32::from(failed > 0))
}

/// Read a JSON-lines fixture; a missing, empty or malformed file is an error.
fn read_fixture(path: &Path) -> anyhow::Result<Vec<Value>> {
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
