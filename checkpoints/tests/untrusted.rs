//! A run's prefix is shared ground: damaged records, racing copies, slow passes and
//! deletions under a reader each get an answer that says what happened, and nothing a kept
//! checkpoint or a live writer needs is deleted.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use weightbay::{
    CreateOptions, DType, Durability, ErrorKind, Listed, MemoryStorage, Result, Sink, Source,
    Storage, StorageExt, Tensor, Writer,
};
use weightbay_checkpoints::{Checkpoints, RankSave, Retention, SaveOptions, StepState};

fn writer(step: u64) -> Writer {
    Writer::new(vec![
        Tensor::new("frozen", DType::U8, [4096], vec![1; 4096]),
        Tensor::new("w", DType::U8, [64], vec![step as u8; 64]),
    ])
}

/// Rank `rank`'s part of a step saved by two ranks.
fn rank_save(rank: u32) -> RankSave {
    let tensor = Tensor::new(format!("rank{rank}"), DType::U8, [64], vec![rank as u8; 64]);
    RankSave::new(rank, 2, Writer::new(vec![tensor]))
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
    fn list(&self, prefix: &str) -> Result<Vec<Listed>> {
        self.before("list", prefix);
        self.inner.list(prefix)
    }
    weightbay::forward_storage!(inner => capabilities, pending, clean_pending, list_foreign);
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

/// A gc from another value over the same storage, run by the hook before the save of step 3
/// opens a container to confirm it (after its last byte) and before it creates its commit
/// record, asserting it removes nothing.
fn gc_from_another_process_at_commit(storage: &Hooked, other: Checkpoints) {
    storage.set(move |operation, key| {
        let confirming = operation == "open"
            && key.starts_with("run/step-3/")
            && key != "run/step-3/commit.json";
        let committing = operation == "create" && key == "run/step-3/commit.json";
        if confirming || committing {
            let report = other.gc().unwrap();
            assert!(
                report.orphans.is_empty(),
                "gc removed a live save's bytes ({operation} {key}): {report:?}"
            );
        }
    });
}

#[test]
fn a_save_of_an_older_step_racing_gc_commits_a_complete_checkpoint() {
    for options in [SaveOptions::default(), SaveOptions::sharded(1024)] {
        let inner = MemoryStorage::new();
        let storage = Hooked::new(inner.clone());
        let checkpoints = Checkpoints::new(storage.clone(), "run");
        checkpoints.save(10, writer(10)).unwrap();
        gc_from_another_process_at_commit(&storage, Checkpoints::new(inner.clone(), "run"));
        checkpoints.save_with(3, writer(3), options).unwrap();
        let reread = Checkpoints::new(inner.clone(), "run");
        reread.open(3).unwrap().verify().unwrap();
        assert_eq!(reread.steps().unwrap(), [3, 10]);
        assert!(
            inner.list("run/refs").unwrap().is_empty(),
            "a committed save leaves no announcement"
        );
    }
}

#[test]
fn a_rank_of_an_older_step_keeps_its_part_through_gc() {
    let inner = MemoryStorage::new();
    let checkpoints = Checkpoints::new(inner.clone(), "run");
    checkpoints.save(10, writer(10)).unwrap();
    checkpoints.save_rank(3, rank_save(0)).unwrap();
    let report = Checkpoints::new(inner.clone(), "run").gc().unwrap();
    assert!(
        report.orphans.is_empty(),
        "gc removed rank 0's part: {report:?}"
    );
    checkpoints.save_rank(3, rank_save(1)).unwrap();
    checkpoints.open(3).unwrap().verify().unwrap();
    let report = checkpoints.gc().unwrap();
    assert_eq!(
        report.spent.len(),
        2,
        "both ranks' announcements are spent: {report:?}"
    );
    assert!(inner.list("run/refs").unwrap().is_empty());
}

#[test]
fn a_rank_commit_whose_container_is_gone_commits_nothing() {
    let inner = MemoryStorage::new();
    // A lease of nothing: every rank's announcement is past it by the time the step commits.
    let checkpoints = Checkpoints::new(inner.clone(), "run").with_reference_lease(Duration::ZERO);
    checkpoints.save_rank(3, rank_save(0)).unwrap();
    // What a gc does once rank 0's announcement has run out: its container goes, its
    // manifest is still there when rank 1 finishes.
    for listed in inner.list("run/step-3").unwrap() {
        if listed.key.ends_with(".bpk") {
            inner.delete(&listed.key).unwrap();
        }
    }
    let err = checkpoints.save_rank(3, rank_save(1)).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotFound, "{err}");
    assert!(err.to_string().contains("rank-00000"), "{err}");
    assert!(inner.open("run/step-3/commit.json").is_err());
}

