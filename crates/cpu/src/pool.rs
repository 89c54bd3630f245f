//! A persistent thread pool for data-parallel kernels.
//!
//! Workers are spawned once. Each call broadcasts one closure to every thread (the caller
//! runs index 0 itself) and returns when all are done, so per-call cost is a counter bump
//! and, only for workers that went to sleep, one wake-up. Idle workers spin briefly (the
//! next matmul of a forward pass usually follows within microseconds) and then park on a
//! condition variable. Each thread owns a reusable f32 scratch buffer, so steady-state
//! calls allocate nothing.

use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

use crate::CpuError;

/// The job signature: `(thread index, that thread's scratch buffer)`.
type Job<'a> = dyn Fn(usize, &mut Vec<f32>) + Sync + 'a;

/// Most threads a pool takes. Far above the cores of any machine the pool serves (every call
/// waits for all threads, so threads past the core count only slow it down), and far below
/// the count at which starting them exhausts memory: asked for 100,000, the OS ran out
/// after about 16,000, and a thread that cannot set itself up aborts the process instead of
/// returning an error.
pub const MAX_THREADS: usize = 1024;

/// `spin_loop` iterations before a waiting thread starts yielding (~10-20 µs on x86, where
/// one pause is tens of cycles).
const SPIN_LIMIT: u32 = 1 << 10;

/// `yield_now` calls after spinning before a worker parks: lets an oversubscribed machine
/// run the other threads while still answering the next call quickly.
const YIELD_LIMIT: u32 = 64;

struct Shared {
    /// Points at a `&Job` on the caller's stack while a call is in flight.
    job: AtomicPtr<()>,
    /// Bumped once per call (and at shutdown); workers run when it changes.
    generation: AtomicU64,
    /// Workers that have not yet finished the current call.
    pending: AtomicUsize,
    /// Workers currently parked or about to park.
    sleepers: AtomicUsize,
    shutdown: AtomicBool,
    panicked: AtomicBool,
    lock: Mutex<()>,
    wake: Condvar,
}

/// A fixed set of worker threads (see the module docs).
pub struct ThreadPool {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
    /// The caller's scratch; holding this lock also serializes concurrent calls.
    caller_scratch: Mutex<Vec<f32>>,
}

impl std::fmt::Debug for ThreadPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ThreadPool")
            .field("n_threads", &self.n_threads())
            .finish()
    }
}

/// Threads the machine offers (`std::thread::available_parallelism`), at least 1.
pub fn default_threads() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
}

impl ThreadPool {
    /// A pool of `n_threads` threads in all: the caller plus `n_threads - 1` workers.
    pub fn new(n_threads: usize) -> Result<Self, CpuError> {
        if n_threads == 0 {
            return Err(CpuError::ZeroThreads);
        }
        if n_threads > MAX_THREADS {
            return Err(CpuError::TooManyThreads {
                requested: n_threads,
                max: MAX_THREADS,
            });
        }
        let shared = Arc::new(Shared {
            job: AtomicPtr::new(std::ptr::null_mut()),
            generation: AtomicU64::new(0),
            pending: AtomicUsize::new(0),
            sleepers: AtomicUsize::new(0),
            shutdown: AtomicBool::new(false),
            panicked: AtomicBool::new(false),
            lock: Mutex::new(()),
            wake: Condvar::new(),
        });
        let mut pool = ThreadPool {
            shared,
            workers: Vec::new(),
            caller_scratch: Mutex::new(Vec::new()),
        };
        for index in 1..n_threads {
            let shared = Arc::clone(&pool.shared);
            let handle = std::thread::Builder::new()
                .name(format!("ferrite-cpu-{index}"))
                .spawn(move || worker_loop(&shared, index))
                .map_err(|e| CpuError::Spawn(e.to_string()))?;
            pool.workers.push(handle);
        }
        Ok(pool)
    }

    /// A pool sized to the machine ([`default_threads`]).
    pub fn with_default_threads() -> Result<Self, CpuError> {
        Self::new(default_threads())
    }

    /// Threads that run each call, the caller included.
    pub fn n_threads(&self) -> usize {
        self.workers.len() + 1
    }

