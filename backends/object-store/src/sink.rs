//! The multipart (or single-PUT) sink.

use std::collections::VecDeque;
use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use object_store::multipart::{MultipartStore, PartId};
use object_store::path::Path;
use object_store::{
    CopyMode, CopyOptions, MultipartId, MultipartUpload, ObjectStore, ObjectStoreExt, PutMode,
    PutMultipartOptions, PutOptions, PutPayload,
};
use tokio::task::JoinHandle;
use weightbay::backend_kit::{check_written, unique_token};
use weightbay::{CreateOptions, Error, ErrorKind, Result, Sink, WriteMode};

use crate::error::{answer_lost, convert};
use crate::journal::Journal;
use crate::landed;
use crate::options::ObjectStoreOptions;
use crate::runtime::Bridge;

/// How long, after a deadline, an abort may take, or a look at whether a request cut at the
/// deadline landed: the caller hears of the deadline within it, and an upload's journal stays
/// for `gc` when its abort takes longer.
const GRACE: Duration = Duration::from_secs(1);
/// A journal is renewed at most this often, however small `stale_after` is.
const MIN_RENEWAL: Duration = Duration::from_secs(1);

/// What a sink needs of the storage that opens it.
#[derive(Clone)]
pub(crate) struct SinkContext {
    pub(crate) store: Arc<dyn ObjectStore>,
    /// The same store's multipart API, where it has one: uploads then have an id that a
    /// journal records (see `journal.rs`).
    pub(crate) multipart: Option<Arc<dyn MultipartStore>>,
    /// Where create-new uploads are staged.
    pub(crate) staging: Path,
    pub(crate) bridge: Bridge,
    pub(crate) tuning: ObjectStoreOptions,
}

/// How the parts of an upload are sent.
enum Driver {
    /// `object_store`'s own upload, which keeps its id to itself.
    Opaque(Box<dyn MultipartUpload>),
    /// The store's multipart API, the id recorded in a journal beside the key.
    Journaled {
        store: Arc<dyn MultipartStore>,
        id: MultipartId,
        journal: Box<Journal>,
        /// The part ids so far, in order.
        parts: Vec<PartId>,
    },
}

type PartTask = JoinHandle<object_store::Result<Option<PartId>>>;

/// An upload in progress.
struct Upload {
    driver: Driver,
    /// Where it lands: the key itself, or a staging key for create-new.
    path: Path,
    in_flight: VecDeque<(usize, PartTask)>,
    parts: usize,
}

/// Part buffers the store has finished with, ready for the next part.
///
/// A long upload reuses the same few allocations instead of taking fresh memory for every part:
/// faulting in fresh pages cost more client CPU than the upload itself (about 0.4 s per GiB on
/// the 2-core machine of docs/BENCHMARKS.md). A buffer comes back only when the store drops its payload, so the
/// buffers in existence stay at the parts in flight plus the one filling.
#[derive(Default)]
struct SpareBuffers(Mutex<Vec<Vec<u8>>>);

impl SpareBuffers {
    fn take(&self) -> Vec<u8> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .pop()
            .unwrap_or_default()
    }
}

/// A part's bytes on their way to the store; dropping them returns the buffer.
struct PartBuffer {
    data: Vec<u8>,
    spares: Arc<SpareBuffers>,
}

impl AsRef<[u8]> for PartBuffer {
    fn as_ref(&self) -> &[u8] {
        &self.data
    }
}

impl Drop for PartBuffer {
    fn drop(&mut self) {
        let mut data = std::mem::take(&mut self.data);
        data.clear();
        self.spares
            .0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(data);
    }
}

pub(crate) struct ObjectSink {
    context: SinkContext,
    key: String,
    target: Path,
    create_new: bool,
    part_size: usize,
    buffer: Vec<u8>,
    spares: Arc<SpareBuffers>,
    upload: Option<Upload>,
    written: u64,
    expected_len: Option<u64>,
    deadline: Option<Deadline>,
}

