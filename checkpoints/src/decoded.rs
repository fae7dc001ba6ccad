//! Encoded pieces read as their bytes: a [`Source`] over the encoded pieces of one stored
//! container, their decoded bytes laid end to end in the order they were added. Each piece is
//! fetched whole, its stored bytes checked against their CRC32C before they are decoded, and
//! decoded into memory; the pieces a read needs are fetched in batches of [`BATCH_LEN`]
//! decoded bytes, as many at once as the source reads ahead, each decoded on every core as it
//! arrives.

use std::ops::Range;
use std::sync::{Arc, Mutex, PoisonError};

use weightbay::backend_kit::{check_jobs, check_ranges};
use weightbay::checksum::crc32c;
use weightbay::codec::{Codec, MAX_ENCODED_LOGICAL_LEN};
use weightbay::{AccessPolicy, Bytes, Error, ErrorKind, Result, Source};

use crate::record::{Encoding, PieceRecord};

/// The decoded bytes of one batch of frames, at most (beyond one piece).
const BATCH_LEN: u64 = 16 << 20;

/// Threads fetching batches ahead, at most: the connections of a store that are busy at once.
const MAX_FETCHERS: usize = 16;

/// The decoded view of one stored container's encoded pieces.
#[derive(Debug)]
pub(crate) struct Decoded {
    key: String,
    stored: Arc<dyn Source>,
    frames: Vec<Frame>,
    len: u64,
    /// Buffers decoded frames were copied out of, kept for the next: fresh ones cost more in
    /// page faults than the decoding.
    spare: Mutex<Vec<Vec<u8>>>,
}

/// One encoded piece: `len` decoded bytes at `at` of the view, from `stored_len` bytes at
/// `offset` of the stored container.
#[derive(Debug)]
struct Frame {
    at: u64,
    len: u64,
    offset: u64,
    stored_len: u64,
    stored_crc32c: u32,
    codec: Codec,
    /// What the piece is of, for errors: `tensor `x`` or `the header`.
    what: String,
}

impl Decoded {
    /// An empty view of `stored`, read under `key`.
    pub(crate) fn new(key: String, stored: Arc<dyn Source>) -> Self {
        Self {
            key,
            stored,
            frames: Vec::new(),
            len: 0,
            spare: Mutex::new(Vec::new()),
        }
    }

    /// Adds `piece`, stored encoded as `encoding`; returns where its bytes start in the view.
    ///
    /// # Errors
    /// [`ErrorKind::Unsupported`] naming a codec this version does not know;
    /// [`ErrorKind::Corrupt`] when the piece claims more than
    /// [`MAX_ENCODED_LOGICAL_LEN`] bytes or lies outside the stored container; both name the
    /// piece and the key.
    pub(crate) fn push(&mut self, piece: &PieceRecord, encoding: &Encoding) -> Result<u64> {
        let what = piece
            .tensor
            .as_deref()
            .map_or_else(|| "the header".to_owned(), |t| format!("tensor `{t}`"));
        let codec = Codec::from_name(&encoding.codec)
            .map_err(|e| e.with_key(&self.key).with_tensor(what.clone()))?;
        if piece.len > MAX_ENCODED_LOGICAL_LEN {
            return Err(Error::new(
                ErrorKind::Corrupt,
                format!(
                    "a piece of {what} claims {} bytes encoded, over the limit of \
                     {MAX_ENCODED_LOGICAL_LEN}",
                    piece.len
                ),
            )
            .with_key(&self.key));
        }
        let stored = self.stored.len();
        if piece
            .offset
            .checked_add(encoding.len)
            .is_none_or(|end| end > stored)
        {
            return Err(Error::new(
                ErrorKind::Corrupt,
                format!(
                    "{what} refers to encoded bytes {}..+{} of a container of {stored}",
                    piece.offset, encoding.len
                ),
            )
            .with_key(&self.key));
        }
        let at = self.len;
        self.frames.push(Frame {
            at,
            len: piece.len,
            offset: piece.offset,
            stored_len: encoding.len,
            stored_crc32c: encoding.crc32c,
            codec,
            what,
        });
        self.len += piece.len;
        Ok(at)
    }

