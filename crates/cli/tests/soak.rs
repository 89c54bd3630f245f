//! The short soak of the default lane (issue 35, defect 6: RSS rose under load with no
//! plateau, and nothing said which memory grew). Sixteen streaming clients, a quarter of
//! them hanging up mid-stream, for a fixed time against `ferrite serve` with SmolLM2 and
//! small cache budgets, so the memory and disk caches fill and evict within seconds.
//! `/metrics` is sampled throughout. The long version is `scripts/soak.sh`.

mod common;
mod server_util;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use serde_json::json;
use server_util::Server;

/// How long the clients run; bounded so the test stays well inside the lane.
const LOAD: Duration = Duration::from_secs(16);
const CLIENTS: usize = 16;
const MEMORY_MB: u64 = 6;
const DISK_MB: u64 = 12;
/// RSS may rise this much after warm-up (allocator noise; no cache may grow by it).
const RSS_SLACK: f64 = 48.0 * 1024.0 * 1024.0;

fn gauges(text: &str) -> BTreeMap<String, f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (name, value) = l.split_once(' ')?;
            Some((name.to_string(), value.parse().ok()?))
        })
        .collect()
}

/// Words from a small list, `n` of them, picked by `seed` (prompts of mixed lengths that
/// share prefixes).
fn words(seed: usize, n: usize) -> String {
    const W: [&str; 12] = [
        "river", "stone", "market", "winter", "engine", "garden", "signal", "copper", "harbor",
        "lantern", "orbit", "meadow",
    ];
    (0..n)
        .map(|i| W[(seed * 7 + i * 5 + i * i) % W.len()])
        .collect::<Vec<_>>()
        .join(" ")
}

fn client(srv: &Server, id: usize, stop: &AtomicBool, done: &AtomicUsize, cut: &AtomicUsize) {
    let prefixes = [words(1, 90), words(2, 180), words(3, 300)];
    let mut k = id;
    while !stop.load(Ordering::Relaxed) {
        k += CLIENTS;
        let prompt = format!("{} {}", prefixes[k % 3], words(k, 3 + k % 17));
        let body = json!({
            "prompt": prompt,
            "max_tokens": 2 + k % 7,
            "stream": true,
            "temperature": if k.is_multiple_of(2) { 0.0 } else { 0.8 },
        });
        // Every client hangs up on one request in four (k / CLIENTS counts its requests),
        // after the first bytes of the stream.
        if (k / CLIENTS + id).is_multiple_of(4) {
            drop(srv.open_stream("/v1/completions", &body, 1, &[]));
            cut.fetch_add(1, Ordering::Relaxed);
            continue;
        }
        let r = srv.post("/v1/completions", &body);
        if r.status == 429 {
            std::thread::sleep(Duration::from_millis(100));
            continue;
        }
        assert_eq!(r.status, 200, "{}", r.body);
        assert!(
            r.body.contains("data: [DONE]"),
            "unfinished stream: {}",
            r.body
        );
        done.fetch_add(1, Ordering::Relaxed);
    }
}

