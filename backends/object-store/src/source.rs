//! The version-pinned ranged source.

use std::fmt;
use std::ops::Range;
use std::sync::Arc;

use bytes::BytesMut;
use futures::{SinkExt, StreamExt};
use object_store::path::Path;
use object_store::{GetOptions, GetRange, ObjectStore, ObjectStoreExt};
use weightbay::backend_kit::{OPEN_PREFIX_LEN, PIECE_LEN, check_jobs, check_range, lazy_bytes};
use weightbay::{AllocationProperty, Bytes, Error, ErrorKind, Result, Source};

use crate::error::convert;
use crate::options::ObjectStoreOptions;
use crate::runtime::Bridge;

/// Adjacent ranges closer than this are fetched in one request.
const COALESCE_GAP: u64 = 1 << 20;
/// The most requests [`ObjectSource::fetch`] keeps open at once, however small they are: more
/// connections stop adding throughput long before this (`get_ranges` stops at 10).
const MAX_REQUESTS_IN_FLIGHT: u64 = 16;

struct Remote {
    store: Arc<dyn ObjectStore>,
    path: Path,
    key: String,
    len: u64,
    e_tag: Option<String>,
    version: Option<String>,
    /// The first bytes, fetched with the object's size and version in the opening request.
    prefix: bytes::Bytes,
    bridge: Bridge,
    /// [`ObjectStoreOptions::fetch_request_len`] of the storage that opened it.
    fetch_request_len: Option<u64>,
    /// [`ObjectStoreOptions::fetch_budget`] of the storage that opened it.
    fetch_budget: usize,
}

impl fmt::Debug for Remote {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ObjectSource")
            .field("path", &self.path.as_ref())
            .field("len", &self.len)
            .field("version", &self.version)
            .finish_non_exhaustive()
    }
}

impl Remote {
    fn pinned(&self, range: Range<u64>) -> GetOptions {
        GetOptions {
            range: Some(GetRange::Bounded(range)),
            if_match: self.e_tag.clone(),
            version: self.version.clone(),
            ..GetOptions::default()
        }
    }

    /// GETs `offset..offset + buf.len()` straight into `buf`: the response's chunks cross to
    /// this thread as they arrive and are copied into place, so no buffer of the range's size
    /// is allocated (a staging pool's reused buffers stay the only memory the bytes land in).
    fn get_into(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        let mut received = 0usize;
        self.get_chunks(offset..offset + buf.len() as u64, &mut |chunk| {
            if let Some(target) = buf.get_mut(received..received + chunk.len()) {
                target.copy_from_slice(chunk);
            }
            received += chunk.len();
            Ok(())
        })
    }

    /// GETs `range` and hands the response's chunks to `each` on this thread as they arrive,
    /// then checks the store sent the range's length.
    fn get_chunks(
        &self,
        range: Range<u64>,
        each: &mut dyn FnMut(&[u8]) -> Result<()>,
    ) -> Result<()> {
        self.bridge.check_may_wait()?;
        let (offset, len) = (range.start, range.end - range.start);
        let (store, path, options) = (
            Arc::clone(&self.store),
            self.path.clone(),
            self.pinned(range),
        );
        // A few chunks in flight: the response waits on the caller, never piles up in memory.
        let (mut sender, mut chunks) = futures::channel::mpsc::channel(4);
        let _detached = self.bridge.spawn(async move {
            let mut body = match store.get_opts(&path, options).await {
                Ok(got) => got.into_stream(),
                Err(e) => {
                    let _ = sender.send(Err(e)).await;
                    return;
                }
            };
            // Ends when the body does, or when the reader stopped listening.
            while let Some(chunk) = body.next().await {
                let failed = chunk.is_err();
                if sender.send(chunk).await.is_err() || failed {
                    return;
                }
            }
        });
        let mut received = 0u64;
        futures::executor::block_on(async {
            while let Some(chunk) = chunks.next().await {
                let chunk = chunk.map_err(|e| self.read_error(offset, e))?;
                received += chunk.len() as u64;
                if received > len {
                    break;
                }
                each(&chunk)?;
            }
            Ok::<(), Error>(())
        })?;
        if received != len {
            let returned = if received > len {
                "more than that".to_owned()
            } else {
                received.to_string()
            };
            return Err(Error::new(
                ErrorKind::Io,
                format!("the store returned {returned} bytes for a {len}-byte range"),
            )
            .with_key(&self.key)
            .with_offset(offset));
        }
        Ok(())
    }

