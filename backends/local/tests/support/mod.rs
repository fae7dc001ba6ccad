//! The conformance harness for [`LocalStorage`]: each fresh storage is its own directory under
//! one temporary root that lives as long as the harness.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};

use weightbay::backend_kit::FileSystem;
use weightbay_conformance::{FaultPlan, FaultyFileSystem, Harness};
use weightbay_local::{LocalStorage, StdFileSystem};

#[derive(Debug)]
pub(crate) struct Local {
    /// Made on first use: the crash case's child process, which only reopens its parent's
    /// storage and is then killed, must not leave a directory of its own behind.
    root: OnceLock<tempfile::TempDir>,
    next: AtomicUsize,
}

impl Default for Local {
    fn default() -> Self {
        Self {
            root: OnceLock::new(),
            next: AtomicUsize::new(0),
        }
    }
}

impl Harness for Local {
    type Storage = LocalStorage;

    fn fresh(&self) -> LocalStorage {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        LocalStorage::new(
            self.root
                .get_or_init(|| tempfile::tempdir().expect("a temporary directory"))
                .path()
                .join(format!("storage-{n}")),
        )
    }

    fn reopen(&self, storage: &LocalStorage) -> LocalStorage {
        LocalStorage::new(storage.root())
    }

    fn locator(&self, storage: &LocalStorage) -> Option<String> {
        storage.root().to_str().map(str::to_owned)
    }

    fn reopen_at(&self, locator: &str) -> Option<LocalStorage> {
        Some(LocalStorage::new(PathBuf::from(locator)))
    }

    fn reopen_at_with_faults(&self, locator: &str, faults: FaultPlan) -> Option<LocalStorage> {
        Some(LocalStorage::with_file_system(
            locator,
            Arc::new(FaultyFileSystem::new(Arc::new(StdFileSystem), faults)),
        ))
    }

    fn over_file_system(&self, fs: Arc<dyn FileSystem>) -> Option<LocalStorage> {
        Some(LocalStorage::with_file_system("/simulated/root", fs))
    }
}
