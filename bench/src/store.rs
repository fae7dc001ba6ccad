//! The one store wrapper the benchmarks use, for a store shaped like a cloud store across a
//! network and for counting what a protocol asks of it. Every request (and every page of a
//! listing) waits a fixed latency before its first byte; with a per-connection bandwidth, every
//! body (a PUT's, a part's, a GET's response) moves no faster than one connection carries, each
//! request its own connection as with `object_store`'s HTTP clients, so parallel requests add up
//! until the machine's own limit. With prefix limits, a key prefix takes at most so many writes
//! and reads a second and answers `503 SlowDown` above them, as S3 does. Every request is
//! counted by kind, with the most open at once, the throttled answers, and when each write
//! landed.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use bytes::Bytes;
use futures::StreamExt;
use futures::stream::BoxStream;
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, GetResultPayload, ListResult, MultipartUpload, ObjectMeta,
    ObjectStore, PutMultipartOptions, PutOptions, PutPayload, PutResult, UploadPart,
};

/// Keys per listing page, as S3, GCS and Azure return them.
pub(crate) const PAGE: usize = 1000;
/// The most bytes a connection delivers in one piece, like an HTTP client's receive buffer.
const FRAME: usize = 1 << 20;

/// Requests by kind, connections, and when each write landed.
#[derive(Debug, Default)]
pub(crate) struct Counts {
    pub(crate) puts: AtomicU64,
    pub(crate) multipart: AtomicU64,
    pub(crate) gets: AtomicU64,
    pub(crate) heads: AtomicU64,
    pub(crate) list_pages: AtomicU64,
    pub(crate) deletes: AtomicU64,
    pub(crate) bytes_got: AtomicU64,
    /// Requests answered `503 SlowDown` by the prefix limits.
    pub(crate) throttled: AtomicU64,
    /// The most writes and reads one prefix was sent in one second, under prefix limits.
    pub(crate) peak_writes: AtomicU64,
    pub(crate) peak_reads: AtomicU64,
    open: AtomicU64,
    most_open: AtomicU64,
    landed: Mutex<Vec<(String, Instant)>>,
}

impl Counts {
    /// Every request so far.
    pub(crate) fn total(&self) -> u64 {
        [
            &self.puts,
            &self.multipart,
            &self.gets,
            &self.heads,
            &self.list_pages,
            &self.deletes,
        ]
        .iter()
        .map(|c| c.load(Ordering::SeqCst))
        .sum()
    }

    /// The most requests that were open at once since the last call (which resets it).
    pub(crate) fn take_most_open(&self) -> u64 {
        self.most_open.swap(0, Ordering::SeqCst)
    }

    /// When the last write to a key that `matches` landed.
    pub(crate) fn last_landed(&self, matches: impl Fn(&str) -> bool) -> Option<Instant> {
        self.landed
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .filter(|(key, _)| matches(key))
            .map(|&(_, at)| at)
            .max()
    }

    fn land(&self, location: &Path) {
        self.landed
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push((location.to_string(), Instant::now()));
    }
}

/// One open request; closes when dropped (for a GET, with its response body).
struct Open(Arc<Counts>);

impl Open {
    fn new(counts: &Arc<Counts>) -> Self {
        let open = counts.open.fetch_add(1, Ordering::SeqCst) + 1;
        counts.most_open.fetch_max(open, Ordering::SeqCst);
        Self(Arc::clone(counts))
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::SeqCst);
    }
}

/// How many requests a second one key prefix takes before the store answers `503 SlowDown`:
/// S3 documents 3,500 writes (PUT, COPY, POST, DELETE) and 5,500 reads (GET, HEAD, LIST) a
/// second per partitioned prefix.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PrefixLimits {
    pub(crate) writes_per_second: u64,
    pub(crate) reads_per_second: u64,
    /// A prefix is a key's first this many segments.
    pub(crate) depth: usize,
}

/// The store's answer above a prefix's limit, as the client sees it.
#[derive(Debug)]
pub(crate) struct SlowDown;

