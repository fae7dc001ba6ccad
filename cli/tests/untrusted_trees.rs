//! The promise of docs/SECURITY.md as a property: over random trees, on local files and on the
//! S3 server, with journals planted that name random paths, symlinks to a canary tree, foreign
//! keys, damaged records and copies racing gc, any sequence of saves, gc, retention, listings,
//! verifications and copies leaves every canary byte as it was, and every step a call reported
//! complete (and no retention retired) reads back and verifies.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;

use object_store::path::Path as ObjectPath;
use object_store::{ObjectStoreExt, PutPayload};
use proptest::prelude::*;
use weightbay::backend_kit::unique_token;
use weightbay::{DType, Durability, Storage, StorageExt, Tensor, Writer};
use weightbay_checkpoints::{Checkpoints, Retention, SaveOptions};

/// What a case does, in order.
#[derive(Debug, Clone)]
enum Op {
    Save {
        step: u64,
        incremental: bool,
    },
    /// An upload journal (object stores) or a scratch-named link (local files) planted in the
    /// step's directory, naming the canary, a sibling's key or a random path.
    PlantJournal {
        step: u64,
        aim: usize,
    },
    /// The step's directory, or one file in it, a symlink to the canary (local files); a
    /// foreign key in it (object stores).
    PlantLink {
        step: u64,
        whole_step: bool,
    },
    PlantForeign {
        step: u64,
        name: String,
    },
    DamageUncommitted {
        step: u64,
    },
    Gc,
    GcRetaining {
        keep_last: usize,
    },
    Retain {
        keep_last: usize,
    },
    List,
    Verify,
    CopyRacingGc {
        step: u64,
    },
}

fn op() -> impl Strategy<Value = Op> {
    let step = 1..=6u64;
    prop_oneof![
        3 => (step.clone(), any::<bool>()).prop_map(|(step, incremental)| Op::Save { step, incremental }),
        2 => (step.clone(), 0..4usize).prop_map(|(step, aim)| Op::PlantJournal { step, aim }),
        1 => (step.clone(), any::<bool>()).prop_map(|(step, whole_step)| Op::PlantLink { step, whole_step }),
        1 => (step.clone(), "[a-z./-]{1,12}").prop_map(|(step, name)| Op::PlantForeign { step, name }),
        1 => step.clone().prop_map(|step| Op::DamageUncommitted { step }),
        2 => Just(Op::Gc),
        1 => (0..3usize).prop_map(|keep_last| Op::GcRetaining { keep_last }),
        1 => (0..3usize).prop_map(|keep_last| Op::Retain { keep_last }),
        1 => Just(Op::List),
        1 => Just(Op::Verify),
        1 => step.prop_map(|step| Op::CopyRacingGc { step }),
    ]
}

/// A tree under test: the run's storage, and a canary beside it that nothing may touch.
trait Tree {
    fn storage(&self) -> Arc<dyn Storage>;
    /// Plants an unfinished-write record in `dir` (a key prefix of the storage), aiming at
    /// the canary (`aim` 0), a sibling key (1), the directory's own key but a foreign upload
    /// path (2) or a random path (3).
    fn plant_journal(&self, dir: &str, aim: usize);
    /// Makes `dir` (or a file in it) a symlink to the canary, or plants a foreign key there.
    fn plant_link(&self, dir: &str, whole_step: bool) -> bool;
    /// Every canary byte, by name.
    fn canary(&self) -> BTreeMap<String, Vec<u8>>;
}

struct LocalTree {
    top: tempfile::TempDir,
}

impl LocalTree {
    fn new() -> Self {
        let top = tempfile::tempdir().unwrap();
        // Another team's run, complete checkpoints of the same steps: a link to one of its
        // steps lists as a complete step of ours.
        let canary = Checkpoints::new(
            weightbay_local::LocalStorage::new(top.path().join("canary")),
            "",
        );
        for step in 1..=6 {
            canary.save(step, writer(step)).unwrap();
        }
        std::fs::create_dir_all(top.path().join("root/sibling")).unwrap();
        std::fs::write(top.path().join("root/sibling/model.bpk"), b"sibling").unwrap();
        Self { top }
    }

