//! Reading a container recorded piece by piece ([`Pieces`]) as if it were stored whole: a
//! [`Source`] over the stored containers its pieces lie in, so every reader, batched fetch and
//! runtime adapter reads an incremental checkpoint exactly like a full one.

use std::collections::BTreeMap;
use std::ops::Range;
use std::sync::Arc;

use weightbay::backend_kit::{check_jobs, check_ranges};
use weightbay::{AccessPolicy, Bytes, Error, ErrorKind, Result, Source, Storage};

use crate::decoded::Decoded;
use crate::record::Pieces;

/// A container whose bytes are pieces of stored containers.
#[derive(Debug)]
pub(crate) struct Spliced {
    len: u64,
    /// Runs of consecutive pieces lying back to back in one stored container, in container
    /// order.
    spans: Vec<Span>,
    /// The stored containers, each opened once, and the decoded view of each one's encoded
    /// pieces.
    stored: Vec<(String, Arc<dyn Source>)>,
}

#[derive(Debug, Clone)]
struct Span {
    /// Where the run starts in the spliced container.
    at: u64,
    len: u64,
    /// Which of [`Spliced::stored`] holds it, and where.
    stored: usize,
    offset: u64,
}

/// One part of a range asked for: `len` bytes at `offset` of stored container `stored`, to
/// byte `to` of output `out`.
struct Part {
    out: usize,
    to: u64,
    stored: usize,
    offset: u64,
    len: u64,
}

impl Spliced {
    /// Opens every stored container `pieces` refers to (keys relative to `prefix`) and checks
    /// each piece lies within it.
    ///
    /// # Errors
    /// [`ErrorKind::Corrupt`] naming the tensor and the key when a container it refers to is
    /// gone or too short (never wrong bytes); the storage's errors.
    pub(crate) fn open(storage: &dyn Storage, prefix: &str, pieces: &Pieces) -> Result<Self> {
        // Each stored container opened once: its slot in `stored` for raw pieces, and the
        // decoded view of its encoded pieces, built here and put in its slot at the end.
        let mut opened: BTreeMap<&str, Arc<dyn Source>> = BTreeMap::new();
        let mut raw: BTreeMap<&str, usize> = BTreeMap::new();
        let mut views: BTreeMap<&str, (usize, Decoded)> = BTreeMap::new();
        let mut stored: Vec<(String, Arc<dyn Source>)> = Vec::new();
        let mut spans: Vec<Span> = Vec::new();
        let mut at = 0u64;
        for piece in &pieces.list {
            let key = if prefix.is_empty() {
                piece.key.clone()
            } else {
                format!("{prefix}/{}", piece.key)
            };
            let what = piece
                .tensor
                .as_deref()
                .map_or_else(|| "the header".to_owned(), |t| format!("tensor `{t}`"));
            let source = match opened.get(piece.key.as_str()) {
                Some(source) => source.clone(),
                None => {
                    let source = storage.open(&key).map_err(|e| {
                        if e.kind() == ErrorKind::NotFound {
                            Error::new(
                                ErrorKind::Corrupt,
                                format!(
                                    "{} refer to a container that is gone",
                                    holders(pieces, &piece.key)
                                ),
                            )
                            .with_key(&key)
                            .with_source(e)
                        } else {
                            e.with_key(&key)
                        }
                    })?;
                    opened.insert(&piece.key, source.clone());
                    source
                }
            };
            let (slot, offset) = match &piece.encoding {
                Some(encoding) => {
                    let (slot, view) = views.entry(&piece.key).or_insert_with(|| {
                        stored.push((key.clone(), source.clone()));
                        (stored.len() - 1, Decoded::new(key.clone(), source.clone()))
                    });
                    (*slot, view.push(piece, encoding)?)
                }
                None => {
                    let slot = *raw.entry(&piece.key).or_insert_with(|| {
                        stored.push((key.clone(), source.clone()));
                        stored.len() - 1
                    });
                    let stored_len = source.len();
                    if piece
                        .offset
                        .checked_add(piece.len)
                        .is_none_or(|end| end > stored_len)
                    {
                        return Err(Error::new(
                            ErrorKind::Corrupt,
                            format!(
                                "{what} refers to bytes {}..+{} of a container of {stored_len}",
                                piece.offset, piece.len
                            ),
                        )
                        .with_key(&key));
                    }
                    (slot, piece.offset)
                }
            };
            match spans.last_mut() {
                Some(last) if last.stored == slot && last.offset + last.len == offset => {
                    last.len += piece.len;
                }
                _ => spans.push(Span {
                    at,
                    len: piece.len,
                    stored: slot,
                    offset,
                }),
            }
            at = at
                .checked_add(piece.len)
                .ok_or_else(|| Error::new(ErrorKind::Corrupt, "pieces overflow"))?;
        }
        for (_, (slot, view)) in views {
            stored[slot].1 = Arc::new(view);
        }
        if at != pieces.len {
            return Err(Error::new(
                ErrorKind::Corrupt,
                format!("pieces of {at} bytes, the record says {}", pieces.len),
            ));
        }
        Ok(Self {
            len: at,
            spans,
            stored,
        })
    }

