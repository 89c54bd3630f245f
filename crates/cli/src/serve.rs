//! `ferrite serve`: OpenAI- and Anthropic-compatible HTTP APIs over one model.
//!
//! The socket is bound first and answers `/health` with 503 while the model loads on the
//! engine thread, so supervisors can tell "starting" from "dead". The listening address is
//! printed to stderr as `listening on http://ADDR` (with `--port 0` that is how clients
//! learn the port).

pub(crate) mod listener;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use ferrite_cuda::CudaBackend;
use ferrite_engine::prefix::PrefixCacheConfig;
use ferrite_engine::{Engine, EngineBackend, EngineConfig, Speculation};

use crate::backend::BackendArg;
use crate::run::KvArg;
use ferrite_server::{AppState, Cors, ServerConfig, router};

/// Arguments of `ferrite serve`.
#[derive(clap::Args)]
pub struct ServeArgs {
    /// Model: a known name (see `ferrite pull`) or a GGUF path.
    #[arg(short, long, default_value = crate::models::DEFAULT_MODEL)]
    model: String,
    /// Address to bind; loopback by default (the API has no TLS).
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// Port to bind; 0 picks a free one.
    #[arg(long, default_value_t = 8080)]
    port: u16,
    /// Context length per slot, in tokens (clamped to the model's).
    #[arg(long, default_value_t = 4096)]
    ctx: usize,
    /// Sequences decoded concurrently (slots); each keeps its own KV cache.
    #[arg(long, default_value_t = 4)]
    parallel: usize,
    /// Requests that may wait for a slot before new ones get 429.
    #[arg(long, default_value_t = 64)]
    queue: usize,
    /// Compute threads (default: all cores).
    #[arg(long, value_parser = crate::backend::threads_arg())]
    threads: Option<usize>,
    /// Require this key (`Authorization: Bearer KEY` or `x-api-key: KEY`).
    #[arg(long, conflicts_with = "api_key_file")]
    api_key: Option<String>,
    /// Read the required key from this file (trimmed).
    #[arg(long)]
    api_key_file: Option<PathBuf>,
    /// Let web pages of this origin (`http://host:port`) call the API from a browser;
    /// repeat for several, or `*` for any. None by default.
    #[arg(long = "cors-origin", value_name = "ORIGIN")]
    cors_origins: Vec<String>,
    /// Seconds a request's headers may take to arrive, counted from the connection being
    /// ready for the request (accepted, or its previous response sent); slower clients are
    /// disconnected.
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..))]
    header_timeout_secs: u64,
    /// Seconds a connection may stay silent while none of its requests is being handled
    /// before it is closed (a request being answered is never idle).
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..))]
    idle_timeout_secs: u64,
    /// Seconds a request's body may take to arrive, counted from its headers.
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..))]
    body_timeout_secs: u64,
    /// Connections served at once; further clients wait to be accepted until one closes.
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u64).range(1..=65_536))]
    max_connections: u64,
    /// Largest accepted request body in bytes; larger ones get 413.
    #[arg(long, default_value_t = 8 << 20)]
    max_body_bytes: usize,
    /// Most prompt tokens evaluated per scheduler step over all slots (bounds the stall
    /// that long prompts cause to running streams).
    #[arg(long, default_value_t = 128)]
    prefill_chunk: usize,
    /// Keep prompt-prefix checkpoints (KV snapshots) in this directory, so a restarted
    /// server, or another one sharing the directory, reuses them.
    #[arg(long)]
    kv_disk_dir: Option<PathBuf>,
    /// Disk budget of `--kv-disk-dir` in MiB; least recently used files are evicted.
    #[arg(long, default_value_t = 4096, requires = "kv_disk_dir")]
    kv_disk_space_mb: u64,
    /// Memory budget in MiB of the prefix cache shared by all slots (0 = off; the CPU
    /// backend only).
    #[arg(long, default_value_t = 512)]
    kv_mem_space_mb: u64,
    /// Compute backend: CUDA when a device answers (auto), or the one named; `cuda` without
    /// a device is an error.
    #[arg(long, value_enum, default_value = "auto")]
    backend: BackendArg,
    /// KV cache element type of every slot (q8: the CPU backend only).
    #[arg(long, value_enum, default_value = "f16")]
    kv: KvArg,
    /// A further name clients may give in `model` fields; repeat for several.
    #[arg(long = "alias", value_name = "NAME")]
    aliases: Vec<String>,
    #[command(flatten)]
    reasoning: crate::run::reasoning::ReasoningFormatArg,
    /// Most tokens a generation may spend reasoning (inside `<think>…</think>`, or a
    /// harmony `analysis` message) when its request sets no budget
    /// (`thinking.budget_tokens`, `thinking_token_budget`): at the limit the block is
    /// closed and the answer follows. Unset: no limit.
    #[arg(long, value_name = "N")]
    reasoning_budget: Option<usize>,
    /// The tool-call syntax parsed out of chat output, whatever the model's template shows:
    /// hermes, qwen3coder, llama3, mistral, deepseek, glm45 or harmony. Unset: the
    /// template's (Hermes when it shows none).
    #[arg(long, value_name = "SYNTAX")]
    tool_syntax: Option<ferrite_engine::output::ToolSyntax>,
    /// Scan every value of every weight for NaN and infinity before serving, naming the
    /// first bad tensor (a pass over the whole file; norms and block scales are always
    /// checked).
    #[arg(long)]
    check_weights: bool,
    /// Speculate with prompt lookup in every slot: guess each request's next tokens from
    /// its earlier text and verify them in the slots' batched step (CPU backend, models
    /// without recurrent state). Responses are the same as without it; `/metrics` counts
    /// the guesses proposed and accepted.
    #[arg(long, group = "speculate")]
    lookup: bool,
    /// Speculate with this draft model in every slot (a name or path as for -m; it must
    /// share the model's vocabulary): each slot drafts greedily in a session of it of its
    /// own, and the slots' batched step verifies (CPU backend, models without recurrent
    /// state). Responses are the same as without it; `/metrics` counts the guesses.
    #[arg(long, value_name = "MODEL", group = "speculate")]
    draft_model: Option<String>,
    /// Most tokens `--lookup` or `--draft-model` guesses a step (1 to 15); fewer, down to
    /// none, while few guesses of a request are accepted. A request may ask for fewer
    /// (`speculative.n_max`, 0 for none).
    #[arg(long, default_value_t = 8, requires = "speculate", value_parser = crate::run::draft_max_arg)]
    draft_max: usize,
    /// Fewest guessed tokens worth verifying (0 to --draft-max): a shorter guess is
    /// dropped and that step decodes plainly. A request may ask for its own
    /// (`speculative.n_min`).
    #[arg(long, default_value_t = 0, requires = "speculate")]
    draft_min: usize,
    /// The draft model stops guessing before its first token less likely than this under
    /// its own distribution (0 to 1; 0: never), so a doubtful guess costs no verify row.
    /// A request may ask for its own (`speculative.p_min`). Prompt lookup has no
    /// probabilities: needs --draft-model.
    #[arg(long, default_value_t = 0.0, requires = "draft_model", value_parser = p_min_arg)]
    draft_p_min: f32,
}

