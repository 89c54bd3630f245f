//! [`CountingAlloc`]: a global allocator for tests that bound the memory a parser may
//! allocate on hostile input. It forwards every call to the system allocator and keeps, per
//! thread, the bytes live, their peak and the largest single request; [`measure`] reports
//! both for one closure.
//!
//! A test binary opts in with
//! `#[global_allocator] static A: ferrite_testkit::CountingAlloc = ferrite_testkit::CountingAlloc;`.
//! Counts are per thread, so tests running in parallel do not see each other's allocations.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

/// The counting allocator (see the module doc).
#[derive(Debug, Clone, Copy, Default)]
pub struct CountingAlloc;

thread_local! {
    static CURRENT: Cell<usize> = const { Cell::new(0) };
    static PEAK: Cell<usize> = const { Cell::new(0) };
    static LARGEST: Cell<usize> = const { Cell::new(0) };
}

// SAFETY: forwards every call to the system allocator unchanged; the bookkeeping only
// touches const-initialised thread-locals without destructors, which never allocate.
unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let cur = CURRENT.get() + layout.size();
        CURRENT.set(cur);
        PEAK.set(PEAK.get().max(cur));
        LARGEST.set(LARGEST.get().max(layout.size()));
        // SAFETY: same contract as our caller's.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        CURRENT.set(CURRENT.get().saturating_sub(layout.size()));
        // SAFETY: same contract as our caller's.
        unsafe { System.dealloc(ptr, layout) }
    }
}

/// What one [`measure`]d closure allocated on its thread.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AllocStats {
    /// Highest heap growth over the bytes live when the closure started.
    pub peak_growth: usize,
    /// The largest single allocation.
    pub largest: usize,
}

/// Runs `f` and reports its allocations. Only meaningful in a binary whose global
/// allocator is [`CountingAlloc`] (otherwise both numbers are 0).
pub fn measure<T>(f: impl FnOnce() -> T) -> (T, AllocStats) {
    let base = CURRENT.get();
    PEAK.set(base);
    LARGEST.set(0);
    let out = f();
    let stats = AllocStats {
        peak_growth: PEAK.get() - base,
        largest: LARGEST.get(),
    };
    (out, stats)
}
