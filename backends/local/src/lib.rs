//! Local-file storage for weightbay.
//!
//! Saves are atomic and, by default, durable: bytes go to a scratch sibling
//! `<name>.<pid>-<n>.tmp`, which is fsynced, renamed over the destination (or hard-linked for
//! create-new), and the directory is fsynced. A failed or abandoned save removes its scratch
//! file and leaves the destination exactly as it was; `Storage::clean_pending` removes
//! the scratch files of writers that were killed. Sources keep the open file handle, so a file
//! replaced after open keeps reading the old bytes, and one truncated after open gives an
//! error, never a panic. docs/DURABILITY.md states what survives a process kill and a power
//! loss.
//!
//! ```
//! use weightbay::{DType, Reader, Storage, Tensor, Writer};
//! use weightbay_local::LocalStorage;
//!
//! let dir = tempfile::tempdir()?;
//! let storage = LocalStorage::new(dir.path());
//! Writer::new(vec![Tensor::new("w", DType::U8, [3], vec![1, 2, 3])])
//!     .write_to(&storage, "checkpoints/step-1.bpk")?;
//! let reader = Reader::open(storage.open("checkpoints/step-1.bpk")?)?;
//! assert_eq!(reader.read("w")?, vec![1, 2, 3]);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod std_fs;

use std::ffi::OsStr;
use std::fmt;
use std::io;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

pub use std_fs::StdFileSystem;
use weightbay::backend_kit::{
    EntryKind, FileHandle, FileSystem, check_deadline, check_range, check_ranges, check_written,
    lazy_bytes, read_at_parallel, validate_key, validate_prefix,
};
use weightbay::{
    AllocationProperty, Bytes, Capabilities, CreateOptions, Durability, Error, ErrorKind, Listed,
    PendingWrite, PositionedWrite, ReadBack, Result, Sink, Source, Storage, WriteMode,
};

/// The suffix of scratch files; the full name is `<name>.<pid>-<n>.tmp`.
const SCRATCH_SUFFIX: &str = ".tmp";

/// Scratch files made by this process get distinct numbers.
static NEXT_SCRATCH: AtomicU64 = AtomicU64::new(0);

/// Containers as files under a root directory; keys are relative paths below it.
#[derive(Debug, Clone)]
pub struct LocalStorage {
    root: PathBuf,
    fs: Arc<dyn FileSystem>,
}