/// Parses `--draft-p-min`: a probability.
fn p_min_arg(s: &str) -> Result<f32, String> {
    let p: f32 = s.parse().map_err(|e| format!("{e}"))?;
    if (0.0..=1.0).contains(&p) {
        Ok(p)
    } else {
        Err(format!("{p} is not a probability (0 to 1)"))
    }
}

/// The engine backend `--backend` asks for: `auto` takes CUDA when the probe finds a device,
/// `cuda` fails without one (never a silent fallback), as for `ferrite run`.
fn engine_backend(arg: BackendArg) -> anyhow::Result<EngineBackend> {
    Ok(match (arg, CudaBackend::probe()) {
        (BackendArg::Cpu, _) | (BackendArg::Auto, Err(_)) => EngineBackend::Cpu,
        (BackendArg::Cuda, Err(err)) => return Err(err).context("--backend cuda"),
        (_, Ok(_)) => EngineBackend::Cuda,
    })
}

fn read_key(path: &Path) -> anyhow::Result<String> {
    let key = std::fs::read_to_string(path)
        .with_context(|| format!("reading the API key file {}", path.display()))?;
    let key = key.trim().to_string();
    anyhow::ensure!(
        !key.is_empty(),
        "the API key file {} is empty",
        path.display()
    );
    Ok(key)
}

/// The served id and accepted aliases of a model argument: a registry name (also when the
/// path is a pulled registry file), else the file stem.
fn model_names(arg: &str, path: &Path) -> (String, Vec<String>) {
    let file = path
        .file_name()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    let stem = path
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| arg.to_string());
    let registry = crate::models::KNOWN_MODELS
        .iter()
        .find(|k| k.name == arg || k.file == file)
        .map(|k| k.name.to_string());
    let id = registry.unwrap_or_else(|| stem.clone());
    let mut aliases = vec![arg.to_string(), stem, path.display().to_string(), file];
    aliases.retain(|a| a != &id && !a.is_empty());
    aliases.sort();
    aliases.dedup();
    (id, aliases)
}

