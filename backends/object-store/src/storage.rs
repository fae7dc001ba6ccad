//! [`ObjectStorage`]: weightbay's storage contract over any `object_store` store.

use std::sync::Arc;

use futures::TryStreamExt;
use object_store::multipart::MultipartStore;
use object_store::path::Path;
use object_store::{ObjectMeta, ObjectStore, ObjectStoreExt};
use weightbay::backend_kit::{validate_key, validate_prefix};
use weightbay::{
    Capabilities, CreateOptions, Error, ForeignEntry, Listed, PendingWrite, Result, Sink, Source,
    Storage,
};

use crate::error::convert;
use crate::journal::JOURNAL_SUFFIX;
use crate::options::{MIN_PART_SIZE, ObjectStoreOptions, STAGING_DIR};
use crate::raw_lister::{RawLister, RawListing};
use crate::runtime::Bridge;
use crate::sink::{ObjectSink, SinkContext};
use crate::source::ObjectSource;
use crate::stall::StallWatch;
use crate::throttle::Throttle;

/// Containers as objects under a prefix of any `object_store` store.
///
/// # Create-new
/// A container that fits in one part is published with a single conditional PUT
/// (`If-None-Match: *` or its store's equivalent). A larger one cannot be: `object_store`
/// sends no condition on completing a multipart upload. It is uploaded to a staging key under
/// [`STAGING_DIR`] and then copied to its key with a conditional copy (`copy_if_not_exists`),
/// which fails if anything is there; the staging object is then deleted. A crash in between
/// leaves a staging object, never a partial container; [`Storage::clean_pending`] removes it
/// once its writer is gone (see [`journaled`](Self::journaled)), or, for a store without
/// upload journals, once it is older than [`ObjectStoreOptions::stale_after`]. On S3 the
/// conditional copy is a multipart copy of one part, so create-new of containers over 5 GiB is
/// refused there.
#[derive(Clone)]
pub struct ObjectStorage {
    pub(crate) store: Arc<dyn ObjectStore>,
    /// The same store's multipart API, when it has one: uploads are then journaled.
    pub(crate) multipart: Option<Arc<dyn MultipartStore>>,
    /// Lists objects whose keys `object_store` cannot parse (S3, GCS, Azure) and a key's open
    /// uploads (S3).
    pub(crate) raw_lister: Option<Arc<RawLister>>,
    pub(crate) prefix: Path,
    pub(crate) bridge: Bridge,
    pub(crate) options: ObjectStoreOptions,
    /// The pace its requests keep, when [`open_url`](crate::open_url) made it.
    throttle: Option<Arc<Throttle>>,
    /// What finds its stalled requests, when [`open_url`](crate::open_url) made it.
    stall_watch: Option<Arc<StallWatch>>,
}

impl std::fmt::Debug for ObjectStorage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ObjectStorage")
            .field("store", &self.store)
            .field("journaled", &self.multipart.is_some())
            .field("prefix", &self.prefix)
            .field("options", &self.options)
            .field("throttle", &self.throttle)
            .field("stall_watch", &self.stall_watch)
            .finish_non_exhaustive()
    }
}

impl ObjectStorage {
    /// Objects of `store`, under no prefix, on a runtime owned by this storage. Its
    /// multipart uploads are `object_store`'s, whose ids it cannot record: one a killed
    /// writer leaves is removed by the store's lifecycle rules only. Prefer
    /// [`journaled`](Self::journaled) for a store that has a multipart API.
    ///
    /// # Errors
    /// [`ErrorKind::Io`](weightbay::ErrorKind::Io) when the runtime cannot start.
    pub fn new(store: Arc<dyn ObjectStore>) -> Result<Self> {
        Ok(Self::with_bridge(store, Bridge::owned()?))
    }

    /// Objects of `store` (S3, GCS, Azure and InMemory are both), whose multipart uploads are
    /// recorded in a journal beside their key, so that
    /// [`clean_pending`](Storage::clean_pending) (what `gc` runs) aborts the uploads of writers
    /// that died. [`open_url`](crate::open_url) opens stores this way.
    ///
    /// # Errors
    /// As [`new`](Self::new).
    pub fn journaled<S: ObjectStore + MultipartStore>(store: Arc<S>) -> Result<Self> {
        let mut storage = Self::new(Arc::clone(&store) as Arc<dyn ObjectStore>)?;
        storage.multipart = Some(store);
        Ok(storage)
    }