impl LocalStorage {
    /// Files under `root` (created on the first write).
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self::with_file_system(root, Arc::new(StdFileSystem))
    }

    /// Files under `root` through another file system (the conformance suite's simulated
    /// disk, for crash testing).
    pub fn with_file_system(root: impl Into<PathBuf>, fs: Arc<dyn FileSystem>) -> Self {
        Self {
            root: root.into(),
            fs,
        }
    }

    /// The root directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Creates the scratch file in `parent`, creating `parent` again if a delete of its last
    /// key removed it between this save's `create_dir_all` and now.
    fn create_scratch(&self, parent: &Path, scratch: &Path) -> io::Result<Box<dyn FileHandle>> {
        const ATTEMPTS: usize = 3;
        let mut attempt = 1;
        loop {
            match self.fs.create_new(scratch) {
                Err(e) if e.kind() == io::ErrorKind::NotFound && attempt < ATTEMPTS => {
                    self.fs.create_dir_all(parent)?;
                    attempt += 1;
                }
                result => return result,
            }
        }
    }

    fn path(&self, key: &str) -> Result<PathBuf> {
        validate_key(key)?;
        let file_name = key.rsplit('/').next().unwrap_or(key);
        if scratch_pid(file_name).is_some() {
            return Err(Error::invalid(
                "file names like `<name>.<pid>-<n>.tmp` are reserved for scratch files",
            )
            .with_key(key));
        }
        Ok(self.root.join(key))
    }

    /// The scratch files under `prefix`, each as the write of its key, abandoned when its
    /// writer's process is no longer running. Liveness is read from `/proc`: where there is
    /// none (not Linux), nothing can be proven dead. A writer in another PID namespace looks
    /// dead, so do not share a directory across containers while saving.
    /// Each with the scratch file's path relative to the root.
    fn scratch_files(&self, prefix: &str) -> Result<Vec<(PendingWrite, String)>> {
        validate_prefix(prefix)?;
        let proc_fs = Path::new("/proc/self").exists();
        Ok(self
            .files_under(prefix)?
            .into_iter()
            .filter_map(|(relative, name)| {
                let pid = scratch_pid(&name)?;
                let alive = !proc_fs
                    || pid == std::process::id()
                    || Path::new("/proc").join(pid.to_string()).exists();
                let pending = PendingWrite::new(
                    scratch_target(&relative)?,
                    format!("scratch file {relative} of process {pid}"),
                    !alive,
                );
                Some((pending, relative))
            })
            .collect())
    }

    /// Every file under the directory `prefix` (relative to the root; empty for the root),
    /// with its path relative to the root and its own name; symlinks to files among them,
    /// since a read follows them (a Hugging Face cache links its snapshot files to blobs). A
    /// missing directory has none. The walk never descends into a symlink: a link to a
    /// directory, a loop or a deep tree of links costs one entry each and fails nothing.
    fn files_under(&self, prefix: &str) -> Result<Vec<(String, String)>> {
        let mut found = Vec::new();
        let mut dirs = vec![prefix.to_owned()];
        while let Some(relative) = dirs.pop() {
            let dir = self.root.join(&relative);
            let names = match self.fs.list_dir(&dir) {
                Ok(names) => names,
                // Nothing under the prefix: it is missing, or a file (keys under `a.bpk/`).
                Err(e)
                    if relative == prefix
                        && matches!(
                            e.kind(),
                            io::ErrorKind::NotFound | io::ErrorKind::NotADirectory
                        ) =>
                {
                    return Ok(found);
                }
                // Removed since its parent was listed.
                Err(e) if relative != prefix && e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(Error::io(format!("listing {}", dir.display()), e)),
            };
            for (name, kind) in names {
                // Keys are UTF-8: another name is no container of this storage.
                let Some(name) = name.to_str() else {
                    continue;
                };
                let child = if relative.is_empty() {
                    name.to_owned()
                } else {
                    format!("{relative}/{name}")
                };
                match kind {
                    EntryKind::File | EntryKind::LinkToFile => {
                        found.push((child, name.to_owned()));
                    }
                    EntryKind::Directory => dirs.push(child),
                    EntryKind::Other => {}
                }
            }
        }
        Ok(found)
    }

    /// The committed files under `prefix`: every file but scratch files, with its length.
    fn list_files(&self, prefix: &str) -> Result<Vec<Listed>> {
        validate_prefix(prefix)?;
        let mut listed = Vec::new();
        for (relative, name) in self.files_under(prefix)? {
            if scratch_pid(&name).is_some() || validate_key(&relative).is_err() {
                continue;
            }
            let path = self.root.join(&relative);
            let len = match self.fs.open(&path).and_then(|file| file.file_len()) {
                Ok(len) => len,
                // Deleted or replaced between listing and opening: not there now.
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(io_error("opening", &path, e)),
            };
            listed.push(Listed { key: relative, len });
        }
        listed.sort();
        Ok(listed)
    }
}

/// Removes the directories a save created (deepest first), unless something else now lives
/// in them. Best effort: this runs when a save is abandoned.
fn remove_new_dirs(fs: &dyn FileSystem, new_dirs: &[PathBuf]) {
    for dir in new_dirs {
        if fs.remove_dir(dir).is_err() {
            break;
        }
    }
}

/// The key a scratch file at `relative` (`dir/<name>.<pid>-<n>.tmp`) would have published.
fn scratch_target(relative: &str) -> Option<String> {
    let stem = relative.strip_suffix(SCRATCH_SUFFIX)?;
    let (rest, _counter) = stem.rsplit_once('-')?;
    let (target, _pid) = rest.rsplit_once('.')?;
    Some(target.to_owned())
}

