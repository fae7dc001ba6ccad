//! The storage plugin traits: a [`Storage`] opens [`Sink`]s to write containers and
//! [`Source`]s to read them.

use std::fmt;
use std::ops::Range;
use std::sync::{Arc, OnceLock};

use crate::bytes::{AccessPolicy, AllocationController, AllocationProperty, Bytes};
use crate::{Error, ErrorKind, Result};

/// Random-access read of one stored container.
///
/// # Contract
/// - [`len`](Self::len) is fixed for the life of the source: the length of the container it
///   opened.
/// - [`read_at`](Self::read_at) fills all of `buf` from `offset`, or fails with
///   [`ErrorKind::OutOfRange`] when the range passes `len`. It never returns bytes of a
///   different container than the one opened: if the stored object was replaced or truncated
///   since `open`, it returns the old bytes or an error, never a mix.
/// - [`bytes`](Self::bytes) returns the range as [`Bytes`] whose controller is the backend's
///   best (zero-copy view, lazy file region, lazy remote range); the default reads eagerly.
/// - Sources are shared across threads; concurrent reads are allowed.
pub trait Source: Send + Sync + fmt::Debug {
    /// Length of the container in bytes.
    fn len(&self) -> u64;

    /// Whether the container is empty.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Fills `buf` with the bytes at `offset..offset + buf.len()`.
    ///
    /// # Errors
    /// [`ErrorKind::OutOfRange`] past the end; the backend's error otherwise.
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<()>;

    /// The bytes of `range`.
    ///
    /// # Errors
    /// [`ErrorKind::OutOfRange`] past the end; the backend's error otherwise.
    fn bytes(&self, range: Range<u64>) -> Result<Bytes> {
        read_resident(self, &range)
    }

    /// The bytes of every range in `ranges`, in the order given, read now rather than on first
    /// access: a load asks for many tensors at once so the backend can coalesce the reads and
    /// run them in parallel. Every range is checked before anything is read. The default reads
    /// them one by one with [`read_at`](Self::read_at).
    ///
    /// # Errors
    /// [`ErrorKind::OutOfRange`] when any range is past the end, and then nothing is read; the
    /// backend's error otherwise.
    fn fetch(&self, ranges: &[Range<u64>]) -> Result<Vec<Bytes>> {
        check_ranges(ranges, self.len())?;
        ranges
            .iter()
            .map(|range| read_resident(self, range))
            .collect()
    }

    /// How many bytes a reader going through the container in order gains from asking
    /// [`fetch`](Self::fetch) for at once: 0 (the default) where a range costs the same alone
    /// (memory, a map, a local file); an object store's fetch budget, since each request pays
    /// a round trip.
    fn fetch_ahead(&self) -> u64 {
        0
    }
}

/// `range` read with `read_at` into fresh memory.
fn read_resident<S: Source + ?Sized>(source: &S, range: &Range<u64>) -> Result<Bytes> {
    check_range(range, source.len())?;
    let len = usize::try_from(range.end - range.start)
        .map_err(|_| Error::new(ErrorKind::OutOfRange, "range does not fit in memory"))?;
    let mut bytes = Bytes::zeroed(len, 64)?;
    source.read_at(range.start, bytes.make_mut()?)?;
    Ok(bytes)
}

/// [`Source::fetch`] for a source whose [`bytes`](Source::bytes) are already resident views
/// (memory, a map): every range checked first, then a view of each, nothing copied.
///
/// # Errors
/// [`ErrorKind::OutOfRange`] when any range is past the end; the source's errors.
pub fn fetch_views<S: Source + ?Sized>(source: &S, ranges: &[Range<u64>]) -> Result<Vec<Bytes>> {
    check_ranges(ranges, source.len())?;
    ranges
        .iter()
        .map(|range| source.bytes(range.clone()))
        .collect()
}

/// Threads [`read_at_parallel`] reads on at most.
const READ_THREADS: usize = 4;
/// Below this many bytes in all, [`read_at_parallel`] reads on the calling thread: starting
/// threads would cost more.
const PARALLEL_READ_FROM: u64 = 4 << 20;

