//! `ferrite serve --kv-disk-dir`: prompt-prefix checkpoints on disk, with the real SmolLM2 on
//! CPU. Prompts are token arrays (`/v1/completions`), so the shared prefix of two requests
//! is known exactly. Oracles: the answer after a restore equals the answer computed from
//! scratch (greedy decoding is deterministic and restores are bit-exact), `cached_tokens`
//! equals the block-aligned shared prefix, and the reported `cache_source` says where it
//! came from.

mod common;
mod server_util;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use server_util::Server;

const MODEL: &str = "smollm2-135m-instruct";
/// Tokens per cache block (the server's default).
const BLOCK: usize = 64;

fn tokens(n: usize, salt: u32) -> Vec<u32> {
    (0..n as u32)
        .map(|i| 300 + (i * 7919 + salt) % 9000)
        .collect()
}

/// `ferrite serve` on SmolLM2 with a 1024-token context, 2 threads, one slot unless
/// `extra` sets `--parallel`, and the disk cache in `disk`.
fn start(disk: Option<&Path>, extra: &[&str]) -> Server {
    let model = common::pull(MODEL);
    let mut args = vec![
        "-m".to_string(),
        model.display().to_string(),
        "--ctx".into(),
        "1024".into(),
        "--threads".into(),
        "2".into(),
    ];
    if !extra.contains(&"--parallel") {
        args.extend(["--parallel".into(), "1".into()]);
    }
    if let Some(d) = disk {
        args.extend(["--kv-disk-dir".into(), d.display().to_string()]);
    }
    args.extend(extra.iter().map(|s| s.to_string()));
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    Server::start(&refs)
}

/// (text, cached_tokens, cache_source) of a greedy 4-token completion.
fn complete(server: &Server, prompt: &[u32]) -> (String, u64, String) {
    let body = json!({"model": MODEL, "prompt": prompt, "max_tokens": 4, "temperature": 0});
    let r = server.post("/v1/completions", &body);
    assert_eq!(r.status, 200, "{}", r.body);
    let v: Value = r.json();
    let u = &v["usage"];
    let cached = u["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap();
    assert_eq!(u["ferrite"]["cached_tokens"].as_u64(), Some(cached));
    (
        v["choices"][0]["text"].as_str().unwrap().to_string(),
        cached,
        u["ferrite"]["cache_source"].as_str().unwrap().to_string(),
    )
}

fn metric(server: &Server, name: &str) -> u64 {
    let text = server.get("/metrics").body;
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{name} ")))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("metric {name} missing:\n{text}"))
}

fn snapshots(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "kvsnap"))
        .collect();
    v.sort();
    v
}

