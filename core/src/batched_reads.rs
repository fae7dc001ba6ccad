//! Batched reads a backend can build its [`Source::fetch`] from: views of memory that is
//! resident already, and `read_at`s shared out over a few threads.

use std::ops::Range;

use crate::checksum::{crc32c, crc32c_append, crc32c_combine};
use crate::ranges::check_ranges;
use crate::storage::{REMOTE_WINDOW, Source};
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

/// The window [`read_in_order`] reads from a source that gains nothing from reading many
/// windows ahead (a file), on [`LOCAL_READERS`] threads.
const LOCAL_WINDOW: u64 = 8 << 20;
/// Threads reading a file's windows: one reads the next while the caller takes this one.
const LOCAL_READERS: usize = 2;

/// The window a reader going in order through a source that gains from reading `ahead` bytes
/// ahead ([`Source::fetch_ahead`]) reads at a time, and how many it reads at once: as many
/// [`REMOTE_WINDOW`]s as that budget holds; from a source that gains nothing (0),
/// [`LOCAL_READERS`] of [`LOCAL_WINDOW`].
pub(crate) fn in_order_reads(ahead: u64) -> (u64, usize) {
    if ahead > 0 {
        (
            REMOTE_WINDOW,
            usize::try_from(ahead / REMOTE_WINDOW).unwrap_or(1),
        )
    } else {
        (LOCAL_WINDOW, LOCAL_READERS)
    }
}

/// `range` cut into windows of `window` bytes, but where the range holds both, the first
/// `ramp` grow from `window / ramp` to `window` and the last `ramp` shrink back the same way.
/// What is left between them shorter than a window comes last before the shrinking ones.
fn windows(range: Range<u64>, window: u64, ramp: usize) -> Vec<Range<u64>> {
    let len = range.end.saturating_sub(range.start);
    // Two ramps of n windows take more than n whole windows: a range shorter than that has
    // none, and a ramp of more steps than the range has windows is never summed.
    let steps = if ramp as u64 <= len / window.max(1) {
        ramp
    } else {
        0
    };
    let step = |k: usize| (window * (k as u64 + 1) / steps as u64).max(1);
    let ramped = 2 * (0..steps).map(step).sum::<u64>();
    let steps = if ramped <= len { steps } else { 0 };
    let body = len - if steps > 0 { ramped } else { 0 };
    let lengths = (0..steps)
        .map(step)
        .chain((0..body.div_ceil(window)).map(|i| window.min(body - i * window)))
        .chain((0..steps).rev().map(step));
    let mut start = range.start;
    lengths
        .map(|len| {
            start += len;
            start - len..start
        })
        .collect()
}