impl fmt::Display for SlowDown {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("503 SlowDown: Please reduce your request rate")
    }
}

impl std::error::Error for SlowDown {}

/// Requests in the current second, by prefix and kind.
#[derive(Debug, Default)]
struct Windows(Mutex<HashMap<(String, bool), (u64, u64)>>);

/// `inner` behind `latency` per request and, optionally, a bandwidth per connection and limits
/// per key prefix.
#[derive(Debug)]
pub(crate) struct SlowStore {
    inner: Arc<dyn ObjectStore>,
    latency: Duration,
    bytes_per_second: Option<f64>,
    limits: Option<PrefixLimits>,
    /// GETs that may be open at once: a client's connections, which more requests wait for.
    connections: Option<Arc<tokio::sync::Semaphore>>,
    windows: Arc<Windows>,
    counts: Arc<Counts>,
}

impl SlowStore {
    /// `inner`, every request `latency` away, bodies as fast as `inner` moves them.
    pub(crate) fn new(inner: Arc<dyn ObjectStore>, latency: Duration) -> Self {
        Self {
            inner,
            latency,
            bytes_per_second: None,
            limits: None,
            connections: None,
            windows: Arc::default(),
            counts: Arc::default(),
        }
    }

    /// Each key prefix takes at most `limits` a second; requests above them are answered `503
    /// SlowDown` (after the latency, as a real answer comes).
    pub(crate) fn with_prefix_limits(mut self, limits: PrefixLimits) -> Self {
        self.limits = Some(limits);
        self
    }

    /// Counts a request to `location` in its prefix's second, and refuses it above the limit.
    fn admit(&self, location: Option<&Path>, write: bool) -> object_store::Result<()> {
        admit(self.limits, &self.windows, &self.counts, location, write)
    }

    /// Bodies move at most `bytes_per_second` per connection.
    pub(crate) fn with_bandwidth(mut self, bytes_per_second: f64) -> Self {
        self.bytes_per_second = Some(bytes_per_second);
        self
    }

    /// At most `connections` GETs are open at once (from their request to the end of their
    /// body); more wait for one to close before their latency starts.
    pub(crate) fn with_connections(mut self, connections: usize) -> Self {
        self.connections = Some(Arc::new(tokio::sync::Semaphore::new(connections)));
        self
    }

    /// What it counted.
    pub(crate) fn counts(&self) -> &Arc<Counts> {
        &self.counts
    }

    /// How long `len` bytes take on one connection.
    fn transfer(bytes_per_second: Option<f64>, len: usize) -> Duration {
        bytes_per_second.map_or(Duration::ZERO, |rate| {
            Duration::from_secs_f64(len as f64 / rate)
        })
    }

    /// Sends a body of `len` bytes: the latency, then the transfer.
    async fn send(latency: Duration, bytes_per_second: Option<f64>, len: usize) {
        tokio::time::sleep(latency + Self::transfer(bytes_per_second, len)).await;
    }
}

impl fmt::Display for SlowStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "SlowStore({}, {:?} per request",
            self.inner, self.latency
        )?;
        match self.bytes_per_second {
            Some(rate) => write!(
                f,
                ", {:.0} MiB/s per connection)",
                rate / f64::from(1 << 20)
            ),
            None => write!(f, ")"),
        }
    }
}

