//! `ferrite bench`: a context-frontier sweep in one process, written as a receipt,
//! `ferrite bench --compare` to judge two receipts, and `ferrite bench serve` to load a
//! running server.
//!
//! This file owns the command line and the receipt's header; the timed loop is in
//! `bench/sweep.rs`, the file format in `bench/receipt.rs`, the judging in
//! `bench/compare.rs`, the server load in `bench/serve.rs` (over `bench/http.rs`), and the
//! speculation comparison of `--lookup` and `--draft-model` in `bench/speculate.rs`.

pub(crate) mod compare;
mod http;
mod prompt;
pub(crate) mod receipt;
mod serve;
mod speculate;
mod sweep;

use std::path::PathBuf;

use anyhow::{Context, bail};

use crate::run::{Loaded, ModelArgs};
use receipt::Receipt;

/// Arguments of `ferrite bench`.
#[derive(clap::Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct BenchArgs {
    #[command(subcommand)]
    mode: Option<BenchMode>,
    #[command(flatten)]
    model: ModelArgs,
    /// First context frontier (prompt tokens before the first decode).
    #[arg(long, default_value_t = 512)]
    ctx_start: usize,
    /// Last context frontier (always measured, even when the steps skip past it). The KV
    /// cache (--ctx) is raised to ctx-max + gen-tokens when smaller.
    #[arg(long, default_value_t = 4096)]
    ctx_max: usize,
    /// Multiply the frontier by K each step (default 2).
    #[arg(long, conflicts_with = "step_incr")]
    step_mul: Option<usize>,
    /// Add K tokens to the frontier each step.
    #[arg(long)]
    step_incr: Option<usize>,
    /// Tokens decoded at each frontier.
    #[arg(long, default_value_t = 64)]
    gen_tokens: usize,
    /// Text whose tokens form the prompt (repeated as needed); default: a built-in
    /// deterministic text.
    #[arg(long)]
    prompt_file: Option<PathBuf>,
    /// Batch sizes (comma-separated): sequences decoded together in one forward pass per
    /// step; each size gets its own receipt rows (on CUDA, one token of each per step:
    /// prompts prefill sequence by sequence).
    #[arg(long, value_delimiter = ',', default_value = "1")]
    batch: Vec<usize>,
    /// Timed sweeps; the receipt gives median, min and max over them.
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Untimed sweeps before the timed ones.
    #[arg(long, default_value_t = 1)]
    warmup: usize,
    /// Write the receipt (CSV with a `# key: value` header) to this file.
    #[arg(long)]
    csv: Option<PathBuf>,
    /// Print the receipt as JSON on stdout instead of a table.
    #[arg(long)]
    json: bool,
    /// Reset and prefill from token 0 at every frontier instead of extending the previous one.
    #[arg(long)]
    cold: bool,
    /// Feed the prompt's next tokens while decoding instead of the sampled ones, so every run
    /// does identical work (default: greedy sampling).
    #[arg(long)]
    teacher_forced: bool,
    /// Compare two receipts (OLD NEW) instead of measuring; exits 1 on a regression.
    #[arg(long, num_args = 2, value_names = ["OLD", "NEW"])]
    compare: Option<Vec<PathBuf>>,
    /// With --compare: report regressions but exit 0.
    #[arg(long, requires = "compare")]
    allow_regression: bool,
    /// Instead of the sweep: greedy decoding of --gen-tokens tokens on a repeat workload
    /// (the prompt text's first passage twice, then its start), plain and with prompt
    /// lookup (`run --lookup`), checking the outputs are identical, then reporting
    /// acceptance, tokens per step and decode tok/s of both (CPU backend).
    #[arg(long, group = "speculate",
          conflicts_with_all = ["csv", "json", "cold", "teacher_forced", "compare"])]
    lookup: bool,
    /// As `--lookup`, speculating with this draft model instead (`run --draft-model`).
    #[arg(long, value_name = "MODEL", group = "speculate",
          conflicts_with_all = ["csv", "json", "cold", "teacher_forced", "compare"])]
    draft_model: Option<String>,
    /// Most tokens `--lookup` or `--draft-model` guesses a step (1 to 15).
    #[arg(long, default_value_t = 8, requires = "speculate",
          value_parser = crate::run::draft_max_arg)]
    draft_max: usize,
}

