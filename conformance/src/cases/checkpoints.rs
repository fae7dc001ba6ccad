//! The checkpoint lifecycle (`weightbay-checkpoints`) on the backend, one scenario per case:
//! saves listed and verified, a failing save that never becomes a checkpoint, retention, and
//! two savers racing for one step.

use std::collections::BTreeSet;
use std::sync::Arc;

use weightbay::{ErrorKind, Format, Storage, Tensor, Writer};
use weightbay_checkpoints::{COMMIT_RECORD, Checkpoints, Retention, SaveOptions};

use crate::gate::Gate;
use crate::outcome::{Outcome, fail};
use crate::strategies::sample;
use crate::{Faulty, Harness, is_injected};

/// The prefix every checkpoint case saves under.
const PREFIX: &str = "ckpt";

/// A writer of step `step`'s tensors in `format`, a few KB.
fn container(step: u64, format: Format) -> Writer {
    let spec = sample(&[300 + step as usize, 7000, 40], step as u8);
    let tensors = spec
        .tensors
        .iter()
        .map(|t| Tensor::new(&t.name, t.dtype.clone(), t.shape.clone(), t.data.clone()))
        .collect();
    Writer::new(tensors).with_format(format)
}

/// A fresh storage holding checkpoints 1 (one Burnpack container), 2 (sharded safetensors) and
/// 3 (sharded Burnpack), and the checkpoints over it; `None` when the backend cannot list.
fn three_saved<H: Harness>(
    harness: &H,
    case: &str,
) -> Option<(H::Storage, Arc<dyn Storage>, Checkpoints)> {
    let storage = harness.fresh();
    if !storage.capabilities().listing {
        return None;
    }
    let shared: Arc<dyn Storage> = Arc::new(harness.reopen(&storage));
    let checkpoints = Checkpoints::over(Arc::clone(&shared), PREFIX);
    let saves = [
        (1, Format::Burnpack, SaveOptions::default()),
        (2, Format::Safetensors, SaveOptions::sharded(4000)),
        (3, Format::Burnpack, SaveOptions::sharded(4000)),
    ];
    for (step, format, options) in saves {
        checkpoints
            .save_with(step, container(step, format), options)
            .unwrap_or_else(|e| fail!(case, "saving step {step}: {e}"));
    }
    Some((storage, shared, checkpoints))
}

/// Why the checkpoint cases cannot run.
const NO_LISTING: &str = "the backend does not list its containers";

/// The steps of the complete checkpoints, or a failure naming `context`.
fn steps(checkpoints: &Checkpoints, case: &str, context: &str) -> Vec<u64> {
    checkpoints
        .steps()
        .unwrap_or_else(|e| fail!(case, "{context}: listing the checkpoints: {e}"))
}

/// Saves in both formats, one sharded, are listed, the newest is `latest`, and each verifies
/// against its commit record.
pub fn checkpoints_list_and_verify<H: Harness>(harness: &H, case: &str) -> Outcome {
    let Some((_, _, checkpoints)) = three_saved(harness, case) else {
        return Outcome::NotApplicable(NO_LISTING.into());
    };
    let listed = steps(&checkpoints, case, "after three saves");
    if listed != [1, 2, 3] {
        fail!(case, "three saves list as {listed:?}");
    }
    for step in [1, 2, 3] {
        let checkpoint = checkpoints
            .open(step)
            .unwrap_or_else(|e| fail!(case, "opening step {step}: {e}"));
        if let Err(e) = checkpoint.verify() {
            fail!(case, "step {step} does not verify: {e}");
        }
    }
    match checkpoints.latest() {
        Ok(Some(latest)) if latest.step() == 3 => {}
        other => fail!(
            case,
            "latest is not step 3: {:?}",
            other.map(|c| c.map(|c| c.step()))
        ),
    }
    Outcome::Checked
}

