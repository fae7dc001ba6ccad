//! The storage plugin traits: a [`Storage`] opens [`Sink`]s to write containers and
//! [`Source`]s to read them. The contracts here are what the conformance suite tests.

use std::fmt;
use std::ops::Range;
use std::sync::Arc;

use crate::capabilities::Capabilities;
use crate::options::CreateOptions;
use crate::ranges::{check_jobs, check_range, check_ranges};
use crate::{Bytes, Error, ErrorKind, Result};

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
/// - [`read_in_pieces`](Self::read_in_pieces) hands the bytes `read_at` would give to its
///   callback in pieces, in order, each with its offset, the pieces covering the range exactly.
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

    /// Reads each job's range, `offset..offset + buf.len()`, into its buffer: what
    /// [`fetch`](Self::fetch) reads, landed in memory the caller chose (a framework tensor's
    /// own storage, a reused buffer) rather than memory the backend allocates, so the bytes are
    /// written once. Every range is checked before anything is read. The default reads the
    /// jobs one by one with [`read_at`](Self::read_at); a backend whose reads pay a round trip
    /// coalesces and parallelizes them as its `fetch` does.
    ///
    /// # Errors
    /// [`ErrorKind::OutOfRange`] when any range is past the end, and then nothing is read; the
    /// backend's error otherwise (the buffers then hold some bytes, not all).
    fn fetch_into(&self, jobs: &mut [(u64, &mut [u8])]) -> Result<()> {
        check_jobs(jobs, self.len())?;
        jobs.iter_mut()
            .try_for_each(|(offset, buf)| self.read_at(*offset, buf))
    }

    /// How many bytes a reader going through the container in order gains from asking
    /// [`fetch`](Self::fetch) for at once: 0 (the default) where a range costs the same alone
    /// (memory, a map, a local file); an object store's fetch budget, since each request pays
    /// a round trip. Above 0, a copy into a sink that takes writes by position reads regions
    /// in parallel through [`read_in_pieces`](Self::read_in_pieces), as many at once as the
    /// budget holds 16 MiB windows.
    fn fetch_ahead(&self) -> u64 {
        0
    }

    /// Reads `range` and hands it to `each` a piece at a time, in order, each piece with the
    /// offset of its first byte: how a copy streams a long range without holding it, so one
    /// request can carry a whole region of an object (each request pays a round trip before
    /// its first byte). An error from `each` stops the read and is returned. The default reads
    /// pieces with [`read_at`](Self::read_at) into one buffer: of at most [`PIECE_LEN`], or,
    /// from a source that gains from reading ahead ([`fetch_ahead`](Self::fetch_ahead) above
    /// 0), of at most 16 MiB, the window a copy in order reads, so a backend that overrides
    /// only `read_at` pays no more round trips than before; an object store streams one
    /// request's body.
    ///
    /// # Errors
    /// [`ErrorKind::OutOfRange`] when the range is past the end, and then nothing is read;
    /// the backend's error; `each`'s.
    fn read_in_pieces(
        &self,
        range: Range<u64>,
        each: &mut dyn FnMut(u64, &[u8]) -> Result<()>,
    ) -> Result<()> {
        check_range(&range, self.len())?;
        let piece_len = if self.fetch_ahead() > 0 {
            REMOTE_WINDOW
        } else {
            PIECE_LEN
        };
        // At most 16 MiB, so it fits in usize.
        let mut buffer = vec![0; (range.end - range.start).min(piece_len) as usize];
        let mut offset = range.start;
        while offset < range.end {
            let piece = &mut buffer[..(range.end - offset).min(piece_len) as usize];
            self.read_at(offset, piece)?;
            each(offset, piece)?;
            offset += piece.len() as u64;
        }
        Ok(())
    }
}

/// The window a reader in order reads from a source that gains from reading ahead (an object
/// store; `backend_kit::read_in_order`): one request each, the object-store backend's default
/// request length. Also the most [`Source::read_in_pieces`] reads at once by default from such
/// a source, so a backend that overrides only `read_at` pays no more requests for a copy.
pub(crate) const REMOTE_WINDOW: u64 = 16 << 20;

