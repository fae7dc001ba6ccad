//! Deletes, listings and cleanups reach exactly what they were given, never a neighbour: a key
//! that is a string prefix of others, a sibling that sorts before a prefix's directory
//! (`runs/7.json` before `runs/7/`), a write still in progress. `gc` deletes what these
//! answer, so a backend that reaches one key too far loses someone else's data.

use weightbay::{CreateOptions, Durability, Listed, Storage, StorageExt};

use crate::{Case, Harness};

use crate::holdings::{pattern, stored};
use crate::outcome::{Outcome, fail};

/// Keys that share string prefixes, and how long each is.
const NEIGHBOURS: &[(&str, usize)] = &[
    ("scope/m.bpk", 100),
    ("scope/m.bpk.bak", 101),
    ("scope/m.bpk2", 102),
    ("scope/runs/7-old/y.bpk", 103),
    ("scope/runs/7.json", 104),
    ("scope/runs/7/a.bpk", 105),
    ("scope/runs/7/b/c.bpk", 106),
    ("scope/runs/70/x.bpk", 107),
];

/// Asserts `list(prefix)` is exactly `expected` of [`NEIGHBOURS`], with their lengths.
fn assert_lists(case: &str, context: &str, storage: &dyn Storage, prefix: &str, expected: &[&str]) {
    let listed = storage
        .list(prefix)
        .unwrap_or_else(|e| fail!(case, "{context}: list({prefix:?}): {e}"));
    let want: Vec<Listed> = NEIGHBOURS
        .iter()
        .filter(|(key, _)| expected.contains(key))
        .map(|&(key, len)| Listed {
            key: key.to_owned(),
            len: len as u64,
        })
        .collect();
    if listed != want {
        fail!(
            case,
            "{context}: list({prefix:?}) gave {listed:?}, where the keys under it are {want:?}"
        );
    }
}

/// Keys that are string prefixes of each other, and a sibling that sorts before a prefix's
/// directory: a listing of `scope/runs/7` gives exactly the keys under `scope/runs/7/` (none
/// of `7.json`, `7-old/`, `70/`), a delete removes exactly its key, a delete of a prefix that
/// is no key removes nothing, and cleaning unfinished writes removes no committed key.
pub fn deletes_and_listings_keep_to_their_key<H: Harness>(harness: &H, case: &str) -> Outcome {
    let storage = harness.fresh();
    for (i, &(key, len)) in NEIGHBOURS.iter().enumerate() {
        storage
            .write_new(key, &pattern(len, i as u8), Durability::Flushed)
            .unwrap_or_else(|e| fail!(case, "writing {key}: {e}"));
    }
    let all: Vec<&str> = NEIGHBOURS.iter().map(|(key, _)| *key).collect();
    let listing = storage.capabilities().listing;
    if listing {
        assert_lists(case, "after writing", &storage, "scope", &all);
        let under_7 = ["scope/runs/7/a.bpk", "scope/runs/7/b/c.bpk"];
        assert_lists(case, "after writing", &storage, "scope/runs/7", &under_7);
        assert_lists(case, "after writing", &storage, "scope/m.bpk", &[]);
    }
    if storage.capabilities().pending_listing {
        for prefix in ["scope/runs/7", "scope", ""] {
            match storage.clean_pending(prefix) {
                Ok(removed) if removed.is_empty() => {}
                Ok(removed) => fail!(
                    case,
                    "clean_pending({prefix:?}) with no write unfinished removed {removed:?}"
                ),
                Err(e) => fail!(case, "clean_pending({prefix:?}): {e}"),
            }
        }
    }
    // A prefix that is no key: deleting it fails, and takes nothing with it.
    if storage.delete("scope/runs/7").is_ok() {
        fail!(
            case,
            "delete(\"scope/runs/7\"), a directory of keys and no key, succeeded"
        );
    }
    let mut left = all.clone();
    for deleted in ["scope/m.bpk", "scope/runs/7/a.bpk"] {
        storage
            .delete(deleted)
            .unwrap_or_else(|e| fail!(case, "delete({deleted:?}): {e}"));
        left.retain(|key| *key != deleted);
        for (i, &(key, len)) in NEIGHBOURS.iter().enumerate() {
            let expected = left.contains(&key).then(|| pattern(len, i as u8));
            if stored(&storage, key).ok() != expected {
                fail!(
                    case,
                    "after delete({deleted:?}), {key} is {}",
                    if expected.is_some() {
                        "gone or changed"
                    } else {
                        "still there"
                    }
                );
            }
        }
        if listing {
            assert_lists(
                case,
                &format!("after delete({deleted:?})"),
                &storage,
                "scope",
                &left,
            );
        }
    }
    Outcome::Checked
}

