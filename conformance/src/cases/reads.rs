//! Reading: sources that keep the version they opened while writers overwrite, batched reads
//! that agree with single ones, and hostile containers that fail cleanly.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use weightbay::{CreateOptions, Durability, ErrorKind, Reader, Storage};

use crate::Harness;
use crate::holdings::{KEY, fetched_whole, several_parts, written_and_opened};
use crate::outcome::{Outcome, fail};
use crate::property::run_property;
use crate::strategies::sample;

/// The most reads a reader racing the writer makes, so a writer that never finishes cannot keep
/// the readers going for ever.
const MAX_RACING_READS: u64 = 100_000;

/// Clears the flag it holds when dropped, on unwinding too.
struct StopOnDrop<'a>(&'a AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(false, Ordering::SeqCst);
    }
}

/// A source opened before an overwrite keeps reading the old container, or fails with
/// [`ErrorKind::Changed`], never the new bytes: checked on a read past what the backend may
/// have fetched at open, after the overwrite has committed. Readers racing a writer open the key
/// every time (it exists throughout) and see one whole version each time, or `Changed`.
pub fn readers_keep_their_version<H: Harness>(harness: &H, case: &str) -> Outcome {
    let storage = harness.fresh();
    // Over 64 KiB before the last tensor: an object store that serves the first bytes from the
    // request that opened the object must fetch the tail after the overwrite.
    let version = |v: usize, fill: u8| sample(&[100_000 + v * 5000, 3000, 60_000], fill);
    let mut versions: Vec<Vec<u8>> = (0..4).map(|v| version(v, v as u8).bytes()).collect();
    versions.push(version(0, 9).bytes());
    let old = &versions[0];
    version(0, 0)
        .writer()
        .write_to(&storage, KEY)
        .unwrap_or_else(|e| fail!(case, "write: {e}"));
    let source = storage
        .open(KEY)
        .unwrap_or_else(|e| fail!(case, "open: {e}"));
    // The same length with other bytes, so a store that ignores the pinned version returns a
    // full range of the wrong bytes.
    version(0, 9)
        .writer()
        .write_to(&storage, KEY)
        .unwrap_or_else(|e| fail!(case, "overwrite: {e}"));
    if source.len() != old.len() as u64 {
        fail!(
            case,
            "a source opened before an overwrite changed its length to {}",
            source.len()
        );
    }
    let tail = old.len() - 60_000;
    let mut buf = vec![0; 60_000];
    match source.read_at(tail as u64, &mut buf) {
        Ok(()) if buf == old[tail..] => {}
        Ok(()) => fail!(
            case,
            "a source opened before an overwrite read the tail of another version after the overwrite committed"
        ),
        Err(e) if e.kind() == ErrorKind::Changed => {}
        Err(e) => fail!(
            case,
            "a source opened before an overwrite failed with {:?} instead of Changed: {e}",
            e.kind()
        ),
    }
    // The batched path too: the tail and the head, asked in reverse order.
    let len = old.len() as u64;
    match source.fetch(&[tail as u64..len, 0..16]) {
        Ok(views) => {
            let got: Vec<Option<Vec<u8>>> = views.iter().map(|v| v.to_vec().ok()).collect();
            if got != [Some(old[tail..].to_vec()), Some(old[..16].to_vec())] {
                fail!(
                    case,
                    "a source opened before an overwrite fetched the tail of another version after the overwrite committed"
                );
            }
        }
        Err(e) if e.kind() == ErrorKind::Changed => {}
        Err(e) => fail!(
            case,
            "a batched read of a source opened before an overwrite failed with {:?} instead of Changed: {e}",
            e.kind()
        ),
    }
    let writing = AtomicBool::new(true);
    std::thread::scope(|scope| {
        let writer = scope.spawn(|| {
            // However the writer ends, a failure included, the readers stop: a failing writer
            // must fail the case, not leave it spinning.
            let _stop = StopOnDrop(&writing);
            for round in 0..20 {
                let v = round % 4;
                version(v, v as u8)
                    .writer()
                    .write_to(&storage, KEY)
                    .unwrap_or_else(|e| fail!(case, "writer, round {round}: {e}"));
            }
        });
        // Reader 0 reads with read_at, reader 1 with one batched read of two ranges.
        let readers: Vec<_> = (0..2)
            .map(|reader| {
                let versions = &versions;
                let writing = &writing;
                let storage = &storage;
                scope.spawn(move || {
                let mut reads = 0;
                while reads < 40 || (writing.load(Ordering::SeqCst) && reads < MAX_RACING_READS) {
                    reads += 1;
                    let source = storage.open(KEY).unwrap_or_else(|e| {
                        fail!(
                            case,
                            "opening a key that exists throughout an overwrite failed with {:?}: {e}",
                            e.kind()
                        )
                    });
                    let read = if reader == 0 {
                        let mut bytes = vec![0; usize::try_from(source.len()).unwrap_or(0)];
                        source.read_at(0, &mut bytes).map(|()| bytes)
                    } else {
                        fetched_whole(&*source)
                    };
                    match read {
                        Ok(bytes) if versions.contains(&bytes) => {}
                        Ok(bytes) => fail!(
                            case,
                            "reader {reader} racing the writer saw {} bytes of no single version",
                            bytes.len()
                        ),
                        Err(e) if e.kind() == ErrorKind::Changed => {}
                        Err(e) => fail!(
                            case,
                            "reader {reader} racing the writer failed with {:?} instead of Changed: {e}",
                            e.kind()
                        ),
                    }
                }
                })
            })
            .collect();
        // A failing thread's own message, not "a scoped thread panicked".
        for thread in std::iter::once(writer).chain(readers) {
            if let Err(panic) = thread.join() {
                std::panic::resume_unwind(panic);
            }
        }
    });
    Outcome::Checked
}