/// The most bytes [`Source::read_in_pieces`] hands over at once by default from a source that
/// does not read ahead, and what a backend streaming a response gathers its chunks into before
/// handing them over: a write per piece, so one per megabyte rather than one per network
/// chunk.
pub const PIECE_LEN: u64 = 1 << 20;

/// `range` read with `read_at` into fresh memory.
fn read_resident<S: Source + ?Sized>(source: &S, range: &Range<u64>) -> Result<Bytes> {
    check_range(range, source.len())?;
    let len = usize::try_from(range.end - range.start)
        .map_err(|_| Error::new(ErrorKind::OutOfRange, "range does not fit in memory"))?;
    let mut bytes = Bytes::zeroed(len, 64)?;
    source.read_at(range.start, bytes.make_mut()?)?;
    Ok(bytes)
}

/// A sequential destination for one container's bytes.
///
/// # Contract
/// - Bytes appear at the key only through [`commit`](Self::commit), all at once: before it,
///   readers of the key see what was there before (or nothing).
/// - Dropping a sink without committing aborts it: the key is exactly as it was and nothing
///   is left behind (no scratch file, no pending upload).
/// - A sink created with a [`CreateOptions::deadline`] that cannot finish a write or its
///   commit by then fails with [`ErrorKind::TimedOut`], the key as it was.
/// - After any error from [`write`](Self::write) or [`pad`](Self::pad) the caller drops the
///   sink. A failed `commit` leaves the key as it was, with one exception a backend must name
///   in the error: the container was published but could not be made durable (a directory
///   fsync that failed after the rename).
/// - The one mode outside these rules is [`WriteMode::InPlace`](crate::WriteMode::InPlace),
///   which the caller chooses knowing that it writes the destination itself: the old
///   container is gone once the sink is created, and a dropped or failed in-place sink leaves
///   a partial file.
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
        pad_with_zeros(self, len)
    }

    /// Publishes everything written, atomically.
    ///
    /// # Errors
    /// [`ErrorKind::AlreadyExists`] when the sink was opened create-new and the key was taken
    /// meanwhile; the backend's error otherwise. The key is then as it was.
    fn commit(self: Box<Self>) -> Result<()>;

    /// A reader of the bytes written so far, for a sink whose bytes can be read before they
    /// are published (a scratch file, a buffer in memory): how a copy of a container to a
    /// slower storage starts while the container is still being written, instead of after its
    /// commit. `None`, the default, where they cannot (an upload in flight).
    fn read_back(&self) -> Option<Arc<dyn ReadBack>> {
        None
    }

    /// The sink's container to write by position, from several threads at once, for a sink
    /// created with an expected length whose bytes can land anywhere before the commit (a
    /// scratch file, a buffer in memory): how a copy writes each region of its source as it
    /// arrives, on the thread that read it, instead of waiting for the regions before it.
    /// `None`, the default, where they cannot (an upload takes its bytes in order) or the
    /// sink has no expected length. The writer borrows the sink: it is dropped before the
    /// commit. See [`PositionedWrite`] for what commit then publishes.
    fn positioned(&mut self) -> Option<Box<dyn PositionedWrite + '_>> {
        None
    }
}

/// A [`Sink`]'s container written by position ([`Sink::positioned`]).
///
/// # Contract
/// - [`write_at`](Self::write_at) puts `data` at `offset..offset + data.len()` of the
///   container, from any thread and in any order; a range past the sink's expected length
///   fails with [`ErrorKind::OutOfRange`] and writes nothing.
/// - Appends ([`Sink::write`]) come first: a caller that takes the writer appends no more,
///   and writes each byte once, by one of the two.
/// - The commit publishes a container of the expected length or fails: where the furthest
///   byte written (by either) is short of it, the key is left as it was (for an atomic sink;
///   an in-place one has truncated it already). Bytes below it that nothing wrote read as
///   zero; an empty write extends nothing.
/// - An error from `write_at` is the sink's error, as one from [`Sink::write`]: the caller
///   drops the sink, which leaves the key as it was.
pub trait PositionedWrite: Send + Sync {
    /// Writes `data` at `offset`.
    ///
    /// # Errors
    /// [`ErrorKind::OutOfRange`] past the expected length; the backend's error.
    fn write_at(&self, offset: u64, data: &[u8]) -> Result<()>;
}

