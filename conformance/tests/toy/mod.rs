//! A small, complete backend written outside core: containers in a `HashMap` behind a mutex.
//! It is the worked example of docs/ADDING_A_BACKEND.md, and, with a [`Defect`] switched on,
//! the broken backends the suite must catch.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use weightbay::backend_kit::{
    check_deadline, check_range, is_under, validate_key, validate_prefix,
};
use weightbay::{
    Capabilities, CreateOptions, Error, ErrorKind, Listed, PendingWrite, ReadBack, Result, Sink,
    Source, Storage, WriteMode,
};
use weightbay_conformance::{Case, Harness};

/// A deliberate bug, for showing that the suite fails loudly.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Defect {
    /// Every write is visible at the key at once, before commit.
    PublishesPartialWrites,
    /// Declares race-free create-new but overwrites anyway.
    IgnoresCreateNew,
    /// Every third write is dropped and reported as done, like a swallowed I/O error.
    SwallowsWriteErrors,
    /// Opening a key returns the first container ever committed there.
    ServesStaleReads,
    /// An overwrite removes the old container, then inserts the new one: for a moment the key
    /// is missing.
    DeletesThenInserts,
    /// `pending()` is not declared and fails with an I/O error instead of Unsupported.
    PendingFailsAsIo,
    /// `open` sniffs the stored bytes and refuses what is not a Burnpack container with
    /// InvalidInput, instead of letting the reader report it corrupt.
    RefusesUnknownContent,
    /// `list("dir")` matches keys by string prefix, as a naive object-store listing does, so
    /// `dir2/x` and `directory` show under `dir`.
    ListsByStringPrefix,
    /// Declares a listing of unfinished writes, and lists the committed containers in it.
    PendingListsCommitted,
    /// After three commits every commit fails, as a store that starts refusing writes does.
    FailsAfterThreeCommits,
    /// A listing returns its first page of 1,000 keys only, as a client that ignores the
    /// continuation token does.
    ListsOnePage,
    /// A source reads through one cursor it shares: seek, then read, as a file handle without
    /// `pread` does, so threads reading it at once get each other's bytes.
    SharedCursor,
    /// A batched read refuses a list holding an empty range, as a coalescing fetch that asks the
    /// store for zero bytes does.
    FetchRefusesEmptyRanges,
    /// A batched read asks for the key's current container, not the one the source opened, as
    /// a fetch that leaves out the object's version does.
    FetchReadsLatest,
    /// A sink commits whenever it is asked, its deadline long passed, as a backend that
    /// ignores `CreateOptions::deadline` does.
    IgnoresDeadlines,
    /// A sink's read-back reads the buffer its commit hands over to the map, so once the sink
    /// commits it reads back nothing.
    ReadBackLosesCommitted,
    /// `delete(key)` also removes every key of which `key` is a string prefix (`m.bpk.bak` with
    /// `m.bpk`), as a delete by prefix match does.
    DeletesByStringPrefix,
    /// `list(prefix)` walks the sorted keys from `prefix` on and stops at the first that is not
    /// under it, so a sibling sorting before the prefix's directory (`runs/7.json` before
    /// `runs/7/`) ends the listing early.
    ListsStopAtSibling,
}

#[derive(Debug, Default)]
struct Objects {
    current: HashMap<String, Arc<[u8]>>,
    first: HashMap<String, Arc<[u8]>>,
    commits: u64,
}

/// Containers in a `HashMap`. Clones share the map.
#[derive(Debug, Clone, Default)]
pub(crate) struct HashMapStorage {
    objects: Arc<Mutex<Objects>>,
    defect: Option<Defect>,
}

impl HashMapStorage {
    fn lock(&self) -> MutexGuard<'_, Objects> {
        self.objects
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn publish(&self, key: &str, bytes: &[u8]) {
        let bytes: Arc<[u8]> = bytes.into();
        let mut objects = self.lock();
        objects
            .first
            .entry(key.to_owned())
            .or_insert_with(|| Arc::clone(&bytes));
        objects.current.insert(key.to_owned(), bytes);
    }
}

impl Storage for HashMapStorage {
    fn capabilities(&self) -> Capabilities {
        // A deliberate choice: race-free create-new (one lock), nothing durable, no in-place
        // writes. The suite checks that the undeclared ones are refused.
        let capabilities = Capabilities::NONE.with_atomic_create_new().with_listing();
        if self.defect == Some(Defect::PendingListsCommitted) {
            capabilities.with_pending_listing()
        } else {
            capabilities
        }
    }

    fn create(&self, key: &str, options: &CreateOptions) -> Result<Box<dyn Sink>> {
        validate_key(key)?;
        self.capabilities().check(options)?;
        Ok(Box::new(HashMapSink {
            storage: self.clone(),
            key: key.to_owned(),
            create_new: options.mode == WriteMode::CreateNew,
            deadline: options
                .deadline
                .filter(|_| self.defect != Some(Defect::IgnoresDeadlines)),
            buffer: Arc::default(),
            writes: 0,
        }))
    }