/// Fills each buffer of `jobs` with `source.read_at` at its offset, the jobs shared out over a
/// few threads when there is enough to read: one thread leaves a cold disk's queue half empty,
/// and from the page cache one core's copy is the limit.
///
/// # Errors
/// The first read error (its offset says which job).
pub fn read_at_parallel<S: Source + ?Sized>(
    source: &S,
    jobs: &mut [(u64, &mut [u8])],
) -> Result<()> {
    let total: u64 = jobs.iter().map(|(_, buf)| buf.len() as u64).sum();
    let threads = std::thread::available_parallelism()
        .map_or(1, usize::from)
        .min(READ_THREADS)
        .min(jobs.len().max(1));
    if threads <= 1 || total < PARALLEL_READ_FROM {
        return jobs
            .iter_mut()
            .try_for_each(|(offset, buf)| source.read_at(*offset, buf));
    }
    let per_thread = jobs.len().div_ceil(threads);
    std::thread::scope(|scope| {
        let workers: Vec<_> = jobs
            .chunks_mut(per_thread)
            .map(|jobs| {
                scope.spawn(move || {
                    jobs.iter_mut()
                        .try_for_each(|(offset, buf)| source.read_at(*offset, buf))
                })
            })
            .collect();
        workers.into_iter().try_for_each(|worker| {
            worker
                .join()
                .unwrap_or_else(|_| Err(Error::new(ErrorKind::Io, "a read thread panicked")))
        })
    })
}

/// Checks every range of a batched read against a source of `len` bytes.
///
/// # Errors
/// [`ErrorKind::OutOfRange`] for the first range that is reversed or passes `len`.
pub fn check_ranges(ranges: &[Range<u64>], len: u64) -> Result<()> {
    ranges.iter().try_for_each(|range| check_range(range, len))
}

/// Checks, at commit, that a sink received the length the writer planned
/// ([`CreateOptions::expected_len`]): a shorter stream means a writer stopped early.
///
/// # Errors
/// [`ErrorKind::Io`] naming both lengths.
pub fn check_written(expected: Option<u64>, written: u64) -> Result<()> {
    match expected {
        Some(expected) if expected != written => Err(Error::new(
            ErrorKind::Io,
            format!("{written} bytes written, {expected} were planned"),
        )),
        _ => Ok(()),
    }
}

/// Checks `range` against a source of `len` bytes.
///
/// # Errors
/// [`ErrorKind::OutOfRange`] when the range is reversed or passes `len`.
pub fn check_range(range: &Range<u64>, len: u64) -> Result<()> {
    if range.start > range.end || range.end > len {
        return Err(Error::new(
            ErrorKind::OutOfRange,
            format!(
                "range {}..{} of a {len}-byte container",
                range.start, range.end
            ),
        )
        .with_offset(range.start));
    }
    Ok(())
}

/// A lazily read range of a [`Source`]: nothing is read until first access, then the range
/// is fetched once and cached. Sub-views taken before that stay lazy and fetch only
/// themselves. Backends return it from [`Source::bytes`].
pub struct LazyRegion {
    source: Arc<dyn Source>,
    range: Range<u64>,
    property: AllocationProperty,
    cache: OnceLock<Box<[u8]>>,
}

impl LazyRegion {
    /// A lazy view of `range` of `source`, reported as `property` (`File` or `Remote`).
    ///
    /// # Errors
    /// [`ErrorKind::OutOfRange`] when the range passes the source's end or does not fit in
    /// memory.
    pub fn new(
        source: Arc<dyn Source>,
        range: Range<u64>,
        property: AllocationProperty,
    ) -> Result<Self> {
        check_range(&range, source.len())?;
        usize::try_from(range.end - range.start)
            .map_err(|_| Error::new(ErrorKind::OutOfRange, "range does not fit in memory"))?;
        Ok(Self {
            source,
            range,
            property,
            cache: OnceLock::new(),
        })
    }
}

impl fmt::Debug for LazyRegion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LazyRegion")
            .field("range", &self.range)
            .field("property", &self.property)
            .field("resident", &self.cache.get().is_some())
            .finish_non_exhaustive()
    }
}

impl AllocationController for LazyRegion {
    fn len(&self) -> usize {
        (self.range.end - self.range.start) as usize
    }

    fn alignment(&self) -> usize {
        // The cache is allocated by the global allocator, which aligns to at least 8.
        8
    }

    fn property(&self) -> AllocationProperty {
        self.property
    }

