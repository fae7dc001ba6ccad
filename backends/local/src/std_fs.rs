//! The real file system behind the seam: plain `std::fs`.

use std::ffi::OsString;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::Path;

use weightbay::backend_kit::{FileHandle, FileSystem};

/// `std::fs`, unchanged.
#[derive(Debug, Clone, Copy, Default)]
pub struct StdFileSystem;

/// A file, and (on Linux) how much of it was written since writeback was last started.
#[derive(Debug)]
struct StdFile {
    file: File,
    written: u64,
    unflushed: u64,
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

impl FileSystem for StdFileSystem {
    fn create_new(&self, path: &Path) -> io::Result<Box<dyn FileHandle>> {
        let file = OpenOptions::new().write(true).create_new(true).open(path)?;
        Ok(Box::new(StdFile::new(file)))
    }

    fn create_truncate(&self, path: &Path) -> io::Result<Box<dyn FileHandle>> {
        let file = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(path)?;
        Ok(Box::new(StdFile::new(file)))
    }

    fn open(&self, path: &Path) -> io::Result<Box<dyn FileHandle>> {
        Ok(Box::new(StdFile::new(File::open(path)?)))
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        // Replacing a file frees the old one inside rename(2): its cached pages are dropped and
        // its blocks released, 0.3 to 0.4 s for 2 GiB on the project's machine, up to half of a
        // durable save. Holding the old inode open moves that work to when the handle closes,
        // which a background thread does once the new file is in place.
        #[cfg(target_os = "linux")]
        let replaced = {
            use std::os::unix::fs::OpenOptionsExt;
            // O_PATH needs no permission on the file; O_NOFOLLOW pins a symlink itself.
            OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_PATH | libc::O_NOFOLLOW)
                .open(to)
                .ok()
        };
        let renamed = fs::rename(from, to);
        #[cfg(target_os = "linux")]
        if let Some(replaced) = replaced {
            // Should no thread start, the closure (and the handle) is dropped here instead.
            let _ = std::thread::Builder::new()
                .name("weightbay-release".into())
                .spawn(move || drop(replaced));
        }
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
        fs::remove_file(path)
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        // Windows cannot open a directory as a file; NTFS journals renames itself.
        if cfg!(unix) {
            File::open(dir)?.sync_all()
        } else {
            Ok(())
        }
    }

    fn list_dir(&self, dir: &Path) -> io::Result<Vec<OsString>> {
        fs::read_dir(dir)?
            .map(|entry| entry.map(|e| e.file_name()))
            .collect()
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
