//! Conformance harnesses for the object-store backend: object_store's InMemory and
//! LocalFileSystem, and the local S3 (moto), GCS (fixture) and Azure (Azurite) servers that
//! scripts/test.sh starts. Every fresh storage is its own prefix.
#![allow(dead_code)] // each test binary uses its own subset

pub(crate) mod intercept;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use intercept::Intercepted;
use weightbay_conformance::{Case, FaultPlan, Harness};
use weightbay_object_store::{ObjectStorage, ObjectStoreOptions, open_url};

/// The cases no object store can run: it does no file I/O through weightbay's file-system seam,
/// an upload's bytes cannot be read back before the object exists, and it takes them in order.
const NOT_APPLICABLE: [Case; 6] = [
    Case::PowerLossAtEveryOperation,
    Case::CompressedSavesSurvivePowerLoss,
    Case::FileSystemFaultAtEveryOperation,
    Case::CreateNewRaceStepByStep,
    Case::ReadBackFollowsWrites,
    Case::PositionedWritesLandWhole,
];

/// For `file://` stores too: local files have no multipart API, so a write in progress is
/// not journaled and `pending` cannot see it.
const NOT_APPLICABLE_FILES: [Case; 7] = [
    NOT_APPLICABLE[0],
    NOT_APPLICABLE[1],
    NOT_APPLICABLE[2],
    NOT_APPLICABLE[3],
    NOT_APPLICABLE[4],
    NOT_APPLICABLE[5],
    Case::WritesInProgressArePending,
];

/// Small parts, so the suite's containers over 64 KiB go through multipart uploads, and its
/// several-parts containers (300 KB) through uploads of five parts.
pub(crate) const SMALL_PARTS: ObjectStoreOptions = ObjectStoreOptions::DEFAULT
    .with_part_size(64 * 1024)
    .with_parts_in_flight(3)
    .with_fetch_budget(1 << 20)
    .with_fetch_request_len(Some(1 << 20))
    // The store cannot tell a dead writer's staged upload from a live one's, so cleanup goes
    // by age; in the suite no writer runs beside a cleanup, so every staged upload is stale.
    .with_stale_after(std::time::Duration::ZERO);

fn unique_run() -> String {
    use std::hash::BuildHasher;
    let random = std::collections::hash_map::RandomState::new().hash_one(std::process::id());
    format!("run-{}-{random:x}", std::process::id())
}

/// object_store's InMemory store.
#[derive(Debug, Default)]
pub(crate) struct InMemory;

impl Harness for InMemory {
    type Storage = ObjectStorage;

    fn fresh(&self) -> ObjectStorage {
        ObjectStorage::journaled(Arc::new(object_store::memory::InMemory::new()))
            .unwrap()
            .with_options(SMALL_PARTS)
    }

    fn reopen(&self, storage: &ObjectStorage) -> ObjectStorage {
        storage.clone()
    }

    fn not_applicable(&self) -> &[Case] {
        // Nothing outlives the process.
        &[
            NOT_APPLICABLE[0],
            NOT_APPLICABLE[1],
            NOT_APPLICABLE[2],
            NOT_APPLICABLE[3],
            NOT_APPLICABLE[4],
            NOT_APPLICABLE[5],
            Case::ProcessCrashAtEveryStep,
            Case::CompressedSavesSurviveKills,
        ]
    }

    fn write_buffer_bound(&self, container_len: u64) -> u64 {
        // The store keeps the object in memory, and parts are copied into it.
        2 * container_len + SMALL_PARTS.buffer_bound(Some(container_len))
    }
}

/// A store reached by URL: `file://` in a temporary directory, or a server from the
/// environment.
#[derive(Debug)]
pub(crate) struct ByUrl {
    base: Option<String>,
    why_not: String,
    options: ObjectStoreOptions,
    run: String,
    next: AtomicUsize,
    limitations: &'static [(Case, &'static str)],
    /// Keys one page of the server's listing holds.
    listing_page_size: usize,
    _dir: Option<tempfile::TempDir>,
}

/// What moto, the S3 server the tests run, does not do as S3 does.
const MOTO_LIMITATIONS: &[(Case, &str)] = &[(
    Case::LargeCreateNewRaceHasOneWinner,
    "moto does not serialize concurrent conditional (If-None-Match) CompleteMultipartUpload \
     calls: of four racing to publish one key, three won; S3 lets one. The deterministic \
     interleaved_commits_resolve_in_order covers that path on moto",
)];

