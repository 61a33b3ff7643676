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
//! ones well). A buffer serves requests down to 8/9 of its capacity, no smaller, and the pool
//! keeps at most [`LIMIT_BYTES`], freeing what comes beyond: the memory it holds idle — sizes
//! only the backward asks for wait through the forward — adds to a step's peak. Measured on the
//! 28M step (16×128 tokens, 2 cores): 256 MiB kept, 8–11% faster than without the pool and
//! +55 MiB (+3.6%) peak RSS; 2 GiB with a 2× fit, 7–8% faster and +250 MiB.
//!
//! [`zeroed`] hands out zeros, as `vec![0.0; len]` does; [`overwritten`] a buffer holding its
//! last user's values, for a kernel that writes every element before reading any.

use std::sync::{Mutex, MutexGuard, PoisonError};

/// Floats below which a buffer is left to the allocator (256 KiB).
pub(crate) const SMALLEST: usize = 1 << 16;

/// The most the pool keeps, in bytes.
pub(crate) const LIMIT_BYTES: usize = 256 << 20;

/// A buffer serves a request of at least `capacity − capacity / (SLACK + 1)` floats: 8/9 of it.
const SLACK: usize = 8;

static POOL: Mutex<Pool> = Mutex::new(Pool::new(LIMIT_BYTES));

fn pool() -> MutexGuard<'static, Pool> {
    // The pool's state is consistent between any two of its calls: a panic elsewhere while it
    // was locked cannot have left it half-updated.
    POOL.lock().unwrap_or_else(PoisonError::into_inner)
}

/// `len` zeros, in a buffer from the pool when one fits.
pub(crate) fn zeroed(len: usize) -> Vec<f32> {
    let reused = if len >= SMALLEST {
        pool().take(len)
    } else {
        None
    };
    match reused {
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
    let reused = if len >= SMALLEST {
        pool().take(len)
    } else {
        None
    };
    match reused {
        Some(mut buffer) => {
            buffer.truncate(len);
            buffer.resize(len, 0.0);
            buffer
        }
        None => vec![0.0; len],
    }
}

/// Gives `buffer` back for a later [`zeroed`] (or frees it: a small one, or one the pool has no
/// room for).
pub(crate) fn recycle(buffer: Vec<f32>) {
    let refused = pool().give(buffer);
    // Freed outside the lock.
    drop(refused);
}

/// Buffers given back, and the bytes they hold.
#[derive(Debug)]
struct Pool {
    buffers: Vec<Vec<f32>>,
    bytes: usize,
    limit: usize,
}

impl Pool {
    const fn new(limit: usize) -> Self {
        Self {
            buffers: Vec::new(),
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
            .filter(|(_, b)| (len..=len + len / SLACK).contains(&b.capacity()))
            .min_by_key(|(_, b)| b.capacity())?;
        let buffer = self.buffers.swap_remove(at);
        self.bytes -= bytes(&buffer);
        Some(buffer)
    }

    /// Keeps `buffer`, or hands it back when it is too small to pool or over the limit.
    fn give(&mut self, buffer: Vec<f32>) -> Option<Vec<f32>> {
        let size = bytes(&buffer);
        if buffer.capacity() < SMALLEST || self.bytes + size > self.limit {
            return Some(buffer);
        }
        self.bytes += size;
        self.buffers.push(buffer);
        None
    }
}

fn bytes(buffer: &[f32]) -> usize {
    std::mem::size_of_val(buffer)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_buffer_given_back_serves_the_next_request_of_its_size() {
        let mut pool = Pool::new(usize::MAX);
        let buffer = vec![7.0f32; SMALLEST + 10];
        let at = buffer.as_ptr();
        assert!(pool.give(buffer).is_none());
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
            assert!(pool.give(vec![0.0; len]).is_none());
        }
        let len = |b: Option<Vec<f32>>| b.map(|b| b.len());
        assert_eq!(len(pool.take(SMALLEST + 1)), Some(SMALLEST + 5));
        assert_eq!(len(pool.take(SMALLEST + 1)), Some(SMALLEST + 400));
        assert_eq!(len(pool.take(SMALLEST + 1)), Some(SMALLEST + 900));
        assert!(pool.buffers.is_empty());
        assert_eq!(pool.bytes, 0);
    }

    #[test]
    fn small_buffers_and_buffers_over_the_limit_are_refused() {
        let limit = 3 * SMALLEST * 4;
        let mut pool = Pool::new(limit);
        assert!(pool.give(vec![0.0; SMALLEST - 1]).is_some(), "too small");
        assert!(pool.give(vec![0.0; 2 * SMALLEST]).is_none());
        assert!(
            pool.give(vec![0.0; 2 * SMALLEST]).is_some(),
            "over the limit"
        );
        assert!(pool.give(vec![0.0; SMALLEST]).is_none(), "exactly at it");
        assert_eq!(pool.bytes, limit);
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
