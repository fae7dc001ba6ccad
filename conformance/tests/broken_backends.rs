//! Broken backends must fail the suite, each in the case that covers its bug, with a message
//! that names the case and the step. Each defect here is one the suite once let through.

//!
//! The defects here live in a toy HashMap backend; defects of the object-store and local
//! backends' own layers are tested beside those backends (their `tests/broken_backends.rs`).

mod toy;

use toy::{Defect, HashMapHarness};
use weightbay_conformance::{Case, Harness, Outcome, failure_of, verdict};

fn broken(defect: Defect) -> HashMapHarness {
    HashMapHarness {
        defect: Some(defect),
    }
}

#[test]
fn publishing_partial_data_fails_the_abort_case() {
    let message = failure_of(
        &broken(Defect::PublishesPartialWrites),
        Case::AbortOnDropLeavesNothing,
    );
    assert!(
        message.contains(&format!(
            "`{}` failed",
            Case::AbortOnDropLeavesNothing.name()
        )),
        "{message}"
    );
    assert!(message.contains("after dropping a sink"), "{message}");
}

#[test]
fn ignoring_create_new_fails_the_create_new_cases() {
    let message = failure_of(
        &broken(Defect::IgnoresCreateNew),
        Case::CreateNewRefusesExisting,
    );
    assert!(message.contains("expected AlreadyExists"), "{message}");
    let message = failure_of(
        &broken(Defect::IgnoresCreateNew),
        Case::CreateNewRaceHasOneWinner,
    );
    assert!(message.contains("writers won"), "{message}");
}

#[test]
fn swallowing_write_errors_fails_the_roundtrip_case() {
    let message = failure_of(
        &broken(Defect::SwallowsWriteErrors),
        Case::RoundtripMatchesWriter,
    );
    assert!(
        message.contains(&format!("`{}` failed", Case::RoundtripMatchesWriter.name())),
        "{message}"
    );
    assert!(message.contains("came back different"), "{message}");
}

#[test]
fn a_failing_property_prints_the_seed_to_replay_it() {
    // Stale reads break the property round trip on its second case at the latest.
    let message = failure_of(
        &broken(Defect::ServesStaleReads),
        Case::ModelBasedOperations,
    );
    assert!(
        message.contains(&format!("`{}` failed", Case::ModelBasedOperations.name())),
        "{message}"
    );
    assert!(message.contains("minimal input"), "{message}");
    assert!(message.contains("replay with WEIGHTBAY_SEED="), "{message}");
}

#[test]
fn stale_reads_fail_the_overwrite_case() {
    let message = failure_of(
        &broken(Defect::ServesStaleReads),
        Case::OverwriteReplacesWhole,
    );
    assert!(message.contains("after overwrite 1"), "{message}");
}

#[test]
fn deleting_then_inserting_fails_the_readers_case() {
    let message = failure_of(
        &broken(Defect::DeletesThenInserts),
        Case::ReadersKeepTheirVersion,
    );
    assert!(
        message.contains(&format!(
            "`{}` failed",
            Case::ReadersKeepTheirVersion.name()
        )),
        "{message}"
    );
    assert!(
        message.contains("exists throughout an overwrite failed with NotFound"),
        "{message}"
    );
}

#[test]
fn failing_pending_with_io_fails_the_capabilities_case() {
    let message = failure_of(
        &broken(Defect::PendingFailsAsIo),
        Case::UndeclaredCapabilitiesAreUnsupported,
    );
    assert!(
        message.contains("pending listing is not declared: expected Unsupported, got Io"),
        "{message}"
    );
}

#[test]
fn listing_by_string_prefix_fails_the_model_case() {
    let message = failure_of(
        &broken(Defect::ListsByStringPrefix),
        Case::ModelBasedOperations,
    );
    assert!(
        message.contains("but the committed containers are"),
        "{message}"
    );
}

