//! The sink of an atomic save: a scratch file, fsynced, then renamed over the destination (or
//! hard-linked, for create-new), the directory fsynced; dropped unfinished, it removes its
//! scratch file and the directories it made.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use weightbay::backend_kit::{FileHandle, FileSystem, HeldDir, check_deadline, check_written};
use weightbay::{Error, ErrorKind, PositionedWrite, ReadBack, Result, Sink};

use crate::file_writes::{FileWrites, io_error, written_len};

/// Writes a scratch file and publishes it by rename (or hard link, for create-new), both in
/// the directory it holds, so no symlink swapped in on the way from the root is followed.
pub(crate) struct AtomicSink {
    pub(crate) fs: Arc<dyn FileSystem>,
    /// The storage's root, which the directories made for this save lie below.
    pub(crate) root: PathBuf,
    /// The destination's directory, held since the scratch file was made in it.
    pub(crate) dir: HeldDir,
    /// `None` once committed.
    pub(crate) file: Option<Box<dyn FileHandle>>,
    /// The scratch file and the destination as the caller knows them, for messages; the
    /// operations go through [`at`](Self::at).
    pub(crate) scratch: PathBuf,
    pub(crate) path: PathBuf,
    pub(crate) create_new: bool,
    pub(crate) durable: bool,
    pub(crate) written: u64,
    pub(crate) expected_len: Option<u64>,
    /// Whether [`Sink::positioned`] was taken: the file's length, not the appends, is then what
    /// was written.
    pub(crate) positioned: bool,
    /// A file write does not block for long, so the deadline is kept between calls.
    pub(crate) deadline: Option<Instant>,
}

impl AtomicSink {
    /// Where the entry `shown` (the scratch file or the destination) is reached: its name in
    /// the held directory.
    pub(crate) fn at(&self, shown: &Path) -> PathBuf {
        self.dir.path().join(shown.file_name().unwrap_or_default())
    }
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
            match self
                .fs
                .hard_link(&self.at(&self.scratch), &self.at(&self.path))
            {
                Ok(()) => {
                    // The container is published; the scratch name is only a second link.
                    let _ = self.fs.remove_file(&self.at(&self.scratch));
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
                    match self
                        .fs
                        .rename_no_replace(&self.at(&self.scratch), &self.at(&self.path))
                    {
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
            let (scratch, path) = (self.at(&self.scratch), self.at(&self.path));
            self.fs
                .copy_permissions(&path, &scratch)
                .map_err(|e| io_error("copying permissions of", &self.path, e))?;
            self.fs
                .rename(&scratch, &path)
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
            let parent = self.path.parent().unwrap_or(&self.root);
            self.fs
                .sync_dir(self.dir.path())
                .map_err(|e| unsynced(parent, e))?;
            for dir in self.dir.created() {
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
        let file = self.fs.open(&self.at(&self.scratch)).ok()?;
        Some(Arc::new(ScratchReadBack {
            file,
            path: self.scratch.clone(),
        }))
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
            let _ = self.fs.remove_file(&self.at(&self.scratch));
            remove_new_dirs(self.fs.as_ref(), &self.root, &self.dir);
        }
    }
}

/// Removes the directories made for `dir` (deepest first), unless something else now lives in
/// them; those below `root` never through a symlink. Best effort: this runs when a save is
/// abandoned.
pub(crate) fn remove_new_dirs(fs: &dyn FileSystem, root: &Path, dir: &HeldDir) {
    for made in dir.created() {
        let removed = match made.strip_prefix(root) {
            Ok(relative) if !relative.as_os_str().is_empty() => fs.remove_dir_below(root, relative),
            _ => fs.remove_dir(made),
        };
        if removed.is_err() {
            break;
        }
    }
}
