//! Helpers for the `ferrite serve` integration tests: start the real binary on a free
//! loopback port, a minimal HTTP/1.1 client over `TcpStream` (so the tests need no HTTP
//! client crate), SSE parsing, and a guard that kills the server.

#![allow(dead_code)] // each test binary uses a different subset

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Stdio};
use std::sync::mpsc::{Receiver, channel};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

/// A running server; killed on drop.
pub struct Server {
    pub addr: SocketAddr,
    child: Child,
    stderr: Arc<Mutex<String>>,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Server {
    /// Start `ferrite serve --port 0 ARGS`, wait for the address line and for /health = 200.
    pub fn start(args: &[&str]) -> Server {
        let mut child = crate::common::ferrite()
            .args(["serve", "--host", "127.0.0.1", "--port", "0"])
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawning ferrite serve");
        let stderr = child.stderr.take().expect("stderr is piped");
        let log = Arc::new(Mutex::new(String::new()));
        let (tx, rx): (_, Receiver<SocketAddr>) = channel();
        let sink = log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Some(addr) = line.strip_prefix("listening on http://") {
                    let _ = tx.send(addr.parse().expect("bad address line"));
                }
                let mut s = sink.lock().unwrap();
                s.push_str(&line);
                s.push('\n');
            }
        });
        let addr = match rx.recv_timeout(Duration::from_secs(60)) {
            Ok(a) => a,
            Err(_) => {
                let _ = child.kill();
                panic!(
                    "server printed no address; stderr:\n{}",
                    log.lock().unwrap()
                );
            }
        };
        let server = Server {
            addr,
            child,
            stderr: log,
        };
        let deadline = Instant::now() + Duration::from_secs(180);
        loop {
            if let Ok(r) = server.try_request("GET", "/health", None, &[]) {
                if r.status == 200 {
                    break;
                }
                assert_eq!(r.status, 503, "unexpected /health answer {}", r.body);
            }
            assert!(
                Instant::now() < deadline,
                "server not healthy in time:\n{}",
                server.log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        server
    }

    /// Everything the server wrote to stderr so far.
    pub fn log(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    fn try_request(
        &self,
        method: &str,
        path: &str,
        body: Option<&str>,
        headers: &[(&str, &str)],
    ) -> std::io::Result<Reply> {
        let mut s = TcpStream::connect(self.addr)?;
        s.set_read_timeout(Some(Duration::from_secs(300)))?;
        s.write_all(request_bytes(method, path, body, headers).as_bytes())?;
        let mut raw = Vec::new();
        s.read_to_end(&mut raw)?;
        Ok(parse_reply(&raw))
    }

    /// One request; panics on transport errors.
    pub fn request(
        &self,
        method: &str,
        path: &str,
        body: Option<&str>,
        headers: &[(&str, &str)],
    ) -> Reply {
        self.try_request(method, path, body, headers)
            .unwrap_or_else(|e| panic!("{method} {path}: {e}\nserver log:\n{}", self.log()))
    }

    /// POST JSON.
    pub fn post(&self, path: &str, body: &Value) -> Reply {
        self.request("POST", path, Some(&body.to_string()), &[])
    }

    /// GET.
    pub fn get(&self, path: &str) -> Reply {
        self.request("GET", path, None, &[])
    }

    /// Open a streaming POST and return the socket after the headers and `min_bytes` of body
    /// arrived (for cancellation tests: drop it to disconnect).
    pub fn open_stream(
        &self,
        path: &str,
        body: &Value,
        min_bytes: usize,
        headers: &[(&str, &str)],
    ) -> TcpStream {
        let mut s = TcpStream::connect(self.addr).expect("connect");
        s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
        s.write_all(request_bytes("POST", path, Some(&body.to_string()), headers).as_bytes())
            .unwrap();
        let mut got = Vec::new();
        let mut buf = [0u8; 4096];
        while got.len() < min_bytes || !contains(&got, b"\r\n\r\n") {
            let n = s.read(&mut buf).expect("reading the stream");
            assert!(
                n > 0,
                "stream closed early: {}",
                String::from_utf8_lossy(&got)
            );
            got.extend_from_slice(&buf[..n]);
        }
        s
    }
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

fn request_bytes(method: &str, path: &str, body: Option<&str>, headers: &[(&str, &str)]) -> String {
    let body = body.unwrap_or("");
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    req.push_str(body);
    req
}

/// A complete HTTP response.
#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    pub headers: String,
    pub body: String,
}

impl Reply {
    /// The body as JSON.
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.body))
    }

    /// SSE events as (event name, data), with the framing checked.
    pub fn events(&self) -> Vec<(Option<String>, String)> {
        assert!(
            self.headers
                .to_ascii_lowercase()
                .contains("content-type: text/event-stream"),
            "{}",
            self.headers
        );
        assert!(
            self.body.ends_with("\n\n"),
            "SSE body must end with a blank line"
        );
        self.body
            .trim_end_matches('\n')
            .split("\n\n")
            .filter(|b| !b.starts_with(':'))
            .map(|block| {
                let mut name = None;
                let mut data = None;
                for line in block.lines() {
                    if let Some(n) = line.strip_prefix("event: ") {
                        name = Some(n.to_string());
                    } else if let Some(d) = line.strip_prefix("data: ") {
                        data = Some(d.to_string());
                    } else {
                        panic!("bad SSE line {line:?}");
                    }
                }
                (name, data.expect("event without data"))
            })
            .collect()
    }
}

