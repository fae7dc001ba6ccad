//! A run's prefix is shared ground: damaged records, racing copies, slow passes and
//! deletions under a reader each get an answer that says what happened, and nothing a kept
//! checkpoint or a live writer needs is deleted.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use weightbay::{
    Capabilities, CreateOptions, DType, Durability, ErrorKind, Listed, MemoryStorage, PendingWrite,
    Result, Sink, Source, Storage, StorageExt, Tensor, Writer,
};
use weightbay_checkpoints::{Checkpoints, Retention, SaveOptions, StepState};

fn writer(step: u64) -> Writer {
    Writer::new(vec![
        Tensor::new("frozen", DType::U8, [4096], vec![1; 4096]),
        Tensor::new("w", DType::U8, [64], vec![step as u8; 64]),
    ])
}

fn put(storage: &dyn Storage, key: &str, bytes: &[u8]) {
    storage.write_new(key, bytes, Durability::Default).unwrap();
}

/// What runs before a storage operation of the wrapped storage: called with the operation's
/// name and key.
type Hook = Box<dyn Fn(&str, &str) + Send + Sync>;

/// A storage that runs a hook before each operation (a gc from another process, a delay), and
/// forwards every method.
#[derive(Clone)]
struct Hooked {
    inner: MemoryStorage,
    hook: Arc<Mutex<Option<Hook>>>,
}

impl std::fmt::Debug for Hooked {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Hooked")
    }
}

impl Hooked {
    fn new(inner: MemoryStorage) -> Self {
        Self {
            inner,
            hook: Arc::default(),
        }
    }

    fn set(&self, hook: impl Fn(&str, &str) + Send + Sync + 'static) {
        *self.hook.lock().unwrap() = Some(Box::new(hook));
    }

    fn before(&self, operation: &str, key: &str) {
        if let Some(hook) = self.hook.lock().unwrap().as_ref() {
            hook(operation, key);
        }
    }
}

#[deny(clippy::missing_trait_methods)]
impl Storage for Hooked {
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }
    fn create(&self, key: &str, options: &CreateOptions) -> Result<Box<dyn Sink>> {
        self.before("create", key);
        self.inner.create(key, options)
    }
    fn open(&self, key: &str) -> Result<Arc<dyn Source>> {
        self.before("open", key);
        self.inner.open(key)
    }
    fn delete(&self, key: &str) -> Result<()> {
        self.before("delete", key);
        self.inner.delete(key)
    }
    fn pending(&self, prefix: &str) -> Result<Vec<PendingWrite>> {
        self.inner.pending(prefix)
    }
    fn clean_pending(&self, prefix: &str) -> Result<Vec<PendingWrite>> {
        self.inner.clean_pending(prefix)
    }
    fn list(&self, prefix: &str) -> Result<Vec<Listed>> {
        self.before("list", prefix);
        self.inner.list(prefix)
    }
}

#[test]
fn a_damaged_record_blocks_no_gc_and_is_never_retired() {
    let storage = MemoryStorage::new();
    let checkpoints = Checkpoints::new(storage.clone(), "run");
    for step in 1..=4 {
        checkpoints.save(step, writer(step)).unwrap();
    }
    storage.delete("run/step-2/commit.json").unwrap();
    put(&storage, "run/step-2/commit.json", b"{");
    let policy = Retention::keep_last(1);
    let plan = checkpoints.gc_plan_retaining(&policy).unwrap();
    assert_eq!(plan.checkpoints, [1, 3]);
    let report = checkpoints.gc_retaining(&policy).unwrap();
    assert_eq!(plan, report, "the dry run shows exactly what gc deletes");
    assert!(checkpoints.gc().is_ok());
    let states: Vec<_> = checkpoints
        .list()
        .unwrap()
        .into_iter()
        .map(|s| (s.step, s.state))
        .collect();
    assert!(
        matches!(states[0], (2, StepState::Damaged(_))),
        "{states:?}"
    );
    assert_eq!(states[1], (4, StepState::Complete));
    assert!(
        !storage.list("run/step-2").unwrap().is_empty(),
        "the damaged step is kept whole"
    );
}

#[test]
fn a_dry_run_names_every_deletion_of_retention_and_gc() {
    let storage = MemoryStorage::new();
    let checkpoints = Checkpoints::new(storage.clone(), "run");
    checkpoints.save(1, writer(1)).unwrap();
    for step in 2..=6 {
        let options = SaveOptions::incremental();
        checkpoints.save_with(step, writer(step), options).unwrap();
    }
    put(&storage, "run/step-3/stray.bin", b"left by a dead save");
    put(&storage, "run/step-9/unfinished.bin", b"a save in progress");
    let policy = Retention::keep_last(2);
    let plan = checkpoints.gc_plan_retaining(&policy).unwrap();
    let report = checkpoints.gc_retaining(&policy).unwrap();
    assert_eq!(plan, report);
    assert_eq!(report.checkpoints, [1, 2, 3, 4]);
    assert!(report.orphans.contains(&"run/step-3/stray.bin".to_owned()));
    // Step 2's full container holds the frozen tensor the kept increments refer to.
    assert!(
        report
            .kept
            .iter()
            .any(|(key, _)| key.starts_with("run/step-2/")),
        "{report:?}"
    );
    assert_eq!(checkpoints.steps().unwrap(), [5, 6]);
    for step in [5, 6] {
        checkpoints.open(step).unwrap().verify().unwrap();
    }
    assert!(storage.open("run/step-9/unfinished.bin").is_ok());
}