/// Run `ferrite serve`; returns the process exit code.
pub fn run(args: ServeArgs) -> anyhow::Result<i32> {
    let api_key = match (&args.api_key, &args.api_key_file) {
        (Some(k), _) if k.is_empty() => anyhow::bail!("--api-key must not be empty"),
        (Some(k), _) => Some(k.clone()),
        (None, Some(path)) => Some(read_key(path)?),
        (None, None) => None,
    };
    anyhow::ensure!(args.parallel >= 1, "--parallel must be at least 1");
    anyhow::ensure!(args.ctx >= 16, "--ctx must be at least 16");
    anyhow::ensure!(
        args.prefill_chunk >= 1,
        "--prefill-chunk must be at least 1"
    );
    let prefix_cache = prefix_cache_config(&args, ferrite_model::physical_memory())?;
    let backend = engine_backend(args.backend)?;
    if backend == EngineBackend::Cuda {
        crate::run::check_cuda_kv(args.kv.into())?;
        if args.lookup {
            crate::run::speculate::check_cuda_speculation(true, "--lookup")?;
        }
        if args.draft_model.is_some() {
            crate::run::speculate::check_cuda_speculation(true, "--draft-model")?;
        }
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(serve(args, api_key, backend, prefix_cache))
}

/// The prefix cache's budgets in bytes and its directory, refused here rather than found
/// wanting later: a memory budget beyond the machine's `memory` would let the cache grow
/// until the server is killed, and a directory that cannot be made would turn the disk cache
/// off with only a log line.
fn prefix_cache_config(
    args: &ServeArgs,
    memory: Option<usize>,
) -> anyhow::Result<PrefixCacheConfig> {
    let mib = |v: u64, flag: &str| {
        v.checked_mul(1 << 20)
            .with_context(|| format!("{flag} {v} is too large"))
    };
    let memory_bytes = mib(args.kv_mem_space_mb, "--kv-mem-space-mb")?;
    if let Some(m) = memory {
        anyhow::ensure!(
            memory_bytes <= m as u64,
            "--kv-mem-space-mb {} is more than this machine's memory ({} MiB)",
            args.kv_mem_space_mb,
            m >> 20
        );
    }
    let disk = match &args.kv_disk_dir {
        Some(dir) => {
            let budget = mib(args.kv_disk_space_mb, "--kv-disk-space-mb")?;
            anyhow::ensure!(
                !dir.exists() || dir.is_dir(),
                "--kv-disk-dir {} is not a directory",
                dir.display()
            );
            std::fs::create_dir_all(dir)
                .with_context(|| format!("creating --kv-disk-dir {}", dir.display()))?;
            Some((dir.clone(), budget))
        }
        None => None,
    };
    Ok(PrefixCacheConfig {
        memory_bytes,
        disk,
        ..PrefixCacheConfig::default()
    })
}

async fn serve(
    args: ServeArgs,
    api_key: Option<String>,
    backend: EngineBackend,
    prefix_cache: PrefixCacheConfig,
) -> anyhow::Result<i32> {
    let state = AppState::new(ServerConfig {
        api_key,
        max_body_bytes: args.max_body_bytes,
        cors: Cors::parse(&args.cors_origins).context("--cors-origin")?,
        reasoning_format: args.reasoning.reasoning_format,
        reasoning_budget: args.reasoning_budget,
        tool_syntax: args.tool_syntax,
        ..ServerConfig::default()
    });
    let listener = tokio::net::TcpListener::bind((args.host.as_str(), args.port))
        .await
        .with_context(|| format!("binding {}:{}", args.host, args.port))?;
    let addr = listener.local_addr().context("reading the bound address")?;
    eprintln!("listening on http://{addr}");
    let threads = args
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let model_arg = args.model.clone();
    let load_state = state.clone();
    let (ctx, parallel, queue, prefill_chunk) =
        (args.ctx, args.parallel, args.queue, args.prefill_chunk);
    let kv = args.kv.into();
    let extra_aliases = args.aliases.clone();
    let check_weights = args.check_weights;
    let (lookup, draft_model) = (args.lookup, args.draft_model.clone());
    let (draft_max, draft_min, p_min) = (args.draft_max, args.draft_min, args.draft_p_min);
    let loader = tokio::task::spawn_blocking(move || -> anyhow::Result<()> {
        let path = crate::models::resolve(&model_arg)?;
        if check_weights {
            let g = ferrite_gguf::Gguf::open(&path)
                .with_context(|| format!("opening {}", path.display()))?;
            crate::run::check_weights(&g, &path)?;
        }
        let speculation = match draft_model {
            Some(name) => Some(Speculation {
                draft_model: Some(crate::models::resolve(&name).context("--draft-model")?),
                draft_max,
                draft_min,
                p_min,
            }),
            None => lookup.then_some(Speculation {
                draft_model: None,
                draft_max,
                draft_min,
                p_min,
            }),
        };
        let (model_id, mut aliases) = model_names(&model_arg, &path);
        aliases.extend(extra_aliases);
        let started = std::time::Instant::now();
        let engine = Engine::start(EngineConfig {
            model_path: path.clone(),
            model_id: model_id.clone(),
            aliases,
            n_ctx: ctx,
            parallel,
            threads,
            queue_limit: queue,
            prefill_chunk,
            prefix_cache,
            backend,
            kv,
            speculation,
        })?;
        eprintln!("{}", engine.backend_line());
        eprintln!(
            "model {model_id} ready ({}; ctx {} x {parallel} slots, {threads} threads) in {} ms",
            path.display(),
            engine.n_ctx(),
            started.elapsed().as_millis()
        );
        load_state.set_backend(Arc::new(engine));
        Ok(())
    });
    let limits = listener::Limits {
        header: Duration::from_secs(args.header_timeout_secs),
        idle: Duration::from_secs(args.idle_timeout_secs),
        body: Duration::from_secs(args.body_timeout_secs),
        // At most 65,536 (the flag's range), so this fits every usize.
        max_connections: args.max_connections as usize,
    };
    let server = tokio::spawn(listener::serve(
        listener,
        router(state),
        limits,
        shutdown_signal(),
    ));
    match loader.await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => return Err(e.context("loading the model")),
        Err(e) => anyhow::bail!("the model loader failed: {e}"),
    }
    server.await.context("the server task failed")?;
    eprintln!("shut down");
    Ok(0)
}

