//! Compressed incremental saves (`weightbay-checkpoints`) crashing: power lost after each
//! file-system operation of a save, and the saving process killed after each operation.
//! Afterwards every complete checkpoint decodes to exactly what it saved, the one before the
//! crash is still complete, the crashed one is complete only if whole, and gc then breaks
//! nothing.

use std::sync::Arc;

use weightbay::Storage;
use weightbay::Writer;
use weightbay::backend_kit::FileSystem;
use weightbay_checkpoints::Checkpoints;

use crate::cases::crash::{KillLayer, killed_child, reopen_with_plan};
use crate::cases::incremental::{PREFIX, check_all, compressed, model};
use crate::outcome::{NO_FILE_SYSTEM, Outcome, fail};
use crate::{FaultPlan, Harness, SimulatedDisk};

/// Set in the child process the kill case spawns: where to reopen and where to die.
const CHILD_ENV: &str = "WEIGHTBAY_CONFORMANCE_COMPRESSED_CHILD";

/// Saves steps 1 and 2 of the chain, compressed, through `storage`.
fn save_first_two(storage: Arc<dyn Storage>, case: &str) {
    let checkpoints = Checkpoints::over(storage, PREFIX);
    for step in 1..=2 {
        checkpoints
            .save_with(step, Writer::new(model(step)), compressed())
            .unwrap_or_else(|e| fail!(case, "saving step {step}: {e}"));
    }
}

/// Saves step 3, compressed and incremental over steps 1 and 2.
fn save_third(storage: Arc<dyn Storage>) -> weightbay::Result<()> {
    Checkpoints::over(storage, PREFIX)
        .save_with(3, Writer::new(model(3)), compressed())
        .map(drop)
}

/// Fails unless the chain on `storage` is whole (step 2 complete, step 3 too where `saved`),
/// and still is after a gc pass.
fn check_after_crash(storage: Arc<dyn Storage>, saved: bool, case: &str, context: &str) {
    let checkpoints = Checkpoints::over(storage, PREFIX);
    let newest = if saved { 3 } else { 2 };
    check_all(&checkpoints, newest, case, context);
    checkpoints
        .gc()
        .unwrap_or_else(|e| fail!(case, "{context}: gc: {e}"));
    check_all(&checkpoints, newest, case, &format!("{context}, after gc"));
}

/// Loses power after each file-system operation of a compressed incremental save (step 3 over
/// steps 1 and 2), on a simulated disk that keeps written and durable bytes apart: every crash
/// image holds step 2 complete and reading what it saved, step 3 complete (and decoding to
/// what it saved) or not at all, and once the save has returned, step 3; a gc pass on the
/// image changes none of that.
pub fn compressed_saves_survive_power_loss<H: Harness>(harness: &H, case: &str) -> Outcome {
    let over = |disk: &SimulatedDisk| {
        harness.over_file_system(Arc::new(disk.clone()) as Arc<dyn FileSystem>)
    };
    let Some(probe) = over(&SimulatedDisk::new()) else {
        return Outcome::NotApplicable(NO_FILE_SYSTEM.into());
    };
    if !probe.capabilities().listing {
        return Outcome::NotApplicable("the backend does not list its containers".into());
    }
    let setup = || {
        let disk = SimulatedDisk::new();
        let storage: Arc<dyn Storage> = Arc::new(
            over(&disk).unwrap_or_else(|| fail!(case, "over_file_system stopped answering")),
        );
        save_first_two(Arc::clone(&storage), case);
        (disk, storage)
    };
    let (disk, storage) = setup();
    let before = disk.operations();
    save_third(storage).unwrap_or_else(|e| fail!(case, "saving step 3 without a crash: {e}"));
    let total = disk.operations() - before;
    for n in 0..=total {
        let (disk, storage) = setup();
        disk.crash_after(n);
        let saved = save_third(storage).is_ok();
        let rebooted: Arc<dyn Storage> = Arc::new(
            over(&disk.crash_image())
                .unwrap_or_else(|| fail!(case, "over_file_system stopped answering")),
        );
        let context = format!("power lost after operation {n} of {total} of a compressed save");
        check_after_crash(rebooted, saved, case, &context);
    }
    Outcome::Checked
}

/// A child process makes a compressed incremental save (step 3 over steps 1 and 2) and is
/// SIGKILLed after each operation in turn: each of the backend's inner operations where the
/// harness offers [`Harness::reopen_at_with_faults`], else each storage operation. Step 2 is
/// then complete and reads what it saved, step 3 is complete and decodes to what it saved or
/// is not complete, and a gc pass changes neither.
///
/// `case` must be the name of the test running the case: the child re-runs that test.
pub fn compressed_saves_survive_kills<H: Harness>(harness: &H, case: &str) -> Outcome {
    if let Ok(spec) = std::env::var(CHILD_ENV) {
        // In the child: save, and die at the chosen operation.
        let mut parts = spec.splitn(3, ':');
        let (Some(layer), Some(kill_at), Some(locator)) =
            (parts.next(), parts.next(), parts.next())
        else {
            fail!(case, "bad child spec {spec}")
        };
        let layer = KillLayer::named(layer);
        let kill_at: u64 = kill_at
            .parse()
            .unwrap_or_else(|_| fail!(case, "bad crash point {kill_at}"));
        let storage = reopen_with_plan(harness, locator, layer, FaultPlan::killing_at(kill_at))
            .unwrap_or_else(|| fail!(case, "child cannot reopen {locator}"));
        let _ = save_third(Arc::from(storage));
        std::process::exit(0);
    }
    let fresh = harness.fresh();
    if !fresh.capabilities().listing {
        return Outcome::NotApplicable("the backend does not list its containers".into());
    }
    let Some(locator) = harness.locator(&fresh) else {
        return Outcome::NotApplicable("the storage does not outlive its process".into());
    };
    let layer = KillLayer::of(harness, &locator);
    // A fresh storage holding steps 1 and 2, and where to reopen it.
    let setup = || {
        let storage = harness.fresh();
        let locator = harness
            .locator(&storage)
            .unwrap_or_else(|| fail!(case, "the harness stopped giving locators"));
        save_first_two(Arc::new(storage), case);
        locator
    };
    let plan = FaultPlan::counting();
    let counting = reopen_with_plan(harness, &setup(), layer, plan.clone())
        .unwrap_or_else(|| fail!(case, "cannot reopen {locator}"));
    save_third(Arc::from(counting)).unwrap_or_else(|e| fail!(case, "the save: {e}"));
    let total = plan.operations();
    for n in 1..=total {
        let locator = setup();
        let spec = format!("{}:{n}:{locator}", layer.name());
        let killed = format!("compressed save killed after {layer:?} operation {n} of {total}");
        let status = killed_child(case, CHILD_ENV, &spec, &killed);
        let context = format!("{killed} (child status {status})");
        let reopened = harness
            .reopen_at(&locator)
            .unwrap_or_else(|| fail!(case, "cannot reopen {locator}"));
        check_after_crash(Arc::new(reopened), false, case, &context);
    }
    Outcome::Checked
}
