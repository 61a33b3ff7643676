//! [`Watchdog`]: names the calls that wait too long.
//!
//! A hung reward worker (a sandbox that never returns, a judge behind a dead connection) or a
//! request the engine never finishes stalls a step without an error: nothing fails, the batch
//! just never fills. The scheduler registers every generation and reward call it awaits; while
//! it waits it asks the watchdog, every quarter of the bound, which calls have waited longer
//! than the bound, and each is named in the log with how long it has waited — again each time
//! the wait doubles, so a stuck call is visible without flooding the log.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Tracks calls in flight and reports those waiting longer than a bound.
#[derive(Debug)]
pub struct Watchdog {
    bound: Duration,
    next: AtomicU64,
    calls: Mutex<BTreeMap<u64, Call>>,
}

#[derive(Debug)]
struct Call {
    what: String,
    since: Instant,
    /// The wait at which it is reported next: the bound, then twice that, ...
    report_at: Duration,
}

/// A call that has waited longer than the bound.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Overdue {
    /// What the call is (e.g. `reward of sample 12 (prompt 3, domain math)`).
    pub what: String,
    /// How long it has waited so far.
    pub waited: Duration,
}

/// Ends the watch of one call when dropped (the call returned, failed or was cancelled).
#[derive(Debug)]
pub struct WatchGuard {
    watchdog: Arc<Watchdog>,
    id: u64,
}

impl Drop for WatchGuard {
    fn drop(&mut self) {
        if let Ok(mut calls) = self.watchdog.calls.lock() {
            calls.remove(&self.id);
        }
    }
}

impl Watchdog {
    /// A watchdog reporting calls that wait longer than `bound`.
    pub fn new(bound: Duration) -> Arc<Self> {
        Arc::new(Self {
            bound,
            next: AtomicU64::new(0),
            calls: Mutex::new(BTreeMap::new()),
        })
    }

    /// The bound.
    pub fn bound(&self) -> Duration {
        self.bound
    }

    /// How often a waiting scheduler should call [`Watchdog::overdue`].
    pub fn poll_interval(&self) -> Duration {
        (self.bound / 4).max(Duration::from_millis(1))
    }

    /// Starts watching a call described by `what`, until the guard is dropped.
    pub fn watch(self: &Arc<Self>, what: impl Into<String>) -> WatchGuard {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        if let Ok(mut calls) = self.calls.lock() {
            calls.insert(
                id,
                Call {
                    what: what.into(),
                    since: Instant::now(),
                    report_at: self.bound,
                },
            );
        }
        WatchGuard {
            watchdog: self.clone(),
            id,
        }
    }

    /// The calls that have waited past the bound since the last report of each (the first time
    /// past the bound, then past twice the wait of the last report), each also logged as a
    /// warning.
    pub fn overdue(&self) -> Vec<Overdue> {
        let Ok(mut calls) = self.calls.lock() else {
            return Vec::new();
        };
        let mut late = Vec::new();
        for call in calls.values_mut() {
            let waited = call.since.elapsed();
            if waited >= call.report_at {
                call.report_at = waited.saturating_mul(2);
                tracing::warn!(
                    "{} has waited {:.1} s (the watchdog's bound is {:.1} s)",
                    call.what,
                    waited.as_secs_f64(),
                    self.bound.as_secs_f64()
                );
                late.push(Overdue {
                    what: call.what.clone(),
                    waited,
                });
            }
        }
        late
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_late_calls_once_per_doubling_and_forgets_finished_ones() {
        let dog = Watchdog::new(Duration::from_millis(20));
        let slow = dog.watch("reward of sample 7");
        let fast = dog.watch("generation of sample 8");
        assert!(dog.overdue().is_empty(), "nothing has waited 20 ms yet");
        drop(fast);
        std::thread::sleep(Duration::from_millis(25));
        let late = dog.overdue();
        assert_eq!(late.len(), 1);
        assert_eq!(late[0].what, "reward of sample 7");
        assert!(late[0].waited >= Duration::from_millis(20));
        // Reported again only once the wait has doubled.
        assert!(dog.overdue().is_empty());
        std::thread::sleep(Duration::from_millis(30));
        assert_eq!(dog.overdue().len(), 1);
        drop(slow);
        std::thread::sleep(Duration::from_millis(60));
        assert!(
            dog.overdue().is_empty(),
            "a finished call is no longer watched"
        );
    }
}