/// The writer pid in a scratch name `<name>.<pid>-<n>.tmp`.
fn scratch_pid(name: &str) -> Option<u32> {
    let stem = name.strip_suffix(SCRATCH_SUFFIX)?;
    let (rest, counter) = stem.rsplit_once('-')?;
    counter.parse::<u64>().ok()?;
    let (_, pid) = rest.rsplit_once('.')?;
    pid.parse().ok()
}

fn io_error(what: &str, path: &Path, e: io::Error) -> Error {
    Error::io(format!("{what} {}", path.display()), e)
}

impl Storage for LocalStorage {
    fn capabilities(&self) -> Capabilities {
        let capabilities = Capabilities::NONE
            .with_atomic_create_new()
            .with_in_place_writes()
            .with_pending_listing()
            .with_listing();
        // Durable needs a directory fsync, which only Unix offers.
        if cfg!(unix) {
            capabilities.with_durable_commit()
        } else {
            capabilities
        }
    }

    fn create(&self, key: &str, options: &CreateOptions) -> Result<Box<dyn Sink>> {
        let path = self.path(key)?;
        self.capabilities().check(options)?;
        let durable = options.durability != Durability::Flushed;
        let parent = path.parent().unwrap_or(&self.root).to_path_buf();
        // Directories this save creates must be made durable too, each in its own parent.
        let new_dirs: Vec<PathBuf> = parent
            .ancestors()
            .take_while(|dir| self.fs.list_dir(dir).is_err())
            .map(Path::to_path_buf)
            .collect();
        self.fs
            .create_dir_all(&parent)
            .map_err(|e| io_error("creating directory", &parent, e))?;
        if options.mode == WriteMode::InPlace {
            let file = self
                .fs
                .create_truncate(&path)
                .map_err(|e| io_error("opening", &path, e))?;
            return Ok(Box::new(InPlaceSink {
                file,
                path,
                durable,
                written: 0,
                expected_len: options.expected_len,
                positioned: false,
                deadline: options.deadline,
            }));
        }
        if options.mode == WriteMode::CreateNew && self.fs.open(&path).is_ok() {
            return Err(Error::new(ErrorKind::AlreadyExists, "file exists").with_key(key));
        }
        let file_name = path
            .file_name()
            .unwrap_or(OsStr::new("container"))
            .to_string_lossy();
        let scratch = parent.join(format!(
            "{file_name}.{}-{}{SCRATCH_SUFFIX}",
            std::process::id(),
            NEXT_SCRATCH.fetch_add(1, Ordering::Relaxed)
        ));
        let file = self.create_scratch(&parent, &scratch).map_err(|e| {
            remove_new_dirs(self.fs.as_ref(), &new_dirs);
            io_error("creating", &scratch, e)
        })?;
        Ok(Box::new(AtomicSink {
            fs: Arc::clone(&self.fs),
            file: Some(file),
            scratch,
            path,
            parent,
            create_new: options.mode == WriteMode::CreateNew,
            durable,
            written: 0,
            expected_len: options.expected_len,
            positioned: false,
            deadline: options.deadline,
            new_dirs,
        }))
    }

    fn open(&self, key: &str) -> Result<Arc<dyn Source>> {
        let path = self.path(key)?;
        let file = self
            .fs
            .open(&path)
            .map_err(|e| io_error("opening", &path, e).with_key(key))?;
        let len = file
            .file_len()
            .map_err(|e| io_error("reading the length of", &path, e))?;
        Ok(Arc::new(LocalSource(Arc::new(OpenFile {
            file,
            len,
            path,
        }))))
    }

