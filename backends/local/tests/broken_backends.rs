//! File-system defects must fail the conformance suite, each in the case that covers it, with
//! a message that names the case and the step: the local backend over a file layer with one
//! defect, as a backend's own file code might have.

use std::io;
use std::path::Path;
use std::sync::Arc;

use weightbay::backend_kit::{EntryKind, FileHandle, FileSystem, HeldDir};
use weightbay::{CreateOptions, ErrorKind, Storage, WriteMode};
use weightbay_conformance::{
    Case, FaultPlan, FaultyFileSystem, Harness, Outcome, failure_of, failure_of_in,
};
use weightbay_local::{LocalStorage, StdFileSystem};

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
    /// No hard links, as on some FUSE and network file systems: create-new must fall back on
    /// renaming without replacing.
    NoHardLinks,
    /// No hard links, and "rename unless the name exists" made of a look and a rename.
    LooksThenRenames,
    /// Neither hard links nor "rename unless the name exists": create-new cannot be race-free.
    NoExclusiveName,
    /// A write at an offset lands at the end of the file, as `pwrite` does on Linux to a file
    /// opened with `O_APPEND`.
    AppendsWritesAt,
    /// A write at an offset writes its first 64 KiB and reports the whole written, as a
    /// single `pwrite` whose short count is ignored does.
    WritesAtShort,
}

#[derive(Debug)]
struct DefectiveFs {
    inner: Arc<dyn FileSystem>,
    defect: FsDefect,
}

/// A file with [`FsDefect::SkipsFsync`] or [`FsDefect::WritesAtShort`].
#[derive(Debug)]
struct DefectiveFile(Box<dyn FileHandle>, FsDefect);

impl FileHandle for DefectiveFile {
    fn write_all(&mut self, data: &[u8]) -> io::Result<()> {
        self.0.write_all(data)
    }
    fn write_at(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        match self.1 {
            FsDefect::WritesAtShort => self.0.write_at(offset, &data[..data.len().min(64 << 10)]),
            _ => self.0.write_at(offset, data),
        }
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        self.0.read_at(offset, buf)
    }
    fn file_len(&self) -> io::Result<u64> {
        self.0.file_len()
    }
    fn sync_all(&self) -> io::Result<()> {
        match self.1 {
            FsDefect::SkipsFsync => Ok(()),
            _ => self.0.sync_all(),
        }
    }
}

/// A file opened for appending: [`FsDefect::AppendsWritesAt`].
#[derive(Debug)]
struct AppendOnlyFile(std::sync::Mutex<Box<dyn FileHandle>>);

