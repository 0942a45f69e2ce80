//! Freed memory handed back to the system after large changes.
//!
//! A cold start or a resync of a large cluster holds, for a moment, its
//! delta, its plan and the kernel's echoes of every change at once. The C
//! allocator keeps what they free in each thread's arena for reuse, so
//! without this the daemon's resident memory would stay at that peak.

/// Kernel operations after which free memory is handed back even while
/// batches keep coming: what fewer free is small and soon reused.
const LARGE_CHANGE: u32 = 10_000;

/// Kernel operations after which free memory is handed back once the
/// kernel task has nothing waiting, so that a converged daemon does not
/// keep what the last part of a large change freed. Single node changes
/// (ten or so operations) reach it rarely: their latency stays clear of it.
const SETTLED_CHANGE: u32 = 5_000;

/// Counts kernel operations, and hands free memory back after every
/// `LARGE_CHANGE` of them, or after `SETTLED_CHANGE` once nothing more is
/// waiting: a cluster streamed in many batches is as large a change as
/// one in a single batch.
#[derive(Debug, Default)]
pub struct Releaser {
    operations: u32,
}

impl Releaser {
    /// Counts a batch's operations; `idle`: no other command is waiting.
    pub fn count(&mut self, operations: u32, idle: bool) {
        self.operations = self.operations.saturating_add(operations);
        let threshold = if idle { SETTLED_CHANGE } else { LARGE_CHANGE };
        if self.operations >= threshold {
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
