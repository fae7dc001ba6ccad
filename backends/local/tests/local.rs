//! File-level guarantees of the local backend beyond the conformance suite.

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};

use weightbay::{
    DType, Durability, ErrorKind, PendingWrite, Reader, Storage, Tensor, WriteMode, Writer,
};
use weightbay_local::LocalStorage;

fn container(fill: u8, len: usize) -> Writer {
    Writer::new(vec![Tensor::new(
        "w",
        DType::U8,
        [len as u64],
        vec![fill; len],
    )])
}

#[test]
fn permissions_carry_over_and_symlinks_are_replaced() {
    let dir = tempfile::tempdir().unwrap();
    let storage = LocalStorage::new(dir.path());
    container(1, 10).write_to(&storage, "m.bpk").unwrap();
    let path = dir.path().join("m.bpk");
    fs::set_permissions(&path, fs::Permissions::from_mode(0o640)).unwrap();
    container(2, 10).write_to(&storage, "m.bpk").unwrap();
    assert_eq!(
        fs::metadata(&path).unwrap().permissions().mode() & 0o777,
        0o640
    );

    let target = dir.path().join("elsewhere.bpk");
    fs::write(&target, b"untouched").unwrap();
    std::os::unix::fs::symlink(&target, dir.path().join("link.bpk")).unwrap();
    container(3, 10).write_to(&storage, "link.bpk").unwrap();
    assert!(
        !fs::symlink_metadata(dir.path().join("link.bpk"))
            .unwrap()
            .file_type()
            .is_symlink()
    );
    assert_eq!(fs::read(&target).unwrap(), b"untouched");
}

#[test]
fn in_place_writes_keep_the_inode_and_other_hard_links() {
    let dir = tempfile::tempdir().unwrap();
    let storage = LocalStorage::new(dir.path());
    container(1, 10).write_to(&storage, "m.bpk").unwrap();
    let path = dir.path().join("m.bpk");
    let inode = fs::metadata(&path).unwrap().ino();
    fs::hard_link(&path, dir.path().join("other-name.bpk")).unwrap();
    container(2, 20)
        .with_mode(WriteMode::InPlace)
        .write_to(&storage, "m.bpk")
        .unwrap();
    assert_eq!(fs::metadata(&path).unwrap().ino(), inode);
    let reader = Reader::open(storage.open("other-name.bpk").unwrap()).unwrap();
    assert_eq!(
        reader.read("w").unwrap(),
        vec![2; 20],
        "the other hard link sees the new bytes"
    );
}

#[test]
fn a_source_keeps_its_handle() {
    let dir = tempfile::tempdir().unwrap();
    let storage = LocalStorage::new(dir.path());
    container(1, 5000).write_to(&storage, "m.bpk").unwrap();
    let reader = Reader::open(storage.open("m.bpk").unwrap()).unwrap();
    // Replaced by rename: the open handle still reads the old inode.
    container(2, 5000).write_to(&storage, "m.bpk").unwrap();
    assert_eq!(reader.read("w").unwrap(), vec![1; 5000]);
    reader.verify().unwrap();

    // Truncated in place: a typed error, never a panic.
    let reader = Reader::open(storage.open("m.bpk").unwrap()).unwrap();
    let bytes = reader.bytes("w").unwrap();
    fs::OpenOptions::new()
        .write(true)
        .open(dir.path().join("m.bpk"))
        .unwrap()
        .set_len(300)
        .unwrap();
    let err = bytes.to_vec().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Io);
    assert!(
        err.to_string().contains("shrank after it was opened"),
        "{err}"
    );
    assert_eq!(reader.verify().unwrap_err().kind(), ErrorKind::Io);
}

