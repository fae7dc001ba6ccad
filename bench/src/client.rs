//! A simulated rank's client of a store: what object_store's HTTP client does around each
//! request, for a store that has none (the simulations' InMemory behind [`SlowStore`]): it
//! waits for its turn at its own [`Throttle`]'s pace, and retries a `503 SlowDown` with
//! object_store's default backoff (from 100 ms, doubling up to 15 s, with jitter; 10 retries
//! within 3 minutes). Every rank of a job is a process of its own, so each gets its own
//! throttle.
//!
//! [`SlowStore`]: crate::store::SlowStore

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore,
    PutMultipartOptions, PutOptions, PutPayload, PutResult,
};
use weightbay_object_store::Throttle;

use crate::store::SlowDown;

/// object_store's `RetryConfig::default()`.
const MAX_RETRIES: u32 = 10;
const RETRY_TIMEOUT: Duration = Duration::from_secs(180);
const INIT_BACKOFF: Duration = Duration::from_millis(100);
const MAX_BACKOFF: Duration = Duration::from_secs(15);

/// Retries made, by every client sharing the counter.
#[derive(Debug, Default)]
pub(crate) struct Retries(pub(crate) AtomicU64);

/// `inner` as one rank's client sees it.
#[derive(Debug)]
pub(crate) struct RankClient {
    inner: Arc<dyn ObjectStore>,
    throttle: Arc<Throttle>,
    retries: Arc<Retries>,
}

impl RankClient {
    /// A client of `inner` with a throttle of its own, counting its retries in `retries`.
    pub(crate) fn new(inner: Arc<dyn ObjectStore>, retries: Arc<Retries>) -> Self {
        Self {
            inner,
            throttle: Arc::default(),
            retries,
        }
    }

    /// Runs `request` until it is not throttled, or the retries run out.
    async fn retrying<T, F, Fut>(&self, request: F) -> object_store::Result<T>
    where
        F: Fn() -> Fut,
        Fut: Future<Output = object_store::Result<T>>,
    {
        let started = Instant::now();
        let mut backoff = INIT_BACKOFF;
        let mut retries = 0;
        loop {
            let sent = self.throttle.pace().await;
            let result = request().await;
            let throttled = matches!(&result, Err(e) if is_slow_down(e));
            self.throttle
                .observe(sent, Some(if throttled { 503 } else { 200 }));
            if !throttled || retries == MAX_RETRIES || started.elapsed() > RETRY_TIMEOUT {
                return result;
            }
            retries += 1;
            self.retries.0.fetch_add(1, Ordering::Relaxed);
            // Decorrelated jitter, as object_store's backoff: somewhere between the first
            // backoff and twice the last.
            let upper = (backoff * 2).min(MAX_BACKOFF);
            let jitter = between(INIT_BACKOFF, upper);
            tokio::time::sleep(jitter).await;
            backoff = jitter.max(INIT_BACKOFF);
        }
    }
}

/// Whether the store answered `503 SlowDown`.
fn is_slow_down(error: &object_store::Error) -> bool {
    matches!(error, object_store::Error::Generic { source, .. } if source.is::<SlowDown>())
}

/// A duration between `low` and `high`, from a per-thread xorshift seeded by the clock.
fn between(low: Duration, high: Duration) -> Duration {
    use std::cell::Cell;
    thread_local! {
        static STATE: Cell<u64> = Cell::new(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos() as u64 | 1),
        );
    }
    let draw = STATE.with(|state| {
        let mut x = state.get();
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        state.set(x);
        x
    });
    let span = high.saturating_sub(low).as_nanos().max(1) as u64;
    low + Duration::from_nanos(draw % span)
}

impl fmt::Display for RankClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RankClient({})", self.inner)
    }
}

#[async_trait]
impl ObjectStore for RankClient {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        self.retrying(|| self.inner.put_opts(location, payload.clone(), opts.clone()))
            .await
    }

    /// Not retried: the simulated containers are single PUTs.
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
        self.retrying(|| self.inner.get_opts(location, options.clone()))
            .await
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, object_store::Result<Path>>,
    ) -> BoxStream<'static, object_store::Result<Path>> {
        self.inner.delete_stream(locations)
    }

    /// The whole listing is retried: its pages are one after another.
    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        let client = Self {
            inner: Arc::clone(&self.inner),
            throttle: Arc::clone(&self.throttle),
            retries: Arc::clone(&self.retries),
        };
        let prefix = prefix.cloned();
        futures::stream::once(async move {
            let listed = client
                .retrying(|| client.inner.list(prefix.as_ref()).try_collect::<Vec<_>>())
                .await;
            match listed {
                Ok(all) => futures::stream::iter(all.into_iter().map(Ok).collect::<Vec<_>>()),
                Err(e) => futures::stream::iter(vec![Err(e)]),
            }
        })
        .flatten()
        .boxed()
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> object_store::Result<ListResult> {
        self.retrying(|| self.inner.list_with_delimiter(prefix))
            .await
    }

    async fn copy_opts(
        &self,
        from: &Path,
        to: &Path,
        options: CopyOptions,
    ) -> object_store::Result<()> {
        self.retrying(|| self.inner.copy_opts(from, to, options.clone()))
            .await
    }
}
