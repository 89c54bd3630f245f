//! `ferrite bench serve`: load a running OpenAI-compatible server (ferrite serve,
//! llama-server, vLLM) with concurrent streaming completions and report, per concurrency
//! level, aggregate and per-stream decode throughput, time to first token and errors.
//!
//! It measures from the client's side only: it never starts or configures a server, so the
//! same command compares engines side by side. Failed requests are counted and reported,
//! never retried or dropped from the statistics' denominators.

use std::path::PathBuf;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde_json::{Value, json};

use super::http::{Endpoint, get_json, post_json};
use super::{prompt, receipt};

/// Arguments of `ferrite bench serve`.
#[derive(clap::Args)]
pub struct ServeBenchArgs {
    /// Server to load, e.g. http://127.0.0.1:8080.
    #[arg(long)]
    url: String,
    /// Concurrency levels (comma-separated); each level runs `concurrency × rounds` requests.
    #[arg(long, value_delimiter = ',', default_value = "1,4,16,64")]
    concurrency: Vec<usize>,
    /// Approximate prompt length in tokens; the receipt reports the server's own count.
    #[arg(long, default_value_t = 128)]
    prompt_tokens: usize,
    /// `max_tokens` of every request (`ignore_eos` is sent too, for servers that honour it).
    #[arg(long, default_value_t = 64)]
    max_tokens: usize,
    /// Sequential requests per stream at each level.
    #[arg(long, default_value_t = 2)]
    rounds: usize,
    /// `model` field of the requests (default: the first id GET /v1/models lists).
    #[arg(long)]
    model: Option<String>,
    /// Bearer token for servers started with an API key.
    #[arg(long, env = "FERRITE_API_KEY")]
    api_key: Option<String>,
    /// Seconds without a byte from the server before a request counts as failed.
    #[arg(long, default_value_t = 300)]
    timeout: u64,
    /// Write the receipt (CSV with a `# key: value` header) to this file.
    #[arg(long)]
    csv: Option<PathBuf>,
}

/// One request as the client saw it.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Sample {
    ttft: Duration,
    /// From the first to the last streamed token.
    decode: Duration,
    completion_tokens: usize,
    prompt_tokens: Option<usize>,
}

/// The outcome of one concurrency level.
#[derive(Debug)]
struct Level {
    concurrency: usize,
    wall: Duration,
    samples: Vec<Sample>,
    errors: Vec<String>,
}

/// Run `ferrite bench serve`; returns the process exit code (1 when any request failed).
pub fn run(args: ServeBenchArgs) -> anyhow::Result<i32> {
    let ep = Endpoint::parse(&args.url)?;
    if args.concurrency.is_empty() || args.concurrency.contains(&0) {
        bail!("--concurrency needs levels of at least 1");
    }
    if args.rounds == 0 || args.max_tokens == 0 || args.prompt_tokens == 0 {
        bail!("--rounds, --max-tokens and --prompt-tokens must be at least 1");
    }
    let started = receipt::utc_now();
    let model = match &args.model {
        Some(m) => m.clone(),
        None => {
            let models = get_json(
                &ep,
                "/v1/models",
                args.api_key.as_deref(),
                Duration::from_secs(args.timeout),
            )?;
            models["data"][0]["id"]
                .as_str()
                .context("GET /v1/models listed no model; pass --model")?
                .to_owned()
        }
    };
    let mut levels = Vec::new();
    for &c in &args.concurrency {
        eprintln!("bench serve: concurrency {c}, {} requests", c * args.rounds);
        let level = run_level(&ep, &args, &model, c, levels.len())?;
        if let Some(first) = level.errors.first() {
            eprintln!(
                "bench serve: {} of {} requests failed; first: {first}",
                level.errors.len(),
                c * args.rounds
            );
        }
        levels.push(level);
    }
    print_table(&levels);
    if let Some(path) = &args.csv {
        std::fs::write(path, to_csv(&args, &model, &started, &levels))
            .with_context(|| format!("writing {}", path.display()))?;
        eprintln!("receipt written to {}", path.display());
    }
    Ok(if levels.iter().any(|l| !l.errors.is_empty()) {
        1
    } else {
        0
    })
}