/// [`Source::fetch`](weightbay::Source::fetch) gives exactly what `read_at` gives for each range,
/// in the order asked, [`Source::fetch_into`](weightbay::Source::fetch_into) lands the same
/// bytes in the caller's buffers, and
/// [`Source::read_in_pieces`](weightbay::Source::read_in_pieces) hands them over in order,
/// each piece at its offset: for lists that always hold an empty, a repeated, an overlapping and an
/// out-of-order range, for random lists, and for a batch larger than the backend reads in one
/// go ([`Harness::batched_read_len`]: parallel reads, split requests). The reader's batched
/// entry points (`load`, `load_all`, `read_many_into`) agree with `read`; a list with one range
/// past the end fails whole with `OutOfRange`, and so does a streamed range past it, before any
/// piece.
pub fn batched_reads_match_single_reads<H: Harness>(harness: &H, case: &str) -> Outcome {
    let storage = harness.fresh();
    // Tensors of a quarter of the batch length each, so the whole container is a batch above
    // every threshold, and several parts long.
    let quarter = (harness.batched_read_len().max(harness.several_parts_len()) / 4).max(1);
    let spec = sample(&[quarter, 3, quarter, 0, quarter, quarter + 1], 7);
    let source = written_and_opened(&storage, &spec, case);
    let len = source.len();
    let check = |ranges: &[std::ops::Range<u64>]| -> Result<(), String> {
        let fetched = source
            .fetch(ranges)
            .map_err(|e| format!("fetch of {ranges:?}: {e}"))?;
        if fetched.len() != ranges.len() {
            return Err(format!(
                "fetch of {} ranges gave {} results",
                ranges.len(),
                fetched.len()
            ));
        }
        for (range, bytes) in ranges.iter().zip(&fetched) {
            let mut single = vec![0; (range.end - range.start) as usize];
            source
                .read_at(range.start, &mut single)
                .map_err(|e| format!("read_at of {range:?}: {e}"))?;
            let batched = bytes
                .to_vec()
                .map_err(|e| format!("reading the fetched bytes of {range:?}: {e}"))?;
            if batched != single {
                return Err(format!("fetch of {range:?} differs from read_at"));
            }
        }
        // The same ranges landed in the caller's buffers.
        let mut buffers: Vec<Vec<u8>> = ranges
            .iter()
            .map(|range| vec![0xAA; (range.end - range.start) as usize])
            .collect();
        let mut jobs: Vec<(u64, &mut [u8])> = ranges
            .iter()
            .zip(buffers.iter_mut())
            .map(|(range, buf)| (range.start, buf.as_mut_slice()))
            .collect();
        source
            .fetch_into(&mut jobs)
            .map_err(|e| format!("fetch_into of {ranges:?}: {e}"))?;
        for ((range, landed), fetched) in ranges.iter().zip(&buffers).zip(&fetched) {
            if fetched.to_vec().ok().as_ref() != Some(landed) {
                return Err(format!("fetch_into of {range:?} differs from fetch"));
            }
        }
        // Each range streamed in pieces: in order, each where it says, nothing left out.
        for (range, fetched) in ranges.iter().zip(&fetched) {
            let mut streamed = Vec::new();
            source
                .read_in_pieces(range.clone(), &mut |offset, piece| {
                    let at = range.start + streamed.len() as u64;
                    if offset != at {
                        return Err(weightbay::Error::invalid(format!(
                            "a piece at {offset} where the next byte is {at}"
                        )));
                    }
                    streamed.extend_from_slice(piece);
                    Ok(())
                })
                .map_err(|e| format!("read_in_pieces of {range:?}: {e}"))?;
            if fetched.to_vec().ok() != Some(streamed) {
                return Err(format!("read_in_pieces of {range:?} differs from fetch"));
            }
        }
        Ok(())
    };
    let (third, half) = (len / 3, len / 2);
    let awkward = [
        // Empty, repeated, overlapping and out of order, in one list.
        vec![5..5, 0..100, 0..100, 50..third, third - 10..half, len..len],
        // Descending, and the whole container in overlapping pieces (a batch above every
        // threshold).
        vec![half..len, third..half + 1, 0..third + 1, 0..len, 7..7],
    ];
    for (i, ranges) in awkward.iter().enumerate() {
        check(ranges).unwrap_or_else(|e| fail!(case, "fixed list {i}: {e}"));
    }
    let ranges = proptest::collection::vec((0..=len, 0u64..200_000), 0..12).prop_map(move |v| {
        v.into_iter()
            .map(|(start, span)| start..start.saturating_add(span).min(len))
            .collect::<Vec<_>>()
    });
    run_property(case, ranges, |ranges| {
        check(&ranges).map_err(TestCaseError::fail)
    });
    let reader =
        Reader::open(Arc::clone(&source)).unwrap_or_else(|e| fail!(case, "Reader::open: {e}"));
    let names: Vec<&str> = spec.tensors.iter().rev().map(|t| t.name.as_str()).collect();
    let mut asked = names.clone();
    asked.push(names[0]);
    let loaded = reader
        .load(&asked)
        .unwrap_or_else(|e| fail!(case, "Reader::load of {asked:?}: {e}"));
    for (name, bytes) in asked.iter().zip(&loaded) {
        let single = reader
            .read(name)
            .unwrap_or_else(|e| fail!(case, "read {name}: {e}"));
        if bytes.to_vec().ok() != Some(single) {
            fail!(
                case,
                "Reader::load of {name} (asked in reverse, one twice) differs from read"
            );
        }
    }
    let all = reader
        .load_all()
        .unwrap_or_else(|e| fail!(case, "Reader::load_all: {e}"));
    for (info, bytes) in all {
        if bytes.to_vec().ok() != reader.read(info.name()).ok() {
            fail!(
                case,
                "Reader::load_all of {} differs from read",
                info.name()
            );
        }
    }
    let mut buffers: Vec<Vec<u8>> = spec
        .tensors
        .iter()
        .map(|t| vec![0xAA; t.data.len()])
        .collect();
    let mut targets: Vec<(&str, &mut [u8])> = spec
        .tensors
        .iter()
        .zip(buffers.iter_mut())
        .map(|(t, buf)| (t.name.as_str(), buf.as_mut_slice()))
        .collect();
    reader
        .read_many_into(&mut targets)
        .unwrap_or_else(|e| fail!(case, "Reader::read_many_into: {e}"));
    for (t, buf) in spec.tensors.iter().zip(&buffers) {
        if *buf != t.data {
            fail!(
                case,
                "Reader::read_many_into of {} differs from what was written",
                t.name
            );
        }
    }
    let past_end = [0..10, len - 1..len + 1, 5..6];
    match source.fetch(&past_end) {
        Err(e) if e.kind() == ErrorKind::OutOfRange => {}
        other => fail!(
            case,
            "a range past the end: expected OutOfRange, got {:?}",
            other.map(|v| v.len()).map_err(|e| e.kind())
        ),
    }
    let mut buffers = [vec![0xAA; 10], vec![0xAA; 2], vec![0xAA; 1]];
    let mut jobs: Vec<(u64, &mut [u8])> = past_end
        .iter()
        .zip(buffers.iter_mut())
        .map(|(range, buf)| (range.start, buf.as_mut_slice()))
        .collect();
    match source.fetch_into(&mut jobs) {
        Err(e) if e.kind() == ErrorKind::OutOfRange => {}
        other => fail!(
            case,
            "fetch_into with a range past the end: expected OutOfRange, got {:?}",
            other.map_err(|e| e.kind())
        ),
    }
    if buffers.iter().flatten().any(|&b| b != 0xAA) {
        fail!(
            case,
            "fetch_into with a range past the end wrote into the buffers before failing"
        );
    }
    let mut pieces = 0;
    match source.read_in_pieces(len - 1..len + 1, &mut |_, _| {
        pieces += 1;
        Ok(())
    }) {
        Err(e) if e.kind() == ErrorKind::OutOfRange && pieces == 0 => {}
        other => fail!(
            case,
            "read_in_pieces of a range past the end: expected OutOfRange and no piece, got \
             {:?} after {pieces} pieces",
            other.map_err(|e| e.kind())
        ),
    }
    Outcome::Checked
}