impl FileHandle for AppendOnlyFile {
    fn write_all(&mut self, data: &[u8]) -> io::Result<()> {
        self.0.get_mut().unwrap().write_all(data)
    }
    fn write_at(&self, _: u64, data: &[u8]) -> io::Result<()> {
        self.0.lock().unwrap().write_all(data)
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        self.0.lock().unwrap().read_at(offset, buf)
    }
    fn file_len(&self) -> io::Result<u64> {
        self.0.lock().unwrap().file_len()
    }
    fn sync_all(&self) -> io::Result<()> {
        self.0.lock().unwrap().sync_all()
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
            FsDefect::SkipsFsync | FsDefect::WritesAtShort => {
                Box::new(DefectiveFile(file, self.defect))
            }
            FsDefect::AppendsWritesAt => Box::new(AppendOnlyFile(std::sync::Mutex::new(file))),
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
    fn rename_no_replace(&self, from: &Path, to: &Path) -> io::Result<()> {
        if self.defect == FsDefect::NoExclusiveName {
            return Err(io::ErrorKind::Unsupported.into());
        }
        if self.defect == FsDefect::LooksThenRenames {
            if self.inner.open(to).is_ok() {
                return Err(io::ErrorKind::AlreadyExists.into());
            }
            return self.inner.rename(from, to);
        }
        self.answer(self.inner.rename_no_replace(from, to))
    }
    fn hard_link(&self, from: &Path, to: &Path) -> io::Result<()> {
        if matches!(
            self.defect,
            FsDefect::NoHardLinks | FsDefect::LooksThenRenames | FsDefect::NoExclusiveName
        ) {
            return Err(io::ErrorKind::Unsupported.into());
        }
        self.answer(self.inner.hard_link(from, to))
    }
    fn remove_file(&self, path: &Path) -> io::Result<()> {
        self.answer(self.inner.remove_file(path))
    }
    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        self.answer(self.inner.sync_dir(dir))
    }
    fn remove_file_below(&self, root: &Path, relative: &Path) -> io::Result<()> {
        self.answer(self.inner.remove_file_below(root, relative))
    }
    fn remove_dir_below(&self, root: &Path, relative: &Path) -> io::Result<()> {
        self.answer(self.inner.remove_dir_below(root, relative))
    }
    fn list_dir(&self, dir: &Path) -> io::Result<Vec<(std::ffi::OsString, EntryKind)>> {
        self.answer(self.inner.list_dir(dir))
    }
    fn create_dir_all(&self, dir: &Path) -> io::Result<()> {
        self.answer(self.inner.create_dir_all(dir))
    }
    fn hold_dir_below(&self, root: &Path, relative: &Path) -> io::Result<HeldDir> {
        self.answer(self.inner.hold_dir_below(root, relative))
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
fn writes_at_an_offset_that_append_fail_the_positioned_case() {
    let message = failure_of(
        &LocalWith::new(FsDefect::AppendsWritesAt),
        Case::PositionedWritesLandWhole,
    );
    assert!(
        message.contains(&format!(
            "`{}` failed: after the commit",
            Case::PositionedWritesLandWhole.name()
        )),
        "{message}"
    );
}

#[test]
fn writes_at_an_offset_that_stop_short_fail_the_positioned_case() {
    let message = failure_of(
        &LocalWith::new(FsDefect::WritesAtShort),
        Case::PositionedWritesLandWhole,
    );
    assert!(
        message.contains("large pieces") || message.contains("1.5 MiB"),
        "{message}"
    );
}

#[test]
fn skipping_fsync_fails_the_power_loss_case() {
    let message = failure_of(
        &LocalWith::new(FsDefect::SkipsFsync),
        Case::PowerLossAtEveryOperation,
    );
    assert!(
        message.contains(&format!(
            "`{}` failed",
            Case::PowerLossAtEveryOperation.name()
        )),
        "{message}"
    );
    assert!(message.contains("power lost after operation"), "{message}");
}

#[test]
fn skipping_fsync_fails_the_compressed_power_loss_case() {
    let message = failure_of(
        &LocalWith::new(FsDefect::SkipsFsync),
        Case::CompressedSavesSurvivePowerLoss,
    );
    assert!(
        message.contains("power lost after operation") && message.contains("compressed save"),
        "{message}"
    );
}

#[test]
fn removing_before_renaming_fails_the_file_system_fault_case() {
    let harness = LocalWith::new(FsDefect::RemovesThenRenames);
    // The gap is never durable, so power loss cannot see it; a failed rename on a live system
    // can.
    let power_loss = Case::PowerLossAtEveryOperation;
    let _ = power_loss.run(&harness, power_loss.name());
    let message = failure_of(&harness, Case::FileSystemFaultAtEveryOperation);
    assert!(
        message.contains(&format!(
            "`{}` failed",
            Case::FileSystemFaultAtEveryOperation.name()
        )),
        "{message}"
    );
    assert!(message.contains("is missing but should hold"), "{message}");
}

#[test]
fn rebuilding_errors_from_their_text_fails_the_file_system_fault_case() {
    let message = failure_of(
        &LocalWith::new(FsDefect::RewritesErrors),
        Case::FileSystemFaultAtEveryOperation,
    );
    assert!(message.contains("the error lost its cause"), "{message}");
}

#[test]
fn copying_instead_of_renaming_fails_the_process_crash_case() {
    let harness = LocalWith::new(FsDefect::CopiesInsteadOfRenaming);
    let this_test = weightbay_conformance::cases::crash::test_path(
        module_path!(),
        "copying_instead_of_renaming_fails_the_process_crash_case",
    );
    let message = failure_of_in(&harness, Case::ProcessCrashAtEveryStep, &this_test);
    // The case re-runs this test in its child, so the message names this test.
    assert!(
        message.contains(&format!("`{this_test}` failed")),
        "{message}"
    );
    assert!(
        message.contains("writer killed after Inner operation"),
        "{message}"
    );
}

#[test]
fn looking_before_renaming_fails_the_step_by_step_race() {
    let message = failure_of(
        &LocalWith::new(FsDefect::LooksThenRenames),
        Case::CreateNewRaceStepByStep,
    );
    assert!(
        message.contains("exactly one create-new must win"),
        "{message}"
    );
}

#[test]
fn create_new_without_hard_links_still_has_one_winner() {
    let harness = LocalWith::new(FsDefect::NoHardLinks);
    for case in [
        Case::CreateNewRaceStepByStep,
        Case::InterleavedCommitsResolveInOrder,
        Case::CreateNewRefusesExisting,
        Case::PowerLossAtEveryOperation,
    ] {
        // A failing case panics with its message.
        let outcome = case.run(&harness, case.name());
        assert!(
            matches!(outcome, Outcome::Checked),
            "{}: {outcome:?}",
            case.name()
        );
    }
}

#[test]
fn create_new_without_an_exclusive_name_fails_clearly_and_leaves_nothing() {
    let harness = LocalWith::new(FsDefect::NoExclusiveName);
    let storage = harness.fresh();
    let options = CreateOptions::default().with_mode(WriteMode::CreateNew);
    let mut sink = storage.create("a.bpk", &options).expect("create");
    sink.write(b"bytes").expect("write");
    let error = sink
        .commit()
        .expect_err("create-new cannot be race-free here");
    assert_eq!(error.kind(), ErrorKind::Unsupported, "{error}");
    assert!(error.to_string().contains("a.bpk"), "{error}");
    assert!(error.to_string().contains("neither hard links"), "{error}");
    assert!(storage.list("").expect("list").is_empty());
    assert!(storage.pending("").expect("pending").is_empty());
}