/// What `ferrite bench` measures instead of the in-process sweep.
#[derive(clap::Subcommand)]
enum BenchMode {
    /// Load a running OpenAI-compatible server with concurrent streaming completions.
    Serve(serve::ServeBenchArgs),
}

/// Run `ferrite bench`; returns the process exit code.
pub fn run(args: BenchArgs) -> anyhow::Result<i32> {
    if let Some(BenchMode::Serve(serve_args)) = args.mode {
        return serve::run(serve_args);
    }
    if let Some(paths) = &args.compare {
        return run_compare(paths, args.allow_regression);
    }
    if args.batch.is_empty() || args.batch.contains(&0) {
        bail!("--batch needs sizes of at least 1");
    }
    let frontiers = sweep::frontiers(args.ctx_start, args.ctx_max, args.step_mul, args.step_incr)?;
    if args.gen_tokens == 0 {
        bail!("--gen-tokens must be at least 1");
    }
    if args.runs == 0 {
        bail!("--runs must be at least 1");
    }
    let need = args.ctx_max + args.gen_tokens;
    // The KV cache must hold the last frontier plus its decoded tokens.
    let model_args = ModelArgs {
        model: args.model.model.clone(),
        ctx: args.model.ctx.max(need),
        threads: args.model.threads,
        precision: args.model.precision,
        kv: args.model.kv,
        backend: args.model.backend,
        check_weights: args.model.check_weights,
    };
    let loaded = Loaded::load(&model_args)?;
    let path = crate::models::resolve(&args.model.model)?;
    if let Some(csv) = &args.csv {
        let mut inputs = vec![("model", path.as_path())];
        inputs.extend(args.prompt_file.as_deref().map(|p| ("prompt file", p)));
        crate::outputs::check_not_an_input("--csv", csv, &inputs)?;
    }
    let tokens = match &args.prompt_file {
        Some(p) => {
            let text = std::fs::read_to_string(p)
                .with_context(|| format!("reading --prompt-file {}", p.display()))?;
            prompt::tokens(&loaded.tokenizer, &text, need)?
        }
        None => prompt::tokens(&loaded.tokenizer, &prompt::builtin_text(), need)?,
    };
    if args.lookup || args.draft_model.is_some() {
        let draft = match &args.draft_model {
            Some(name) => Some(crate::run::speculate::load_draft(&loaded, name)?),
            None => None,
        };
        let plan = speculate::Plan {
            gen_tokens: args.gen_tokens,
            runs: args.runs,
            warmup: args.warmup,
            lookup: args.lookup,
            draft: draft.as_ref(),
            draft_max: args.draft_max,
        };
        speculate::run(&loaded, &speculate::repeat_prompt(&tokens), &plan)?;
        return Ok(0);
    }
    let plan = sweep::Plan {
        frontiers,
        gen_tokens: args.gen_tokens,
        runs: args.runs,
        warmup: args.warmup,
        cold: args.cold,
        teacher_forced: args.teacher_forced,
    };
    // The header (commit, date, load average) describes the state when measuring began.
    let header = header(&args, &loaded, &path, &plan)?;
    let rows = sweep::run(&loaded, &tokens, &plan, &args.batch)?;
    let receipt = Receipt { header, rows };
    if let Some(csv) = &args.csv {
        std::fs::write(csv, receipt.to_csv())
            .with_context(|| format!("writing {}", csv.display()))?;
        eprintln!("receipt written to {}", csv.display());
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&receipt.to_json())?);
    } else {
        print_table(&receipt);
    }
    Ok(0)
}

fn run_compare(paths: &[PathBuf], allow_regression: bool) -> anyhow::Result<i32> {
    let [old, new] = paths else {
        bail!("--compare takes exactly two receipts: OLD NEW");
    };
    let old = Receipt::read(old)?;
    let new = Receipt::read(new)?;
    match compare::compare(&old, &new) {
        Err(msg) => {
            eprintln!("error: {msg}");
            Ok(1)
        }
        Ok(compare::Verdict::Regression) if !allow_regression => {
            eprintln!("regression: more than 10 % slower (pass --allow-regression to accept)");
            Ok(1)
        }
        Ok(_) => Ok(0),
    }
}