#[test]
fn clean_pending_removes_only_dead_writers_scratch_files() {
    let dir = tempfile::tempdir().unwrap();
    let storage = LocalStorage::new(dir.path());
    container(1, 10).write_to(&storage, "sub/m.bpk").unwrap();
    // A scratch file of a process that no longer exists, and one of a live process.
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let dead = child.id();
    child.wait().unwrap();
    fs::write(
        dir.path().join(format!("sub/m.bpk.{dead}-7.tmp")),
        b"partial",
    )
    .unwrap();
    let live = std::process::id();
    fs::write(
        dir.path().join(format!("m.bpk.{live}-99.tmp")),
        b"in progress",
    )
    .unwrap();
    let scratch = |path: String, pid: u32, abandoned: bool| {
        let key = if path.starts_with("sub/") {
            "sub/m.bpk"
        } else {
            "m.bpk"
        };
        PendingWrite::new(
            key,
            format!("scratch file {path} of process {pid}"),
            abandoned,
        )
    };
    let live_scratch = scratch(format!("m.bpk.{live}-99.tmp"), live, false);
    let dead_scratch = scratch(format!("sub/m.bpk.{dead}-7.tmp"), dead, true);
    let mut pending = storage.pending("").unwrap();
    pending.sort();
    assert_eq!(pending, [live_scratch.clone(), dead_scratch.clone()]);
    // A prefix scopes both.
    assert_eq!(
        storage.pending("sub").unwrap(),
        std::slice::from_ref(&dead_scratch)
    );
    assert!(storage.clean_pending("other").unwrap().is_empty());
    assert_eq!(storage.clean_pending("").unwrap(), [dead_scratch]);
    assert_eq!(storage.pending("").unwrap(), [live_scratch]);
    assert!(dir.path().join("sub/m.bpk").exists());
}

#[test]
fn flushed_durability_still_publishes_atomically() {
    let dir = tempfile::tempdir().unwrap();
    let storage = LocalStorage::new(dir.path());
    container(4, 100)
        .with_durability(Durability::Flushed)
        .write_to(&storage, "m.bpk")
        .unwrap();
    assert_eq!(
        Reader::open(storage.open("m.bpk").unwrap())
            .unwrap()
            .read("w")
            .unwrap(),
        vec![4; 100]
    );
    assert!(storage.pending("").unwrap().is_empty());
}

#[test]
fn errors_name_the_file() {
    let dir = tempfile::tempdir().unwrap();
    fs::write(
        dir.path().join("blocker"),
        b"a file where a directory should be",
    )
    .unwrap();
    let storage = LocalStorage::new(dir.path());
    let err = container(1, 1)
        .write_to(&storage, "blocker/m.bpk")
        .unwrap_err();
    assert!(err.to_string().contains("blocker"), "{err}");
    assert_eq!(err.key(), Some("blocker/m.bpk"));
    let err = storage.open("missing.bpk").unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotFound);
    assert!(err.to_string().contains("missing.bpk"), "{err}");
}

/// Writes a file with holes for padding, so an 8 GiB offset costs no disk.
struct SparseFileSink(fs::File);

impl weightbay::Sink for SparseFileSink {
    fn write(&mut self, data: &[u8]) -> weightbay::Result<()> {
        use std::io::Write;
        self.0
            .write_all(data)
            .map_err(|e| weightbay::Error::io("write", e))
    }
    fn pad(&mut self, len: u64) -> weightbay::Result<()> {
        use std::io::{Seek, SeekFrom};
        let offset = i64::try_from(len).unwrap();
        self.0
            .seek(SeekFrom::Current(offset))
            .map(|_| ())
            .map_err(|e| weightbay::Error::io("seek", e))
    }
    fn commit(self: Box<Self>) -> weightbay::Result<()> {
        Ok(())
    }
}

