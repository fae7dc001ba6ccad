//! Reading a sink's bytes back before it commits ([`Sink::read_back`](weightbay::Sink::read_back)),
//! what a tiered checkpoint's promotion streams from while the save is still writing.

use std::sync::Arc;

use weightbay::{CreateOptions, ReadBack, Storage};

use crate::Harness;
use crate::holdings::{KEY, pattern};
use crate::outcome::{Outcome, fail};

/// Reads `expected.len()` bytes at `offset` through `reader` and compares them.
fn assert_reads(case: &str, context: &str, reader: &dyn ReadBack, offset: u64, expected: &[u8]) {
    let mut got = vec![0u8; expected.len()];
    reader.read_at(offset, &mut got).unwrap_or_else(|e| {
        fail!(
            case,
            "{context}: reading back {} bytes at {offset}: {e}",
            got.len()
        )
    });
    if got != expected {
        let at = got
            .iter()
            .zip(expected)
            .position(|(a, b)| a != b)
            .unwrap_or(0);
        fail!(
            case,
            "{context}: {} bytes read back at {offset} differ from what was written, first at \
             byte {}",
            got.len(),
            offset + at as u64
        );
    }
}

/// A sink that offers a read-back reads back every write that returned, at its offset, while
/// it goes on writing, from another thread too, and keeps reading those bytes after the sink
/// commits, after the key is overwritten, and after a second sink is dropped uncommitted.
/// Reading past what was written never panics. A backend whose sinks offer none is not
/// applicable.
pub fn read_back_follows_writes<H: Harness>(harness: &H, case: &str) -> Outcome {
    let storage = harness.fresh();
    let mut sink = storage
        .create(KEY, &CreateOptions::default())
        .unwrap_or_else(|e| fail!(case, "create: {e}"));
    let Some(reader) = sink.read_back() else {
        return Outcome::NotApplicable(
            "the backend's sinks cannot read their bytes back before they commit".into(),
        );
    };
    let (first, second) = (pattern(3000, 1), pattern(70_000, 2));
    sink.write(&first)
        .unwrap_or_else(|e| fail!(case, "write: {e}"));
    assert_reads(case, "after the first write", reader.as_ref(), 0, &first);
    assert_reads(
        case,
        "after the first write",
        reader.as_ref(),
        1000,
        &first[1000..2000],
    );
    let mut whole = first;
    std::thread::scope(|scope| {
        // Another thread reads each write back as soon as it returns.
        let (written, read) = std::sync::mpsc::channel::<(u64, Vec<u8>)>();
        let other = Arc::clone(&reader);
        let checker = scope.spawn(move || {
            for (offset, bytes) in read {
                assert_reads(case, "on another thread", other.as_ref(), offset, &bytes);
            }
        });
        for chunk in second.chunks(7000) {
            sink.write(chunk)
                .unwrap_or_else(|e| fail!(case, "write: {e}"));
            let _ = written.send((whole.len() as u64, chunk.to_vec()));
            whole.extend_from_slice(chunk);
        }
        drop(written);
        if checker.join().is_err() {
            fail!(
                case,
                "reading back on another thread failed (its panic is above)"
            );
        }
    });
    sink.pad(100).unwrap_or_else(|e| fail!(case, "pad: {e}"));
    whole.extend_from_slice(&[0; 100]);
    assert_reads(case, "after a pad", reader.as_ref(), 0, &whole);
    // Past the end: an error or any bytes, but no panic.
    let _ = reader.read_at(whole.len() as u64, &mut [0u8; 16]);
    sink.commit().unwrap_or_else(|e| fail!(case, "commit: {e}"));
    assert_reads(case, "after the commit", reader.as_ref(), 0, &whole);

    let mut replacing = storage
        .create(KEY, &CreateOptions::default())
        .unwrap_or_else(|e| fail!(case, "create the replacement: {e}"));
    let dropped = replacing
        .read_back()
        .unwrap_or_else(|| fail!(case, "a second sink offered no read-back"));
    let replacement = pattern(5000, 3);
    replacing
        .write(&replacement)
        .unwrap_or_else(|e| fail!(case, "write the replacement: {e}"));
    drop(replacing);
    assert_reads(
        case,
        "after its sink was dropped",
        dropped.as_ref(),
        0,
        &replacement,
    );
    let mut overwriting = storage
        .create(KEY, &CreateOptions::default())
        .unwrap_or_else(|e| fail!(case, "create the overwrite: {e}"));
    overwriting
        .write(&replacement)
        .unwrap_or_else(|e| fail!(case, "write the overwrite: {e}"));
    overwriting
        .commit()
        .unwrap_or_else(|e| fail!(case, "commit the overwrite: {e}"));
    assert_reads(
        case,
        "after the key was overwritten",
        reader.as_ref(),
        0,
        &whole,
    );
    Outcome::Checked
}
