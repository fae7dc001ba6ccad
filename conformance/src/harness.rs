//! How the suite gets storages of the backend under test.

use std::sync::Arc;

use weightbay::Storage;
use weightbay::backend_kit::FileSystem;

use crate::case::Case;
use crate::faulty::FaultPlan;

/// How the suite gets storages of the backend under test.
pub trait Harness: Send + Sync + 'static {
    /// The backend's storage type.
    type Storage: Storage + 'static;

    /// Why the storage cannot be reached (a server that is not running), or `None` when it
    /// can. Every case is then shown as ignored with this reason, or fails when
    /// `WEIGHTBAY_REQUIRE_SERVERS=1`.
    fn unavailable(&self) -> Option<String> {
        None
    }

    /// The cases that cannot run on this backend. Such a case must report
    /// [`Outcome::NotApplicable`](crate::Outcome::NotApplicable); any other case that does fails,
    /// so a missing hook cannot quietly turn a case into a pass.
    fn not_applicable(&self) -> &[Case] {
        &[]
    }

    /// Cases that the server the backend is tested against cannot pass, through no fault of the
    /// backend: an emulator that lacks what the real store does (conditional writes that are
    /// not atomic, no object versions), each with the server's limitation in words. The suite
    /// shows them as not applicable with that reason instead of running them. A defect of the
    /// backend itself never belongs here.
    fn server_limitations(&self) -> &[(Case, &'static str)] {
        &[]
    }

    /// A fresh, empty storage namespace, isolated from every other one this harness made.
    fn fresh(&self) -> Self::Storage;

    /// A new handle to the same underlying storage (as a restarted process would open it).
    fn reopen(&self, storage: &Self::Storage) -> Self::Storage;

    /// A string from which another process can reopen `storage` with
    /// [`reopen_at`](Self::reopen_at); `None` when the storage does not outlive its
    /// process (the process-crash case is then not applicable).
    fn locator(&self, storage: &Self::Storage) -> Option<String> {
        let _ = storage;
        None
    }

    /// Reopens a storage from a [`locator`](Self::locator), in a child process.
    fn reopen_at(&self, locator: &str) -> Option<Self::Storage> {
        let _ = locator;
        None
    }

    /// Like [`reopen_at`](Self::reopen_at), with `faults` applied to the backend's own inner
    /// operations (file-system calls, store requests), so the process-crash case can kill
    /// between the steps of one `create`, `write` or `commit`. `None` when the backend has no
    /// such layer; the case then kills between storage operations only.
    fn reopen_at_with_faults(&self, locator: &str, faults: FaultPlan) -> Option<Self::Storage> {
        let _ = (locator, faults);
        None
    }

    /// The storage over a simulated file system, for backends that do their file I/O through
    /// [`weightbay::backend_kit::FileSystem`]; `None` otherwise (the power-loss and file-system
    /// fault cases are then not applicable).
    fn over_file_system(&self, fs: Arc<dyn FileSystem>) -> Option<Self::Storage> {
        let _ = fs;
        None
    }

    /// A batch length above every threshold at which the backend reads a batch differently
    /// (on several threads, in several requests), so the batched-read case takes those paths.
    /// Default 6 MiB: the local backend reads on several threads from 4 MiB.
    fn batched_read_len(&self) -> usize {
        6 << 20
    }

    /// How many keys one page of the backend's listing holds at most (object stores answer
    /// 1,000 a request), so the listing case writes more than fit in one. Default 1,000.
    fn listing_page_size(&self) -> usize {
        1000
    }

    /// A container length that the backend writes as several pieces (multipart parts, pages,
    /// blocks), so the round-trip, overwrite, create-new and crash cases check how the pieces
    /// are joined. Default 300,000 bytes.
    fn several_parts_len(&self) -> usize {
        300_000
    }

    /// Bytes the backend may hold in memory while writing a container of `container_len`
    /// bytes, beyond the writer's own buffer and the tensor being written (for example part
    /// size × parts in flight for an object store, or the whole container for memory).
    fn write_buffer_bound(&self, container_len: u64) -> u64 {
        let _ = container_len;
        0
    }
}
