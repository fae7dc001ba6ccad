//! Fault injection: [`FaultPlan`] picks the operation that fails or kills; [`Faulty`] applies it
//! to a storage's operations and [`FaultyFileSystem`] to a file system's.

use std::ffi::OsString;
use std::fmt;
use std::io;
use std::ops::Range;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use weightbay::backend_kit::{EntryKind, FileHandle, FileSystem, HeldDir};
use weightbay::{
    Bytes, CreateOptions, Error, ErrorKind, ForeignEntry, Listed, PositionedWrite, ReadBack,
    Result, Sink, Source, Storage,
};

/// Counts operations and fails the one numbered `fail_at` (1-based) with
/// [`ErrorKind::Io`] whose source is an [`InjectedFault`], or kills the whole process (SIGKILL,
/// no destructors run) right after the one numbered `kill_after`. Deterministic and free of
/// global state: clones share one counter.
#[derive(Clone)]
pub struct Faulty<S> {
    inner: S,
    plan: FaultPlan,
}

/// The fault injected into an operation: the source of the error the operation returns, so a
/// case recognises it by type ([`is_injected`]) whatever message a backend wraps it in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InjectedFault {
    /// The 1-based number of the failed operation.
    pub operation: u64,
    /// What the operation was (`"write"`, `"rename"`, `"put_part"`, ...).
    pub name: &'static str,
}

impl fmt::Display for InjectedFault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "injected fault at operation {} ({})",
            self.operation, self.name
        )
    }
}

impl std::error::Error for InjectedFault {}

/// Whether an [`InjectedFault`] is anywhere in `error`'s source chain, looking inside
/// `std::io::Error`s too (whose `source()` skips the error they wrap).
pub fn is_injected(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut next = Some(error);
    while let Some(error) = next {
        if error.is::<InjectedFault>() {
            return true;
        }
        if let Some(inner) = error
            .downcast_ref::<std::io::Error>()
            .and_then(std::io::Error::get_ref)
            && is_injected(inner)
        {
            return true;
        }
        next = error.source();
    }
    false
}

/// Which operation fails or kills, shared by every layer it is applied to: the storage
/// ([`Faulty`]), a file system ([`FaultyFileSystem`]), or a backend's own inner layer (an
/// object store's requests). Clones share one counter.
#[derive(Clone)]
pub struct FaultPlan(Arc<Counter>);

struct Counter {
    done: AtomicU64,
    fail_at: Option<u64>,
    kill_after: Option<u64>,
    injected: OnceLock<InjectedFault>,
}

impl FaultPlan {
    /// Fails operation number `fail_at` (1-based).
    pub fn failing_at(fail_at: u64) -> Self {
        Self::new(Some(fail_at), None)
    }

    /// Kills this process right after operation number `kill_after` (1-based) ran.
    pub fn killing_at(kill_after: u64) -> Self {
        Self::new(None, Some(kill_after))
    }

    /// Counts operations without failing any.
    pub fn counting() -> Self {
        Self::new(None, None)
    }

    fn new(fail_at: Option<u64>, kill_after: Option<u64>) -> Self {
        Self(Arc::new(Counter {
            done: AtomicU64::new(0),
            fail_at,
            kill_after,
            injected: OnceLock::new(),
        }))
    }

    /// Operations performed so far.
    pub fn operations(&self) -> u64 {
        self.0.done.load(Ordering::SeqCst)
    }

    /// The fault injected so far, if any.
    pub fn injected(&self) -> Option<&InjectedFault> {
        self.0.injected.get()
    }

    /// Counts the operation `name` about to run: the fault when it is the chosen one.
    ///
    /// # Errors
    /// The [`InjectedFault`] for the chosen operation.
    pub fn before(&self, name: &'static str) -> std::result::Result<u64, InjectedFault> {
        let operation = self.0.done.fetch_add(1, Ordering::SeqCst) + 1;
        if self.0.fail_at == Some(operation) {
            let fault = InjectedFault { operation, name };
            let _ = self.0.injected.set(fault.clone());
            return Err(fault);
        }
        Ok(operation)
    }

