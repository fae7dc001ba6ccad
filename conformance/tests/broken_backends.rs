//! Broken backends must fail the suite, each in the case that covers its bug, with a message
//! that names the case.

mod toy;

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;

use toy::{Defect, HashMapHarness};
use weightbay::fs::{FileHandle, FileSystem};
use weightbay_conformance::{Harness, cases};
use weightbay_local::LocalStorage;

/// Runs `run` and returns its panic message; fails if it did not panic.
fn failure_of(run: impl FnOnce()) -> String {
    let panic =
        catch_unwind(AssertUnwindSafe(run)).expect_err("the broken backend passed the case");
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

/// A disk that says it synced but did not: what a backend that skips fsync looks like to the
/// power-loss case.
#[derive(Debug)]
struct SkipsFsync(Arc<dyn FileSystem>);

#[derive(Debug)]
struct NoSyncFile(Box<dyn FileHandle>);

impl FileHandle for NoSyncFile {
    fn write_all(&mut self, data: &[u8]) -> std::io::Result<()> {
        self.0.write_all(data)
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> std::io::Result<()> {
        self.0.read_at(offset, buf)
    }
    fn file_len(&self) -> std::io::Result<u64> {
        self.0.file_len()
    }
    fn sync_all(&self) -> std::io::Result<()> {
        Ok(())
    }
}

impl FileSystem for SkipsFsync {
    fn create_new(&self, path: &std::path::Path) -> std::io::Result<Box<dyn FileHandle>> {
        Ok(Box::new(NoSyncFile(self.0.create_new(path)?)))
    }
    fn create_truncate(&self, path: &std::path::Path) -> std::io::Result<Box<dyn FileHandle>> {
        Ok(Box::new(NoSyncFile(self.0.create_truncate(path)?)))
    }
    fn open(&self, path: &std::path::Path) -> std::io::Result<Box<dyn FileHandle>> {
        self.0.open(path)
    }
    fn rename(&self, from: &std::path::Path, to: &std::path::Path) -> std::io::Result<()> {
        self.0.rename(from, to)
    }
    fn hard_link(&self, from: &std::path::Path, to: &std::path::Path) -> std::io::Result<()> {
        self.0.hard_link(from, to)
    }
    fn remove_file(&self, path: &std::path::Path) -> std::io::Result<()> {
        self.0.remove_file(path)
    }
    fn sync_dir(&self, dir: &std::path::Path) -> std::io::Result<()> {
        self.0.sync_dir(dir)
    }
    fn list_dir(&self, dir: &std::path::Path) -> std::io::Result<Vec<std::ffi::OsString>> {
        self.0.list_dir(dir)
    }
    fn create_dir_all(&self, dir: &std::path::Path) -> std::io::Result<()> {
        self.0.create_dir_all(dir)
    }
    fn remove_dir(&self, dir: &std::path::Path) -> std::io::Result<()> {
        self.0.remove_dir(dir)
    }
    fn copy_permissions(
        &self,
        from: &std::path::Path,
        to: &std::path::Path,
    ) -> std::io::Result<()> {
        self.0.copy_permissions(from, to)
    }
}

/// The local backend over a disk whose file fsyncs do nothing.
#[derive(Debug)]
struct LocalWithoutFsync;

impl Harness for LocalWithoutFsync {
    type Storage = LocalStorage;
    fn fresh(&self) -> LocalStorage {
        unreachable!("only the power-loss case runs")
    }
    fn reopen(&self, storage: &LocalStorage) -> LocalStorage {
        storage.clone()
    }
    fn over_file_system(&self, fs: Arc<dyn FileSystem>) -> Option<LocalStorage> {
        // The case hands us its simulated disk; every file fsync is hidden from it.
        Some(LocalStorage::with_file_system(
            "/root",
            Arc::new(SkipsFsync(fs)),
        ))
    }
}

#[test]
fn skipping_fsync_fails_the_power_loss_case() {
    let message = failure_of(|| cases::power_loss_at_every_operation(&LocalWithoutFsync));
    assert!(
        message.contains("`power_loss_at_every_operation` failed"),
        "{message}"
    );
    assert!(message.contains("power lost after operation"), "{message}");
}