    /// Objects of `store` on the given runtime bridge.
    pub fn with_bridge(store: Arc<dyn ObjectStore>, bridge: Bridge) -> Self {
        Self {
            store,
            multipart: None,
            raw_lister: None,
            prefix: Path::default(),
            bridge,
            options: ObjectStoreOptions::default(),
            throttle: None,
            stall_watch: None,
        }
    }

    /// Keys live under `prefix` (a `/`-separated path).
    ///
    /// # Errors
    /// [`ErrorKind::InvalidInput`](weightbay::ErrorKind::InvalidInput) for a prefix `object_store`
    /// cannot express.
    pub fn with_prefix(mut self, prefix: &str) -> Result<Self> {
        self.prefix =
            Path::parse(prefix).map_err(|e| Error::invalid("bad object prefix").with_source(e))?;
        Ok(self)
    }

    /// Sets the tuning options. Their [`stall_detection`](ObjectStoreOptions::stall_detection)
    /// goes to the storage's [`StallWatch`], and so to every storage of the same
    /// [`open_url`](crate::open_url) call.
    #[must_use]
    pub fn with_options(mut self, options: ObjectStoreOptions) -> Self {
        self.options = options;
        if let Some(watch) = &self.stall_watch {
            watch.set(options.stall_detection);
        }
        self
    }

    /// Records the [`Throttle`] the store's requests go through (built into the store with
    /// [`http_connector`](crate::http_connector)), so [`throttle`](Self::throttle) can report
    /// it.
    #[must_use]
    pub fn with_throttle(mut self, throttle: Arc<Throttle>) -> Self {
        self.throttle = Some(throttle);
        self
    }

    /// The pace the store's requests keep under throttling, when known.
    pub fn throttle(&self) -> Option<&Arc<Throttle>> {
        self.throttle.as_ref()
    }

    /// Records the [`StallWatch`] the store's requests go through (built into the store with
    /// [`http_connector`](crate::http_connector)), so [`stall_watch`](Self::stall_watch) can
    /// report it; it takes this storage's
    /// [`stall_detection`](ObjectStoreOptions::stall_detection).
    #[must_use]
    pub fn with_stall_watch(mut self, watch: Arc<StallWatch>) -> Self {
        watch.set(self.options.stall_detection);
        self.stall_watch = Some(watch);
        self
    }

    /// What finds the store's stalled requests, and what it cut, when known.
    pub fn stall_watch(&self) -> Option<&Arc<StallWatch>> {
        self.stall_watch.as_ref()
    }

    /// The tuning options.
    pub fn options(&self) -> &ObjectStoreOptions {
        &self.options
    }

    /// The underlying store.
    pub fn store(&self) -> &Arc<dyn ObjectStore> {
        &self.store
    }

    /// The underlying store's multipart API, when uploads are journaled
    /// ([`journaled`](Self::journaled)).
    pub fn multipart_store(&self) -> Option<&Arc<dyn MultipartStore>> {
        self.multipart.as_ref()
    }

    /// The prefix keys live under.
    pub fn prefix(&self) -> &Path {
        &self.prefix
    }

    /// The object path of `key`.
    fn path(&self, key: &str) -> Result<Path> {
        validate_key(key)?;
        if key.split('/').any(|segment| segment == STAGING_DIR) {
            return Err(Error::invalid(format!(
                "keys with a `{STAGING_DIR}` segment are reserved for staged uploads"
            ))
            .with_key(key));
        }
        if key.ends_with(JOURNAL_SUFFIX) {
            return Err(Error::invalid(format!(
                "keys ending in `{JOURNAL_SUFFIX}` are reserved for upload journals"
            ))
            .with_key(key));
        }
        Ok(self.object_path(key))
    }