/// A save failing at each storage operation in turn never becomes a checkpoint, and leaves
/// nothing that `gc` does not remove once a later save completes.
pub fn failed_saves_never_become_checkpoints<H: Harness>(harness: &H, case: &str) -> Outcome {
    let Some((storage, shared, checkpoints)) = three_saved(harness, case) else {
        return Outcome::NotApplicable(NO_LISTING.into());
    };
    for fail_at in 1.. {
        let faulty: Arc<dyn Storage> =
            Arc::new(Faulty::failing_at(harness.reopen(&storage), fail_at));
        let result = Checkpoints::over(faulty, PREFIX).save(4, container(4, Format::Burnpack));
        let context = format!("a save failing at operation {fail_at}");
        match result {
            Ok(_) => break,
            Err(e) if !is_injected(&e) => {
                fail!(case, "{context} failed with its own error: {e}")
            }
            Err(_) => {}
        }
        let listed = steps(&checkpoints, case, &context);
        if listed != [1, 2, 3] {
            fail!(case, "{context}: the checkpoints are {listed:?}");
        }
    }
    let listed = steps(&checkpoints, case, "after the save of step 4 succeeded");
    if listed != [1, 2, 3, 4] {
        fail!(case, "after step 4 saved, the checkpoints are {listed:?}");
    }
    if let Err(e) = checkpoints.gc() {
        fail!(case, "gc: {e}");
    }
    // Every key left is a commit record or a container one names.
    let statuses = checkpoints
        .list()
        .unwrap_or_else(|e| fail!(case, "listing: {e}"));
    let named: BTreeSet<String> = statuses
        .iter()
        .filter_map(|s| s.record.as_ref())
        .flat_map(|r| {
            let dir = checkpoints.step_dir(r.step);
            r.containers
                .iter()
                .map(|c| format!("{dir}/{}", c.key))
                .chain(std::iter::once(format!("{dir}/{COMMIT_RECORD}")))
                .collect::<Vec<_>>()
        })
        .collect();
    let listed = shared
        .list(PREFIX)
        .unwrap_or_else(|e| fail!(case, "listing {PREFIX}: {e}"));
    if let Some(stray) = listed.iter().find(|l| !named.contains(&l.key)) {
        fail!(
            case,
            "after gc, `{}` is left that no commit record names",
            stray.key
        );
    }
    Outcome::Checked
}

/// Retention keeps what it says and deletes all of the rest.
pub fn retention_keeps_what_it_says<H: Harness>(harness: &H, case: &str) -> Outcome {
    let Some((_, shared, checkpoints)) = three_saved(harness, case) else {
        return Outcome::NotApplicable(NO_LISTING.into());
    };
    match checkpoints.retain(&Retention::keep_last(2)) {
        Ok(deleted) if deleted == [1] => {}
        other => fail!(
            case,
            "retention of the last 2 deleted {other:?}, not step 1"
        ),
    }
    let left = shared
        .list(PREFIX)
        .unwrap_or_else(|e| fail!(case, "listing {PREFIX}: {e}"));
    if let Some(stale) = left.iter().find(|l| l.key.starts_with("ckpt/step-1/")) {
        fail!(case, "retention left `{}` behind", stale.key);
    }
    let listed = steps(&checkpoints, case, "after retention");
    if listed != [2, 3] {
        fail!(
            case,
            "after keeping the last 2, the checkpoints are {listed:?}"
        );
    }
    Outcome::Checked
}

