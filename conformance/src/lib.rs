//! The conformance suite every weightbay storage backend must pass.
//!
//! A backend implements [`Harness`] for its storage and writes a test file of one line,
//! declared with `harness = false` in its `Cargo.toml` (`[[test]] name = "conformance"
//! harness = false`):
//!
//! ```no_run
//! use weightbay::MemoryStorage;
//! use weightbay_conformance::{Case, Harness};
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
//!     fn not_applicable(&self) -> &[Case] {
//!         // Nothing outlives the process, and nothing goes through a file system.
//!         &[Case::PowerLossAtEveryOperation, Case::CompressedSavesSurvivePowerLoss,
//!           Case::FileSystemFaultAtEveryOperation, Case::CreateNewRaceStepByStep,
//!           Case::ProcessCrashAtEveryStep, Case::CompressedSavesSurviveKills]
//!     }
//! }
//!
//! weightbay_conformance::suite!(Memory);
//! ```
//!
//! which makes a test binary with one test per [`Case`] (run by
//! [libtest-mimic](https://docs.rs/libtest-mimic), so each case is named, filterable with the usual
//! `cargo test` arguments and runs in parallel). Every case is registered once, in [`cases`], so a
//! new case reaches every backend. Each is also a public generic function a third party can call
//! directly ([`Case::run`] runs one by name); it returns an [`Outcome`]. A case that cannot run on
//! a backend (no simulated file system, nothing that outlives the process) is shown as ignored with
//! its reason when the harness declares it in [`Harness::not_applicable`], and fails when it does
//! not: nothing passes without having been checked. A dedicated test binary adds [`memory_bound!`]
//! for the peak-memory case, which needs its own global allocator.
//!
//! A failing case panics with a message that names the case, the operation, and what is needed
//! to replay it: the proptest seed (`WEIGHTBAY_SEED=...`) or the crash point. Property cases run
//! `WEIGHTBAY_CASES` cases each (default 32). docs/ADDING_A_BACKEND.md walks through it.

pub mod alloc;
mod case;
pub mod cases;
mod faulty;
mod gate;
mod harness;
mod holdings;
mod lockstep;
pub mod model;
mod outcome;
mod property;
pub mod ranked;
mod servers;
mod sim_disk;
pub mod strategies;
mod suite;

pub use case::Case;
pub use faulty::{FaultPlan, Faulty, FaultyFileSystem, InjectedFault, is_injected};
pub use harness::Harness;
pub use outcome::Outcome;
pub use property::property_cases;
pub use servers::{FaultProxy, VerbatimServer, azure_url, s3_open_uploads, s3_url};
pub use sim_disk::SimulatedDisk;
pub use suite::{Suite, failure_of, failure_of_in, verdict};

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
            $crate::alloc::install(&WEIGHTBAY_COUNTING_ALLOCATOR);
            let harness = $harness;
            let case = $crate::Case::PeakMemoryIsBounded;
            let outcome = case.run(&harness, case.name());
            if let Err(message) = $crate::verdict(&harness, case, outcome) {
                panic!("{message}");
            }
        }
    };
}
