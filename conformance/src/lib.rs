//! The conformance suite every weightbay storage backend must pass.
//!
//! A backend implements [`Harness`] for its storage and writes a test file of one line,
//! declared with `harness = false` in its `Cargo.toml` (`[[test]] name = "conformance"
//! harness = false`):
//!
//! ```no_run
//! use weightbay::MemoryStorage;
//! use weightbay_conformance::Harness;
//!
//! struct Memory;
//!
//! impl Harness for Memory {
//!     type Storage = MemoryStorage;
//!     fn fresh(&self) -> MemoryStorage {
//!         MemoryStorage::new()
//!     }
//!     fn reopen(&self, storage: &MemoryStorage) -> MemoryStorage {
//!         storage.clone()
//!     }
//!     fn not_applicable(&self) -> &[&'static str] {
//!         // Nothing outlives the process, and nothing goes through a file system.
//!         &["power_loss_at_every_operation", "file_system_fault_at_every_operation",
//!           "process_crash_at_every_step"]
//!     }
//! }
//!
//! weightbay_conformance::suite!(Memory);
//! ```
//!
//! which makes a test binary with one test per case in [`cases`] (run by
//! [libtest-mimic](https://docs.rs/libtest-mimic), so each case is named, filterable with the
//! usual `cargo test` arguments and runs in parallel). The case list lives in [`Suite`] alone,
//! so a new case reaches every backend. Each case is also a public generic function a third
//! party can call directly; it returns an [`Outcome`]. A case that cannot run on a backend
//! (no simulated file system, nothing that outlives the process) is shown as ignored with its
//! reason when the harness declares it in [`Harness::not_applicable`], and fails when it does
//! not: nothing passes without having been checked. A dedicated test binary adds
//! [`memory_bound!`] for the peak-memory case, which needs its own global allocator.
//!
//! A failing case panics with a message that names the case, the operation, and what is needed
//! to replay it: the proptest seed (`WEIGHTBAY_SEED=...`) or the crash point. Property cases run
//! `WEIGHTBAY_CASES` cases each (default 32). docs/ADDING_A_BACKEND.md walks through it.
#![warn(missing_docs)]

pub mod alloc;
pub mod cases;
pub mod faulty;
pub mod model;
pub mod ranked;
pub mod sim_disk;
pub mod strategies;

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;

pub use cases::Outcome;
pub use faulty::{FaultPlan, Faulty, FaultyFileSystem, InjectedFault, is_injected};
use libtest_mimic::{Arguments, Completion, Failed, Trial};
pub use sim_disk::SimulatedDisk;
use weightbay::Storage;
use weightbay::backend_kit::FileSystem;

/// How the suite gets storages of the backend under test.
pub trait Harness: Send + Sync + 'static {
    /// The backend's storage type.
    type Storage: Storage + 'static;

    /// Why the storage cannot be reached (a server that is not running), or `None` when it
    /// can. Every case is then shown as ignored with this reason, or fails when
    /// `WEIGHTBAY_REQUIRE_SERVERS=1`.
    fn unavailable(&self) -> Option<String> {
        None
    }

    /// The cases that cannot run on this backend, by name (the names of the functions in
    /// [`cases`]). Such a case must report [`Outcome::NotApplicable`]; any other case that does
    /// fails, so a missing hook cannot quietly turn a case into a pass.
    fn not_applicable(&self) -> &[&'static str] {
        &[]
    }

    /// A fresh, empty storage namespace, isolated from every other one this harness made.
    fn fresh(&self) -> Self::Storage;

    /// A new handle to the same underlying storage (as a restarted process would open it).
    fn reopen(&self, storage: &Self::Storage) -> Self::Storage;

    /// A string from which another process can reopen `storage` with
    /// [`reopen_at`](Self::reopen_at); `None` when the storage does not outlive its
    /// process (the process-crash case is then not applicable).
    fn locator(&self, storage: &Self::Storage) -> Option<String> {
        let _ = storage;
        None
    }

    /// Reopens a storage from a [`locator`](Self::locator), in a child process.
    fn reopen_at(&self, locator: &str) -> Option<Self::Storage> {
        let _ = locator;
        None
    }

    /// Like [`reopen_at`](Self::reopen_at), with `faults` applied to the backend's own inner
    /// operations (file-system calls, store requests), so the process-crash case can kill
    /// between the steps of one `create`, `write` or `commit`. `None` when the backend has no
    /// such layer; the case then kills between storage operations only.
    fn reopen_at_with_faults(&self, locator: &str, faults: FaultPlan) -> Option<Self::Storage> {
        let _ = (locator, faults);
        None
    }

    /// The storage over a simulated file system, for backends that do their file I/O through
    /// [`weightbay::backend_kit::FileSystem`]; `None` otherwise (the power-loss and file-system fault
    /// cases are then not applicable).
    fn over_file_system(&self, fs: Arc<dyn FileSystem>) -> Option<Self::Storage> {
        let _ = fs;
        None
    }

    /// A container length that the backend writes as several pieces (multipart parts, pages,
    /// blocks), so the round-trip, overwrite, create-new and crash cases check how the pieces
    /// are joined. Default 300,000 bytes.
    fn several_parts_len(&self) -> usize {
        300_000
    }

    /// Bytes the backend may hold in memory while writing a container of `container_len`
    /// bytes, beyond the writer's own buffer and the tensor being written (for example part
    /// size × parts in flight for an object store, or the whole container for memory).
    fn write_buffer_bound(&self, container_len: u64) -> u64 {
        let _ = container_len;
        0
    }
}