/// Waits until the server's log contains `needle`.
fn wait_log(server: &Server, needle: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !server.log().contains(needle) {
        assert!(
            Instant::now() < deadline,
            "no {needle:?} in:\n{}",
            server.log()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Waits until the server logged its `n`-th checkpoint write.
fn wait_written(server: &Server, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while server.log().matches("kv-cache: wrote").count() < n {
        assert!(
            Instant::now() < deadline,
            "no checkpoint written:\n{}",
            server.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A whole snapshot file decodes (checksums included) against its own header.
fn is_complete(path: &Path) -> bool {
    let Ok(mut f) = std::fs::File::open(path) else {
        return false;
    };
    let len = f.metadata().unwrap().len();
    let Ok(h) = ferrite_kvstore::read_header(&mut f, len) else {
        return false;
    };
    ferrite_kvstore::read_snapshot(path, &h.compat).is_ok()
}

#[test]
fn restart_reuses_disk_and_an_edit_reuses_only_the_unchanged_prefix() {
    let dir = tempfile::tempdir().unwrap();
    let p = tokens(400, 1);
    let first = start(Some(dir.path()), &[]);
    let (text, cached, source) = complete(&first, &p);
    assert_eq!((cached, source.as_str()), (0, "none"));
    wait_written(&first, 1);
    assert_eq!(metric(&first, "ferrite_kv_disk_written_total"), 1);
    drop(first);
    assert_eq!(snapshots(dir.path()).len(), 1);

    // Restarted: the checkpoint (400 prompt + 3 evaluated generated tokens, minus the
    // trimmed tail of 4, aligned down to 384) comes from disk; the answer is unchanged.
    let second = start(Some(dir.path()), &[]);
    let (again, cached, source) = complete(&second, &p);
    assert_eq!(
        (again.as_str(), cached, source.as_str()),
        (text.as_str(), 384, "disk")
    );
    // The request's log line (and its counters) are written as its handler finishes,
    // which may be just after the client has the answer.
    wait_log(&second, "cache=disk");
    assert_eq!(metric(&second, "ferrite_cache_disk_hits_total"), 1);
    assert_eq!(metric(&second, "ferrite_kv_disk_rejected_total"), 0);
    drop(second);

    // An edit at token 300: a new server reuses only the whole blocks before it.
    let mut edited = p.clone();
    edited[300] += 1;
    let third = start(Some(dir.path()), &[]);
    let (edited_text, cached, source) = complete(&third, &edited);
    assert_eq!(cached, (300 / BLOCK * BLOCK) as u64);
    assert_eq!(source, "disk");
    drop(third);
    // Oracle for the edited answer: a server with no cache at all.
    let plain = start(None, &["--kv-mem-space-mb", "0"]);
    let (want, cached, source) = complete(&plain, &edited);
    assert_eq!((cached, source.as_str()), (0, "none"));
    assert_eq!(edited_text, want);
}

#[test]
fn eviction_keeps_the_directory_within_budget_and_the_newest_entry() {
    let dir = tempfile::tempdir().unwrap();
    // Each checkpoint of a 200-token prompt holds 192 tokens: about 4.4 MB; room for two.
    let server = start(Some(dir.path()), &["--kv-disk-space-mb", "10"]);
    let budget = 10u64 << 20;
    for i in 0..4 {
        complete(&server, &tokens(200, 100 + i));
        wait_written(&server, i as usize + 1);
        let files = snapshots(dir.path());
        let total: u64 = files.iter().map(|f| f.metadata().unwrap().len()).sum();
        assert!(total <= budget, "{total} > {budget} after request {i}");
        let newest = server
            .log()
            .lines()
            .rev()
            .find_map(|l| l.split(" to ").nth(1).map(str::to_string))
            .unwrap();
        assert!(
            dir.path().join(format!("{newest}.kvsnap")).is_file(),
            "the newest entry {newest} was evicted"
        );
        assert!(files.len() <= 2, "{files:?}");
    }
}

#[test]
fn killed_writer_leaves_no_file_that_is_used() {
    let dir = tempfile::tempdir().unwrap();
    let p = tokens(400, 7);
    let server = start(Some(dir.path()), &[]);
    let (text, _, _) = complete(&server, &p);
    // SIGKILL right after the answer, while the checkpoint is likely being written.
    drop(server);
    for f in snapshots(dir.path()) {
        assert!(
            is_complete(&f),
            "a visible snapshot is incomplete: {}",
            f.display()
        );
    }
    // What a writer killed mid-file leaves (a temporary file named with its pid), what a
    // live writer is writing, and a truncated snapshot under a real name (as if copied by a
    // careless tool): none may be used; the dead writer's file goes, the live one's stays.
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let dead_pid = child.id();
    child.wait().unwrap();
    let partial = dir
        .path()
        .join(format!(".00000000deadbeef.kvsnap.{dead_pid}.0.partial"));
    std::fs::write(&partial, b"FRKVSNAP half-written").unwrap();
    let live = dir.path().join(format!(
        ".00000000feedface.kvsnap.{}.0.partial",
        std::process::id()
    ));
    std::fs::write(&live, b"FRKVSNAP being written").unwrap();
    let truncated = dir.path().join("00000000deadbeef.kvsnap");
    std::fs::write(&truncated, b"FRKVSNAP\x01\x00\x00\x00").unwrap();
    let server = start(Some(dir.path()), &[]);
    let (again, _, source) = complete(&server, &p);
    assert_eq!(again, text);
    assert!(source == "disk" || source == "none", "{source}");
    assert!(
        !truncated.exists(),
        "the truncated snapshot was not removed"
    );
    assert!(
        !partial.exists(),
        "a dead writer's temporary file was not removed"
    );
    assert!(live.exists(), "a live writer's temporary file was removed");
    assert!(
        server.log().contains("kv-cache: skipping"),
        "{}",
        server.log()
    );
    assert_eq!(metric(&server, "ferrite_kv_disk_rejected_total"), 1);
}

/// The memory cache is shared by all slots: a prompt whose slot was since reused for other
/// work is still restored from memory. With the memory cache off, the same traffic reuses
/// nothing (the control that shows the reuse comes from the shared cache, not a slot).
#[test]
fn memory_cache_is_shared_across_slots() {
    let p = tokens(200, 11);
    let mut seen = Vec::new();
    for mem in ["512", "0"] {
        let server = start(None, &["--parallel", "2", "--kv-mem-space-mb", mem]);
        // Slot 0 gets p; the next two prompts (sharing nothing) fill slot 1, then slot 0
        // (it holds fewer tokens), so no slot holds p any more.
        let (text, _, _) = complete(&server, &p);
        complete(&server, &tokens(300, 12));
        complete(&server, &tokens(250, 13));
        let (again, cached, source) = complete(&server, &p);
        assert_eq!(again, text);
        seen.push((cached, source));
    }
    assert_eq!(seen[0], (192, "memory".to_string()));
    assert_eq!(seen[1], (0, "none".to_string()));
}

/// Two servers on one directory: a checkpoint written by one after the other started is
/// found by the other (its index is refreshed from the directory on a miss).
#[test]
fn servers_sharing_a_directory_reuse_each_others_checkpoints() {
    let dir = tempfile::tempdir().unwrap();
    let p = tokens(300, 21);
    let a = start(Some(dir.path()), &[]);
    let b = start(Some(dir.path()), &[]);
    let (text, _, _) = complete(&a, &p);
    wait_written(&a, 1);
    let (again, cached, source) = complete(&b, &p);
    assert_eq!((again, cached, source.as_str()), (text, 256, "disk"));
}