/// The receipt's `# key: value` block.
fn header(
    args: &BenchArgs,
    loaded: &Loaded,
    path: &std::path::Path,
    plan: &sweep::Plan,
) -> anyhow::Result<Vec<(String, String)>> {
    let mut h: Vec<(String, String)> = vec![
        ("ferrite_version".into(), env!("CARGO_PKG_VERSION").into()),
        ("git_commit".into(), receipt::git_commit()),
        ("date".into(), receipt::utc_now()),
    ];
    // `backend=cpu threads=N simd=..` or `backend=cuda device="..." ..`: the same line
    // `ferrite run` prints.
    h.extend(key_values(&loaded.backend_line()));
    // The backend line describes one session; rows of larger batches step through another
    // path, and sample every row on the host.
    if args.batch.iter().any(|&b| b > 1) {
        let path = match loaded.cuda.as_ref().map(|c| &c.path) {
            None => "cpu batch",
            Some(crate::backend::CudaPath::Pass(_)) => "contract batch",
            Some(crate::backend::CudaPath::Model(_)) => "device batch",
        };
        h.push(("batched".into(), format!("{path}, sampling=host")));
    }
    let cores = std::thread::available_parallelism().map_or(0, usize::from);
    h.extend([
        ("cpu_model".into(), receipt::cpu_model()),
        ("cpu_cores".into(), cores.to_string()),
        (
            "load_average_at_start".into(),
            std::fs::read_to_string("/proc/loadavg")
                .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
                .unwrap_or_else(|_| "unknown".into()),
        ),
        ("model_path".into(), path.display().to_string()),
        ("model_sha256".into(), receipt::sha256_file(path)?),
        (
            "model_arch".into(),
            format!("{:?}", loaded.model.config().arch),
        ),
        (
            "model_type_mix".into(),
            receipt::type_mix(loaded.model.gguf()),
        ),
        ("kv_capacity".into(), loaded.ctx.to_string()),
        (
            "frontiers".into(),
            plan.frontiers
                .iter()
                .map(usize::to_string)
                .collect::<Vec<_>>()
                .join(" "),
        ),
        (
            "mode".into(),
            if plan.cold { "cold" } else { "incremental" }.into(),
        ),
        (
            "decode".into(),
            if plan.teacher_forced {
                "teacher-forced"
            } else {
                "greedy"
            }
            .into(),
        ),
        (
            "prompt".into(),
            args.prompt_file
                .as_ref()
                .map_or("builtin".into(), |p| p.display().to_string()),
        ),
        ("warmup".into(), plan.warmup.to_string()),
        ("runs".into(), plan.runs.to_string()),
        (
            "statistic".into(),
            "median, min, max over the timed runs".into(),
        ),
        (
            "flags".into(),
            std::env::args().skip(1).collect::<Vec<_>>().join(" "),
        ),
    ]);
    Ok(h)
}

/// `key=value` items separated by spaces; a value may be double-quoted to hold spaces.
fn key_values(line: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut rest = line.trim_start();
    while let Some((key, after)) = rest.split_once('=') {
        let (value, next) = match after.strip_prefix('"') {
            Some(quoted) => quoted.split_once('"').unwrap_or((quoted, "")),
            None => after.split_once(' ').unwrap_or((after, "")),
        };
        out.push((key.trim().to_owned(), value.to_owned()));
        rest = next.trim_start();
    }
    out
}

fn print_table(r: &Receipt) {
    use receipt::col;
    println!(
        "{:>8} {:>5} {:>9} {:>10} {:>14} {:>14}",
        "frontier", "batch", "load_ms", "ttft_ms", "prefill_tok/s", "decode_tok/s"
    );
    for row in &r.rows {
        println!(
            "{:>8} {:>5} {:>9.0} {:>10.1} {:>14.1} {:>14.1}",
            row[col("frontier")],
            row[col("batch")],
            row[col("load_ms")],
            row[col("ttft_ms_median")],
            row[col("prefill_tps_median")],
            row[col("decode_tps_median")]
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backend_line_splits_into_header_entries() {
        let kv = |l| key_values(l);
        assert_eq!(
            kv("backend=cpu threads=2 simd=avx512"),
            [
                ("backend".into(), "cpu".into()),
                ("threads".into(), "2".into()),
                ("simd".into(), "avx512".into())
            ]
        );
        assert_eq!(
            kv("backend=cuda device=\"NVIDIA H200\" cc=9.0"),
            [
                ("backend".into(), "cuda".into()),
                ("device".into(), "NVIDIA H200".into()),
                ("cc".into(), "9.0".into())
            ]
        );
    }
}
