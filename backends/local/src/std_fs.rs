//! The real file system behind the seam: plain `std::fs`.

use std::ffi::OsString;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::Path;
#[cfg(target_os = "linux")]
use std::sync::atomic::{AtomicU64, Ordering};

use weightbay::backend_kit::{EntryKind, FileHandle, FileSystem, HeldDir};

/// `std::fs`, unchanged.
#[derive(Debug, Clone, Copy, Default)]
pub struct StdFileSystem;

/// A file, and (on Linux) how much of it was written since writeback was last started.
#[derive(Debug)]
struct StdFile {
    file: File,
    written: u64,
    unflushed: u64,
    /// Bytes written by position since their writeback was last started, from any thread.
    #[cfg(target_os = "linux")]
    unflushed_at: AtomicU64,
}

/// Every this many bytes, writeback of what was written is started in the background, so the
/// final fsync finds little left to do and disk and CPU work overlap.
#[cfg(target_os = "linux")]
const WRITEBACK_EVERY: u64 = 32 * 1024 * 1024;

impl StdFile {
    fn new(file: File) -> Self {
        Self {
            file,
            written: 0,
            unflushed: 0,
            #[cfg(target_os = "linux")]
            unflushed_at: AtomicU64::new(0),
        }
    }

    /// Starts (without waiting for) writeback of the bytes written since the last call.
    #[cfg(target_os = "linux")]
    fn start_writeback(&mut self) {
        use std::os::fd::AsRawFd;
        if self.unflushed < WRITEBACK_EVERY {
            return;
        }
        let start = self.written - self.unflushed;
        // SAFETY: a plain syscall on a file descriptor this value owns; it only schedules I/O.
        // Failure is harmless (fsync still does the work), so its result is ignored.
        unsafe {
            libc::sync_file_range(
                self.file.as_raw_fd(),
                i64::try_from(start).unwrap_or(i64::MAX),
                i64::try_from(self.unflushed).unwrap_or(i64::MAX),
                libc::SYNC_FILE_RANGE_WRITE,
            );
        }
        self.unflushed = 0;
    }

    /// After every [`WRITEBACK_EVERY`] bytes written by position, starts writeback of the
    /// whole file: positioned writes land all over it, and pages already on their way to the
    /// disk are passed over.
    #[cfg(target_os = "linux")]
    fn start_writeback_at(&self, len: usize) {
        use std::os::fd::AsRawFd;
        let before = self.unflushed_at.fetch_add(len as u64, Ordering::Relaxed);
        // The thread that crosses the mark starts it; one whose count was taken meanwhile
        // finds the swap's zero-or-little and leaves it.
        if before + (len as u64) < WRITEBACK_EVERY
            || self.unflushed_at.swap(0, Ordering::Relaxed) < WRITEBACK_EVERY
        {
            return;
        }
        // SAFETY: as in `start_writeback`; a length of 0 means to the end of the file.
        unsafe {
            libc::sync_file_range(self.file.as_raw_fd(), 0, 0, libc::SYNC_FILE_RANGE_WRITE);
        }
    }

    #[cfg(not(target_os = "linux"))]
    fn start_writeback(&mut self) {}
}

impl FileHandle for StdFile {
    fn write_all(&mut self, data: &[u8]) -> io::Result<()> {
        self.file.write_all(data)?;
        self.written += data.len() as u64;
        self.unflushed += data.len() as u64;
        self.start_writeback();
        Ok(())
    }

