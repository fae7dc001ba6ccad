//! The file-system seam, for backend authors and test doubles: every file operation the local
//! backend performs, behind one small trait, so the conformance suite's simulated disk can
//! crash the real backend code after any operation, and its faulty file system can fail any
//! one, and check what survives. The real implementation (plain `std::fs`) lives in
//! `weightbay-local`. Saving and loading never need it: nothing in `Storage`, `Writer` or
//! `Reader` names it. docs/ARCHITECTURE.md says why it lives in core.

use std::ffi::OsString;
use std::fmt;
use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};

/// An open file.
///
/// # Contract
/// Writes append at the end of what this handle wrote so far; `write_at` writes at its offset,
/// from any thread, extending the file where it ends past it (a handle written at offsets takes
/// no more appends).
/// `read_at` fills `buf` exactly or fails with `UnexpectedEof`. `sync_all` makes the written
/// bytes (appended or not) and the file's length durable: after it returns they survive power
/// loss (the directory entry does not, until [`FileSystem::sync_dir`]).
pub trait FileHandle: Send + Sync + fmt::Debug {
    /// Appends `data`.
    ///
    /// # Errors
    /// The operating system's error.
    fn write_all(&mut self, data: &[u8]) -> io::Result<()>;

    /// Writes all of `data` at `offset`.
    ///
    /// # Errors
    /// The operating system's error.
    fn write_at(&self, offset: u64, data: &[u8]) -> io::Result<()>;

    /// Reads exactly `buf.len()` bytes at `offset`.
    ///
    /// # Errors
    /// `UnexpectedEof` past the end; the operating system's error.
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()>;

    /// The file's current length.
    ///
    /// # Errors
    /// The operating system's error.
    fn file_len(&self) -> io::Result<u64>;

    /// Makes the written bytes durable (fsync).
    ///
    /// # Errors
    /// The operating system's error.
    fn sync_all(&self) -> io::Result<()>;
}

/// What a directory entry is, as [`FileSystem::list_dir`] finds it: read from the entry itself,
/// so a symlink is never taken for what it points to, except to tell a link to a file (which a
/// read follows) from every other link.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryKind {
    /// A regular file.
    File,
    /// A symlink to a regular file: opened, it reads that file.
    LinkToFile,
    /// A directory (never a symlink to one).
    Directory,
    /// Anything else: a symlink to a directory, a dangling or looping symlink, a socket, a
    /// device. A walk neither descends into it nor lists it.
    Other,
}

/// A directory below a root, held as [`FileSystem::hold_dir_below`] found or made it: a path
/// that names that very directory for as long as this value lives, whatever is renamed or
/// linked in the tree meanwhile, and the directories made for it.
#[derive(Debug)]
pub struct HeldDir {
    path: PathBuf,
    created: Vec<PathBuf>,
    /// The open directory `path` goes through, where it goes through one.
    _handle: Option<File>,
}

impl HeldDir {
    /// The directory named by `path`, which stays its name while `handle` is open (`None`
    /// where `path` is a plain path), with the directories made for it, deepest first.
    pub fn new(path: PathBuf, created: Vec<PathBuf>, handle: Option<File>) -> Self {
        Self {
            path,
            created,
            _handle: handle,
        }
    }

    /// The path to create, rename, link and sync the directory's entries through: on Linux
    /// the open directory's descriptor under `/proc/self/fd`, so no symlink swapped in on the
    /// way from the root is followed; elsewhere the plain path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The directories made for it (the root's missing ancestors included), as plain paths,
    /// deepest first: each must be made durable in its parent, and removed if the write they
    /// were made for is abandoned.
    pub fn created(&self) -> &[PathBuf] {
        &self.created
    }
}

/// [`FileSystem::hold_dir_below`] for a file system with no symlinks (a simulated disk): the
/// directory `root/relative`, made with [`FileSystem::create_dir_all`] and named by its plain
/// path; the missing ones are found with [`FileSystem::list_dir`].
///
/// # Errors
/// As `create_dir_all`.
pub fn hold_dir_plainly(
    fs: &(impl FileSystem + ?Sized),
    root: &Path,
    relative: &Path,
) -> io::Result<HeldDir> {
    let dir = root.join(relative);
    let created = dir
        .ancestors()
        .take_while(|ancestor| fs.list_dir(ancestor).is_err())
        .map(Path::to_path_buf)
        .collect();
    fs.create_dir_all(&dir)?;
    Ok(HeldDir::new(dir, created, None))
}

