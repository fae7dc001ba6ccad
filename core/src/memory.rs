//! [`MemoryStorage`], the reference backend: every other backend is checked against its
//! behaviour by the conformance suite.

use std::collections::BTreeMap;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use crate::batched_reads::fetch_views;
use crate::bytes::SharedBytes;
use crate::capabilities::Capabilities;
use crate::keys::{is_under, validate_key, validate_prefix};
use crate::options::{CreateOptions, WriteMode, check_deadline};
use crate::ranges::{check_range, check_written};
use crate::storage::{
    ForeignEntry, Listed, PendingWrite, PositionedWrite, ReadBack, Sink, Source, Storage,
};
use crate::{AllocationProperty, Bytes, Error, ErrorKind, Result};

#[derive(Debug, Default)]
struct State {
    objects: BTreeMap<String, bytes::Bytes>,
    /// Open sinks, by id, with their keys.
    pending: BTreeMap<u64, String>,
}

/// Containers held in process memory. Clones share the same objects (a clone is the same
/// storage reopened).
///
/// Commits are atomic (one map insert under a lock), create-new is race-free, sources are
/// zero-copy snapshots that keep reading what they opened, and a dropped sink leaves nothing.
#[derive(Debug, Default, Clone)]
pub struct MemoryStorage {
    state: Arc<Mutex<State>>,
    next_sink: Arc<AtomicU64>,
}

impl MemoryStorage {
    /// An empty storage.
    pub fn new() -> Self {
        Self::default()
    }

    /// The keys present, sorted.
    pub fn keys(&self) -> Vec<String> {
        self.lock().objects.keys().cloned().collect()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock cannot leave the maps half-updated (every update is
        // one insert or remove), so a poisoned lock is safe to keep using.
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl Storage for MemoryStorage {
    fn capabilities(&self) -> Capabilities {
        Capabilities::NONE
            .with_atomic_create_new()
            .with_zero_copy_reads()
            .with_pending_listing()
            .with_listing()
    }

    fn create(&self, key: &str, options: &CreateOptions) -> Result<Box<dyn Sink>> {
        validate_key(key)?;
        self.capabilities().check(options)?;
        let mut state = self.lock();
        if options.mode == WriteMode::CreateNew && state.objects.contains_key(key) {
            return Err(Error::new(ErrorKind::AlreadyExists, "key is taken").with_key(key));
        }
        let id = self.next_sink.fetch_add(1, Ordering::Relaxed);
        state.pending.insert(id, key.to_owned());
        let capacity = options
            .expected_len
            .map_or(0, |len| usize::try_from(len).unwrap_or(0).min(1 << 30));
        Ok(Box::new(MemorySink {
            storage: self.clone(),
            id,
            key: key.to_owned(),
            create_new: options.mode == WriteMode::CreateNew,
            deadline: options.deadline,
            expected_len: options.expected_len,
            appended: 0,
            positioned: false,
            written: Arc::new(Mutex::new(Written::Writing(Vec::with_capacity(capacity)))),
        }))
    }

    fn open(&self, key: &str) -> Result<Arc<dyn Source>> {
        validate_key(key)?;
        let data = self.lock().objects.get(key).cloned();
        match data {
            Some(data) => Ok(Arc::new(MemorySource::new(data))),
            None => Err(Error::new(ErrorKind::NotFound, "no container at key").with_key(key)),
        }
    }

    fn delete(&self, key: &str) -> Result<()> {
        validate_key(key)?;
        match self.lock().objects.remove(key) {
            Some(_) => Ok(()),
            None => Err(Error::new(ErrorKind::NotFound, "no container at key").with_key(key)),
        }
    }

    fn pending(&self, prefix: &str) -> Result<Vec<PendingWrite>> {
        validate_prefix(prefix)?;
        Ok(self
            .lock()
            .pending
            .iter()
            .filter(|(_, key)| is_under(key, prefix))
            .map(|(id, key)| PendingWrite::new(key, format!("open sink {id}"), false))
            .collect())
    }

    fn clean_pending(&self, prefix: &str) -> Result<Vec<PendingWrite>> {
        validate_prefix(prefix)?;
        // Every pending entry is a live sink in this process; a dead writer leaves nothing.
        Ok(Vec::new())
    }

    fn list(&self, prefix: &str) -> Result<Vec<Listed>> {
        validate_prefix(prefix)?;
        Ok(self
            .lock()
            .objects
            .iter()
            .filter(|(key, _)| is_under(key, prefix))
            .map(|(key, data)| Listed {
                key: key.clone(),
                len: data.len() as u64,
            })
            .collect())
    }

    /// None: every key here was written through [`create`](Storage::create), so is valid.
    fn list_foreign(&self, prefix: &str) -> Result<Vec<ForeignEntry>> {
        validate_prefix(prefix)?;
        Ok(Vec::new())
    }
}

struct MemorySink {
    storage: MemoryStorage,
    id: u64,
    key: String,
    create_new: bool,
    deadline: Option<Instant>,
    expected_len: Option<u64>,
    /// Where the next append goes: the end of the last one, whatever was written by position.
    appended: usize,
    /// Whether [`Sink::positioned`] was taken: the commit then checks the length.
    positioned: bool,
    /// Shared with the sink's [`ReadBack`]s, which keep reading it after the commit.
    written: Arc<Mutex<Written>>,
}

/// A memory sink's bytes: being written, then the container its commit published.
#[derive(Debug)]
enum Written {
    Writing(Vec<u8>),
    Published(bytes::Bytes),
}

impl Written {
    fn bytes(&self) -> &[u8] {
        match self {
            Self::Writing(buffer) => buffer,
            Self::Published(bytes) => bytes,
        }
    }

    /// Puts `data` at `offset` of the bytes being written, zeros before it where they end
    /// short of it.
    fn put(&mut self, offset: usize, data: &[u8]) {
        if data.is_empty() {
            return;
        }
        let Self::Writing(buffer) = self else {
            unreachable!("a sink is published only by its commit, which consumes it");
        };
        let end = offset + data.len();
        if buffer.len() < end {
            buffer.resize(end, 0);
        }
        // The buffer reaches `end` now.
        buffer[offset..end].copy_from_slice(data);
    }
}

fn lock_written(written: &Mutex<Written>) -> MutexGuard<'_, Written> {
    // Every update is one copy in place or one swap: a panic cannot leave it half done.
    written
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Sink for MemorySink {
    fn write(&mut self, data: &[u8]) -> Result<()> {
        check_deadline(self.deadline, "writing").map_err(|e| e.with_key(&self.key))?;
        lock_written(&self.written).put(self.appended, data);
        self.appended += data.len();
        Ok(())
    }

    fn commit(self: Box<Self>) -> Result<()> {
        check_deadline(self.deadline, "committing").map_err(|e| e.with_key(&self.key))?;
        let mut written = lock_written(&self.written);
        let mut state = self.storage.lock();
        if self.create_new && state.objects.contains_key(&self.key) {
            return Err(
                Error::new(ErrorKind::AlreadyExists, "key was taken before commit")
                    .with_key(&self.key),
            );
        }
        let Written::Writing(buffer) = &mut *written else {
            unreachable!("a sink is committed once: its commit consumes it");
        };
        if self.positioned {
            check_written(self.expected_len, buffer.len() as u64)
                .map_err(|e| e.with_key(&self.key))?;
        }
        let data = bytes::Bytes::from(std::mem::take(buffer));
        *written = Written::Published(data.clone());
        state.objects.insert(self.key.clone(), data);
        Ok(())
    }

    fn read_back(&self) -> Option<Arc<dyn ReadBack>> {
        Some(Arc::new(MemoryReadBack(Arc::clone(&self.written))))
    }

    fn positioned(&mut self) -> Option<Box<dyn PositionedWrite + '_>> {
        let expected_len = self.expected_len?;
        self.positioned = true;
        Some(Box::new(MemoryWrites {
            sink: self,
            expected_len,
        }))
    }
}

/// A memory sink written by position ([`Sink::positioned`]).
struct MemoryWrites<'a> {
    sink: &'a MemorySink,
    expected_len: u64,
}

impl PositionedWrite for MemoryWrites<'_> {
    fn write_at(&self, offset: u64, data: &[u8]) -> Result<()> {
        let key = &self.sink.key;
        check_deadline(self.sink.deadline, "writing").map_err(|e| e.with_key(key))?;
        let range = offset..offset.saturating_add(data.len() as u64);
        check_range(&range, self.expected_len).map_err(|e| e.with_key(key))?;
        let offset = usize::try_from(offset).map_err(|_| {
            Error::new(ErrorKind::OutOfRange, "an offset past memory").with_key(key)
        })?;
        lock_written(&self.sink.written).put(offset, data);
        Ok(())
    }
}

