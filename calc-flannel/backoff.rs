//! Retrying without flooding: delays that double up to a cap, and a log
//! line only when the state of a dependency changes (first failure, a
//! different failure, recovery), never one per attempt.

use std::fmt::Display;
use std::time::Duration;

use tracing::{info, warn};

pub struct Backoff {
    first: Duration,
    max: Duration,
    next: Duration,
}

impl Backoff {
    /// Retries of anything that should come back soon: from 100 ms,
    /// doubling, at most 5 s apart.
    pub fn retries() -> Backoff {
        Backoff::new(Duration::from_millis(100), Duration::from_secs(5))
    }

    pub fn new(first: Duration, max: Duration) -> Backoff {
        Backoff {
            first,
            max,
            next: first,
        }
    }

    /// The delay before the next attempt.
    pub fn next(&mut self) -> Duration {
        let delay = self.next;
        self.next = (self.next * 2).min(self.max);
        delay
    }

    pub fn reset(&mut self) {
        self.next = self.first;
    }
}

/// The state of one thing calc-flannel depends on, as last logged.
pub struct Condition {
    what: &'static str,
    failing: Option<String>,
}

impl Condition {
    pub fn new(what: &'static str) -> Condition {
        Condition {
            what,
            failing: None,
        }
    }

    /// A failed attempt: logged when it is the first or differs from the
    /// last one.
    pub fn failed(&mut self, why: &dyn Display, retry_in: Duration) {
        let why = why.to_string();
        if self.failing.as_deref() != Some(why.as_str()) {
            warn!(
                retry_in_ms = retry_in.as_millis() as u64,
                "{}: {why} (retrying; logged again only when this changes)", self.what
            );
            self.failing = Some(why);
        }
    }

    /// A successful attempt: logged when it ends a failure.
    pub fn ok(&mut self) {
        if self.failing.take().is_some() {
            info!("{}: working again", self.what);
        }
    }
}

/// Tries `attempt` until it succeeds, backing off between attempts and
/// logging failures as `what` does.
pub async fn retry<T, E: Display, F: Future<Output = Result<T, E>>>(
    what: &'static str,
    mut attempt: impl FnMut() -> F,
) -> T {
    let mut backoff = Backoff::retries();
    let mut condition = Condition::new(what);
    loop {
        match attempt().await {
            Ok(value) => {
                condition.ok();
                return value;
            }
            Err(e) => {
                let wait = backoff.next();
                condition.failed(&e, wait);
                tokio::time::sleep(wait).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_double_up_to_the_cap_and_reset() {
        let mut b = Backoff::new(Duration::from_millis(100), Duration::from_millis(500));
        let delays: Vec<u128> = (0..5).map(|_| b.next().as_millis()).collect();
        assert_eq!(delays, [100, 200, 400, 500, 500]);
        b.reset();
        assert_eq!(b.next().as_millis(), 100);
    }
}
