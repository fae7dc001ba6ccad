//! Object-store behaviour beyond the suite: multipart on real servers, request counts,
//! version pinning, coalesced fetches, and use from sync and async code.

mod support;

use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use object_store::ObjectStore;
use support::intercept::Intercepted;
use support::{ByUrl, SMALL_PARTS};
use weightbay::{Bytes, DType, ErrorKind, Reader, Storage, Tensor, WriteMode, Writer};
use weightbay_conformance::{FaultPlan, Harness};
use weightbay_object_store::{ObjectSource, ObjectStorage, ObjectStoreOptions};

/// An in-memory store that counts the GET requests reaching it.
fn counting() -> (Arc<Intercepted>, ObjectStorage) {
    counting_with(SMALL_PARTS)
}

/// [`counting`] with `options`.
fn counting_with(options: ObjectStoreOptions) -> (Arc<Intercepted>, ObjectStorage) {
    let store = Arc::new(Intercepted::new(
        Arc::new(object_store::memory::InMemory::new()),
        FaultPlan::counting(),
        None,
    ));
    let storage = ObjectStorage::new(Arc::clone(&store) as Arc<dyn ObjectStore>)
        .unwrap()
        .with_options(options);
    (store, storage)
}

fn tensors(count: usize, len: usize) -> Vec<Tensor> {
    (0..count)
        .map(|i| Tensor::new(format!("t{i}"), DType::U8, [len as u64], vec![i as u8; len]))
        .collect()
}

#[test]
fn opening_takes_one_request_for_header_and_metadata() {
    let (store, storage) = counting();
    Writer::new(tensors(20, 1000))
        .write_to(&storage, "m.bpk")
        .unwrap();
    store.gets.store(0, Ordering::SeqCst);
    let reader = Reader::open(storage.open("m.bpk").unwrap()).unwrap();
    assert_eq!(
        store.gets.load(Ordering::SeqCst),
        1,
        "size, version, header and metadata in one GET"
    );
    assert_eq!(reader.read("t3").unwrap(), vec![3; 1000]);

    // A container larger than the first read: one more for the trailer's footer.
    Writer::new(tensors(3, 100_000))
        .write_to(&storage, "big.bpk")
        .unwrap();
    store.gets.store(0, Ordering::SeqCst);
    Reader::open(storage.open("big.bpk").unwrap()).unwrap();
    assert_eq!(store.gets.load(Ordering::SeqCst), 2);
}

/// Writes ten adjacent 5000-byte tensors, fetches them all at once and checks the bytes;
/// returns the source, its reader and ranges, and how many GETs the fetch made.
fn fetch_ten_tensors(
    store: &Intercepted,
    storage: &ObjectStorage,
) -> (ObjectSource, Reader, Vec<Range<u64>>, usize) {
    Writer::new(tensors(10, 5000))
        .write_to(storage, "m.bpk")
        .unwrap();
    let source = storage.open_object("m.bpk").unwrap();
    let reader = Reader::open(Arc::new(source.clone())).unwrap();
    let ranges: Vec<Range<u64>> = reader.tensors().iter().map(|t| t.range()).collect();
    store.gets.store(0, Ordering::SeqCst);
    let fetched = source.fetch(&ranges).unwrap();
    let gets = store.gets.load(Ordering::SeqCst);
    for (info, bytes) in reader.tensors().iter().zip(&fetched) {
        assert_eq!(bytes.to_vec().unwrap(), reader.read(info.name()).unwrap());
    }
    (source, reader, ranges, gets)
}

#[test]
fn fetch_coalesces_adjacent_ranges_and_pins_the_version() {
    let (store, storage) = counting();
    let (source, reader, ranges, gets) = fetch_ten_tensors(&store, &storage);
    assert_eq!(gets, 1, "ten adjacent tensors in one request");

    // Replaced after open: pinned reads refuse the new object rather than mix it in.
    Writer::new(tensors(10, 5001))
        .write_to(&storage, "m.bpk")
        .unwrap();
    let err = source.fetch(&ranges).unwrap_err();
    assert!(err.to_string().contains("changed or vanished"), "{err}");
    // Bytes already fetched at open (this whole small container) stay the old version's.
    assert!(reader.read("t9").unwrap() == vec![9; 5000]);
}