    /// Called after operation `operation` ran: dies if it is the chosen one.
    pub fn after(&self, operation: u64) {
        if self.0.kill_after == Some(operation) {
            kill_this_process();
        }
    }

    /// Runs `f` as operation `name`.
    ///
    /// # Errors
    /// The injected fault, converted by `fault`; or `f`'s error.
    pub fn around<T, E>(
        &self,
        name: &'static str,
        fault: impl FnOnce(InjectedFault) -> E,
        f: impl FnOnce() -> std::result::Result<T, E>,
    ) -> std::result::Result<T, E> {
        let operation = self.before(name).map_err(fault)?;
        let result = f();
        self.after(operation);
        result
    }

    fn storage_op<T>(&self, name: &'static str, f: impl FnOnce() -> Result<T>) -> Result<T> {
        self.around(
            name,
            |fault| {
                Error::new(ErrorKind::Io, fault.to_string())
                    .with_operation(name)
                    .with_source(fault)
            },
            f,
        )
    }

    fn file_op<T>(&self, name: &'static str, f: impl FnOnce() -> io::Result<T>) -> io::Result<T> {
        self.around(name, io::Error::other, f)
    }
}

impl fmt::Debug for FaultPlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FaultPlan")
            .field("done", &self.operations())
            .field("fail_at", &self.0.fail_at)
            .field("kill_after", &self.0.kill_after)
            .finish()
    }
}

/// Ends the process at once, as a crash or `kill -9` would: no destructor or cleanup runs.
fn kill_this_process() -> ! {
    #[cfg(unix)]
    // SAFETY: sending a signal to our own pid has no memory-safety preconditions.
    unsafe {
        libc::kill(libc::getpid(), libc::SIGKILL);
    }
    std::process::abort()
}

impl<S: Storage> Faulty<S> {
    /// Fails operation number `fail_at` (1-based).
    pub fn failing_at(inner: S, fail_at: u64) -> Self {
        Self::new(inner, FaultPlan::failing_at(fail_at))
    }

    /// Kills this process right after operation number `kill_after` (1-based) ran.
    pub fn killing_at(inner: S, kill_after: u64) -> Self {
        Self::new(inner, FaultPlan::killing_at(kill_after))
    }

    /// Counts operations without failing any.
    pub fn counting(inner: S) -> Self {
        Self::new(inner, FaultPlan::counting())
    }

    /// Applies `plan` to the storage's operations.
    pub fn new(inner: S, plan: FaultPlan) -> Self {
        Self { inner, plan }
    }

    /// Operations performed so far.
    pub fn operations(&self) -> u64 {
        self.plan.operations()
    }
}

impl<S> fmt::Debug for Faulty<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Faulty")
            .field("plan", &self.plan)
            .finish_non_exhaustive()
    }
}

#[deny(clippy::missing_trait_methods)]
impl<S: Storage> Storage for Faulty<S> {
    fn create(&self, key: &str, options: &CreateOptions) -> Result<Box<dyn Sink>> {
        let inner = self
            .plan
            .storage_op("create", || self.inner.create(key, options))?;
        Ok(Box::new(FaultySink {
            inner,
            plan: self.plan.clone(),
        }))
    }

    fn open(&self, key: &str) -> Result<Arc<dyn Source>> {
        let inner = self.plan.storage_op("open", || self.inner.open(key))?;
        Ok(Arc::new(FaultySource {
            inner,
            plan: self.plan.clone(),
        }))
    }

    fn delete(&self, key: &str) -> Result<()> {
        self.plan.storage_op("delete", || self.inner.delete(key))
    }

    fn list(&self, prefix: &str) -> Result<Vec<Listed>> {
        self.plan.storage_op("list", || self.inner.list(prefix))
    }

