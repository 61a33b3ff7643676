//! Whole forwards and backwards as one job on rayon's pool.
//!
//! The CPU kernels fork a parallel section per operation: tens per layer, each a few
//! microseconds on a small model. A section forked from a thread outside rayon's pool (the
//! engine's thread, a tokio worker, a test) is injected into the pool while its caller sleeps on
//! a latch until it completes: two thread wake-ups per operation, which on a 2-core machine cost
//! more than a tiny model's kernels. A section forked from a pool thread is a `join` whose other
//! half an idle worker steals while it is still spinning. So a forward or a backward enters the
//! pool once, through [`as_one_job`], and its sections fork from there.

/// Runs `work` on one of rayon's pool threads (in place when the caller is one) and returns its
/// result.
///
/// With `waits_on_peers`, `work` runs on the caller's thread instead. Work that blocks on other
/// ranks (a tensor-parallel all-reduce) must not hold a pool thread: ranks on threads of one
/// process could then hold every pool thread (there is one per core) while waiting for a peer
/// whose job queues behind them.
pub(crate) fn as_one_job<R: Send>(waits_on_peers: bool, work: impl FnOnce() -> R + Send) -> R {
    if waits_on_peers {
        work()
    } else {
        rayon::scope(|_| work())
    }
}

#[cfg(test)]
mod tests {
    use super::as_one_job;

    #[test]
    fn work_runs_on_a_pool_thread_unless_it_waits_on_peers() {
        // The test harness's threads are not rayon's.
        assert_eq!(rayon::current_thread_index(), None);
        assert!(as_one_job(false, rayon::current_thread_index).is_some());
        assert_eq!(as_one_job(true, rayon::current_thread_index), None);
    }

    #[test]
    fn a_job_inside_a_job_runs_in_place() {
        let (outer, inner) = as_one_job(false, || {
            let outer = rayon::current_thread_index();
            (outer, as_one_job(false, rayon::current_thread_index))
        });
        assert!(outer.is_some());
        assert_eq!(outer, inner);
    }
}
