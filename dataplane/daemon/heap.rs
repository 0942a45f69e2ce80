//! Freed memory handed back to the system after large changes.
//!
//! A cold start or a resync of a large cluster holds, for a moment, its
//! delta, its plan and the kernel's echoes of every change at once. The C
//! allocator keeps what they free in each thread's arena for reuse, so
//! without this the daemon's resident memory would stay at that peak.

use std::time::{Duration, Instant};

/// A batch of at least this many kernel operations (or a burst of as many
/// notifications) is large: what its delta, plan and operations freed is
/// handed back before its status goes out, so that a daemon converged by
/// large batches (a cold start) holds its state and little more.
const LARGE_BATCH: u32 = 1_000;

/// Kernel operations of small batches after which free memory is handed
/// back too: single node changes (ten or so operations) reach it once in
/// hundreds, so their latency stays clear of it.
const MANY_SMALL: u32 = 5_000;

/// How long the kernel task stays idle after a large batch before free
/// memory is handed back once more: what was freed after the batch's own
/// hand-back (the tail of its echoes, the engine's and the server's
/// buffers) would otherwise stay resident until the next resync.
const IDLE_AFTER_LARGE: Duration = Duration::from_secs(1);

/// Counts kernel operations and hands free memory back after each large
/// batch, and after every `MANY_SMALL` operations of smaller ones; after a
/// large batch, once more when the work it brought has died down.
#[derive(Debug, Default)]
pub struct Releaser {
    operations: u32,
    idle_release_at: Option<Instant>,
}

impl Releaser {
    pub fn count(&mut self, operations: u32, now: Instant) {
        self.operations = self.operations.saturating_add(operations);
        if operations >= LARGE_BATCH || self.operations >= MANY_SMALL {
            self.operations = 0;
            release_free_memory();
        }
        if operations >= LARGE_BATCH || self.idle_release_at.is_some() {
            self.idle_release_at = Some(now + IDLE_AFTER_LARGE);
        }
    }

    /// When to call `release_when_idle`, if a large batch left work to
    /// hand back.
    pub fn idle_release_at(&self) -> Option<Instant> {
        self.idle_release_at
    }

    pub fn release_when_idle(&mut self) {
        self.idle_release_at = None;
        release_free_memory();
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_large_batch_is_followed_by_a_release_once_the_work_dies_down() {
        let start = Instant::now();
        let mut releaser = Releaser::default();
        releaser.count(10, start);
        assert_eq!(releaser.idle_release_at(), None, "small batches alone");
        releaser.count(LARGE_BATCH, start);
        assert_eq!(releaser.idle_release_at(), Some(start + IDLE_AFTER_LARGE));
        let later = start + Duration::from_millis(300);
        releaser.count(5, later);
        assert_eq!(
            releaser.idle_release_at(),
            Some(later + IDLE_AFTER_LARGE),
            "postponed while notifications still come in"
        );
        releaser.release_when_idle();
        assert_eq!(releaser.idle_release_at(), None);
        releaser.count(5, later);
        assert_eq!(releaser.idle_release_at(), None, "once per large batch");
    }
}
