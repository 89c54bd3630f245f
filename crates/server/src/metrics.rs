//! Server counters, the engine's gauges (occupancy, every cache's size against its budget,
//! the process's resident memory) and the one-line-per-request log.
//!
//! A [`RequestLog`] is created per request by the logging middleware; handlers fill in token
//! counts and timings, and streaming bodies keep a clone alive until the stream ends. When the
//! last clone drops, the line is written to stderr and the counters are updated, so a
//! cancelled stream is logged and counted exactly once too.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use ferrite_engine::{EngineStats, Timings, Usage};

/// Process-wide counters exposed at `/metrics`.
#[derive(Debug, Default)]
pub struct Metrics {
    requests: Mutex<BTreeMap<(String, u16), u64>>,
    prompt_tokens: AtomicU64,
    cached_tokens: AtomicU64,
    generated_tokens: AtomicU64,
    cache_hits: AtomicU64,
    disk_cache_hits: AtomicU64,
    cancelled: AtomicU64,
}

impl Metrics {
    fn requests(&self) -> MutexGuard<'_, BTreeMap<(String, u16), u64>> {
        // A panic while holding this lock cannot leave the map inconsistent.
        self.requests.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Prometheus text exposition of the counters plus the engine's gauges.
    pub fn render(&self, engine: Option<EngineStats>) -> String {
        let mut out = String::new();
        out.push_str("# HELP ferrite_requests_total HTTP requests by endpoint and status.\n");
        out.push_str("# TYPE ferrite_requests_total counter\n");
        for ((endpoint, status), n) in self.requests().iter() {
            let _ = writeln!(
                out,
                "ferrite_requests_total{{endpoint=\"{endpoint}\",status=\"{status}\"}} {n}"
            );
        }
        let counters = [
            (
                "ferrite_prompt_tokens_total",
                "Prompt tokens of generation requests.",
                &self.prompt_tokens,
            ),
            (
                "ferrite_cached_prompt_tokens_total",
                "Prompt tokens reused from a slot's KV cache.",
                &self.cached_tokens,
            ),
            (
                "ferrite_generated_tokens_total",
                "Generated tokens.",
                &self.generated_tokens,
            ),
            (
                "ferrite_cache_hits_total",
                "Generation requests that reused cached prompt tokens.",
                &self.cache_hits,
            ),
            (
                "ferrite_cache_disk_hits_total",
                "Generation requests whose reused prefix came from the disk cache.",
                &self.disk_cache_hits,
            ),
            (
                "ferrite_cancelled_requests_total",
                "Generation requests whose client went away.",
                &self.cancelled,
            ),
        ];
        for (name, help, value) in counters {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter");
            let _ = writeln!(out, "{name} {}", value.load(Ordering::Relaxed));
        }
        let stats = engine.unwrap_or_default();
        let gauges = [
            (
                "ferrite_queue_depth",
                "Requests waiting for a slot.",
                stats.queue_depth as u64,
            ),
            (
                "ferrite_queue_limit",
                "Most requests that may wait for a slot.",
                stats.queue_limit as u64,
            ),
            (
                "ferrite_slots_active",
                "Slots running a request.",
                stats.slots_active as u64,
            ),
            (
                "ferrite_slots_total",
                "Slots (parallel sequences).",
                stats.slots_total as u64,
            ),
            (
                "ferrite_prefix_cache_memory_bytes",
                "Bytes of prefix-cache checkpoints held in memory.",
                stats.prefix_memory_bytes,
            ),
            (
                "ferrite_prefix_cache_memory_budget_bytes",
                "Memory budget of the prefix cache (0: none).",
                stats.prefix_memory_budget,
            ),
            (
                "ferrite_prefix_cache_memory_entries",
                "Prefix-cache checkpoints held in memory.",
                stats.prefix_memory_entries,
            ),
            (
                "ferrite_kv_disk_bytes",
                "Bytes of the disk cache directory (entries and live writers' temporary files).",
                stats.kv_disk_bytes,
            ),
            (
                "ferrite_kv_disk_budget_bytes",
                "Byte budget of the disk cache directory (0: none).",
                stats.kv_disk_budget,
            ),
            (
                "ferrite_kv_disk_files",
                "Complete files of the disk cache directory.",
                stats.kv_disk_files,
            ),
        ];
        let engine_counters = [
            (
                "ferrite_kv_disk_written_total",
                "Disk-cache snapshot files written.",
                stats.kv_disk_written,
            ),
            (
                "ferrite_kv_disk_rejected_total",
                "Disk-cache snapshot files rejected (other model or setting, damaged).",
                stats.kv_disk_rejected,
            ),
            (
                "ferrite_batched_steps_total",
                "Engine steps that evaluated several slots in one forward pass.",
                stats.batched_steps,
            ),
            (
                "ferrite_spec_proposed_tokens_total",
                "Draft tokens speculation proposed and verified (serve --lookup).",
                stats.spec_proposed,
            ),
            (
                "ferrite_spec_accepted_tokens_total",
                "Draft tokens verification accepted (emitted without a forward pass of their own).",
                stats.spec_accepted,
            ),
        ];
        for (name, help, value) in engine_counters {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} counter\n{name} {value}"
            );
        }
        let resident = resident_bytes().map(|b| {
            (
                "ferrite_process_resident_bytes",
                "Resident memory of the server process (VmRSS of /proc/self/status).",
                b,
            )
        });
        for (name, help, value) in gauges.into_iter().chain(resident) {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {value}"
            );
        }
        out
    }
}

