//! The multipart (or single-PUT) sink.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, PoisonError};

use object_store::path::Path;
use object_store::{
    CopyMode, CopyOptions, MultipartUpload, ObjectStore, ObjectStoreExt, PutMode,
    PutMultipartOptions, PutOptions, PutPayload,
};
use weightbay::backend_kit::check_written;
use weightbay::{CreateOptions, Error, ErrorKind, Result, Sink, WriteMode};

use crate::error::convert;
use crate::options::ObjectStoreOptions;
use crate::runtime::Bridge;

/// An upload in progress.
struct Upload {
    upload: Box<dyn MultipartUpload>,
    /// Where it lands: the key itself, or a staging key for create-new.
    path: Path,
    in_flight: VecDeque<(usize, tokio::task::JoinHandle<object_store::Result<()>>)>,
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
    store: Arc<dyn ObjectStore>,
    /// Where create-new uploads are staged.
    staging: Path,
    bridge: Bridge,
    parts_in_flight: usize,
    key: String,
    target: Path,
    create_new: bool,
    part_size: usize,
    buffer: Vec<u8>,
    spares: Arc<SpareBuffers>,
    upload: Option<Upload>,
    written: u64,
    expected_len: Option<u64>,
}

impl ObjectSink {
    pub(crate) fn new(
        store: Arc<dyn ObjectStore>,
        staging: Path,
        bridge: Bridge,
        tuning: ObjectStoreOptions,
        key: &str,
        target: Path,
        options: &CreateOptions,
    ) -> Result<Self> {
        let create_new = options.mode == WriteMode::CreateNew;
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
        if create_new {
            let store = Arc::clone(&store);
            let path = target.clone();
            // Fail fast when the key is taken; commit checks again, atomically.
            if bridge.run(async move { store.head(&path).await })?.is_ok() {
                return Err(Error::new(ErrorKind::AlreadyExists, "object exists").with_key(key));
            }
        }
        let part_size = tuning.part_size_for(options.expected_len);
        Ok(Self {
            store,
            staging,
            bridge,
            parts_in_flight: tuning.parts_in_flight,
            key: key.to_owned(),
            target,
            create_new,
            part_size,
            buffer: Vec::new(),
            spares: Arc::default(),
            upload: None,
            written: 0,
            expected_len: options.expected_len,
        })
    }

    fn store(&self) -> Arc<dyn ObjectStore> {
        Arc::clone(&self.store)
    }

    fn context(&self, what: &str, upload: &Upload) -> String {
        format!(
            "{what} (part {}, {} bytes sent)",
            upload.parts, self.written
        )
    }

    /// Starts the multipart upload, to a staging key for create-new.
    fn start_upload(&mut self) -> Result<()> {
        let path = if self.create_new {
            let unique = weightbay::backend_kit::unique_token();
            self.key
                .split('/')
                .fold(self.staging.clone().join(unique), |p, s| p.join(s))
        } else {
            self.target.clone()
        };
        let store = self.store();
        let start = path.clone();
        let upload = self
            .bridge
            .run(async move {
                store
                    .put_multipart_opts(&start, PutMultipartOptions::default())
                    .await
            })?
            .map_err(|e| convert("starting the multipart upload", e).with_key(&self.key))?;
        self.upload = Some(Upload {
            upload,
            path,
            in_flight: VecDeque::new(),
            parts: 0,
        });
        Ok(())
    }

    /// Sends the buffer as the next part, first waiting while too many are in flight.
    fn send_part(&mut self) -> Result<()> {
        if self.upload.is_none() {
            self.start_upload()?;
        }
        let limit = self.parts_in_flight.max(1);
        let bridge = self.bridge.clone();
        let Some(upload) = self.upload.as_mut() else {
            return Ok(());
        };
        while upload.in_flight.len() >= limit {
            if let Some((part, handle)) = upload.in_flight.pop_front() {
                wait_part(&bridge, part, handle).map_err(|e| e.with_key(&self.key))?;
            }
        }
        let part = PartBuffer {
            data: std::mem::replace(&mut self.buffer, self.spares.take()),
            spares: Arc::clone(&self.spares),
        };
        let future = upload
            .upload
            .put_part(PutPayload::from(bytes::Bytes::from_owner(part)));
        upload.parts += 1;
        upload
            .in_flight
            .push_back((upload.parts, bridge.spawn(future)));
        Ok(())
    }

    /// Sends the last part, waits for every part, and completes the upload.
    fn finish_upload(&mut self) -> Result<Path> {
        if !self.buffer.is_empty() {
            self.send_part()?;
        }
        let bridge = self.bridge.clone();
        let Some(mut upload) = self.upload.take() else {
            return Err(Error::new(ErrorKind::Io, "no upload to complete"));
        };
        while let Some((part, handle)) = upload.in_flight.pop_front() {
            if let Err(e) = wait_part(&bridge, part, handle) {
                let context = self.context("uploading", &upload);
                abort(&bridge, upload);
                return Err(e
                    .context(context)
                    .with_key(&self.key)
                    .with_operation("commit"));
            }
        }
        let path = upload.path.clone();
        let context = self.context("completing the multipart upload", &upload);
        // What the path held before, so that a completion whose answer is lost can be told
        // from one that failed. A create-new's staging path is new: it held nothing.
        let before = if self.create_new {
            None
        } else {
            self.version_of(&path)
        };
        let mut inner = upload.upload;
        let completed = bridge.run(async move {
            match inner.complete().await {
                Ok(_) => Ok(()),
                Err(e) => {
                    let _ = inner.abort().await;
                    Err(e)
                }
            }
        })?;
        match completed {
            Ok(()) => Ok(path),
            // The request may have landed and only its answer been lost (a connection reset
            // mid-response): look before reporting failure.
            Err(e) if self.completed_at(&path, before.as_ref()) => {
                let _ = e;
                Ok(path)
            }
            Err(e) => Err(convert(context, e).with_key(&self.key)),
        }
    }

