//! The mmap backend passes the conformance suite: zero-copy reads, and the local backend's
//! durable atomic saves (in-place writes refused).

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};

use weightbay_conformance::{Case, FaultPlan, FaultyFileSystem, Harness};
use weightbay_local::{LocalStorage, StdFileSystem};
use weightbay_mmap::MmapStorage;

#[derive(Debug)]
struct Mmap {
    /// Made on first use: the crash case's child process, which only reopens its parent's
    /// storage and is then killed, must not leave a directory of its own behind.
    root: OnceLock<tempfile::TempDir>,
    next: AtomicUsize,
}

impl Default for Mmap {
    fn default() -> Self {
        Self {
            root: OnceLock::new(),
            next: AtomicUsize::new(0),
        }
    }
}

impl Harness for Mmap {
    type Storage = MmapStorage;

    fn fresh(&self) -> MmapStorage {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        MmapStorage::new(
            self.root
                .get_or_init(|| tempfile::tempdir().expect("a temporary directory"))
                .path()
                .join(format!("storage-{n}")),
        )
    }

    fn reopen(&self, storage: &MmapStorage) -> MmapStorage {
        MmapStorage::new(storage.local().root())
    }

    fn locator(&self, storage: &MmapStorage) -> Option<String> {
        storage.local().root().to_str().map(str::to_owned)
    }

    fn reopen_at(&self, locator: &str) -> Option<MmapStorage> {
        Some(MmapStorage::new(PathBuf::from(locator)))
    }

    fn reopen_at_with_faults(&self, locator: &str, faults: FaultPlan) -> Option<MmapStorage> {
        // Maps read the real files; the saves' file operations go through the faults.
        let fs = FaultyFileSystem::new(Arc::new(StdFileSystem), faults);
        Some(MmapStorage::over(LocalStorage::with_file_system(
            locator,
            Arc::new(fs),
        )))
    }

    fn not_applicable(&self) -> &[Case] {
        // Maps need real files: there is no simulated file system to put this backend on.
        &[
            Case::PowerLossAtEveryOperation,
            Case::CompressedSavesSurvivePowerLoss,
            Case::FileSystemFaultAtEveryOperation,
            Case::CreateNewRaceStepByStep,
        ]
    }
}

weightbay_conformance::suite!(Mmap::default());