/// Truncated, bit-flipped and hostile containers stored in the backend give typed errors on
/// open, read and verify, never a panic; a flipped tensor byte fails verify naming the tensor.
pub fn corrupt_containers_fail_cleanly<H: Harness>(harness: &H, case: &str) -> Outcome {
    let storage = harness.fresh();
    let good = sample(&[4000, 3000, 17], 9).bytes();
    // Where each tensor's bytes lie in the container, to know which one a flip damaged.
    let layout: Vec<(String, std::ops::Range<u64>)> = {
        let reader = Reader::from_bytes(good.clone())
            .unwrap_or_else(|e| fail!(case, "the good container does not open: {e}"));
        reader
            .tensors()
            .iter()
            .map(|t| (t.name().to_owned(), t.range()))
            .collect()
    };
    // (what, bytes, the tensor whose data the damage lies in)
    let mut inputs: Vec<(String, Vec<u8>, Option<&str>)> = Vec::new();
    for cut in [0, 5, 10, 11, 100, 255, 256, good.len() / 2, good.len() - 1] {
        inputs.push((format!("truncated to {cut}"), good[..cut].to_vec(), None));
    }
    for at in (0..good.len()).step_by(97) {
        let mut flipped = good.clone();
        flipped[at] ^= 0x40;
        let damaged = layout
            .iter()
            .find(|(_, range)| range.contains(&(at as u64)))
            .map(|(name, _)| name.as_str());
        inputs.push((format!("byte {at} flipped"), flipped, damaged));
    }
    let mut huge_claim = good[..10].to_vec();
    huge_claim[6..10].copy_from_slice(&u32::MAX.to_le_bytes());
    inputs.push(("metadata length u32::MAX".into(), huge_claim, None));
    inputs.push(("all zeros".into(), vec![0; 4096], None));
    inputs.push(("all ones".into(), vec![0xff; 4096], None));
    for (what, bytes, damaged) in inputs {
        let mut sink = storage
            .create(KEY, &CreateOptions::default())
            .unwrap_or_else(|e| fail!(case, "create: {e}"));
        sink.write(&bytes)
            .unwrap_or_else(|e| fail!(case, "write: {e}"));
        sink.commit().unwrap_or_else(|e| fail!(case, "commit: {e}"));
        let outcome = catch_unwind(AssertUnwindSafe(|| {
            let reader = Reader::open(storage.open(KEY)?)?;
            for info in reader.tensors() {
                reader.read(info.name())?;
            }
            reader.verify().map(|_| ())
        }));
        match outcome {
            Err(_) => fail!(case, "{what}: the reader panicked"),
            Ok(Ok(())) => {
                // A flip inside padding or the trailer's own bytes can still verify only if
                // it changed nothing checked; everything is checked, so this is a miss.
                fail!(
                    case,
                    "{what}: a corrupted container opened, read and verified"
                );
            }
            Ok(Err(e)) if !matches!(e.kind(), ErrorKind::Corrupt | ErrorKind::LimitExceeded) => {
                fail!(
                    case,
                    "{what}: expected Corrupt or LimitExceeded, got {:?}: {e}",
                    e.kind()
                )
            }
            Ok(Err(e)) => {
                if let Some(tensor) = damaged
                    && e.tensor() != Some(tensor)
                {
                    fail!(
                        case,
                        "{what}: the error does not name `{tensor}`, whose bytes were damaged: {e}"
                    );
                }
            }
        }
    }
    Outcome::Checked
}