#[test]
fn fetch_splits_long_runs_at_the_request_length() {
    let (store, storage) = counting();
    let storage = storage.with_options(SMALL_PARTS.with_fetch_request_len(Some(12_000)));
    let (.., gets) = fetch_ten_tensors(&store, &storage);
    assert_eq!(
        gets, 4,
        "three 5000-byte tensors per request of about 12,000 bytes (at most 18,000), then one"
    );
}

#[test]
fn fetch_cuts_a_tensor_longer_than_a_request_into_pieces() {
    let (store, storage) = counting();
    let storage = storage.with_options(SMALL_PARTS.with_fetch_request_len(Some(2000)));
    let (.., gets) = fetch_ten_tensors(&store, &storage);
    assert_eq!(
        gets, 30,
        "each 5000-byte tensor in three requests of at most 2000 bytes"
    );
    // Pieces join back in order, also when the ranges are asked for out of order and one
    // starts inside a piece.
    let source = storage.open_object("m.bpk").unwrap();
    let len = weightbay::Source::len(&source);
    let ranges = [len - 4999..len - 1, 17..4017, 0..0, 3..9000];
    let fetched = source.fetch(&ranges).unwrap();
    for (range, bytes) in ranges.iter().zip(&fetched) {
        let mut expected = vec![0; (range.end - range.start) as usize];
        weightbay::Source::read_at(&source, range.start, &mut expected).unwrap();
        assert_eq!(bytes.to_vec().unwrap(), expected, "{range:?}");
    }
}

#[test]
fn a_range_a_little_past_the_request_length_is_one_request() {
    let (store, storage) = counting();
    let storage = storage.with_options(SMALL_PARTS.with_fetch_request_len(Some(4800)));
    let (.., gets) = fetch_ten_tensors(&store, &storage);
    assert_eq!(
        gets, 10,
        "a 5000-byte tensor against 4800-byte requests is one request, not a second for 200 bytes"
    );
}

#[test]
fn fetch_into_lands_what_fetch_returns_in_the_callers_buffers() {
    let (store, storage) = counting();
    let (source, reader, ranges, fetch_gets) = fetch_ten_tensors(&store, &storage);
    let land = |jobs_of: &[Range<u64>]| -> (Vec<Vec<u8>>, usize) {
        let mut buffers: Vec<Vec<u8>> = jobs_of
            .iter()
            .map(|r| vec![0xAA; (r.end - r.start) as usize])
            .collect();
        let mut jobs: Vec<(u64, &mut [u8])> = jobs_of
            .iter()
            .zip(buffers.iter_mut())
            .map(|(r, buf)| (r.start, buf.as_mut_slice()))
            .collect();
        store.gets.store(0, Ordering::SeqCst);
        source.fetch_into(&mut jobs).unwrap();
        (buffers, store.gets.load(Ordering::SeqCst))
    };
    // Every tensor, asked in reverse: coalesced as fetch coalesces them.
    let reversed: Vec<_> = ranges.iter().rev().cloned().collect();
    let (landed, gets) = land(&reversed);
    assert_eq!(gets, fetch_gets, "as many requests as fetch");
    for (range, bytes) in reversed.iter().zip(&landed) {
        let info = reader
            .tensors()
            .iter()
            .find(|t| t.range() == *range)
            .unwrap();
        assert_eq!(*bytes, reader.read(info.name()).unwrap());
    }
    // Pieces of a request split across jobs, overlapping and out of order, one empty, and
    // ranges longer than a request.
    let storage = storage.with_options(SMALL_PARTS.with_fetch_request_len(Some(2000)));
    let source = storage.open_object("m.bpk").unwrap();
    let len = weightbay::Source::len(&source);
    let awkward = [len - 4999..len - 1, 17..4017, 0..0, 3..9000, 4000..4100];
    let mut buffers: Vec<Vec<u8>> = awkward
        .iter()
        .map(|r| vec![0xAA; (r.end - r.start) as usize])
        .collect();
    let mut jobs: Vec<(u64, &mut [u8])> = awkward
        .iter()
        .zip(buffers.iter_mut())
        .map(|(r, buf)| (r.start, buf.as_mut_slice()))
        .collect();
    source.fetch_into(&mut jobs).unwrap();
    for (range, landed) in awkward.iter().zip(&buffers) {
        let mut expected = vec![0; (range.end - range.start) as usize];
        weightbay::Source::read_at(&source, range.start, &mut expected).unwrap();
        assert_eq!(*landed, expected, "{range:?}");
    }
    // A range past the end: refused before any request, nothing written.
    store.gets.store(0, Ordering::SeqCst);
    let mut buffer = vec![0xAA; 10];
    let err = source
        .fetch_into(&mut [(len - 5, buffer.as_mut_slice())])
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::OutOfRange, "{err}");
    assert_eq!(store.gets.load(Ordering::SeqCst), 0);
    assert!(buffer.iter().all(|&b| b == 0xAA));
}

