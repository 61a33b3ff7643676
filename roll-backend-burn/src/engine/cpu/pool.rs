//! Whole forwards and backwards as one job on rayon's pool.
//!
//! The CPU kernels fork a parallel section per operation: tens per layer, each a few
//! microseconds on a small model. A section forked from a thread outside rayon's pool (the
//! engine's thread, a tokio worker, a test) is injected into the pool while its caller sleeps on
//! a latch until it completes: two thread wake-ups per operation, which on a 2-core machine cost
//! more than a tiny model's kernels. A section forked from a pool thread is a `join` whose other
//! half an idle worker steals while it is still spinning. So a forward or a backward enters the
//! pool once, through [`as_one_job`], and its sections fork from there.
//!
//! The job always runs on the pool's first thread. glibc's allocator gives each thread its own
//! arena, and memory freed into one arena serves only that arena's thread: a training step that
//! ran on whichever pool thread took it left its freed activations in one arena and allocated the
//! next step's in another (the 28M step's peak RSS rose from 1.6 to 2.1–2.2 GiB). On one thread,
//! a step reuses what the step before freed.

/// `cell`'s value, made by `make` the first time it is read — outside the cell's lock. `make`
/// forks rayon sections (packing a weight), and a pool thread waiting in a `join` takes other
/// jobs meanwhile: inside `OnceLock::get_or_init` it could take one that reads the same cell and
/// wait for itself for ever. (Seen: the engine and an asynchronous training step, which share
/// the CPU decoder's lazily packed weights since the trainer reads the engine's packing; a test
/// hung in `async_rollout.rs`.) Two threads may both make the value; the first to finish is kept.
pub(crate) fn made_once<T>(cell: &std::sync::OnceLock<T>, make: impl FnOnce() -> T) -> &T {
    if let Some(value) = cell.get() {
        return value;
    }
    let value = make();
    cell.get_or_init(|| value)
}

/// Runs `work` on the first of rayon's pool threads (in place when the caller is a pool thread)
/// and returns its result; the other pool threads are free to take its parallel sections.
///
/// With `waits_on_peers`, `work` runs on the caller's thread instead. Work that blocks on other
/// ranks (a tensor-parallel all-reduce) must not hold a pool thread: ranks on threads of one
/// process could then hold every pool thread (there is one per core) while waiting for a peer
/// whose job queues behind them.
pub(crate) fn as_one_job<R: Send>(waits_on_peers: bool, work: impl FnOnce() -> R + Send) -> R {
    if waits_on_peers || rayon::current_thread_index().is_some() {
        return work();
    }
    let work = std::sync::Mutex::new(Some(work));
    // Every pool thread runs the broadcast; the first runs the work, the others return at once.
    let mut ran = rayon::broadcast(|ctx| {
        if ctx.index() != 0 {
            return None;
        }
        let work = work.lock().ok()?.take()?;
        Some(work())
    });
    ran.swap_remove(0).expect("pool thread 0 runs the work")
}

#[cfg(test)]
mod tests {
    use super::{as_one_job, made_once};

    #[test]
    fn work_runs_on_the_first_pool_thread_unless_it_waits_on_peers() {
        // The test harness's threads are not rayon's.
        assert_eq!(rayon::current_thread_index(), None);
        for _ in 0..20 {
            assert_eq!(as_one_job(false, rayon::current_thread_index), Some(0));
        }
        assert_eq!(as_one_job(true, rayon::current_thread_index), None);
    }

    #[test]
    fn the_work_runs_once_and_its_parallel_sections_run() {
        use rayon::prelude::*;
        use std::sync::atomic::{AtomicUsize, Ordering};
        let runs = AtomicUsize::new(0);
        let sum = as_one_job(false, || {
            runs.fetch_add(1, Ordering::Relaxed);
            (0..1000u64).into_par_iter().sum::<u64>()
        });
        assert_eq!((sum, runs.load(Ordering::Relaxed)), (499_500, 1));
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

    #[test]
    fn a_value_made_once_may_be_read_while_it_is_being_made() {
        // What a pool thread does when, packing a weight, it takes a job that reads the same
        // weight: the read inside the making. Inside `OnceLock::get_or_init` this waits for
        // itself (std: "the current implementation deadlocks"); a timeout tells that apart.
        let (done, result) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let cell = std::sync::OnceLock::new();
            let value = *made_once(&cell, || made_once(&cell, || 2) + 1);
            let _ = done.send((value, *made_once(&cell, || 7)));
        });
        let got = result.recv_timeout(std::time::Duration::from_secs(20));
        // The inner read made and kept its value first; later reads see it.
        assert_eq!(got, Ok((2, 2)));
    }
}
