//! A counting global allocator: how many bytes are live, the peak since a
//! [`Mark`], and the largest single allocation since it. Lets a target
//! assert that an input cannot make the code allocate without bound (an
//! announced length taken on trust, for example).

use std::{
    alloc::{GlobalAlloc, Layout, System},
    sync::atomic::{AtomicUsize, Ordering::Relaxed},
};

/// The system allocator, counted.
pub struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);
static LARGEST: AtomicUsize = AtomicUsize::new(0);

fn grew(by: usize, size: usize) {
    let live = LIVE.fetch_add(by, Relaxed) + by;
    PEAK.fetch_max(live, Relaxed);
    LARGEST.fetch_max(size, Relaxed);
}

// SAFETY: every call is forwarded unchanged to `System`; the counters are
// bookkeeping only.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: same contract as ours.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            grew(layout.size(), layout.size());
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: same contract as ours.
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            grew(layout.size(), layout.size());
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as ours.
        unsafe { System.dealloc(ptr, layout) };
        LIVE.fetch_sub(layout.size(), Relaxed);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: same contract as ours.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            if new_size >= layout.size() {
                grew(new_size - layout.size(), new_size);
            } else {
                LIVE.fetch_sub(layout.size() - new_size, Relaxed);
            }
        }
        p
    }
}

/// A point to measure allocations from.
pub struct Mark {
    live: usize,
}

/// What was allocated since a [`Mark`].
#[derive(Debug, Clone, Copy)]
pub struct Usage {
    /// Highest live bytes above those live at the mark.
    pub peak: usize,
    /// Largest single allocation (or reallocation's new size).
    pub largest: usize,
}

impl Mark {
    /// Starts measuring (single-threaded use: the targets run one input at
    /// a time, and the counters are global).
    pub fn now() -> Mark {
        let live = LIVE.load(Relaxed);
        PEAK.store(live, Relaxed);
        LARGEST.store(0, Relaxed);
        Mark { live }
    }

    /// What was allocated since the mark.
    pub fn usage(&self) -> Usage {
        Usage {
            peak: PEAK.load(Relaxed).saturating_sub(self.live),
            largest: LARGEST.load(Relaxed),
        }
    }
}
