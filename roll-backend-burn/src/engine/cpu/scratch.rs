//! Large `f32` buffers reused rather than reallocated: a process-wide pool that the CPU kernels
//! take their big buffers from ([`zeroed`]) and give back to ([`recycle`]) once read.
//!
//! A training step on the CPU allocates and frees its activations and gradients every
//! micro-batch: on the order of a gigabyte for the 28M config at 16×128 tokens, in buffers of
//! 1–30 MiB. Freed, they go back to the kernel — glibc's allocator trims the top of its heap
//! beyond a few tens of MiB and maps the largest buffers on their own — and the next micro-batch
//! faults every page in again, each zeroed by the kernel on first touch. That was ~8% of a 28M
//! step's profile (`clear_page_erms` and the fault path); keeping the memory instead (glibc's
//! `MALLOC_TRIM_THRESHOLD_` and `MALLOC_MMAP_MAX_`, which take the user's environment or unsafe
//! FFI) made the step 12–24% faster at the same peak memory. The pool gets most of that from
//! within: a buffer given back serves the next request of its size, its pages already mapped.
//!
//! Only buffers of at least [`SMALLEST`] floats are pooled (the allocator's own bins serve small
//! ones well). A buffer serves requests down to 8/9 of its capacity, no smaller; the pool keeps
//! at most [`LIMIT_BYTES`], freeing the oldest beyond, and frees a buffer no request took for
//! [`IDLE`]: the memory it holds idle — sizes only the backward asks for wait through the
//! forward — adds to a step's peak. Measured on the
//! 28M step (16×128 tokens, 2 cores): 256 MiB kept, 8–11% faster than without the pool and
//! +55 MiB (+3.6%) peak RSS; 2 GiB with a 2× fit, 7–8% faster and +250 MiB.
//!
//! [`zeroed`] hands out zeros, as `vec![0.0; len]` does; [`overwritten`] a buffer holding its
//! last user's values, for a kernel that writes every element before reading any.

use std::collections::VecDeque;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

/// Floats below which a buffer is left to the allocator (256 KiB).
const SMALLEST: usize = 1 << 16;

/// The most the pool keeps, in bytes.
const LIMIT_BYTES: usize = 256 << 20;

/// A buffer serves a request of at least `capacity − capacity / (SLACK + 1)` floats: 8/9 of it.
const SLACK: usize = 8;

/// How long a buffer waits in the pool for a request before it is freed (at the next buffer
/// given back): a training step's sizes come round again within a step or two.
const IDLE: Duration = Duration::from_secs(10);

static POOL: Mutex<Pool> = Mutex::new(Pool::new(LIMIT_BYTES));

fn pool() -> MutexGuard<'static, Pool> {
    // The pool's state is consistent between any two of its calls: a panic elsewhere while it
    // was locked cannot have left it half-updated.
    POOL.lock().unwrap_or_else(PoisonError::into_inner)
}

/// `len` zeros, in a buffer from the pool when one fits.
pub(crate) fn zeroed(len: usize) -> Vec<f32> {
    match reused(len) {
        Some(mut buffer) => {
            buffer.clear();
            buffer.resize(len, 0.0);
            buffer
        }
        None => vec![0.0; len],
    }
}

/// A buffer of `len` floats for a kernel that writes every one of them before anything reads
/// it (a GEMM that overwrites its output, a transpose, an element-wise map): from the pool when
/// one fits, holding whatever its last user left, which the kernel's writes replace; otherwise
/// zeros. Skipping the zeroing saves a pass over the buffer's memory.
pub(crate) fn overwritten(len: usize) -> Vec<f32> {
    match reused(len) {
        Some(mut buffer) => {
            buffer.truncate(len);
            buffer.resize(len, 0.0);
            buffer
        }
        None => vec![0.0; len],
    }
}

/// A pooled buffer that fits `len` floats, if `len` is worth pooling and one does.
fn reused(len: usize) -> Option<Vec<f32>> {
    if len < SMALLEST {
        return None;
    }
    pool().take(len)
}

/// Gives `buffer` back for a later [`zeroed`] or [`overwritten`], freeing the pool's oldest
/// buffers if it would hold more than [`LIMIT_BYTES`] (or frees `buffer` itself: a small one).
pub(crate) fn recycle(buffer: Vec<f32>) {
    if buffer.capacity() < SMALLEST {
        return;
    }
    let freed = pool().give(buffer, Instant::now());
    // Outside the lock.
    drop(freed);
}

/// Buffers given back, oldest first with when, and the bytes they hold.
#[derive(Debug)]
struct Pool {
    buffers: VecDeque<(Vec<f32>, Instant)>,
    bytes: usize,
    limit: usize,
}

impl Pool {
    const fn new(limit: usize) -> Self {
        Self {
            buffers: VecDeque::new(),
            bytes: 0,
            limit,
        }
    }

    /// The buffer that fits `len` floats most tightly, if one holds at least `len` and at most
    /// an eighth more (a big buffer is not spent on a small request).
    fn take(&mut self, len: usize) -> Option<Vec<f32>> {
        let (at, _) = self
            .buffers
            .iter()
            .enumerate()
            .filter(|(_, (b, _))| (len..=len + len / SLACK).contains(&b.capacity()))
            .min_by_key(|(_, (b, _))| b.capacity())?;
        let (buffer, _) = self.buffers.remove(at)?;
        self.bytes -= held(&buffer);
        Some(buffer)
    }

