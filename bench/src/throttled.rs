//! A store in front of another that answers like a cloud store across a network: every request
//! waits a fixed latency before its first byte, and every response body arrives no faster than
//! one connection carries. Each request is its own connection, as with `object_store`'s HTTP
//! clients, so parallel requests add up until the machine's own limit.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use futures::StreamExt;
use futures::stream::BoxStream;
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, GetResultPayload, ListResult, MultipartUpload, ObjectMeta,
    ObjectStore, PutMultipartOptions, PutOptions, PutPayload, PutResult,
};

/// `inner` behind a network of `latency` to first byte and `bytes_per_second` per connection.
#[derive(Debug)]
pub(crate) struct Throttled {
    inner: Arc<dyn ObjectStore>,
    latency: Duration,
    bytes_per_second: f64,
    connections: Arc<Connections>,
}

/// Requests open now, and the most open at once since the last reset.
#[derive(Debug, Default)]
struct Connections {
    open: AtomicU64,
    most: AtomicU64,
}

/// One open request; closes when its response body is dropped.
struct Open(Arc<Connections>);

impl Open {
    fn new(connections: &Arc<Connections>) -> Self {
        let open = connections.open.fetch_add(1, Ordering::SeqCst) + 1;
        connections.most.fetch_max(open, Ordering::SeqCst);
        Self(Arc::clone(connections))
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The most bytes a connection delivers in one piece, like an HTTP client's receive buffer.
const FRAME: usize = 1 << 20;

impl Throttled {
    pub(crate) fn new(
        inner: Arc<dyn ObjectStore>,
        latency: Duration,
        bytes_per_second: f64,
    ) -> Self {
        Self {
            inner,
            latency,
            bytes_per_second,
            connections: Arc::default(),
        }
    }

    /// The most requests that were open at once since the last call (which resets it).
    pub(crate) fn take_most_connections(&self) -> u64 {
        self.connections.most.swap(0, Ordering::SeqCst)
    }

    /// How long `len` bytes take on one connection.
    fn transfer(bytes_per_second: f64, len: usize) -> Duration {
        Duration::from_secs_f64(len as f64 / bytes_per_second)
    }
}

impl fmt::Display for Throttled {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Throttled({}, {:?} latency, {:.0} MiB/s per connection)",
            self.inner,
            self.latency,
            self.bytes_per_second / f64::from(1 << 20)
        )
    }
}

#[async_trait]
impl ObjectStore for Throttled {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        tokio::time::sleep(
            self.latency + Self::transfer(self.bytes_per_second, payload.content_length()),
        )
        .await;
        self.inner.put_opts(location, payload, opts).await
    }

    /// Uploads are not what the load cases measure: they pass straight through.
    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        self.inner.put_multipart_opts(location, opts).await
    }

    async fn get_opts(
        &self,
        location: &Path,
        options: GetOptions,
    ) -> object_store::Result<GetResult> {
        let open = Open::new(&self.connections);
        tokio::time::sleep(self.latency).await;
        let mut result = self.inner.get_opts(location, options).await?;
        let (meta, range, attributes) = (
            result.meta.clone(),
            result.range.clone(),
            result.attributes.clone(),
        );
        let extensions = std::mem::take(&mut result.extensions);
        let bytes_per_second = self.bytes_per_second;
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
                let due = started + Self::transfer(bytes_per_second, carried);
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
        self.inner.delete_stream(locations)
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        self.inner.list(prefix)
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> object_store::Result<ListResult> {
        self.inner.list_with_delimiter(prefix).await
    }

    async fn copy_opts(
        &self,
        from: &Path,
        to: &Path,
        options: CopyOptions,
    ) -> object_store::Result<()> {
        self.inner.copy_opts(from, to, options).await
    }
}
