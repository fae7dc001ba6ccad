//! Broken backends must fail the suite, each in the case that covers its bug, with a message
//! that names the case and the step. Each defect here is one the suite once let through.

#[path = "../../backends/object-store/tests/support/mod.rs"]
mod object_store_support;
mod toy;

use std::io;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::Path;
use std::sync::Arc;

use object_store_support::SMALL_PARTS;
use object_store_support::intercept::{Intercepted, StoreDefect};
use toy::{Defect, HashMapHarness};
use weightbay::backend_kit::{FileHandle, FileSystem};
use weightbay_conformance::{FaultPlan, FaultyFileSystem, Harness, Outcome, cases, verdict};
use weightbay_local::{LocalStorage, StdFileSystem};
use weightbay_object_store::ObjectStorage;

/// Runs `run` and returns its panic message; fails if it did not panic.
fn failure_of(run: impl FnOnce() -> Outcome) -> String {
    let panic = catch_unwind(AssertUnwindSafe(run))
        .map(|outcome| panic!("the broken backend passed the case: {outcome:?}"))
        .unwrap_err();
    panic
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| panic.downcast_ref::<&str>().map(ToString::to_string))
        .unwrap_or_default()
}

fn broken(defect: Defect) -> HashMapHarness {
    HashMapHarness {
        defect: Some(defect),
    }
}

#[test]
fn publishing_partial_data_fails_the_abort_case() {
    let message =
        failure_of(|| cases::abort_on_drop_leaves_nothing(&broken(Defect::PublishesPartialWrites)));
    assert!(
        message.contains("`abort_on_drop_leaves_nothing` failed"),
        "{message}"
    );
    assert!(message.contains("after dropping a sink"), "{message}");
}

#[test]
fn ignoring_create_new_fails_the_create_new_cases() {
    let message =
        failure_of(|| cases::create_new_refuses_existing(&broken(Defect::IgnoresCreateNew)));
    assert!(message.contains("expected AlreadyExists"), "{message}");
    let message =
        failure_of(|| cases::create_new_race_has_one_winner(&broken(Defect::IgnoresCreateNew)));
    assert!(message.contains("writers won"), "{message}");
}

#[test]
fn swallowing_write_errors_fails_the_roundtrip_case() {
    let message =
        failure_of(|| cases::roundtrip_matches_writer(&broken(Defect::SwallowsWriteErrors)));
    assert!(
        message.contains("`roundtrip_matches_writer` failed"),
        "{message}"
    );
    assert!(message.contains("came back different"), "{message}");
}

#[test]
fn a_failing_property_prints_the_seed_to_replay_it() {
    // Stale reads break the property round trip on its second case at the latest.
    let message = failure_of(|| cases::model_based_operations(&broken(Defect::ServesStaleReads)));
    assert!(
        message.contains("`model_based_operations` failed"),
        "{message}"
    );
    assert!(message.contains("minimal input"), "{message}");
    assert!(message.contains("replay with WEIGHTBAY_SEED="), "{message}");
}

#[test]
fn stale_reads_fail_the_overwrite_case() {
    let message = failure_of(|| cases::overwrite_replaces_whole(&broken(Defect::ServesStaleReads)));
    assert!(message.contains("after overwrite 1"), "{message}");
}

#[test]
fn deleting_then_inserting_fails_the_readers_case() {
    let message =
        failure_of(|| cases::readers_keep_their_version(&broken(Defect::DeletesThenInserts)));
    assert!(
        message.contains("`readers_keep_their_version` failed"),
        "{message}"
    );
    assert!(
        message.contains("exists throughout an overwrite failed with NotFound"),
        "{message}"
    );
}

#[test]
fn failing_pending_with_io_fails_the_capabilities_case() {
    let message = failure_of(|| {
        cases::undeclared_capabilities_are_unsupported(&broken(Defect::PendingFailsAsIo))
    });
    assert!(
        message.contains("pending listing is not declared: expected Unsupported, got Io"),
        "{message}"
    );
}

#[test]
fn listing_by_string_prefix_fails_the_model_case() {
    let message =
        failure_of(|| cases::model_based_operations(&broken(Defect::ListsByStringPrefix)));
    assert!(
        message.contains("but the committed containers are"),
        "{message}"
    );
}

#[test]
fn refusing_unknown_content_fails_the_corrupt_case() {
    let message = failure_of(|| {
        cases::corrupt_containers_fail_cleanly(&broken(Defect::RefusesUnknownContent))
    });
    assert!(
        message.contains("`corrupt_containers_fail_cleanly` failed"),
        "{message}"
    );
    assert!(
        message.contains("expected Corrupt or LimitExceeded, got InvalidInput"),
        "{message}"
    );
}

/// The in-memory HashMap harness with no cases declared not applicable.
struct Undeclared(HashMapHarness);

impl Harness for Undeclared {
    type Storage = toy::HashMapStorage;
    fn fresh(&self) -> Self::Storage {
        self.0.fresh()
    }
    fn reopen(&self, storage: &Self::Storage) -> Self::Storage {
        self.0.reopen(storage)
    }
}

