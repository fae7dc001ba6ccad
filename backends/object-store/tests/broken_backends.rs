//! Object-store defects must fail the conformance suite, each in the case that covers it, with
//! a message that names the case and the step: this backend over object_store's InMemory,
//! behind a store wrapper with one defect.

mod support;

use std::sync::Arc;

use support::SMALL_PARTS;
use support::intercept::{Intercepted, StoreDefect};
use weightbay_conformance::{Case, FaultPlan, Harness, failure_of};
use weightbay_object_store::ObjectStorage;

/// The backend over object_store's InMemory, behind a store with one defect.
struct DefectiveStore(StoreDefect);

impl Harness for DefectiveStore {
    type Storage = ObjectStorage;
    fn fresh(&self) -> ObjectStorage {
        let store = Intercepted::new(
            Arc::new(object_store::memory::InMemory::new()),
            FaultPlan::counting(),
            Some(self.0),
        );
        ObjectStorage::new(Arc::new(store))
            .expect("a runtime")
            .with_options(SMALL_PARTS)
    }
    fn reopen(&self, storage: &ObjectStorage) -> ObjectStorage {
        storage.clone()
    }
}

#[test]
fn completing_a_multipart_upload_without_a_part_fails_the_roundtrip_case() {
    let message = failure_of(
        &DefectiveStore(StoreDefect::DropsSecondPart),
        Case::RoundtripMatchesWriter,
    );
    assert!(
        message.contains(&format!("`{}` failed", Case::RoundtripMatchesWriter.name())),
        "{message}"
    );
    assert!(message.contains("came back different"), "{message}");
}

#[test]
fn ignoring_the_pinned_version_fails_the_readers_case() {
    let message = failure_of(
        &DefectiveStore(StoreDefect::IgnoresPinnedVersion),
        Case::ReadersKeepTheirVersion,
    );
    assert!(
        message.contains("read the tail of another version after the overwrite committed"),
        "{message}"
    );
}

#[test]
fn a_copy_that_ignores_its_condition_fails_the_interleaved_commits_case() {
    // Small containers are created with a conditional PUT, which this store honours; only the
    // staged upload of a several-parts container goes through the copy.
    let message = failure_of(
        &DefectiveStore(StoreDefect::IgnoresCopyCondition),
        Case::InterleavedCommitsResolveInOrder,
    );
    assert!(
        message.contains("CreateNew of two several-parts containers"),
        "{message}"
    );
    assert!(
        message.contains("must fail with AlreadyExists"),
        "{message}"
    );
}

#[test]
fn a_copy_that_ignores_its_condition_fails_the_large_create_new_race() {
    let message = failure_of(
        &DefectiveStore(StoreDefect::IgnoresCopyCondition),
        Case::LargeCreateNewRaceHasOneWinner,
    );
    assert!(message.contains("writers won"), "{message}");
}