    fn list_foreign(&self, prefix: &str) -> Result<Vec<ForeignEntry>> {
        self.plan
            .storage_op("list_foreign", || self.inner.list_foreign(prefix))
    }
    weightbay::forward_storage!(inner => capabilities, pending, clean_pending);
}

struct FaultySink {
    inner: Box<dyn Sink>,
    plan: FaultPlan,
}

#[deny(clippy::missing_trait_methods)]
impl Sink for FaultySink {
    fn write(&mut self, data: &[u8]) -> Result<()> {
        self.plan.storage_op("write", || self.inner.write(data))
    }

    fn pad(&mut self, len: u64) -> Result<()> {
        self.plan.storage_op("pad", || self.inner.pad(len))
    }

    fn commit(self: Box<Self>) -> Result<()> {
        let plan = self.plan.clone();
        plan.storage_op("commit", || self.inner.commit())
    }

    fn read_back(&self) -> Option<Arc<dyn ReadBack>> {
        let inner = self.inner.read_back()?;
        Some(Arc::new(FaultyReadBack {
            inner,
            plan: self.plan.clone(),
        }))
    }

    fn positioned(&mut self) -> Option<Box<dyn PositionedWrite + '_>> {
        Some(Box::new(FaultyWrites {
            inner: self.inner.positioned()?,
            plan: self.plan.clone(),
        }))
    }
}

/// A sink's writes by position, each following the sink's [`FaultPlan`].
struct FaultyWrites<'a> {
    inner: Box<dyn PositionedWrite + 'a>,
    plan: FaultPlan,
}

impl PositionedWrite for FaultyWrites<'_> {
    fn write_at(&self, offset: u64, data: &[u8]) -> Result<()> {
        self.plan
            .storage_op("write_at", || self.inner.write_at(offset, data))
    }
}

/// A sink's read-back whose reads follow the sink's [`FaultPlan`].
#[derive(Debug)]
struct FaultyReadBack {
    inner: Arc<dyn ReadBack>,
    plan: FaultPlan,
}

impl ReadBack for FaultyReadBack {
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        self.plan
            .storage_op("read_back", || self.inner.read_at(offset, buf))
    }
}

struct FaultySource {
    inner: Arc<dyn Source>,
    plan: FaultPlan,
}

impl fmt::Debug for FaultySource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("FaultySource").field(&self.inner).finish()
    }
}

#[deny(clippy::missing_trait_methods)]
impl Source for FaultySource {
    fn len(&self) -> u64 {
        self.inner.len()
    }

    fn is_empty(&self) -> bool {
        self.inner.is_empty()
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        self.plan
            .storage_op("read", || self.inner.read_at(offset, buf))
    }

    fn bytes(&self, range: Range<u64>) -> Result<Bytes> {
        self.plan.storage_op("bytes", || self.inner.bytes(range))
    }

    fn fetch(&self, ranges: &[Range<u64>]) -> Result<Vec<Bytes>> {
        self.plan.storage_op("fetch", || self.inner.fetch(ranges))
    }

    fn fetch_into(&self, jobs: &mut [(u64, &mut [u8])]) -> Result<()> {
        self.plan
            .storage_op("fetch_into", || self.inner.fetch_into(jobs))
    }

    fn fetch_ahead(&self) -> u64 {
        self.inner.fetch_ahead()
    }

    fn read_in_pieces(
        &self,
        range: Range<u64>,
        each: &mut dyn FnMut(u64, &[u8]) -> Result<()>,
    ) -> Result<()> {
        self.plan
            .storage_op("read_in_pieces", || self.inner.read_in_pieces(range, each))
    }
}

/// A file system whose operations follow a [`FaultPlan`]: the failed one returns an
/// `io::Error` wrapping the [`InjectedFault`]. Handles it opens count their writes, reads and
/// syncs too.
#[derive(Debug)]
pub struct FaultyFileSystem {
    inner: Arc<dyn FileSystem>,
    plan: FaultPlan,
}

impl FaultyFileSystem {
    /// Applies `plan` to every operation of `inner`.
    pub fn new(inner: Arc<dyn FileSystem>, plan: FaultPlan) -> Self {
        Self { inner, plan }
    }