#[test]
fn a_case_that_cannot_run_fails_unless_declared() {
    let harness = Undeclared(HashMapHarness::default());
    let case = "power_loss_at_every_operation";
    let message = verdict(
        &harness,
        case,
        cases::power_loss_at_every_operation(&harness),
    )
    .expect_err("an undeclared skip passed");
    assert!(
        message.contains("unexpected skip is a failure"),
        "{message}"
    );
    // Declared, it is a skip with its reason.
    let declared = HashMapHarness::default();
    let reason = verdict(
        &declared,
        case,
        cases::power_loss_at_every_operation(&declared),
    );
    assert!(
        matches!(&reason, Ok(Some(why)) if why.contains("FileSystem")),
        "{reason:?}"
    );
    // Declared but able to run: the declaration must go.
    let message = verdict(&declared, "process_crash_at_every_step", Outcome::Checked)
        .expect_err("a declared skip that ran passed");
    assert!(message.contains("remove it from the list"), "{message}");
}

/// The object-store backend over object_store's InMemory, behind a store with one defect.
struct DefectiveStore(StoreDefect);

impl Harness for DefectiveStore {
    type Storage = ObjectStorage;
    fn fresh(&self) -> ObjectStorage {
        let store = Intercepted::new(
            Arc::new(object_store::memory::InMemory::new()),
            FaultPlan::counting(),
            Some(self.0),
        );
        ObjectStorage::new(Arc::new(store))
            .expect("a runtime")
            .with_options(SMALL_PARTS)
    }
    fn reopen(&self, storage: &ObjectStorage) -> ObjectStorage {
        storage.clone()
    }
}

#[test]
fn completing_a_multipart_upload_without_a_part_fails_the_roundtrip_case() {
    let message = failure_of(|| {
        cases::roundtrip_matches_writer(&DefectiveStore(StoreDefect::DropsSecondPart))
    });
    assert!(
        message.contains("`roundtrip_matches_writer` failed"),
        "{message}"
    );
    assert!(message.contains("came back different"), "{message}");
}

#[test]
fn ignoring_the_pinned_version_fails_the_readers_case() {
    let message = failure_of(|| {
        cases::readers_keep_their_version(&DefectiveStore(StoreDefect::IgnoresPinnedVersion))
    });
    assert!(
        message.contains("read the tail of another version after the overwrite committed"),
        "{message}"
    );
}

/// A file-system layer with one defect, as a backend's own file code might have.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum FsDefect {
    /// File fsyncs return at once and make nothing durable.
    SkipsFsync,
    /// Replacing a file removes the destination first, then renames onto the free name.
    RemovesThenRenames,
    /// Replacing a file copies the bytes over the destination, then removes the source.
    CopiesInsteadOfRenaming,
    /// Errors are rebuilt from their text: the message stays, the cause is gone.
    RewritesErrors,
}

#[derive(Debug)]
struct DefectiveFs {
    inner: Arc<dyn FileSystem>,
    defect: FsDefect,
}

#[derive(Debug)]
struct NoSyncFile(Box<dyn FileHandle>);

impl FileHandle for NoSyncFile {
    fn write_all(&mut self, data: &[u8]) -> io::Result<()> {
        self.0.write_all(data)
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        self.0.read_at(offset, buf)
    }
    fn file_len(&self) -> io::Result<u64> {
        self.0.file_len()
    }
    fn sync_all(&self) -> io::Result<()> {
        Ok(())
    }
}

impl DefectiveFs {
    fn wrap(inner: Arc<dyn FileSystem>, defect: FsDefect) -> Arc<dyn FileSystem> {
        Arc::new(Self { inner, defect })
    }

    fn answer<T>(&self, result: io::Result<T>) -> io::Result<T> {
        match self.defect {
            FsDefect::RewritesErrors => result.map_err(|e| io::Error::new(e.kind(), e.to_string())),
            _ => result,
        }
    }

    fn file(&self, file: io::Result<Box<dyn FileHandle>>) -> io::Result<Box<dyn FileHandle>> {
        let file = self.answer(file)?;
        Ok(match self.defect {
            FsDefect::SkipsFsync => Box::new(NoSyncFile(file)),
            _ => file,
        })
    }
}