#[test]
fn a_slow_pass_stops_deleting_at_a_sixth_of_the_lease() {
    let storage = Hooked::new(MemoryStorage::new());
    let lease = Duration::from_millis(600);
    let checkpoints = Checkpoints::new(storage.clone(), "run").with_reference_lease(lease);
    checkpoints.save(1, writer(1)).unwrap();
    checkpoints.save(2, writer(2)).unwrap();
    for n in 0..20 {
        put(&storage, &format!("run/step-1/stray-{n}.bin"), b"x");
    }
    storage.set(|operation, _| {
        if operation == "delete" {
            std::thread::sleep(Duration::from_millis(30));
        }
    });
    let err = checkpoints.gc().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::TimedOut, "{err}");
    assert!(
        err.to_string().contains("sixth of the reference lease"),
        "{err}"
    );
    let left = storage.inner.list("run/step-1").unwrap();
    assert!(
        left.len() > 10,
        "the pass went on deleting: {} left",
        left.len()
    );
}

#[test]
fn a_backfill_copy_racing_gc_commits_a_complete_checkpoint() {
    let source = Checkpoints::new(MemoryStorage::new(), "run");
    source.save(3, writer(3)).unwrap();
    let inner = MemoryStorage::new();
    let storage = Hooked::new(inner.clone());
    let destination = Checkpoints::new(storage.clone(), "run");
    destination.save(10, writer(10)).unwrap();
    // A gc from another process runs just before the copy writes its commit record.
    let other = Checkpoints::new(inner.clone(), "run");
    storage.set(move |operation, key| {
        if operation == "create" && key == "run/step-3/commit.json" {
            let report = other.gc().unwrap();
            assert!(
                report.orphans.is_empty(),
                "gc removed a live copy's bytes: {report:?}"
            );
        }
    });
    let checkpoint = source.open(3).unwrap();
    destination
        .copy_from(&checkpoint, Durability::Default)
        .unwrap();
    let copied = Checkpoints::new(inner, "run");
    copied.open(3).unwrap().verify().unwrap();
    assert_eq!(copied.steps().unwrap(), [3, 10]);
}

#[test]
fn a_save_whose_container_gc_removed_commits_nothing() {
    let inner = MemoryStorage::new();
    let storage = Hooked::new(inner.clone());
    let checkpoints = Checkpoints::new(storage.clone(), "run");
    checkpoints.save(10, writer(10)).unwrap();
    // A gc that wins the race: the save's container is gone before its record is written.
    let thief = inner.clone();
    storage.set(move |operation, key| {
        if operation == "open" && key.starts_with("run/step-3/") && key.ends_with(".bpk") {
            for listed in thief.list("run/step-3").unwrap() {
                thief.delete(&listed.key).unwrap();
            }
        }
    });
    let err = checkpoints.save(3, writer(3)).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotFound, "{err}");
    assert!(err.to_string().contains("gc"), "{err}");
    assert!(
        inner.open("run/step-3/commit.json").is_err(),
        "no record names a missing container"
    );
}

#[test]
fn a_checkpoint_deleted_under_its_reader_is_not_found() {
    let checkpoints = Checkpoints::new(MemoryStorage::new(), "run");
    checkpoints.save(1, writer(1)).unwrap();
    checkpoints
        .save_with(2, writer(2), SaveOptions::incremental())
        .unwrap();
    let opened = checkpoints.open(2).unwrap();
    checkpoints.save(3, writer(3)).unwrap();
    checkpoints.retain(&Retention::keep_last(1)).unwrap();
    let err = opened.reader().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotFound, "{err}");
    assert!(
        std::error::Error::source(&err).is_some(),
        "the cause is kept: {err}"
    );
    let err = opened.verify().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotFound, "{err}");
}

#[test]
fn a_record_deleted_between_listing_and_reading_is_not_damaged() {
    let inner = MemoryStorage::new();
    let storage = Hooked::new(inner.clone());
    let checkpoints = Checkpoints::new(storage.clone(), "run");
    checkpoints.save(1, writer(1)).unwrap();
    checkpoints.save(2, writer(2)).unwrap();
    let deleter = inner;
    storage.set(move |operation, key| {
        if operation == "open" && key == "run/step-1/commit.json" {
            let _ = deleter.delete(key);
        }
    });
    let states: Vec<_> = checkpoints
        .list()
        .unwrap()
        .into_iter()
        .map(|s| s.state)
        .collect();
    assert_eq!(states, [StepState::Uncommitted, StepState::Complete]);
}