    fn open(&self, key: &str) -> Result<Arc<dyn Source>> {
        validate_key(key)?;
        let objects = self.lock();
        let table = if self.defect == Some(Defect::ServesStaleReads) {
            &objects.first
        } else {
            &objects.current
        };
        let bytes = table
            .get(key)
            .cloned()
            .ok_or_else(|| Error::new(ErrorKind::NotFound, "no such key").with_key(key))?;
        if self.defect == Some(Defect::RefusesUnknownContent) && !bytes.starts_with(b"NRUB") {
            return Err(Error::invalid("not a Burnpack container").with_key(key));
        }
        let cursor = (self.defect == Some(Defect::SharedCursor)).then(|| Mutex::new(0));
        let refuses_empty = self.defect == Some(Defect::FetchRefusesEmptyRanges);
        let latest =
            (self.defect == Some(Defect::FetchReadsLatest)).then(|| (self.clone(), key.to_owned()));
        Ok(Arc::new(HashMapSource {
            bytes,
            cursor,
            refuses_empty,
            latest,
        }))
    }

    fn pending(&self, _prefix: &str) -> Result<Vec<PendingWrite>> {
        if self.defect == Some(Defect::PendingListsCommitted) {
            return Ok(self
                .lock()
                .current
                .keys()
                .map(|key| PendingWrite::new(key, "the committed container", false))
                .collect());
        }
        if self.defect == Some(Defect::PendingFailsAsIo) {
            return Err(Error::new(ErrorKind::Io, "no pending listing here"));
        }
        Err(Error::unsupported("no pending listing"))
    }

    fn clean_pending(&self, _prefix: &str) -> Result<Vec<PendingWrite>> {
        if self.defect == Some(Defect::PendingListsCommitted) {
            return Ok(Vec::new());
        }
        Err(Error::unsupported("no pending listing"))
    }

    /// None: every key in the map came through `create`, which validates it.
    fn list_foreign(&self, prefix: &str) -> Result<Vec<weightbay::ForeignEntry>> {
        validate_prefix(prefix)?;
        Ok(Vec::new())
    }

    fn list(&self, prefix: &str) -> Result<Vec<Listed>> {
        validate_prefix(prefix)?;
        let naive = self.defect == Some(Defect::ListsByStringPrefix);
        let mut listed: Vec<Listed> = self
            .lock()
            .current
            .iter()
            .filter(|(key, _)| {
                if naive {
                    key.starts_with(prefix)
                } else {
                    is_under(key, prefix)
                }
            })
            .map(|(key, bytes)| Listed {
                key: key.clone(),
                len: bytes.len() as u64,
            })
            .collect();
        listed.sort();
        if self.defect == Some(Defect::ListsStopAtSibling) {
            let mut all: Vec<String> = self.lock().current.keys().cloned().collect();
            all.sort();
            let first_outside = all
                .iter()
                .skip_while(|key| key.as_str() < prefix)
                .position(|key| !is_under(key, prefix));
            let walked: Vec<&String> = all
                .iter()
                .skip_while(|key| key.as_str() < prefix)
                .take(first_outside.unwrap_or(usize::MAX))
                .collect();
            listed.retain(|l| walked.contains(&&l.key));
        }
        if self.defect == Some(Defect::ListsOnePage) {
            listed.truncate(1000);
        }
        Ok(listed)
    }

    fn delete(&self, key: &str) -> Result<()> {
        validate_key(key)?;
        let mut objects = self.lock();
        if self.defect == Some(Defect::DeletesByStringPrefix) {
            objects
                .current
                .retain(|other, _| other == key || !other.starts_with(key));
        }
        objects.first.remove(key);
        objects
            .current
            .remove(key)
            .map(|_| ())
            .ok_or_else(|| Error::new(ErrorKind::NotFound, "no such key").with_key(key))
    }
}

struct HashMapSink {
    storage: HashMapStorage,
    key: String,
    create_new: bool,
    deadline: Option<std::time::Instant>,
    /// Shared with the sink's read-backs.
    buffer: Arc<Mutex<Vec<u8>>>,
    writes: u64,
}

impl Sink for HashMapSink {
    fn write(&mut self, data: &[u8]) -> Result<()> {
        self.writes += 1;
        if self.storage.defect == Some(Defect::SwallowsWriteErrors) && self.writes.is_multiple_of(3)
        {
            return Ok(());
        }
        let mut buffer = lock(&self.buffer);
        buffer.extend_from_slice(data);
        if self.storage.defect == Some(Defect::PublishesPartialWrites) {
            self.storage.publish(&self.key, &buffer);
        }
        Ok(())
    }

