//! `ferrite tokenize`: the ids and pieces of a text under a model's tokenizer. The exact
//! comparisons against reference fixtures are `ferrite gate` (crate::gate).

use std::path::PathBuf;

use anyhow::Context;
use ferrite_gguf::Gguf;
use ferrite_tokenizer::Tokenizer;
use serde_json::json;

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

/// Load the tokenizer of a model given as `-m`.
pub fn load(model: &str) -> anyhow::Result<(PathBuf, Tokenizer)> {
    let path = crate::models::resolve(model)?;
    let gguf = Gguf::open(&path).with_context(|| format!("reading {}", path.display()))?;
    let tok = Tokenizer::from_gguf(&gguf)
        .with_context(|| format!("building the tokenizer of {}", path.display()))?;
    Ok((path, tok))
}

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