    fn write_at(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        #[cfg(unix)]
        let written = std::os::unix::fs::FileExt::write_all_at(&self.file, data, offset);
        #[cfg(windows)]
        let written = (|| {
            let mut done = 0;
            // `done < data.len()` inside the loop, so the slice below is in bounds.
            while done < data.len() {
                match std::os::windows::fs::FileExt::seek_write(
                    &self.file,
                    &data[done..],
                    offset + done as u64,
                )? {
                    0 => return Err(io::ErrorKind::WriteZero.into()),
                    n => done += n,
                }
            }
            Ok(())
        })();
        written?;
        #[cfg(target_os = "linux")]
        self.start_writeback_at(data.len());
        Ok(())
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        #[cfg(unix)]
        {
            std::os::unix::fs::FileExt::read_exact_at(&self.file, buf, offset)
        }
        #[cfg(windows)]
        {
            let mut done = 0;
            // `done < buf.len()` inside the loop, so the slice below is in bounds.
            while done < buf.len() {
                match std::os::windows::fs::FileExt::seek_read(
                    &self.file,
                    &mut buf[done..],
                    offset + done as u64,
                )? {
                    0 => return Err(io::ErrorKind::UnexpectedEof.into()),
                    n => done += n,
                }
            }
            Ok(())
        }
    }

    fn file_len(&self) -> io::Result<u64> {
        Ok(self.file.metadata()?.len())
    }

    fn sync_all(&self) -> io::Result<()> {
        self.file.sync_all()
    }
}

/// A large file whose name is about to go (replaced by a rename, or removed), held open so
/// that the kernel frees it when the handle closes rather than inside the call that drops its
/// last name: freeing a 2 GiB file drops its cached pages and releases its blocks, 0.3 to 0.5 s
/// on the project's machine, up to half of a durable save or the whole of a retention pass
/// that a training loop waits on. The handle is closed on a thread of its own, so the space
/// comes back shortly after the call returns, not in it.
struct Held(#[cfg(target_os = "linux")] Option<File>);

impl Held {
    /// Below this size a file is freed where its name goes: a thread would cost more.
    #[cfg(target_os = "linux")]
    const HOLD_FROM_LEN: u64 = 64 * 1024 * 1024;

    #[cfg(target_os = "linux")]
    fn open(path: &Path) -> Self {
        use std::os::unix::fs::OpenOptionsExt;
        // O_PATH needs no permission on the file; O_NOFOLLOW pins a symlink itself. Failing to
        // hold it only means the kernel frees it in the call, as it would have anyway.
        let file = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_PATH | libc::O_NOFOLLOW)
            .open(path)
            .ok()
            .filter(|file| {
                file.metadata()
                    .is_ok_and(|meta| meta.len() >= Self::HOLD_FROM_LEN)
            });
        Self(file)
    }

    #[cfg(not(target_os = "linux"))]
    fn open(_: &Path) -> Self {
        Self()
    }

    /// Closes the handle on a background thread (here, should none start).
    fn release(self) {
        #[cfg(target_os = "linux")]
        if let Some(file) = self.0 {
            let _ = std::thread::Builder::new()
                .name("weightbay-release".into())
                .spawn(move || drop(file));
        }
    }
}

impl FileSystem for StdFileSystem {
    fn create_new(&self, path: &Path) -> io::Result<Box<dyn FileHandle>> {
        let file = OpenOptions::new().write(true).create_new(true).open(path)?;
        Ok(Box::new(StdFile::new(file)))
    }

    fn create_truncate(&self, path: &Path) -> io::Result<Box<dyn FileHandle>> {
        let mut options = OpenOptions::new();
        options.write(true).create(true).truncate(true);
        #[cfg(unix)]
        {
            use std::os::unix::fs::OpenOptionsExt;
            options.custom_flags(libc::O_NOFOLLOW);
        }
        Ok(Box::new(StdFile::new(options.open(path)?)))
    }

    fn open(&self, path: &Path) -> io::Result<Box<dyn FileHandle>> {
        Ok(Box::new(StdFile::new(File::open(path)?)))
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        let replaced = Held::open(to);
        let renamed = fs::rename(from, to);
        replaced.release();
        renamed
    }