/// The bytes a [`Sink`] has written, read while it goes on writing ([`Sink::read_back`]).
///
/// # Contract
/// - [`read_at`](Self::read_at) fills all of `buf` from `offset` with the bytes the sink's
///   writes (and pads) put there, for every byte of a write that had returned `Ok` before the
///   read began, from any thread.
/// - Those bytes stay readable, unchanged, for as long as the reader lives: after the sink
///   has written more, committed, failed or been dropped, and whatever is later committed at
///   its key.
/// - A range past what was written fails with [`ErrorKind::OutOfRange`] or returns unspecified
///   bytes; it never panics.
pub trait ReadBack: Send + Sync + fmt::Debug {
    /// Reads `buf.len()` bytes written at `offset`.
    ///
    /// # Errors
    /// [`ErrorKind::OutOfRange`] past what was written; the backend's error.
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<()>;
}

/// A storage backend: opens sinks and sources by key.
///
/// Keys are `/`-separated relative paths (see
/// [`validate_key`](crate::backend_kit::validate_key)). The trait is object safe so a backend
/// can be chosen at run time (`Box<dyn Storage>`).
///
/// # Contract
/// - [`create`](Self::create) checks `options` against [`capabilities`](Self::capabilities)
///   and returns a [`Sink`] with the sink contract; with
///   [`WriteMode::CreateNew`](crate::WriteMode::CreateNew) it may fail early with
///   [`ErrorKind::AlreadyExists`], and the sink's `commit` must fail so if the key was taken
///   meanwhile.
/// - [`open`](Self::open) returns a [`Source`] over the container committed last at the key,
///   [`ErrorKind::NotFound`] if none. A source keeps reading what it opened: a later commit or
///   delete never mixes into it.
/// - [`delete`](Self::delete) removes the key; [`ErrorKind::NotFound`] if absent.
/// - [`pending`](Self::pending) lists the writes under a prefix that were started and
///   neither committed nor aborted and that the backend can see (scratch files, staged and
///   multipart uploads), each saying whether its writer is known to be gone, and
///   [`clean_pending`](Self::clean_pending) removes exactly those whose writer is gone, when
///   the backend declares [`Capabilities::pending_listing`]; otherwise both fail with
///   [`ErrorKind::Unsupported`]. A write in progress is never removed.
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

    /// The unfinished writes under `prefix` (every one for an empty prefix): a key is under
    /// it as for [`list`](Self::list).
    ///
    /// # Errors
    /// [`ErrorKind::Unsupported`] unless the backend declares
    /// [`Capabilities::pending_listing`]; [`ErrorKind::InvalidInput`] for a bad prefix.
    fn pending(&self, prefix: &str) -> Result<Vec<PendingWrite>> {
        let _ = prefix;
        Err(Error::unsupported(
            "this storage cannot list unfinished writes",
        ))
    }

    /// Removes what dead writers left under `prefix` (scratch files of killed processes,
    /// abandoned uploads): the [`pending`](Self::pending) writes that are
    /// [`abandoned`](PendingWrite::abandoned), which it returns, with the records it refused
    /// to act on ([`PendingWrite::refused`]: left untouched, so one listing tells a caller
    /// both). Writes still in progress are left alone.
    ///
    /// # Errors
    /// [`ErrorKind::Unsupported`] unless the backend declares
    /// [`Capabilities::pending_listing`]; the backend's error.
    fn clean_pending(&self, prefix: &str) -> Result<Vec<PendingWrite>> {
        let _ = prefix;
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

    /// What lies under `prefix` (as for [`list`](Self::list)) that no container can be, for a
    /// listing to report rather than hide, sorted by name: a symlink to a directory or to
    /// nothing, a special file, a name that is no valid key (local files); an object whose
    /// key has a `.`, `..` or empty segment (object stores). Anyone with write access to the
    /// storage can plant one, so weightbay never reads, walks into or deletes what this
    /// returns. A storage where nothing can be foreign (memory) finds none, the default, and
    /// says so by answering it.
    ///
    /// # Errors
    /// As [`list`](Self::list).
    fn list_foreign(&self, prefix: &str) -> Result<Vec<ForeignEntry>> {
        let _ = prefix;
        Ok(Vec::new())
    }
}