/// A tensor placed at an absolute offset of 8 GiB (a sparse file) reads back through the
/// local source, and verifies.
#[test]
fn offsets_beyond_four_gib() {
    const EIGHT_GIB: u64 = 8 << 30;
    let dir = tempfile::tempdir().unwrap();
    let file = fs::File::create(dir.path().join("big.bpk")).unwrap();
    let tail = Tensor::new(
        "tail",
        DType::U32,
        [2],
        [7u32, 9].map(u32::to_le_bytes).concat(),
    );
    let mut sink = SparseFileSink(file);
    let len = Writer::new(vec![tail])
        .with_alignment(EIGHT_GIB)
        .write_to_sink(&mut sink)
        .unwrap();
    assert!(len > EIGHT_GIB);
    assert_eq!(fs::metadata(dir.path().join("big.bpk")).unwrap().len(), len);

    let storage = LocalStorage::new(dir.path());
    let reader = Reader::open(storage.open("big.bpk").unwrap()).unwrap();
    assert_eq!(reader.tensor("tail").unwrap().range().start, EIGHT_GIB);
    assert_eq!(
        reader.read("tail").unwrap(),
        [7u32, 9].map(u32::to_le_bytes).concat()
    );
}

#[test]
fn an_abandoned_save_removes_the_directories_it_made() {
    let dir = tempfile::tempdir().unwrap();
    let storage = LocalStorage::new(dir.path());
    let mut sink = storage
        .create("a/b/c/m.bpk", &weightbay::CreateOptions::default())
        .unwrap();
    sink.write(b"partial").unwrap();
    drop(sink);
    assert!(
        !dir.path().join("a").exists(),
        "the new directories are gone"
    );
    container(1, 10).write_to(&storage, "a/keep.bpk").unwrap();
    drop(
        storage
            .create("a/b/m.bpk", &weightbay::CreateOptions::default())
            .unwrap(),
    );
    assert!(dir.path().join("a/keep.bpk").exists() && !dir.path().join("a/b").exists());
}

/// A large container that is replaced or deleted is freed off the caller's path (Linux), but
/// it is freed: no handle to it outlives the background close. Containers from 64 MiB are
/// held so.
#[cfg(target_os = "linux")]
#[test]
fn a_replaced_or_deleted_container_is_released() {
    let dir = tempfile::tempdir().unwrap();
    let storage = LocalStorage::new(dir.path());
    let path = dir.path().join("m.bpk");
    let len = 65 << 20;
    let holds_a_freed_file = || {
        fs::read_dir("/proc/self/fd").unwrap().flatten().any(|fd| {
            fs::read_link(fd.path()).is_ok_and(|target| {
                target.to_string_lossy() == format!("{} (deleted)", path.display())
            })
        })
    };
    let wait_until_released = || {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while holds_a_freed_file() {
            assert!(
                std::time::Instant::now() < deadline,
                "a replaced or deleted container is still held open"
            );
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    };
    for fill in 0..3 {
        container(fill, len).write_to(&storage, "m.bpk").unwrap();
    }
    wait_until_released();
    assert_eq!(
        fs::read(&path).unwrap().len() as u64,
        fs::metadata(&path).unwrap().len()
    );
    assert_eq!(
        Reader::open(storage.open("m.bpk").unwrap())
            .unwrap()
            .read("w")
            .unwrap(),
        vec![2; len]
    );

    storage.delete("m.bpk").unwrap();
    assert!(!path.exists());
    assert_eq!(
        storage.open("m.bpk").unwrap_err().kind(),
        ErrorKind::NotFound
    );
    wait_until_released();
}

/// A failed file operation reaches the caller with its `io::Error` in the source chain, so a
/// program can look at the OS error, and converts to an `io::Error` of the same kind.
#[test]
fn a_local_failure_keeps_its_io_cause() {
    let dir = tempfile::tempdir().unwrap();
    let storage = LocalStorage::new(dir.path());
    let error = Reader::open_key(&storage, "missing.bpk").unwrap_err();
    assert_eq!(error.kind(), ErrorKind::NotFound);
    assert_eq!(error.key(), Some("missing.bpk"));
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(&error);
    let mut found = None;
    while let Some(e) = cause {
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            found = Some(io.kind());
        }
        cause = e.source();
    }
    assert_eq!(found, Some(std::io::ErrorKind::NotFound), "{error:?}");
    let as_io = std::io::Error::from(error);
    assert_eq!(as_io.kind(), std::io::ErrorKind::NotFound);
    let back = weightbay::Error::from(as_io);
    assert_eq!(
        (back.kind(), back.key()),
        (ErrorKind::NotFound, Some("missing.bpk"))
    );
}