/// When the write must be done by, and who said so (for the message).
#[derive(Debug, Clone, Copy)]
struct Deadline {
    at: Instant,
    /// Set by [`ObjectStoreOptions::save_timeout`] rather than the caller's options.
    save_timeout: Option<Duration>,
}

impl ObjectSink {
    pub(crate) fn new(
        context: SinkContext,
        key: &str,
        target: Path,
        options: &CreateOptions,
    ) -> Result<Self> {
        let create_new = options.mode == WriteMode::CreateNew;
        let store = &context.store;
        // S3's conditional copy is a one-part multipart copy, which S3 caps at 5 GiB.
        const S3_COPY_LIMIT: u64 = 5 << 30;
        if create_new
            && options.expected_len.is_some_and(|len| len > S3_COPY_LIMIT)
            && store.to_string().starts_with("AmazonS3")
        {
            return Err(Error::unsupported(
                "create-new of containers over 5 GiB on S3 (its conditional copy stops there)",
            )
            .with_key(key));
        }
        let deadline = match (options.deadline, context.tuning.save_timeout) {
            (Some(at), _) => Some(Deadline {
                at,
                save_timeout: None,
            }),
            (None, Some(timeout)) => Some(Deadline {
                at: Instant::now() + timeout,
                save_timeout: Some(timeout),
            }),
            (None, None) => None,
        };
        let part_size = context.tuning.part_size_for(options.expected_len);
        let sink = Self {
            context,
            key: key.to_owned(),
            target,
            create_new,
            part_size,
            buffer: Vec::new(),
            spares: Arc::default(),
            upload: None,
            written: 0,
            expected_len: options.expected_len,
            deadline,
        };
        if create_new {
            let store = sink.store();
            let path = sink.target.clone();
            // Fail fast when the key is taken; commit checks again, atomically.
            if sink
                .run("checking that the key is free", async move {
                    store.head(&path).await
                })?
                .is_ok()
            {
                return Err(Error::new(ErrorKind::AlreadyExists, "object exists").with_key(key));
            }
        }
        Ok(sink)
    }

    fn store(&self) -> Arc<dyn ObjectStore> {
        Arc::clone(&self.context.store)
    }

    fn expired(&self) -> bool {
        self.deadline.is_some_and(|d| Instant::now() >= d.at)
    }