    /// The object path of a key, unchecked.
    pub(crate) fn object_path(&self, key: &str) -> Path {
        key.split('/')
            .fold(self.prefix.clone(), |path, segment| path.join(segment))
    }

    /// Opens `key` as an [`ObjectSource`], for [`ObjectSource::fetch`].
    ///
    /// # Errors
    /// [`ErrorKind::NotFound`](weightbay::ErrorKind::NotFound); the store's error.
    pub fn open_object(&self, key: &str) -> Result<ObjectSource> {
        let path = self.path(key)?;
        ObjectSource::open(
            Arc::clone(&self.store),
            path,
            key.to_owned(),
            self.bridge.clone(),
            &self.options,
        )
    }

    pub(crate) fn staging_prefix(&self) -> Path {
        self.prefix.clone().join(STAGING_DIR)
    }

    /// `path` as a key of this storage (the whole path when it lies outside the prefix).
    pub(crate) fn relative(&self, path: &Path) -> String {
        path.prefix_match(&self.prefix)
            .map(|parts| {
                parts
                    .map(|part| part.as_ref().to_owned())
                    .collect::<Vec<_>>()
                    .join("/")
            })
            .unwrap_or_else(|| path.to_string())
    }
}

impl ObjectStorage {
    /// Every object under the directory `under` (everything for an empty one), staged uploads
    /// and journals included; `what` names the listing in errors. An object whose key
    /// `object_store` cannot represent (a `.`, `..` or empty segment: anyone with write access
    /// can create one) fails `object_store`'s whole listing; on S3, GCS and Azure the listing
    /// is then made again by this backend's own requests, and such objects are left out: no
    /// container has such a key, and nothing here can address one to read or delete it.
    pub(crate) fn objects_under(&self, under: &Path, what: &str) -> Result<Vec<ObjectMeta>> {
        Ok(self.raw_objects_under(under, what)?.objects)
    }

    /// As [`objects_under`](Self::objects_under), with the keys of the objects it leaves out.
    fn raw_objects_under(&self, under: &Path, what: &str) -> Result<RawListing> {
        let store = Arc::clone(&self.store);
        let at = under.clone();
        let listed = self.bridge.run(async move {
            let at = (!at.as_ref().is_empty()).then_some(at);
            store.list(at.as_ref()).try_collect::<Vec<_>>().await
        })?;
        match (listed, &self.raw_lister) {
            (Ok(objects), _) => Ok(RawListing {
                objects,
                unrepresentable: Vec::new(),
            }),
            (Err(object_store::Error::InvalidPath { .. }), Some(lister)) => {
                let (lister, at) = (Arc::clone(lister), under.clone());
                self.bridge
                    .run(async move { lister.objects_under(&at).await })?
                    .map_err(|e| convert(what, e))
            }
            (Err(e), _) => Err(convert(what, e)),
        }
    }

    /// The path a listing of `prefix` covers: the storage's prefix, and `prefix` below it.
    fn listed_path(&self, prefix: &str) -> Result<Path> {
        validate_prefix(prefix)?;
        if prefix.is_empty() {
            Ok(self.prefix.clone())
        } else {
            self.path(prefix)
        }
    }

    /// Refuses a configured part size the store would refuse: S3 and GCS take no part under
    /// [`MIN_PART_SIZE`] but the last; Azure, in-memory and local stores take any size.
    fn check_part_size(&self) -> Result<()> {
        let name = self.store.to_string();
        let strict = name.starts_with("AmazonS3") || name.starts_with("GoogleCloudStorage");
        if strict && self.options.part_size < MIN_PART_SIZE {
            return Err(Error::invalid(format!(
                "a part size of {} bytes is under the 5 MiB that {name} accepts for every part \
                 but the last; set ObjectStoreOptions::part_size to at least MIN_PART_SIZE",
                self.options.part_size
            )));
        }
        Ok(())
    }
}

impl Storage for ObjectStorage {
    fn capabilities(&self) -> Capabilities {
        let capabilities = Capabilities::NONE
            .with_atomic_create_new()
            .with_pending_listing()
            .with_listing();
        if self.options.durable {
            capabilities.with_durable_commit()
        } else {
            capabilities
        }
    }