    fn rename_no_replace(&self, from: &Path, to: &Path) -> io::Result<()> {
        #[cfg(target_os = "linux")]
        {
            use std::ffi::CString;
            use std::os::unix::ffi::OsStrExt;
            let path = |p: &Path| {
                CString::new(p.as_os_str().as_bytes())
                    .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))
            };
            let (from, to) = (path(from)?, path(to)?);
            // The raw system call: glibc wraps renameat2 only from 2.28, musl later still.
            // SAFETY: both paths are NUL-terminated and outlive the call.
            let status = unsafe {
                libc::syscall(
                    libc::SYS_renameat2,
                    libc::AT_FDCWD,
                    from.as_ptr(),
                    libc::AT_FDCWD,
                    to.as_ptr(),
                    libc::RENAME_NOREPLACE,
                )
            };
            if status == 0 {
                return Ok(());
            }
            let error = io::Error::last_os_error();
            // EINVAL: this file system has no RENAME_NOREPLACE; ENOSYS: the kernel predates it.
            match error.raw_os_error() {
                Some(libc::EINVAL | libc::ENOSYS) => Err(io::Error::new(
                    io::ErrorKind::Unsupported,
                    format!("rename without replacing is not supported here: {error}"),
                )),
                _ => Err(error),
            }
        }
        #[cfg(not(target_os = "linux"))]
        {
            let _ = (from, to);
            Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "rename without replacing is implemented for Linux only",
            ))
        }
    }

    fn hard_link(&self, from: &Path, to: &Path) -> io::Result<()> {
        fs::hard_link(from, to)
    }

    fn remove_file(&self, path: &Path) -> io::Result<()> {
        let removed = Held::open(path);
        let result = fs::remove_file(path);
        removed.release();
        result
    }

    fn remove_file_below(&self, root: &Path, relative: &Path) -> io::Result<()> {
        let removed = Held::open(&root.join(relative));
        let result = below::remove(root, relative, false);
        removed.release();
        result
    }

    fn remove_dir_below(&self, root: &Path, relative: &Path) -> io::Result<()> {
        below::remove(root, relative, true)
    }

    fn hold_dir_below(&self, root: &Path, relative: &Path) -> io::Result<HeldDir> {
        below::hold(root, relative)
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        // Windows cannot open a directory as a file; NTFS journals renames itself.
        if cfg!(unix) {
            File::open(dir)?.sync_all()
        } else {
            Ok(())
        }
    }

    fn list_dir(&self, dir: &Path) -> io::Result<Vec<(OsString, EntryKind)>> {
        let mut names = Vec::new();
        for entry in fs::read_dir(dir)? {
            let entry = entry?;
            // The entry's own type: a symlink is not followed, but to tell a link to a file.
            let kind = match entry.file_type()? {
                kind if kind.is_file() => EntryKind::File,
                kind if kind.is_dir() => EntryKind::Directory,
                kind if kind.is_symlink() => match fs::metadata(entry.path()) {
                    Ok(target) if target.is_file() => EntryKind::LinkToFile,
                    _ => EntryKind::Other,
                },
                _ => EntryKind::Other,
            };
            names.push((entry.file_name(), kind));
        }
        Ok(names)
    }

    fn create_dir_all(&self, dir: &Path) -> io::Result<()> {
        fs::create_dir_all(dir)
    }

    fn remove_dir(&self, dir: &Path) -> io::Result<()> {
        fs::remove_dir(dir)
    }

    fn copy_permissions(&self, from: &Path, to: &Path) -> io::Result<()> {
        match fs::symlink_metadata(from) {
            Ok(meta) if meta.is_file() => fs::set_permissions(to, meta.permissions()),
            Ok(_) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(e),
        }
    }
}

/// Removal and creation below a root that never go through a symlink.
mod below {
    use std::io;
    use std::path::{Component, Path, PathBuf};

    use weightbay::backend_kit::HeldDir;

