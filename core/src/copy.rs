//! Copies of a source's range into a sink: by position on the threads that read it where
//! both allow, else in order.

use std::ops::Range;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use crate::batched_reads::{in_order_reads, read_in_order};
use crate::checksum::{crc32c_append, crc32c_combine};
use crate::storage::{PositionedWrite, Sink, Source};
use crate::{Error, ErrorKind, Result};

/// The longest region [`copy_by_position`] reads in one request. Each request waits a round
/// trip for its first byte, so the longer the request the less of a connection's time is
/// spent waiting: at 20 ms to first byte and 100 MiB/s, a 64 MiB region loses 3% to it where a
/// 16 MiB window loses 11%. It is also the most a failed request has read for nothing.
const REGION_LEN: u64 = 64 << 20;
/// The shortest region [`copy_by_position`] cuts a range into: a shorter request costs its
/// round trip for too little.
const MIN_REGION_LEN: u64 = 1 << 20;

/// `range` cut into regions of at most [`REGION_LEN`], all of one length but the last, which
/// is shorter by less than one byte per region (about [`MIN_REGION_LEN`] at least, unless the
/// range is shorter), in whole rounds of `workers` where the range is long enough: each worker
/// then reads its last region beside the others, and none is left reading alone at the end.
fn regions(range: Range<u64>, workers: usize) -> Vec<Range<u64>> {
    let len = range.end.saturating_sub(range.start);
    if len == 0 {
        return Vec::new();
    }
    let workers = workers.max(1) as u64;
    let count = len
        .div_ceil(REGION_LEN)
        .div_ceil(workers)
        .saturating_mul(workers)
        .min(len / MIN_REGION_LEN)
        .max(1);
    let region = len.div_ceil(count);
    (0..count)
        .map(|i| {
            let start = range.start + (i * region).min(len);
            start..(start + region).min(range.end)
        })
        .filter(|region| !region.is_empty())
        .collect()
}

/// Copies `range` of `source` to the same offsets of `into` and returns the CRC32C of the
/// range. The range is cut into regions (64 MiB at most), read by as many threads as
/// a reader in order would keep windows in flight (the fetch budget over 16 MiB from an
/// object store), each region one streamed read ([`Source::read_in_pieces`]) whose pieces
/// are written where they belong as they arrive, on the thread that read them. Nothing waits
/// for the bytes before it, memory holds a piece per thread, and from an object store each
/// request carries a whole region. The first error stops every thread. With one thread it
/// all runs on the calling thread (a bridge to a runtime can then tell whether that thread
/// may wait).
///
/// # Errors
/// The first read or write error; [`ErrorKind::Io`] when a source hands over a piece out of
/// place or leaves part of a region out.
pub fn copy_by_position<S: Source + ?Sized>(
    source: &S,
    range: Range<u64>,
    into: &dyn PositionedWrite,
) -> Result<u32> {
    let (_, threads) = in_order_reads(source.fetch_ahead());
    let regions = regions(range, threads);
    let threads = threads.clamp(1, regions.len().max(1));
    let next = AtomicUsize::new(0);
    let stopped = AtomicBool::new(false);
    let first_error = Mutex::new(None);
    let crcs = Mutex::new(vec![0u32; regions.len()]);
    let copy_region = |region: &Range<u64>| -> Result<u32> {
        let (mut crc, mut at) = (0, region.start);
        source.read_in_pieces(region.clone(), &mut |offset, piece| {
            if stopped.load(Ordering::Relaxed) {
                return Err(Error::new(ErrorKind::Interrupted, "another region failed"));
            }
            // A piece out of place would leave zeros where a byte was skipped.
            if offset != at || piece.len() as u64 > region.end - at {
                return Err(misplaced(region, at, offset, piece.len()));
            }
            into.write_at(offset, piece)?;
            crc = crc32c_append(crc, piece);
            at += piece.len() as u64;
            Ok(())
        })?;
        if at != region.end {
            return Err(Error::new(
                ErrorKind::Io,
                format!("the source's pieces of the range {region:?} ended at {at}"),
            )
            .with_offset(at));
        }
        Ok(crc)
    };
    // Takes regions in turn until none is left or one failed anywhere.
    let work = || {
        while !stopped.load(Ordering::Relaxed) {
            let index = next.fetch_add(1, Ordering::Relaxed);
            let Some(region) = regions.get(index) else {
                return;
            };
            match copy_region(region) {
                Ok(crc) => crcs.lock().unwrap_or_else(|e| e.into_inner())[index] = crc,
                Err(e) => {
                    // The first failure is the cause; the others only saw it stop them.
                    if !stopped.swap(true, Ordering::Relaxed) {
                        *first_error.lock().unwrap_or_else(|e| e.into_inner()) = Some(e);
                    }
                    return;
                }
            }
        }
    };
    if threads == 1 {
        work();
    } else {
        std::thread::scope(|scope| {
            for _ in 0..threads {
                scope.spawn(work);
            }
        });
    }
    if let Some(e) = first_error.into_inner().unwrap_or_else(|e| e.into_inner()) {
        return Err(e);
    }
    let crcs = crcs.into_inner().unwrap_or_else(|e| e.into_inner());
    Ok(regions
        .iter()
        .zip(crcs)
        .fold(0, |crc, (region, region_crc)| {
            crc32c_combine(crc, region_crc, (region.end - region.start) as usize)
        }))
}

