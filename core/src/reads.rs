//! Batched reads a backend can build its [`Source::fetch`] from: views of memory that is
//! resident already, and `read_at`s shared out over a few threads.

use std::ops::Range;

use crate::ranges::check_ranges;
use crate::storage::Source;
use crate::{Bytes, Error, ErrorKind, Result};

/// [`Source::fetch`] for a source whose [`bytes`](Source::bytes) are already resident views
/// (memory, a map): every range checked first, then a view of each, nothing copied.
///
/// # Errors
/// [`ErrorKind::OutOfRange`] when any range is past the end; the source's errors.
pub fn fetch_views<S: Source + ?Sized>(source: &S, ranges: &[Range<u64>]) -> Result<Vec<Bytes>> {
    check_ranges(ranges, source.len())?;
    ranges
        .iter()
        .map(|range| source.bytes(range.clone()))
        .collect()
}

/// Threads [`read_at_parallel`] reads on at most.
const READ_THREADS: usize = 4;
/// Below this many bytes in all, [`read_at_parallel`] reads on the calling thread: starting
/// threads would cost more.
const PARALLEL_READ_FROM: u64 = 4 << 20;

/// Fills each buffer of `jobs` with `source.read_at` at its offset, the jobs shared out over a
/// few threads when there is enough to read: one thread leaves a cold disk's queue half empty,
/// and from the page cache one core's copy is the limit.
///
/// # Errors
/// The first read error (its offset says which job).
pub fn read_at_parallel<S: Source + ?Sized>(
    source: &S,
    jobs: &mut [(u64, &mut [u8])],
) -> Result<()> {
    let total: u64 = jobs.iter().map(|(_, buf)| buf.len() as u64).sum();
    let threads = std::thread::available_parallelism()
        .map_or(1, usize::from)
        .min(READ_THREADS)
        .min(jobs.len().max(1));
    if threads <= 1 || total < PARALLEL_READ_FROM {
        return jobs
            .iter_mut()
            .try_for_each(|(offset, buf)| source.read_at(*offset, buf));
    }
    let per_thread = jobs.len().div_ceil(threads);
    std::thread::scope(|scope| {
        let workers: Vec<_> = jobs
            .chunks_mut(per_thread)
            .map(|jobs| {
                scope.spawn(move || {
                    jobs.iter_mut()
                        .try_for_each(|(offset, buf)| source.read_at(*offset, buf))
                })
            })
            .collect();
        workers.into_iter().try_for_each(|worker| {
            worker
                .join()
                .unwrap_or_else(|_| Err(Error::new(ErrorKind::Io, "a read thread panicked")))
        })
    })
}