    /// The parts of `range`, for output `out`.
    fn parts(&self, out: usize, range: &Range<u64>, parts: &mut Vec<Part>) {
        let mut at = range.start;
        let mut i = self.spans.partition_point(|s| s.at + s.len <= at);
        while at < range.end {
            // `range` lies within `0..len`, which the spans tile.
            let span = &self.spans[i];
            let end = range.end.min(span.at + span.len);
            parts.push(Part {
                out,
                to: at - range.start,
                stored: span.stored,
                offset: span.offset + (at - span.at),
                len: end - at,
            });
            at = end;
            i += 1;
        }
    }
}

/// What has pieces in stored container `key`, for an error: `the header, tensors `a`, `b``.
fn holders(pieces: &Pieces, key: &str) -> String {
    let mut header = false;
    let mut tensors: Vec<&str> = Vec::new();
    for piece in pieces.list.iter().filter(|p| p.key == key) {
        match piece.tensor.as_deref() {
            None => header = true,
            Some(name) if tensors.last() != Some(&name) => tensors.push(name),
            Some(_) => {}
        }
    }
    let mut named: Vec<String> = header
        .then(|| "the header".to_owned())
        .into_iter()
        .collect();
    let shown: Vec<String> = tensors.iter().take(8).map(|t| format!("`{t}`")).collect();
    if !shown.is_empty() {
        let more = tensors.len().saturating_sub(8);
        let tail = if more > 0 {
            format!(" and {more} more")
        } else {
            String::new()
        };
        named.push(format!("tensors {}{tail}", shown.join(", ")));
    }
    named.join(" and ")
}

impl Source for Spliced {
    fn len(&self) -> u64 {
        self.len
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        let range = offset..offset + buf.len() as u64;
        check_ranges(std::slice::from_ref(&range), self.len)?;
        let mut parts = Vec::new();
        self.parts(0, &range, &mut parts);
        for part in parts {
            let (key, source) = &self.stored[part.stored];
            let to = part.to as usize;
            source
                .read_at(part.offset, &mut buf[to..to + part.len as usize])
                .map_err(|e| e.with_key(key))?;
        }
        Ok(())
    }

    /// Within one stored container: that container's own bytes (a view of a map, a lazy
    /// range). Across several: read now.
    fn bytes(&self, range: Range<u64>) -> Result<Bytes> {
        check_ranges(std::slice::from_ref(&range), self.len)?;
        let mut parts = Vec::new();
        self.parts(0, &range, &mut parts);
        if let [part] = parts.as_slice() {
            let (key, source) = &self.stored[part.stored];
            return source
                .bytes(part.offset..part.offset + part.len)
                .map_err(|e| e.with_key(key));
        }
        let mut fetched = self.fetch(std::slice::from_ref(&range))?;
        Ok(fetched.remove(0))
    }

    /// One batched fetch per stored container of every part the ranges need from it (the
    /// container's own fetch coalesces and parallelizes them as its backend does best), the
    /// containers fetched side by side; a range within one container is handed out as that
    /// container's bytes.
    fn fetch(&self, ranges: &[Range<u64>]) -> Result<Vec<Bytes>> {
        check_ranges(ranges, self.len)?;
        let mut parts = Vec::new();
        for (out, range) in ranges.iter().enumerate() {
            self.parts(out, range, &mut parts);
        }
        // Each stored container's parts, and where each part's bytes come back in its fetch.
        let mut asked: BTreeMap<usize, Vec<Range<u64>>> = BTreeMap::new();
        let slots: Vec<usize> = parts
            .iter()
            .map(|part| {
                let runs = asked.entry(part.stored).or_default();
                runs.push(part.offset..part.offset + part.len);
                runs.len() - 1
            })
            .collect();
        let fetched = side_by_side(asked, |stored, runs| {
            let (key, source) = &self.stored[stored];
            source.fetch(&runs).map_err(|e| e.with_key(key))
        })?;
        let piece = |i: usize| -> Result<&Bytes> {
            let part = &parts[i];
            fetched
                .get(&part.stored)
                .and_then(|bytes| bytes.get(slots[i]))
                .filter(|bytes| bytes.len() as u64 == part.len)
                .ok_or_else(|| {
                    Error::new(
                        ErrorKind::Io,
                        "a batched read returned other lengths than asked",
                    )
                    .with_key(&self.stored[part.stored].0)
                })
        };
        let mut out: Vec<Bytes> = Vec::with_capacity(ranges.len());
        let mut i = 0;
        for (index, range) in ranges.iter().enumerate() {
            let count = parts[i..].iter().take_while(|p| p.out == index).count();
            if count == 1 {
                out.push(piece(i)?.clone());
            } else {
                let len = usize::try_from(range.end - range.start).map_err(|_| {
                    Error::new(ErrorKind::OutOfRange, "range does not fit in memory")
                })?;
                let mut joined = Bytes::zeroed(len, 64)?;
                let target = joined.make_mut()?;
                for (j, part) in parts.iter().enumerate().skip(i).take(count) {
                    let to = part.to as usize;
                    let bytes = piece(j)?.read(AccessPolicy::AllowCopy)?;
                    target[to..to + bytes.len()].copy_from_slice(bytes);
                }
                out.push(joined);
            }
            i += count;
        }
        Ok(out)
    }