/// One source read from several threads at once, by single and batched reads of ranges all
/// over it: every read gives exactly the bytes it names, as a source with one shared file
/// cursor would not.
pub fn sources_are_shared_between_threads<H: Harness>(harness: &H, case: &str) -> Outcome {
    const THREADS: u64 = 4;
    const READS: u64 = 50;
    let storage = harness.fresh();
    let spec = several_parts(harness, 5);
    let bytes = spec.bytes();
    let source = written_and_opened(&storage, &spec, case);
    let len = bytes.len() as u64;
    std::thread::scope(|scope| {
        let threads: Vec<_> = (0..THREADS)
            .map(|thread| {
                let (source, bytes) = (&source, &bytes);
                scope.spawn(move || {
                    for read in 0..READS {
                        // Ranges spread over the container, different in every thread.
                        let start = (thread * 7919 + read * 104_729) % len;
                        let end = (start + 1 + (read * 31 + thread) % 70_000).min(len);
                        let expected = &bytes[start as usize..end as usize];
                        let mut single = vec![0; expected.len()];
                        source.read_at(start, &mut single).unwrap_or_else(|e| {
                            fail!(case, "thread {thread}, read {read}: read_at: {e}")
                        });
                        if single != expected {
                            fail!(
                                case,
                                "thread {thread}, read {read}: read_at of {start}..{end} gave other bytes while other threads read the same source"
                            );
                        }
                        let other = (start / 2)..(start / 2 + 100).min(len);
                        let fetched = source
                            .fetch(&[start..end, other.clone()])
                            .and_then(|got| got.iter().map(|b| b.to_vec()).collect::<Result<Vec<_>, _>>())
                            .unwrap_or_else(|e| {
                                fail!(case, "thread {thread}, read {read}: fetch: {e}")
                            });
                        let wanted = [expected, &bytes[other.start as usize..other.end as usize]];
                        if fetched.iter().map(Vec::as_slice).ne(wanted) {
                            fail!(
                                case,
                                "thread {thread}, read {read}: fetch of {start}..{end} and {other:?} gave other bytes while other threads read the same source"
                            );
                        }
                    }
                })
            })
            .collect();
        for thread in threads {
            if let Err(panic) = thread.join() {
                std::panic::resume_unwind(panic);
            }
        }
    });
    Outcome::Checked
}