/// `latest()` among many checkpoints: one listing and one GET (the newest commit record),
/// however many there are.
#[test]
fn finding_the_latest_checkpoint_reads_one_commit_record() {
    let (store, storage) = counting();
    let checkpoints = weightbay_checkpoints::Checkpoints::new(storage, "run");
    for step in 1..=40 {
        checkpoints.save(step, Writer::new(tensors(1, 10))).unwrap();
    }
    store.gets.store(0, Ordering::SeqCst);
    assert_eq!(checkpoints.latest().unwrap().unwrap().step(), 40);
    assert_eq!(store.gets.load(Ordering::SeqCst), 1);
}

#[test]
fn empty_ranges_fetch_as_empty_bytes() {
    let (_, storage) = counting();
    Writer::new(vec![
        Tensor::new("empty", DType::U8, [0], vec![]),
        Tensor::new("one", DType::U8, [1], vec![7]),
    ])
    .write_to(&storage, "m.bpk")
    .unwrap();
    let source = storage.open_object("m.bpk").unwrap();
    let reader = Reader::open(Arc::new(source.clone())).unwrap();
    let ranges: Vec<Range<u64>> = reader.tensors().iter().map(|t| t.range()).collect();
    let fetched = source.fetch(&ranges).unwrap();
    assert_eq!(fetched.iter().map(|b| b.len()).collect::<Vec<_>>(), [0, 1]);
}

/// A bridge borrowed from a current-thread runtime, called on that runtime's own thread,
/// answers Unsupported instead of waiting forever for work that thread would have to run.
#[test]
fn a_borrowed_current_thread_runtime_refuses_instead_of_hanging() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let storage = ObjectStorage::with_bridge(
        Arc::new(object_store::memory::InMemory::new()),
        weightbay_object_store::Bridge::borrowed(runtime.handle().clone()),
    );
    let err = runtime.block_on(async { storage.open("m.bpk").unwrap_err() });
    assert_eq!(err.kind(), ErrorKind::Unsupported, "{err}");
}

#[test]
fn part_size_grows_to_stay_under_ten_thousand_parts() {
    let options = ObjectStoreOptions::default();
    assert_eq!(options.part_size_for(Some(1 << 30)), 8 << 20);
    let huge = 200u64 << 30; // 200 GiB
    let part = options.part_size_for(Some(huge)) as u64;
    assert!(huge.div_ceil(part) <= 10_000, "{part}");
    assert_eq!(part % (1 << 20), 0);
    assert_eq!(options.buffer_bound(Some(1 << 30)), 9 * (8 << 20));
}

/// Deferred tensors of 2 MiB: with 64 KiB parts the container spans many parts.
fn multipart_writer(fill: u8) -> Writer {
    Writer::new(
        (0..4u8)
            .map(|i| {
                Tensor::deferred(format!("t{i}"), DType::U8, [2 << 20], 2 << 20, move || {
                    Ok(Bytes::from(vec![fill.wrapping_add(i); 2 << 20]))
                })
            })
            .collect(),
    )
}