    /// How many of `requests` run at once: as many of the longest as the fetch budget holds,
    /// at least one and at most [`MAX_REQUESTS_IN_FLIGHT`].
    fn in_flight<'a>(&self, requests: impl Iterator<Item = &'a Range<u64>>) -> usize {
        let largest = requests.map(|r| r.end - r.start).max().unwrap_or(1).max(1);
        (self.fetch_budget as u64 / largest).clamp(1, MAX_REQUESTS_IN_FLIGHT) as usize
    }

    fn read_error(&self, offset: u64, e: object_store::Error) -> Error {
        let changed = matches!(
            e,
            object_store::Error::Precondition { .. } | object_store::Error::NotFound { .. }
        );
        if changed {
            return Error::new(
                ErrorKind::Changed,
                "the object changed or vanished since it was opened",
            )
            .with_source(e)
            .with_key(&self.key)
            .with_offset(offset);
        }
        convert("reading a range", e)
            .with_key(&self.key)
            .with_offset(offset)
    }
}

impl Source for Remote {
    fn len(&self) -> u64 {
        self.len
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        let end = offset.saturating_add(buf.len() as u64);
        check_range(&(offset..end), self.len)?;
        if end <= self.prefix.len() as u64 {
            // In range, so both ends fit in usize.
            buf.copy_from_slice(&self.prefix[offset as usize..end as usize]);
            return Ok(());
        }
        if buf.is_empty() {
            return Ok(());
        }
        self.get_into(offset, buf)
    }

    /// One GET, its chunks gathered into pieces of [`PIECE_LEN`] (a chunk that long already
    /// is handed over as it is, once the bytes before it are).
    fn read_in_pieces(
        &self,
        range: Range<u64>,
        each: &mut dyn FnMut(u64, &[u8]) -> Result<()>,
    ) -> Result<()> {
        check_range(&range, self.len)?;
        if range.is_empty() {
            return Ok(());
        }
        if range.end <= self.prefix.len() as u64 {
            // In range, so both ends fit in usize.
            return each(
                range.start,
                &self.prefix[range.start as usize..range.end as usize],
            );
        }
        let piece_len = PIECE_LEN as usize;
        let mut gathered = Vec::with_capacity(piece_len.min((range.end - range.start) as usize));
        let mut offset = range.start;
        self.get_chunks(range, &mut |mut chunk| {
            if !gathered.is_empty() {
                // At most the chunk's length, so both slices below are in it.
                let fill = (piece_len - gathered.len()).min(chunk.len());
                gathered.extend_from_slice(&chunk[..fill]);
                chunk = &chunk[fill..];
                if gathered.len() < piece_len {
                    return Ok(());
                }
                each(offset, &gathered)?;
                offset += gathered.len() as u64;
                gathered.clear();
            }
            if chunk.len() >= piece_len {
                each(offset, chunk)?;
                offset += chunk.len() as u64;
            } else {
                gathered.extend_from_slice(chunk);
            }
            Ok(())
        })?;
        if gathered.is_empty() {
            return Ok(());
        }
        each(offset, &gathered)
    }
}

/// An object opened for reading: its size and version (or ETag) are learned in the first
/// request, which also brings the header and metadata, and every later range request is pinned
/// to them, so an object replaced mid-read gives an error, never mixed bytes.
#[derive(Debug, Clone)]
pub struct ObjectSource(Arc<Remote>);

impl ObjectSource {
    pub(crate) fn open(
        store: Arc<dyn ObjectStore>,
        path: Path,
        key: String,
        bridge: Bridge,
        options: &ObjectStoreOptions,
    ) -> Result<Self> {
        let request = (Arc::clone(&store), path.clone());
        let opened = bridge.run(async move {
            let (store, path) = request;
            let options = GetOptions {
                range: Some(GetRange::Bounded(0..OPEN_PREFIX_LEN)),
                ..GetOptions::default()
            };
            match store.get_opts(&path, options).await {
                Ok(result) => {
                    let meta = result.meta.clone();
                    Ok((meta, result.bytes().await?))
                }
                // An empty object has no first byte to range over.
                Err(object_store::Error::NotFound { path, source }) => {
                    Err(object_store::Error::NotFound { path, source })
                }
                Err(_) => Ok((store.head(&path).await?, bytes::Bytes::new())),
            }
        })?;
        let (meta, prefix) = opened.map_err(|e| convert("opening the object", e).with_key(&key))?;
        Ok(Self(Arc::new(Remote {
            store,
            path,
            key,
            len: meta.size,
            e_tag: meta.e_tag,
            version: meta.version,
            prefix,
            bridge,
            fetch_request_len: options.fetch_request_len,
            fetch_budget: options.fetch_budget,
        })))
    }