#[test]
fn refusing_unknown_content_fails_the_corrupt_case() {
    let message = failure_of(
        &broken(Defect::RefusesUnknownContent),
        Case::CorruptContainersFailCleanly,
    );
    assert!(
        message.contains(&format!(
            "`{}` failed",
            Case::CorruptContainersFailCleanly.name()
        )),
        "{message}"
    );
    assert!(
        message.contains("expected Corrupt or LimitExceeded, got InvalidInput"),
        "{message}"
    );
}

/// The in-memory HashMap harness with no cases declared not applicable.
struct Undeclared(HashMapHarness);

impl Harness for Undeclared {
    type Storage = toy::HashMapStorage;
    fn fresh(&self) -> Self::Storage {
        self.0.fresh()
    }
    fn reopen(&self, storage: &Self::Storage) -> Self::Storage {
        self.0.reopen(storage)
    }
}

#[test]
fn a_case_that_cannot_run_fails_unless_declared() {
    let harness = Undeclared(HashMapHarness::default());
    let case = Case::PowerLossAtEveryOperation;
    let message = verdict(&harness, case, case.run(&harness, case.name()))
        .expect_err("an undeclared skip passed");
    assert!(
        message.contains("unexpected skip is a failure"),
        "{message}"
    );
    // Declared, it is a skip with its reason.
    let declared = HashMapHarness::default();
    let reason = verdict(&declared, case, case.run(&declared, case.name()));
    assert!(
        matches!(&reason, Ok(Some(why)) if why.contains("FileSystem")),
        "{reason:?}"
    );
    // Declared but able to run: the declaration must go.
    let message = verdict(&declared, Case::ProcessCrashAtEveryStep, Outcome::Checked)
        .expect_err("a declared skip that ran passed");
    assert!(message.contains("remove it from the list"), "{message}");
}

#[test]
fn a_writer_failing_while_readers_race_it_fails_the_readers_case_and_ends() {
    // The writer's second overwrite fails: the case must fail naming the step, not spin.
    let message = failure_of(
        &broken(Defect::FailsAfterThreeCommits),
        Case::ReadersKeepTheirVersion,
    );
    assert!(message.contains("writer, round 1"), "{message}");
    assert!(message.contains("refuses writes"), "{message}");
}

#[test]
fn listing_committed_containers_as_pending_fails_the_capabilities_case() {
    let message = failure_of(
        &broken(Defect::PendingListsCommitted),
        Case::UndeclaredCapabilitiesAreUnsupported,
    );
    assert!(
        message.contains("no write is in progress, but pending() lists"),
        "{message}"
    );
}

#[test]
fn a_listing_of_one_page_fails_the_listing_case() {
    let message = failure_of(&broken(Defect::ListsOnePage), Case::ListingSpansPages);
    assert!(message.contains("the listing gives 1000"), "{message}");
}

#[test]
fn a_source_with_one_shared_cursor_fails_the_shared_sources_case() {
    let message = failure_of(
        &broken(Defect::SharedCursor),
        Case::SourcesAreSharedBetweenThreads,
    );
    assert!(
        message.contains("gave other bytes while other threads read the same source"),
        "{message}"
    );
}

#[test]
fn ignoring_create_new_fails_the_interleaved_checkpoint_cases_every_time() {
    let message = failure_of(
        &broken(Defect::IgnoresCreateNew),
        Case::InterleavedSavesCommitOnce,
    );
    assert!(message.contains("save 0 committing first"), "{message}");
    let message = failure_of(
        &broken(Defect::IgnoresCreateNew),
        Case::InterleavedRankRerunsKeepOnePart,
    );
    assert!(
        message.contains("rank 0's part is stored 2 times"),
        "{message}"
    );
}

#[test]
fn a_batched_read_refusing_empty_ranges_fails_the_batched_reads_case() {
    let message = failure_of(
        &broken(Defect::FetchRefusesEmptyRanges),
        Case::BatchedReadsMatchSingleReads,
    );
    assert!(message.contains("fixed list 0: fetch of"), "{message}");
    assert!(message.contains("zero bytes"), "{message}");
}