// The provided methods (`get_ranges`, `list_with_offset`, `rename_opts`) go through the ones
// below, so they wait and count too.
#[async_trait]
impl ObjectStore for SlowStore {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        self.counts.puts.fetch_add(1, Ordering::SeqCst);
        let _open = Open::new(&self.counts);
        Self::send(
            self.latency,
            self.bytes_per_second,
            payload.content_length(),
        )
        .await;
        self.admit(Some(location), true)?;
        let put = self.inner.put_opts(location, payload, opts).await?;
        self.counts.land(location);
        Ok(put)
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        self.counts.multipart.fetch_add(1, Ordering::SeqCst);
        tokio::time::sleep(self.latency).await;
        self.admit(Some(location), true)?;
        Ok(Box::new(SlowUpload {
            inner: self.inner.put_multipart_opts(location, opts).await?,
            latency: self.latency,
            bytes_per_second: self.bytes_per_second,
            limits: self.limits,
            windows: Arc::clone(&self.windows),
            counts: Arc::clone(&self.counts),
            location: location.clone(),
        }))
    }

    async fn get_opts(
        &self,
        location: &Path,
        options: GetOptions,
    ) -> object_store::Result<GetResult> {
        let counter = if options.head {
            &self.counts.heads
        } else {
            &self.counts.gets
        };
        counter.fetch_add(1, Ordering::SeqCst);
        let connection = match &self.connections {
            Some(connections) => {
                Some(Arc::clone(connections).acquire_owned().await.map_err(|e| {
                    object_store::Error::Generic {
                        store: "SlowStore",
                        source: Box::new(e),
                    }
                })?)
            }
            None => None,
        };
        let open = (Open::new(&self.counts), connection);
        tokio::time::sleep(self.latency).await;
        self.admit(Some(location), false)?;
        let mut result = self.inner.get_opts(location, options).await?;
        self.counts
            .bytes_got
            .fetch_add(result.range.end - result.range.start, Ordering::SeqCst);
        let Some(bytes_per_second) = self.bytes_per_second else {
            return Ok(result);
        };
        let (meta, range, attributes) = (
            result.meta.clone(),
            result.range.clone(),
            result.attributes.clone(),
        );
        let extensions = std::mem::take(&mut result.extensions);
        // The body arrives in frames, none before the connection could have carried it; the
        // caller joins them (`GetResult::bytes`), the one copy a client's receive path makes.
        let started = tokio::time::Instant::now();
        let mut carried = 0usize;
        let paced = result
            .into_stream()
            .flat_map(|chunk| {
                let frames: Vec<object_store::Result<Bytes>> = match chunk {
                    Ok(chunk) => (0..chunk.len())
                        .step_by(FRAME)
                        .map(|start| Ok(chunk.slice(start..(start + FRAME).min(chunk.len()))))
                        .collect(),
                    Err(e) => vec![Err(e)],
                };
                futures::stream::iter(frames)
            })
            .then(move |frame| {
                // The connection counts as open for as long as its body stream lives.
                let _open = &open;
                if let Ok(frame) = &frame {
                    carried += frame.len();
                }
                let due = started + Self::transfer(Some(bytes_per_second), carried);
                async move {
                    tokio::time::sleep_until(due).await;
                    frame
                }
            })
            .boxed();
        Ok(GetResult {
            payload: GetResultPayload::Stream(paced),
            meta,
            range,
            attributes,
            extensions,
        })
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, object_store::Result<Path>>,
    ) -> BoxStream<'static, object_store::Result<Path>> {
        let (counts, latency) = (Arc::clone(&self.counts), self.latency);
        let (limits, windows) = (self.limits, Arc::clone(&self.windows));
        let delayed = locations
            .then(move |location| {
                counts.deletes.fetch_add(1, Ordering::SeqCst);
                let (counts, windows) = (Arc::clone(&counts), Arc::clone(&windows));
                async move {
                    tokio::time::sleep(latency).await;
                    let location = location?;
                    admit(limits, &windows, &counts, Some(&location), true)?;
                    Ok(location)
                }
            })
            .boxed();
        self.inner.delete_stream(delayed)
    }

    /// One request per page of [`PAGE`] keys, one after another as continuation tokens make
    /// them.
    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        let (counts, latency) = (Arc::clone(&self.counts), self.latency);
        let (limits, windows) = (self.limits, Arc::clone(&self.windows));
        let under = prefix.cloned();
        let listing = self.inner.list(prefix);
        futures::stream::once(async move {
            let all: Vec<_> = listing.collect().await;
            for _ in 0..all.len().div_ceil(PAGE).max(1) {
                counts.list_pages.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(latency).await;
                if let Err(e) = admit(limits, &windows, &counts, under.as_ref(), false) {
                    return futures::stream::iter(vec![Err(e)]);
                }
            }
            futures::stream::iter(all)
        })
        .flatten()
        .boxed()
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> object_store::Result<ListResult> {
        self.counts.list_pages.fetch_add(1, Ordering::SeqCst);
        tokio::time::sleep(self.latency).await;
        self.admit(prefix, false)?;
        self.inner.list_with_delimiter(prefix).await
    }

    async fn copy_opts(
        &self,
        from: &Path,
        to: &Path,
        options: CopyOptions,
    ) -> object_store::Result<()> {
        self.counts.puts.fetch_add(1, Ordering::SeqCst);
        tokio::time::sleep(self.latency).await;
        self.admit(Some(to), true)?;
        self.inner.copy_opts(from, to, options).await?;
        self.counts.land(to);
        Ok(())
    }
}