    /// The object version the source is pinned to, if the store reports one.
    pub fn version(&self) -> Option<&str> {
        self.0.version.as_deref()
    }

    /// The ETag the source is pinned to, if the store reports one.
    pub fn e_tag(&self) -> Option<&str> {
        self.0.e_tag.as_deref()
    }

    /// Fetches `ranges` now and returns them resident, in the order given. Ranges closer than
    /// 1 MiB are coalesced into requests of about
    /// [`fetch_request_len`](ObjectStoreOptions::fetch_request_len) bytes (at most 1.5 times
    /// it), and a longer range is fetched in equal pieces of about that length, which run in parallel within
    /// [`fetch_budget`](ObjectStoreOptions::fetch_budget) bytes in flight (at least one
    /// request at a time); every request is pinned to the opened version.
    ///
    /// # Errors
    /// [`ErrorKind::OutOfRange`] for a range past the end; the store's error.
    pub fn fetch(&self, ranges: &[Range<u64>]) -> Result<Vec<Bytes>> {
        for range in ranges {
            check_range(range, self.0.len)?;
        }
        let request_len = self.0.fetch_request_len.unwrap_or(u64::MAX).max(1);
        let runs = coalesce(ranges, request_len);
        // Each run gets one buffer, cut into one piece per request: responses stream straight
        // into place, one copy from the network, and the pieces join again without a copy.
        let mut requests: Vec<(Range<u64>, BytesMut)> = Vec::new();
        for (run, _) in &runs {
            let mut buffer = BytesMut::zeroed(to_usize(run.end - run.start)?);
            for piece in requests_of(run, request_len) {
                let len = to_usize(piece.end - piece.start)?;
                requests.push((piece, buffer.split_to(len)));
            }
        }
        let parallel = self.0.in_flight(requests.iter().map(|(r, _)| r));
        let remote = Arc::clone(&self.0);
        let pinned: Vec<(usize, Range<u64>, GetOptions, BytesMut)> = requests
            .into_iter()
            .enumerate()
            .map(|(i, (range, piece))| (i, range.clone(), remote.pinned(range), piece))
            .collect();
        let store = Arc::clone(&remote.store);
        let path = remote.path.clone();
        let fetched = remote.bridge.run(async move {
            futures::stream::iter(pinned)
                .map(|(i, range, options, piece)| {
                    let (store, path) = (Arc::clone(&store), path.clone());
                    async move {
                        let filled = fill(store.as_ref(), &path, options, piece).await;
                        (i, range, filled)
                    }
                })
                // Unordered, so a slow request holds one slot, not every slot behind it.
                .buffer_unordered(parallel)
                .collect::<Vec<_>>()
                .await
        })?;
        let mut fetched = fetched;
        fetched.sort_unstable_by_key(|(i, _, _)| *i);
        let mut pieces = Vec::with_capacity(fetched.len());
        for (_, range, filled) in fetched {
            let (piece, received) = filled.map_err(|e| remote.read_error(range.start, e))?;
            if received != piece.len() {
                return Err(Error::new(
                    ErrorKind::Io,
                    format!(
                        "the store returned {received} bytes for a {}-byte range",
                        piece.len()
                    ),
                )
                .with_key(&remote.key)
                .with_offset(range.start));
            }
            pieces.push(piece);
        }
        // The pieces are in request order, which is run order.
        let mut pieces = pieces.into_iter();
        let mut out = vec![Bytes::from(Vec::new()); ranges.len()];
        for (run, members) in runs {
            let mut joined = BytesMut::new();
            for _ in requests_of(&run, request_len) {
                // Adjacent pieces of one buffer: unsplit only moves the end.
                joined.unsplit(pieces.next().unwrap_or_default());
            }
            let joined = joined.freeze();
            for i in members {
                let range = &ranges[i];
                let slice = joined
                    .slice((range.start - run.start) as usize..(range.end - run.start) as usize);
                out[i] = Bytes::from_shared(slice, AllocationProperty::Shared);
            }
        }
        Ok(out)
    }