    fn root(&self) -> PathBuf {
        self.top.path().join("root")
    }
}

impl Tree for LocalTree {
    fn storage(&self) -> Arc<dyn Storage> {
        Arc::new(weightbay_local::LocalStorage::new(self.root()))
    }

    fn plant_journal(&self, dir: &str, aim: usize) {
        // Local saves keep no journal: a scratch-named link of a dead process is the record
        // that clean_pending acts on.
        let target = match aim {
            0 | 2 => self.top.path().join("canary/step-1/commit.json"),
            1 => self.root().join("sibling/model.bpk"),
            _ => self.top.path().join("canary"),
        };
        let dir = self.root().join(dir);
        std::fs::create_dir_all(&dir).unwrap();
        let link = dir.join(format!("model.bpk.4194303-{aim}.tmp"));
        let _ = std::os::unix::fs::symlink(target, link);
    }

    fn plant_link(&self, dir: &str, whole_step: bool) -> bool {
        let path = self.root().join(dir);
        if whole_step {
            if path.exists() {
                return false;
            }
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            let step = path.file_name().unwrap();
            std::os::unix::fs::symlink(self.top.path().join("canary").join(step), &path).unwrap();
            return true;
        }
        std::fs::create_dir_all(&path).unwrap();
        let _ = std::os::unix::fs::symlink(self.top.path().join("canary"), path.join("linked"));
        let _ = std::os::unix::fs::symlink(
            self.top.path().join("canary/step-1/commit.json"),
            path.join("linked.json"),
        );
        false
    }

    fn canary(&self) -> BTreeMap<String, Vec<u8>> {
        let mut found = BTreeMap::new();
        let mut dirs = vec![self.top.path().join("canary")];
        while let Some(dir) = dirs.pop() {
            for entry in std::fs::read_dir(&dir).unwrap() {
                let path = entry.unwrap().path();
                if path.is_dir() {
                    dirs.push(path);
                } else {
                    found.insert(path.display().to_string(), std::fs::read(&path).unwrap());
                }
            }
        }
        let sibling = self.root().join("sibling/model.bpk");
        found.insert(
            sibling.display().to_string(),
            std::fs::read(&sibling).unwrap_or_default(),
        );
        found
    }
}

struct S3Tree {
    storage: weightbay_object_store::ObjectStorage,
    /// Runs the raw store's requests (its client paces them on a tokio timer).
    runtime: tokio::runtime::Runtime,
    /// The canary's prefix, beside the storage's root in the bucket.
    canary: String,
}

impl S3Tree {
    fn new(base: &str) -> Self {
        let name = format!("prop-{}", unique_token());
        let storage = weightbay_object_store::open_url(
            &format!("{base}/{name}"),
            std::iter::empty::<(&str, &str)>(),
        )
        .unwrap();
        // A journal of another machine's writer counts as a dead one's at once, so the planted
        // ones are acted on (or refused) by the first gc.
        let options = storage
            .options()
            .with_stale_after(std::time::Duration::ZERO);
        let storage = storage.with_options(options);
        let canary = format!("{}-canary", storage.prefix());
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let tree = Self {
            storage,
            runtime,
            canary,
        };
        let beside = weightbay_object_store::open_url(
            &format!("{base}/{name}-canary"),
            std::iter::empty::<(&str, &str)>(),
        )
        .unwrap();
        let run = Checkpoints::new(beside, "");
        for step in 1..=3 {
            run.save(step, writer(step)).unwrap();
        }
        tree.put(
            &format!("{}/sibling/model.bpk", tree.storage.prefix()),
            b"sibling".to_vec(),
        );
        tree
    }

    /// Every object under `prefix` of the bucket, read.
    fn objects(&self, prefix: &str) -> BTreeMap<String, Vec<u8>> {
        let store = Arc::clone(self.storage.store());
        let prefix = ObjectPath::from(prefix);
        self.runtime
            .block_on(async move {
                use futures::TryStreamExt;
                let listed: Vec<_> = store.list(Some(&prefix)).try_collect().await?;
                let mut found = BTreeMap::new();
                for meta in listed {
                    let bytes = store.get(&meta.location).await?.bytes().await?;
                    found.insert(meta.location.to_string(), bytes.to_vec());
                }
                Ok::<_, object_store::Error>(found)
            })
            .unwrap()
    }