    /// Removes the file, then each directory above it that this leaves empty, up to the root,
    /// each removal made durable in its parent: retention and gc would otherwise leave a run's
    /// whole history as empty directories that every listing walks. Nothing is removed
    /// through a symlink below the root: a key whose path has one fails, naming it.
    fn delete(&self, key: &str) -> Result<()> {
        let path = self.path(key)?;
        self.fs
            .remove_file_below(&self.root, Path::new(key))
            .map_err(|e| io_error("removing", &path, e).with_key(key))?;
        let mut dir = Path::new(key).parent();
        loop {
            let absolute = dir.map_or_else(|| self.root.clone(), |d| self.root.join(d));
            self.fs
                .sync_dir(&absolute)
                .map_err(|e| io_error("syncing directory", &absolute, e))?;
            let Some(relative) = dir.filter(|d| !d.as_os_str().is_empty()) else {
                return Ok(());
            };
            // Fails, and so stops the walk, while the directory holds anything: another key,
            // or the scratch file of a save under way (which `create` retries for).
            if self.fs.remove_dir_below(&self.root, relative).is_err() {
                return Ok(());
            }
            dir = relative.parent();
        }
    }

    fn pending(&self, prefix: &str) -> Result<Vec<PendingWrite>> {
        Ok(self
            .scratch_files(prefix)?
            .into_iter()
            .map(|(pending, _)| pending)
            .collect())
    }

    /// Removes the scratch files of writers that are no longer running; those of live
    /// writers, in this process or another, are left alone.
    fn clean_pending(&self, prefix: &str) -> Result<Vec<PendingWrite>> {
        let mut removed = Vec::new();
        for (pending, relative) in self.scratch_files(prefix)? {
            if !pending.abandoned {
                continue;
            }
            let path = self.root.join(&relative);
            match self.fs.remove_file_below(&self.root, Path::new(&relative)) {
                Ok(()) => removed.push(pending),
                // Its writer was not dead after all, or another cleanup was first.
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(Error::io(format!("removing {}", path.display()), e)),
            }
        }
        Ok(removed)
    }

    fn list(&self, prefix: &str) -> Result<Vec<Listed>> {
        self.list_files(prefix)
    }
}

/// Writes a scratch file and publishes it by rename (or hard link, for create-new).
struct AtomicSink {
    fs: Arc<dyn FileSystem>,
    /// `None` once committed.
    file: Option<Box<dyn FileHandle>>,
    scratch: PathBuf,
    path: PathBuf,
    parent: PathBuf,
    create_new: bool,
    durable: bool,
    written: u64,
    expected_len: Option<u64>,
    /// Whether [`Sink::positioned`] was taken: the file's length, not the appends, is then what
    /// was written.
    positioned: bool,
    /// A file write does not block for long, so the deadline is kept between calls.
    deadline: Option<Instant>,
    /// Directories created for this save, deepest first.
    new_dirs: Vec<PathBuf>,
}

impl Sink for AtomicSink {
    fn write(&mut self, data: &[u8]) -> Result<()> {
        check_deadline(self.deadline, "writing")?;
        let file = self
            .file
            .as_mut()
            .ok_or_else(|| Error::new(ErrorKind::Io, "sink already committed"))?;
        file.write_all(data)
            .map_err(|e| io_error("writing", &self.scratch, e).with_offset(self.written))?;
        self.written += data.len() as u64;
        Ok(())
    }