#[test]
fn dropped_or_failed_uploads_leave_no_object() {
    let storage = support::InMemory.fresh();
    let failing = Writer::new(vec![
        Tensor::new("a", DType::U8, [1 << 20], vec![1; 1 << 20]),
        Tensor::deferred("b", DType::U8, [4], 4, || {
            Err(weightbay::Error::new(ErrorKind::Io, "device lost"))
        }),
    ]);
    let err = failing.write_to(&storage, "m.bpk").unwrap_err();
    assert_eq!(err.tensor(), Some("b"));
    assert_eq!(
        storage.open("m.bpk").unwrap_err().kind(),
        ErrorKind::NotFound
    );
    multipart_writer(0)
        .with_mode(WriteMode::CreateNew)
        .write_to(&storage, "m.bpk")
        .unwrap();
    assert!(
        storage.pending("").unwrap().is_empty(),
        "the staging object is gone after publishing"
    );
    let err = multipart_writer(1)
        .with_mode(WriteMode::CreateNew)
        .write_to(&storage, "m.bpk")
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::AlreadyExists);
    let reader = Reader::open(storage.open("m.bpk").unwrap()).unwrap();
    assert_eq!(reader.read("t2").unwrap(), vec![2; 2 << 20]);
}

/// Multipart create-new, overwrite and abort against the real servers, with 5 MiB parts.
fn multipart_on_server(harness: &ByUrl, list_uploads: Option<&dyn Fn() -> String>) {
    if let Some(why) = harness.unavailable() {
        assert!(
            std::env::var("WEIGHTBAY_REQUIRE_SERVERS").as_deref() != Ok("1"),
            "{why} (WEIGHTBAY_REQUIRE_SERVERS=1)"
        );
        eprintln!("skipped: {why}");
        return;
    }
    let storage = harness.fresh();
    let big = |fill: u8| {
        Writer::new(vec![
            Tensor::new("a", DType::U8, [7 << 20], vec![fill; 7 << 20]),
            Tensor::new("b", DType::U8, [6 << 20], vec![fill + 1; 6 << 20]),
        ])
    };
    big(1)
        .with_mode(WriteMode::CreateNew)
        .write_to(&storage, "m.bpk")
        .unwrap();
    let err = big(2)
        .with_mode(WriteMode::CreateNew)
        .write_to(&storage, "m.bpk")
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::AlreadyExists, "{err}");
    big(3).write_to(&storage, "m.bpk").unwrap();
    let reader = Reader::open(storage.open("m.bpk").unwrap()).unwrap();
    assert_eq!(reader.read("b").unwrap(), vec![4; 6 << 20]);
    reader.verify().unwrap();

    // A dropped sink after two parts: no object, no upload left on the server.
    let mut sink = storage
        .create("dropped.bpk", &weightbay::CreateOptions::default())
        .unwrap();
    sink.write(&vec![9; 11 << 20]).unwrap();
    drop(sink);
    assert_eq!(
        storage.open("dropped.bpk").unwrap_err().kind(),
        ErrorKind::NotFound
    );
    assert!(storage.pending("").unwrap().is_empty());
    if let Some(list_uploads) = list_uploads {
        let listing = list_uploads();
        assert!(
            listing.contains("ListMultipartUploadsResult"),
            "the server did not list uploads: {listing}"
        );
        assert!(
            !listing.contains("dropped.bpk"),
            "a multipart upload was left behind: {listing}"
        );
    }
}

#[test]
fn multipart_on_s3() {
    let harness = ByUrl::s3();
    let list = || {
        // S3's ListMultipartUploads, straight to the local server.
        let endpoint = std::env::var("AWS_ENDPOINT").unwrap();
        let bucket = std::env::var("AWS_BUCKET").unwrap();
        let output = std::process::Command::new("curl")
            .args(["-s", &format!("{endpoint}/{bucket}?uploads")])
            .output()
            .unwrap();
        String::from_utf8_lossy(&output.stdout).into_owned()
    };
    multipart_on_server(&harness, Some(&list));
}