    /// The frames `range` of the view touches.
    fn touched(&self, range: &Range<u64>) -> Range<usize> {
        let first = self.frames.partition_point(|f| f.at + f.len <= range.start);
        let end = self.frames.partition_point(|f| f.at < range.end);
        first..end.max(first)
    }

    /// Fetches frames `indices` in one batched read of the stored container, checks each
    /// against its stored CRC32C and decodes them, on every core.
    fn decode(&self, indices: &[usize]) -> Result<Vec<Vec<u8>>> {
        let fetched = self.fetch_frames(indices)?;
        let work = indices
            .iter()
            .zip(&fetched)
            .map(|(&i, b)| (i, b, None))
            .collect();
        let mut decoded = self.decode_fetched(work)?;
        decoded.sort_unstable_by_key(|(i, _)| *i);
        Ok(decoded.into_iter().map(|(_, bytes)| bytes).collect())
    }

    /// The stored bytes of frames `indices`, in one batched read of the stored container.
    fn fetch_frames(&self, indices: &[usize]) -> Result<Vec<Bytes>> {
        let ranges: Vec<Range<u64>> = indices
            .iter()
            .map(|&i| self.frames[i].offset..self.frames[i].offset + self.frames[i].stored_len)
            .collect();
        let fetched = self
            .stored
            .fetch(&ranges)
            .map_err(|e| e.with_key(&self.key))?;
        if fetched.len() != ranges.len() {
            return Err(Error::new(
                ErrorKind::Io,
                "a batched read returned other lengths than asked",
            )
            .with_key(&self.key));
        }
        Ok(fetched)
    }

    /// Frames fetched, each checked against its stored CRC32C and decoded on every core:
    /// into its target where it has one (the memory of the one read that wants all of it),
    /// else into a buffer of its own, returned with the frame's index.
    fn decode_fetched(
        &self,
        work: Vec<(usize, &Bytes, Option<&mut [u8]>)>,
    ) -> Result<Vec<(usize, Vec<u8>)>> {
        let one = |(i, bytes, target): (usize, &Bytes, Option<&mut [u8]>)| -> Result<Option<(usize, Vec<u8>)>> {
            let frame = &self.frames[i];
            let stored = bytes.read(AccessPolicy::AllowCopy)?;
            let crc = crc32c(stored);
            if stored.len() as u64 != frame.stored_len || crc != frame.stored_crc32c {
                return Err(Error::new(
                    ErrorKind::Corrupt,
                    format!(
                        "the encoded piece of {} at {} holds {} bytes with CRC32C {crc:08x}, \
                         the commit record says {} bytes with {:08x}",
                        frame.what,
                        frame.offset,
                        stored.len(),
                        frame.stored_len,
                        frame.stored_crc32c
                    ),
                )
                .with_key(&self.key));
            }
            let failed = |e: Error| {
                Error::new(
                    e.kind(),
                    format!("the encoded piece of {} at {}", frame.what, frame.offset),
                )
                .with_key(&self.key)
                .with_source(e)
            };
            if let Some(target) = target {
                frame.codec.decode(stored, target).map_err(failed)?;
                return Ok(None);
            }
            // The length was checked against the limit when the frame was added.
            let mut decoded = self
                .spare
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .pop()
                .unwrap_or_default();
            decoded.clear();
            decoded.resize(frame.len as usize, 0);
            frame.codec.decode(stored, &mut decoded).map_err(failed)?;
            Ok(Some((i, decoded)))
        };
        let threads = std::thread::available_parallelism()
            .map_or(1, usize::from)
            .min(work.len())
            .max(1);
        if threads == 1 {
            return work
                .into_iter()
                .filter_map(|w| one(w).transpose())
                .collect();
        }
        // Each thread takes every `threads`-th frame, so large and small ones spread evenly.
        let mut shares: Vec<Vec<_>> = (0..threads).map(|_| Vec::new()).collect();
        for (n, item) in work.into_iter().enumerate() {
            shares[n % threads].push(item);
        }
        std::thread::scope(|scope| {
            let workers: Vec<_> = shares
                .into_iter()
                .map(|share| {
                    scope.spawn(move || {
                        share
                            .into_iter()
                            .filter_map(|w| one(w).transpose())
                            .collect::<Result<Vec<_>>>()
                    })
                })
                .collect();
            let mut decoded = Vec::new();
            for worker in workers {
                let part = worker.join().unwrap_or_else(|_| {
                    Err(Error::new(ErrorKind::Io, "a decoding thread panicked"))
                });
                decoded.extend(part?);
            }
            Ok(decoded)
        })
    }