    /// Reads each job's range into its buffer, requested as [`fetch`](Self::fetch) requests
    /// them (coalesced, in pieces of the request length, in parallel within the fetch budget,
    /// pinned to the opened version). The responses' chunks cross to the calling thread as they
    /// arrive and are copied into the buffers there, so no memory of the ranges' size is
    /// allocated: the buffers are the only place the bytes land.
    ///
    /// # Errors
    /// [`ErrorKind::OutOfRange`] for a range past the end, before any request; the store's
    /// error.
    pub fn fetch_into(&self, jobs: &mut [(u64, &mut [u8])]) -> Result<()> {
        check_jobs(jobs, self.0.len)?;
        let remote = &self.0;
        remote.bridge.check_may_wait()?;
        let ranges: Vec<Range<u64>> = jobs
            .iter()
            .map(|(offset, buf)| *offset..offset + buf.len() as u64)
            .collect();
        let request_len = remote.fetch_request_len.unwrap_or(u64::MAX).max(1);
        // Each request with the jobs of its run, in order of their starts.
        let mut requests: Vec<(Range<u64>, Arc<[usize]>)> = Vec::new();
        for (run, members) in coalesce(&ranges, request_len) {
            let members: Arc<[usize]> = members.into();
            for piece in requests_of(&run, request_len) {
                requests.push((piece, Arc::clone(&members)));
            }
        }
        let parallel = remote.in_flight(requests.iter().map(|(r, _)| r));
        let pinned: Vec<(usize, GetOptions)> = requests
            .iter()
            .enumerate()
            .map(|(i, (range, _))| (i, remote.pinned(range.clone())))
            .collect();
        let (store, path) = (Arc::clone(&remote.store), remote.path.clone());
        // A few chunks per request in flight: the responses wait on the copies, never pile up.
        let (sender, mut chunks) = futures::channel::mpsc::channel(parallel * 4);
        let _detached = remote.bridge.spawn(async move {
            futures::stream::iter(pinned)
                .for_each_concurrent(parallel, |(i, options)| {
                    let (store, path, mut sender) =
                        (Arc::clone(&store), path.clone(), sender.clone());
                    async move {
                        if sender.is_closed() {
                            return;
                        }
                        let mut body = match store.get_opts(&path, options).await {
                            Ok(got) => got.into_stream(),
                            Err(e) => {
                                let _ = sender.send((i, Err(e))).await;
                                return;
                            }
                        };
                        // Ends with the body, or when the reader stopped listening.
                        while let Some(chunk) = body.next().await {
                            let failed = chunk.is_err();
                            if sender.send((i, chunk)).await.is_err() || failed {
                                return;
                            }
                        }
                    }
                })
                .await;
        });
        let mut received = vec![0u64; requests.len()];
        // Per request, the first of its jobs not wholly before what has arrived.
        let mut first = vec![0usize; requests.len()];
        futures::executor::block_on(async {
            while let Some((i, chunk)) = chunks.next().await {
                let (range, members) = &requests[i];
                let chunk = chunk.map_err(|e| remote.read_error(range.start, e))?;
                let at = range.start + received[i];
                received[i] += chunk.len() as u64;
                // Bytes past the request's range (a store sending too much) land nowhere.
                let usable = range.end.saturating_sub(at).min(chunk.len() as u64) as usize;
                scatter(jobs, &ranges, members, &mut first[i], at, &chunk[..usable]);
            }
            Ok::<(), Error>(())
        })?;
        for ((range, _), received) in requests.iter().zip(received) {
            if received != range.end - range.start {
                return Err(Error::new(
                    ErrorKind::Io,
                    format!(
                        "the store returned {received} bytes for a {}-byte range",
                        range.end - range.start
                    ),
                )
                .with_key(&remote.key)
                .with_offset(range.start));
            }
        }
        Ok(())
    }
}

/// Copies `chunk`, the bytes at `at` of the object, into the jobs among `members` (sorted by
/// start) that it overlaps; `first` skips the members wholly before it, as a request's chunks
/// arrive in order.
fn scatter(
    jobs: &mut [(u64, &mut [u8])],
    ranges: &[Range<u64>],
    members: &[usize],
    first: &mut usize,
    at: u64,
    chunk: &[u8],
) {
    let end = at + chunk.len() as u64;
    while members.get(*first).is_some_and(|&m| ranges[m].end <= at) {
        *first += 1;
    }
    for &m in members.get(*first..).unwrap_or_default() {
        let range = &ranges[m];
        if range.start >= end {
            break;
        }
        let (from, to) = (range.start.max(at), range.end.min(end));
        if from < to {
            // Both lie within the job's range and the chunk, so the offsets fit.
            let target = &mut jobs[m].1[(from - range.start) as usize..(to - range.start) as usize];
            target.copy_from_slice(&chunk[(from - at) as usize..(to - at) as usize]);
        }
    }
}

