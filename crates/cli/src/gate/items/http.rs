//! The HTTP side of the gate's server items: the real `ferrite serve` stack (engine, router,
//! listener with its limits) started in-process on a loopback port, a raw HTTP/1.1 client
//! over `TcpStream` that can send what no well-behaved client sends (truncated bodies,
//! wrong methods, bytes that are not JSON), and stub servers that answer wrongly on
//! purpose, on which the items prove their oracles can fail.
//!
//! Every read has a deadline, so a wedged server fails the item instead of hanging the gate.
//! Nothing here judges a response: the items do.

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use ferrite_engine::prefix::PrefixCacheConfig;
use ferrite_engine::{Engine, EngineBackend, EngineConfig};
use ferrite_server::{AppState, ServerConfig, router};
use serde_json::Value;

/// The id the gate's servers answer to in `model` fields.
pub const MODEL_ID: &str = "gate-model";

/// Longest wait for any one answer (a whole non-streaming generation included).
const ANSWER_DEADLINE: Duration = Duration::from_secs(120);

/// Settings of one gate server.
pub struct ServerOpts {
    /// Context per slot.
    pub ctx: usize,
    /// Slots.
    pub parallel: usize,
    /// Prompt tokens per scheduler step.
    pub prefill_chunk: usize,
    /// Memory budget of the prefix cache (0: off).
    pub kv_mem_bytes: usize,
    /// Disk directory of the prefix cache.
    pub kv_disk_dir: Option<std::path::PathBuf>,
}

/// The largest body the gate's servers accept (413 beyond).
pub const MAX_BODY: usize = 1 << 20;

/// The real server stack over one model, on `127.0.0.1:<free port>`; stopped on drop.
pub struct GateServer {
    /// Where it listens.
    pub addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    runtime: Option<tokio::runtime::Runtime>,
}

impl GateServer {
    /// Loads `model` in an engine on the CPU and serves it as `ferrite serve` does.
    pub fn start(model: &Path, opts: ServerOpts) -> anyhow::Result<GateServer> {
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        let engine = Engine::start(EngineConfig {
            model_path: model.to_path_buf(),
            model_id: MODEL_ID.into(),
            aliases: Vec::new(),
            n_ctx: opts.ctx,
            parallel: opts.parallel,
            threads,
            queue_limit: 8,
            prefill_chunk: opts.prefill_chunk,
            prefix_cache: PrefixCacheConfig {
                memory_bytes: opts.kv_mem_bytes as u64,
                disk: opts.kv_disk_dir.map(|d| (d, 256 << 20)),
                ..PrefixCacheConfig::default()
            },
            backend: EngineBackend::Cpu,
            kv: ferrite_model::KvType::F16,
            speculation: None,
        })?;
        let state = AppState::new(ServerConfig {
            max_body_bytes: MAX_BODY,
            ..ServerConfig::default()
        });
        state.set_backend(Arc::new(engine));
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .context("starting the gate server's runtime")?;
        let listener = runtime
            .block_on(tokio::net::TcpListener::bind(("127.0.0.1", 0)))
            .context("binding a loopback port")?;
        let addr = listener.local_addr()?;
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let limits = crate::serve::listener::Limits {
            header: Duration::from_secs(10),
            idle: Duration::from_secs(10),
            body: Duration::from_secs(10),
            max_connections: 64,
        };
        runtime.spawn(crate::serve::listener::serve(
            listener,
            router(state),
            limits,
            async {
                let _ = stopped.await;
            },
        ));
        let server = GateServer {
            addr,
            stop: Some(stop),
            runtime: Some(runtime),
        };
        let health = server.get("/health")?;
        anyhow::ensure!(health.status == 200, "/health answered {}", health.status);
        Ok(server)
    }

    /// POST a JSON body.
    pub fn post(&self, path: &str, body: &Value) -> anyhow::Result<Reply> {
        exchange(
            self.addr,
            &request("POST", path, JSON, body.to_string().as_bytes()),
        )
    }

    /// GET.
    pub fn get(&self, path: &str) -> anyhow::Result<Reply> {
        exchange(self.addr, &request("GET", path, None, b""))
    }