#[test]
fn multipart_on_gcs() {
    multipart_on_server(&ByUrl::gcs(), None);
}

/// The sync API works from plain threads, from inside a current-thread runtime (blocking it),
/// and through `spawn_blocking` from a multi-threaded one.
#[test]
fn usable_from_sync_and_async_code() {
    let storage = support::InMemory.fresh();
    multipart_writer(5).write_to(&storage, "plain.bpk").unwrap();

    let current = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    current.block_on(async {
        multipart_writer(6)
            .write_to(&storage, "inside.bpk")
            .unwrap();
        Reader::open(storage.open("inside.bpk").unwrap())
            .unwrap()
            .verify()
            .unwrap();
    });

    let multi = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let borrowed = ObjectStorage::with_bridge(
        storage.store().clone(),
        weightbay_object_store::Bridge::borrowed(multi.handle().clone()),
    )
    .with_options(SMALL_PARTS);
    multi.block_on(async {
        let saver = borrowed.clone();
        tokio::task::spawn_blocking(move || multipart_writer(7).write_to(&saver, "spawned.bpk"))
            .await
            .unwrap()
            .unwrap();
    });
    let reader = Reader::open(borrowed.open("spawned.bpk").unwrap()).unwrap();
    assert_eq!(reader.read("t1").unwrap(), vec![8; 2 << 20]);
}

#[test]
fn urls_and_their_errors() {
    let err = weightbay_object_store::open_url("ftp://host/x", std::iter::empty::<(&str, &str)>())
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidInput, "{err}");
    let err = weightbay_object_store::open_url("not a url", std::iter::empty::<(&str, &str)>())
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidInput);
    let storage =
        weightbay_object_store::open_url("memory:///a/b", std::iter::empty::<(&str, &str)>())
            .unwrap();
    assert_eq!(storage.prefix().as_ref(), "a/b");
    let err = storage
        .create(".weightbay-staging/x", &weightbay::CreateOptions::default())
        .err()
        .unwrap();
    assert_eq!(err.kind(), ErrorKind::InvalidInput);
}

/// Loads split long runs into parallel requests only for stores across a network.
#[test]
fn urls_choose_how_loads_are_split() {
    let split = |url: &str, options: &[(&str, &str)]| {
        weightbay_object_store::open_url(url, options.iter().copied())
            .unwrap()
            .options()
            .fetch_request_len
    };
    let remote = ObjectStoreOptions::default().fetch_request_len;
    assert!(remote.is_some());
    assert_eq!(split("memory:///m", &[]), None);
    assert_eq!(split("file:///tmp", &[]), None);
    let s3 = |endpoint| {
        split(
            "s3://bucket/p",
            &[
                ("aws_endpoint", endpoint),
                ("aws_region", "us-east-1"),
                ("aws_access_key_id", "k"),
                ("aws_secret_access_key", "s"),
            ],
        )
    };
    assert_eq!(s3("http://127.0.0.1:9000"), None);
    assert_eq!(s3("http://localhost:9000"), None);
    assert_eq!(s3("http://[::1]:9000"), None);
    assert_eq!(s3("https://s3.example.com"), remote);
    assert_eq!(s3("http://127.example.com"), remote);
}

/// Walks `error`'s source chain to the `object_store::Error` that caused it.
fn store_cause(error: &weightbay::Error) -> Option<&object_store::Error> {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(e) = cause {
        if let Some(store) = e.downcast_ref::<object_store::Error>() {
            return Some(store);
        }
        cause = e.source();
    }
    None
}

