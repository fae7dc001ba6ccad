//! A counting global allocator for the peak-memory case.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};

/// The counting allocator this binary runs on, once [`install`] named it.
static INSTALLED: OnceLock<&'static CountingAllocator> = OnceLock::new();

/// Names `allocator`, which must be this binary's `#[global_allocator]`, to the peak-memory
/// case ([`memory_bound!`](crate::memory_bound) does both). A second call is ignored.
pub fn install(allocator: &'static CountingAllocator) {
    let _ = INSTALLED.set(allocator);
}

/// The allocator [`install`] named, if any.
pub fn installed() -> Option<&'static CountingAllocator> {
    INSTALLED.get().copied()
}

/// Forwards to the system allocator and tracks live bytes and their peak.
#[derive(Debug)]
pub struct CountingAllocator {
    live: AtomicUsize,
    peak: AtomicUsize,
}

impl CountingAllocator {
    /// A counter at zero.
    pub const fn new() -> Self {
        Self {
            live: AtomicUsize::new(0),
            peak: AtomicUsize::new(0),
        }
    }

    /// Starts a measurement: the peak is reset to the bytes live now, which are returned.
    pub fn reset(&self) -> usize {
        let live = self.live.load(Ordering::SeqCst);
        self.peak.store(live, Ordering::SeqCst);
        live
    }

    /// The most bytes live since the last [`reset`](Self::reset).
    pub fn peak(&self) -> usize {
        self.peak.load(Ordering::SeqCst)
    }
}

impl Default for CountingAllocator {
    fn default() -> Self {
        Self::new()
    }
}

// SAFETY: every call is forwarded to `System` with the caller's arguments; the counters are
// bookkeeping only.
unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let live = self.live.fetch_add(layout.size(), Ordering::SeqCst) + layout.size();
        self.peak.fetch_max(live, Ordering::SeqCst);
        // SAFETY: forwarded with the caller's layout.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        self.live.fetch_sub(layout.size(), Ordering::SeqCst);
        // SAFETY: `ptr` was allocated by `System` with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if new_size >= layout.size() {
            let live = self
                .live
                .fetch_add(new_size - layout.size(), Ordering::SeqCst)
                + new_size
                - layout.size();
            self.peak.fetch_max(live, Ordering::SeqCst);
        } else {
            self.live
                .fetch_sub(layout.size() - new_size, Ordering::SeqCst);
        }
        // SAFETY: forwarded with the caller's arguments.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}
