//! The checkpoint lifecycle over MemoryStorage: save, list, latest, open, verify, retention,
//! cleanup, background saves and racing savers. The conformance suite runs the same lifecycle
//! on every backend.

use std::sync::Arc;

use weightbay::Format;
use weightbay::WeightComponentSpec;
use weightbay::{CreateOptions, DType, Error, ErrorKind, MemoryStorage, Storage, Tensor, Writer};
use weightbay_checkpoints::{Checkpoints, Retention, SaveOptions, StepState};

fn tensors(step: u64) -> Vec<Tensor> {
    (0..4)
        .map(|i| {
            Tensor::new(
                format!("layer{i}.weight"),
                DType::U8,
                [1000],
                vec![(step as u8).wrapping_add(i); 1000],
            )
        })
        .collect()
}

fn writer(step: u64, format: Format) -> Writer {
    Writer::new(tensors(step)).with_format(format)
}

/// Puts `bytes` at `key` of `storage` (to damage or plant containers).
fn put(storage: &dyn Storage, key: &str, bytes: &[u8]) {
    let mut sink = storage.create(key, &CreateOptions::default()).unwrap();
    sink.write(bytes).unwrap();
    sink.commit().unwrap();
}

fn read_all(storage: &dyn Storage, key: &str) -> Vec<u8> {
    let source = storage.open(key).unwrap();
    let mut bytes = vec![0; source.len() as usize];
    source.read_at(0, &mut bytes).unwrap();
    bytes
}

#[test]
fn saved_checkpoints_list_load_and_verify_in_both_formats_single_and_sharded() {
    for format in [Format::Burnpack, Format::Safetensors] {
        for options in [SaveOptions::default(), SaveOptions::sharded(2000)] {
            let checkpoints = Checkpoints::new(MemoryStorage::new(), "runs/a");
            for step in [10, 20] {
                let record = checkpoints
                    .save_with(
                        step,
                        writer(step, format),
                        options.clone().with_metadata("lr", "0.1"),
                    )
                    .unwrap();
                assert_eq!(record.step, step);
                assert_eq!(record.format, format.to_string());
                assert_eq!(record.metadata["lr"], "0.1");
                let shards = if options.shard_len.is_some() { 3 } else { 1 };
                // Shards and the index of a sharded set; the one container otherwise.
                assert_eq!(record.containers.len(), shards, "{format} {options:?}");
            }
            assert_eq!(checkpoints.steps().unwrap(), [10, 20]);
            let latest = checkpoints.latest().unwrap().unwrap();
            assert_eq!(latest.step(), 20);
            let report = latest.verify().unwrap();
            assert_eq!(report.containers, latest.record().containers.len());
            let weights = latest.weights().unwrap();
            let payload = weights
                .component(&WeightComponentSpec::dense(
                    "layer3.weight",
                    [1000],
                    DType::U8,
                ))
                .unwrap()
                .unwrap();
            assert_eq!(payload.bytes.to_vec().unwrap(), vec![23; 1000]);
            assert_eq!(checkpoints.open(10).unwrap().step(), 10);
            assert_eq!(
                checkpoints.open(30).unwrap_err().kind(),
                ErrorKind::NotFound
            );
        }
    }
}

#[test]
fn the_sharded_index_stays_a_hugging_face_index() {
    let storage = Arc::new(MemoryStorage::new());
    let checkpoints = Checkpoints::over(storage.clone(), "");
    let record = checkpoints
        .save_with(
            7,
            writer(7, Format::Safetensors),
            SaveOptions::sharded(2000),
        )
        .unwrap();
    let index = record.index.as_deref().unwrap();
    assert!(index.ends_with("/model.safetensors.index.json"), "{index}");
    let json: serde_json::Value =
        serde_json::from_slice(&read_all(storage.as_ref(), &format!("step-7/{index}"))).unwrap();
    assert_eq!(json["weight_map"].as_object().unwrap().len(), 4);
}

#[test]
fn one_flipped_bit_in_a_safetensors_shard_fails_verify() {
    let storage = Arc::new(MemoryStorage::new());
    let checkpoints = Checkpoints::over(storage.clone(), "run");
    let record = checkpoints
        .save_with(
            5,
            writer(5, Format::Safetensors),
            SaveOptions::sharded(2000),
        )
        .unwrap();
    let shard = record
        .containers
        .iter()
        .find(|c| c.key.ends_with(".safetensors"))
        .unwrap();
    let key = format!("run/step-5/{}", shard.key);
    let mut bytes = read_all(storage.as_ref(), &key);
    let last = bytes.len() - 1;
    bytes[last] ^= 0x10; // tensor data, which safetensors itself never checks
    put(storage.as_ref(), &key, &bytes);
    let error = checkpoints.open(5).unwrap().verify().unwrap_err();
    assert_eq!(error.kind(), ErrorKind::Corrupt, "{error}");
    assert_eq!(error.key(), Some(key.as_str()));
}

