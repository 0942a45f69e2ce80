//! Freed memory handed back to the system after large changes.
//!
//! A cold start or a resync of a large cluster holds, for a moment, its
//! delta, its plan and the kernel's echoes of every change at once. The C
//! allocator keeps what they free in each thread's arena for reuse, so
//! without this the daemon's resident memory would stay at that peak.

/// A batch of at least this many kernel operations (or a burst of as many
/// notifications) is large: what its delta, plan and operations freed is
/// handed back before its status goes out, so that a daemon converged by
/// large batches (a cold start) holds its state and little more.
const LARGE_BATCH: u32 = 1_000;

/// Kernel operations of small batches after which free memory is handed
/// back too: single node changes (ten or so operations) reach it once in
/// hundreds, so their latency stays clear of it.
const MANY_SMALL: u32 = 5_000;

/// Counts kernel operations and hands free memory back after each large
/// batch, and after every `MANY_SMALL` operations of smaller ones.
#[derive(Debug, Default)]
pub struct Releaser {
    operations: u32,
}

impl Releaser {
    pub fn count(&mut self, operations: u32) {
        self.operations = self.operations.saturating_add(operations);
        if operations >= LARGE_BATCH || self.operations >= MANY_SMALL {
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