/// How much a case writes before it looks for its write in progress: past one part of any
/// harness's uploads (a multipart upload exists, and is journaled, once its first part goes).
const IN_PROGRESS: usize = (16 << 20) + 4097;

/// A write in progress is listed by `pending` as not abandoned, on a backend that can see
/// writes before their commit (scratch files, journaled uploads); a harness whose backend
/// cannot (an object store without a multipart API) names this case not applicable.
pub fn writes_in_progress_are_pending<H: Harness>(harness: &H, case: &str) -> Outcome {
    let storage = harness.fresh();
    if !storage.capabilities().pending_listing {
        return Outcome::NotApplicable("the backend does not list unfinished writes".into());
    }
    // No capability says it: the harness knows its backend (a store without a multipart API
    // holds an upload in the client until it completes).
    if harness
        .not_applicable()
        .contains(&Case::WritesInProgressArePending)
    {
        return Outcome::NotApplicable(
            "the harness's backend cannot see a write before its commit".into(),
        );
    }
    let data = pattern(IN_PROGRESS, 5);
    let mut sink = storage
        .create("live/m.bpk", &CreateOptions::default())
        .unwrap_or_else(|e| fail!(case, "create: {e}"));
    for piece in data.chunks(1 << 20) {
        sink.write(piece)
            .unwrap_or_else(|e| fail!(case, "write: {e}"));
    }
    let pending = storage
        .pending("live")
        .unwrap_or_else(|e| fail!(case, "pending: {e}"));
    match pending.iter().find(|p| p.key == "live/m.bpk") {
        Some(p) if !p.abandoned => {}
        Some(p) => fail!(case, "a write in progress is reported abandoned: {p:?}"),
        None => fail!(
            case,
            "a write in progress ({IN_PROGRESS} bytes written) is not listed by pending: {pending:?}"
        ),
    }
    drop(sink);
    Outcome::Checked
}

/// Cleaning unfinished writes, under the write's own prefix and everywhere, never removes a
/// write in progress: the sink goes on writing and commits exactly its bytes.
pub fn cleaning_spares_writes_in_progress<H: Harness>(harness: &H, case: &str) -> Outcome {
    let storage = harness.fresh();
    if !storage.capabilities().pending_listing {
        return Outcome::NotApplicable("the backend does not clean unfinished writes".into());
    }
    let data = pattern(IN_PROGRESS + (3 << 20), 6);
    let mut sink = storage
        .create("live/m.bpk", &CreateOptions::default())
        .unwrap_or_else(|e| fail!(case, "create: {e}"));
    let (first, rest) = data.split_at(IN_PROGRESS);
    for piece in first.chunks(1 << 20) {
        sink.write(piece)
            .unwrap_or_else(|e| fail!(case, "write: {e}"));
    }
    for prefix in ["live", ""] {
        match storage.clean_pending(prefix) {
            Ok(removed) if removed.iter().all(|p| p.key != "live/m.bpk") => {}
            Ok(removed) => fail!(
                case,
                "clean_pending({prefix:?}) removed a write in progress: {removed:?}"
            ),
            Err(e) => fail!(case, "clean_pending({prefix:?}): {e}"),
        }
    }
    for piece in rest.chunks(1 << 20) {
        sink.write(piece)
            .unwrap_or_else(|e| fail!(case, "write after cleaning: {e}"));
    }
    sink.commit()
        .unwrap_or_else(|e| fail!(case, "commit after cleaning: {e}"));
    match stored(&storage, "live/m.bpk") {
        Ok(bytes) if bytes == data => Outcome::Checked,
        Ok(bytes) => fail!(
            case,
            "after cleaning, the write committed {} bytes, not the {} written",
            bytes.len(),
            data.len()
        ),
        Err(e) => fail!(case, "reading the write committed after cleaning: {e}"),
    }
}