/// Listing more keys than one page of the backend's listing holds gives every one of them, and
/// a prefix lists its own directory only, not keys that merely start with the same string
/// (`run/1` is not `run/10/…` nor `run/1x`).
pub fn listing_spans_pages<H: Harness>(harness: &H, case: &str) -> Outcome {
    let storage = harness.fresh();
    if !storage.capabilities().listing {
        return Outcome::NotApplicable("the backend does not list its containers".into());
    }
    let count = harness.listing_page_size() + 5;
    let options = CreateOptions::default().with_durability(Durability::Flushed);
    let put = |key: &str| {
        let mut sink = storage
            .create(key, &options)
            .unwrap_or_else(|e| fail!(case, "create `{key}`: {e}"));
        sink.write(key.as_bytes())
            .unwrap_or_else(|e| fail!(case, "write `{key}`: {e}"));
        sink.commit()
            .unwrap_or_else(|e| fail!(case, "commit `{key}`: {e}"));
    };
    let keys_under = |prefix: &str| -> Vec<String> {
        storage
            .list(prefix)
            .unwrap_or_else(|e| fail!(case, "list `{prefix}`: {e}"))
            .into_iter()
            .map(|l| l.key)
            .collect()
    };
    let keys: Vec<String> = (0..count).map(|i| format!("many/{i:05}.bpk")).collect();
    for key in &keys {
        put(key);
    }
    let listed = keys_under("many");
    if listed != keys {
        fail!(
            case,
            "{count} keys under `many`, more than a page of {}: the listing gives {} (last: {:?})",
            harness.listing_page_size(),
            listed.len(),
            listed.last()
        );
    }
    for key in [
        "run/1/a.bpk",
        "run/10/b.bpk",
        "run/1x.bpk",
        "run/1/sub/c.bpk",
    ] {
        put(key);
    }
    let under = keys_under("run/1");
    if under != ["run/1/a.bpk", "run/1/sub/c.bpk"] {
        fail!(
            case,
            "list(\"run/1\") gives {under:?}, not the two keys in directory run/1"
        );
    }
    Outcome::Checked
}