    /// Each job cut at the stored containers' boundaries, and one `fetch_into` per stored
    /// container of every piece it holds, the containers read side by side.
    fn fetch_into(&self, jobs: &mut [(u64, &mut [u8])]) -> Result<()> {
        check_jobs(jobs, self.len)?;
        let mut shares: BTreeMap<usize, Vec<(u64, &mut [u8])>> = BTreeMap::new();
        let mut parts = Vec::new();
        for (out, (offset, buf)) in jobs.iter_mut().enumerate() {
            parts.clear();
            self.parts(out, &(*offset..*offset + buf.len() as u64), &mut parts);
            // The parts tile the job's range in order.
            let mut rest: &mut [u8] = buf;
            for part in &parts {
                let (piece, tail) = std::mem::take(&mut rest).split_at_mut(part.len as usize);
                rest = tail;
                shares
                    .entry(part.stored)
                    .or_default()
                    .push((part.offset, piece));
            }
        }
        side_by_side(shares, |stored, mut share| {
            let (key, source) = &self.stored[stored];
            source.fetch_into(&mut share).map_err(|e| e.with_key(key))
        })?;
        Ok(())
    }

    /// Each part of the range streamed from its stored container in turn, the pieces' offsets
    /// moved to where the part lies in this container.
    fn read_in_pieces(
        &self,
        range: Range<u64>,
        each: &mut dyn FnMut(u64, &[u8]) -> Result<()>,
    ) -> Result<()> {
        check_ranges(std::slice::from_ref(&range), self.len)?;
        let mut parts = Vec::new();
        self.parts(0, &range, &mut parts);
        for part in parts {
            let (key, source) = &self.stored[part.stored];
            let moved_by = range.start + part.to;
            // `each`'s error is the caller's (a destination's, say): kept apart, so that only
            // the source's own errors are named after the stored container.
            let mut theirs = None;
            let read =
                source.read_in_pieces(part.offset..part.offset + part.len, &mut |offset, piece| {
                    each(offset - part.offset + moved_by, piece).map_err(|e| {
                        theirs = Some(e);
                        Error::new(ErrorKind::Interrupted, "the reader stopped")
                    })
                });
            if let Some(e) = theirs {
                return Err(e);
            }
            read.map_err(|e| e.with_key(key))?;
        }
        Ok(())
    }

    fn fetch_ahead(&self) -> u64 {
        self.stored
            .iter()
            .map(|(_, source)| source.fetch_ahead())
            .max()
            .unwrap_or(0)
    }
}

/// `read` of each stored container's share of a batched read, on threads of their own when
/// there are several, so the containers' requests run side by side.
fn side_by_side<T: Send, R: Send>(
    shares: BTreeMap<usize, T>,
    read: impl Fn(usize, T) -> Result<R> + Sync,
) -> Result<BTreeMap<usize, R>> {
    if shares.len() <= 1 {
        return shares
            .into_iter()
            .map(|(stored, share)| Ok((stored, read(stored, share)?)))
            .collect();
    }
    let read = &read;
    std::thread::scope(|scope| {
        let workers: Vec<_> = shares
            .into_iter()
            .map(|(stored, share)| (stored, scope.spawn(move || read(stored, share))))
            .collect();
        workers
            .into_iter()
            .map(|(stored, worker)| {
                let read = worker
                    .join()
                    .unwrap_or_else(|_| Err(Error::new(ErrorKind::Io, "a read thread panicked")))?;
                Ok((stored, read))
            })
            .collect()
    })
}