/// Retention and gc delete a run's old checkpoints key by key; the directories they leave
/// must go too, or every listing walks the run's whole history.
#[test]
fn deleting_the_last_key_of_a_directory_removes_the_directories_left_empty() {
    let dir = tempfile::tempdir().unwrap();
    let storage = LocalStorage::new(dir.path());
    container(1, 10)
        .write_to(&storage, "run/step-1/save/model.bpk")
        .unwrap();
    container(2, 10).write_to(&storage, "run/keep.bpk").unwrap();
    storage.delete("run/step-1/save/model.bpk").unwrap();
    assert!(!dir.path().join("run/step-1").exists(), "step-1/ is left");
    assert!(dir.path().join("run/keep.bpk").exists());
    storage.delete("run/keep.bpk").unwrap();
    assert!(!dir.path().join("run").exists(), "run/ is left");
    assert!(dir.path().exists(), "the storage's root is never removed");
}

/// The standard file system, but the first scratch file created runs `before` first: the
/// moment a delete of a directory's last key can fall between a save's `hold_dir_below` and
/// its scratch file.
struct DeleteFirst {
    before: std::sync::Mutex<Option<Box<dyn FnOnce() + Send>>>,
}

impl std::fmt::Debug for DeleteFirst {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("DeleteFirst")
    }
}

impl weightbay::backend_kit::FileSystem for DeleteFirst {
    fn create_new(
        &self,
        path: &std::path::Path,
    ) -> std::io::Result<Box<dyn weightbay::backend_kit::FileHandle>> {
        if let Some(before) = self.before.lock().unwrap().take() {
            before();
        }
        weightbay_local::StdFileSystem.create_new(path)
    }
    fn create_truncate(
        &self,
        path: &std::path::Path,
    ) -> std::io::Result<Box<dyn weightbay::backend_kit::FileHandle>> {
        weightbay_local::StdFileSystem.create_truncate(path)
    }
    fn open(
        &self,
        path: &std::path::Path,
    ) -> std::io::Result<Box<dyn weightbay::backend_kit::FileHandle>> {
        weightbay_local::StdFileSystem.open(path)
    }
    fn rename(&self, from: &std::path::Path, to: &std::path::Path) -> std::io::Result<()> {
        weightbay_local::StdFileSystem.rename(from, to)
    }
    fn rename_no_replace(
        &self,
        from: &std::path::Path,
        to: &std::path::Path,
    ) -> std::io::Result<()> {
        weightbay_local::StdFileSystem.rename_no_replace(from, to)
    }
    fn hard_link(&self, from: &std::path::Path, to: &std::path::Path) -> std::io::Result<()> {
        weightbay_local::StdFileSystem.hard_link(from, to)
    }
    fn remove_file(&self, path: &std::path::Path) -> std::io::Result<()> {
        weightbay_local::StdFileSystem.remove_file(path)
    }
    fn sync_dir(&self, dir: &std::path::Path) -> std::io::Result<()> {
        weightbay_local::StdFileSystem.sync_dir(dir)
    }
    fn remove_file_below(
        &self,
        root: &std::path::Path,
        relative: &std::path::Path,
    ) -> std::io::Result<()> {
        weightbay_local::StdFileSystem.remove_file_below(root, relative)
    }
    fn remove_dir_below(
        &self,
        root: &std::path::Path,
        relative: &std::path::Path,
    ) -> std::io::Result<()> {
        weightbay_local::StdFileSystem.remove_dir_below(root, relative)
    }
    fn list_dir(
        &self,
        dir: &std::path::Path,
    ) -> std::io::Result<Vec<(std::ffi::OsString, weightbay::backend_kit::EntryKind)>> {
        weightbay_local::StdFileSystem.list_dir(dir)
    }
    fn create_dir_all(&self, dir: &std::path::Path) -> std::io::Result<()> {
        weightbay_local::StdFileSystem.create_dir_all(dir)
    }
    fn hold_dir_below(
        &self,
        root: &std::path::Path,
        relative: &std::path::Path,
    ) -> std::io::Result<weightbay::backend_kit::HeldDir> {
        weightbay_local::StdFileSystem.hold_dir_below(root, relative)
    }
    fn remove_dir(&self, dir: &std::path::Path) -> std::io::Result<()> {
        weightbay_local::StdFileSystem.remove_dir(dir)
    }
    fn copy_permissions(
        &self,
        from: &std::path::Path,
        to: &std::path::Path,
    ) -> std::io::Result<()> {
        weightbay_local::StdFileSystem.copy_permissions(from, to)
    }
}