    fn create(&self, key: &str, options: &CreateOptions) -> Result<Box<dyn Sink>> {
        let path = self.path(key)?;
        self.capabilities().check(options)?;
        self.check_part_size().map_err(|e| e.with_key(key))?;
        let context = SinkContext {
            store: Arc::clone(&self.store),
            multipart: self.multipart.clone(),
            staging: self.staging_prefix(),
            bridge: self.bridge.clone(),
            tuning: self.options,
        };
        Ok(Box::new(ObjectSink::new(context, key, path, options)?))
    }

    fn open(&self, key: &str) -> Result<Arc<dyn Source>> {
        Ok(Arc::new(self.open_object(key)?))
    }

    fn delete(&self, key: &str) -> Result<()> {
        let path = self.path(key)?;
        let store = Arc::clone(&self.store);
        let result = self.bridge.run(async move {
            // object_store's delete succeeds on a missing object on some stores: ask first.
            store.head(&path).await?;
            crate::landed::delete(store.as_ref(), &path).await
        })?;
        result.map_err(|e| convert("deleting the object", e).with_key(key))
    }

    /// Journals of multipart uploads under `prefix`, and staged create-new uploads no
    /// journal names: see `pending.rs`.
    fn pending(&self, prefix: &str) -> Result<Vec<PendingWrite>> {
        Ok(self
            .unfinished(prefix)?
            .into_iter()
            .map(|(_, pending)| pending)
            .collect())
    }

    /// Aborts the uploads of journals whose writer is gone, removes their staged objects and
    /// the journals, and removes staged uploads older than
    /// [`ObjectStoreOptions::stale_after`] that no journal names; returns those, and the
    /// records it refused (see `pending.rs`), which it leaves.
    fn clean_pending(&self, prefix: &str) -> Result<Vec<PendingWrite>> {
        self.remove_abandoned(prefix)
    }

    /// One LIST request per page of 1,000 objects (S3, GCS, Azure); staged create-new uploads,
    /// upload journals and unfinished multipart uploads never appear.
    fn list(&self, prefix: &str) -> Result<Vec<Listed>> {
        let under = self.listed_path(prefix)?;
        let objects = self.objects_under(&under, "listing objects")?;
        let mut found: Vec<Listed> = objects
            .into_iter()
            .filter_map(|meta| {
                let key = self.relative(&meta.location);
                let listed = !is_internal(&key) && validate_key(&key).is_ok();
                listed.then_some(Listed {
                    key,
                    len: meta.size,
                })
            })
            .collect();
        found.sort();
        Ok(found)
    }

    /// Objects whose keys `object_store` cannot address (a `.`, `..` or empty segment) and
    /// objects whose keys are no valid key of this storage: one more listing.
    fn list_foreign(&self, prefix: &str) -> Result<Vec<ForeignEntry>> {
        let under = self.listed_path(prefix)?;
        let listing = self.raw_objects_under(&under, "listing objects")?;
        let root = if self.prefix.as_ref().is_empty() {
            String::new()
        } else {
            format!("{}/", self.prefix)
        };
        let mut foreign: Vec<ForeignEntry> = listing
            .unrepresentable
            .into_iter()
            .map(|stored| {
                let name = stored.strip_prefix(&root).unwrap_or(&stored).to_owned();
                ForeignEntry::new(
                    name,
                    "an object whose key has a `.`, `..` or empty segment: never read or deleted",
                )
            })
            .collect();
        for meta in listing.objects {
            let key = self.relative(&meta.location);
            if let (false, Err(e)) = (is_internal(&key), validate_key(&key)) {
                foreign.push(ForeignEntry::new(
                    key,
                    format!("an object whose key is no key: {e}"),
                ));
            }
        }
        foreign.sort();
        Ok(foreign)
    }
}

/// Whether `key` (relative to the storage's prefix) is this backend's own: a staged upload or
/// an upload journal.
fn is_internal(key: &str) -> bool {
    key.split('/').any(|segment| segment == STAGING_DIR) || key.ends_with(JOURNAL_SUFFIX)
}