    /// Decodes `batch`, fetched as `fetched`, into `jobs`: a frame one job wants all of, and
    /// no other job wants, straight into that job's memory; any other into a buffer, then
    /// copied to every job that wants part of it.
    fn decode_batch(
        &self,
        batch: &[usize],
        fetched: &[Bytes],
        jobs: &mut [(u64, &mut [u8])],
    ) -> Result<()> {
        let (first, last) = (batch[0], batch[batch.len() - 1]);
        let in_batch = |range: Range<u64>| {
            let touched = self.touched(&range);
            (touched.start.max(first)..touched.end.min(last + 1))
                .filter_map(|i| batch.binary_search(&i).ok().map(|at| (i, at)))
        };
        let mut wanted_by = vec![0u32; batch.len()];
        for (offset, buf) in jobs.iter() {
            for (_, at) in in_batch(*offset..*offset + buf.len() as u64) {
                wanted_by[at] += 1;
            }
        }
        let mut targets: Vec<Option<&mut [u8]>> = (0..batch.len()).map(|_| None).collect();
        for (offset, buf) in jobs.iter_mut() {
            let end = *offset + buf.len() as u64;
            let (mut rest, mut rest_at): (&mut [u8], u64) = (&mut **buf, *offset);
            for (i, at) in in_batch(*offset..end) {
                let frame = &self.frames[i];
                if wanted_by[at] != 1 || frame.at < rest_at || frame.at + frame.len > end {
                    continue;
                }
                let (_, tail) =
                    std::mem::take(&mut rest).split_at_mut((frame.at - rest_at) as usize);
                let (target, tail) = tail.split_at_mut(frame.len as usize);
                (rest, rest_at) = (tail, frame.at + frame.len);
                targets[at] = Some(target);
            }
        }
        let work = batch
            .iter()
            .zip(fetched)
            .zip(targets)
            .map(|((&i, bytes), target)| (i, bytes, target))
            .collect();
        let decoded = self.decode_fetched(work)?;
        for (i, bytes) in &decoded {
            for (offset, buf) in jobs.iter_mut() {
                copy_overlap(self.frames[*i].at, bytes, *offset, buf);
            }
        }
        let mut spare = self.spare.lock().unwrap_or_else(PoisonError::into_inner);
        spare.extend(decoded.into_iter().map(|(_, bytes)| bytes));
        // A batch's worth is all the next one needs.
        spare.truncate(batch.len());
        Ok(())
    }
}

impl Source for Decoded {
    fn len(&self) -> u64 {
        self.len
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        self.fetch_into(&mut [(offset, buf)])
    }

    fn bytes(&self, range: Range<u64>) -> Result<Bytes> {
        let mut fetched = self.fetch(std::slice::from_ref(&range))?;
        Ok(fetched.remove(0))
    }