fn parse_reply(raw: &[u8]) -> Reply {
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("no header end");
    let head = String::from_utf8_lossy(&raw[..split]).into_owned();
    let status: u16 = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .expect("status");
    let rest = &raw[split + 4..];
    let body = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        dechunk(rest)
    } else {
        rest.to_vec()
    };
    Reply {
        status,
        headers: head,
        body: String::from_utf8(body).expect("UTF-8 body"),
    }
}

fn dechunk(mut raw: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(eol) = raw.windows(2).position(|w| w == b"\r\n") {
        let size_text = String::from_utf8_lossy(&raw[..eol]);
        let size = usize::from_str_radix(size_text.split(';').next().unwrap_or("").trim(), 16)
            .expect("chunk size");
        if size == 0 {
            break;
        }
        let start = eol + 2;
        out.extend_from_slice(&raw[start..start + size]);
        raw = &raw[start + size + 2..];
    }
    out
}

/// Concatenated `choices[0].delta.content` of an OpenAI chat stream (checks `[DONE]` last).
pub fn chat_stream_text(reply: &Reply) -> (String, Vec<Value>) {
    let events = reply.events();
    assert_eq!(
        events.last().map(|e| e.1.as_str()),
        Some("[DONE]"),
        "{}",
        reply.body
    );
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|(_, d)| serde_json::from_str(d).unwrap())
        .collect();
    let text = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    (text, chunks)
}

/// The model every server test serves.
pub const MODEL: &str = "smollm2-135m-instruct";

/// A greedy chat request of one user message.
pub fn chat(content: &str, max_tokens: u32) -> Value {
    json!({"model": MODEL, "messages": [{"role": "user", "content": content}],
        "temperature": 0, "max_tokens": max_tokens})
}

/// `body` with the fields of `extra` set.
pub fn with(mut body: Value, extra: Value) -> Value {
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    body
}

/// A metric's value from the server's `/metrics`.
pub fn metric(server: &Server, name: &str) -> f64 {
    let text = server.get("/metrics").body;
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{name} ")))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("metric {name} missing:\n{text}"))
}

/// A server of the real SmolLM2 on the CPU: context 512, 4 slots, 2 threads.
pub fn start() -> Server {
    start_with(&[])
}

/// The server of [`start`] with `extra` flags.
pub fn start_with(extra: &[&str]) -> Server {
    let model = crate::common::pull(MODEL);
    let mut args = vec![
        "-m",
        model.to_str().unwrap(),
        "--ctx",
        "512",
        "--parallel",
        "4",
        "--threads",
        "2",
    ];
    args.extend_from_slice(extra);
    Server::start(&args)
}

/// Text the model continues by repeating it (speculation drafts from it).
pub const REPEAT: &str = "def area(w, h):\n    return w * h\n\ndef area(w, h):\n    return w * h\n\n\
def area(w, h):\n    return w * h\n\ndef area(w, h):\n";

/// What is compared of an answer: everything but ids and timestamps.
pub fn answer(v: &Value) -> Value {
    json!({"choices": v["choices"], "usage": v["usage"]["completion_tokens"]})
}

/// The streamed text of a reply (chat deltas or completion texts), `[DONE]` checked.
pub fn stream_text(path: &str, reply: &Reply) -> String {
    if path == "/v1/chat/completions" {
        return chat_stream_text(reply).0;
    }
    let events = reply.events();
    assert_eq!(events.last().map(|e| e.1.as_str()), Some("[DONE]"));
    events[..events.len() - 1]
        .iter()
        .filter_map(|(_, d)| {
            let v: Value = serde_json::from_str(d).unwrap();
            v["choices"][0]["text"].as_str().map(str::to_string)
        })
        .collect()
}

/// The text of a plain answer.
pub fn text_of(path: &str, v: &Value) -> String {
    let c = &v["choices"][0];
    let t = if path == "/v1/chat/completions" {
        &c["message"]["content"]
    } else {
        &c["text"]
    };
    t.as_str().unwrap_or_default().to_string()
}
