//! Crashes: power lost after each file-system operation on a disk that keeps written and
//! durable bytes apart, and a writer process killed at each step. Afterwards the key holds
//! the old or the new container, never a mix, and what the dead writer left is cleaned.

use std::process::ExitStatus;
use std::sync::Arc;

use weightbay::backend_kit::FileSystem;
use weightbay::{CreateOptions, Durability, Storage, WriteMode};

use crate::holdings::{KEY, assert_nothing_pending, assert_old_or_new, key_for, several_parts};
use crate::outcome::{NO_FILE_SYSTEM, Outcome, fail};
use crate::strategies::{ContainerSpec, sample};
use crate::{FaultPlan, Faulty, Harness, SimulatedDisk};

/// Loses power after each file-system operation of a durable overwrite and of a durable
/// create-new, on a simulated disk that keeps written and durable bytes apart, and, where the
/// backend's sinks take writes by position, of a durable overwrite written by position out of
/// order: every crash image holds the old or the new container (or nothing, for create-new),
/// and once `commit` has returned, the new one.
pub fn power_loss_at_every_operation<H: Harness>(harness: &H, case: &str) -> Outcome {
    let over = |disk: &SimulatedDisk| {
        harness.over_file_system(Arc::new(disk.clone()) as Arc<dyn FileSystem>)
    };
    if over(&SimulatedDisk::new()).is_none() {
        return Outcome::NotApplicable(NO_FILE_SYSTEM.into());
    }
    let old = sample(&[3000, 100], 1);
    let new = sample(&[20_000, 300, 9000], 2);
    for (mode, positioned) in [
        (WriteMode::Overwrite, false),
        (WriteMode::CreateNew, false),
        (WriteMode::Overwrite, true),
    ] {
        let key = key_for(mode);
        let write = |storage: &H::Storage, spec: &ContainerSpec| {
            if positioned {
                return write_positioned(storage, key, &spec.bytes());
            }
            spec.writer()
                .with_mode(mode)
                .with_durability(Durability::Durable)
                .write_to(storage, key)
                .map(|_| ())
        };
        let setup = || {
            let disk = SimulatedDisk::new();
            let storage =
                over(&disk).unwrap_or_else(|| fail!(case, "over_file_system stopped answering"));
            old.writer()
                .with_durability(Durability::Durable)
                .write_to(&storage, KEY)
                .unwrap_or_else(|e| fail!(case, "write old: {e}"));
            (disk, storage)
        };
        let (disk, storage) = setup();
        if positioned && !takes_positioned_writes(&storage) {
            continue;
        }
        let before = disk.operations();
        write(&storage, &new)
            .unwrap_or_else(|e| fail!(case, "{mode:?} write without a crash: {e}"));
        let total = disk.operations() - before;
        for n in 0..=total {
            let (disk, storage) = setup();
            disk.crash_after(n);
            let committed = write(&storage, &new).is_ok();
            let image = disk.crash_image();
            let rebooted =
                over(&image).unwrap_or_else(|| fail!(case, "over_file_system stopped answering"));
            let how = if positioned { ", by position" } else { "" };
            let context = format!("{mode:?}{how}: power lost after operation {n} of {total}");
            assert_old_or_new(
                case,
                &context,
                &rebooted,
                mode,
                &old,
                &new,
                committed.then_some("after commit returned"),
            );
        }
    }
    Outcome::Checked
}

/// Whether `storage`'s sinks take writes by position.
fn takes_positioned_writes(storage: &dyn Storage) -> bool {
    let options = CreateOptions::default().with_expected_len(1);
    storage
        .create("probe", &options)
        .is_ok_and(|mut sink| sink.positioned().is_some())
}

/// Overwrites `key` with `bytes` durably, written by position in pieces from the last to the
/// first.
fn write_positioned(storage: &dyn Storage, key: &str, bytes: &[u8]) -> weightbay::Result<()> {
    let options = CreateOptions::default()
        .with_durability(Durability::Durable)
        .with_expected_len(bytes.len() as u64);
    let mut sink = storage.create(key, &options)?;
    let writes = sink
        .positioned()
        .ok_or_else(|| weightbay::Error::invalid("writes by position went away"))?;
    for (i, piece) in bytes.chunks(4099).enumerate().rev() {
        writes.write_at((i * 4099) as u64, piece)?;
    }
    drop(writes);
    sink.commit()
}

/// The name libtest gives the test `case` generated in module `module_path` (the crate name
/// dropped).
pub fn test_path(module_path: &str, case: &str) -> String {
    match module_path.split_once("::") {
        Some((_, rest)) => format!("{rest}::{case}"),
        None => case.to_string(),
    }
}

/// Set in the child process the crash case spawns: what to write and where to die.
const CHILD_ENV: &str = "WEIGHTBAY_CONFORMANCE_CRASH_CHILD";

/// Where the crash case's child dies: between the backend's own inner operations (file-system
/// calls, store requests) when the harness can apply faults there, else between storage
/// operations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum KillLayer {
    Inner,
    Storage,
}

impl KillLayer {
    /// The deepest layer `harness` can kill in at `locator`.
    pub(crate) fn of<H: Harness>(harness: &H, locator: &str) -> Self {
        if harness
            .reopen_at_with_faults(locator, FaultPlan::counting())
            .is_some()
        {
            Self::Inner
        } else {
            Self::Storage
        }
    }

