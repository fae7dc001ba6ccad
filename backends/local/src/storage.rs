//! [`LocalStorage`]: containers as files under a root directory, created through scratch files
//! and published by rename, listed and cleaned of killed writers' scratch files.

use std::ffi::OsStr;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use weightbay::backend_kit::{
    EntryKind, FileHandle, FileSystem, HeldDir, validate_key, validate_prefix,
};
use weightbay::{
    Capabilities, CreateOptions, Durability, Error, ErrorKind, ForeignEntry, Listed, PendingWrite,
    Result, Sink, Source, Storage, WriteMode,
};

use crate::atomic_sink::{AtomicSink, remove_new_dirs};
use crate::file_writes::io_error;
use crate::in_place_sink::InPlaceSink;
use crate::scratch::{NEXT_SCRATCH, SCRATCH_SUFFIX, scratch_pid, scratch_target};
use crate::source::LocalSource;
use crate::std_fs::StdFileSystem;

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

    /// The directory `relative` (below the root) held, and the scratch file `name` created in
    /// it, holding the directory again if a delete of its last key removed it between the two.
    fn create_scratch(
        &self,
        relative: &Path,
        name: &str,
    ) -> io::Result<(HeldDir, Box<dyn FileHandle>)> {
        const ATTEMPTS: usize = 3;
        let mut attempt = 1;
        loop {
            let dir = self.fs.hold_dir_below(&self.root, relative)?;
            match self.fs.create_new(&dir.path().join(name)) {
                Ok(file) => return Ok((dir, file)),
                Err(e) if e.kind() == io::ErrorKind::NotFound && attempt < ATTEMPTS => {
                    attempt += 1;
                }
                Err(e) => {
                    remove_new_dirs(self.fs.as_ref(), &self.root, &dir);
                    return Err(e);
                }
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
            .files
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
    /// since a read follows them (a Hugging Face cache links its snapshot files to blobs);
    /// and every entry no file of this storage can be. A missing directory has none. The
    /// walk never descends into a symlink: a link to a directory, a loop or a deep tree of
    /// links costs one foreign entry each and fails nothing.
    fn files_under(&self, prefix: &str) -> Result<Walked> {
        let mut found = Walked::default();
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
                let child = |name: &str| {
                    if relative.is_empty() {
                        name.to_owned()
                    } else {
                        format!("{relative}/{name}")
                    }
                };
                // Keys are UTF-8: another name is no container of this storage.
                let Some(name) = name.to_str() else {
                    let name = child(&name.to_string_lossy());
                    found
                        .foreign
                        .push(ForeignEntry::new(name, "a name that is not UTF-8"));
                    continue;
                };
                match kind {
                    EntryKind::File | EntryKind::LinkToFile => {
                        found.files.push((child(name), name.to_owned()));
                    }
                    EntryKind::Directory => dirs.push(child(name)),
                    EntryKind::Other => found.foreign.push(ForeignEntry::new(
                        child(name),
                        "a symlink to a directory or to nothing, or a special file: not followed",
                    )),
                }
            }
        }
        Ok(found)
    }

    /// The committed files under `prefix`: every file but scratch files, with its length.
    fn list_files(&self, prefix: &str) -> Result<Vec<Listed>> {
        validate_prefix(prefix)?;
        let mut listed = Vec::new();
        for (relative, name) in self.files_under(prefix)?.files {
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
        let relative = Path::new(key).parent().unwrap_or(Path::new(""));
        let file_name = path
            .file_name()
            .unwrap_or(OsStr::new("container"))
            .to_string_lossy()
            .into_owned();
        if options.mode == WriteMode::InPlace {
            let dir = self
                .fs
                .hold_dir_below(&self.root, relative)
                .map_err(|e| io_error("creating directory", &parent, e))?;
            let file = self
                .fs
                .create_truncate(&dir.path().join(&file_name))
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
        let scratch_name = format!(
            "{file_name}.{}-{}{SCRATCH_SUFFIX}",
            std::process::id(),
            NEXT_SCRATCH.fetch_add(1, Ordering::Relaxed)
        );
        let scratch = parent.join(&scratch_name);
        let (dir, file) = self
            .create_scratch(relative, &scratch_name)
            .map_err(|e| io_error("creating", &scratch, e))?;
        let sink = AtomicSink {
            fs: Arc::clone(&self.fs),
            root: self.root.clone(),
            dir,
            file: Some(file),
            scratch,
            path,
            create_new: options.mode == WriteMode::CreateNew,
            durable,
            written: 0,
            expected_len: options.expected_len,
            positioned: false,
            deadline: options.deadline,
        };
        if options.mode == WriteMode::CreateNew && self.fs.open(&sink.at(&sink.path)).is_ok() {
            // Dropped: its scratch file and the directories it made go.
            return Err(Error::new(ErrorKind::AlreadyExists, "file exists").with_key(key));
        }
        Ok(Box::new(sink))
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
        Ok(Arc::new(LocalSource::new(file, len, path)))
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

    /// Symlinks that are not to files, special files, names that are not UTF-8, and files
    /// whose path is no valid key.
    fn list_foreign(&self, prefix: &str) -> Result<Vec<ForeignEntry>> {
        validate_prefix(prefix)?;
        let walked = self.files_under(prefix)?;
        let mut foreign = walked.foreign;
        for (relative, name) in walked.files {
            if scratch_pid(&name).is_some() {
                continue;
            }
            if let Err(e) = validate_key(&relative) {
                foreign.push(ForeignEntry::new(
                    relative,
                    format!("a file whose path is no key: {e}"),
                ));
            }
        }
        foreign.sort();
        Ok(foreign)
    }
}

/// What a walk under a prefix found.
#[derive(Debug, Default)]
struct Walked {
    /// Each file, symlinks to files among them, by its path relative to the root and its own
    /// name.
    files: Vec<(String, String)>,
    /// Each entry no file of this storage can be.
    foreign: Vec<ForeignEntry>,
}