    /// A metric's value from `/metrics`.
    pub fn metric(&self, name: &str) -> anyhow::Result<f64> {
        let text = String::from_utf8_lossy(&self.get("/metrics")?.body).into_owned();
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("{name} ")))
            .and_then(|v| v.trim().parse().ok())
            .with_context(|| format!("no metric {name} at /metrics"))
    }
}

impl Drop for GateServer {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_timeout(Duration::from_secs(5));
        }
    }
}

/// The JSON content type.
pub const JSON: Option<&str> = Some("application/json");

/// One request's bytes: `Connection: close`, the given content type, a correct length.
pub fn request(method: &str, path: &str, content_type: Option<&str>, body: &[u8]) -> Vec<u8> {
    let mut head = format!(
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    if let Some(ct) = content_type {
        head.push_str(&format!("Content-Type: {ct}\r\n"));
    }
    head.push_str("\r\n");
    let mut out = head.into_bytes();
    out.extend_from_slice(body);
    out
}

/// A complete HTTP response.
#[derive(Debug)]
pub struct Reply {
    /// Status code.
    pub status: u16,
    /// The header block, as text.
    pub headers: String,
    /// The body, de-chunked.
    pub body: Vec<u8>,
}

impl Reply {
    /// The body as JSON, if it is.
    pub fn json(&self) -> Option<Value> {
        serde_json::from_slice(&self.body).ok()
    }

    /// The first 160 characters of the body, for a receipt line.
    pub fn excerpt(&self) -> String {
        String::from_utf8_lossy(&self.body)
            .chars()
            .take(160)
            .collect()
    }
}

/// Sends `raw`, then reads the whole response (the server closes: `Connection: close`).
pub fn exchange(addr: SocketAddr, raw: &[u8]) -> anyhow::Result<Reply> {
    exchange_then(addr, raw, false)
}

/// As [`exchange`]; with `half_close` the sending side is shut after `raw`, as a client
/// that dies in the middle of its body leaves it.
pub fn exchange_then(addr: SocketAddr, raw: &[u8], half_close: bool) -> anyhow::Result<Reply> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
    s.set_read_timeout(Some(ANSWER_DEADLINE))?;
    s.write_all(raw)?;
    if half_close {
        s.shutdown(Shutdown::Write)?;
    }
    let mut got = Vec::new();
    s.read_to_end(&mut got).context("reading the response")?;
    parse_reply(&got)
}

/// Parses a whole response; a connection closed before a status line is an error.
pub fn parse_reply(raw: &[u8]) -> anyhow::Result<Reply> {
    let split = find(raw, b"\r\n\r\n").with_context(|| {
        format!(
            "connection closed after {} bytes, before a complete header",
            raw.len()
        )
    })?;
    let headers = String::from_utf8_lossy(&raw[..split]).into_owned();
    let status = headers
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .context("no status code")?;
    let rest = &raw[split + 4..];
    let body = if headers
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        dechunk(rest)?
    } else {
        rest.to_vec()
    };
    Ok(Reply {
        status,
        headers,
        body,
    })
}

/// Position of `needle` in `hay`.
pub fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

fn dechunk(mut raw: &[u8]) -> anyhow::Result<Vec<u8>> {
    let mut out = Vec::new();
    while let Some(eol) = find(raw, b"\r\n") {
        let size_text = String::from_utf8_lossy(&raw[..eol]);
        let size = usize::from_str_radix(size_text.split(';').next().unwrap_or("").trim(), 16)
            .with_context(|| format!("bad chunk size {size_text:?}"))?;
        if size == 0 {
            return Ok(out);
        }
        let start = eol + 2;
        let chunk = raw
            .get(start..start + size)
            .context("the stream ended inside a chunk")?;
        out.extend_from_slice(chunk);
        raw = raw.get(start + size + 2..).unwrap_or(&[]);
    }
    anyhow::bail!("the chunked body has no final chunk")
}

/// An open streaming request: read what arrives, drop it to disconnect.
pub struct Stream {
    socket: TcpStream,
    /// Everything received so far.
    pub got: Vec<u8>,
}