#[test]
fn a_batched_read_of_the_latest_version_fails_the_readers_case() {
    let message = failure_of(
        &broken(Defect::FetchReadsLatest),
        Case::ReadersKeepTheirVersion,
    );
    assert!(
        message.contains("fetched the tail of another version"),
        "{message}"
    );
}

#[test]
fn ignoring_deadlines_fails_the_deadline_case() {
    let message = failure_of(&broken(Defect::IgnoresDeadlines), Case::DeadlinesAreKept);
    assert!(
        message.contains("committed after its deadline passed"),
        "{message}"
    );
}

#[test]
fn a_read_back_that_loses_committed_bytes_fails_the_read_back_case() {
    let message = failure_of(
        &broken(Defect::ReadBackLosesCommitted),
        Case::ReadBackFollowsWrites,
    );
    assert!(message.contains("after the commit"), "{message}");
}

#[test]
fn a_delete_by_string_prefix_fails_the_scope_case() {
    let message = failure_of(
        &broken(Defect::DeletesByStringPrefix),
        Case::DeletesAndListingsKeepToTheirKey,
    );
    assert!(
        message.contains("after delete(\"scope/m.bpk\"), scope/m.bpk.bak is gone"),
        "{message}"
    );
}

#[test]
fn a_listing_that_stops_at_a_sibling_fails_the_scope_case() {
    let message = failure_of(
        &broken(Defect::ListsStopAtSibling),
        Case::DeletesAndListingsKeepToTheirKey,
    );
    assert!(
        message.contains("list(\"scope/runs/7\") gave []"),
        "{message}"
    );
}

/// A defect in the listing or cleaning of unfinished writes, over the reference backend
/// (which sees its open sinks as pending).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PendingDefect {
    /// `pending` reports only writes whose writer is gone, never one in progress.
    ListsOnlyAbandoned,
    /// `clean_pending` removes every unfinished write, a live writer's too.
    CleansLiveWrites,
}

#[derive(Debug, Clone)]
struct BrokenPending {
    inner: weightbay::MemoryStorage,
    defect: PendingDefect,
}

#[deny(clippy::missing_trait_methods)]
impl weightbay::Storage for BrokenPending {
    fn pending(&self, prefix: &str) -> weightbay::Result<Vec<weightbay::PendingWrite>> {
        let mut pending = self.inner.pending(prefix)?;
        if self.defect == PendingDefect::ListsOnlyAbandoned {
            pending.retain(|p| p.abandoned);
        }
        Ok(pending)
    }
    fn clean_pending(&self, prefix: &str) -> weightbay::Result<Vec<weightbay::PendingWrite>> {
        match self.defect {
            PendingDefect::CleansLiveWrites => self.inner.pending(prefix),
            PendingDefect::ListsOnlyAbandoned => self.inner.clean_pending(prefix),
        }
    }
    weightbay::forward_storage!(inner => capabilities, create, open, delete, list, list_foreign);
}

impl Harness for PendingDefect {
    type Storage = BrokenPending;

    fn fresh(&self) -> BrokenPending {
        BrokenPending {
            inner: weightbay::MemoryStorage::new(),
            defect: *self,
        }
    }

    fn reopen(&self, storage: &BrokenPending) -> BrokenPending {
        storage.clone()
    }
}

#[test]
fn pending_that_hides_writes_in_progress_fails_the_pending_case() {
    let message = failure_of(
        &PendingDefect::ListsOnlyAbandoned,
        Case::WritesInProgressArePending,
    );
    assert!(message.contains("is not listed by pending"), "{message}");
}

#[test]
fn cleaning_a_live_write_fails_the_cleaning_case() {
    let message = failure_of(
        &PendingDefect::CleansLiveWrites,
        Case::CleaningSparesWritesInProgress,
    );
    assert!(message.contains("removed a write in progress"), "{message}");
}
