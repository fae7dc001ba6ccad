//! [`SimulatedDisk`]: an in-memory file system that keeps what was written apart from what is
//! durable, so a backend written against [`weightbay::backend_kit::FileSystem`] can be "powered off"
//! after any operation and the surviving image inspected.
//!
//! The model is deliberately pessimistic, like a file system with delayed allocation and no
//! rename heuristics: file bytes become durable only through `sync_all` of that file, and
//! directory entries (create, rename, link, remove) only through `sync_dir` of their directory.
//! Directories themselves are assumed to exist durably once created.

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsString;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use weightbay::backend_kit::{EntryKind, FileHandle, FileSystem, HeldDir, hold_dir_plainly};

#[derive(Debug, Clone, Default)]
struct Inode {
    written: Vec<u8>,
    durable: Vec<u8>,
}

type Entries = BTreeMap<OsString, usize>;

#[derive(Debug, Clone, Default)]
struct State {
    inodes: Vec<Inode>,
    dirs: BTreeSet<PathBuf>,
    /// Directory entries as the running system sees them.
    written: BTreeMap<PathBuf, Entries>,
    /// Directory entries that survive power loss.
    durable: BTreeMap<PathBuf, Entries>,
    operations: u64,
    /// Power is lost after this many operations.
    crash_after: Option<u64>,
}

/// An in-memory file system with power-loss semantics. Clones share the same disk.
#[derive(Debug, Clone, Default)]
pub struct SimulatedDisk {
    state: Arc<Mutex<State>>,
}

fn split(path: &Path) -> io::Result<(PathBuf, OsString)> {
    match (path.parent(), path.file_name()) {
        (Some(parent), Some(name)) => Ok((parent.to_path_buf(), name.to_os_string())),
        _ => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "path has no file name",
        )),
    }
}

fn not_found(path: &Path) -> io::Error {
    io::Error::new(
        io::ErrorKind::NotFound,
        format!("{} not found", path.display()),
    )
}

impl SimulatedDisk {
    /// An empty disk with power that never fails.
    pub fn new() -> Self {
        Self::default()
    }

    /// Loses power after `operations` more operations: each later operation fails.
    pub fn crash_after(&self, operations: u64) {
        let mut state = self.lock();
        state.crash_after = Some(state.operations + operations);
    }

    /// Operations performed so far.
    pub fn operations(&self) -> u64 {
        self.lock().operations
    }

    /// What a reboot would find: a fresh disk holding only durable entries and bytes.
    pub fn crash_image(&self) -> SimulatedDisk {
        let state = self.lock();
        let inodes = state
            .inodes
            .iter()
            .map(|inode| Inode {
                written: inode.durable.clone(),
                durable: inode.durable.clone(),
            })
            .collect();
        let image = State {
            inodes,
            dirs: state.dirs.clone(),
            written: state.durable.clone(),
            durable: state.durable.clone(),
            operations: 0,
            crash_after: None,
        };
        SimulatedDisk {
            state: Arc::new(Mutex::new(image)),
        }
    }

    /// The file names in `dir` (what the running system sees).
    pub fn names(&self, dir: &Path) -> Vec<String> {
        let state = self.lock();
        state.written.get(dir).map_or_else(Vec::new, |entries| {
            entries
                .keys()
                .map(|name| name.to_string_lossy().into_owned())
                .collect()
        })
    }

    /// Every file the running system sees, by path.
    pub fn files(&self) -> BTreeSet<PathBuf> {
        let state = self.lock();
        state
            .written
            .iter()
            .flat_map(|(dir, entries)| entries.keys().map(move |name| dir.join(name)))
            .collect()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Counts one operation, failing it if power is already lost; then runs `f`.
    fn operate<T>(&self, f: impl FnOnce(&mut State) -> io::Result<T>) -> io::Result<T> {
        let mut state = self.lock();
        if state
            .crash_after
            .is_some_and(|limit| state.operations >= limit)
        {
            return Err(io::Error::other("simulated power loss"));
        }
        state.operations += 1;
        f(&mut state)
    }

    fn handle(&self, inode: usize) -> Box<dyn FileHandle> {
        Box::new(SimFile {
            disk: self.clone(),
            inode,
        })
    }
}

impl State {
    fn lookup(&self, path: &Path) -> io::Result<usize> {
        let (dir, name) = split(path)?;
        self.written
            .get(&dir)
            .and_then(|entries| entries.get(&name))
            .copied()
            .ok_or_else(|| not_found(path))
    }

    fn entries(&mut self, dir: &Path) -> io::Result<&mut Entries> {
        if !self.dirs.contains(dir) {
            return Err(not_found(dir));
        }
        Ok(self.written.entry(dir.to_path_buf()).or_default())
    }

    fn new_inode(&mut self) -> usize {
        self.inodes.push(Inode::default());
        self.inodes.len() - 1
    }
}

#[derive(Debug)]
struct SimFile {
    disk: SimulatedDisk,
    inode: usize,
}

impl FileHandle for SimFile {
    fn write_all(&mut self, data: &[u8]) -> io::Result<()> {
        self.disk.operate(|state| {
            state.inodes[self.inode].written.extend_from_slice(data);
            Ok(())
        })
    }

    fn write_at(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        self.disk.operate(|state| {
            if data.is_empty() {
                return Ok(());
            }
            let bytes = &mut state.inodes[self.inode].written;
            let start = usize::try_from(offset)
                .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
            let end = start.saturating_add(data.len());
            if bytes.len() < end {
                bytes.resize(end, 0);
            }
            // The file reaches `end` now.
            bytes[start..end].copy_from_slice(data);
            Ok(())
        })
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        self.disk.operate(|state| {
            let bytes = &state.inodes[self.inode].written;
            let start = usize::try_from(offset)
                .map_err(|_| io::Error::from(io::ErrorKind::UnexpectedEof))?;
            let source = bytes
                .get(start..start.saturating_add(buf.len()))
                .ok_or_else(|| io::Error::from(io::ErrorKind::UnexpectedEof))?;
            buf.copy_from_slice(source);
            Ok(())
        })
    }