/// The process's resident set in bytes, where the system says (Linux `/proc`); `None`
/// elsewhere, and then `/metrics` leaves the line out rather than report 0. Read from
/// `/proc/self/status` (kB) rather than `statm` (pages), which would need the page size
/// from libc.
fn resident_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    parse_vm_rss(&status)
}

/// The `VmRSS:` line of a `/proc/PID/status` text, in bytes.
fn parse_vm_rss(status: &str) -> Option<u64> {
    let line = status.lines().find_map(|l| l.strip_prefix("VmRSS:"))?;
    let kb: u64 = line.trim().strip_suffix("kB")?.trim().parse().ok()?;
    kb.checked_mul(1024)
}

/// The metrics label of a path: known routes by name, everything else as `other`, so
/// clients cannot grow the label set without bound.
fn endpoint_label(path: &str) -> &str {
    const ROUTES: [&str; 11] = [
        "/health",
        "/metrics",
        "/v1/models",
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/messages",
        "/v1/messages/count_tokens",
        "/v1/responses",
        "/tokenize",
        "/detokenize",
        "/v1/models/{id}",
    ];
    if path.starts_with("/v1/models/") {
        return "/v1/models/{id}";
    }
    ROUTES
        .iter()
        .find(|r| **r == path)
        .copied()
        .unwrap_or("other")
}

/// Fields of one request's log line.
#[derive(Debug)]
struct Entry {
    id: u64,
    method: String,
    path: String,
    status: u16,
    start: Instant,
    usage: Option<Usage>,
    timings: Timings,
    ttft: Option<Duration>,
    finished: bool,
    generation: bool,
    metrics: Arc<Metrics>,
}