impl FileSystem for DefectiveFs {
    fn create_new(&self, path: &Path) -> io::Result<Box<dyn FileHandle>> {
        self.file(self.inner.create_new(path))
    }
    fn create_truncate(&self, path: &Path) -> io::Result<Box<dyn FileHandle>> {
        self.file(self.inner.create_truncate(path))
    }
    fn open(&self, path: &Path) -> io::Result<Box<dyn FileHandle>> {
        self.answer(self.inner.open(path))
    }
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        match self.defect {
            FsDefect::RemovesThenRenames => {
                match self.inner.remove_file(to) {
                    Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
                    _ => {}
                }
                self.inner.rename(from, to)
            }
            FsDefect::CopiesInsteadOfRenaming => {
                let source = self.inner.open(from)?;
                let mut bytes = vec![0; usize::try_from(source.file_len()?).unwrap_or(0)];
                source.read_at(0, &mut bytes)?;
                let mut destination = self.inner.create_truncate(to)?;
                destination.write_all(&bytes)?;
                destination.sync_all()?;
                self.inner.remove_file(from)
            }
            _ => self.answer(self.inner.rename(from, to)),
        }
    }
    fn hard_link(&self, from: &Path, to: &Path) -> io::Result<()> {
        self.answer(self.inner.hard_link(from, to))
    }
    fn remove_file(&self, path: &Path) -> io::Result<()> {
        self.answer(self.inner.remove_file(path))
    }
    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        self.answer(self.inner.sync_dir(dir))
    }
    fn list_dir(&self, dir: &Path) -> io::Result<Vec<std::ffi::OsString>> {
        self.answer(self.inner.list_dir(dir))
    }
    fn create_dir_all(&self, dir: &Path) -> io::Result<()> {
        self.answer(self.inner.create_dir_all(dir))
    }
    fn remove_dir(&self, dir: &Path) -> io::Result<()> {
        self.answer(self.inner.remove_dir(dir))
    }
    fn copy_permissions(&self, from: &Path, to: &Path) -> io::Result<()> {
        self.answer(self.inner.copy_permissions(from, to))
    }
}

/// The local backend with a defective file layer, on the simulated disk the cases hand over
/// or, for the crash case, on real files under a temporary directory.
#[derive(Debug)]
struct LocalWith {
    defect: FsDefect,
    root: tempfile::TempDir,
}

impl LocalWith {
    fn new(defect: FsDefect) -> Self {
        Self {
            defect,
            root: tempfile::tempdir().expect("a temporary directory"),
        }
    }
}

impl Harness for LocalWith {
    type Storage = LocalStorage;
    fn fresh(&self) -> LocalStorage {
        let dir = tempfile::tempdir_in(self.root.path()).expect("a temporary directory");
        LocalStorage::with_file_system(
            dir.keep(),
            DefectiveFs::wrap(Arc::new(StdFileSystem), self.defect),
        )
    }
    fn reopen(&self, storage: &LocalStorage) -> LocalStorage {
        storage.clone()
    }
    fn locator(&self, storage: &LocalStorage) -> Option<String> {
        storage.root().to_str().map(str::to_owned)
    }
    fn reopen_at(&self, locator: &str) -> Option<LocalStorage> {
        Some(LocalStorage::new(locator))
    }
    fn reopen_at_with_faults(&self, locator: &str, faults: FaultPlan) -> Option<LocalStorage> {
        // The defect's own steps go through the faults, so the crash can fall between them.
        let faulty = Arc::new(FaultyFileSystem::new(Arc::new(StdFileSystem), faults));
        Some(LocalStorage::with_file_system(
            locator,
            DefectiveFs::wrap(faulty, self.defect),
        ))
    }
    fn over_file_system(&self, fs: Arc<dyn FileSystem>) -> Option<LocalStorage> {
        Some(LocalStorage::with_file_system(
            "/root",
            DefectiveFs::wrap(fs, self.defect),
        ))
    }
}

#[test]
fn skipping_fsync_fails_the_power_loss_case() {
    let message =
        failure_of(|| cases::power_loss_at_every_operation(&LocalWith::new(FsDefect::SkipsFsync)));
    assert!(
        message.contains("`power_loss_at_every_operation` failed"),
        "{message}"
    );
    assert!(message.contains("power lost after operation"), "{message}");
}

#[test]
fn removing_before_renaming_fails_the_file_system_fault_case() {
    let harness = LocalWith::new(FsDefect::RemovesThenRenames);
    // The gap is never durable, so power loss cannot see it; a failed rename on a live system
    // can.
    let _ = cases::power_loss_at_every_operation(&harness);
    let message = failure_of(|| cases::file_system_fault_at_every_operation(&harness));
    assert!(
        message.contains("`file_system_fault_at_every_operation` failed"),
        "{message}"
    );
    assert!(message.contains("is missing but should hold"), "{message}");
}

#[test]
fn rebuilding_errors_from_their_text_fails_the_file_system_fault_case() {
    let message = failure_of(|| {
        cases::file_system_fault_at_every_operation(&LocalWith::new(FsDefect::RewritesErrors))
    });
    assert!(message.contains("the error lost its cause"), "{message}");
}

#[test]
fn copying_instead_of_renaming_fails_the_process_crash_case() {
    let harness = LocalWith::new(FsDefect::CopiesInsteadOfRenaming);
    let this_test = cases::test_path(
        module_path!(),
        "copying_instead_of_renaming_fails_the_process_crash_case",
    );
    let message = failure_of(|| cases::process_crash_at_every_step(&harness, &this_test));
    assert!(
        message.contains("`process_crash_at_every_step` failed"),
        "{message}"
    );
    assert!(
        message.contains("writer killed after Inner operation"),
        "{message}"
    );
}
