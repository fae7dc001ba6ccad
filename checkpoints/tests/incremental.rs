//! Incremental checkpoints over MemoryStorage: only changed pieces are written, every
//! checkpoint of a chain reads like a full save, references survive retention and gc (and gc
//! racing a save), and a dangling reference is `Corrupt`, never wrong bytes. The conformance
//! suite runs chains with faults on every backend.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use proptest::prelude::*;
use weightbay::{
    CreateOptions, DType, ErrorKind, Format, MemoryStorage, Sink, Storage, Tensor, Writer,
};
mod common;

use common::{contents, expected};
use weightbay_checkpoints::{Checkpoints, Retention, SaveOptions, StepState};

/// A model of `tensors` named `t0…`, each `len` bytes, tensor `i` filled from `seeds[i]`.
fn model(seeds: &[u8], len: usize) -> Vec<Tensor> {
    seeds
        .iter()
        .enumerate()
        .map(|(i, &seed)| {
            // A xorshift stream per (tensor, seed): no two chunks alike by accident.
            let mut state =
                (u64::from(seed) << 32 | i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
            let bytes: Vec<u8> = (0..len)
                .map(|_| {
                    state ^= state << 13;
                    state ^= state >> 7;
                    state ^= state << 17;
                    state as u8
                })
                .collect();
            Tensor::new(format!("t{i}"), DType::U8, [len as u64], bytes)
        })
        .collect()
}

/// Every key stored under `prefix`.
fn keys_under(storage: &MemoryStorage, prefix: &str) -> Vec<String> {
    storage
        .list(prefix)
        .unwrap()
        .into_iter()
        .map(|l| l.key)
        .collect()
}

#[test]
fn an_increment_writes_only_the_changed_chunks_and_reads_like_a_full_save() {
    let storage = Arc::new(MemoryStorage::new());
    let checkpoints = Checkpoints::over(storage, "run");
    let options = SaveOptions::incremental().with_chunk_len(4096);
    let first = model(&[1, 2, 3, 4], 64 * 1024);
    let full = checkpoints
        .save_with(1, Writer::new(first.clone()), options.clone())
        .unwrap();
    assert_eq!(full.pieces.as_ref().unwrap().increment, 0);
    // One tensor changes in one byte: one 4 KiB chunk, the header and the trailer move.
    let mut second = first.clone();
    let mut bytes = second[2].bytes().unwrap().to_vec().unwrap();
    bytes[10_000] ^= 0xff;
    second[2] = Tensor::new("t2", DType::U8, [64 * 1024], bytes);
    let record = checkpoints
        .save_with(2, Writer::new(second.clone()), options)
        .unwrap();
    let pieces = record.pieces.as_ref().unwrap();
    assert_eq!(pieces.increment, 1);
    let written: u64 = record.containers.iter().map(|c| c.len).sum();
    let header = pieces.list[0].len;
    assert!(
        written <= 4096 + header + 64,
        "an increment changing one chunk wrote {written} bytes (header {header})"
    );
    let checkpoint = checkpoints.open(2).unwrap();
    assert_eq!(checkpoint.written_bytes(), written);
    assert_eq!(
        checkpoint.written_bytes() + checkpoint.referenced_bytes(),
        pieces.len
    );
    assert_eq!(contents(&checkpoints, 2), expected(&second));
    assert_eq!(contents(&checkpoints, 1), expected(&first));
    let report = checkpoint.verify().unwrap();
    assert_eq!(report.bytes, pieces.len);
    // The spliced container is byte for byte what a full save writes.
    let full_bytes = Writer::new(second).into_bytes().unwrap();
    let reader = checkpoint.reader().unwrap();
    let mut spliced = vec![0; reader.source().len() as usize];
    reader.source().read_at(0, &mut spliced).unwrap();
    assert_eq!(spliced, full_bytes);
    // Streamed in pieces, as a copy reads it: each piece where it says, across the pieces'
    // containers (the changed chunk lies in the increment, the rest in the base).
    for range in [0..spliced.len() as u64, 9000..20_000, 12_288..140_000] {
        let mut streamed = Vec::new();
        reader
            .source()
            .read_in_pieces(range.clone(), &mut |offset, piece| {
                assert_eq!(offset, range.start + streamed.len() as u64);
                streamed.extend_from_slice(piece);
                Ok(())
            })
            .unwrap();
        assert!(streamed == spliced[range.start as usize..range.end as usize]);
    }
}

#[test]
fn tensors_declared_unchanged_are_referred_to_by_name_and_a_false_claim_is_caught_on_demand() {
    let checkpoints = Checkpoints::new(MemoryStorage::new(), "run");
    let first = model(&[1, 2], 10_000);
    checkpoints
        .save_with(1, Writer::new(first), SaveOptions::incremental())
        .unwrap();
    let mut second = model(&[9, 2], 10_000);
    // The claim is the caller's: t1 really is unchanged.
    let record = checkpoints
        .save_with(
            2,
            Writer::new(second.clone()),
            SaveOptions::incremental().with_unchanged(["t1"]),
        )
        .unwrap();
    assert_eq!(contents(&checkpoints, 2), expected(&second));
    let t1 = |r: &weightbay_checkpoints::CommitRecord| {
        r.pieces
            .as_ref()
            .unwrap()
            .list
            .iter()
            .filter(|p| p.tensor.as_deref() == Some("t1"))
            .map(|p| p.key.clone())
            .collect::<Vec<_>>()
    };
    assert!(t1(&record).iter().all(|k| k.starts_with("step-1/")));
    // A false claim, checked: the save fails naming the tensor, and nothing is committed.
    second[1] = model(&[7], 10_000).remove(0);
    second[1] = Tensor::new("t1", DType::U8, [10_000], second[1].bytes().unwrap());
    let lie = SaveOptions::incremental()
        .with_unchanged(["t1"])
        .check_unchanged();
    let error = checkpoints
        .save_with(3, Writer::new(second), lie)
        .unwrap_err();
    assert_eq!(error.kind(), ErrorKind::InvalidInput, "{error}");
    assert!(error.to_string().contains("t1"), "{error}");
    assert_eq!(checkpoints.steps().unwrap(), [1, 2]);
}

#[test]
fn retention_and_gc_keep_every_container_a_kept_checkpoint_refers_to() {
    let storage = Arc::new(MemoryStorage::new());
    let checkpoints = Checkpoints::over(storage.clone(), "run");
    let options = SaveOptions::incremental().with_chunk_len(1024);
    let mut saved = BTreeMap::new();
    for step in 1..=6u64 {
        // t0 never changes; t1 changes every step.
        let tensors = model(&[1, step as u8], 8192);
        checkpoints
            .save_with(step, Writer::new(tensors.clone()), options.clone())
            .unwrap();
        saved.insert(step, expected(&tensors));
        checkpoints.retain(&Retention::keep_last(2)).unwrap();
        checkpoints.gc().unwrap();
        for kept in checkpoints.steps().unwrap() {
            assert_eq!(contents(&checkpoints, kept), saved[&kept], "step {kept}");
            checkpoints.open(kept).unwrap().verify().unwrap();
        }
    }
    assert_eq!(checkpoints.steps().unwrap(), [5, 6]);
    // Step 1's record is gone, its container stays: steps 5 and 6 refer to its t0.
    let keys = keys_under(&storage, "run");
    assert!(
        keys.iter()
            .any(|k| k.starts_with("run/step-1/") && k.ends_with("model.bpk")),
        "{keys:?}"
    );
    assert!(
        !keys.iter().any(|k| k.starts_with("run/step-2/")),
        "{keys:?}"
    );
    // A rebase lets the old chain go.
    let tensors = model(&[1, 7], 8192);
    checkpoints
        .save_with(7, Writer::new(tensors), options.rebase_after(0))
        .unwrap();
    checkpoints.retain(&Retention::keep_last(1)).unwrap();
    checkpoints.gc().unwrap();
    let keys = keys_under(&storage, "run");
    assert!(
        keys.iter()
            .all(|k| k.starts_with("run/step-7/") || k.starts_with("run/refs/")),
        "{keys:?}"
    );
}

#[test]
fn a_dangling_reference_is_corrupt_naming_the_tensor_and_the_key_never_wrong_bytes() {
    let storage = Arc::new(MemoryStorage::new());
    let checkpoints = Checkpoints::over(storage.clone(), "run");
    for step in [1, 2] {
        let tensors = model(&[5, step as u8], 4096);
        checkpoints
            .save_with(step, Writer::new(tensors), SaveOptions::incremental())
            .unwrap();
    }
    let opened = checkpoints.open(2).unwrap();
    let base = storage
        .list("run/step-1")
        .unwrap()
        .into_iter()
        .find(|l| l.key.ends_with("model.bpk"))
        .unwrap();
    storage.delete(&base.key).unwrap();
    let error = opened.reader().unwrap_err();
    assert_eq!(error.kind(), ErrorKind::Corrupt, "{error}");
    let message = error.to_string();
    assert!(
        message.contains("t0") && message.contains(&base.key),
        "{message}"
    );
    assert_eq!(opened.verify().unwrap_err().kind(), ErrorKind::Corrupt);
    let error = checkpoints.open(2).unwrap_err();
    assert_eq!(error.kind(), ErrorKind::Corrupt, "{error}");
    let status = checkpoints.list().unwrap().pop().unwrap();
    assert!(matches!(status.state, StepState::Damaged(_)), "{status:?}");
    assert!(checkpoints.latest().unwrap().is_none());
}

#[test]
fn copying_an_increment_writes_it_whole_with_its_hashes() {
    let checkpoints = Checkpoints::new(MemoryStorage::new(), "run");
    for step in [1, 2] {
        let tensors = model(&[5, step as u8], 4096);
        checkpoints
            .save_with(step, Writer::new(tensors), SaveOptions::incremental())
            .unwrap();
    }
    let target = Checkpoints::new(MemoryStorage::new(), "copy");
    let increment = checkpoints.open(2).unwrap();
    target
        .copy_from(&increment, weightbay::Durability::Flushed)
        .unwrap();
    let copied = target.open(2).unwrap();
    assert_eq!(copied.referenced_bytes(), 0);
    assert_eq!(
        copied.written_bytes(),
        increment.record().pieces.as_ref().unwrap().len
    );
    copied.verify().unwrap();
    assert_eq!(contents(&target, 2), contents(&checkpoints, 2));
    // Its hashes came along: the next increment there refers to it.
    let record = target
        .save_with(
            3,
            Writer::new(model(&[5, 3], 4096)),
            SaveOptions::incremental(),
        )
        .unwrap();
    assert!(!record.references().is_empty());
}

/// A storage that runs `hook` once, the first time a key ending in `trigger` is created,
/// before creating it (failing the create if the hook fails): to run a retention pass in the
/// middle of a save, or to fail one.
struct BeforeCreate {
    inner: Arc<MemoryStorage>,
    trigger: &'static str,
    hook: Mutex<Option<Hook>>,
}

type Hook = Box<dyn FnOnce() -> weightbay::Result<()> + Send>;

impl std::fmt::Debug for BeforeCreate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BeforeCreate")
            .field("trigger", &self.trigger)
            .finish_non_exhaustive()
    }
}