    fn memory(&self, policy: AccessPolicy) -> Result<&[u8]> {
        if let Some(cached) = self.cache.get() {
            return Ok(cached);
        }
        if policy == AccessPolicy::ZeroCopy {
            return Err(Error::new(
                ErrorKind::WouldCopy,
                format!("{} bytes are not resident yet", self.len()),
            ));
        }
        let mut buf = vec![0; self.len()].into_boxed_slice();
        self.source.read_at(self.range.start, &mut buf)?;
        Ok(self.cache.get_or_init(|| buf))
    }

    fn read_at(&self, offset: usize, buf: &mut [u8]) -> Result<()> {
        if let Some(cached) = self.cache.get() {
            buf.copy_from_slice(&cached[offset..offset + buf.len()]);
            return Ok(());
        }
        self.source.read_at(self.range.start + offset as u64, buf)
    }

    fn narrow(&self, start: usize, end: usize) -> Option<Box<dyn AllocationController>> {
        if self.cache.get().is_some() {
            return None;
        }
        let base = self.range.start;
        let range = base + start as u64..base + end as u64;
        Some(Box::new(Self {
            source: Arc::clone(&self.source),
            range,
            property: self.property,
            cache: OnceLock::new(),
        }))
    }
}

/// A sequential destination for one container's bytes.
///
/// # Contract
/// - Bytes appear at the key only through [`commit`](Self::commit), all at once: before it,
///   readers of the key see what was there before (or nothing).
/// - Dropping a sink without committing aborts it: the key is exactly as it was and nothing
///   is left behind (no scratch file, no pending upload).
/// - After any error from [`write`](Self::write) or [`pad`](Self::pad) the caller drops the
///   sink. A failed `commit` leaves the key as it was, with one exception a backend must name
///   in the error: the container was published but could not be made durable (a directory
///   fsync that failed after the rename).
/// - The one mode outside these rules is [`WriteMode::InPlace`], which the caller chooses
///   knowing that it writes the destination itself: the old container is gone once the sink
///   is created, and a dropped or failed in-place sink leaves a partial file.
pub trait Sink: Send {
    /// Appends `data`.
    ///
    /// # Errors
    /// The backend's error; the sink must then be dropped.
    fn write(&mut self, data: &[u8]) -> Result<()>;

    /// Appends `len` zero bytes.
    ///
    /// # Errors
    /// As [`write`](Self::write).
    fn pad(&mut self, len: u64) -> Result<()> {
        const ZEROS: [u8; 4096] = [0; 4096];
        let mut left = len;
        while left > 0 {
            let step = left.min(ZEROS.len() as u64);
            self.write(&ZEROS[..step as usize])?;
            left -= step;
        }
        Ok(())
    }

    /// Publishes everything written, atomically.
    ///
    /// # Errors
    /// [`ErrorKind::AlreadyExists`] when the sink was opened create-new and the key was taken
    /// meanwhile; the backend's error otherwise. The key is then as it was.
    fn commit(self: Box<Self>) -> Result<()>;
}

/// What happens to an existing container at the key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum WriteMode {
    /// Replace whatever is there, atomically (the default).
    #[default]
    Overwrite,
    /// Fail with [`ErrorKind::AlreadyExists`] if anything is there, without a race between
    /// two writers (needs [`Capabilities::atomic_create_new`]).
    CreateNew,
    /// Write the existing object in place (keeps a file's inode); a failure loses the old
    /// container (needs [`Capabilities::in_place_writes`]).
    InPlace,
}

/// How hard a commit works to survive a crash.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Durability {
    /// The strongest durability the backend offers.
    #[default]
    Default,
    /// Atomic against a process crash, but may be lost on power failure (no fsync).
    Flushed,
    /// Survives power loss once `commit` returns (needs [`Capabilities::durable_commit`]).
    Durable,
}

/// Options for [`Storage::create`]: `CreateOptions::default()` and the `with_` setters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub struct CreateOptions {
    /// Overwrite, create-new or in-place.
    pub mode: WriteMode,
    /// Crash durability wanted from `commit`.
    pub durability: Durability,
    /// The container's planned total length, when known (the writer always knows it):
    /// backends use it to size parts or preallocate.
    pub expected_len: Option<u64>,
}

impl CreateOptions {
    /// Sets the write mode.
    #[must_use]
    pub fn with_mode(mut self, mode: WriteMode) -> Self {
        self.mode = mode;
        self
    }