/// The error for a source whose pieces of `region` did not follow on: the next byte due was at
/// `due`, and a piece of `len` bytes came at `offset`.
fn misplaced(region: &Range<u64>, due: u64, offset: u64, len: usize) -> Error {
    Error::new(
        ErrorKind::Io,
        format!(
            "the source handed over {len} bytes at {offset} of the range {region:?}, where the \
             next byte due was at {due}"
        ),
    )
    .with_offset(due)
}

/// Copies `range` of `source` into `sink` and returns the CRC32C of the range: by position
/// ([`copy_by_position`]) where the source gains from reading ahead (an object store) and the
/// sink takes writes by position ([`Sink::positioned`]: a local file, memory), else appended
/// in order ([`read_in_order`]). From a file, reading in order on two threads already keeps
/// up with the writes. The sink must hold exactly `range.start` bytes already (none for a
/// whole copy; the head a copy streamed so far otherwise): both ways put byte `i` of the
/// source at byte `i` of the container.
///
/// # Errors
/// The source's and the sink's errors.
pub fn copy_to_sink<S: Source + ?Sized>(
    source: &S,
    range: Range<u64>,
    sink: &mut dyn Sink,
) -> Result<u32> {
    if source.fetch_ahead() > 0
        && let Some(into) = sink.positioned()
    {
        return copy_by_position(source, range, into.as_ref());
    }
    read_in_order(source, range, |window| sink.write(window))
}

#[cfg(test)]
mod tests {
    use std::ops::Range;

    use super::{copy_by_position, regions};
    use crate::storage::Source;
    use crate::{CreateOptions, ErrorKind, MemorySource, MemoryStorage, Result, Storage};

    /// A source that reads ahead and hands over its `skip`th piece a byte short (none, at 0),
    /// as a broken stream would.
    #[derive(Debug)]
    struct Skipping {
        inner: MemorySource,
        skip: usize,
    }

    impl Source for Skipping {
        fn len(&self) -> u64 {
            self.inner.len()
        }
        fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
            self.inner.read_at(offset, buf)
        }
        fn fetch_ahead(&self) -> u64 {
            64 << 20
        }
        fn read_in_pieces(
            &self,
            range: Range<u64>,
            each: &mut dyn FnMut(u64, &[u8]) -> Result<()>,
        ) -> Result<()> {
            let mut count = 0;
            self.inner.read_in_pieces(range, &mut |offset, piece| {
                count += 1;
                if count == self.skip {
                    return each(offset, &piece[1..]);
                }
                each(offset, piece)
            })
        }
    }

    #[test]
    fn a_source_that_leaves_a_byte_out_fails_the_copy() {
        let data: Vec<u8> = (0..5u32 << 20).map(|i| i as u8).collect();
        for skip in [0, 1, 2] {
            let source = Skipping {
                inner: MemorySource::new(crate::SharedBytes::from(data.clone())),
                skip,
            };
            let storage = MemoryStorage::new();
            let options = CreateOptions::default().with_expected_len(data.len() as u64);
            let mut sink = storage.create("copy", &options).unwrap();
            let into = sink.positioned().unwrap();
            let copied = copy_by_position(&source, 0..data.len() as u64, into.as_ref());
            if skip == 0 {
                assert_eq!(copied.unwrap(), crate::checksum::crc32c(&data));
            } else {
                let err = copied.unwrap_err();
                assert_eq!(err.kind(), ErrorKind::Io, "{err}");
            }
        }
    }

    fn lengths(range: std::ops::Range<u64>, workers: usize) -> Vec<u64> {
        let regions = regions(range.clone(), workers);
        assert_eq!(regions.first().map(|r| r.start), Some(range.start));
        assert_eq!(regions.last().map(|r| r.end), Some(range.end));
        assert!(regions.windows(2).all(|pair| pair[0].end == pair[1].start));
        regions.iter().map(|r| r.end - r.start).collect()
    }

    #[test]
    fn a_range_is_cut_into_whole_rounds_of_regions() {
        const MIB: u64 = 1 << 20;
        // 2 GiB on 16 threads: two rounds of 64 MiB.
        assert_eq!(lengths(0..2048 * MIB, 16), vec![64 * MIB; 32]);
        // 2.5 GiB: three rounds of 53 MiB rather than a half-empty third one of 64 MiB.
        let rounds = lengths(0..2560 * MIB, 16);
        assert_eq!(rounds.len(), 48);
        assert!(
            rounds
                .iter()
                .all(|&len| len.abs_diff(2560 * MIB / 48) <= 48)
        );
        // 100 MiB: one round, each thread a region.
        assert_eq!(lengths(7..7 + 96 * MIB, 16), vec![6 * MIB; 16]);
        // Short ranges: no region under 1 MiB, the last one the rest.
        assert_eq!(lengths(0..3 * MIB + 5, 16), [MIB + 2, MIB + 2, MIB + 1]);
        assert_eq!(lengths(10..20, 16), [10]);
        assert_eq!(lengths(0..2048 * MIB, 0), vec![64 * MIB; 32]);
    }

    #[test]
    fn an_empty_or_reversed_range_has_no_regions() {
        assert!(regions(5..5, 16).is_empty());
        #[allow(clippy::reversed_empty_ranges)]
        let reversed = regions(9..5, 16);
        assert!(reversed.is_empty());
    }
}