/// `c` streams start together; each sends `rounds` requests one after another.
fn run_level(
    ep: &Endpoint,
    args: &ServeBenchArgs,
    model: &str,
    c: usize,
    level_index: usize,
) -> anyhow::Result<Level> {
    let barrier = Arc::new(Barrier::new(c + 1));
    let timeout = Duration::from_secs(args.timeout);
    let mut handles = Vec::with_capacity(c);
    for stream in 0..c {
        let (ep, barrier) = (ep.clone(), barrier.clone());
        let bodies: Vec<String> = (0..args.rounds)
            .map(|round| {
                // A distinct first line per request keeps servers' prefix caches from
                // turning the benchmark into a cache-hit measurement.
                let tag = format!("Request {level_index}-{stream}-{round}.");
                request_body(args, model, &tag)
            })
            .collect();
        let key = args.api_key.clone();
        handles.push(
            std::thread::Builder::new()
                .name(format!("bench-stream-{stream}"))
                .spawn(move || {
                    barrier.wait();
                    bodies
                        .iter()
                        .map(|b| one_request(&ep, b, key.as_deref(), timeout))
                        .collect::<Vec<_>>()
                })
                .context("spawning a client thread")?,
        );
    }
    barrier.wait();
    let t0 = Instant::now();
    let mut samples = Vec::new();
    let mut errors = Vec::new();
    for h in handles {
        let results = h
            .join()
            .map_err(|_| anyhow::anyhow!("a client thread panicked"))?;
        for r in results {
            match r {
                Ok(s) => samples.push(s),
                Err(e) => errors.push(format!("{e:#}")),
            }
        }
    }
    Ok(Level {
        concurrency: c,
        wall: t0.elapsed(),
        samples,
        errors,
    })
}

/// A streaming completions request of about `prompt_tokens` tokens starting with `tag`.
fn request_body(args: &ServeBenchArgs, model: &str, tag: &str) -> String {
    // English-like text from the built-in word list runs about 4 tokens per 3 words.
    let words = (args.prompt_tokens * 3 / 4).max(1);
    let builtin = prompt::builtin_text();
    let text: Vec<&str> = builtin
        .split_whitespace()
        .cycle()
        .take(words)
        .collect::<Vec<_>>();
    json!({
        "model": model,
        "prompt": format!("{tag} {}", text.join(" ")),
        "max_tokens": args.max_tokens,
        "temperature": 0,
        "stream": true,
        "stream_options": {"include_usage": true},
        "ignore_eos": true,
    })
    .to_string()
}

/// Send one streaming request and time its tokens as they arrive.
fn one_request(
    ep: &Endpoint,
    body: &str,
    key: Option<&str>,
    timeout: Duration,
) -> anyhow::Result<Sample> {
    let t0 = Instant::now();
    let mut resp = post_json(ep, "/v1/completions", body, key, timeout)?;
    let mut first: Option<Instant> = None;
    let mut last = t0;
    let mut streamed = 0usize;
    let mut usage: Option<(usize, usize)> = None;
    while let Some(data) = resp.next_event()? {
        if data == "[DONE]" {
            break;
        }
        let v: Value =
            serde_json::from_str(&data).with_context(|| format!("event is not JSON: {data}"))?;
        if let Some(err) = v.get("error") {
            bail!("server error in stream: {err}");
        }
        let text = v["choices"][0]["text"].as_str().unwrap_or_default();
        if !text.is_empty() {
            let now = Instant::now();
            first.get_or_insert(now);
            last = now;
            streamed += 1;
        }
        if let Some(u) = v.get("usage").filter(|u| !u.is_null()) {
            let n = |k: &str| u[k].as_u64().map(|x| x as usize);
            if let (Some(p), Some(c)) = (n("prompt_tokens"), n("completion_tokens")) {
                usage = Some((p, c));
            }
        }
    }
    let Some(first) = first else {
        bail!("the stream ended without a token");
    };
    Ok(Sample {
        ttft: first - t0,
        decode: last - first,
        completion_tokens: usage.map_or(streamed, |(_, c)| c),
        prompt_tokens: usage.map(|(p, _)| p),
    })
}

/// Summary statistics of one level, in the receipt's column order.
fn summarize(l: &Level) -> [f64; 10] {
    let n = l.samples.len();
    let tokens: usize = l.samples.iter().map(|s| s.completion_tokens).sum();
    let prompts: Vec<f64> = l
        .samples
        .iter()
        .filter_map(|s| s.prompt_tokens.map(|p| p as f64))
        .collect();
    let mut ttft: Vec<f64> = l
        .samples
        .iter()
        .map(|s| s.ttft.as_secs_f64() * 1e3)
        .collect();
    let mut rates: Vec<f64> = l
        .samples
        .iter()
        .filter(|s| s.completion_tokens > 1 && !s.decode.is_zero())
        .map(|s| (s.completion_tokens - 1) as f64 / s.decode.as_secs_f64())
        .collect();
    let wall = l.wall.as_secs_f64();
    [
        l.concurrency as f64,
        (n + l.errors.len()) as f64,
        l.errors.len() as f64,
        mean(&prompts),
        tokens as f64,
        wall,
        if wall > 0.0 {
            tokens as f64 / wall
        } else {
            0.0
        },
        percentile(&mut rates, 50.0),
        percentile(&mut ttft, 50.0),
        percentile(&mut ttft, 99.0),
    ]
}