/// A failed request reaches the caller with the store's own error in the source chain: on
/// object_store's InMemory store, and on the S3 server when it runs.
#[test]
fn a_store_failure_keeps_its_cause() {
    let check = |storage: &ObjectStorage| {
        let error = Reader::open_key(storage, "missing.bpk").unwrap_err();
        assert_eq!(error.kind(), ErrorKind::NotFound);
        assert_eq!(error.key(), Some("missing.bpk"));
        assert!(
            matches!(
                store_cause(&error),
                Some(object_store::Error::NotFound { .. })
            ),
            "{error:?}"
        );
    };
    check(&counting().1);
    let s3 = ByUrl::s3();
    match s3.unavailable() {
        None => check(&s3.fresh()),
        Some(why) => {
            assert!(
                std::env::var("WEIGHTBAY_REQUIRE_SERVERS").as_deref() != Ok("1"),
                "{why} (WEIGHTBAY_REQUIRE_SERVERS=1)"
            );
            eprintln!("S3 part skipped: {why}");
        }
    }
}

/// The public load path gets the batched read: `Reader::load_all` and a copy through
/// `to_writer` ask the store for every tensor in a few coalesced requests, not one each.
#[test]
fn loads_and_copies_fetch_in_batches() {
    let (store, storage) = counting();
    Writer::new(tensors(40, 5000))
        .write_to(&storage, "m.bpk")
        .unwrap();
    let reader = Reader::open_key(&storage, "m.bpk").unwrap();
    store.gets.store(0, Ordering::SeqCst);
    let all = reader.load_all().unwrap();
    assert_eq!(
        store.gets.load(Ordering::SeqCst),
        1,
        "40 adjacent tensors of 5000 bytes, one request of at most 1 MiB"
    );
    for (info, bytes) in &all {
        assert_eq!(bytes.to_vec().unwrap(), reader.read(info.name()).unwrap());
    }

    store.gets.store(0, Ordering::SeqCst);
    let copy = weightbay::MemoryStorage::new();
    reader.to_writer().write_to(&copy, "m.bpk").unwrap();
    assert_eq!(
        store.gets.load(Ordering::SeqCst),
        1,
        "the copy reads ahead up to the 1 MiB fetch budget: one batch"
    );
    let copied = Reader::open_key(&copy, "m.bpk").unwrap();
    for (info, bytes) in &all {
        assert_eq!(copied.read(info.name()).unwrap(), bytes.to_vec().unwrap());
    }

    store.gets.store(0, Ordering::SeqCst);
    let mut buffers = vec![vec![0u8; 5000]; all.len()];
    let mut targets: Vec<(&str, &mut [u8])> = all
        .iter()
        .zip(buffers.iter_mut())
        .map(|((info, _), buf)| (info.name(), buf.as_mut_slice()))
        .collect();
    reader.read_many_into(&mut targets).unwrap();
    assert_eq!(
        store.gets.load(Ordering::SeqCst),
        1,
        "into caller buffers, in one batch too"
    );
    for ((_, bytes), buf) in all.iter().zip(&buffers) {
        assert_eq!(&bytes.to_vec().unwrap(), buf);
    }
}

#[test]
fn a_copy_into_a_sink_that_takes_writes_by_position_streams_one_get_per_region() {
    use weightbay::{CreateOptions, MemoryStorage, StorageExt};
    // A budget of four 16 MiB windows: four threads, so 80 MiB is four regions of 20 MiB,
    // each one GET (read in order: five windows; read through `read_at` 16 MiB at a time:
    // eight).
    let (store, storage) = counting_with(ObjectStoreOptions::DEFAULT.with_fetch_budget(64 << 20));
    Writer::new(tensors(80, 1 << 20))
        .write_to(&storage, "m.bpk")
        .unwrap();
    let source = storage.open("m.bpk").unwrap();
    let expected = {
        let mut all = vec![0; source.len() as usize];
        source.read_at(0, &mut all).unwrap();
        all
    };
    let into = MemoryStorage::new();
    store.gets.store(0, Ordering::SeqCst);
    let crc = into
        .copy_in("m.bpk", source.as_ref(), CreateOptions::default())
        .unwrap();
    assert_eq!(store.gets.load(Ordering::SeqCst), 4, "one GET per region");
    assert_eq!(crc, weightbay::checksum::crc32c(&expected));
    let mut copied = vec![0; expected.len()];
    into.open("m.bpk").unwrap().read_at(0, &mut copied).unwrap();
    assert!(copied == expected);
}
