//! The `ferrite` binary: command-line front end over the ferrite crates.
//!
//! Each subcommand lives in its own module with its own `clap::Args` struct. This file only
//! dispatches and turns errors into a one-line message and exit code 1; nothing here may panic
//! on user input.

mod backend;
mod bench;
mod convert;
mod gate;
mod inspect;
mod models;
mod outputs;
mod pull;
mod quantize;
#[cfg(test)]
mod readme_check;
mod run;
mod score;
mod serve;
mod synth;
mod tokenize;

use clap::{Parser, Subcommand};

/// Local LLM inference engine.
#[derive(Parser)]
#[command(name = "ferrite", version, about, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Generate text from a prompt (or chat interactively).
    Run(run::RunArgs),
    /// Download and verify a known model; prints the model's path last.
    Pull(pull::PullArgs),
    /// Show a model file's metadata, tensors and architecture summary.
    Inspect(inspect::InspectArgs),
    /// Tokenize text with a model's tokenizer.
    Tokenize(tokenize::TokenizeArgs),
    /// Check the build against reference fixtures: one fixture file, or the release gate.
    Gate(gate::GateArgs),
    /// Measure quality against reference logits or perplexity text.
    Score(score::ScoreArgs),
    /// Serve OpenAI- and Anthropic-compatible HTTP APIs.
    Serve(serve::ServeArgs),
    /// Measure speed and write receipts.
    Bench(bench::BenchArgs),
    /// Write a random-weight model of a given shape.
    Synth(synth::SynthArgs),
    /// Rewrite a GGUF model with another quantization mix (q8_0, q4_k_m, ...).
    Quantize(quantize::QuantizeArgs),
    /// Convert a Hugging Face model directory (safetensors) to GGUF.
    Convert(convert::ConvertArgs),
}

/// A reader that closes our stdout early (`ferrite tokenize --json … | head`) makes the next
/// `println!` panic with a broken pipe. That is the reader's choice, not an error: end quietly
/// with success, as `cat` or `grep` would. Every other panic keeps the default report.
fn exit_quietly_on_broken_stdout() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let message = info
            .payload()
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| info.payload().downcast_ref::<&str>().copied())
            .unwrap_or_default();
        if message.contains("failed printing to stdout") && message.contains("Broken pipe") {
            std::process::exit(0);
        }
        default(info);
    }));
}

/// The error and its causes on one line, `: `-separated. Several library errors show their
/// cause in their own message and also return it as their source (the server sends the
/// message alone to clients, so it must be whole); a cause whose text already ends the line
/// is left out rather than printed twice.
fn one_line(err: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in err.chain() {
        let text = cause.to_string();
        if line.ends_with(&text) {
            continue;
        }
        if !line.is_empty() {
            line.push_str(": ");
        }
        line.push_str(&text);
    }
    line
}

fn main() {
    exit_quietly_on_broken_stdout();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Run(args) => run::run(args),
        Command::Pull(args) => pull::run(args),
        Command::Inspect(args) => inspect::run(args),
        Command::Tokenize(args) => tokenize::run_tokenize(args),
        Command::Gate(args) => gate::run(args),
        Command::Score(args) => score::run(args),
        Command::Serve(args) => serve::run(args),
        Command::Bench(args) => bench::run(args),
        Command::Synth(args) => synth::run(args),
        Command::Quantize(args) => quantize::run(args),
        Command::Convert(args) => convert::run(args),
    };
    match result {
        Ok(code) => std::process::exit(code),
        Err(err) => {
            eprintln!("error: {}", one_line(&err));
            std::process::exit(1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::one_line;

    /// A library error that shows its cause and also returns it as its source.
    #[derive(Debug)]
    struct ShowsCause(std::io::Error);

    impl std::fmt::Display for ShowsCause {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "metadata: {}", self.0)
        }
    }

    impl std::error::Error for ShowsCause {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.0)
        }
    }

    #[test]
    fn a_cause_already_in_the_message_is_printed_once() {
        let io = std::io::Error::other("file truncated at byte 0");
        let err = anyhow::Error::new(ShowsCause(io)).context("loading m.gguf");
        assert_eq!(
            one_line(&err),
            "loading m.gguf: metadata: file truncated at byte 0"
        );
    }

    #[test]
    fn causes_not_in_the_message_are_all_printed() {
        let err = anyhow::anyhow!("inner").context("middle").context("outer");
        assert_eq!(one_line(&err), "outer: middle: inner");
    }
}