const COLUMNS: [&str; 10] = [
    "concurrency",
    "requests",
    "errors",
    "prompt_tokens_mean",
    "completion_tokens",
    "wall_s",
    "aggregate_tps",
    "stream_decode_tps_median",
    "ttft_ms_p50",
    "ttft_ms_p99",
];

fn mean(xs: &[f64]) -> f64 {
    if xs.is_empty() {
        f64::NAN
    } else {
        xs.iter().sum::<f64>() / xs.len() as f64
    }
}

/// Nearest-rank percentile; NaN for no data.
fn percentile(xs: &mut [f64], p: f64) -> f64 {
    if xs.is_empty() {
        return f64::NAN;
    }
    xs.sort_by(f64::total_cmp);
    let rank = ((p / 100.0) * xs.len() as f64).ceil() as usize;
    xs[rank.clamp(1, xs.len()) - 1]
}

fn print_table(levels: &[Level]) {
    println!(
        "{:>5} {:>5} {:>6} {:>8} {:>11} {:>15} {:>11} {:>11}",
        "conc", "reqs", "errors", "prompt", "agg_tok/s", "stream_tok/s", "ttft_p50", "ttft_p99"
    );
    let base = levels.first().map(|l| summarize(l)[6]);
    for l in levels {
        let s = summarize(l);
        println!(
            "{:>5} {:>5} {:>6} {:>8.0} {:>11.1} {:>15.1} {:>9.0}ms {:>9.0}ms",
            s[0], s[1], s[2], s[3], s[6], s[7], s[8], s[9]
        );
    }
    if let (Some(b), Some(l)) = (base, levels.last())
        && levels.len() > 1
        && b > 0.0
    {
        println!(
            "aggregate at concurrency {} is {:.2}x concurrency {}",
            l.concurrency,
            summarize(l)[6] / b,
            levels[0].concurrency
        );
    }
}

fn to_csv(args: &ServeBenchArgs, model: &str, started: &str, levels: &[Level]) -> String {
    let mut out = String::new();
    for (k, v) in [
        ("kind", "bench-serve".to_owned()),
        ("ferrite_version", env!("CARGO_PKG_VERSION").to_owned()),
        ("git_commit", receipt::git_commit()),
        ("date", started.to_owned()),
        ("cpu_model", receipt::cpu_model()),
        ("url", args.url.clone()),
        ("model", model.to_owned()),
        ("max_tokens", args.max_tokens.to_string()),
        ("rounds", args.rounds.to_string()),
        (
            "flags",
            std::env::args().skip(1).collect::<Vec<_>>().join(" "),
        ),
    ] {
        out.push_str(&format!("# {k}: {v}\n"));
    }
    out.push_str(&COLUMNS.join(","));
    out.push('\n');
    for l in levels {
        let row: Vec<String> = summarize(l).iter().map(|x| format!("{x:.3}")).collect();
        out.push_str(&row.join(","));
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(ttft_ms: u64, decode_ms: u64, tokens: usize) -> Sample {
        Sample {
            ttft: Duration::from_millis(ttft_ms),
            decode: Duration::from_millis(decode_ms),
            completion_tokens: tokens,
            prompt_tokens: Some(100),
        }
    }

    #[test]
    fn percentiles_use_nearest_rank() {
        let mut xs = vec![5.0, 1.0, 4.0, 2.0, 3.0];
        assert_eq!(percentile(&mut xs, 50.0), 3.0);
        assert_eq!(percentile(&mut xs, 99.0), 5.0);
        assert_eq!(percentile(&mut xs, 0.0), 1.0);
        assert!(percentile(&mut [], 50.0).is_nan());
    }

    #[test]
    fn summaries_count_errors_as_requests_and_tokens_over_wall_time() {
        let l = Level {
            concurrency: 2,
            wall: Duration::from_secs(2),
            samples: vec![sample(100, 1000, 11), sample(300, 500, 11)],
            errors: vec!["HTTP 500".into()],
        };
        let s = summarize(&l);
        assert_eq!(&s[..3], &[2.0, 3.0, 1.0]);
        assert_eq!(s[3], 100.0);
        assert_eq!(s[4], 22.0);
        assert_eq!(s[6], 11.0);
        // Per-stream rates 10/1 s and 10/0.5 s: the median (nearest rank) is the lower.
        assert_eq!(s[7], 10.0);
        assert_eq!((s[8], s[9]), (100.0, 300.0));
    }
}