/// Whether servers are required (`WEIGHTBAY_REQUIRE_SERVERS=1`, as CI sets).
fn servers_required() -> bool {
    std::env::var("WEIGHTBAY_REQUIRE_SERVERS").is_ok_and(|v| v == "1")
}

/// For a plain `#[test]` that needs the local S3 server: its URL (`WEIGHTBAY_S3_URL`, set by
/// `scripts/servers.sh start s3`), or `None` after saying on standard error that the test
/// skips, and why. A test then returns early; libtest still lists it as passed, which is why
/// CI sets `WEIGHTBAY_REQUIRE_SERVERS=1`.
///
/// # Panics
/// When the server is unset and `WEIGHTBAY_REQUIRE_SERVERS=1`.
pub fn s3_url() -> Option<String> {
    match std::env::var("WEIGHTBAY_S3_URL") {
        Ok(url) => Some(url),
        Err(_) if servers_required() => {
            panic!("WEIGHTBAY_REQUIRE_SERVERS=1 but WEIGHTBAY_S3_URL is unset")
        }
        Err(_) => {
            eprintln!(
                "skipped: no S3 server (vars=$(scripts/servers.sh start s3) && eval \"$vars\")"
            );
            None
        }
    }
}

/// Judges a case's outcome against the harness's declarations: `Ok(None)` when it was checked,
/// `Ok(Some(reason))` when it was not applicable and declared so.
///
/// # Errors
/// A message when the case was not applicable but the harness did not declare it, or was
/// declared not applicable but ran.
pub fn verdict<H: Harness>(
    harness: &H,
    case: &str,
    outcome: Outcome,
) -> Result<Option<String>, String> {
    let declared = harness.not_applicable().contains(&case);
    match (outcome, declared) {
        (Outcome::Checked, false) => Ok(None),
        (Outcome::NotApplicable(reason), true) => Ok(Some(reason)),
        (Outcome::NotApplicable(reason), false) => Err(format!(
            "conformance case `{case}` could not run ({reason}) and the harness does not list it \
             in `Harness::not_applicable`: an unexpected skip is a failure"
        )),
        (Outcome::Checked, true) => Err(format!(
            "conformance case `{case}` ran, but the harness lists it in \
             `Harness::not_applicable`: remove it from the list"
        )),
    }
}

/// The conformance cases as tests, for one or more backends, run by libtest-mimic.
///
/// [`suite!`] is this for one backend. A test binary with several harnesses names each:
///
/// ```no_run
/// # use weightbay::MemoryStorage;
/// # struct Memory;
/// # impl weightbay_conformance::Harness for Memory {
/// #     type Storage = MemoryStorage;
/// #     fn fresh(&self) -> MemoryStorage { MemoryStorage::new() }
/// #     fn reopen(&self, s: &MemoryStorage) -> MemoryStorage { s.clone() }
/// # }
/// fn main() {
///     weightbay_conformance::Suite::new()
///         .backend("first", Memory)
///         .backend("second", Memory)
///         .run();
/// }
/// ```
#[derive(Debug, Default)]
pub struct Suite {
    trials: Vec<Trial>,
}

type CaseFn<H> = fn(&H, &str) -> Outcome;