    fn put(&self, path: &str, bytes: Vec<u8>) {
        let (store, path) = (Arc::clone(self.storage.store()), ObjectPath::from(path));
        self.runtime
            .block_on(async move { store.put(&path, PutPayload::from(bytes)).await })
            .unwrap();
    }
}

impl Drop for S3Tree {
    /// Removes the case's objects: the tests share one bucket, and the local S3 server lists
    /// slower the more it holds.
    fn drop(&mut self) {
        for prefix in [self.storage.prefix().to_string(), self.canary.clone()] {
            let store = Arc::clone(self.storage.store());
            let _ = self.runtime.block_on(async move {
                use futures::TryStreamExt;
                let listed: Vec<_> = store
                    .list(Some(&ObjectPath::from(prefix.as_str())))
                    .try_collect()
                    .await?;
                for meta in listed {
                    store.delete(&meta.location).await?;
                }
                Ok::<_, object_store::Error>(())
            });
        }
    }
}

impl Tree for S3Tree {
    fn storage(&self) -> Arc<dyn Storage> {
        Arc::new(self.storage.clone())
    }

    fn plant_journal(&self, dir: &str, aim: usize) {
        let root = self.storage.prefix().to_string();
        let here = format!("{root}/{dir}/model.bpk");
        let victim = format!("{}/step-1/commit.json", self.canary);
        let (target, upload) = match aim {
            0 => (victim.clone(), victim),
            1 => (
                format!("{root}/sibling/model.bpk"),
                format!("{root}/sibling/model.bpk"),
            ),
            2 => (here.clone(), victim),
            _ => (
                format!("{root}/x/{}", unique_token()),
                format!("other/{}", unique_token()),
            ),
        };
        let record = serde_json::json!({
            "weightbay_upload": 1,
            "target": target,
            "upload_path": upload,
            "staged": aim.is_multiple_of(2),
            "upload_id": null,
            "publishing": aim == 3,
            // Another machine's writer, gone long ago.
            "writer": { "boot_id": "another machine", "pid_namespace": null, "pid": 1, "start_ticks": 1 },
            "started_unix_ms": 0,
        });
        let name = format!("{here}.{}.weightbay-upload", unique_token());
        self.put(&name, serde_json::to_vec(&record).unwrap());
    }

    fn plant_link(&self, dir: &str, _whole_step: bool) -> bool {
        let path = format!("{}/{dir}/foreign.bin", self.storage.prefix());
        self.put(&path, b"foreign".to_vec());
        false
    }

    fn canary(&self) -> BTreeMap<String, Vec<u8>> {
        let mut found = self.objects(&self.canary);
        found.extend(self.objects(&format!("{}/sibling", self.storage.prefix())));
        found
    }
}

fn writer(step: u64) -> Writer {
    Writer::new(vec![
        Tensor::new("frozen", DType::U8, [2048], vec![3; 2048]),
        Tensor::new("w", DType::U8, [512], vec![step as u8; 512]),
    ])
}