    fn commit(self: Box<Self>) -> Result<()> {
        check_deadline(self.deadline, "committing")?;
        let check = self.create_new && self.storage.defect != Some(Defect::IgnoresCreateNew);
        // Check and insert under one lock: that is what makes create-new race-free.
        let mut objects = self.storage.lock();
        if self.storage.defect == Some(Defect::FailsAfterThreeCommits) && objects.commits >= 3 {
            return Err(
                Error::new(ErrorKind::Io, "the store refuses writes now").with_key(&self.key)
            );
        }
        objects.commits += 1;
        if check && objects.current.contains_key(&self.key) {
            return Err(Error::new(ErrorKind::AlreadyExists, "key is taken").with_key(&self.key));
        }
        if self.storage.defect == Some(Defect::DeletesThenInserts) {
            objects.current.remove(&self.key);
            // The gap a remove-then-write backend leaves: another thread may look now.
            drop(objects);
            std::thread::yield_now();
            objects = self.storage.lock();
        }
        let bytes: Arc<[u8]> = if self.storage.defect == Some(Defect::ReadBackLosesCommitted) {
            std::mem::take(&mut *lock(&self.buffer)).into()
        } else {
            lock(&self.buffer).as_slice().into()
        };
        objects
            .first
            .entry(self.key.clone())
            .or_insert_with(|| Arc::clone(&bytes));
        objects.current.insert(self.key, bytes);
        Ok(())
    }

    fn read_back(&self) -> Option<Arc<dyn ReadBack>> {
        Some(Arc::new(HashMapReadBack(Arc::clone(&self.buffer))))
    }
}

fn lock(buffer: &Mutex<Vec<u8>>) -> MutexGuard<'_, Vec<u8>> {
    buffer
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Reads a sink's buffer.
#[derive(Debug)]
struct HashMapReadBack(Arc<Mutex<Vec<u8>>>);

impl ReadBack for HashMapReadBack {
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        let buffer = lock(&self.0);
        let start = usize::try_from(offset).unwrap_or(usize::MAX);
        let bytes = buffer
            .get(start..start.saturating_add(buf.len()))
            .ok_or_else(|| Error::new(ErrorKind::OutOfRange, "past what was written"))?;
        buf.copy_from_slice(bytes);
        Ok(())
    }
}

#[derive(Debug)]
struct HashMapSource {
    bytes: Arc<[u8]>,
    /// With [`Defect::SharedCursor`], where the next read starts.
    cursor: Option<Mutex<u64>>,
    /// With [`Defect::FetchRefusesEmptyRanges`].
    refuses_empty: bool,
    /// With [`Defect::FetchReadsLatest`], where `fetch` looks.
    latest: Option<(HashMapStorage, String)>,
}

impl Source for HashMapSource {
    fn len(&self) -> u64 {
        self.bytes.len() as u64
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        let end = offset.saturating_add(buf.len() as u64);
        check_range(&(offset..end), self.len())?;
        let start = match &self.cursor {
            Some(cursor) => {
                // Seek, then read: another thread may seek in between.
                *cursor
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner) = offset;
                std::thread::yield_now();
                let at = *cursor
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                at.min(self.len() - buf.len() as u64)
            }
            None => offset,
        };
        // In range, so both ends fit in usize.
        buf.copy_from_slice(&self.bytes[start as usize..start as usize + buf.len()]);
        Ok(())
    }

    fn fetch(&self, ranges: &[std::ops::Range<u64>]) -> Result<Vec<weightbay::Bytes>> {
        if self.refuses_empty && ranges.iter().any(|r| r.start == r.end) {
            return Err(Error::invalid("a batched read of zero bytes"));
        }
        if let Some((storage, key)) = &self.latest
            && let Some(bytes) = storage.lock().current.get(key).cloned()
        {
            let latest = HashMapSource {
                bytes,
                cursor: None,
                refuses_empty: false,
                latest: None,
            };
            return weightbay::backend_kit::fetch_views(&latest, ranges);
        }
        weightbay::backend_kit::fetch_views(self, ranges)
    }
}

/// The harness: a fresh map per storage, optionally with a defect.
#[derive(Debug, Default)]
pub(crate) struct HashMapHarness {
    pub defect: Option<Defect>,
}

impl Harness for HashMapHarness {
    type Storage = HashMapStorage;

    fn fresh(&self) -> HashMapStorage {
        HashMapStorage {
            defect: self.defect,
            ..HashMapStorage::default()
        }
    }

    fn reopen(&self, storage: &HashMapStorage) -> HashMapStorage {
        storage.clone()
    }

    fn not_applicable(&self) -> &[Case] {
        // Nothing outlives the process, nothing goes through a file system, its sinks only
        // append, and it keeps no list of unfinished writes.
        &[
            Case::PowerLossAtEveryOperation,
            Case::CompressedSavesSurvivePowerLoss,
            Case::FileSystemFaultAtEveryOperation,
            Case::CreateNewRaceStepByStep,
            Case::ProcessCrashAtEveryStep,
            Case::CompressedSavesSurviveKills,
            Case::PositionedWritesLandWhole,
            Case::WritesInProgressArePending,
            Case::CleaningSparesWritesInProgress,
        ]
    }
}