#[test]
fn a_save_whose_directory_a_delete_removes_meanwhile_still_lands() {
    let dir = tempfile::tempdir().unwrap();
    let plain = LocalStorage::new(dir.path());
    container(1, 10).write_to(&plain, "run/old.bpk").unwrap();
    let deleter = plain.clone();
    let racing = LocalStorage::with_file_system(
        dir.path(),
        std::sync::Arc::new(DeleteFirst {
            before: std::sync::Mutex::new(Some(Box::new(move || {
                deleter.delete("run/old.bpk").unwrap();
            }))),
        }),
    );
    container(2, 10).write_to(&racing, "run/new.bpk").unwrap();
    assert!(!dir.path().join("run/old.bpk").exists());
    let reader = Reader::open(plain.open("run/new.bpk").unwrap()).unwrap();
    assert_eq!(reader.read("w").unwrap(), vec![2; 10]);
}

#[test]
fn rename_no_replace_takes_a_free_name_and_refuses_a_taken_one() {
    use weightbay::backend_kit::FileSystem;
    use weightbay_local::StdFileSystem;
    let dir = tempfile::tempdir().expect("a temporary directory");
    let [a, b, taken] = ["a", "b", "taken"].map(|name| dir.path().join(name));
    for (path, bytes) in [(&a, "a"), (&b, "b"), (&taken, "taken")] {
        fs::write(path, bytes).expect("write");
    }
    let fs_ = StdFileSystem;
    match fs_.rename_no_replace(&a, &dir.path().join("free")) {
        Err(e) if e.kind() == std::io::ErrorKind::Unsupported => {
            eprintln!("skipped: {e} (this file system has no RENAME_NOREPLACE)");
            return;
        }
        result => result.expect("rename onto a free name"),
    }
    assert_eq!(fs::read(dir.path().join("free")).expect("read"), b"a");
    assert!(!a.exists());
    let refused = fs_
        .rename_no_replace(&b, &taken)
        .expect_err("the name is taken");
    assert_eq!(
        refused.kind(),
        std::io::ErrorKind::AlreadyExists,
        "{refused}"
    );
    assert_eq!(fs::read(&taken).expect("read"), b"taken");
    assert_eq!(fs::read(&b).expect("read"), b"b");
}

/// A source in memory that says it gains from reading `ahead` bytes ahead, as an object store
/// does, and notes the threads that read it and each read's offset and length; reads from
/// `fail_at` on fail.
#[derive(Debug)]
struct ReadAhead {
    inner: weightbay::MemorySource,
    readers: std::sync::Mutex<std::collections::HashSet<std::thread::ThreadId>>,
    reads: std::sync::Mutex<Vec<(u64, u64)>>,
    fail_at: u64,
    ahead: u64,
}

impl ReadAhead {
    fn new(data: Vec<u8>, fail_at: u64) -> Self {
        Self {
            inner: weightbay::MemorySource::new(weightbay::SharedBytes::from(data)),
            readers: std::sync::Mutex::default(),
            reads: std::sync::Mutex::default(),
            fail_at,
            ahead: 64 << 20,
        }
    }

