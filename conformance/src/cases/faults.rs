//! Faults while the system keeps running: each storage operation, and each file-system
//! operation, failing in turn. The error keeps its cause and the key holds old or new.

use std::sync::Arc;

use weightbay::backend_kit::FileSystem;
use weightbay::{Durability, Reader, Storage, WriteMode};

use crate::holdings::{
    KEY, assert_holds_one_of, assert_nothing_pending, assert_old_or_new, key_for,
};
use crate::outcome::{NO_FILE_SYSTEM, Outcome, fail};
use crate::strategies::{ContainerSpec, sample};
use crate::{FaultPlan, Faulty, FaultyFileSystem, Harness, SimulatedDisk, is_injected};

/// The workload the fault and crash cases interrupt: overwrite `KEY` with the new container.
fn write_new(storage: &dyn Storage, spec: &ContainerSpec) -> weightbay::Result<()> {
    spec.writer().write_to(storage, KEY).map(|_| ())
}

/// Read back everything: open, read each tensor, verify.
fn read_back(storage: &dyn Storage) -> weightbay::Result<()> {
    let reader = Reader::open(storage.open(KEY)?)?;
    for info in reader.tensors() {
        reader.read(info.name())?;
    }
    reader.verify().map(|_| ())
}

/// Fails each I/O operation of a write-then-read workload in turn: the error reaches the
/// caller naming the operation, and the key holds the old or the new container, complete and
/// verifying, never anything else, with nothing left behind.
pub fn fault_at_every_operation<H: Harness>(harness: &H, case: &str) -> Outcome {
    let old = sample(&[3000, 100], 1);
    let new = sample(&[100_000, 70_000, 20, 0, 90_000], 2);
    let counting = Faulty::counting(harness.fresh());
    old.writer()
        .write_to(&counting, KEY)
        .unwrap_or_else(|e| fail!(case, "write old: {e}"));
    let before = counting.operations();
    write_new(&counting, &new)
        .and_then(|()| read_back(&counting))
        .unwrap_or_else(|e| fail!(case, "workload: {e}"));
    let total = counting.operations() - before;
    for n in 1..=total {
        let storage = harness.fresh();
        old.writer()
            .write_to(&storage, KEY)
            .unwrap_or_else(|e| fail!(case, "write old: {e}"));
        let faulty = Faulty::failing_at(harness.reopen(&storage), n);
        let result = write_new(&faulty, &new).and_then(|()| read_back(&faulty));
        match result {
            Err(e) if is_injected(&e) => {}
            Err(e) => fail!(
                case,
                "fault at operation {n} of {total}: the error lost the cause: {e}"
            ),
            Ok(()) => fail!(
                case,
                "fault at operation {n} of {total} was swallowed: the workload succeeded"
            ),
        }
        let context = format!("fault at operation {n} of {total}");
        let reopened = harness.reopen(&storage);
        assert_holds_one_of(
            case,
            &context,
            &reopened,
            KEY,
            &[Some(&old.bytes()), Some(&new.bytes())],
        );
        assert_nothing_pending(case, &context, &reopened);
    }
    Outcome::Checked
}

/// Fails each file-system operation of a durable overwrite, a create-new and the read back in
/// turn (not a crash: the system keeps running), then looks at the live disk: the error reaches
/// the caller with the injected fault in its cause chain, the key holds the old or the new
/// container, readable and verifying (nothing or the new one, for create-new), and no other
/// file is left that [`Storage::pending`] does not report.
pub fn file_system_fault_at_every_operation<H: Harness>(harness: &H, case: &str) -> Outcome {
    let over = |fs: Arc<dyn FileSystem>| harness.over_file_system(fs);
    if over(Arc::new(SimulatedDisk::new())).is_none() {
        return Outcome::NotApplicable(NO_FILE_SYSTEM.into());
    }
    let storage_over = |fs: Arc<dyn FileSystem>| {
        over(fs).unwrap_or_else(|| fail!(case, "over_file_system stopped answering"))
    };
    let old = sample(&[3000, 100], 1);
    let new = sample(&[20_000, 300, 9000], 2);
    for mode in [WriteMode::Overwrite, WriteMode::CreateNew] {
        let key = key_for(mode);
        let workload = |storage: &H::Storage| {
            new.writer()
                .with_mode(mode)
                .with_durability(Durability::Durable)
                .write_to(storage, key)?;
            let reader = Reader::open(storage.open(key)?)?;
            for info in reader.tensors() {
                reader.read(info.name())?;
            }
            reader.verify().map(|_| ())
        };
        let setup = || {
            let disk = SimulatedDisk::new();
            old.writer()
                .with_durability(Durability::Durable)
                .write_to(&storage_over(Arc::new(disk.clone())), KEY)
                .unwrap_or_else(|e| fail!(case, "write old: {e}"));
            disk
        };
        let disk = setup();
        let plan = FaultPlan::counting();
        workload(&storage_over(Arc::new(FaultyFileSystem::new(
            Arc::new(disk),
            plan.clone(),
        ))))
        .unwrap_or_else(|e| fail!(case, "{mode:?} workload without a fault: {e}"));
        let total = plan.operations();
        for n in 1..=total {
            let disk = setup();
            let before = disk.files();
            let plan = FaultPlan::failing_at(n);
            let faulty = FaultyFileSystem::new(Arc::new(disk.clone()), plan.clone());
            let failed = |plan: &FaultPlan| plan.injected().map_or("", |fault| fault.name);
            let mut context = format!("{mode:?}: file-system operation {n} of {total} failed");
            let succeeded = match workload(&storage_over(Arc::new(faulty))) {
                // A backend may get past a failed step it can do without (a best-effort
                // cleanup), never past a failed sync of a durable write.
                Ok(()) if ["fsync", "sync_dir"].contains(&failed(&plan)) => fail!(
                    case,
                    "{context} ({}), and the durable write reported success",
                    failed(&plan)
                ),
                Ok(()) => true,
                Err(e) if !is_injected(&e) => fail!(
                    case,
                    "{context} ({}): the error lost its cause (no InjectedFault in its source chain): {e}",
                    failed(&plan)
                ),
                Err(_) => false,
            };
            context = format!("{context} ({})", failed(&plan));
            let live = storage_over(Arc::new(disk.clone()));
            assert_old_or_new(
                case,
                &context,
                &live,
                mode,
                &old,
                &new,
                succeeded.then_some("after the workload succeeded"),
            );
            if let Some(vanished) = before.difference(&disk.files()).next() {
                fail!(case, "{context}: {} vanished", vanished.display());
            }
            let pending = if live.capabilities().pending_listing {
                live.pending("")
                    .unwrap_or_else(|e| fail!(case, "{context}: pending(): {e}"))
            } else {
                Vec::new()
            };
            let key_path = |path: &std::path::Path| path.ends_with(key);
            for extra in disk.files().difference(&before) {
                // A backend names what holds a pending write in its own words; a scratch file's
                // name (unique to its writer) must be among them.
                let name = extra.file_name().map(|n| n.to_string_lossy().into_owned());
                let reported = name
                    .is_some_and(|name| pending.iter().any(|p| p.held_by.contains(name.as_str())));
                if !key_path(extra) && !reported {
                    fail!(
                        case,
                        "{context}: {} was left behind and pending() does not report it",
                        extra.display()
                    );
                }
            }
        }
    }
    Outcome::Checked
}