    fn handle(&self, inner: Box<dyn FileHandle>) -> Box<dyn FileHandle> {
        Box::new(FaultyFile {
            inner,
            plan: self.plan.clone(),
        })
    }
}

#[deny(clippy::missing_trait_methods)]
impl FileSystem for FaultyFileSystem {
    fn create_new(&self, path: &Path) -> io::Result<Box<dyn FileHandle>> {
        let file = self
            .plan
            .file_op("create_new", || self.inner.create_new(path))?;
        Ok(self.handle(file))
    }

    fn create_truncate(&self, path: &Path) -> io::Result<Box<dyn FileHandle>> {
        let file = self
            .plan
            .file_op("create_truncate", || self.inner.create_truncate(path))?;
        Ok(self.handle(file))
    }

    fn open(&self, path: &Path) -> io::Result<Box<dyn FileHandle>> {
        let file = self.plan.file_op("open", || self.inner.open(path))?;
        Ok(self.handle(file))
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        self.plan.file_op("rename", || self.inner.rename(from, to))
    }

    fn rename_no_replace(&self, from: &Path, to: &Path) -> io::Result<()> {
        self.plan.file_op("rename_no_replace", || {
            self.inner.rename_no_replace(from, to)
        })
    }

    fn hard_link(&self, from: &Path, to: &Path) -> io::Result<()> {
        self.plan
            .file_op("hard_link", || self.inner.hard_link(from, to))
    }

    fn remove_file(&self, path: &Path) -> io::Result<()> {
        self.plan
            .file_op("remove_file", || self.inner.remove_file(path))
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        self.plan.file_op("sync_dir", || self.inner.sync_dir(dir))
    }

    fn remove_file_below(&self, root: &Path, relative: &Path) -> io::Result<()> {
        self.plan.file_op("remove_file_below", || {
            self.inner.remove_file_below(root, relative)
        })
    }

    fn remove_dir_below(&self, root: &Path, relative: &Path) -> io::Result<()> {
        self.plan.file_op("remove_dir_below", || {
            self.inner.remove_dir_below(root, relative)
        })
    }

    fn list_dir(&self, dir: &Path) -> io::Result<Vec<(OsString, EntryKind)>> {
        self.plan.file_op("list_dir", || self.inner.list_dir(dir))
    }

    fn create_dir_all(&self, dir: &Path) -> io::Result<()> {
        self.plan
            .file_op("create_dir_all", || self.inner.create_dir_all(dir))
    }

    fn hold_dir_below(&self, root: &Path, relative: &Path) -> io::Result<HeldDir> {
        self.plan.file_op("hold_dir_below", || {
            self.inner.hold_dir_below(root, relative)
        })
    }

    fn remove_dir(&self, dir: &Path) -> io::Result<()> {
        self.plan
            .file_op("remove_dir", || self.inner.remove_dir(dir))
    }

    fn copy_permissions(&self, from: &Path, to: &Path) -> io::Result<()> {
        self.plan
            .file_op("copy_permissions", || self.inner.copy_permissions(from, to))
    }
}

#[derive(Debug)]
struct FaultyFile {
    inner: Box<dyn FileHandle>,
    plan: FaultPlan,
}

#[deny(clippy::missing_trait_methods)]
impl FileHandle for FaultyFile {
    fn write_all(&mut self, data: &[u8]) -> io::Result<()> {
        self.plan
            .file_op("file write", || self.inner.write_all(data))
    }

    fn write_at(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        self.plan
            .file_op("file write at", || self.inner.write_at(offset, data))
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        self.plan
            .file_op("file read", || self.inner.read_at(offset, buf))
    }

    fn file_len(&self) -> io::Result<u64> {
        self.plan.file_op("file length", || self.inner.file_len())
    }

    fn sync_all(&self) -> io::Result<()> {
        self.plan.file_op("fsync", || self.inner.sync_all())
    }
}