/// `len` as a buffer length.
fn to_usize(len: u64) -> Result<usize> {
    usize::try_from(len)
        .map_err(|_| Error::new(ErrorKind::OutOfRange, "a range does not fit in memory"))
}

/// GETs a range into `piece`, which has its length; returns the piece and how many bytes the
/// store sent (more than fit are counted, not written).
async fn fill(
    store: &dyn ObjectStore,
    path: &Path,
    options: GetOptions,
    mut piece: BytesMut,
) -> object_store::Result<(BytesMut, usize)> {
    let mut body = store.get_opts(path, options).await?.into_stream();
    let mut received = 0;
    while let Some(chunk) = body.next().await {
        let chunk = chunk?;
        if let Some(target) = piece.get_mut(received..received + chunk.len()) {
            target.copy_from_slice(&chunk);
        }
        received += chunk.len();
    }
    Ok((piece, received))
}

/// How many requests a run of `len` bytes is fetched in: as many as `request_len` divides it
/// into, rounded to the nearest (at least one). A range a little past the request length (a
/// tensor of 17 MiB against 16 MiB requests) is then one request, not a second one that pays a
/// whole round trip for its last megabyte; no request is longer than 1.5 times the request
/// length.
fn request_count(len: u64, request_len: u64) -> u64 {
    (len / request_len + u64::from(len % request_len >= request_len.div_ceil(2))).max(1)
}

/// The requests a run is fetched in ([`request_count`] of them), of equal length.
fn requests_of(run: &Range<u64>, request_len: u64) -> impl Iterator<Item = Range<u64>> + use<> {
    let count = request_count(run.end - run.start, request_len);
    let piece = (run.end - run.start).div_ceil(count).max(1);
    let (start, end) = (run.start, run.end);
    let at = move |i: u64| start.saturating_add(i.saturating_mul(piece)).min(end);
    (0..count)
        .map(move |i| at(i)..at(i + 1))
        .filter(|piece| !piece.is_empty())
}

/// The runs to fetch: ranges sorted by start and merged when closer than [`COALESCE_GAP`] and
/// the merged run is still one request, each with the indices of the ranges inside it. So only
/// a single range can make a run longer than one request, and a norm beside a large tensor
/// rides in its request. Empty ranges (zero-element tensors) need no request and are left out;
/// their output stays empty.
fn coalesce(ranges: &[Range<u64>], request_len: u64) -> Vec<(Range<u64>, Vec<usize>)> {
    let mut order: Vec<usize> = (0..ranges.len()).collect();
    order.sort_by_key(|&i| ranges[i].start);
    let mut runs: Vec<(Range<u64>, Vec<usize>)> = Vec::new();
    for i in order {
        let range = &ranges[i];
        if range.start == range.end {
            continue;
        }
        match runs.last_mut() {
            Some((run, members))
                if range.start <= run.end + COALESCE_GAP
                    && request_count(range.end.max(run.end) - run.start, request_len) == 1 =>
            {
                run.end = run.end.max(range.end);
                members.push(i);
            }
            _ => runs.push((range.clone(), vec![i])),
        }
    }
    runs
}

impl Source for ObjectSource {
    fn len(&self) -> u64 {
        self.0.len
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        self.0.read_at(offset, buf)
    }

    /// One version-pinned GET, streamed: see [`Source::read_in_pieces`].
    fn read_in_pieces(
        &self,
        range: Range<u64>,
        each: &mut dyn FnMut(u64, &[u8]) -> Result<()>,
    ) -> Result<()> {
        self.0.read_in_pieces(range, each)
    }

    fn bytes(&self, range: Range<u64>) -> Result<Bytes> {
        lazy_bytes(Arc::clone(&self.0) as _, range, AllocationProperty::Remote)
    }

    /// Coalesced, parallel, version-pinned GETs: see [`ObjectSource::fetch`].
    fn fetch(&self, ranges: &[Range<u64>]) -> Result<Vec<Bytes>> {
        ObjectSource::fetch(self, ranges)
    }

    /// Coalesced, parallel, version-pinned GETs streamed into the buffers: see
    /// [`ObjectSource::fetch_into`].
    fn fetch_into(&self, jobs: &mut [(u64, &mut [u8])]) -> Result<()> {
        ObjectSource::fetch_into(self, jobs)
    }

    /// The fetch budget: what [`fetch`](Self::fetch) may keep in flight.
    fn fetch_ahead(&self) -> u64 {
        self.0.fetch_budget as u64
    }
}
