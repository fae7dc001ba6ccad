//! A store in front of another: it counts GET requests, applies a conformance [`FaultPlan`] to
//! every request (so the crash case can kill a writer between the requests of one `commit`),
//! and can carry one deliberate [`StoreDefect`], for the suite's broken-backend tests.

use std::fmt;
use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use async_trait::async_trait;
use bytes::Bytes;
use futures::stream::BoxStream;
use futures::{FutureExt, StreamExt};
use object_store::multipart::{MultipartStore, PartId};
use object_store::path::Path;
use object_store::{
    CopyMode, CopyOptions, GetOptions, GetResult, ListResult, MultipartId, MultipartUpload,
    ObjectMeta, ObjectStore, PutMultipartOptions, PutOptions, PutPayload, PutResult, UploadPart,
};
use weightbay_conformance::{FaultPlan, InjectedFault};

/// A realistic store bug.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StoreDefect {
    /// A multipart upload's second part is acknowledged but never becomes part of the object.
    DropsSecondPart,
    /// Reads ignore `If-Match` and the version they pin, and serve whatever is there now.
    IgnoresPinnedVersion,
    /// A conditional copy (create if absent) copies over whatever is there: how a store without
    /// the condition on that path publishes a staged create-new upload.
    IgnoresCopyCondition,
}

/// `inner` with `plan` applied to each request and `defect`, if any, switched on; its
/// multipart API (when `multipart` is the same store's) intercepted the same way.
pub(crate) struct Intercepted {
    inner: Arc<dyn ObjectStore>,
    multipart: Option<Arc<dyn MultipartStore>>,
    plan: FaultPlan,
    defect: Option<StoreDefect>,
    /// Ranges asked for by GET so far (`get_ranges` counts each range).
    pub gets: AtomicUsize,
}

impl Intercepted {
    pub(crate) fn new(
        inner: Arc<dyn ObjectStore>,
        plan: FaultPlan,
        defect: Option<StoreDefect>,
    ) -> Self {
        Self {
            inner,
            multipart: None,
            plan,
            defect,
            gets: AtomicUsize::new(0),
        }
    }

    /// Also intercepts `multipart`, the inner store's multipart API.
    pub(crate) fn with_multipart(mut self, multipart: Arc<dyn MultipartStore>) -> Self {
        self.multipart = Some(multipart);
        self
    }

    fn multipart(&self) -> object_store::Result<&Arc<dyn MultipartStore>> {
        self.multipart
            .as_ref()
            .ok_or_else(|| object_store::Error::NotImplemented {
                operation: "multipart uploads by id".into(),
                implementer: "this intercepted store".into(),
            })
    }

    /// Runs `request` as one counted operation.
    async fn request<T>(
        plan: &FaultPlan,
        name: &'static str,
        request: impl Future<Output = object_store::Result<T>>,
    ) -> object_store::Result<T> {
        let operation = plan.before(name).map_err(injected)?;
        let result = request.await;
        plan.after(operation);
        result
    }

    /// Starts the stream `start` makes as one counted operation.
    fn stream<T: Send + 'static>(
        &self,
        name: &'static str,
        start: impl FnOnce() -> BoxStream<'static, object_store::Result<T>>,
    ) -> BoxStream<'static, object_store::Result<T>> {
        match self.plan.before(name) {
            Ok(operation) => {
                let stream = start();
                self.plan.after(operation);
                stream
            }
            Err(fault) => futures::stream::once(async move { Err(injected(fault)) }).boxed(),
        }
    }
}

impl fmt::Debug for Intercepted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Intercepted")
            .field("inner", &self.inner)
            .field("multipart", &self.multipart.is_some())
            .field("defect", &self.defect)
            .finish_non_exhaustive()
    }
}

fn injected(fault: InjectedFault) -> object_store::Error {
    object_store::Error::Generic {
        store: "intercepted",
        source: Box::new(fault),
    }
}

// Keeps the inner store's name: the backend recognises S3 by it.
impl fmt::Display for Intercepted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.inner.fmt(f)
    }
}