    /// Runs `future` within the write's deadline; past it, the request is cut and the error
    /// says what was being done.
    fn run<F>(&self, what: impl std::fmt::Display, future: F) -> Result<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        if self.expired() {
            return Err(self.timed_out(what));
        }
        self.context
            .bridge
            .run_until(self.deadline.map(|d| d.at), future)?
            .ok_or_else(|| self.timed_out(what))
    }

    /// Runs `future` for at most [`GRACE`] past the deadline (or without a bound when there
    /// is no deadline): for cleaning up, and for looking whether a request cut at the deadline
    /// landed. `None` when the bound passed first.
    fn run_in_grace<F>(&self, future: F) -> Option<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        let bound = self.deadline.map(|d| d.at.max(Instant::now()) + GRACE);
        self.context.bridge.run_until(bound, future).ok().flatten()
    }

    fn timed_out(&self, what: impl std::fmt::Display) -> Error {
        let timeout = self
            .deadline
            .and_then(|d| d.save_timeout)
            .map(|t| format!(" ({t:?} after it began, ObjectStoreOptions::save_timeout)"))
            .unwrap_or_default();
        Error::new(
            ErrorKind::TimedOut,
            format!(
                "the write's deadline{timeout} passed while {what}, {} bytes written",
                self.written
            ),
        )
        .with_key(&self.key)
    }

    fn context(&self, what: &str, upload: &Upload) -> String {
        format!(
            "{what} (part {}, {} bytes sent)",
            upload.parts, self.written
        )
    }

    /// Starts the multipart upload, to a staging key for create-new, journaled where the
    /// store gives uploads an id.
    fn start_upload(&mut self) -> Result<()> {
        let path = if self.create_new {
            self.key
                .split('/')
                .fold(self.context.staging.clone().join(unique_token()), |p, s| {
                    p.join(s)
                })
        } else {
            self.target.clone()
        };
        let driver = match self.context.multipart.clone() {
            Some(multipart) => self.start_journaled(multipart, &path)?,
            None => {
                let mut attempt = 1;
                loop {
                    let (store, start) = (self.store(), path.clone());
                    let started = self.run("starting the multipart upload", async move {
                        store
                            .put_multipart_opts(&start, PutMultipartOptions::default())
                            .await
                    })?;
                    match started {
                        Ok(upload) => break Driver::Opaque(upload),
                        Err(e) if answer_lost(&e) && attempt < START_ATTEMPTS => attempt += 1,
                        Err(e) => {
                            return Err(
                                convert("starting the multipart upload", e).with_key(&self.key)
                            );
                        }
                    }
                }
            }
        };
        self.upload = Some(Upload {
            driver,
            path,
            in_flight: VecDeque::new(),
            parts: 0,
        });
        Ok(())
    }

    /// Records the upload in its journal, starts it, and records its id: a writer killed
    /// between the two writes leaves a record saying an upload may exist at `path`. A start
    /// whose answer is lost (a connection reset mid-response, which object_store does not
    /// retry) is tried again under a journal of its own; the first journal, without an id,
    /// stays for `gc`, since the store may have created that upload. Once started, the journal
    /// is renewed on an interval until the upload ends.
    fn start_journaled(&self, store: Arc<dyn MultipartStore>, path: &Path) -> Result<Driver> {
        let recording = "recording the upload in its journal";
        let mut attempt = 1;
        let (mut journal, id) = loop {
            let journal =
                Journal::new(self.store(), &self.target, &self.key, path, self.create_new);
            self.run(recording, journal.update(|_| {}))?
                .map_err(|e| convert(recording, e).with_key(&self.key))?;
            let (start, store) = (path.clone(), Arc::clone(&store));
            // Past the deadline the upload may have been created: the journal stays.
            let started = self.run("starting the multipart upload", async move {
                store.create_multipart(&start).await
            })?;
            match started {
                Ok(id) => break (journal, id),
                Err(e) if answer_lost(&e) && attempt < START_ATTEMPTS => attempt += 1,
                Err(e) => {
                    if !answer_lost(&e) {
                        let _ = self.run_in_grace(journal.remove());
                    }
                    return Err(convert("starting the multipart upload", e).with_key(&self.key));
                }
            }
        };
        let recorded = id.clone();
        let written = self
            .run(
                recording,
                journal.update(move |r| r.upload_id = Some(recorded)),
            )
            .and_then(|put| put.map_err(|e| convert(recording, e).with_key(&self.key)));
        if let Err(e) = written {
            let (store, path, upload) = (Arc::clone(&store), path.clone(), id);
            let aborted =
                self.run_in_grace(async move { store.abort_multipart(&path, &upload).await });
            if matches!(aborted, Some(Ok(()))) {
                let _ = self.run_in_grace(journal.remove());
            }
            return Err(e);
        }
        let every = (self.context.tuning.stale_after / 2).max(MIN_RENEWAL);
        journal.renew_every(every, &self.context.bridge);
        Ok(Driver::Journaled {
            store,
            id,
            journal: Box::new(journal),
            parts: Vec::new(),
        })
    }

    /// Sends the buffer as the next part, first waiting while too many are in flight.
    fn send_part(&mut self) -> Result<()> {
        if self.upload.is_none() {
            self.start_upload()?;
        }
        let limit = self.context.tuning.parts_in_flight.max(1);
        let Some(mut upload) = self.upload.take() else {
            return Ok(());
        };
        while upload.in_flight.len() >= limit {
            if let Some((part, handle)) = upload.in_flight.pop_front() {
                match self.wait_part(part, handle) {
                    Ok(id) => upload.record_part(id),
                    Err(e) => {
                        self.upload = Some(upload);
                        return Err(e.with_key(&self.key));
                    }
                }
            }
        }
        let part = PartBuffer {
            data: std::mem::replace(&mut self.buffer, self.spares.take()),
            spares: Arc::clone(&self.spares),
        };
        let payload = PutPayload::from(bytes::Bytes::from_owner(part));
        let index = upload.parts;
        let task = match &mut upload.driver {
            Driver::Opaque(inner) => {
                let part = inner.put_part(payload);
                self.context
                    .bridge
                    .spawn(async move { part.await.map(|()| None) })
            }
            Driver::Journaled { store, id, .. } => {
                let (store, path, id) = (Arc::clone(store), upload.path.clone(), id.clone());
                self.context.bridge.spawn(async move {
                    store.put_part(&path, &id, index, payload).await.map(Some)
                })
            }
        };
        upload.parts += 1;
        upload.in_flight.push_back((upload.parts, task));
        self.upload = Some(upload);
        Ok(())
    }

    /// Waits for part `part` (1-based, as stores count them) within the deadline; past it,
    /// the part's request is cancelled.
    fn wait_part(&self, part: usize, handle: PartTask) -> Result<Option<PartId>> {
        let cancel = handle.abort_handle();
        let waited = self.run(format_args!("uploading part {part}"), handle);
        if waited.is_err() {
            cancel.abort();
        }
        match waited? {
            Ok(Ok(id)) => Ok(id),
            Ok(Err(e)) => Err(convert(format!("uploading part {part}"), e)),
            Err(join) => Err(Error::new(
                ErrorKind::Io,
                format!("uploading part {part} panicked or was cancelled"),
            )
            .with_source(join)),
        }
    }

    /// Sends the last part, waits for every part, completes the upload, and publishes a
    /// create-new's staged object.
    fn finish_upload(&mut self) -> Result<()> {
        if !self.buffer.is_empty() {
            self.send_part()?;
        }
        let Some(mut upload) = self.upload.take() else {
            return Err(Error::new(ErrorKind::Io, "no upload to complete"));
        };
        while let Some((part, handle)) = upload.in_flight.pop_front() {
            match self.wait_part(part, handle) {
                Ok(id) => upload.record_part(id),
                Err(e) => {
                    let context = self.context("uploading", &upload);
                    self.abort(upload);
                    return Err(e
                        .context(context)
                        .with_key(&self.key)
                        .with_operation("commit"));
                }
            }
        }
        let path = upload.path.clone();
        let context = self.context("completing the multipart upload", &upload);
        // What the path held before, so that a completion whose answer is lost can be told
        // from one that failed. A create-new's staging path is new: it held nothing. When the
        // path cannot be read, no lost answer is taken for a landed completion.
        let before = if self.create_new {
            Some(None)
        } else {
            let read = landed::version(self.store(), path.clone());
            match self.run("reading the key's version", read) {
                Ok(version) => version.ok(),
                Err(timed_out) => {
                    self.abort(upload);
                    return Err(timed_out);
                }
            }
        };
        // Each completion aborts the upload when it fails, and says whether the abort went
        // through (otherwise the journal stays, for `gc`).
        let (completion, journal) = match upload.driver {
            Driver::Opaque(mut inner) => (
                self.run(&context, async move {
                    match inner.complete().await {
                        Ok(_) => Ok(()),
                        Err(e) => Err((e, inner.abort().await.is_ok())),
                    }
                }),
                None,
            ),
            Driver::Journaled {
                store,
                id,
                journal,
                parts,
            } => {
                let target = path.clone();
                (
                    self.run(&context, async move {
                        match store.complete_multipart(&target, &id, parts).await {
                            Ok(_) => Ok(()),
                            Err(e) => Err((e, store.abort_multipart(&target, &id).await.is_ok())),
                        }
                    }),
                    Some(journal),
                )
            }
        };
        let landed = |sink: &Self| {
            let before = before.clone()?;
            let look = landed::completed(sink.store(), path.clone(), before, sink.written);
            sink.run_in_grace(look).filter(|&landed| landed)
        };
        let (outcome, settled) = match completion {
            Ok(Ok(())) => (Ok(()), true),
            // The request may have landed and only its answer been lost (a connection reset
            // mid-response): look before reporting failure.
            Ok(Err(_)) if landed(self).is_some() => (Ok(()), true),
            Ok(Err((e, aborted))) => (Err(convert(context, e).with_key(&self.key)), aborted),
            // Cut at the deadline: it may land all the same, so look; if it has not, the
            // journal stays for `gc`, which finds the upload complete or aborts it.
            Err(_) if landed(self).is_some() => (Ok(()), true),
            Err(timed_out) => (Err(timed_out), false),
        };
        let (outcome, copy_uncertain) = match (outcome, &journal) {
            (Ok(()), _) if !self.create_new => (Ok(()), false),
            // Say first that a copy is starting: on S3 it is a multipart upload of its own.
            (Ok(()), Some(journal)) => {
                let marking = "recording the copy in the upload's journal";
                match self
                    .run(marking, journal.update(|r| r.publishing = true))
                    .and_then(|put| put.map_err(|e| convert(marking, e).with_key(&self.key)))
                {
                    Ok(()) => self.publish_staged(&path),
                    Err(e) => (Err(e), false),
                }
            }
            (Ok(()), None) => self.publish_staged(&path),
            (Err(e), _) => (Err(e), false),
        };
        // A copy whose answer was lost may have left its own upload at the key: the journal,
        // which says a copy was under way, then stays for `gc`.
        if let (Some(journal), true) = (journal, settled && !copy_uncertain) {
            let _ = self.run_in_grace(journal.remove());
        }
        outcome
    }

    /// Publishes a small container with one (conditional) PUT.
    fn put_whole(&mut self) -> Result<()> {
        let data = bytes::Bytes::from(std::mem::take(&mut self.buffer));
        let mode = if self.create_new {
            PutMode::Create
        } else {
            PutMode::Overwrite
        };
        let store = self.store();
        let path = self.target.clone();
        let payload = data.clone();
        let result = self.run("uploading the container", async move {
            store
                .put_opts(
                    &path,
                    PutPayload::from(payload),
                    PutOptions {
                        mode,
                        ..PutOptions::default()
                    },
                )
                .await
        });
        let holds = |sink: &Self| {
            let look = landed::holds(sink.store(), sink.target.clone(), data.clone());
            sink.run_in_grace(look) == Some(true)
        };
        match result {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(
                e @ (object_store::Error::AlreadyExists { .. }
                | object_store::Error::Precondition { .. }),
            )) => Err(convert("the key was taken before commit", e).with_key(&self.key)),
            // The request may have landed: look before reporting failure.
            Ok(Err(_)) | Err(_) if holds(self) => Ok(()),
            Ok(Err(e)) => Err(convert("uploading the container", e).with_key(&self.key)),
            Err(timed_out) => Err(timed_out),
        }
    }

    /// Copies a completed staging object to the key if nothing is there, then removes it, and
    /// says whether a copy may have left an upload of its own behind (its answer was lost at
    /// some attempt). A copy whose answer is lost is tried again (S3's conditional copy is a
    /// multipart upload, whose start object_store does not retry); "exists" after such a try
    /// is this copy's own when the key holds the staged bytes.
    fn publish_staged(&self, staged: &Path) -> (Result<()>, bool) {
        let same = |sink: &Self| {
            let look = landed::same_objects(sink.store(), staged.clone(), sink.target.clone());
            sink.run_in_grace(look) == Some(true)
        };
        let mut attempt = 1;
        let mut lost = false;
        let outcome = loop {
            let store = self.store();
            let (from, to) = (staged.clone(), self.target.clone());
            let copied = self.run("publishing the staged upload", async move {
                store
                    .copy_opts(&from, &to, CopyOptions::new().with_mode(CopyMode::Create))
                    .await
            });
            break match copied {
                Ok(Ok(())) => Ok(()),
                Ok(Err(
                    e @ (object_store::Error::AlreadyExists { .. }
                    | object_store::Error::Precondition { .. }),
                )) => {
                    if attempt > 1 && same(self) {
                        Ok(())
                    } else {
                        Err(convert("the key was taken before commit", e).with_key(&self.key))
                    }
                }
                // The copy may have landed: compare before trying again or failing.
                Ok(Err(_)) | Err(_) if same(self) => Ok(()),
                Ok(Err(e)) if answer_lost(&e) && attempt < START_ATTEMPTS => {
                    lost = true;
                    attempt += 1;
                    continue;
                }
                Ok(Err(e)) => {
                    lost |= answer_lost(&e);
                    Err(convert("publishing the staged upload", e).with_key(&self.key))
                }
                Err(timed_out) => {
                    lost = true;
                    Err(timed_out)
                }
            };
        };
        let (store, staged) = (self.store(), staged.clone());
        // Best effort: a staging object left behind is named by the journal (or, for a store
        // without one, listed by `pending` as staged); it is never mistaken for the container.
        let _ = self.run_in_grace(async move { landed::delete(store.as_ref(), &staged).await });
        (outcome, lost)
    }

    /// Aborts the upload: its parts in flight settle first (or, past the deadline, are
    /// cancelled), then the store drops what it holds, and its journal record goes. Bounded by
    /// [`GRACE`] past the deadline; when the abort does not finish, the journal stays for
    /// `gc`.
    fn abort(&self, upload: Upload) {
        let Upload {
            driver,
            path,
            in_flight,
            ..
        } = upload;
        if self.expired() {
            for (_, handle) in &in_flight {
                handle.abort();
            }
        }
        let settle = async move {
            for (_, handle) in in_flight {
                let _ = handle.await;
            }
        };
        match driver {
            Driver::Opaque(mut inner) => {
                let _ = self.run_in_grace(async move {
                    settle.await;
                    inner.abort().await
                });
            }
            Driver::Journaled {
                store, id, journal, ..
            } => {
                let aborted = self.run_in_grace(async move {
                    settle.await;
                    store.abort_multipart(&path, &id).await
                });
                if matches!(aborted, Some(Ok(()))) {
                    let _ = self.run_in_grace(journal.remove());
                }
            }
        }
    }
}