#[test]
fn a_checkpoint_with_a_missing_or_truncated_container_is_never_complete() {
    let storage = Arc::new(MemoryStorage::new());
    let checkpoints = Checkpoints::over(storage.clone(), "run");
    checkpoints.save(1, writer(1, Format::Burnpack)).unwrap();
    let record = checkpoints.save(2, writer(2, Format::Burnpack)).unwrap();
    let key = format!("run/step-2/{}", record.containers[0].key);

    let bytes = read_all(storage.as_ref(), &key);
    put(storage.as_ref(), &key, &bytes[..bytes.len() - 1]);
    let status = checkpoints.list().unwrap();
    assert!(matches!(&status[1].state, StepState::Damaged(why) if why.contains("bytes")));
    assert_eq!(checkpoints.latest().unwrap().unwrap().step(), 1);
    assert_eq!(checkpoints.open(2).unwrap_err().kind(), ErrorKind::Corrupt);

    storage.delete(&key).unwrap();
    let status = checkpoints.list().unwrap();
    assert!(matches!(&status[1].state, StepState::Damaged(why) if why.contains("missing")));
    assert_eq!(checkpoints.steps().unwrap(), [1]);
}

#[test]
fn retention_keeps_the_last_n_every_kth_and_always_the_newest_complete() {
    let storage = Arc::new(MemoryStorage::new());
    let checkpoints = Checkpoints::over(storage.clone(), "run");
    for step in (100..=800).step_by(100) {
        checkpoints
            .save(step, writer(step, Format::Burnpack))
            .unwrap();
    }
    let deleted = checkpoints
        .retain(&Retention::keep_last(2).and_every(400))
        .unwrap();
    assert_eq!(deleted, [100, 200, 300, 500, 600]);
    assert_eq!(checkpoints.steps().unwrap(), [400, 700, 800]);
    // Nothing of a deleted checkpoint stays behind.
    assert!(
        storage
            .keys()
            .iter()
            .all(|k| !k.starts_with("run/step-100/"))
    );

    checkpoints.retain(&Retention::keep_last(0)).unwrap();
    assert_eq!(
        checkpoints.steps().unwrap(),
        [800],
        "the newest complete one stays"
    );
}

/// A storage whose container deletes fail: retention must delete a commit record before the
/// containers it names, so a half-deleted checkpoint is never complete.
#[derive(Debug)]
struct ContainersUndeletable(MemoryStorage);

#[deny(clippy::missing_trait_methods)]
impl Storage for ContainersUndeletable {
    fn delete(&self, key: &str) -> weightbay::Result<()> {
        if key.ends_with("commit.json") {
            self.0.delete(key)
        } else {
            Err(Error::new(ErrorKind::Io, "deletes of containers fail here"))
        }
    }
    weightbay::forward_storage!(0 => capabilities, create, open, pending, clean_pending, list, list_foreign);
}

#[test]
fn retention_deletes_the_commit_record_first() {
    let checkpoints = Checkpoints::new(ContainersUndeletable(MemoryStorage::new()), "run");
    for step in [1, 2] {
        checkpoints
            .save(step, writer(step, Format::Burnpack))
            .unwrap();
    }
    let error = checkpoints.retain(&Retention::keep_last(1)).unwrap_err();
    assert_eq!(error.kind(), ErrorKind::Io);
    let status = checkpoints.list().unwrap();
    assert_eq!(status[0].state, StepState::Uncommitted, "{status:?}");
    assert_eq!(checkpoints.steps().unwrap(), [2]);
}

#[test]
fn gc_removes_dead_saves_up_to_the_newest_complete_checkpoint() {
    let storage = Arc::new(MemoryStorage::new());
    let checkpoints = Checkpoints::over(storage.clone(), "run");
    // A save of step 1 that died, a loser's leftovers beside committed step 2, and a save of
    // step 3 that may still be running elsewhere.
    put(storage.as_ref(), "run/step-1/dead/model.bpk", b"partial");
    checkpoints.save(2, writer(2, Format::Burnpack)).unwrap();
    put(storage.as_ref(), "run/step-2/loser/model.bpk", b"partial");
    put(storage.as_ref(), "run/step-3/running/model.bpk", b"partial");
    let report = checkpoints.gc().unwrap();
    assert_eq!(
        report.orphans,
        ["run/step-1/dead/model.bpk", "run/step-2/loser/model.bpk"]
    );
    assert!(
        storage
            .keys()
            .contains(&"run/step-3/running/model.bpk".to_owned())
    );
    checkpoints.open(2).unwrap().verify().unwrap();
}

#[test]
fn saving_a_committed_step_again_fails_and_writes_nothing() {
    let storage = Arc::new(MemoryStorage::new());
    let checkpoints = Checkpoints::over(storage.clone(), "run");
    checkpoints.save(1, writer(1, Format::Burnpack)).unwrap();
    let before = storage.keys();
    let error = checkpoints
        .save(1, writer(9, Format::Burnpack))
        .unwrap_err();
    assert_eq!(error.kind(), ErrorKind::AlreadyExists);
    assert_eq!(storage.keys(), before);
}