    /// The version (ETag, else modification time) of the object at `path`, if any.
    fn version_of(&self, path: &Path) -> Option<(Option<String>, i64)> {
        let store = self.store();
        let path = path.clone();
        let meta = self
            .bridge
            .run(async move { store.head(&path).await })
            .ok()?
            .ok()?;
        Some((meta.e_tag, meta.last_modified.timestamp_micros()))
    }

    /// Whether `path` now holds an object of the length written that is not the one it held
    /// `before` the completion.
    fn completed_at(&self, path: &Path, before: Option<&(Option<String>, i64)>) -> bool {
        let store = self.store();
        let target = path.clone();
        let Ok(Ok(meta)) = self.bridge.run(async move { store.head(&target).await }) else {
            return false;
        };
        let now = (meta.e_tag, meta.last_modified.timestamp_micros());
        meta.size == self.written && before != Some(&now)
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
        let result = self.bridge.run(async move {
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
        })?;
        match result {
            Ok(_) => Ok(()),
            Err(
                e @ (object_store::Error::AlreadyExists { .. }
                | object_store::Error::Precondition { .. }),
            ) => Err(convert("the key was taken before commit", e).with_key(&self.key)),
            // The request may have landed: look before reporting failure.
            Err(e) if self.holds(&self.target, &data) => {
                let _ = e;
                Ok(())
            }
            Err(e) => Err(convert("uploading the container", e).with_key(&self.key)),
        }
    }

    /// Whether the object at `path` holds exactly `data`.
    fn holds(&self, path: &Path, data: &bytes::Bytes) -> bool {
        let store = self.store();
        let path = path.clone();
        let found = self
            .bridge
            .run(async move { store.get(&path).await?.bytes().await });
        matches!(found, Ok(Ok(bytes)) if bytes == *data)
    }

    /// Whether two objects have the same bytes, compared in bounded windows.
    fn same_objects(&self, a: &Path, b: &Path) -> bool {
        let store = self.store();
        let (a, b) = (a.clone(), b.clone());
        let compared = self.bridge.run(async move {
            let (meta_a, meta_b) = (store.head(&a).await?, store.head(&b).await?);
            if meta_a.size != meta_b.size {
                return Ok::<bool, object_store::Error>(false);
            }
            const WINDOW: u64 = 8 << 20;
            let mut offset = 0;
            while offset < meta_a.size {
                let end = (offset + WINDOW).min(meta_a.size);
                if store.get_range(&a, offset..end).await?
                    != store.get_range(&b, offset..end).await?
                {
                    return Ok(false);
                }
                offset = end;
            }
            Ok(true)
        });
        matches!(compared, Ok(Ok(true)))
    }

    /// Copies a completed staging object to the key if nothing is there, then removes it.
    fn publish_staged(&self, staged: &Path) -> Result<()> {
        let store = self.store();
        let (from, to) = (staged.clone(), self.target.clone());
        let copied = self.bridge.run(async move {
            store
                .copy_opts(&from, &to, CopyOptions::new().with_mode(CopyMode::Create))
                .await
        })?;
        let outcome = match copied {
            Ok(()) => Ok(()),
            Err(
                e @ (object_store::Error::AlreadyExists { .. }
                | object_store::Error::Precondition { .. }),
            ) => Err(convert("the key was taken before commit", e).with_key(&self.key)),
            // The copy may have landed: compare before reporting failure.
            Err(_) if self.same_objects(staged, &self.target) => Ok(()),
            Err(e) => Err(convert("publishing the staged upload", e).with_key(&self.key)),
        };
        let store = self.store();
        let staged = staged.clone();
        // Best effort: a staging object left behind is listed by `pending` and removed by
        // `clean_pending`; it is never mistaken for the container.
        let _ = self.bridge.run(async move { store.delete(&staged).await });
        outcome
    }
}

fn wait_part(
    bridge: &Bridge,
    part: usize,
    handle: tokio::task::JoinHandle<object_store::Result<()>>,
) -> Result<()> {
    match bridge.run(handle)? {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(convert(format!("uploading part {part}"), e)),
        Err(join) => Err(Error::new(
            ErrorKind::Io,
            format!("uploading part {part} panicked or was cancelled"),
        )
        .with_source(join)),
    }
}

/// Waits for the parts in flight to settle, then aborts the upload.
fn abort(bridge: &Bridge, upload: Upload) {
    let Upload {
        mut upload,
        in_flight,
        ..
    } = upload;
    let _ = bridge.run(async move {
        for (_, handle) in in_flight {
            let _ = handle.await;
        }
        let _ = upload.abort().await;
    });
}

impl Sink for ObjectSink {
    fn write(&mut self, mut data: &[u8]) -> Result<()> {
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
        if self.upload.is_none() {
            return self.put_whole();
        }
        let landed = self.finish_upload()?;
        if self.create_new {
            self.publish_staged(&landed)
        } else {
            Ok(())
        }
    }
}

impl Drop for ObjectSink {
    fn drop(&mut self) {
        if let Some(upload) = self.upload.take() {
            abort(&self.bridge, upload);
        }
    }
}