#[test]
fn gc_deletes_only_what_it_listed_before_the_announcements() {
    let inner = MemoryStorage::new();
    let storage = Hooked::new(inner.clone());
    let checkpoints = Checkpoints::new(storage.clone(), "run");
    checkpoints.save(10, writer(10)).unwrap();
    put(
        &inner,
        "run/step-3/dead/model.bpk",
        b"left by a save that died",
    );
    // A rank of step 3 starts after the pass listed the announcements, and writes before the
    // pass reads the records again.
    let rank = Checkpoints::new(inner.clone(), "run");
    let lists = Arc::new(Mutex::new(0));
    storage.set(move |operation, key| {
        if operation == "list" && key == "run" {
            let mut lists = lists.lock().unwrap();
            *lists += 1;
            if *lists == 2 {
                rank.save_rank(3, rank_save(0)).unwrap();
            }
        }
    });
    let report = checkpoints.gc().unwrap();
    assert_eq!(report.orphans, ["run/step-3/dead/model.bpk"], "{report:?}");
    let left: Vec<String> = inner
        .list("run/step-3")
        .unwrap()
        .into_iter()
        .map(|l| l.key)
        .collect();
    assert_eq!(
        left.len(),
        2,
        "the rank's container and manifest stay: {left:?}"
    );
}

#[test]
fn a_rank_commit_checks_only_the_parts_of_ranks_whose_announcement_ran_out() {
    let opened = Arc::new(Mutex::new(Vec::new()));
    let commit = |lease: Duration| {
        let storage = Hooked::new(MemoryStorage::new());
        let checkpoints = Checkpoints::new(storage.clone(), "run").with_reference_lease(lease);
        checkpoints.save_rank(3, rank_save(0)).unwrap();
        let opened = Arc::clone(&opened);
        opened.lock().unwrap().clear();
        storage.set(move |operation, key| {
            if operation == "open" && key.ends_with(".bpk") {
                opened.lock().unwrap().push(key.to_owned());
            }
        });
        checkpoints.save_rank(3, rank_save(1)).unwrap();
        checkpoints.open(3).unwrap();
    };
    commit(Duration::from_secs(3600));
    assert!(
        opened.lock().unwrap().is_empty(),
        "{:?}",
        opened.lock().unwrap()
    );
    commit(Duration::ZERO);
    assert_eq!(
        opened.lock().unwrap().len(),
        2,
        "{:?}",
        opened.lock().unwrap()
    );
}

#[test]
fn a_dead_writer_s_directory_is_kept_for_the_lease_then_cleaned() {
    let storage = MemoryStorage::new();
    let checkpoints = Checkpoints::new(storage.clone(), "run");
    checkpoints.save(10, writer(10)).unwrap();
    // What a save of step 3 killed after its first container leaves.
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis();
    let announcement =
        format!(r#"{{"weightbay_announcement": 1, "step": 3, "time_unix_ms": {now}, "keys": []}}"#);
    put(
        &storage,
        "run/refs/step-3-77-1-dead.json",
        announcement.as_bytes(),
    );
    put(&storage, "run/step-3/77-1-dead/model.bpk", b"half a save");
    let plan = checkpoints.gc_plan().unwrap();
    assert!(plan.orphans.is_empty(), "{plan:?}");
    assert_eq!(
        plan.kept,
        [(
            "run/step-3/77-1-dead/model.bpk".to_owned(),
            "a save of step 3 in progress writes it".to_owned()
        )]
    );
    let expired = checkpoints.with_reference_lease(Duration::ZERO);
    let plan = expired.gc_plan().unwrap();
    assert_eq!(plan.orphans, ["run/step-3/77-1-dead/model.bpk"]);
    assert_eq!(plan.spent, ["run/refs/step-3-77-1-dead.json"]);
}