/// Oracle: the budgets given on the command line, checked against the server's own
/// gauges in every sample; and the resident set after warm-up against its peak during
/// warm-up. A cache that ignores its budget shows as bytes over the budget; a leak of the
/// size of a checkpoint per request shows as RSS growth past the slack.
#[test]
fn caches_stay_within_budget_and_rss_is_flat_under_streaming_load() {
    let model = common::pull("smollm2-135m-instruct");
    let disk = tempfile::tempdir().unwrap();
    let (mem, dsk) = (MEMORY_MB.to_string(), DISK_MB.to_string());
    let srv = Arc::new(Server::start(&[
        "-m",
        model.to_str().unwrap(),
        "--backend",
        "cpu",
        "--threads",
        "2",
        "--parallel",
        "4",
        "--ctx",
        "1024",
        "--kv-mem-space-mb",
        &mem,
        "--kv-disk-dir",
        disk.path().to_str().unwrap(),
        "--kv-disk-space-mb",
        &dsk,
    ]));
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicUsize::new(0));
    let cut = Arc::new(AtomicUsize::new(0));
    let threads: Vec<_> = (0..CLIENTS)
        .map(|id| {
            let (srv, stop, done, cut) = (srv.clone(), stop.clone(), done.clone(), cut.clone());
            std::thread::spawn(move || client(&srv, id, &stop, &done, &cut))
        })
        .collect();
    let start = Instant::now();
    let mut samples: Vec<(Duration, BTreeMap<String, f64>)> = Vec::new();
    while start.elapsed() < LOAD {
        std::thread::sleep(Duration::from_millis(250));
        let m = srv.get("/metrics");
        assert_eq!(m.status, 200);
        samples.push((start.elapsed(), gauges(&m.body)));
    }
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        t.join().expect("a client failed");
    }
    let g = |s: &BTreeMap<String, f64>, k: &str| -> f64 {
        *s.get(k).unwrap_or_else(|| panic!("/metrics lacks {k}"))
    };
    let (budget, disk_budget) = (MEMORY_MB as f64 * 1048576.0, DISK_MB as f64 * 1048576.0);
    let mut peak = (0.0f64, 0.0f64);
    for (t, s) in &samples {
        assert_eq!(g(s, "ferrite_prefix_cache_memory_budget_bytes"), budget);
        assert_eq!(g(s, "ferrite_kv_disk_budget_bytes"), disk_budget);
        let (m, d) = (
            g(s, "ferrite_prefix_cache_memory_bytes"),
            g(s, "ferrite_kv_disk_bytes"),
        );
        assert!(
            m <= budget,
            "at {t:?}: memory cache {m} bytes > budget {budget}"
        );
        assert!(
            d <= disk_budget,
            "at {t:?}: disk cache {d} bytes > budget {disk_budget}"
        );
        peak = (peak.0.max(m), peak.1.max(d));
    }
    // The budgets were under pressure, or the checks above prove nothing.
    let last = &samples.last().expect("no samples").1;
    let written = g(last, "ferrite_kv_disk_written_total");
    let hits = g(last, "ferrite_cache_hits_total");
    let (done, cut) = (done.load(Ordering::Relaxed), cut.load(Ordering::Relaxed));
    println!(
        "{} samples, {done} streams finished, {cut} cut off, memory cache peak {:.1} MiB of \
         {MEMORY_MB}, disk peak {:.1} MiB of {DISK_MB}, {written} files written, {hits} hits",
        samples.len(),
        peak.0 / 1048576.0,
        peak.1 / 1048576.0
    );
    assert!(
        done >= 8 && cut >= 2,
        "too little load: {done} done, {cut} cut off"
    );
    assert!(peak.0 > budget / 2.0, "memory cache never filled: {peak:?}");
    assert!(
        peak.1 > disk_budget / 2.0,
        "disk cache never filled: {peak:?}"
    );
    // Flat after warm-up: the later half never exceeds the first half's peak plus slack.
    let rss: Vec<(Duration, f64)> = samples
        .iter()
        .map(|(t, s)| (*t, g(s, "ferrite_process_resident_bytes")))
        .collect();
    let half = LOAD / 2;
    let warm = rss.iter().filter(|(t, _)| *t < half).map(|x| x.1);
    let after = rss.iter().filter(|(t, _)| *t >= half).map(|x| x.1);
    let (warm, after) = (warm.fold(0.0, f64::max), after.fold(0.0, f64::max));
    println!(
        "RSS peak {:.1} MiB in warm-up, {:.1} MiB after",
        warm / 1048576.0,
        after / 1048576.0
    );
    assert!(
        after <= warm + RSS_SLACK,
        "RSS grew after warm-up: {after} > {warm} + {RSS_SLACK}"
    );
}