/// Runs `ops` on `tree`, checking the invariant after each.
fn run(tree: &dyn Tree, ops: &[Op]) -> Result<(), TestCaseError> {
    let canary = tree.canary();
    let storage = tree.storage();
    let run = Checkpoints::over(Arc::clone(&storage), "run");
    let backfill = Checkpoints::over(Arc::clone(&storage), "backfill");
    backfill.save(100, writer(100)).unwrap();
    let mut complete: BTreeSet<u64> = BTreeSet::new();
    let mut backfilled: BTreeSet<u64> = BTreeSet::new();
    let mut linked: BTreeSet<u64> = BTreeSet::new();
    let retired = |complete: &mut BTreeSet<u64>, steps: &[u64]| {
        for step in steps {
            complete.remove(step);
        }
    };
    for op in ops {
        // Writes follow links (docs/SECURITY.md): nothing, the test's planting included, writes
        // below a step that is a link to the canary.
        let below_link = match op {
            Op::Save { step, .. }
            | Op::PlantJournal { step, .. }
            | Op::PlantLink { step, .. }
            | Op::PlantForeign { step, .. }
            | Op::DamageUncommitted { step } => linked.contains(step),
            _ => false,
        };
        if below_link {
            continue;
        }
        match op {
            Op::Save { step, incremental } => {
                let options = if *incremental {
                    SaveOptions::incremental()
                } else {
                    SaveOptions::default()
                };
                if run.save_with(*step, writer(*step), options).is_ok() {
                    complete.insert(*step);
                }
            }
            Op::PlantJournal { step, aim } => tree.plant_journal(&run.step_dir(*step), *aim),
            Op::PlantLink { step, whole_step } => {
                if !complete.contains(step) && tree.plant_link(&run.step_dir(*step), *whole_step) {
                    linked.insert(*step);
                }
            }
            Op::PlantForeign { step, name } => {
                let key = format!("{}/{}", run.step_dir(*step), name.trim_matches(['/', '.']));
                if weightbay::backend_kit::validate_key(&key).is_ok() {
                    let _ = storage.write_new(&key, b"foreign", Durability::Flushed);
                }
            }
            Op::DamageUncommitted { step }
                if !complete.contains(step) && !linked.contains(step) =>
            {
                let key = format!("{}/commit.json", run.step_dir(*step));
                let _ = storage.write_new(&key, b"{", Durability::Flushed);
            }
            Op::DamageUncommitted { .. } => {}
            Op::Gc => {
                run.gc()
                    .map_err(|e| TestCaseError::fail(format!("gc: {e}")))?;
            }
            Op::GcRetaining { keep_last } => {
                let report = run
                    .gc_retaining(&Retention::keep_last(*keep_last))
                    .map_err(|e| TestCaseError::fail(format!("gc --keep-last: {e}")))?;
                retired(&mut complete, &report.checkpoints);
            }
            Op::Retain { keep_last } => {
                let steps = run
                    .retain(&Retention::keep_last(*keep_last))
                    .map_err(|e| TestCaseError::fail(format!("retain: {e}")))?;
                retired(&mut complete, &steps);
            }
            Op::List => {
                run.list()
                    .map_err(|e| TestCaseError::fail(format!("ls: {e}")))?;
            }
            Op::Verify => {
                if let Some(latest) = run
                    .latest()
                    .map_err(|e| TestCaseError::fail(format!("latest: {e}")))?
                {
                    latest
                        .verify()
                        .map_err(|e| TestCaseError::fail(format!("verify: {e}")))?;
                }
            }
            Op::CopyRacingGc { step } if complete.contains(step) && !backfilled.contains(step) => {
                let checkpoint = run.open(*step).unwrap();
                let racing = backfill.clone();
                let gc =
                    std::thread::spawn(move || (0..10).try_for_each(|_| racing.gc().map(drop)));
                let copied = backfill.copy_from(&checkpoint, Durability::Flushed);
                gc.join()
                    .unwrap()
                    .map_err(|e| TestCaseError::fail(format!("gc racing a copy: {e}")))?;
                if copied.is_ok() {
                    backfilled.insert(*step);
                }
            }
            Op::CopyRacingGc { .. } => {}
        }
        let now = tree.canary();
        let touched: Vec<&String> = canary
            .iter()
            .filter(|(name, bytes)| now.get(*name) != Some(*bytes))
            .map(|(name, _)| name)
            .collect();
        prop_assert!(
            touched.is_empty(),
            "after {:?}, canary changed or gone: {:?}",
            op,
            touched
        );
        for (checkpoints, steps) in [(&run, &complete), (&backfill, &backfilled)] {
            for step in steps {
                let verified = checkpoints.open(*step).and_then(|c| c.verify());
                prop_assert!(
                    verified.is_ok(),
                    "step {} after {:?}: {:?}",
                    step,
                    op,
                    verified.err()
                );
            }
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn local_trees_keep_the_canary_and_every_complete_step(ops in prop::collection::vec(op(), 4..16)) {
        run(&LocalTree::new(), &ops)?;
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 16, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn s3_trees_keep_the_canary_and_every_complete_step(ops in prop::collection::vec(op(), 4..14)) {
        let Some(base) = weightbay_conformance::s3_url() else {
            return Ok(());
        };
        run(&S3Tree::new(&base), &ops)?;
    }
}