/// Of two savers racing for one step, exactly one commits and the other fails with
/// `AlreadyExists`, leaving nothing behind.
pub fn racing_saves_commit_once<H: Harness>(harness: &H, case: &str) -> Outcome {
    let storage = harness.fresh();
    let capabilities = storage.capabilities();
    if !capabilities.listing || !capabilities.atomic_create_new {
        return Outcome::NotApplicable(
            "the backend does not both list and create new atomically".into(),
        );
    }
    let shared: Arc<dyn Storage> = Arc::new(harness.reopen(&storage));
    let checkpoints = Checkpoints::over(Arc::clone(&shared), PREFIX);
    let racers: Vec<_> = (0..2u8)
        .map(|i| {
            let checkpoints = Checkpoints::over(Arc::clone(&shared), PREFIX);
            let writer = container(5 + u64::from(i), Format::Burnpack);
            std::thread::spawn(move || checkpoints.save(5, writer))
        })
        .collect();
    let results: Vec<_> = racers
        .into_iter()
        .map(|r| {
            r.join()
                .unwrap_or_else(|_| fail!(case, "a racing saver panicked"))
        })
        .collect();
    let won = results.iter().filter(|r| r.is_ok()).count();
    let lost_cleanly = results
        .iter()
        .filter(|r| matches!(r, Err(e) if e.kind() == ErrorKind::AlreadyExists))
        .count();
    if (won, lost_cleanly) != (1, 1) {
        fail!(case, "two savers racing for step 5: {results:?}");
    }
    let stored = shared
        .list("ckpt/step-5")
        .unwrap_or_else(|e| fail!(case, "listing step 5: {e}"));
    let record = checkpoints
        .open(5)
        .unwrap_or_else(|e| fail!(case, "opening step 5: {e}"));
    if stored.len() != record.record().containers.len() + 1 {
        fail!(case, "the losing saver left files behind: {stored:?}");
    }
    Outcome::Checked
}

/// Two saves of one step whose commit records meet, committed one after the other in both
/// orders (no luck involved): the first record wins, the second save fails with AlreadyExists
/// and removes its containers; the step holds the winner's record and containers alone.
pub fn interleaved_saves_commit_once<H: Harness>(harness: &H, case: &str) -> Outcome {
    let capabilities = harness.fresh().capabilities();
    if !capabilities.listing || !capabilities.atomic_create_new {
        return Outcome::NotApplicable(
            "the backend does not both list and create new atomically".into(),
        );
    }
    for first in [0, 1] {
        let context = format!("save {first} committing first");
        let storage = harness.fresh();
        let shared: Arc<dyn Storage> = Arc::new(harness.reopen(&storage));
        let gate = Gate::new(Arc::clone(&shared), "/commit.json", [first, 1 - first]);
        let results: Vec<_> = std::thread::scope(|scope| {
            let saves: Vec<_> = (0..2)
                .map(|id| {
                    let checkpoints = Checkpoints::over(gate.writer(id), PREFIX);
                    let writer = container(5 + id as u64, Format::Burnpack);
                    scope.spawn(move || checkpoints.save(5, writer))
                })
                .collect();
            saves
                .into_iter()
                .map(|save| {
                    save.join()
                        .unwrap_or_else(|_| fail!(case, "{context}: a save panicked"))
                })
                .collect()
        });
        match (&results[first], &results[1 - first]) {
            (Ok(_), Err(e)) if e.kind() == ErrorKind::AlreadyExists => {}
            other => fail!(case, "{context}: {other:?}"),
        }
        let checkpoints = Checkpoints::over(Arc::clone(&shared), PREFIX);
        let checkpoint = checkpoints
            .open(5)
            .unwrap_or_else(|e| fail!(case, "{context}: opening step 5: {e}"));
        if let Err(e) = checkpoint.verify() {
            fail!(case, "{context}: step 5 does not verify: {e}");
        }
        let read = checkpoint
            .reader()
            .and_then(|r| r.read_as::<u8>("layer0.weight"));
        let expected = container(5 + first as u64, Format::Burnpack)
            .tensors()
            .first()
            .and_then(|t| t.bytes().ok())
            .and_then(|b| b.to_vec().ok());
        if read.ok() != expected {
            fail!(
                case,
                "{context}: step 5 does not hold the first save's tensors"
            );
        }
        let stored = shared
            .list("ckpt/step-5")
            .unwrap_or_else(|e| fail!(case, "{context}: listing step 5: {e}"));
        if stored.len() != checkpoint.record().containers.len() + 1 {
            fail!(
                case,
                "{context}: the losing save left files behind: {stored:?}"
            );
        }
    }
    Outcome::Checked
}