impl Suite {
    /// An empty suite.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds every case for `harness`, named `name::case` (or `case` when `name` is empty).
    #[must_use]
    pub fn backend<H: Harness>(mut self, name: &str, harness: H) -> Self {
        let cases: [(&'static str, CaseFn<H>); 20] = [
            ("roundtrip_matches_writer", |h, _| {
                cases::roundtrip_matches_writer(h)
            }),
            ("model_based_operations", |h, _| {
                cases::model_based_operations(h)
            }),
            ("open_missing_is_not_found", |h, _| {
                cases::open_missing_is_not_found(h)
            }),
            ("invalid_keys_are_rejected", |h, _| {
                cases::invalid_keys_are_rejected(h)
            }),
            ("overwrite_replaces_whole", |h, _| {
                cases::overwrite_replaces_whole(h)
            }),
            ("create_new_refuses_existing", |h, _| {
                cases::create_new_refuses_existing(h)
            }),
            ("create_new_race_has_one_winner", |h, _| {
                cases::create_new_race_has_one_winner(h)
            }),
            ("undeclared_capabilities_are_unsupported", |h, _| {
                cases::undeclared_capabilities_are_unsupported(h)
            }),
            ("abort_on_drop_leaves_nothing", |h, _| {
                cases::abort_on_drop_leaves_nothing(h)
            }),
            ("failed_writes_leave_key_unchanged", |h, _| {
                cases::failed_writes_leave_key_unchanged(h)
            }),
            ("fault_at_every_operation", |h, _| {
                cases::fault_at_every_operation(h)
            }),
            ("file_system_fault_at_every_operation", |h, _| {
                cases::file_system_fault_at_every_operation(h)
            }),
            ("power_loss_at_every_operation", |h, _| {
                cases::power_loss_at_every_operation(h)
            }),
            (
                "process_crash_at_every_step",
                cases::process_crash_at_every_step,
            ),
            ("readers_keep_their_version", |h, _| {
                cases::readers_keep_their_version(h)
            }),
            ("batched_reads_match_single_reads", |h, _| {
                cases::batched_reads_match_single_reads(h)
            }),
            ("corrupt_containers_fail_cleanly", |h, _| {
                cases::corrupt_containers_fail_cleanly(h)
            }),
            ("sharded_checkpoint_is_all_or_nothing", |h, _| {
                cases::sharded_checkpoint_is_all_or_nothing(h)
            }),
            ("checkpoint_lifecycle", |h, _| {
                cases::checkpoint_lifecycle(h)
            }),
            ("multi_rank_commit", |h, _| cases::multi_rank_commit(h)),
        ];
        let harness = Arc::new(harness);
        let unavailable = harness.unavailable();
        if let Some(why) = &unavailable
            && !servers_required()
        {
            eprintln!(
                "{name}: every case ignored: {why} (run scripts/test.sh, or set \
                 WEIGHTBAY_REQUIRE_SERVERS=1 to fail instead)"
            );
        }
        for (case, run) in cases {
            let test = if name.is_empty() {
                case.to_owned()
            } else {
                format!("{name}::{case}")
            };
            let harness = Arc::clone(&harness);
            let unavailable = unavailable.clone();
            let name = test.clone();
            self.trials.push(Trial::ignorable_test(test, move || {
                if let Some(why) = unavailable {
                    return if servers_required() {
                        Err(Failed::from(format!(
                            "{why} (WEIGHTBAY_REQUIRE_SERVERS=1, so this is a failure)"
                        )))
                    } else {
                        Ok(Completion::ignored_with(why))
                    };
                }
                let outcome = catch_unwind(AssertUnwindSafe(|| run(&harness, &name)))
                    .map_err(|panic| Failed::from(panic_message(&*panic)))?;
                match verdict(&*harness, case, outcome)? {
                    None => Ok(Completion::Completed),
                    Some(reason) => Ok(Completion::ignored_with(format!(
                        "not applicable: {reason}"
                    ))),
                }
            }));
        }
        self
    }

    /// Runs the cases as the test binary's arguments select, then exits with libtest's status.
    pub fn run(self) -> ! {
        libtest_mimic::run(&Arguments::from_args(), self.trials).exit()
    }
}

/// The text of a panic payload.
fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| panic.downcast_ref::<&str>().map(ToString::to_string))
        .unwrap_or_else(|| "the case panicked".to_owned())
}

/// A `main` that runs every conformance case for the harness expression `$harness`. The test
/// target needs `harness = false`.
#[macro_export]
macro_rules! suite {
    ($harness:expr) => {
        fn main() {
            $crate::Suite::new().backend("", $harness).run()
        }
    };
}

/// The peak-memory case, with the counting global allocator it needs. Use it alone in a
/// dedicated test binary (`tests/memory.rs`).
#[macro_export]
macro_rules! memory_bound {
    ($harness:expr) => {
        #[global_allocator]
        static WEIGHTBAY_COUNTING_ALLOCATOR: $crate::alloc::CountingAllocator =
            $crate::alloc::CountingAllocator::new();

        #[test]
        fn peak_memory_is_bounded() {
            let harness = $harness;
            let outcome =
                $crate::cases::peak_memory_is_bounded(&harness, &WEIGHTBAY_COUNTING_ALLOCATOR);
            if let Err(message) = $crate::verdict(&harness, "peak_memory_is_bounded", outcome) {
                panic!("{message}");
            }
        }
    };
}