/// A write started and neither committed nor aborted, as [`Storage::pending`] finds it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[non_exhaustive]
pub struct PendingWrite {
    /// The key the write would publish.
    pub key: String,
    /// What holds its bytes, in the backend's terms: a scratch file (its path under the
    /// root), a staged object, a multipart upload (its id and path).
    pub held_by: String,
    /// Whether its writer is known to be gone (its process ended, or it stopped renewing its
    /// record for longer than the backend allows), so [`Storage::clean_pending`] removes it.
    pub abandoned: bool,
    /// Why the backend refuses to act on what it found: a record naming paths that the
    /// backend's own naming rule does not derive from where the record lies (forged, or
    /// written by another tool), or a staged object outside the backend's staging layout.
    /// Nothing a refused record names is touched, and it is never abandoned.
    pub refused: Option<String>,
}

impl PendingWrite {
    /// A pending write of `key`, held by `held_by`.
    pub fn new(key: impl Into<String>, held_by: impl Into<String>, abandoned: bool) -> Self {
        Self {
            key: key.into(),
            held_by: held_by.into(),
            abandoned,
            refused: None,
        }
    }

    /// A record or object at `held_by` that the backend will not act on, and why.
    pub fn refused(
        key: impl Into<String>,
        held_by: impl Into<String>,
        why: impl Into<String>,
    ) -> Self {
        Self {
            key: key.into(),
            held_by: held_by.into(),
            abandoned: false,
            refused: Some(why.into()),
        }
    }
}

impl fmt::Display for PendingWrite {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.key, self.held_by)?;
        if self.abandoned {
            f.write_str(", its writer is gone")?;
        }
        if let Some(why) = &self.refused {
            write!(f, ", REFUSED and left untouched: {why}")?;
        }
        Ok(())
    }
}

/// Writes `len` zero bytes through `sink`'s [`write`](Sink::write), 4 KiB at a time: what
/// [`Sink::pad`] does unless a sink does better, and what a wrapper that must see the padding
/// as bytes (to count or checksum them) names as its `pad`.
///
/// # Errors
/// As [`Sink::write`].
pub fn pad_with_zeros<S: Sink + ?Sized>(sink: &mut S, len: u64) -> Result<()> {
    const ZEROS: [u8; 4096] = [0; 4096];
    let mut left = len;
    while left > 0 {
        let step = left.min(ZEROS.len() as u64);
        sink.write(&ZEROS[..step as usize])?;
        left -= step;
    }
    Ok(())
}

/// A committed container, as [`Storage::list`] finds it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Listed {
    /// Its key.
    pub key: String,
    /// Its length in bytes.
    pub len: u64,
}

/// An entry under a prefix that no container can be, as [`Storage::list_foreign`] finds it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[non_exhaustive]
pub struct ForeignEntry {
    /// Its name as stored, relative to the storage's root: key-shaped, but no valid key
    /// (and, being planted, not to be printed unescaped).
    pub name: String,
    /// What it is, in the backend's terms ("a symlink or special file, not followed").
    pub what: String,
}

impl ForeignEntry {
    /// The entry `name`, which is `what`.
    pub fn new(name: impl Into<String>, what: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            what: what.into(),
        }
    }
}

macro_rules! storage_through_pointers {
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
            fn pending(&self, prefix: &str) -> Result<Vec<PendingWrite>> {
                (**self).pending(prefix)
            }
            fn clean_pending(&self, prefix: &str) -> Result<Vec<PendingWrite>> {
                (**self).clean_pending(prefix)
            }
            fn list(&self, prefix: &str) -> Result<Vec<Listed>> {
                (**self).list(prefix)
            }
            fn list_foreign(&self, prefix: &str) -> Result<Vec<ForeignEntry>> {
                (**self).list_foreign(prefix)
            }
        }
    )*};
}
storage_through_pointers!(&S, Box<S>, Arc<S>);
