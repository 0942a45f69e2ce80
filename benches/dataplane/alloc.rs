//! A global allocator that counts, so the in-process scenarios can say how
//! many allocations a resync makes and how much heap vxmgr's state holds.
//! Relaxed atomics: the counts are read only between measured steps.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU64, Ordering};

pub struct Counting;

static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);
static ALLOCATED_BYTES: AtomicU64 = AtomicU64::new(0);
static IN_USE_BYTES: AtomicU64 = AtomicU64::new(0);

fn allocated(size: usize) {
    ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
    ALLOCATED_BYTES.fetch_add(size as u64, Ordering::Relaxed);
    IN_USE_BYTES.fetch_add(size as u64, Ordering::Relaxed);
}

fn freed(size: usize) {
    IN_USE_BYTES.fetch_sub(size as u64, Ordering::Relaxed);
}

// SAFETY: every call is passed on to the system allocator unchanged; the
// wrapper only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract is the system allocator's.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            allocated(layout.size());
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as for alloc.
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            allocated(layout.size());
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as for alloc.
        unsafe { System.dealloc(ptr, layout) };
        freed(layout.size());
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: as for alloc.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            // A realloc is one allocation of the new size replacing the old.
            freed(layout.size());
            allocated(new_size);
        }
        p
    }
}

/// The counters at one moment.
#[derive(Clone, Copy, Debug)]
pub struct Snapshot {
    pub allocations: u64,
    pub allocated_bytes: u64,
    pub in_use_bytes: u64,
}

pub fn snapshot() -> Snapshot {
    Snapshot {
        allocations: ALLOCATIONS.load(Ordering::Relaxed),
        allocated_bytes: ALLOCATED_BYTES.load(Ordering::Relaxed),
        in_use_bytes: IN_USE_BYTES.load(Ordering::Relaxed),
    }
}

impl Snapshot {
    /// Allocations and bytes allocated from `earlier` to `self`.
    pub fn since(&self, earlier: &Snapshot) -> (u64, u64) {
        (
            self.allocations - earlier.allocations,
            self.allocated_bytes - earlier.allocated_bytes,
        )
    }
}