    /// Sets the durability.
    #[must_use]
    pub fn with_durability(mut self, durability: Durability) -> Self {
        self.durability = durability;
        self
    }

    /// Sets the expected total length.
    #[must_use]
    pub fn with_expected_len(mut self, len: u64) -> Self {
        self.expected_len = Some(len);
        self
    }
}

/// What a backend promises beyond the base contract. Each declared capability is tested by
/// the conformance suite; asking for an undeclared one fails with [`ErrorKind::Unsupported`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub struct Capabilities {
    /// [`WriteMode::CreateNew`] is race-free: of two concurrent creators exactly one wins.
    pub atomic_create_new: bool,
    /// [`Durability::Durable`] commits survive power loss.
    pub durable_commit: bool,
    /// [`Source::bytes`] returns host memory without copying (memory, mmap).
    pub zero_copy_reads: bool,
    /// [`WriteMode::InPlace`] is supported.
    pub in_place_writes: bool,
    /// [`Storage::pending`] lists unfinished writes and [`Storage::clean_pending`] removes
    /// those of dead writers.
    pub pending_listing: bool,
    /// [`Storage::list`] lists committed containers.
    pub listing: bool,
}

impl Capabilities {
    /// No capability beyond the base contract.
    pub const NONE: Self = Self {
        atomic_create_new: false,
        durable_commit: false,
        zero_copy_reads: false,
        in_place_writes: false,
        pending_listing: false,
        listing: false,
    };

    /// Declares race-free create-new.
    #[must_use]
    pub const fn with_atomic_create_new(mut self) -> Self {
        self.atomic_create_new = true;
        self
    }

    /// Declares power-loss durable commits.
    #[must_use]
    pub const fn with_durable_commit(mut self) -> Self {
        self.durable_commit = true;
        self
    }

    /// Declares zero-copy reads.
    #[must_use]
    pub const fn with_zero_copy_reads(mut self) -> Self {
        self.zero_copy_reads = true;
        self
    }

    /// Declares in-place writes.
    #[must_use]
    pub const fn with_in_place_writes(mut self) -> Self {
        self.in_place_writes = true;
        self
    }

    /// Declares listing of unfinished writes.
    #[must_use]
    pub const fn with_pending_listing(mut self) -> Self {
        self.pending_listing = true;
        self
    }

    /// Declares listing of committed containers.
    #[must_use]
    pub const fn with_listing(mut self) -> Self {
        self.listing = true;
        self
    }

    /// Fails with [`ErrorKind::Unsupported`] when `options` ask for something undeclared.
    ///
    /// # Errors
    /// As described.
    pub fn check(&self, options: &CreateOptions) -> Result<()> {
        let missing = match (options.mode, options.durability) {
            (WriteMode::CreateNew, _) if !self.atomic_create_new => "create-new writes",
            (WriteMode::InPlace, _) if !self.in_place_writes => "in-place writes",
            (_, Durability::Durable) if !self.durable_commit => "durable commits",
            _ => return Ok(()),
        };
        Err(Error::unsupported(format!(
            "this storage does not offer {missing}"
        )))
    }
}

/// A storage backend: opens sinks and sources by key.
///
/// Keys are `/`-separated relative paths (see [`validate_key`]). The trait is object safe so a
/// backend can be chosen at run time (`Box<dyn Storage>`).
///
/// # Contract
/// - [`create`](Self::create) checks `options` against [`capabilities`](Self::capabilities)
///   and returns a [`Sink`] with the sink contract; with [`WriteMode::CreateNew`] it may fail
///   early with [`ErrorKind::AlreadyExists`], and the sink's `commit` must fail so if the key
///   was taken meanwhile.
/// - [`open`](Self::open) returns a [`Source`] over the container committed last at the key,
///   [`ErrorKind::NotFound`] if none. A source keeps reading what it opened: a later commit or
///   delete never mixes into it.
/// - [`delete`](Self::delete) removes the key; [`ErrorKind::NotFound`] if absent.
/// - [`pending`](Self::pending) lists writes started and neither committed nor aborted
///   that the backend can see (scratch files of dead writers, staged uploads), and
///   [`clean_pending`](Self::clean_pending) removes those whose writer is gone, when the
///   backend declares [`Capabilities::pending_listing`]; otherwise both fail with
///   [`ErrorKind::Unsupported`].
/// - [`list`](Self::list) returns exactly the keys `open` would find under a prefix, with
///   their lengths, when the backend declares [`Capabilities::listing`]: never a write in
///   progress, an aborted one, a scratch file or a staged upload.
pub trait Storage: Send + Sync + fmt::Debug {
    /// What this backend promises.
    fn capabilities(&self) -> Capabilities;