/// Directory and file operations, named after their `std::fs` counterparts.
///
/// # Contract
/// `rename`, `rename_no_replace`, `hard_link` and `remove_file` change directory entries
/// atomically but not durably: only `sync_dir` of the parent makes them survive power loss.
/// `hard_link` and `rename_no_replace` fail with `AlreadyExists` when `to` exists, checked and
/// taken in one step, so that of two callers racing for one name exactly one wins.
/// `create_new` fails with `AlreadyExists` when `path` exists.
/// [`remove_file_below`](Self::remove_file_below) and
/// [`remove_dir_below`](Self::remove_dir_below) never remove anything through a symlink: each
/// directory between `root` and the removed name is opened without following links, from the
/// handle of the one above it, so a path with a symlink on it fails, even one swapped in after
/// a listing; the removed name itself, a symlink included, is removed as a name.
/// [`hold_dir_below`](Self::hold_dir_below) walks down from `root` the same way, so entries
/// created through the directory it holds are never created through a symlink below `root`.
pub trait FileSystem: Send + Sync + fmt::Debug {
    /// Creates `path` for writing; fails if it exists.
    ///
    /// # Errors
    /// `AlreadyExists`; the operating system's error.
    fn create_new(&self, path: &Path) -> io::Result<Box<dyn FileHandle>>;

    /// Opens `path` for writing, creating or truncating it; a symlink at `path` itself is
    /// refused, not followed (the directories above it are the caller's to hold, see
    /// [`hold_dir_below`](Self::hold_dir_below)).
    ///
    /// # Errors
    /// The operating system's error (`ELOOP` for a symlink, on Unix).
    fn create_truncate(&self, path: &Path) -> io::Result<Box<dyn FileHandle>>;

    /// Opens `path` for reading.
    ///
    /// # Errors
    /// `NotFound`; the operating system's error.
    fn open(&self, path: &Path) -> io::Result<Box<dyn FileHandle>>;

    /// Atomically replaces `to` with `from`.
    ///
    /// # Errors
    /// The operating system's error.
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()>;

    /// Renames `from` to `to` unless `to` exists, in one atomic step.
    ///
    /// # Errors
    /// `AlreadyExists`; `Unsupported` where the file system cannot do it in one step.
    fn rename_no_replace(&self, from: &Path, to: &Path) -> io::Result<()>;

    /// Makes `to` a second name of `from`; fails if `to` exists.
    ///
    /// # Errors
    /// `AlreadyExists`; `Unsupported` where the file system has no hard links.
    fn hard_link(&self, from: &Path, to: &Path) -> io::Result<()>;

    /// Removes the name `path`.
    ///
    /// # Errors
    /// `NotFound`; the operating system's error.
    fn remove_file(&self, path: &Path) -> io::Result<()>;

    /// Removes the file (or symlink) `relative` below the directory `root`, never through a
    /// symlink (see the trait's contract). `relative` is a path of plain names.
    ///
    /// # Errors
    /// `NotFound`; `InvalidInput` for a `relative` with `..`, `.` or a root; an error naming
    /// the symlink when a directory on the way is one; the operating system's error.
    fn remove_file_below(&self, root: &Path, relative: &Path) -> io::Result<()>;

    /// Removes the directory `relative` below `root` if it is empty, never through a symlink,
    /// as [`remove_file_below`](Self::remove_file_below).
    ///
    /// # Errors
    /// As `remove_file_below`; an error (of any kind) when it is not empty or is no directory.
    fn remove_dir_below(&self, root: &Path, relative: &Path) -> io::Result<()>;

    /// The directory `relative` below `root` (a path of plain names; empty for `root`), made
    /// with its missing parents, and held ([`HeldDir`]): never through a symlink below
    /// `root`, each directory on the way opened or made from the handle of the one above it
    /// without following links, so a path with a symlink on it fails, even one swapped in
    /// meanwhile. `root` itself, and what lies above it, may be symlinks: the caller named it.
    ///
    /// # Errors
    /// `InvalidInput` for a `relative` with `..`, `.` or a root; an error naming the symlink
    /// when a directory on the way is one; the operating system's error.
    fn hold_dir_below(&self, root: &Path, relative: &Path) -> io::Result<HeldDir>;

    /// Makes the entries of directory `dir` durable (fsync of the directory).
    ///
    /// # Errors
    /// The operating system's error.
    fn sync_dir(&self, dir: &Path) -> io::Result<()>;

    /// The names in directory `dir`, each with what it is.
    ///
    /// # Errors
    /// The operating system's error.
    fn list_dir(&self, dir: &Path) -> io::Result<Vec<(OsString, EntryKind)>>;

    /// Creates `dir` and its parents.
    ///
    /// # Errors
    /// The operating system's error.
    fn create_dir_all(&self, dir: &Path) -> io::Result<()>;

    /// Removes the directory `dir` if it is empty.
    ///
    /// # Errors
    /// `NotFound`; an error (of any kind) when it is not empty.
    fn remove_dir(&self, dir: &Path) -> io::Result<()>;

    /// Gives `to` the permission bits of `from`, if `from` exists as a regular file.
    ///
    /// # Errors
    /// The operating system's error.
    fn copy_permissions(&self, from: &Path, to: &Path) -> io::Result<()>;
}