#[async_trait]
impl ObjectStore for Intercepted {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        Self::request(
            &self.plan,
            "put",
            self.inner.put_opts(location, payload, opts),
        )
        .await
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        let inner = Self::request(
            &self.plan,
            "start multipart",
            self.inner.put_multipart_opts(location, opts),
        )
        .await?;
        Ok(Box::new(InterceptedUpload {
            inner,
            plan: self.plan.clone(),
            defect: self.defect,
            parts: AtomicUsize::new(0),
        }))
    }

    async fn get_opts(
        &self,
        location: &Path,
        mut options: GetOptions,
    ) -> object_store::Result<GetResult> {
        if self.defect == Some(StoreDefect::IgnoresPinnedVersion) {
            options.if_match = None;
            options.version = None;
        }
        self.gets.fetch_add(1, Ordering::SeqCst);
        Self::request(&self.plan, "get", self.inner.get_opts(location, options)).await
    }

    async fn get_ranges(
        &self,
        location: &Path,
        ranges: &[Range<u64>],
    ) -> object_store::Result<Vec<Bytes>> {
        self.gets.fetch_add(ranges.len(), Ordering::SeqCst);
        Self::request(
            &self.plan,
            "get ranges",
            self.inner.get_ranges(location, ranges),
        )
        .await
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, object_store::Result<Path>>,
    ) -> BoxStream<'static, object_store::Result<Path>> {
        self.stream("delete", || self.inner.delete_stream(locations))
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        self.stream("list", || self.inner.list(prefix))
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> object_store::Result<ListResult> {
        Self::request(
            &self.plan,
            "list with delimiter",
            self.inner.list_with_delimiter(prefix),
        )
        .await
    }

    async fn copy_opts(
        &self,
        from: &Path,
        to: &Path,
        options: CopyOptions,
    ) -> object_store::Result<()> {
        let options = if self.defect == Some(StoreDefect::IgnoresCopyCondition) {
            CopyOptions::new().with_mode(CopyMode::Overwrite)
        } else {
            options
        };
        Self::request(&self.plan, "copy", self.inner.copy_opts(from, to, options)).await
    }
}

#[async_trait]
impl MultipartStore for Intercepted {
    async fn create_multipart(&self, path: &Path) -> object_store::Result<MultipartId> {
        let inner = self.multipart()?;
        Self::request(&self.plan, "start multipart", inner.create_multipart(path)).await
    }

    async fn put_part(
        &self,
        path: &Path,
        id: &MultipartId,
        part_idx: usize,
        data: PutPayload,
    ) -> object_store::Result<PartId> {
        let inner = self.multipart()?;
        if part_idx == 1 && self.defect == Some(StoreDefect::DropsSecondPart) {
            // Acknowledged, never stored: completing then leaves the part out.
            return Ok(PartId {
                content_id: String::new(),
            });
        }
        Self::request(
            &self.plan,
            "put part",
            inner.put_part(path, id, part_idx, data),
        )
        .await
    }

    async fn complete_multipart(
        &self,
        path: &Path,
        id: &MultipartId,
        parts: Vec<PartId>,
    ) -> object_store::Result<PutResult> {
        let inner = self.multipart()?;
        Self::request(
            &self.plan,
            "complete multipart",
            inner.complete_multipart(path, id, parts),
        )
        .await
    }

    async fn abort_multipart(&self, path: &Path, id: &MultipartId) -> object_store::Result<()> {
        let inner = self.multipart()?;
        Self::request(
            &self.plan,
            "abort multipart",
            inner.abort_multipart(path, id),
        )
        .await
    }
}

#[derive(Debug)]
struct InterceptedUpload {
    inner: Box<dyn MultipartUpload>,
    plan: FaultPlan,
    defect: Option<StoreDefect>,
    parts: AtomicUsize,
}

#[async_trait]
impl MultipartUpload for InterceptedUpload {
    fn put_part(&mut self, data: PutPayload) -> UploadPart {
        let part = self.parts.fetch_add(1, Ordering::Relaxed) + 1;
        if part == 2 && self.defect == Some(StoreDefect::DropsSecondPart) {
            return async { Ok(()) }.boxed();
        }
        let upload = self.inner.put_part(data);
        let plan = self.plan.clone();
        async move { Intercepted::request(&plan, "put part", upload).await }.boxed()
    }

    async fn complete(&mut self) -> object_store::Result<PutResult> {
        Intercepted::request(&self.plan, "complete multipart", self.inner.complete()).await
    }

    async fn abort(&mut self) -> object_store::Result<()> {
        Intercepted::request(&self.plan, "abort multipart", self.inner.abort()).await
    }
}