    /// Opens a sink that will publish a container at `key`.
    ///
    /// # Errors
    /// [`ErrorKind::Unsupported`], [`ErrorKind::AlreadyExists`], [`ErrorKind::InvalidInput`]
    /// for a bad key, or the backend's error.
    fn create(&self, key: &str, options: &CreateOptions) -> Result<Box<dyn Sink>>;

    /// Opens the container at `key` for reading.
    ///
    /// # Errors
    /// [`ErrorKind::NotFound`], or the backend's error.
    fn open(&self, key: &str) -> Result<Arc<dyn Source>>;

    /// Removes the container at `key`.
    ///
    /// # Errors
    /// [`ErrorKind::NotFound`], or the backend's error.
    fn delete(&self, key: &str) -> Result<()>;

    /// Keys of unfinished writes.
    ///
    /// # Errors
    /// [`ErrorKind::Unsupported`] unless the backend declares
    /// [`Capabilities::pending_listing`].
    fn pending(&self) -> Result<Vec<String>> {
        Err(Error::unsupported(
            "this storage cannot list unfinished writes",
        ))
    }

    /// Removes what dead writers left behind (scratch files of killed processes, abandoned
    /// uploads) and returns what it removed. Writes still in progress are left alone.
    ///
    /// # Errors
    /// [`ErrorKind::Unsupported`] unless the backend declares
    /// [`Capabilities::pending_listing`].
    fn clean_pending(&self) -> Result<Vec<String>> {
        Err(Error::unsupported(
            "this storage cannot clean unfinished writes",
        ))
    }

    /// The committed containers under `prefix`, sorted by key: every key that is `prefix`
    /// followed by `/` and more (any depth), or every key for an empty prefix. A key is
    /// listed exactly when [`open`](Self::open) would find it, with the length its source
    /// would have.
    ///
    /// # Errors
    /// [`ErrorKind::InvalidInput`] for a prefix that is not a valid key;
    /// [`ErrorKind::Unsupported`] unless the backend declares [`Capabilities::listing`]; the
    /// backend's error.
    fn list(&self, prefix: &str) -> Result<Vec<Listed>> {
        let _ = prefix;
        Err(Error::unsupported(
            "this storage cannot list its containers",
        ))
    }
}

/// A committed container, as [`Storage::list`] finds it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Listed {
    /// Its key.
    pub key: String,
    /// Its length in bytes.
    pub len: u64,
}

/// Writes `body`, a small file such as an index or a commit record, to `key` with create-new:
/// it appears whole, and only if the key was free.
///
/// # Errors
/// [`ErrorKind::AlreadyExists`] when the key is taken; the storage's errors, naming the key
/// and the operation.
pub fn write_new<S: Storage + ?Sized>(
    storage: &S,
    key: &str,
    body: &[u8],
    durability: Durability,
) -> Result<()> {
    let options = CreateOptions::default()
        .with_mode(WriteMode::CreateNew)
        .with_durability(durability)
        .with_expected_len(body.len() as u64);
    let mut sink = storage
        .create(key, &options)
        .map_err(|e| e.with_operation("create").with_key(key))?;
    sink.write(body)
        .map_err(|e| e.with_operation("write").with_key(key))?;
    sink.commit()
        .map_err(|e| e.with_operation("commit").with_key(key))
}

/// Checks a listing prefix: empty, or a valid key.
///
/// # Errors
/// [`ErrorKind::InvalidInput`] as [`validate_key`] says.
pub fn validate_prefix(prefix: &str) -> Result<()> {
    if prefix.is_empty() {
        Ok(())
    } else {
        validate_key(prefix)
    }
}

/// Whether `key` lies under the listing prefix `prefix` (see [`Storage::list`]).
pub fn is_under(key: &str, prefix: &str) -> bool {
    prefix.is_empty()
        || key
            .strip_prefix(prefix)
            .is_some_and(|rest| rest.starts_with('/'))
}

