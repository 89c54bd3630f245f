//! `ferrite serve`'s connection limits against slow and silent clients over loopback
//! (issue 35: connections sending headers a byte at a time were kept open forever). Every
//! wait is bounded; the limits under test are set to one second.

mod common;
mod server_util;

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use server_util::Server;

/// Generous bound on how long a one-second limit may take to act.
const BOUND: Duration = Duration::from_secs(20);

fn server(dir: &tempfile::TempDir, extra: &[&str]) -> Server {
    let model = dir.path().join("tiny.gguf");
    common::tiny_model(&model);
    let mut args = vec![
        "-m",
        model.to_str().unwrap(),
        "--backend",
        "cpu",
        "--threads",
        "1",
    ];
    args.extend_from_slice(extra);
    Server::start(&args)
}

/// Whether the server closed `s` (end of stream or reset) before `BOUND`, polling while
/// `feed` (called every 200 ms) sends what the client sends.
fn closed_within_bound(s: &mut TcpStream, mut feed: impl FnMut(&mut TcpStream)) -> bool {
    s.set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let start = Instant::now();
    let mut buf = [0u8; 4096];
    while start.elapsed() < BOUND {
        match s.read(&mut buf) {
            Ok(0) => return true,
            // A reply (the server's 4xx for a body that never came) is read on to the close.
            Ok(_) => {}
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(_) => return true,
        }
        feed(s);
    }
    false
}

#[test]
fn headers_sent_a_byte_at_a_time_are_cut_off() {
    let dir = tempfile::tempdir().unwrap();
    let srv = server(&dir, &["--header-timeout-secs", "1"]);
    let mut s = TcpStream::connect(srv.addr).unwrap();
    s.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        .unwrap();
    // One byte every 200 ms: never silent long enough for the idle limit (10 s default).
    let closed = closed_within_bound(&mut s, |s| {
        let _ = s.write_all(b"a");
    });
    assert!(closed, "a 1 s header limit kept a dribbling client open");
    // The server still answers others.
    assert_eq!(srv.get("/health").status, 200);
}

#[test]
fn a_silent_connection_is_closed_when_idle() {
    let dir = tempfile::tempdir().unwrap();
    let srv = server(&dir, &["--idle-timeout-secs", "1"]);
    let mut s = TcpStream::connect(srv.addr).unwrap();
    assert!(
        closed_within_bound(&mut s, |_| {}),
        "a 1 s idle limit kept a silent connection open"
    );
    // A kept-alive connection serves its next request after a pause shorter than the limit.
    let mut s = TcpStream::connect(srv.addr).unwrap();
    s.set_read_timeout(Some(BOUND)).unwrap();
    for _ in 0..2 {
        s.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            .unwrap();
        let mut buf = [0u8; 1024];
        let n = s.read(&mut buf).unwrap();
        assert!(buf[..n].starts_with(b"HTTP/1.1 200"), "{:?}", &buf[..n]);
        std::thread::sleep(Duration::from_millis(300));
    }
}

#[test]
fn a_body_that_stops_arriving_is_cut_off() {
    let dir = tempfile::tempdir().unwrap();
    let srv = server(&dir, &["--body-timeout-secs", "1"]);
    let mut s = TcpStream::connect(srv.addr).unwrap();
    s.write_all(
        b"POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
          Content-Length: 100\r\n\r\n{\"content\": \"",
    )
    .unwrap();
    assert!(
        closed_within_bound(&mut s, |_| {}),
        "a 1 s body limit kept a stalled upload open"
    );
}

#[test]
fn connections_beyond_the_cap_wait_to_be_served() {
    let dir = tempfile::tempdir().unwrap();
    let srv = server(&dir, &["--max-connections", "1"]);
    // Server::start's health checks are done and closed; this one holds the only place.
    let holder = TcpStream::connect(srv.addr).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let mut waiting = TcpStream::connect(srv.addr).unwrap();
    waiting
        .write_all(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .unwrap();
    waiting
        .set_read_timeout(Some(Duration::from_secs(2)))
        .unwrap();
    let mut buf = [0u8; 1024];
    match waiting.read(&mut buf) {
        Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
        other => panic!("served beyond --max-connections 1: {other:?}"),
    }
    drop(holder);
    waiting.set_read_timeout(Some(BOUND)).unwrap();
    let n = waiting.read(&mut buf).unwrap();
    assert!(buf[..n].starts_with(b"HTTP/1.1 200"), "{:?}", &buf[..n]);
}