#[test]
fn racing_savers_of_one_step_commit_once_and_the_loser_leaves_nothing() {
    for _ in 0..20 {
        let storage = Arc::new(MemoryStorage::new());
        let savers: Vec<_> = (0..2)
            .map(|i| {
                let checkpoints = Checkpoints::over(storage.clone(), "run");
                std::thread::spawn(move || checkpoints.save(1, writer(i, Format::Burnpack)))
            })
            .collect();
        let results: Vec<_> = savers.into_iter().map(|s| s.join().unwrap()).collect();
        let winners = results.iter().filter(|r| r.is_ok()).count();
        assert_eq!(winners, 1, "{results:?}");
        let loser = results.iter().find_map(|r| r.as_ref().err()).unwrap();
        assert_eq!(loser.kind(), ErrorKind::AlreadyExists);
        let checkpoints = Checkpoints::over(storage.clone(), "run");
        let record = checkpoints.open(1).unwrap().record().clone();
        // The commit record and the winner's container: nothing of the loser.
        assert_eq!(storage.keys().len(), 2, "{:?}", storage.keys());
        assert!(
            storage
                .keys()
                .iter()
                .any(|k| k.ends_with(&record.containers[0].key))
        );
    }
}

#[test]
fn background_saves_run_one_at_a_time_and_report_through_the_handle() {
    let checkpoints = Checkpoints::new(MemoryStorage::new(), "run");
    let first = checkpoints
        .save_in_background(1, writer(1, Format::Burnpack), SaveOptions::default())
        .unwrap();
    // Waits for the first to end before starting (one save in flight at a time).
    let second = checkpoints
        .save_in_background(2, writer(2, Format::Burnpack), SaveOptions::default())
        .unwrap();
    assert_eq!(first.wait().unwrap().step, 1);
    assert_eq!(second.wait().unwrap().step, 2);
    let again = checkpoints
        .save_in_background(2, writer(2, Format::Burnpack), SaveOptions::default())
        .unwrap();
    assert_eq!(again.wait().unwrap_err().kind(), ErrorKind::AlreadyExists);
    checkpoints.flush().unwrap();
    assert_eq!(checkpoints.steps().unwrap(), [1, 2]);
}

#[test]
fn a_dropped_handle_does_not_lose_its_failure() {
    let checkpoints = Checkpoints::new(MemoryStorage::new(), "run");
    let failing = Writer::new(vec![Tensor::deferred("t", DType::U8, [8], 8, || {
        Err(Error::new(ErrorKind::Io, "the device readback failed"))
    })]);
    drop(
        checkpoints
            .save_in_background(1, failing, SaveOptions::default())
            .unwrap(),
    );
    // The next save reports it instead of saving, and then saves normally.
    let error = checkpoints
        .save(2, writer(2, Format::Burnpack))
        .unwrap_err();
    assert!(error.to_string().contains("background save"), "{error}");
    checkpoints.save(2, writer(2, Format::Burnpack)).unwrap();
    // Nothing of the failed save stays behind, and it never became a checkpoint.
    assert_eq!(checkpoints.steps().unwrap(), [2]);
    assert!(checkpoints.list().unwrap().iter().all(|s| s.step == 2));
    checkpoints.flush().unwrap();
}

#[test]
fn copying_a_checkpoint_checks_every_byte_and_commits_last() {
    let from_storage = Arc::new(MemoryStorage::new());
    let from = Checkpoints::over(from_storage.clone(), "run");
    from.save_with(
        3,
        writer(3, Format::Safetensors),
        SaveOptions::sharded(2000),
    )
    .unwrap();
    let to = Checkpoints::new(MemoryStorage::new(), "copied");
    let record = to
        .copy_from(&from.open(3).unwrap(), weightbay::Durability::default())
        .unwrap();
    assert_eq!(to.steps().unwrap(), [3]);
    let copied = to.open(3).unwrap();
    copied.verify().unwrap();
    assert_eq!(copied.record(), &record);
    let again = to.copy_from(&from.open(3).unwrap(), weightbay::Durability::default());
    assert_eq!(again.unwrap_err().kind(), ErrorKind::AlreadyExists);

    // A source container changed since its save: the copy refuses and commits nothing.
    let shard = &from.open(3).unwrap().record().containers[0].key.clone();
    let key = format!("run/step-3/{shard}");
    let mut bytes = read_all(from_storage.as_ref(), &key);
    bytes[0] ^= 1;
    put(from_storage.as_ref(), &key, &bytes);
    let elsewhere = Checkpoints::new(MemoryStorage::new(), "");
    let error = elsewhere
        .copy_from(&from.open(3).unwrap(), weightbay::Durability::default())
        .unwrap_err();
    assert_eq!(error.kind(), ErrorKind::Corrupt, "{error}");
    assert!(elsewhere.list().unwrap().is_empty());
}