/// Ctrl-C or SIGTERM.
async fn shutdown_signal() {
    let ctrl_c = async {
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {}
        () = term => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_names_are_ids_and_paths_are_aliases() {
        let path = Path::new("/m/SmolLM2-135M-Instruct.Q4_1.gguf");
        let (id, aliases) = model_names("smollm2-135m-instruct", path);
        assert_eq!(id, "smollm2-135m-instruct");
        assert!(aliases.contains(&"SmolLM2-135M-Instruct.Q4_1.gguf".to_string()));
        assert!(aliases.contains(&"/m/SmolLM2-135M-Instruct.Q4_1.gguf".to_string()));
        let (id, aliases) = model_names("/m/x.gguf", Path::new("/m/x.gguf"));
        assert_eq!(id, "x");
        assert_eq!(aliases, ["/m/x.gguf", "x.gguf"]);
        let (id, aliases) = model_names(path.to_str().unwrap(), path);
        assert_eq!(id, "smollm2-135m-instruct");
        assert!(aliases.contains(&"SmolLM2-135M-Instruct.Q4_1".to_string()));
    }

    #[test]
    fn backend_flag_follows_run_semantics() {
        assert_eq!(engine_backend(BackendArg::Cpu).unwrap(), EngineBackend::Cpu);
        match CudaBackend::probe() {
            Ok(_) => {
                assert_eq!(
                    engine_backend(BackendArg::Auto).unwrap(),
                    EngineBackend::Cuda
                );
                assert_eq!(
                    engine_backend(BackendArg::Cuda).unwrap(),
                    EngineBackend::Cuda
                );
            }
            Err(_) => {
                assert_eq!(
                    engine_backend(BackendArg::Auto).unwrap(),
                    EngineBackend::Cpu
                );
                let err = format!("{:#}", engine_backend(BackendArg::Cuda).unwrap_err());
                assert!(err.starts_with("--backend cuda: no CUDA device: "), "{err}");
            }
        }
    }

    #[test]
    fn draft_p_min_is_a_probability() {
        assert_eq!(p_min_arg("0"), Ok(0.0));
        assert_eq!(p_min_arg("0.75"), Ok(0.75));
        assert_eq!(p_min_arg("1"), Ok(1.0));
        for bad in ["-0.1", "1.01", "NaN", "x"] {
            assert!(p_min_arg(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn key_file_is_trimmed_and_must_not_be_empty() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("key");
        std::fs::write(&f, "abc\n").unwrap();
        assert_eq!(read_key(&f).unwrap(), "abc");
        std::fs::write(&f, "\n").unwrap();
        assert!(read_key(&f).is_err());
        assert!(read_key(&dir.path().join("missing")).is_err());
    }
}