#[deny(clippy::missing_trait_methods)]
impl Storage for BeforeCreate {
    fn create(&self, key: &str, options: &CreateOptions) -> weightbay::Result<Box<dyn Sink>> {
        if key.ends_with(self.trigger) {
            let hook = self.hook.lock().unwrap().take();
            if let Some(hook) = hook {
                hook()?;
            }
        }
        self.inner.create(key, options)
    }
    weightbay::forward_storage!(inner => capabilities, open, delete, pending, clean_pending, list, list_foreign);
}

#[test]
fn a_pass_that_deletes_a_save_s_base_while_it_uploads_keeps_what_the_save_refers_to() {
    let storage = Arc::new(MemoryStorage::new());
    let checkpoints = Checkpoints::over(storage.clone(), "run");
    let options = SaveOptions::incremental().with_chunk_len(1024);
    let first = model(&[1, 1], 8192);
    checkpoints
        .save_with(1, Writer::new(first.clone()), options.clone())
        .unwrap();
    // Step 2 shares nothing with step 1, so no record refers to step 1 once its own goes.
    checkpoints
        .save_with(
            2,
            Writer::new(model(&[2, 2], 8192)),
            options.clone().rebase_after(0),
        )
        .unwrap();
    // A save of step 3 against step 1: announced and its base read, then, before it uploads,
    // a retention pass deletes step 1 and sweeps. Only the announcement keeps step 1's bytes.
    let pass = Checkpoints::over(storage.clone(), "run");
    let saver = Checkpoints::over(
        Arc::new(BeforeCreate {
            inner: storage,
            trigger: "delta.bin",
            hook: Mutex::new(Some(Box::new(move || {
                assert_eq!(pass.retain(&Retention::keep_last(1)).unwrap(), [1]);
                pass.gc().map(drop)
            }))),
        }),
        "run",
    );
    let mut third = first;
    third[1] = model(&[3, 3], 8192).remove(1);
    let record = saver
        .save_with(3, Writer::new(third.clone()), options.with_base(1))
        .unwrap();
    assert!(
        record.references().keys().any(|k| k.starts_with("step-1/")),
        "{:?}",
        record.references()
    );
    assert_eq!(checkpoints.steps().unwrap(), [2, 3]);
    assert_eq!(contents(&checkpoints, 3), expected(&third));
    checkpoints.open(3).unwrap().verify().unwrap();
    // Once step 3 is committed, its record protects step 1's bytes: the save removed its
    // announcement.
    assert!(checkpoints.gc_plan().unwrap().spent.is_empty());
    let report = checkpoints.gc().unwrap();
    assert!(
        report
            .kept
            .iter()
            .any(|(k, _)| k.starts_with("run/step-1/")),
        "{report:?}"
    );
    checkpoints.open(3).unwrap().verify().unwrap();
}

