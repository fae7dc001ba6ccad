//! Writing a sink's container by position ([`Sink::positioned`](weightbay::Sink::positioned)),
//! how a copy from an object store lands each region on the thread that read it.

use weightbay::{CreateOptions, ErrorKind, PositionedWrite, Storage, StorageExt};

use crate::Harness;
use crate::holdings::{KEY, assert_nothing_pending, pattern, stored};
use crate::outcome::{Outcome, fail};

/// The pieces a case writes: odd lengths, so none lines up with a page or a block.
const PIECE: usize = 7001;

/// Writes every piece of `data` from `from` on through `writes`, from four threads, each
/// taking every fourth piece from the end backwards: out of order and at once.
fn write_scattered(case: &str, writes: &dyn PositionedWrite, data: &[u8], from: usize) {
    let pieces: Vec<(usize, &[u8])> = data[from..]
        .chunks(PIECE)
        .enumerate()
        .map(|(i, piece)| (from + i * PIECE, piece))
        .collect();
    std::thread::scope(|scope| {
        for thread in 0..4 {
            let pieces = &pieces;
            scope.spawn(move || {
                for (offset, piece) in pieces.iter().rev().skip(thread).step_by(4) {
                    writes
                        .write_at(*offset as u64, piece)
                        .unwrap_or_else(|e| fail!(case, "write_at {offset}: {e}"));
                }
            });
        }
    });
}

/// Asserts `key` holds `expected`.
fn assert_holds(case: &str, context: &str, storage: &dyn Storage, expected: &[u8]) {
    let held = stored(storage, KEY).unwrap_or_else(|e| fail!(case, "{context}: reading: {e}"));
    if held != expected {
        let at = held.iter().zip(expected).position(|(a, b)| a != b);
        fail!(
            case,
            "{context}: the key holds {} bytes, not the {} expected (first difference at {at:?})",
            held.len(),
            expected.len()
        );
    }
}

/// A sink created with an expected length that offers writes by position takes them from
/// several threads in any order, and its commit publishes exactly those bytes; a write past
/// the expected length fails; appends before them keep their place; a container left short
/// of its length fails to commit, and a dropped sink leaves the key as it was. A sink with no
/// expected length offers none. A backend whose sinks offer none is not applicable.
pub fn positioned_writes_land_whole<H: Harness>(harness: &H, case: &str) -> Outcome {
    let storage = harness.fresh();
    let old = pattern(5000, 1);
    storage
        .write_new(KEY, &old, weightbay::Durability::Flushed)
        .unwrap_or_else(|e| fail!(case, "write the old container: {e}"));
    let new = pattern(300_000, 2);
    let len = new.len() as u64;
    let create = |expected: Option<u64>| {
        let mut options = CreateOptions::default();
        options.expected_len = expected;
        storage
            .create(KEY, &options)
            .unwrap_or_else(|e| fail!(case, "create: {e}"))
    };
    let mut sink = create(Some(len));
    let Some(writes) = sink.positioned() else {
        return Outcome::NotApplicable("the backend's sinks take no writes by position".into());
    };
    write_scattered(case, writes.as_ref(), &new, 0);
    match writes.write_at(len - 10, &[7; 20]) {
        Err(e) if e.kind() == ErrorKind::OutOfRange => {}
        other => fail!(
            case,
            "a write past the expected length gave {other:?}, not OutOfRange"
        ),
    }
    drop(writes);
    assert_holds(case, "before the commit", &storage, &old);
    sink.commit().unwrap_or_else(|e| fail!(case, "commit: {e}"));
    assert_holds(case, "after the commit", &storage, &new);

    // A head appended, the rest by position: how a copy that began streaming goes on.
    let newer = pattern(200_000, 3);
    let mut sink = create(Some(newer.len() as u64));
    sink.write(&newer[..1234])
        .unwrap_or_else(|e| fail!(case, "append the head: {e}"));
    let writes = sink
        .positioned()
        .unwrap_or_else(|| fail!(case, "a second sink offered no writes by position"));
    write_scattered(case, writes.as_ref(), &newer, 1234);
    drop(writes);
    sink.commit()
        .unwrap_or_else(|e| fail!(case, "commit after a head: {e}"));
    assert_holds(
        case,
        "after a head and writes by position",
        &storage,
        &newer,
    );

    // Pieces of a megabyte and more, as a copy's regions hand them over: each call lands
    // whole, however the backend cuts it into requests.
    let large = pattern((3 << 20) + 5, 4);
    let mut sink = create(Some(large.len() as u64));
    let writes = sink.positioned().unwrap_or_else(|| {
        fail!(
            case,
            "a sink for large pieces offered no writes by position"
        )
    });
    let (low, high) = large.split_at((3 << 19) + 3);
    std::thread::scope(|scope| {
        for (offset, piece) in [(0, low), (low.len(), high)] {
            let writes = &writes;
            scope.spawn(move || {
                writes
                    .write_at(offset as u64, piece)
                    .unwrap_or_else(|e| fail!(case, "write_at {offset} of a large piece: {e}"));
            });
        }
    });
    drop(writes);
    sink.commit()
        .unwrap_or_else(|e| fail!(case, "commit of large pieces: {e}"));
    assert_holds(case, "after pieces of 1.5 MiB", &storage, &large);

    // Left short of its length: the commit fails and the key is as it was.
    let mut sink = create(Some(len));
    let writes = sink
        .positioned()
        .unwrap_or_else(|| fail!(case, "a third sink offered no writes by position"));
    write_scattered(case, writes.as_ref(), &new[..new.len() - 100], 0);
    drop(writes);
    if sink.commit().is_ok() {
        fail!(
            case,
            "a container written 100 bytes short of its expected length was committed"
        );
    }
    assert_holds(case, "after a short commit failed", &storage, &large);

    // Dropped after its writes: the key as it was, nothing left behind.
    let mut sink = create(Some(len));
    let writes = sink
        .positioned()
        .unwrap_or_else(|| fail!(case, "a fourth sink offered no writes by position"));
    write_scattered(case, writes.as_ref(), &new, 0);
    drop(writes);
    drop(sink);
    assert_holds(case, "after a dropped sink", &storage, &large);
    assert_nothing_pending(case, "after a dropped sink", &storage);

    if create(None).positioned().is_some() {
        fail!(
            case,
            "a sink with no expected length offered writes by position"
        );
    }
    Outcome::Checked
}