/// Reads `range` of `source` in order, window by window, hands every window to `each` on
/// the calling thread, and returns the CRC32C of all of it: a sequential copy or checksum.
///
/// From a source that gains from reading ahead ([`Source::fetch_ahead`] above 0: an object
/// store), windows of 16 MiB are read on as many worker threads as the fetch budget holds,
/// each into a buffer of its own reused from window to window, so the store's connections
/// stay busy while memory holds the budget. Where the range is long enough, the first n
/// windows grow from 1/n of a window to a whole one and the last n shrink back (n the windows
/// in flight): `each` starts after a short read instead of waiting out a whole window's
/// transfer with nothing to do, the windows after the first n arrive spread out instead of
/// together, and the last ones end close together, as the first n started apart
/// (docs/BENCHMARKS.md, cold start, the copies).
///
/// Anything else is read in 8 MiB windows on two threads, one window ahead of `each`, so that
/// reading the next window overlaps what `each` does with this one (a copy from a local file
/// into an upload ran 1.13× a save from memory reading on the calling thread, 1.03× reading
/// ahead: docs/BENCHMARKS.md, tiered).
///
/// Each window's CRC32C is taken by the thread that read it, and only combined on the calling
/// thread, which is the one a copy's writes wait on.
///
/// # Errors
/// The first read error, or `each`'s, which stops the reads.
pub fn read_in_order<S: Source + ?Sized>(
    source: &S,
    range: Range<u64>,
    mut each: impl FnMut(&[u8]) -> Result<()>,
) -> Result<u32> {
    let ahead = source.fetch_ahead();
    let (window, in_flight) = in_order_reads(ahead);
    let ramp = if ahead > 0 { in_flight } else { 0 };
    let windows = windows(range.clone(), window, ramp);
    let workers = in_flight.clamp(1, windows.len().max(1));
    let mut crc = 0;
    if workers == 1 {
        let mut buffer = vec![0; window.min(range.end.saturating_sub(range.start)) as usize];
        // Every window is at most `window` long and lies inside `range`: within the buffer.
        for piece in &windows {
            let chunk = &mut buffer[..(piece.end - piece.start) as usize];
            source.read_at(piece.start, chunk)?;
            crc = crc32c_append(crc, chunk);
            each(chunk)?;
        }
        return Ok(crc);
    }
    std::thread::scope(|scope| {
        // Worker k reads windows k, k + workers, …, one at a time into its one buffer, which
        // comes back once its window has been handed over: so window i is never waited on
        // behind a buffer that only a later window could free.
        let (filled, arrived) = std::sync::mpsc::channel::<(usize, Result<(Vec<u8>, u32)>)>();
        let mut give_back = Vec::with_capacity(workers);
        for worker in 0..workers {
            let (back, returned) = std::sync::mpsc::channel::<Vec<u8>>();
            give_back.push(back);
            let (filled, windows) = (filled.clone(), &windows);
            scope.spawn(move || {
                // Every window is at most `window` long, so each slice below is in the buffer.
                let mut buffer = vec![0; window as usize];
                for (index, piece) in windows.iter().enumerate().skip(worker).step_by(workers) {
                    let len = (piece.end - piece.start) as usize;
                    let read = source.read_at(piece.start, &mut buffer[..len]);
                    let read = read.map(|()| {
                        let crc = crc32c(&buffer[..len]);
                        (buffer, crc)
                    });
                    let sent = filled.send((index, read));
                    match returned.recv() {
                        Ok(back) if sent.is_ok() => buffer = back,
                        _ => return,
                    }
                }
            });
        }
        drop(filled);
        let mut early = std::collections::BTreeMap::new();
        for (index, piece) in windows.iter().enumerate() {
            let (buffer, window_crc) = loop {
                if let Some(read) = early.remove(&index) {
                    break read;
                }
                let (at, read) = arrived
                    .recv()
                    .map_err(|_| Error::new(ErrorKind::Io, "a read thread ended early"))?;
                early.insert(at, read?);
            };
            let len = (piece.end - piece.start) as usize;
            crc = crc32c_combine(crc, window_crc, len);
            each(&buffer[..len])?;
            // The worker may have ended already, on a failure of its own: nothing to return.
            let _ = give_back[index % workers].send(buffer);
        }
        Ok(crc)
    })
}

#[cfg(test)]
mod tests {
    use super::windows;

    fn lengths(range: std::ops::Range<u64>, window: u64, ramp: usize) -> Vec<u64> {
        let windows = windows(range.clone(), window, ramp);
        assert_eq!(windows.first().map(|w| w.start), Some(range.start));
        assert_eq!(windows.last().map(|w| w.end), Some(range.end));
        assert!(windows.windows(2).all(|pair| pair[0].end == pair[1].start));
        let lengths: Vec<u64> = windows.iter().map(|w| w.end - w.start).collect();
        // Each window is read into a buffer `window` bytes long.
        assert!(lengths.iter().all(|len| (1..=window).contains(len)));
        lengths
    }

    #[test]
    fn an_empty_or_reversed_range_has_no_windows() {
        assert!(windows(5..5, 16, 4).is_empty());
        #[allow(clippy::reversed_empty_ranges)]
        let reversed = windows(9..5, 16, 4);
        assert!(reversed.is_empty());
    }

    #[test]
    fn the_first_windows_grow_to_a_whole_one_and_the_last_shrink_back() {
        assert_eq!(lengths(10..110, 16, 4), [4, 8, 12, 16, 16, 4, 16, 12, 8, 4]);
        assert_eq!(lengths(10..110, 16, 0), [16, 16, 16, 16, 16, 16, 4]);
        // Too short to hold both ramps: whole windows.
        assert_eq!(lengths(10..89, 16, 4), [16, 16, 16, 16, 15]);
        assert_eq!(lengths(10..90, 16, 4), [4, 8, 12, 16, 16, 12, 8, 4]);
        // A ramp of one step is whole windows; one of more steps than the range has windows
        // is none.
        assert_eq!(lengths(10..110, 16, 1), [16, 16, 16, 16, 16, 4, 16]);
        assert_eq!(
            lengths(10..110, 16, usize::MAX),
            [16, 16, 16, 16, 16, 16, 4]
        );
        // A step that rounds down to nothing is a byte.
        assert_eq!(lengths(0..12, 2, 4), [1, 1, 1, 2, 2, 2, 1, 1, 1]);
    }
}