macro_rules! forward_storage {
    ($($pointer:ty),*) => {$(
        /// Forwards to the storage behind the pointer, so `&S`, `Box<dyn Storage>` and
        /// `Arc<dyn Storage>` are storages too.
        impl<S: Storage + ?Sized> Storage for $pointer {
            fn capabilities(&self) -> Capabilities {
                (**self).capabilities()
            }
            fn create(&self, key: &str, options: &CreateOptions) -> Result<Box<dyn Sink>> {
                (**self).create(key, options)
            }
            fn open(&self, key: &str) -> Result<Arc<dyn Source>> {
                (**self).open(key)
            }
            fn delete(&self, key: &str) -> Result<()> {
                (**self).delete(key)
            }
            fn pending(&self) -> Result<Vec<String>> {
                (**self).pending()
            }
            fn clean_pending(&self) -> Result<Vec<String>> {
                (**self).clean_pending()
            }
            fn list(&self, prefix: &str) -> Result<Vec<Listed>> {
                (**self).list(prefix)
            }
        }
    )*};
}
forward_storage!(&S, Box<S>, Arc<S>);

/// The longest key accepted, in bytes.
pub const MAX_KEY_LEN: usize = 1024;

/// A token no other write uses at the same time, in any process on any machine: this
/// process's id, a per-process counter and a random number (`4242-7-9f0c…`). Writers and
/// backends build the names of staged uploads and shards from it.
pub fn unique_token() -> String {
    use std::hash::BuildHasher;
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let pid = std::process::id();
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    // A fresh random key per call (the standard library seeds each RandomState anew).
    let random = std::collections::hash_map::RandomState::new().hash_one((
        pid,
        n,
        std::time::SystemTime::now(),
    ));
    format!("{pid}-{n}-{random:016x}")
}

/// Checks that `key` is a relative `/`-separated path: non-empty, at most [`MAX_KEY_LEN`]
/// bytes, no empty, `.` or `..` segment, no leading `/`, no backslash or NUL. Every backend
/// applies the same rule so a key means the same thing everywhere.
///
/// # Errors
/// [`ErrorKind::InvalidInput`] naming the key.
pub fn validate_key(key: &str) -> Result<()> {
    let problem = if key.is_empty() {
        Some("is empty")
    } else if key.len() > MAX_KEY_LEN {
        Some("is longer than 1024 bytes")
    } else if key.contains(['\\', '\0']) {
        Some("contains a backslash or NUL")
    } else if key
        .split('/')
        .any(|segment| matches!(segment, "" | "." | ".."))
    {
        Some("has an empty, `.` or `..` segment (or a leading or trailing `/`)")
    } else {
        None
    };
    match problem {
        Some(problem) => Err(Error::invalid(format!("key {problem}")).with_key(key)),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_relative_paths() {
        for good in ["model.bpk", "runs/7/step-100.bpk", "ünïcode/名前"] {
            validate_key(good).unwrap();
        }
        for bad in [
            "",
            "/abs",
            "a//b",
            "a/./b",
            "../up",
            "trail/",
            "back\\slash",
            "nul\0",
        ] {
            assert_eq!(
                validate_key(bad).unwrap_err().kind(),
                ErrorKind::InvalidInput,
                "{bad:?}"
            );
        }
        assert!(validate_key(&"k".repeat(MAX_KEY_LEN + 1)).is_err());
        validate_key(&"k".repeat(MAX_KEY_LEN)).unwrap();
    }

    #[test]
    fn undeclared_capabilities_are_unsupported() {
        let none = Capabilities::NONE;
        for options in [
            CreateOptions::default().with_mode(WriteMode::CreateNew),
            CreateOptions::default().with_mode(WriteMode::InPlace),
            CreateOptions::default().with_durability(Durability::Durable),
        ] {
            assert_eq!(
                none.check(&options).unwrap_err().kind(),
                ErrorKind::Unsupported
            );
        }
        none.check(&CreateOptions::default()).unwrap();
        let all = Capabilities::NONE
            .with_atomic_create_new()
            .with_in_place_writes()
            .with_durable_commit();
        all.check(&CreateOptions::default().with_mode(WriteMode::CreateNew))
            .unwrap();
    }
}
