//! `ferrite score`: fidelity against reference logits fixtures, and perplexity of a text.
//!
//! The procedures are the fixtures' own (fixtures/reference/README.md) and live in
//! `ferrite-engine::score`; this module only loads, prints per-case lines and the final
//! `summary:` / `perplexity:` line that scripts read.
//!
//! A fixture in `--mode decode` runs on the chosen backend (`auto`: CUDA when a device is
//! present); `--mode prefill` and `--text` need the logits of every position and run on the
//! CPU, so `--backend cuda` with them is an error.

use std::io::Write;
use std::path::PathBuf;

use anyhow::{Context, bail};
use ferrite_engine::score::{self, ScoreMode};

use crate::backend::BackendArg;
use crate::run::{Loaded, ModelArgs};
use ferrite_engine::ScoreSession;

/// Teacher-forcing mode on the command line.
#[derive(Clone, Copy, clap::ValueEnum)]
pub enum ModeArg {
    /// Prompt and continuation in one batched call.
    Prefill,
    /// The prompt in one call, then one token per call.
    Decode,
}

/// Arguments of `ferrite score`.
#[derive(clap::Args)]
pub struct ScoreArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// Logits fixture (JSON lines, schema in fixtures/reference/README.md).
    #[arg(long, conflicts_with = "text")]
    fixture: Option<PathBuf>,
    /// Text file whose perplexity to measure, in windows of --ctx tokens.
    #[arg(long)]
    text: Option<PathBuf>,
    /// How the fixture's sequences are fed.
    #[arg(long, value_enum, default_value = "prefill")]
    mode: ModeArg,
    /// Write one row per case to this TSV file (with --fixture; perplexity has no cases).
    #[arg(long, conflicts_with = "text")]
    tsv: Option<PathBuf>,
}

/// Run `ferrite score`.
pub fn run(mut args: ScoreArgs) -> anyhow::Result<i32> {
    // Prefill scoring and perplexity need the logits of many positions per call, which only
    // the CPU backend returns; decode scoring needs the last position's only, which CUDA has.
    let one_row_per_call = args.fixture.is_some() && matches!(args.mode, ModeArg::Decode);
    if !one_row_per_call {
        match args.model.backend {
            BackendArg::Cuda => bail!(
                "the CUDA backend returns only the last position's logits, so it scores a \
                 --fixture with --mode decode only; --mode prefill and --text run on the CPU \
                 (pass --backend cpu)"
            ),
            BackendArg::Auto => args.model.backend = BackendArg::Cpu,
            BackendArg::Cpu => {}
        }
    }
    match (&args.fixture, &args.text) {
        (Some(fixture), None) => score_fixture(&args, fixture),
        (None, Some(text)) => score_text(&args, text),
        _ => bail!("give either --fixture FILE.jsonl or --text FILE"),
    }
}

fn score_fixture(args: &ScoreArgs, fixture: &PathBuf) -> anyhow::Result<i32> {
    let text = std::fs::read_to_string(fixture)
        .with_context(|| format!("reading fixture {}", fixture.display()))?;
    let cases = score::parse_logits_fixture(&text)
        .with_context(|| format!("parsing fixture {}", fixture.display()))?;
    if cases.is_empty() {
        bail!("fixture {} has no cases", fixture.display());
    }
    let loaded = Loaded::load(&args.model)?;
    if let Some(tsv) = &args.tsv {
        crate::outputs::check_not_an_input(
            "--tsv",
            tsv,
            &[("model", &loaded.path), ("fixture", fixture)],
        )?;
    }
    eprintln!("{}", loaded.backend_line());
    let longest = cases
        .iter()
        .map(|c| c.prompt_ids.len() + c.generated_ids.len())
        .max()
        .unwrap_or(0);
    if longest > loaded.ctx {
        bail!(
            "the longest case needs {longest} tokens but --ctx is {}",
            loaded.ctx
        );
    }
    let mode = match args.mode {
        ModeArg::Prefill => ScoreMode::Prefill,
        ModeArg::Decode => ScoreMode::Decode,
    };
    let mut tsv = match &args.tsv {
        Some(path) => {
            let mut f = std::io::BufWriter::new(
                std::fs::File::create(path)
                    .with_context(|| format!("creating {}", path.display()))?,
            );
            writeln!(
                f,
                "id\tfirst_token_match\tgreedy_prefix\ttop1_agree\tsteps\tmean_abs_dlogprob\tmax_abs_dlogprob\tnll\tref_nll"
            )?;
            Some(f)
        }
        None => None,
    };
    let mut session = ScoreSession {
        session: loaded.any_session()?,
        n_vocab: loaded.model.config().n_vocab,
    };
    // LongRoPE picks its factors by the session's context (llama.cpp's rule); transformers,
    // whose logits the fixtures hold, by the sequence it is given. A session of exactly the
    // case's length makes the two the same.
    let per_case = loaded.model.config().rope_long.is_some();
    let mut scores = Vec::with_capacity(cases.len());
    for case in &cases {
        if per_case {
            let len = case.prompt_ids.len() + case.generated_ids.len();
            session.session = loaded.any_session_of(len)?;
        }
        let s = score::score_case(&mut session, case, mode)
            .with_context(|| format!("scoring case {}", case.id))?;
        let mean = s.sum_abs_dlogprob / s.n_dlogprob.max(1) as f64;
        println!(
            "case {}: first_token_match={} greedy_prefix={}/{} top1={}/{} mean_abs_dlogprob={mean:.6} max_abs_dlogprob={:.6}",
            s.id,
            s.first_token_match,
            s.greedy_prefix,
            s.steps,
            s.top1_agree,
            s.steps,
            s.max_abs_dlogprob
        );
        if let Some(f) = tsv.as_mut() {
            writeln!(
                f,
                "{}\t{}\t{}\t{}\t{}\t{mean:.6}\t{:.6}\t{:.6}\t{:.6}",
                s.id,
                s.first_token_match,
                s.greedy_prefix,
                s.top1_agree,
                s.steps,
                s.max_abs_dlogprob,
                s.nll,
                s.ref_nll
            )?;
        }
        scores.push(s);
    }
    if let Some(mut f) = tsv {
        f.flush()?;
    }
    println!("{}", score::summarize(&scores));
    Ok(0)
}

fn score_text(args: &ScoreArgs, path: &PathBuf) -> anyhow::Result<i32> {
    // A window of one position predicts nothing: the result would be a perfect score made
    // of no predictions.
    if args.model.ctx < 2 {
        bail!("--ctx must be at least 2 to measure perplexity (windows of --ctx tokens)");
    }
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let loaded = Loaded::load(&args.model)?;
    eprintln!("{}", loaded.backend_line());
    let ids = loaded.tokenizer.encode(&text, true, true);
    if ids.len() < 2 {
        bail!("{} has fewer than two tokens", path.display());
    }
    let mut session = loaded.session()?;
    let result = score::perplexity(&mut session, &ids, loaded.ctx)?;
    println!("{result}");
    Ok(0)
}