    /// Keeps `buffer` (given back at `now`), letting go of the buffers idle longer than [`IDLE`]
    /// and then of the oldest while the pool would hold more than its limit — a workload that
    /// changed shapes (another model, another batch) does not leave the sizes it no longer asks
    /// for behind; returns what it lets go (`buffer` itself when it is too small to pool, or
    /// larger than the limit).
    fn give(&mut self, buffer: Vec<f32>, now: Instant) -> Vec<Vec<f32>> {
        let size = held(&buffer);
        if buffer.capacity() < SMALLEST || size > self.limit {
            return vec![buffer];
        }
        let mut freed = Vec::new();
        while let Some((oldest, given)) = self.buffers.front()
            && (now.saturating_duration_since(*given) > IDLE || self.bytes + size > self.limit)
        {
            self.bytes -= held(oldest);
            freed.extend(self.buffers.pop_front().map(|(b, _)| b));
        }
        self.bytes += size;
        self.buffers.push_back((buffer, now));
        freed
    }
}

/// The bytes a buffer holds: its capacity, whatever its length.
fn held(buffer: &Vec<f32>) -> usize {
    buffer.capacity() * std::mem::size_of::<f32>()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_buffer_given_back_serves_the_next_request_of_its_size() {
        let mut pool = Pool::new(usize::MAX);
        let buffer = vec![7.0f32; SMALLEST + 10];
        let at = buffer.as_ptr();
        assert!(pool.give(buffer, now()).is_empty());
        assert!(pool.take(SMALLEST + 11).is_none(), "more than it holds");
        assert!(
            pool.take(SMALLEST * 8 / 9).is_none(),
            "under 8/9 of it: kept"
        );
        let again = pool.take(SMALLEST).expect("fits");
        assert_eq!(again.as_ptr(), at, "the same memory");
        assert_eq!(pool.bytes, 0);
    }

    #[test]
    fn the_tightest_fit_is_taken() {
        let mut pool = Pool::new(usize::MAX);
        let sizes = [SMALLEST + 900, SMALLEST + 5, SMALLEST + 400];
        for len in sizes {
            assert!(pool.give(vec![0.0; len], now()).is_empty());
        }
        let len = |b: Option<Vec<f32>>| b.map(|b| b.len());
        assert_eq!(len(pool.take(SMALLEST + 1)), Some(SMALLEST + 5));
        assert_eq!(len(pool.take(SMALLEST + 1)), Some(SMALLEST + 400));
        assert_eq!(len(pool.take(SMALLEST + 1)), Some(SMALLEST + 900));
        assert!(pool.buffers.is_empty());
        assert_eq!(pool.bytes, 0);
    }

    #[test]
    fn small_buffers_are_refused_and_the_oldest_go_to_make_room() {
        let limit = 3 * SMALLEST * 4;
        let mut pool = Pool::new(limit);
        assert_eq!(
            pool.give(vec![0.0; SMALLEST - 1], now()).len(),
            1,
            "too small"
        );
        assert_eq!(
            pool.give(vec![0.0; 3 * SMALLEST + 1], now()).len(),
            1,
            "over the limit alone"
        );
        let first = vec![0.0; 2 * SMALLEST];
        let at = first.as_ptr();
        assert!(pool.give(first, now()).is_empty());
        let freed = pool.give(vec![0.0; 2 * SMALLEST], now());
        assert_eq!(freed.len(), 1, "the first makes room for the second");
        assert_eq!(freed[0].as_ptr(), at);
        assert!(
            pool.give(vec![0.0; SMALLEST], now()).is_empty(),
            "exactly at the limit"
        );
        assert_eq!(pool.bytes, limit);
        // Counted by capacity: a buffer shortened by its last user holds all of it.
        let mut short = pool.take(SMALLEST).expect("fits");
        short.truncate(10);
        assert_eq!(pool.bytes, 2 * SMALLEST * 4);
        assert!(pool.give(short, now()).is_empty());
        assert_eq!(pool.bytes, limit);
    }

    fn now() -> Instant {
        Instant::now()
    }

    #[test]
    fn a_buffer_no_request_took_for_long_is_freed_at_the_next_give() {
        let mut pool = Pool::new(usize::MAX);
        let start = Instant::now();
        assert!(pool.give(vec![0.0; SMALLEST], start).is_empty());
        assert!(
            pool.give(vec![0.0; 2 * SMALLEST], start + IDLE / 2)
                .is_empty()
        );
        assert!(
            pool.give(vec![0.0; 3 * SMALLEST], start + IDLE).is_empty(),
            "not yet"
        );
        let freed = pool.give(vec![0.0; 4 * SMALLEST], start + IDLE * 3 / 2 + IDLE / 10);
        let lengths: Vec<usize> = freed.iter().map(Vec::len).collect();
        assert_eq!(
            lengths,
            [SMALLEST, 2 * SMALLEST],
            "the two given longest ago"
        );
        assert_eq!(pool.bytes, 7 * SMALLEST * 4);
    }

    #[test]
    fn what_the_pool_hands_out_is_zeroed() {
        // An odd size no other test of this process asks for.
        let len = SMALLEST + 4099;
        recycle(vec![f32::NAN; len]);
        recycle(vec![1.5; len + 7]);
        for _ in 0..3 {
            let buffer = zeroed(len);
            assert_eq!(buffer.len(), len);
            assert!(buffer.iter().all(|&v| v.to_bits() == 0), "every float +0.0");
        }
        assert!(zeroed(5).iter().all(|&v| v == 0.0));
    }
}