impl Stream {
    /// Sends a POST of `body` and returns before reading anything.
    pub fn open(addr: SocketAddr, path: &str, body: &Value) -> anyhow::Result<Stream> {
        let mut socket = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
        socket.write_all(&request("POST", path, JSON, body.to_string().as_bytes()))?;
        Ok(Stream {
            socket,
            got: Vec::new(),
        })
    }

    /// Reads until `done(received)` holds; an end of stream or the deadline is an error.
    pub fn read_until(&mut self, what: &str, done: impl Fn(&[u8]) -> bool) -> anyhow::Result<()> {
        let deadline = Instant::now() + ANSWER_DEADLINE;
        let mut buf = [0u8; 4096];
        while !done(&self.got) {
            let left = deadline.saturating_duration_since(Instant::now());
            anyhow::ensure!(!left.is_zero(), "no {what} within {ANSWER_DEADLINE:?}");
            self.socket.set_read_timeout(Some(left))?;
            match self.socket.read(&mut buf) {
                Ok(0) => anyhow::bail!(
                    "the stream ended before {what}: {}",
                    String::from_utf8_lossy(&self.got)
                ),
                Ok(n) => self.got.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(e).with_context(|| format!("waiting for {what}")),
            }
        }
        Ok(())
    }

    /// Reads whatever has arrived, without waiting.
    pub fn drain_now(&mut self) -> anyhow::Result<()> {
        self.socket.set_nonblocking(true)?;
        let mut buf = [0u8; 4096];
        let result = loop {
            match self.socket.read(&mut buf) {
                Ok(0) => break Ok(()),
                Ok(n) => self.got.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == ErrorKind::WouldBlock => break Ok(()),
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => break Err(e),
            }
        };
        self.socket.set_nonblocking(false)?;
        Ok(result?)
    }
}

/// Polls `check` every 20 ms until it holds or `within` passed; the last value is returned.
pub fn wait_for(
    within: Duration,
    mut check: impl FnMut() -> anyhow::Result<bool>,
) -> anyhow::Result<bool> {
    let deadline = Instant::now() + within;
    loop {
        if check()? {
            return Ok(true);
        }
        if Instant::now() >= deadline {
            return Ok(false);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// How a stub server answers every request.
#[derive(Clone, Copy, Debug)]
pub enum StubMode {
    /// 500 with a JSON error body.
    ServerError,
    /// Closes the connection without a byte.
    Drop,
    /// 400 with a JSON error body, good requests included.
    RefuseAll,
    /// 200 with `{}`, malformed requests included.
    AcceptAll,
}

/// A defective server on a loopback port; stopped on drop.
pub struct Stub {
    /// Where it listens.
    pub addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Stub {
    /// Starts a stub answering in `mode`.
    pub fn start(mode: StubMode) -> anyhow::Result<Stub> {
        let listener = TcpListener::bind(("127.0.0.1", 0))?;
        let addr = listener.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            for conn in listener.incoming() {
                if flag.load(Ordering::SeqCst) {
                    break;
                }
                if let Ok(s) = conn {
                    stub_answer(s, mode);
                }
            }
        });
        Ok(Stub {
            addr,
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for Stub {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wakes the accept loop so it sees the flag.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_secs(1));
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Reads one request's header and declared body (bounded), then answers as `mode` says.
fn stub_answer(mut s: TcpStream, mode: StubMode) {
    let _ = s.set_read_timeout(Some(Duration::from_millis(500)));
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        if let Some(end) = find(&got, b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&got[..end]).to_ascii_lowercase();
            let len = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse::<usize>().ok())
                .unwrap_or(0)
                .min(MAX_BODY);
            if got.len() >= end + 4 + len {
                break;
            }
        }
        match s.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => got.extend_from_slice(&buf[..n]),
        }
    }
    let (status, body) = match mode {
        StubMode::Drop => return,
        StubMode::ServerError => (
            "500 Internal Server Error",
            r#"{"error":{"message":"internal server error"}}"#,
        ),
        StubMode::RefuseAll => ("400 Bad Request", r#"{"error":{"message":"refused"}}"#),
        StubMode::AcceptAll => ("200 OK", "{}"),
    };
    let _ = s.write_all(
        format!(
            "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )
        .as_bytes(),
    );
}
