//! Freed memory handed back to the system after large changes.
//!
//! A cold start or a resync of a large cluster holds, for a moment, its
//! delta, its plan and the kernel's echoes of every change at once. The C
//! allocator keeps what they free in each thread's arena for reuse, so
//! without this the daemon's resident memory would stay at that peak.

/// Kernel operations after which free memory is handed back: what fewer
/// free is small and soon reused. Single node changes (ten or so
/// operations) reach it once in hundreds, so their latency stays clear of
/// it; the large batches of a cold start reach it at once, and what they
/// freed is handed back before their status goes out.
const LARGE_CHANGE: u32 = 5_000;

/// Counts kernel operations, and hands free memory back after every
/// `LARGE_CHANGE` of them: a cluster streamed in many batches is as large
/// a change as one in a single batch.
#[derive(Debug, Default)]
pub struct Releaser {
    operations: u32,
}

impl Releaser {
    pub fn count(&mut self, operations: u32) {
        self.operations = self.operations.saturating_add(operations);
        if self.operations >= LARGE_CHANGE {
            self.operations = 0;
            release_free_memory();
        }
    }
}

/// Returns the allocator's free pages, in every arena, to the system.
pub fn release_free_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only hands pages that hold no allocation back to
    // the kernel; it takes the allocator's locks as malloc does.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Makes every thread allocate from one arena. The C allocator gives each
/// thread an arena of its own; the daemon's threads take turns along one
/// pipeline (server, engine, kernel task), so they lose nothing to sharing
/// one, and what a batch frees is reused by the next whichever thread runs
/// it, instead of pinning pages in several arenas. Call before starting any
/// thread.
pub fn use_one_arena() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets an allocator parameter; no thread but the
    // caller's exists yet.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 1);
    }
}