    fn commit(mut self: Box<Self>) -> Result<()> {
        check_deadline(self.deadline, "committing")?;
        let Some(file) = self.file.take() else {
            return Err(Error::new(ErrorKind::Io, "sink already committed"));
        };
        check_written(
            self.expected_len,
            written_len(file.as_ref(), self.positioned, self.written, &self.scratch)?,
        )?;
        if self.durable {
            file.sync_all()
                .map_err(|e| io_error("syncing", &self.scratch, e))?;
        }
        drop(file);
        if self.create_new {
            match self.fs.hard_link(&self.scratch, &self.path) {
                Ok(()) => {
                    // The container is published; the scratch name is only a second link.
                    let _ = self.fs.remove_file(&self.scratch);
                }
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                    return Err(Error::new(
                        ErrorKind::AlreadyExists,
                        format!("{} exists", self.path.display()),
                    ));
                }
                Err(e) if e.kind() == io::ErrorKind::Unsupported => {
                    // No hard links here (some FUSE and network file systems). Looking for the
                    // name and then renaming would let two racing writers both win; only a
                    // rename that refuses an existing name in the same step keeps one winner.
                    match self.fs.rename_no_replace(&self.scratch, &self.path) {
                        Ok(()) => {}
                        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                            return Err(Error::new(
                                ErrorKind::AlreadyExists,
                                format!("{} exists", self.path.display()),
                            ));
                        }
                        Err(e) if e.kind() == io::ErrorKind::Unsupported => {
                            return Err(Error::new(
                                ErrorKind::Unsupported,
                                format!(
                                    "create-new of {}: this file system has neither hard links \
                                     nor a rename that refuses an existing name, so two \
                                     writers could both win; use overwrite here",
                                    self.path.display()
                                ),
                            )
                            .with_source(e));
                        }
                        Err(e) => return Err(io_error("renaming onto", &self.path, e)),
                    }
                }
                Err(e) => return Err(io_error("linking", &self.path, e)),
            }
        } else {
            self.fs
                .copy_permissions(&self.path, &self.scratch)
                .map_err(|e| io_error("copying permissions of", &self.path, e))?;
            self.fs
                .rename(&self.scratch, &self.path)
                .map_err(|e| io_error("renaming onto", &self.path, e))?;
        }
        // Published: from here on, Drop must not remove anything, and an error means the
        // container is visible but may not survive power loss.
        self.scratch = PathBuf::new();
        if self.durable {
            let unsynced = |dir: &Path, e| {
                io_error(
                    "published, but could not make durable the directory",
                    dir,
                    e,
                )
            };
            self.fs
                .sync_dir(&self.parent)
                .map_err(|e| unsynced(&self.parent, e))?;
            for dir in &self.new_dirs {
                if let Some(parent) = dir.parent() {
                    self.fs.sync_dir(parent).map_err(|e| unsynced(parent, e))?;
                }
            }
        }
        Ok(())
    }

    fn positioned(&mut self) -> Option<Box<dyn PositionedWrite + '_>> {
        let expected_len = self.expected_len?;
        self.positioned = true;
        Some(Box::new(FileWrites {
            file: self.file.as_deref()?,
            path: &self.scratch,
            expected_len,
            deadline: self.deadline,
        }))
    }

    fn read_back(&self) -> Option<Arc<dyn ReadBack>> {
        // A handle that cannot be opened means no read-back: the copy then waits for the
        // commit and reads the published file, as it would from any sink.
        let file = self.fs.open(&self.scratch).ok()?;
        Some(Arc::new(ScratchReadBack {
            file,
            path: self.scratch.clone(),
        }))
    }
}

/// How many bytes a local sink wrote: its appends, or where it was written by position, the
/// file's length.
fn written_len(file: &dyn FileHandle, positioned: bool, appended: u64, path: &Path) -> Result<u64> {
    if !positioned {
        return Ok(appended);
    }
    file.file_len()
        .map_err(|e| io_error("reading the length of", path, e))
}

/// A local sink's file written by position ([`Sink::positioned`]).
struct FileWrites<'a> {
    file: &'a dyn FileHandle,
    path: &'a Path,
    expected_len: u64,
    deadline: Option<Instant>,
}

impl PositionedWrite for FileWrites<'_> {
    fn write_at(&self, offset: u64, data: &[u8]) -> Result<()> {
        check_deadline(self.deadline, "writing")?;
        check_range(
            &(offset..offset.saturating_add(data.len() as u64)),
            self.expected_len,
        )?;
        self.file
            .write_at(offset, data)
            .map_err(|e| io_error("writing", self.path, e).with_offset(offset))
    }
}

/// Reads an atomic sink's scratch file through a handle of its own, which keeps reading the
/// same file once it is renamed into place or removed.
#[derive(Debug)]
struct ScratchReadBack {
    file: Box<dyn FileHandle>,
    path: PathBuf,
}

impl ReadBack for ScratchReadBack {
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        // Past what was written, the read ends early: OutOfRange, as `Error::io` maps it.
        self.file
            .read_at(offset, buf)
            .map_err(|e| io_error("reading back", &self.path, e).with_offset(offset))
    }
}