impl Drop for Entry {
    fn drop(&mut self) {
        let total = self.start.elapsed();
        let mut line = format!(
            "req {} {} {} {} total={}ms",
            self.id,
            self.method,
            self.path,
            self.status,
            total.as_millis()
        );
        if let Some(u) = self.usage {
            let t = &self.timings;
            let _ = write!(
                line,
                " in={} cached={} cache={} out={} queue={}ms prefill={}ms decode={}ms",
                u.prompt_tokens,
                u.cached_tokens,
                u.cache_source.as_str(),
                u.completion_tokens,
                t.queue.as_millis(),
                t.prefill.as_millis(),
                t.decode.as_millis()
            );
            if let Some(ttft) = self.ttft {
                let _ = write!(line, " ttft={}ms", ttft.as_millis());
            }
            let m = &self.metrics;
            m.prompt_tokens
                .fetch_add(u.prompt_tokens as u64, Ordering::Relaxed);
            m.cached_tokens
                .fetch_add(u.cached_tokens as u64, Ordering::Relaxed);
            m.generated_tokens
                .fetch_add(u.completion_tokens as u64, Ordering::Relaxed);
            if u.cached_tokens > 0 {
                m.cache_hits.fetch_add(1, Ordering::Relaxed);
                if u.cache_source == ferrite_engine::CacheSource::Disk {
                    m.disk_cache_hits.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        if self.generation && !self.finished && self.status < 400 {
            line.push_str(" cancelled");
            self.metrics.cancelled.fetch_add(1, Ordering::Relaxed);
        }
        eprintln!("{line}");
        *self
            .metrics
            .requests()
            .entry((endpoint_label(&self.path).to_string(), self.status))
            .or_default() += 1;
    }
}

/// Shared handle on one request's log line; the line is written when the last clone drops.
#[derive(Clone, Debug)]
pub struct RequestLog(Arc<Mutex<Entry>>);

impl RequestLog {
    /// Start the log of a request.
    pub fn new(id: u64, method: &str, path: &str, metrics: Arc<Metrics>) -> RequestLog {
        RequestLog(Arc::new(Mutex::new(Entry {
            id,
            method: method.to_string(),
            path: path.to_string(),
            status: 0,
            start: Instant::now(),
            usage: None,
            timings: Timings::default(),
            ttft: None,
            finished: false,
            generation: false,
            metrics,
        })))
    }

    fn entry(&self) -> MutexGuard<'_, Entry> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The request's sequence number.
    pub fn id(&self) -> u64 {
        self.entry().id
    }

    /// Record the response status.
    pub fn set_status(&self, status: u16) {
        self.entry().status = status;
    }

    /// Mark this request as a generation (so an unfinished one is logged as cancelled).
    pub fn start_generation(&self) {
        self.entry().generation = true;
    }

    /// Record the first generated token's arrival.
    pub fn first_token(&self) {
        let mut e = self.entry();
        if e.ttft.is_none() {
            e.ttft = Some(e.start.elapsed());
        }
    }

    /// Add one finished generation's counts (n > 1 adds several; prompt counted once).
    pub fn add_usage(&self, usage: Usage, timings: Timings) {
        let mut e = self.entry();
        let u = e.usage.get_or_insert(Usage {
            prompt_tokens: usage.prompt_tokens,
            cached_tokens: 0,
            completion_tokens: 0,
            cache_source: usage.cache_source,
        });
        if usage.cached_tokens > u.cached_tokens {
            u.cached_tokens = usage.cached_tokens;
            u.cache_source = usage.cache_source;
        }
        u.completion_tokens += usage.completion_tokens;
        e.timings.queue = e.timings.queue.max(timings.queue);
        e.timings.prefill = e.timings.prefill.max(timings.prefill);
        e.timings.decode = e.timings.decode.max(timings.decode);
    }

    /// All generations of this request ended normally.
    pub fn finish(&self) {
        self.entry().finished = true;
    }
}

/// Source of request sequence numbers.
#[derive(Debug, Default)]
pub struct RequestIds(AtomicU64);

impl RequestIds {
    /// The next id (starting at 1).
    pub fn next(&self) -> u64 {
        self.0.fetch_add(1, Ordering::Relaxed) + 1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_counts_once_when_last_clone_drops() {
        let m = Arc::new(Metrics::default());
        let log = RequestLog::new(1, "POST", "/v1/completions", m.clone());
        log.set_status(200);
        log.start_generation();
        let held = log.clone();
        log.add_usage(
            Usage {
                prompt_tokens: 5,
                cached_tokens: 3,
                completion_tokens: 2,
                ..Usage::default()
            },
            Timings::default(),
        );
        drop(log);
        assert!(!m.render(None).contains("status=\"200\"} 1"));
        drop(held);
        let text = m.render(None);
        assert!(
            text.contains("ferrite_requests_total{endpoint=\"/v1/completions\",status=\"200\"} 1")
        );
        assert!(text.contains("ferrite_cached_prompt_tokens_total 3"));
        assert!(text.contains("ferrite_cache_hits_total 1"));
        assert!(text.contains("ferrite_cancelled_requests_total 1"));
    }

    /// Every cache gauge comes from the engine's figures, and the resident set from the
    /// system. Oracle: the values put in, and this process's own `/proc/self/status`.
    #[test]
    fn cache_gauges_and_resident_memory_are_rendered() {
        let text = Metrics::default().render(Some(EngineStats {
            prefix_memory_bytes: 11,
            prefix_memory_budget: 12,
            prefix_memory_entries: 13,
            kv_disk_bytes: 14,
            kv_disk_budget: 15,
            kv_disk_files: 16,
            queue_limit: 17,
            spec_proposed: 18,
            spec_accepted: 19,
            ..EngineStats::default()
        }));
        for line in [
            "ferrite_prefix_cache_memory_bytes 11",
            "ferrite_prefix_cache_memory_budget_bytes 12",
            "ferrite_prefix_cache_memory_entries 13",
            "ferrite_kv_disk_bytes 14",
            "ferrite_kv_disk_budget_bytes 15",
            "ferrite_kv_disk_files 16",
            "ferrite_queue_limit 17",
            "ferrite_spec_proposed_tokens_total 18",
            "ferrite_spec_accepted_tokens_total 19",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} missing:\n{text}");
        }
        if std::path::Path::new("/proc/self/status").exists() {
            let rss = text
                .lines()
                .find_map(|l| l.strip_prefix("ferrite_process_resident_bytes "))
                .expect("resident bytes on Linux");
            assert!(rss.parse::<u64>().unwrap() > 1 << 20, "{rss}");
        } else {
            println!("skipped: no /proc/self/status on this system");
        }
        assert_eq!(
            parse_vm_rss("Name:\tx\nVmRSS:\t  1234 kB\n"),
            Some(1234 * 1024)
        );
        assert_eq!(parse_vm_rss("VmRSS: lots\n"), None);
        assert_eq!(parse_vm_rss("VmHWM: 5 kB\n"), None);
    }

    #[test]
    fn unknown_paths_share_one_label() {
        let m = Arc::new(Metrics::default());
        for path in ["/a", "/b/c", "/v1/models/x", "/v1/models/y"] {
            RequestLog::new(1, "GET", path, m.clone()).set_status(404);
        }
        let text = m.render(None);
        assert!(
            text.contains("endpoint=\"other\",status=\"404\"} 2"),
            "{text}"
        );
        assert!(
            text.contains("endpoint=\"/v1/models/{id}\",status=\"404\"} 2"),
            "{text}"
        );
    }
}