impl Upload {
    fn record_part(&mut self, id: Option<PartId>) {
        if let (Driver::Journaled { parts, .. }, Some(id)) = (&mut self.driver, id) {
            parts.push(id);
        }
    }
}

/// How often starting an upload, or publishing a staged one, is tried when its answer is lost.
const START_ATTEMPTS: usize = 3;

impl Sink for ObjectSink {
    fn write(&mut self, mut data: &[u8]) -> Result<()> {
        if self.expired() {
            return Err(self.timed_out("writing"));
        }
        self.written += data.len() as u64;
        while !data.is_empty() {
            let room = self.part_size - self.buffer.len();
            let (now, later) = data.split_at(room.min(data.len()));
            if self.buffer.capacity() == 0 {
                let planned = self.expected_len.map_or(self.part_size, |len| {
                    usize::try_from(len).unwrap_or(usize::MAX)
                });
                self.buffer.reserve_exact(self.part_size.min(planned));
            }
            self.buffer.extend_from_slice(now);
            data = later;
            if self.buffer.len() == self.part_size {
                self.send_part()?;
            }
        }
        Ok(())
    }

    fn commit(mut self: Box<Self>) -> Result<()> {
        check_written(self.expected_len, self.written).map_err(|e| e.with_key(&self.key))?;
        if self.expired() {
            return Err(self.timed_out("committing"));
        }
        if self.upload.is_none() {
            return self.put_whole();
        }
        self.finish_upload()
    }
}

impl Drop for ObjectSink {
    fn drop(&mut self) {
        if let Some(upload) = self.upload.take() {
            self.abort(upload);
        }
    }
}