    /// Runs `f(index, scratch)` once on every thread, `index` in `0..n_threads()`, and
    /// returns when all have finished. A panic in any of them is re-raised here after every
    /// thread is done with `f`. Calls from several threads are serialized; `f` must not call
    /// `run` on the same pool (it would wait for itself).
    pub fn run<F>(&self, f: F)
    where
        F: Fn(usize, &mut Vec<f32>) + Sync,
    {
        let mut scratch = self
            .caller_scratch
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if self.workers.is_empty() {
            f(0, &mut scratch);
            return;
        }
        let job: &Job<'_> = &f;
        let job_ref: &&Job<'_> = &job;
        let s = &*self.shared;
        s.panicked.store(false, Ordering::Relaxed);
        s.pending.store(self.workers.len(), Ordering::Relaxed);
        s.job.store(
            std::ptr::from_ref(job_ref).cast_mut().cast(),
            Ordering::Relaxed,
        );
        s.generation.fetch_add(1, Ordering::SeqCst);
        if s.sleepers.load(Ordering::SeqCst) > 0 {
            let _guard = s.lock.lock().unwrap_or_else(|p| p.into_inner());
            s.wake.notify_all();
        }
        let mine = catch_unwind(AssertUnwindSafe(|| f(0, &mut scratch)));
        // `f` lives on this stack frame: wait for every worker before returning or unwinding.
        let mut spins = 0u32;
        while s.pending.load(Ordering::Acquire) != 0 {
            if spins < SPIN_LIMIT {
                spins += 1;
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
        s.job.store(std::ptr::null_mut(), Ordering::Relaxed);
        if let Err(payload) = mine {
            resume_unwind(payload);
        }
        if s.panicked.load(Ordering::Acquire) {
            panic!("a ferrite-cpu worker thread panicked");
        }
    }
}

/// Consecutive ranges of `0..total`, `per` items each (the last may hold fewer), handed to
/// whichever thread asks next: a call's work goes to the threads that are running, so a
/// thread the OS has descheduled (another process busy on its core) delays the call by the
/// one range it holds, not by a fixed share of the call.
#[derive(Debug)]
pub(crate) struct Claims {
    next: AtomicUsize,
    total: usize,
    per: usize,
}

/// Ranges per thread a [`Claims`] aims at: enough for the running threads to take over a
/// stalled one's share, few enough that each range stays a long sequential read.
const CLAIMS_PER_THREAD: usize = 4;

impl Claims {
    /// Ranges of `0..total` for `threads` threads, each a multiple of `align` items (but
    /// the last).
    pub(crate) fn new(total: usize, threads: usize, align: usize) -> Claims {
        let align = align.max(1);
        let per = total.div_ceil(threads.max(1) * CLAIMS_PER_THREAD);
        Claims {
            next: AtomicUsize::new(0),
            total,
            per: per.max(1).next_multiple_of(align),
        }
    }

    /// The next unclaimed range, if any is left.
    pub(crate) fn claim(&self) -> Option<std::ops::Range<usize>> {
        let start = self.next.fetch_add(self.per, Ordering::Relaxed);
        (start < self.total).then(|| start..(start + self.per).min(self.total))
    }
}

fn worker_loop(s: &Shared, index: usize) {
    let mut seen = 0u64;
    let mut scratch: Vec<f32> = Vec::new();
    loop {
        let mut spins = 0u32;
        loop {
            let g = s.generation.load(Ordering::Acquire);
            if g != seen {
                seen = g;
                break;
            }
            if spins < SPIN_LIMIT {
                spins += 1;
                std::hint::spin_loop();
                continue;
            }
            if spins < SPIN_LIMIT + YIELD_LIMIT {
                spins += 1;
                std::thread::yield_now();
                continue;
            }
            let mut guard = s.lock.lock().unwrap_or_else(|p| p.into_inner());
            s.sleepers.fetch_add(1, Ordering::SeqCst);
            while s.generation.load(Ordering::SeqCst) == seen {
                guard = s.wake.wait(guard).unwrap_or_else(|p| p.into_inner());
            }
            s.sleepers.fetch_sub(1, Ordering::SeqCst);
            spins = 0;
        }
        if s.shutdown.load(Ordering::Acquire) {
            return;
        }
        let ptr = s.job.load(Ordering::Relaxed).cast::<&Job<'static>>();
        // SAFETY: the caller stored a pointer to a live `&Job` before bumping the generation
        // (the Acquire load above pairs with that SeqCst bump), and it keeps the closure and
        // the reference alive until `pending` reaches zero, which only happens after this
        // worker's decrement below. The 'static lifetime is never relied on past that point.
        let job: &Job<'_> = unsafe { *ptr };
        if catch_unwind(AssertUnwindSafe(|| job(index, &mut scratch))).is_err() {
            s.panicked.store(true, Ordering::Release);
        }
        s.pending.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Drop for ThreadPool {
    fn drop(&mut self) {
        let s = &*self.shared;
        s.shutdown.store(true, Ordering::Release);
        s.generation.fetch_add(1, Ordering::SeqCst);
        {
            let _guard = s.lock.lock().unwrap_or_else(|p| p.into_inner());
            s.wake.notify_all();
        }
        for h in self.workers.drain(..) {
            // A worker that panicked outside a job has nothing left to report.
            let _ = h.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    #[test]
    fn claims_cover_every_item_once_in_aligned_ranges() {
        for (total, threads, align) in [(0, 2, 16), (1, 2, 16), (100, 2, 16), (3071, 3, 1)] {
            let claims = Claims::new(total, threads, align);
            let mut seen = Vec::new();
            while let Some(r) = claims.claim() {
                assert!(r.start.is_multiple_of(align), "{r:?}");
                seen.extend(r);
            }
            assert_eq!(seen, (0..total).collect::<Vec<_>>());
        }
        let pool = ThreadPool::new(3).expect("pool");
        let claims = Claims::new(1000, 3, 4);
        let hits: Vec<AtomicUsize> = (0..1000).map(|_| AtomicUsize::new(0)).collect();
        pool.run(|_, _| {
            while let Some(r) = claims.claim() {
                for i in r {
                    hits[i].fetch_add(1, Ordering::Relaxed);
                }
            }
        });
        assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 1));
    }

    #[test]
    fn every_thread_runs_once_per_call_across_many_calls() {
        let pool = ThreadPool::new(3).expect("pool");
        assert_eq!(pool.n_threads(), 3);
        let hits: Vec<AtomicUsize> = (0..3).map(|_| AtomicUsize::new(0)).collect();
        for _ in 0..2000 {
            pool.run(|i, _| {
                hits[i].fetch_add(1, Ordering::Relaxed);
            });
        }
        for h in &hits {
            assert_eq!(h.load(Ordering::Relaxed), 2000);
        }
    }

    #[test]
    fn parked_workers_wake_up() {
        let pool = ThreadPool::new(2).expect("pool");
        // Long enough for the worker to exhaust its spin budget and park.
        std::thread::sleep(std::time::Duration::from_millis(50));
        let hits = AtomicUsize::new(0);
        pool.run(|_, _| {
            hits.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(hits.load(Ordering::Relaxed), 2);
    }

    #[test]
    fn scratch_is_reused_between_calls() {
        let pool = ThreadPool::new(2).expect("pool");
        pool.run(|_, s| s.resize(1024, 0.0));
        let caps: Vec<AtomicUsize> = (0..2).map(|_| AtomicUsize::new(0)).collect();
        pool.run(|i, s| caps[i].store(s.capacity(), Ordering::Relaxed));
        assert!(caps.iter().all(|c| c.load(Ordering::Relaxed) >= 1024));
    }

    #[test]
    fn zero_threads_is_an_error() {
        assert!(matches!(ThreadPool::new(0), Err(CpuError::ZeroThreads)));
    }

    #[test]
    fn more_threads_than_the_limit_is_an_error_and_the_limit_works() {
        assert!(matches!(
            ThreadPool::new(MAX_THREADS + 1),
            Err(CpuError::TooManyThreads {
                requested,
                max: MAX_THREADS
            }) if requested == MAX_THREADS + 1
        ));
        let pool = ThreadPool::new(MAX_THREADS).expect("a pool of the most threads");
        let ran = AtomicUsize::new(0);
        pool.run(|_, _| {
            ran.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(ran.load(Ordering::Relaxed), MAX_THREADS);
    }

    #[test]
    fn worker_panic_is_reraised_and_pool_survives() {
        let pool = ThreadPool::new(2).expect("pool");
        let r = catch_unwind(AssertUnwindSafe(|| {
            pool.run(|i, _| {
                if i == 1 {
                    panic!("boom");
                }
            })
        }));
        assert!(r.is_err());
        let hits = AtomicUsize::new(0);
        pool.run(|_, _| {
            hits.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(hits.load(Ordering::Relaxed), 2);
    }
}