    /// The lengths read, in the order of their offsets.
    fn read_lengths(&self) -> Vec<u64> {
        let mut reads = self.reads.lock().unwrap().clone();
        reads.sort_unstable();
        reads.into_iter().map(|(_, len)| len).collect()
    }
}

impl weightbay::Source for ReadAhead {
    fn len(&self) -> u64 {
        self.inner.len()
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> weightbay::Result<()> {
        self.readers
            .lock()
            .unwrap()
            .insert(std::thread::current().id());
        self.reads.lock().unwrap().push((offset, buf.len() as u64));
        if offset + buf.len() as u64 > self.fail_at {
            return Err(weightbay::Error::new(ErrorKind::Io, "refused for the test"));
        }
        self.inner.read_at(offset, buf)
    }
    fn fetch_ahead(&self) -> u64 {
        self.ahead
    }
}

#[test]
fn a_copy_from_a_store_reads_regions_on_several_threads_and_lands_whole() {
    use weightbay::{CreateOptions, StorageExt};
    const MIB: u64 = 1 << 20;
    let dir = tempfile::tempdir().unwrap();
    let storage = LocalStorage::new(dir.path());
    // 50 MiB and a bit (three 16 MiB windows and a short one), each byte telling where it is.
    let data: Vec<u8> = (0..(50u64 << 20) + 12_345)
        .map(|i| (i % 251) as u8)
        .collect();
    let crc = weightbay::checksum::crc32c(&data);
    // A local file takes writes by position: four threads (a 64 MiB budget over 16 MiB) each
    // read a region of 12.5 MiB, written where it belongs. This source streams through the
    // default `read_in_pieces`, whose pieces from a source that reads ahead are up to 16 MiB
    // (the window it would read in order), so each region is one read.
    let source = ReadAhead::new(data.clone(), u64::MAX);
    let copied = storage
        .copy_in("copied.bpk", &source, CreateOptions::default())
        .unwrap();
    assert_eq!(copied, crc);
    assert!(fs::read(dir.path().join("copied.bpk")).unwrap() == data);
    let threads = source.readers.lock().unwrap().len();
    assert!((2..=4).contains(&threads), "read on {threads} threads");
    let region = (data.len() as u64).div_ceil(4);
    assert_eq!(
        source.read_lengths(),
        [region, region, region, data.len() as u64 - 3 * region]
    );

    // A sink without an expected length takes no writes by position: the copy reads 16 MiB
    // windows in order, two in flight, the first two growing from half a window to a whole one
    // and the last two shrinking back.
    let ramped = ReadAhead {
        ahead: 32 << 20,
        ..ReadAhead::new(data.clone(), u64::MAX)
    };
    let mut sink = storage
        .create("ramped.bpk", &CreateOptions::default())
        .unwrap();
    let in_order =
        weightbay::backend_kit::copy_to_sink(&ramped, 0..data.len() as u64, sink.as_mut()).unwrap();
    sink.commit().unwrap();
    assert_eq!(in_order, crc);
    assert!(fs::read(dir.path().join("ramped.bpk")).unwrap() == data);
    assert_eq!(
        ramped.read_lengths(),
        [8 * MIB, 16 * MIB, 2 * MIB + 12_345, 16 * MIB, 8 * MIB]
    );
    storage.delete("ramped.bpk").unwrap();

    // A read failing part-way stops the other threads, is the error returned, and leaves the
    // copy as it was and no scratch file behind.
    let failing = ReadAhead::new(vec![9; 40 << 20], 30 << 20);
    let err = storage
        .copy_in("copied.bpk", &failing, CreateOptions::default())
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Io, "{err}");
    assert!(err.to_string().contains("refused for the test"), "{err}");
    assert!(fs::read(dir.path().join("copied.bpk")).unwrap() == data);
    assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 1);
}