    /// The plain names of `relative`, refusing `..`, `.` and roots.
    fn names(relative: &Path) -> io::Result<Vec<&std::ffi::OsStr>> {
        relative
            .components()
            .map(|component| match component {
                Component::Normal(name) => Ok(name),
                _ => Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!(
                        "{} is not a path of plain names below the root",
                        relative.display()
                    ),
                )),
            })
            .collect()
    }

    /// The error for a name on the way down that is a symlink or no directory.
    fn not_through(
        root: &Path,
        on_the_way: &[&std::ffi::OsStr],
        what: &str,
        e: &io::Error,
    ) -> io::Error {
        let on_the_way: PathBuf = on_the_way.iter().collect();
        io::Error::other(format!(
            "{} is a symlink or no directory: nothing is {what} through one ({e})",
            root.join(on_the_way).display()
        ))
    }

    /// The root's missing ancestors, deepest first, once made: the root may be a symlink, or
    /// lie below one, since the caller named it.
    #[cfg(target_os = "linux")]
    fn make_root(root: &Path) -> io::Result<Vec<PathBuf>> {
        let missing = root
            .ancestors()
            .take_while(|dir| std::fs::symlink_metadata(dir).is_err())
            .map(Path::to_path_buf)
            .collect();
        std::fs::create_dir_all(root)?;
        Ok(missing)
    }

    #[cfg(target_os = "linux")]
    mod at {
        use std::ffi::{CString, OsStr};
        use std::io;
        use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
        use std::os::unix::ffi::OsStrExt;
        use std::path::Path;

        pub(super) fn c_name(name: &OsStr) -> io::Result<CString> {
            CString::new(name.as_bytes())
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))
        }

        /// The directory `name` in the directory `at` (or AT_FDCWD), opened; a symlink is
        /// followed only where `follow`.
        pub(super) fn open_dir(at: libc::c_int, name: &OsStr, follow: bool) -> io::Result<OwnedFd> {
            let name = c_name(name)?;
            let no_follow = if follow { 0 } else { libc::O_NOFOLLOW };
            // SAFETY: `name` is NUL-terminated and outlives the call; `at` is a directory
            // descriptor held open by the caller, or AT_FDCWD.
            let fd = unsafe {
                libc::openat(
                    at,
                    name.as_ptr(),
                    libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC | no_follow,
                )
            };
            if fd < 0 {
                return Err(io::Error::last_os_error());
            }
            // SAFETY: a descriptor just returned by openat, owned by nothing else.
            Ok(unsafe { OwnedFd::from_raw_fd(fd) })
        }

        /// Makes the directory `name` in the directory `dir`; `Ok(false)` if it exists.
        pub(super) fn make_dir(dir: &OwnedFd, name: &OsStr) -> io::Result<bool> {
            let name = c_name(name)?;
            // SAFETY: `dir` is an open directory descriptor and `name` is NUL-terminated.
            if unsafe { libc::mkdirat(dir.as_raw_fd(), name.as_ptr(), 0o777) } == 0 {
                return Ok(true);
            }
            let error = io::Error::last_os_error();
            if error.kind() == io::ErrorKind::AlreadyExists {
                Ok(false)
            } else {
                Err(error)
            }
        }

        /// Whether an `openat` failed because the name was a symlink or no directory.
        pub(super) fn is_not_through(e: &io::Error) -> bool {
            matches!(e.raw_os_error(), Some(libc::ELOOP | libc::ENOTDIR))
        }

        /// The root, opened following links.
        pub(super) fn open_root(root: &Path) -> io::Result<OwnedFd> {
            open_dir(libc::AT_FDCWD, root.as_os_str(), true)
        }
    }

    /// Removes `relative` below `root` (a directory if `directory`): each directory on the
    /// way opened from its parent's handle with `O_NOFOLLOW`, then the last name unlinked
    /// from its directory's handle, so no symlink is followed below `root`, however the
    /// tree changes meanwhile.
    #[cfg(target_os = "linux")]
    pub(super) fn remove(root: &Path, relative: &Path, directory: bool) -> io::Result<()> {
        use std::os::fd::AsRawFd;

        let names = names(relative)?;
        let Some((last, dirs)) = names.split_last() else {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "nothing to remove below the root",
            ));
        };
        let mut dir = at::open_root(root)?;
        for (depth, name) in dirs.iter().enumerate() {
            dir = at::open_dir(dir.as_raw_fd(), name, false).map_err(|e| {
                if at::is_not_through(&e) {
                    not_through(root, &dirs[..=depth], "removed", &e)
                } else {
                    e
                }
            })?;
        }
        let flags = if directory { libc::AT_REMOVEDIR } else { 0 };
        let name = at::c_name(last)?;
        // SAFETY: `dir` is an open directory descriptor and `name` is NUL-terminated.
        if unsafe { libc::unlinkat(dir.as_raw_fd(), name.as_ptr(), flags) } == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    }

    /// Holds `relative` below `root`, making what is missing: each directory on the way
    /// opened (or made, then opened) from its parent's handle with `O_NOFOLLOW`; the result
    /// names the last one through its descriptor under `/proc/self/fd`, so what is created
    /// through it lands in that directory, whatever is renamed or linked on the way later.
    #[cfg(target_os = "linux")]
    pub(super) fn hold(root: &Path, relative: &Path) -> io::Result<HeldDir> {
        use std::os::fd::AsRawFd;

        let names = names(relative)?;
        let mut created_below = Vec::new();
        let created_above = make_root(root)?;
        let mut dir = at::open_root(root)?;
        for (depth, name) in names.iter().enumerate() {
            let opened = match at::open_dir(dir.as_raw_fd(), name, false) {
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    if at::make_dir(&dir, name)? {
                        created_below.push(root.join(names[..=depth].iter().collect::<PathBuf>()));
                    }
                    at::open_dir(dir.as_raw_fd(), name, false)
                }
                opened => opened,
            };
            dir = opened.map_err(|e| {
                if at::is_not_through(&e) {
                    not_through(root, &names[..=depth], "written", &e)
                } else {
                    e
                }
            })?;
        }
        let path = PathBuf::from(format!("/proc/self/fd/{}", dir.as_raw_fd()));
        if !path.is_dir() {
            // No /proc: a plain path, checked once (a link swapped in later is followed).
            return Ok(HeldDir::new(
                root.join(relative),
                with_above(created_below, created_above),
                None,
            ));
        }
        Ok(HeldDir::new(
            path,
            with_above(created_below, created_above),
            Some(std::fs::File::from(dir)),
        ))
    }

    /// The directories made below the root (shallowest first) and the root's own, deepest
    /// first.
    #[cfg(target_os = "linux")]
    fn with_above(mut below: Vec<PathBuf>, above: Vec<PathBuf>) -> Vec<PathBuf> {
        below.reverse();
        below.extend(above);
        below
    }

    /// Checks that none of `names`, walked down from `root`, is a symlink or no directory;
    /// the walk ends at the first one missing.
    #[cfg(not(target_os = "linux"))]
    fn check_on_the_way(root: &Path, names: &[&std::ffi::OsStr], what: &str) -> io::Result<()> {
        let mut path = root.to_path_buf();
        for (depth, name) in names.iter().enumerate() {
            path.push(name);
            match std::fs::symlink_metadata(&path) {
                Ok(meta) if meta.is_dir() => {}
                Ok(_) => {
                    let e = io::Error::other("not a directory");
                    return Err(not_through(root, &names[..=depth], what, &e));
                }
                Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Where there is no `openat`: each directory on the way is checked not to be a symlink,
    /// then the path removed. A link swapped in between the two is followed: only Linux
    /// removes race-free.
    #[cfg(not(target_os = "linux"))]
    pub(super) fn remove(root: &Path, relative: &Path, directory: bool) -> io::Result<()> {
        let names = names(relative)?;
        check_on_the_way(root, &names[..names.len().saturating_sub(1)], "removed")?;
        let path = root.join(relative);
        if directory {
            std::fs::remove_dir(path)
        } else {
            std::fs::remove_file(path)
        }
    }

    /// Where there is no `openat`: the directories on the way are checked not to be
    /// symlinks, then made, and the result is the plain path. A link swapped in later is
    /// followed: only Linux writes race-free.
    #[cfg(not(target_os = "linux"))]
    pub(super) fn hold(root: &Path, relative: &Path) -> io::Result<HeldDir> {
        check_on_the_way(root, &names(relative)?, "written")?;
        weightbay::backend_kit::hold_dir_plainly(&super::StdFileSystem, root, relative)
    }
}