/// Reads a memory sink's bytes as they are written, and its container once published.
#[derive(Debug)]
struct MemoryReadBack(Arc<Mutex<Written>>);

impl ReadBack for MemoryReadBack {
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        let written = lock_written(&self.0);
        let bytes = written.bytes();
        let range = offset..offset.saturating_add(buf.len() as u64);
        check_range(&range, bytes.len() as u64)?;
        // In range of a slice in memory, so both ends fit in usize.
        buf.copy_from_slice(&bytes[range.start as usize..range.end as usize]);
        Ok(())
    }
}

impl Drop for MemorySink {
    fn drop(&mut self) {
        self.storage.lock().pending.remove(&self.id);
    }
}

/// A [`Source`] over bytes in memory: a buffer, or a file's map (`weightbay-mmap` makes its
/// sources so). [`bytes`](Source::bytes) is zero-copy, and each view carries the allocation
/// property the source was made with.
#[derive(Debug, Clone)]
pub struct MemorySource {
    data: SharedBytes,
    property: AllocationProperty,
}

impl MemorySource {
    /// A source over `data`, an ordinary shared buffer ([`AllocationProperty::Shared`]).
    pub fn new(data: SharedBytes) -> Self {
        Self::with_property(data, AllocationProperty::Shared)
    }

    /// A source over `data`, whose views report `property` (a map over a file's pages is
    /// [`AllocationProperty::Mmap`]).
    pub fn with_property(data: SharedBytes, property: AllocationProperty) -> Self {
        Self { data, property }
    }

    /// All of it, as zero-copy bytes.
    pub fn as_bytes(&self) -> Bytes {
        Bytes::from_shared(self.data.clone(), self.property)
    }

    fn slice(&self, range: &Range<u64>) -> Result<Range<usize>> {
        check_range(range, self.len())?;
        // In range of an in-memory buffer, so both ends fit usize.
        Ok(range.start as usize..range.end as usize)
    }
}

impl Source for MemorySource {
    fn len(&self) -> u64 {
        self.data.len() as u64
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        let range = self.slice(&(offset..offset.saturating_add(buf.len() as u64)))?;
        buf.copy_from_slice(&self.data[range]);
        Ok(())
    }

    fn bytes(&self, range: Range<u64>) -> Result<Bytes> {
        let range = self.slice(&range)?;
        Ok(Bytes::from_shared(self.data.slice(range), self.property))
    }

    /// Views of the buffer: nothing is copied (a map's pages come in as they are touched).
    fn fetch(&self, ranges: &[Range<u64>]) -> Result<Vec<Bytes>> {
        fetch_views(self, ranges)
    }
}