    fn file_len(&self) -> io::Result<u64> {
        self.disk
            .operate(|state| Ok(state.inodes[self.inode].written.len() as u64))
    }

    fn sync_all(&self) -> io::Result<()> {
        self.disk.operate(|state| {
            let inode = &mut state.inodes[self.inode];
            inode.durable = inode.written.clone();
            Ok(())
        })
    }
}

impl FileSystem for SimulatedDisk {
    fn create_new(&self, path: &Path) -> io::Result<Box<dyn FileHandle>> {
        let inode = self.operate(|state| {
            let (dir, name) = split(path)?;
            if state.entries(&dir)?.contains_key(&name) {
                return Err(io::ErrorKind::AlreadyExists.into());
            }
            let inode = state.new_inode();
            state.entries(&dir)?.insert(name, inode);
            Ok(inode)
        })?;
        Ok(self.handle(inode))
    }

    fn create_truncate(&self, path: &Path) -> io::Result<Box<dyn FileHandle>> {
        let inode = self.operate(|state| {
            if let Ok(inode) = state.lookup(path) {
                state.inodes[inode].written.clear();
                return Ok(inode);
            }
            let (dir, name) = split(path)?;
            let inode = state.new_inode();
            state.entries(&dir)?.insert(name, inode);
            Ok(inode)
        })?;
        Ok(self.handle(inode))
    }

    fn open(&self, path: &Path) -> io::Result<Box<dyn FileHandle>> {
        let inode = self.operate(|state| state.lookup(path))?;
        Ok(self.handle(inode))
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        self.operate(|state| {
            let inode = state.lookup(from)?;
            let (from_dir, from_name) = split(from)?;
            let (to_dir, to_name) = split(to)?;
            state.entries(&to_dir)?.insert(to_name, inode);
            state.entries(&from_dir)?.remove(&from_name);
            Ok(())
        })
    }

    fn rename_no_replace(&self, from: &Path, to: &Path) -> io::Result<()> {
        self.operate(|state| {
            let inode = state.lookup(from)?;
            let (from_dir, from_name) = split(from)?;
            let (to_dir, to_name) = split(to)?;
            let entries = state.entries(&to_dir)?;
            if entries.contains_key(&to_name) {
                return Err(io::ErrorKind::AlreadyExists.into());
            }
            entries.insert(to_name, inode);
            state.entries(&from_dir)?.remove(&from_name);
            Ok(())
        })
    }

    fn hard_link(&self, from: &Path, to: &Path) -> io::Result<()> {
        self.operate(|state| {
            let inode = state.lookup(from)?;
            let (dir, name) = split(to)?;
            let entries = state.entries(&dir)?;
            if entries.contains_key(&name) {
                return Err(io::ErrorKind::AlreadyExists.into());
            }
            entries.insert(name, inode);
            Ok(())
        })
    }

    fn remove_file(&self, path: &Path) -> io::Result<()> {
        self.operate(|state| {
            let (dir, name) = split(path)?;
            state
                .entries(&dir)?
                .remove(&name)
                .map(|_| ())
                .ok_or_else(|| not_found(path))
        })
    }

    /// This disk has no symlinks: the path below the root is removed as it is.
    fn remove_file_below(&self, root: &Path, relative: &Path) -> io::Result<()> {
        self.remove_file(&root.join(relative))
    }

    fn remove_dir_below(&self, root: &Path, relative: &Path) -> io::Result<()> {
        self.remove_dir(&root.join(relative))
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        self.operate(|state| {
            let entries = state.entries(dir)?.clone();
            state.durable.insert(dir.to_path_buf(), entries);
            Ok(())
        })
    }

    fn list_dir(&self, dir: &Path) -> io::Result<Vec<(OsString, EntryKind)>> {
        self.operate(|state| {
            let mut names: Vec<(OsString, EntryKind)> = state
                .entries(dir)?
                .keys()
                .map(|name| (name.clone(), EntryKind::File))
                .collect();
            names.extend(
                state
                    .dirs
                    .iter()
                    .filter(|d| d.parent() == Some(dir))
                    .filter_map(|d| d.file_name())
                    .map(|name| (OsString::from(name), EntryKind::Directory)),
            );
            Ok(names)
        })
    }

    /// A simulated disk has no symlinks: the plain path.
    fn hold_dir_below(&self, root: &Path, relative: &Path) -> io::Result<HeldDir> {
        hold_dir_plainly(self, root, relative)
    }

    fn create_dir_all(&self, dir: &Path) -> io::Result<()> {
        self.operate(|state| {
            for ancestor in dir.ancestors() {
                state.dirs.insert(ancestor.to_path_buf());
            }
            Ok(())
        })
    }

    fn remove_dir(&self, dir: &Path) -> io::Result<()> {
        self.operate(|state| {
            let has_entries = state
                .written
                .get(dir)
                .is_some_and(|entries| !entries.is_empty());
            let has_subdirs = state.dirs.iter().any(|d| d.parent() == Some(dir));
            if has_entries || has_subdirs {
                return Err(io::Error::other("directory not empty"));
            }
            if !state.dirs.remove(dir) {
                return Err(not_found(dir));
            }
            state.written.remove(dir);
            state.durable.remove(dir);
            Ok(())
        })
    }

    fn copy_permissions(&self, _from: &Path, _to: &Path) -> io::Result<()> {
        self.operate(|_| Ok(()))
    }
}
