//! The conformance suite every weightbay storage backend must pass.
//!
//! A backend implements [`Harness`] for its storage and writes one line in a test file:
//!
//! ```
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
//! }
//!
//! weightbay_conformance::suite!(Memory);
//! # fn main() {}
//! ```
//!
//! which expands to one `#[test]` per case in [`cases`], so each case is named, filterable and
//! runs in parallel. The case list lives in the [`suite!`] macro alone, so a new case reaches
//! every backend. Each case is also a public generic function a third party can call directly.
//! A dedicated test binary adds [`memory_bound!`] for the peak-memory case, which needs its own
//! global allocator.
//!
//! A failing case panics with a message that names the case, the operation, and what is needed
//! to replay it: the proptest seed (`WEIGHTBAY_SEED=...`) or the crash point. Property cases run
//! `WEIGHTBAY_CASES` cases each (default 32). docs/ADDING_A_BACKEND.md walks through it.

pub mod alloc;
pub mod cases;
pub mod faulty;
pub mod model;
pub mod sim_disk;
pub mod strategies;

use std::sync::Arc;

pub use faulty::Faulty;
pub use sim_disk::SimulatedDisk;
use weightbay::Storage;
use weightbay::fs::FileSystem;

/// How the suite gets storages of the backend under test.
pub trait Harness: Sync {
    /// The backend's storage type.
    type Storage: Storage + 'static;

    /// Why the storage cannot be reached (a server that is not running), or `None` when it
    /// can. Each case then fails when `WEIGHTBAY_REQUIRE_SERVERS=1` and otherwise prints the
    /// reason and checks nothing.
    fn unavailable(&self) -> Option<String> {
        None
    }

    /// A fresh, empty storage namespace, isolated from every other one this harness made.
    fn fresh(&self) -> Self::Storage;

    /// A new handle to the same underlying storage (as a restarted process would open it).
    fn reopen(&self, storage: &Self::Storage) -> Self::Storage;

    /// A string from which another process can reopen `storage` with
    /// [`reopen_at`](Self::reopen_at); `None` when the storage does not outlive its
    /// process (then the process-crash case has nothing to check and says so).
    fn locator(&self, storage: &Self::Storage) -> Option<String> {
        let _ = storage;
        None
    }

    /// Reopens a storage from a [`locator`](Self::locator), in a child process.
    fn reopen_at(&self, locator: &str) -> Option<Self::Storage> {
        let _ = locator;
        None
    }

    /// The storage over a simulated file system, for backends that do their file I/O through
    /// [`weightbay::fs::FileSystem`]; `None` otherwise (the power-loss case then says so).
    fn over_file_system(&self, fs: Arc<dyn FileSystem>) -> Option<Self::Storage> {
        let _ = fs;
        None
    }

    /// Bytes the backend may hold in memory while writing a container of `container_len`
    /// bytes, beyond the writer's own buffer and the tensor being written (for example part
    /// size × parts in flight for an object store, or the whole container for memory).
    fn write_buffer_bound(&self, container_len: u64) -> u64 {
        let _ = container_len;
        0
    }
}

/// Whether the harness's storage can be reached. When it cannot, this panics if
/// `WEIGHTBAY_REQUIRE_SERVERS=1` and otherwise prints why the case is skipped.
///
/// # Panics
/// When the storage is unreachable and `WEIGHTBAY_REQUIRE_SERVERS=1`.
pub fn reachable<H: Harness>(harness: &H) -> bool {
    let Some(why) = harness.unavailable() else {
        return true;
    };
    if std::env::var("WEIGHTBAY_REQUIRE_SERVERS").is_ok_and(|v| v == "1") {
        panic!("{why} (WEIGHTBAY_REQUIRE_SERVERS=1, so this is a failure)");
    }
    eprintln!(
        "skipped: {why} (run scripts/test.sh, or set WEIGHTBAY_REQUIRE_SERVERS=1 to fail instead)"
    );
    false
}

/// One `#[test]` per conformance case for the harness expression `$harness`.
#[macro_export]
macro_rules! suite {
    ($harness:expr) => {
        $crate::__cases!($harness;
            roundtrip_matches_writer,
            model_based_operations,
            open_missing_is_not_found,
            invalid_keys_are_rejected,
            overwrite_replaces_whole,
            create_new_refuses_existing,
            create_new_race_has_one_winner,
            undeclared_capabilities_are_unsupported,
            abort_on_drop_leaves_nothing,
            failed_writes_leave_key_unchanged,
            fault_at_every_operation,
            power_loss_at_every_operation,
            readers_keep_their_version,
            corrupt_containers_fail_cleanly,
            sharded_checkpoint_is_all_or_nothing,
        );
        #[test]
        fn process_crash_at_every_step() {
            let harness = $harness;
            if $crate::reachable(&harness) {
                $crate::cases::process_crash_at_every_step(
                    &harness,
                    &$crate::cases::test_path(module_path!(), "process_crash_at_every_step"),
                );
            }
        }
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __cases {
    ($harness:expr; $($case:ident),* $(,)?) => {
        $(
            #[test]
            fn $case() {
                let harness = $harness;
                if $crate::reachable(&harness) {
                    $crate::cases::$case(&harness);
                }
            }
        )*
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
            if $crate::reachable(&harness) {
                $crate::cases::peak_memory_is_bounded(&harness, &WEIGHTBAY_COUNTING_ALLOCATOR);
            }
        }
    };
}