/// See [`SlowStore::admit`]; also for the uploads it hands out.
fn admit(
    limits: Option<PrefixLimits>,
    windows: &Windows,
    counts: &Counts,
    location: Option<&Path>,
    write: bool,
) -> object_store::Result<()> {
    let Some(limits) = limits else {
        return Ok(());
    };
    let prefix: Vec<&str> = location
        .map(|path| path.as_ref().split('/').take(limits.depth).collect())
        .unwrap_or_default();
    let limit = if write {
        limits.writes_per_second
    } else {
        limits.reads_per_second
    };
    let second = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let mut windows = windows.0.lock().unwrap_or_else(PoisonError::into_inner);
    let window = windows.entry((prefix.join("/"), write)).or_default();
    if window.0 != second {
        *window = (second, 0);
    }
    window.1 += 1;
    let peak = if write {
        &counts.peak_writes
    } else {
        &counts.peak_reads
    };
    peak.fetch_max(window.1, Ordering::SeqCst);
    if window.1 <= limit {
        return Ok(());
    }
    counts.throttled.fetch_add(1, Ordering::SeqCst);
    Err(object_store::Error::Generic {
        store: "SlowStore",
        source: Box::new(SlowDown),
    })
}

/// A multipart upload whose part and completion requests wait like any other.
#[derive(Debug)]
struct SlowUpload {
    inner: Box<dyn MultipartUpload>,
    latency: Duration,
    bytes_per_second: Option<f64>,
    limits: Option<PrefixLimits>,
    windows: Arc<Windows>,
    counts: Arc<Counts>,
    location: Path,
}

#[async_trait]
impl MultipartUpload for SlowUpload {
    fn put_part(&mut self, data: PutPayload) -> UploadPart {
        self.counts.multipart.fetch_add(1, Ordering::SeqCst);
        let open = Open::new(&self.counts);
        let (latency, rate, len) = (self.latency, self.bytes_per_second, data.content_length());
        let (limits, windows, counts) = (
            self.limits,
            Arc::clone(&self.windows),
            Arc::clone(&self.counts),
        );
        let location = self.location.clone();
        let part = self.inner.put_part(data);
        Box::pin(async move {
            let _open = open;
            SlowStore::send(latency, rate, len).await;
            admit(limits, &windows, &counts, Some(&location), true)?;
            part.await
        })
    }

    async fn complete(&mut self) -> object_store::Result<PutResult> {
        self.counts.multipart.fetch_add(1, Ordering::SeqCst);
        tokio::time::sleep(self.latency).await;
        admit(
            self.limits,
            &self.windows,
            &self.counts,
            Some(&self.location),
            true,
        )?;
        let put = self.inner.complete().await?;
        self.counts.land(&self.location);
        Ok(put)
    }

    async fn abort(&mut self) -> object_store::Result<()> {
        tokio::time::sleep(self.latency).await;
        self.inner.abort().await
    }
}
