//! `ferrite run`'s end-of-run report: load, first-token, prefill and decode clocks, the
//! speculation counts, the backend line and the CUDA path markers. It only prints what
//! the run measured; it must never time anything itself.

use std::time::Duration;

use ferrite_engine::speculate::Stats;

use super::Loaded;

/// Counters for the end-of-run report.
#[derive(Default)]
pub(super) struct Clocks {
    pub(super) prompt_tokens: usize,
    pub(super) prefill: Duration,
    pub(super) generated: usize,
    /// Tokens sampled after the first (the first one's time belongs to prefill).
    pub(super) decoded: usize,
    pub(super) decode: Duration,
    /// What `--lookup` or `--draft-model` did, when one ran.
    pub(super) speculation: Option<SpeculationReport>,
}

/// What speculation did during one generation.
pub(super) struct SpeculationReport {
    /// The proposer (`lookup`, `draft`).
    pub(super) name: &'static str,
    pub(super) stats: Stats,
    /// Steps the adaptive draft length decoded plainly, and the probes among its steps.
    pub(super) off_steps: usize,
    pub(super) probes: usize,
    /// Why the draft model stopped proposing, when it failed.
    pub(super) failure: Option<String>,
}

/// The end-of-run lines on stderr: clocks, what speculation did, the backend line and,
/// when asked, the CUDA launch counts.
pub(super) fn report(loaded: &Loaded, clocks: &Clocks, ttft: Option<Duration>) {
    let rate = |n: usize, d: Duration| {
        if d.is_zero() {
            0.0
        } else {
            n as f64 / d.as_secs_f64()
        }
    };
    eprintln!(
        "load {:.0} ms | ttft {:.0} ms | prefill {:.1} tok/s | decode {:.1} tok/s | tokens in {} out {}",
        loaded.load_time.as_secs_f64() * 1e3,
        ttft.unwrap_or_default().as_secs_f64() * 1e3,
        rate(clocks.prompt_tokens, clocks.prefill),
        rate(clocks.decoded, clocks.decode),
        clocks.prompt_tokens,
        clocks.generated
    );
    if let Some(sp) = &clocks.speculation {
        let st = &sp.stats;
        eprintln!(
            "{}: proposed {} accepted {} ({:.1} %) | {:.2} tokens per step over {} steps | \
             off {} steps, {} probes",
            sp.name,
            st.proposed,
            st.accepted,
            st.acceptance() * 100.0,
            st.tokens_per_step(clocks.generated),
            st.steps,
            sp.off_steps,
            sp.probes
        );
        if let Some(failure) = &sp.failure {
            eprintln!("note: {failure}");
        }
    }
    eprintln!("{}", loaded.backend_line());
    if let Some(cuda) = &loaded.cuda
        && std::env::var_os(COUNTS_ENV).is_some_and(|v| v == "1")
    {
        let counts = cuda.backend.launch_counts();
        let ran: Vec<String> = counts
            .iter()
            .filter(|(_, n)| **n > 0)
            .map(|(k, n)| format!("{k}={n}"))
            .collect();
        eprintln!("cuda launches: {}", ran.join(" "));
    }
}

/// Set to `1`, a CUDA run ends with a line of the kernel launch counts (the path markers:
/// which products, attention and sampling kernels ran).
const COUNTS_ENV: &str = "FERRITE_CUDA_COUNTS";