impl Drop for AtomicSink {
    fn drop(&mut self) {
        if !self.scratch.as_os_str().is_empty() {
            self.file = None;
            // Best effort: a scratch file that cannot be removed now is found later by
            // `clean_pending`.
            let _ = self.fs.remove_file(&self.scratch);
            remove_new_dirs(self.fs.as_ref(), &self.new_dirs);
        }
    }
}

/// Writes the destination itself, keeping its inode. The old container is gone as soon as
/// the sink is created; a failure leaves a truncated file.
struct InPlaceSink {
    file: Box<dyn FileHandle>,
    path: PathBuf,
    durable: bool,
    written: u64,
    expected_len: Option<u64>,
    /// As [`AtomicSink::positioned`].
    positioned: bool,
    deadline: Option<Instant>,
}

impl Sink for InPlaceSink {
    fn write(&mut self, data: &[u8]) -> Result<()> {
        check_deadline(self.deadline, "writing")?;
        self.file
            .write_all(data)
            .map_err(|e| io_error("writing", &self.path, e))?;
        self.written += data.len() as u64;
        Ok(())
    }

    fn commit(self: Box<Self>) -> Result<()> {
        check_written(
            self.expected_len,
            written_len(
                self.file.as_ref(),
                self.positioned,
                self.written,
                &self.path,
            )?,
        )?;
        check_deadline(self.deadline, "committing")?;
        if self.durable {
            self.file
                .sync_all()
                .map_err(|e| io_error("syncing", &self.path, e))?;
        }
        Ok(())
    }

    fn positioned(&mut self) -> Option<Box<dyn PositionedWrite + '_>> {
        let expected_len = self.expected_len?;
        self.positioned = true;
        Some(Box::new(FileWrites {
            file: self.file.as_ref(),
            path: &self.path,
            expected_len,
            deadline: self.deadline,
        }))
    }
}

/// The handle a source reads through, with the length seen at open.
#[derive(Debug)]
struct OpenFile {
    file: Box<dyn FileHandle>,
    len: u64,
    path: PathBuf,
}

impl Source for OpenFile {
    fn len(&self) -> u64 {
        self.len
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        check_range(&(offset..offset.saturating_add(buf.len() as u64)), self.len)?;
        self.file.read_at(offset, buf).map_err(|e| {
            let message = if e.kind() == io::ErrorKind::UnexpectedEof {
                format!("{} shrank after it was opened", self.path.display())
            } else {
                format!("reading {}", self.path.display())
            };
            Error::new(ErrorKind::Io, message)
                .with_offset(offset)
                .with_source(e)
        })
    }
}

/// A file opened for reading: `read_at` through the held handle (never reopened by path);
/// `bytes` are lazy file regions over that handle.
struct LocalSource(Arc<OpenFile>);

impl fmt::Debug for LocalSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("LocalSource").field(&self.0.path).finish()
    }
}

impl Source for LocalSource {
    fn len(&self) -> u64 {
        self.0.len
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        self.0.read_at(offset, buf)
    }

    fn bytes(&self, range: Range<u64>) -> Result<Bytes> {
        lazy_bytes(Arc::clone(&self.0) as _, range, AllocationProperty::File)
    }

    /// `pread`s straight into the returned buffers, the ranges shared out over a few threads
    /// ([`read_at_parallel`]).
    fn fetch(&self, ranges: &[Range<u64>]) -> Result<Vec<Bytes>> {
        check_ranges(ranges, self.len())?;
        let mut out: Vec<Bytes> = ranges
            .iter()
            .map(|range| {
                let len = usize::try_from(range.end - range.start).map_err(|_| {
                    Error::new(ErrorKind::OutOfRange, "range does not fit in memory")
                })?;
                Bytes::zeroed(len, 64)
            })
            .collect::<Result<_>>()?;
        let mut jobs: Vec<(u64, &mut [u8])> = out
            .iter_mut()
            .zip(ranges)
            .map(|(buf, range)| Ok((range.start, buf.make_mut()?)))
            .collect::<Result<_>>()?;
        read_at_parallel(self.0.as_ref(), &mut jobs)?;
        Ok(out)
    }
}