impl ByUrl {
    /// LocalFileSystem under a temporary directory.
    pub(crate) fn local_fs() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let base = format!("file://{}", dir.path().display());
        Self::new(Some(base), String::new(), SMALL_PARTS, Some(dir))
    }

    /// The S3 server named by `WEIGHTBAY_S3_URL` and the `AWS_*` variables.
    pub(crate) fn s3() -> Self {
        let base = std::env::var("WEIGHTBAY_S3_URL")
            .ok()
            .filter(|_| std::env::var("AWS_ENDPOINT").is_ok());
        let mut s3 = Self::new(base, "no S3 server: WEIGHTBAY_S3_URL and AWS_ENDPOINT are unset (scripts/servers.sh start s3)".into(), server_parts(), None);
        s3.limitations = MOTO_LIMITATIONS;
        s3
    }

    /// The GCS server named by `WEIGHTBAY_GCS_URL` and the `GOOGLE_*` variables.
    pub(crate) fn gcs() -> Self {
        let base = std::env::var("WEIGHTBAY_GCS_URL")
            .ok()
            .filter(|_| std::env::var("GOOGLE_SERVICE_ACCOUNT").is_ok());
        Self::new(base, "no GCS server: WEIGHTBAY_GCS_URL and GOOGLE_SERVICE_ACCOUNT are unset (scripts/servers.sh start gcs)".into(), server_parts(), None)
    }

    /// Azurite, named by `WEIGHTBAY_AZURE_URL` and the `AZURE_*` / `AZURITE_*` variables.
    pub(crate) fn azure() -> Self {
        let base = std::env::var("WEIGHTBAY_AZURE_URL")
            .ok()
            .filter(|_| std::env::var("AZURITE_BLOB_STORAGE_URL").is_ok());
        let mut azure = Self::new(base, "no Azure server: WEIGHTBAY_AZURE_URL and AZURITE_BLOB_STORAGE_URL are unset (scripts/servers.sh start azure)".into(), server_parts(), None);
        // Azure lists up to 5,000 blobs a page, and object_store asks for no fewer.
        azure.listing_page_size = 5000;
        azure
    }

    fn new(
        base: Option<String>,
        why_not: String,
        options: ObjectStoreOptions,
        dir: Option<tempfile::TempDir>,
    ) -> Self {
        Self {
            base,
            why_not,
            options,
            run: unique_run(),
            next: AtomicUsize::new(0),
            limitations: &[],
            listing_page_size: 1000,
            _dir: dir,
        }
    }

    pub(crate) fn url(&self, n: usize) -> String {
        format!(
            "{}/{}/storage-{n}",
            self.base.as_deref().unwrap_or_default(),
            self.run
        )
    }

    pub(crate) fn open(&self, url: &str) -> ObjectStorage {
        let storage = open_url(url, std::iter::empty::<(&str, &str)>())
            .unwrap_or_else(|e| panic!("opening {url}: {e}"));
        let durable = storage.options().durable;
        storage.with_options(self.options.with_durable(durable))
    }
}

/// Servers refuse parts under 5 MiB. Requests of 4 MiB, so the batched-read case's batch
/// (above 6 MiB) is fetched in several pieces on the servers too.
fn server_parts() -> ObjectStoreOptions {
    ObjectStoreOptions::DEFAULT
        .with_fetch_request_len(Some(4 << 20))
        .with_part_size(weightbay_object_store::MIN_PART_SIZE)
        .with_parts_in_flight(4)
        // Long enough that no journal is renewed while a case's upload runs: a renewal every
        // second (the floor) made the crash case's count of the store's requests differ from
        // run to run on a loaded machine ("killed after operation 12 of 12: not killed").
        // Killed writers here ran on this machine, so their journals are judged by process,
        // not by age.
        .with_stale_after(std::time::Duration::from_secs(600))
}

impl Harness for ByUrl {
    type Storage = ObjectStorage;

    fn unavailable(&self) -> Option<String> {
        self.base.is_none().then(|| self.why_not.clone())
    }

    fn fresh(&self) -> ObjectStorage {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        self.open(&self.url(n))
    }

    fn reopen(&self, storage: &ObjectStorage) -> ObjectStorage {
        storage.clone()
    }

    fn locator(&self, storage: &ObjectStorage) -> Option<String> {
        // The prefix holds the whole path for file:// stores, and the path after the bucket
        // for servers (whose base URL is just scheme and bucket).
        let base = self.base.as_deref()?;
        Some(if base.starts_with("file://") {
            format!("file:///{}", storage.prefix())
        } else {
            format!("{base}/{}", storage.prefix())
        })
    }

    fn reopen_at(&self, locator: &str) -> Option<ObjectStorage> {
        Some(self.open(locator))
    }

    fn reopen_at_with_faults(&self, locator: &str, faults: FaultPlan) -> Option<ObjectStorage> {
        let storage = self.open(locator);
        let store = Intercepted::new(Arc::clone(storage.store()), faults, None);
        // Journaled where the store is, so killed writers' uploads are tested for cleanup.
        let intercepted = match storage.multipart_store() {
            Some(multipart) => {
                ObjectStorage::journaled(Arc::new(store.with_multipart(Arc::clone(multipart))))
            }
            None => ObjectStorage::new(Arc::new(store)),
        }
        .and_then(|s| s.with_prefix(storage.prefix().as_ref()))
        .unwrap_or_else(|e| panic!("intercepting {locator}: {e}"));
        Some(intercepted.with_options(*storage.options()))
    }

    fn not_applicable(&self) -> &[Case] {
        match &self.base {
            Some(base) if base.starts_with("file://") => &NOT_APPLICABLE_FILES,
            _ => &NOT_APPLICABLE,
        }
    }

    fn server_limitations(&self) -> &[(Case, &'static str)] {
        self.limitations
    }

    fn listing_page_size(&self) -> usize {
        self.listing_page_size
    }

    fn several_parts_len(&self) -> usize {
        // Two and a half parts of whatever size this store takes.
        self.options.part_size * 5 / 2
    }

    fn write_buffer_bound(&self, container_len: u64) -> u64 {
        self.options.buffer_bound(Some(container_len))
    }
}