    fn fetch(&self, ranges: &[Range<u64>]) -> Result<Vec<Bytes>> {
        check_ranges(ranges, self.len)?;
        let mut out: Vec<Bytes> = ranges
            .iter()
            .map(|r| {
                let len = usize::try_from(r.end - r.start).map_err(|_| {
                    Error::new(ErrorKind::OutOfRange, "range does not fit in memory")
                })?;
                Bytes::zeroed(len, 64)
            })
            .collect::<Result<_>>()?;
        let mut targets: Vec<&mut [u8]> =
            out.iter_mut().map(Bytes::make_mut).collect::<Result<_>>()?;
        let mut jobs: Vec<(u64, &mut [u8])> = ranges
            .iter()
            .zip(targets.iter_mut())
            .map(|(r, t)| (r.start, &mut **t))
            .collect();
        self.fetch_into(&mut jobs)?;
        Ok(out)
    }

    /// The frames every job touches, in batches of about [`BATCH_LEN`] decoded bytes, each
    /// batch fetched at once and decoded on every core, then copied to the jobs.
    fn fetch_into(&self, jobs: &mut [(u64, &mut [u8])]) -> Result<()> {
        check_jobs(jobs, self.len)?;
        let mut wanted: Vec<usize> = jobs
            .iter()
            .flat_map(|(offset, buf)| self.touched(&(*offset..*offset + buf.len() as u64)))
            .collect();
        wanted.sort_unstable();
        wanted.dedup();
        let mut batches: Vec<Vec<usize>> = Vec::new();
        let mut batch_len = BATCH_LEN;
        for &i in &wanted {
            if batch_len >= BATCH_LEN {
                batches.push(Vec::new());
                batch_len = 0;
            }
            batches.last_mut().expect("a batch was started").push(i);
            batch_len += self.frames[i].len;
        }
        // Batches are fetched ahead on threads of their own, as many as the source's
        // read-ahead budget holds (an object store's: its connections stay busy), one for a
        // source without one; each thread hands its batch over in turn and only then fetches
        // its next, so at most two batches a thread are held.
        let fetchers = usize::try_from(self.stored.fetch_ahead() / BATCH_LEN)
            .unwrap_or(MAX_FETCHERS)
            .clamp(1, MAX_FETCHERS)
            .min(batches.len().max(1));
        std::thread::scope(|scope| {
            let arrivals: Vec<_> = (0..fetchers)
                .map(|first| {
                    let (fetched, arrived) = std::sync::mpsc::sync_channel(0);
                    let batches = &batches;
                    scope.spawn(move || {
                        for batch in batches.iter().skip(first).step_by(fetchers) {
                            if fetched.send(self.fetch_frames(batch)).is_err() {
                                return;
                            }
                        }
                    });
                    arrived
                })
                .collect();
            for (index, batch) in batches.iter().enumerate() {
                let frames = arrivals[index % fetchers].recv().map_err(|_| {
                    Error::new(ErrorKind::Io, "a fetching thread stopped").with_key(&self.key)
                })??;
                self.decode_batch(batch, &frames, jobs)?;
            }
            Ok(())
        })
    }

    /// Each frame the range touches, decoded in turn.
    fn read_in_pieces(
        &self,
        range: Range<u64>,
        each: &mut dyn FnMut(u64, &[u8]) -> Result<()>,
    ) -> Result<()> {
        check_ranges(std::slice::from_ref(&range), self.len)?;
        for i in self.touched(&range) {
            let frame = &self.frames[i];
            let decoded = self.decode(&[i])?.remove(0);
            let start = range.start.max(frame.at);
            let end = range.end.min(frame.at + frame.len);
            each(
                start,
                &decoded[(start - frame.at) as usize..(end - frame.at) as usize],
            )?;
        }
        Ok(())
    }

    fn fetch_ahead(&self) -> u64 {
        self.stored.fetch_ahead()
    }
}

/// Copies the part of `bytes` (which start at `at`) that falls within `buf` (which starts at
/// `offset`).
fn copy_overlap(at: u64, bytes: &[u8], offset: u64, buf: &mut [u8]) {
    let start = at.max(offset);
    let end = (at + bytes.len() as u64).min(offset + buf.len() as u64);
    if start < end {
        buf[(start - offset) as usize..(end - offset) as usize]
            .copy_from_slice(&bytes[(start - at) as usize..(end - at) as usize]);
    }
}
