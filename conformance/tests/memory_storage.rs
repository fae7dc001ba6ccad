//! The reference backend passes its own suite.

use weightbay::MemoryStorage;
use weightbay_conformance::{Case, Harness};

struct Memory;

impl Harness for Memory {
    type Storage = MemoryStorage;

    fn fresh(&self) -> MemoryStorage {
        MemoryStorage::new()
    }

    fn reopen(&self, storage: &MemoryStorage) -> MemoryStorage {
        storage.clone()
    }

    fn not_applicable(&self) -> &[Case] {
        // Nothing outlives the process, and nothing goes through a file system.
        &[
            Case::PowerLossAtEveryOperation,
            Case::CompressedSavesSurvivePowerLoss,
            Case::FileSystemFaultAtEveryOperation,
            Case::CreateNewRaceStepByStep,
            Case::ProcessCrashAtEveryStep,
            Case::CompressedSavesSurviveKills,
        ]
    }

    fn write_buffer_bound(&self, container_len: u64) -> u64 {
        // The memory sink holds the whole container: that is where it is stored.
        container_len
    }
}

weightbay_conformance::suite!(Memory);