    /// Its name in a child's spec.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::Inner => "inner",
            Self::Storage => "storage",
        }
    }

    /// The layer a child's spec names.
    pub(crate) fn named(name: &str) -> Self {
        if name == "inner" {
            Self::Inner
        } else {
            Self::Storage
        }
    }
}

/// Runs the test `case` again as a child process with `spec` in the variable `env` (what to do
/// and where to die), and fails `case` unless the child was killed; returns how it ended.
pub(crate) fn killed_child(case: &str, env: &str, spec: &str, context: &str) -> ExitStatus {
    let exe = std::env::current_exe().unwrap_or_else(|e| fail!(case, "current_exe: {e}"));
    let status = std::process::Command::new(&exe)
        .args([case, "--exact", "--nocapture", "--test-threads=1"])
        .env(env, spec)
        .stdout(std::process::Stdio::null())
        .status()
        .unwrap_or_else(|e| fail!(case, "spawning the child: {e}"));
    if status.success() {
        fail!(
            case,
            "{context} (child status {status}): the child was not killed"
        );
    }
    status
}

/// Reopens `locator` in this process with `plan` applied at `layer`.
pub(crate) fn reopen_with_plan<H: Harness>(
    harness: &H,
    locator: &str,
    layer: KillLayer,
    plan: FaultPlan,
) -> Option<Box<dyn Storage>> {
    match layer {
        KillLayer::Inner => harness
            .reopen_at_with_faults(locator, plan)
            .map(|s| Box::new(s) as Box<dyn Storage>),
        KillLayer::Storage => harness
            .reopen_at(locator)
            .map(|s| Box::new(Faulty::new(s, plan)) as Box<dyn Storage>),
    }
}

/// A child process overwrites the old container with the new one (and, where create-new is
/// declared, creates the new one at a free key) and is SIGKILLed after each operation in turn:
/// each of the backend's inner operations where the harness offers
/// [`Harness::reopen_at_with_faults`], else each storage operation. The key then holds the old
/// or the new container (nothing or the new one, for create-new), and
/// [`Storage::clean_pending`] removes what the dead writer left.
///
/// `case` must be the name of the test running the case: the child re-runs that test.
pub fn process_crash_at_every_step<H: Harness>(harness: &H, case: &str) -> Outcome {
    let new = several_parts(harness, 2);
    let old = sample(&[3000, 100], 1);
    let write = |storage: &dyn Storage, mode: WriteMode| {
        let key = key_for(mode);
        new.writer()
            .with_mode(mode)
            .write_to(storage, key)
            .map(|_| ())
    };
    if let Ok(spec) = std::env::var(CHILD_ENV) {
        // In the child: write, and die at the chosen operation.
        let mut parts = spec.splitn(4, ':');
        let (Some(layer), Some(mode), Some(kill_at), Some(locator)) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            fail!(case, "bad child spec {spec}")
        };
        let layer = KillLayer::named(layer);
        let mode = if mode == "create-new" {
            WriteMode::CreateNew
        } else {
            WriteMode::Overwrite
        };
        let kill_at: u64 = kill_at
            .parse()
            .unwrap_or_else(|_| fail!(case, "bad crash point {kill_at}"));
        let storage = reopen_with_plan(harness, locator, layer, FaultPlan::killing_at(kill_at))
            .unwrap_or_else(|| fail!(case, "child cannot reopen {locator}"));
        let _ = write(&*storage, mode);
        std::process::exit(0);
    }
    let Some(locator) = harness.locator(&harness.fresh()) else {
        return Outcome::NotApplicable("the storage does not outlive its process".into());
    };
    let layer = KillLayer::of(harness, &locator);
    let mut modes = vec![WriteMode::Overwrite];
    if harness.fresh().capabilities().atomic_create_new {
        modes.push(WriteMode::CreateNew);
    }
    for mode in modes {
        // A fresh storage holding the old container, and where to reopen it.
        let setup = || {
            let storage = harness.fresh();
            let locator = harness
                .locator(&storage)
                .unwrap_or_else(|| fail!(case, "the harness stopped giving locators"));
            old.writer()
                .write_to(&storage, KEY)
                .unwrap_or_else(|e| fail!(case, "write old: {e}"));
            locator
        };
        let plan = FaultPlan::counting();
        let counting = reopen_with_plan(harness, &setup(), layer, plan.clone())
            .unwrap_or_else(|| fail!(case, "cannot reopen {locator}"));
        write(&*counting, mode).unwrap_or_else(|e| fail!(case, "{mode:?} workload: {e}"));
        let total = plan.operations();
        for n in 1..=total {
            let locator = setup();
            let written = if mode == WriteMode::CreateNew {
                "create-new"
            } else {
                "overwrite"
            };
            let spec = format!("{}:{written}:{n}:{locator}", layer.name());
            let killed =
                format!("{mode:?}: writer killed after {layer:?} operation {n} of {total}");
            let status = killed_child(case, CHILD_ENV, &spec, &killed);
            let context = format!("{killed} (child status {status})");
            let reopened = harness
                .reopen_at(&locator)
                .unwrap_or_else(|| fail!(case, "cannot reopen {locator}"));
            assert_old_or_new(case, &context, &reopened, mode, &old, &new, None);
            if reopened.capabilities().pending_listing {
                reopened
                    .clean_pending("")
                    .unwrap_or_else(|e| fail!(case, "{context}: clean_pending: {e}"));
                assert_nothing_pending(case, &format!("{context}, after clean_pending"), &reopened);
            }
        }
    }
    Outcome::Checked
}