#[test]
fn an_announcement_protects_until_its_lease_runs_out_and_a_save_must_commit_within_it() {
    let storage = Arc::new(MemoryStorage::new());
    let checkpoints = Checkpoints::over(storage.clone(), "run");
    checkpoints
        .save_with(
            1,
            Writer::new(model(&[1, 1], 4096)),
            SaveOptions::incremental(),
        )
        .unwrap();
    // A save whose commit record's write fails as if its answer were lost: it may have
    // committed, so its announcement stays.
    let failing = Checkpoints::over(
        Arc::new(BeforeCreate {
            inner: storage.clone(),
            trigger: "commit.json",
            hook: Mutex::new(Some(Box::new(|| {
                Err(weightbay::Error::new(ErrorKind::Io, "connection reset"))
            }))),
        }),
        "run",
    );
    let error = failing
        .save_with(
            2,
            Writer::new(model(&[1, 2], 4096)),
            SaveOptions::incremental(),
        )
        .unwrap_err();
    assert_eq!(error.kind(), ErrorKind::Io, "{error}");
    let announcements = |report: weightbay_checkpoints::GcReport| report.spent.len();
    assert_eq!(announcements(checkpoints.gc_plan().unwrap()), 0);
    let expired = Checkpoints::over(storage, "run").with_reference_lease(Duration::ZERO);
    assert_eq!(announcements(expired.gc_plan().unwrap()), 1);
    // With no lease, a save cannot commit its references in time.
    let error = expired
        .save_with(
            3,
            Writer::new(model(&[1, 3], 4096)),
            SaveOptions::incremental(),
        )
        .unwrap_err();
    assert_eq!(error.kind(), ErrorKind::TimedOut, "{error}");
    assert_eq!(checkpoints.steps().unwrap(), [1]);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    /// Chains of random changes, random retention and gc after each save: every kept
    /// checkpoint reads exactly what was saved, and verifies.
    #[test]
    fn every_kept_checkpoint_of_a_chain_reads_what_was_saved(
        changes in prop::collection::vec(prop::collection::vec(any::<bool>(), 4), 1..8),
        keep in 1usize..4,
        rebase in prop::option::of(0u32..4),
        chunk in prop::sample::select(vec![100u64, 1000, 1 << 20]),
        format in prop::sample::select(vec![Format::Burnpack, Format::Safetensors]),
    ) {
        let checkpoints = Checkpoints::new(MemoryStorage::new(), "run");
        let mut seeds = [1u8, 2, 3, 4];
        let mut saved = BTreeMap::new();
        for (step, changed) in changes.iter().enumerate() {
            let step = step as u64 + 1;
            for (seed, &change) in seeds.iter_mut().zip(changed) {
                if change {
                    *seed = seed.wrapping_add(step as u8 * 3 + 1);
                }
            }
            let tensors = model(&seeds, 1500);
            let mut options = SaveOptions::incremental().with_chunk_len(chunk);
            if let Some(after) = rebase {
                options = options.rebase_after(after);
            }
            checkpoints
                .save_with(step, Writer::new(tensors.clone()).with_format(format), options)
                .unwrap();
            saved.insert(step, expected(&tensors));
            checkpoints.retain(&Retention::keep_last(keep)).unwrap();
            checkpoints.gc().unwrap();
            for kept in checkpoints.steps().unwrap() {
                prop_assert_eq!(&contents(&checkpoints, kept), &saved[&kept]);
                checkpoints.open(kept).unwrap().verify().unwrap();
            }
        }
    }
}
