//! Writing: what a committed container holds, overwrite and create-new (and their race),
//! capabilities declared or refused, aborted and failed writes, and sharded sets that exist
//! whole or not at all.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use weightbay::{
    Bytes, CreateOptions, DType, Durability, ErrorKind, Listed, Reader, ShardedWeights,
    ShardedWriter, Storage, Tensor, WeightComponentSpec, WeightSource, WriteMode, Writer,
};

use crate::lockstep::Lockstep;
use crate::model::{KEYS, Model, Op};
use crate::strategies::{self, ContainerSpec, sample};
use crate::support::{
    KEY, NO_FILE_SYSTEM, Outcome, assert_holds_one_of, assert_nothing_pending, fail, many_parts,
    run_property, several_parts, stored,
};
use crate::{Faulty, Harness, SimulatedDisk, is_injected};

/// Write → commit → open → read gives back the input, byte for byte what
/// [`Writer::into_bytes`] produces, and the trailer verifies; for every dtype, empty and
/// zero-size tensors, unicode and long names, metadata, scalars and alignments.
pub fn roundtrip_matches_writer<H: Harness>(harness: &H, case: &str) -> Outcome {
    let storage = harness.fresh();
    // Tensors of 64 KiB and more reach the sink as separate writes; the second container
    // spans several of the backend's parts, the third more than ten.
    for (what, large) in [
        (
            "several sink writes",
            sample(&[100_000, 70_000, 5, 90_000, 300_000], 4),
        ),
        ("several parts", several_parts(harness, 5)),
        ("eleven parts and more", many_parts(harness, 6)),
    ] {
        large
            .writer()
            .write_to(&storage, KEY)
            .unwrap_or_else(|e| fail!(case, "write_to ({what}): {e}"));
        let bytes = stored(&harness.reopen(&storage), KEY)
            .unwrap_or_else(|e| fail!(case, "open/read ({what}): {e}"));
        if bytes != large.bytes() {
            fail!(
                case,
                "a container written in {what} came back different ({} bytes stored, {} written)",
                bytes.len(),
                large.bytes().len()
            );
        }
    }
    run_property(case, strategies::container(), |spec| {
        spec.writer()
            .write_to(&storage, KEY)
            .map_err(|e| TestCaseError::fail(format!("write_to: {e}")))?;
        let reopened = harness.reopen(&storage);
        let bytes =
            stored(&reopened, KEY).map_err(|e| TestCaseError::fail(format!("open/read: {e}")))?;
        prop_assert_eq!(
            &bytes,
            &spec.bytes(),
            "stored bytes differ from Writer::into_bytes"
        );
        let reader = Reader::open(
            reopened
                .open(KEY)
                .map_err(|e| TestCaseError::fail(e.to_string()))?,
        )
        .map_err(|e| TestCaseError::fail(format!("Reader::open: {e}")))?;
        for tensor in &spec.tensors {
            let data = reader
                .read(&tensor.name)
                .map_err(|e| TestCaseError::fail(e.to_string()))?;
            prop_assert_eq!(&data, &tensor.data, "tensor {}", tensor.name);
            let via_bytes = reader.bytes(&tensor.name).and_then(|b| b.to_vec());
            prop_assert_eq!(
                via_bytes.ok(),
                Some(tensor.data.clone()),
                "Source::bytes of {}",
                tensor.name
            );
        }
        prop_assert_eq!(reader.metadata(), &spec.metadata);
        prop_assert_eq!(reader.has_trailer(), spec.trailer);
        reader
            .verify()
            .map_err(|e| TestCaseError::fail(format!("verify: {e}")))?;
        Ok(())
    });
    if storage.capabilities().zero_copy_reads {
        let spec = sample(&[4096], 1);
        spec.writer()
            .write_to(&storage, KEY)
            .unwrap_or_else(|e| fail!(case, "write_to: {e}"));
        let reader = Reader::open(
            storage
                .open(KEY)
                .unwrap_or_else(|e| fail!(case, "open: {e}")),
        )
        .unwrap_or_else(|e| fail!(case, "Reader::open: {e}"));
        let bytes = reader
            .bytes("layer0.weight")
            .unwrap_or_else(|e| fail!(case, "bytes: {e}"));
        if let Err(e) = bytes.read(weightbay::AccessPolicy::ZeroCopy) {
            fail!(
                case,
                "zero_copy_reads is declared but Source::bytes needs a copy: {e}"
            );
        }
    }
    Outcome::Checked
}

fn op() -> impl Strategy<Value = Op> {
    let key = 0usize..KEYS.len();
    prop_oneof![
        3 => (key.clone(), 0u8..4, any::<bool>(), proptest::option::weighted(0.2, 1u64..12))
            .prop_map(|(key, version, create_new, fail_at)| Op::Put { key, version, create_new, fail_at }),
        1 => (key.clone(), 0u8..4).prop_map(|(key, version)| Op::Abort { key, version }),
        1 => key.clone().prop_map(|key| Op::Delete { key }),
        2 => key.clone().prop_map(|key| Op::Open { key }),
        1 => (key, 0u64..2000, 0u64..700).prop_map(|(key, start, len)| Op::ReadRange { key, start, len }),
    ]
}

/// Random sequences of create, overwrite, create-new (some with an injected fault), abort,
/// delete, open and ranged reads, run against the backend and against a `BTreeMap` model,
/// compared after every step.
pub fn model_based_operations<H: Harness>(harness: &H, case: &str) -> Outcome {
    run_property(case, proptest::collection::vec(op(), 1..24), |ops| {
        let storage = harness.fresh();
        let mut model = Model::default();
        for (step, op) in ops.iter().enumerate() {
            model
                .apply(&storage, op)
                .and_then(|()| model.check(&storage))
                .map_err(|e| TestCaseError::fail(format!("step {step} ({op:?}): {e}")))?;
        }
        Ok(())
    });
    Outcome::Checked
}

/// Opening or deleting a key that was never written fails with NotFound.
pub fn open_missing_is_not_found<H: Harness>(harness: &H, case: &str) -> Outcome {
    let storage = harness.fresh();
    for key in ["missing.bpk", "no/such/dir/x.bpk"] {
        match storage.open(key) {
            Err(e) if e.kind() == ErrorKind::NotFound => {}
            Err(e) => fail!(
                case,
                "open `{key}`: expected NotFound, got {:?}: {e}",
                e.kind()
            ),
            Ok(_) => fail!(case, "open `{key}` succeeded on an empty storage"),
        }
        match storage.delete(key) {
            Err(e) if e.kind() == ErrorKind::NotFound => {}
            other => fail!(
                case,
                "delete `{key}`: expected NotFound, got {:?}",
                other.map_err(|e| e.to_string())
            ),
        }
    }
    Outcome::Checked
}

/// Keys that are not relative `/`-separated paths are refused with InvalidInput everywhere.
pub fn invalid_keys_are_rejected<H: Harness>(harness: &H, case: &str) -> Outcome {
    let storage = harness.fresh();
    for key in [
        "",
        "/abs.bpk",
        "../escape.bpk",
        "a//b.bpk",
        "a/./b.bpk",
        "back\\slash.bpk",
    ] {
        let create = storage.create(key, &CreateOptions::default()).map(|_| ());
        let open = storage.open(key).map(|_| ());
        let delete = storage.delete(key);
        for (operation, result) in [("create", create), ("open", open), ("delete", delete)] {
            match result {
                Err(e) if e.kind() == ErrorKind::InvalidInput => {}
                other => fail!(
                    case,
                    "{operation} {key:?}: expected InvalidInput, got {:?}",
                    other.map_err(|e| e.kind())
                ),
            }
        }
    }
    Outcome::Checked
}

/// An overwrite replaces the whole container, shorter or longer.
pub fn overwrite_replaces_whole<H: Harness>(harness: &H, case: &str) -> Outcome {
    let storage = harness.fresh();
    let half = harness.several_parts_len() / 2 + 1;
    let several = [half, 5, half];
    for (step, sizes) in [
        &[5000usize, 3000][..],
        &several,
        &[10],
        &[70_000, 1, 0, 9000],
        &several,
        &[],
    ]
    .iter()
    .enumerate()
    {
        let spec = sample(sizes, step as u8);
        spec.writer()
            .write_to(&storage, KEY)
            .unwrap_or_else(|e| fail!(case, "write {step}: {e}"));
        let bytes = stored(&harness.reopen(&storage), KEY)
            .unwrap_or_else(|e| fail!(case, "read {step}: {e}"));
        if bytes != spec.bytes() {
            fail!(
                case,
                "after overwrite {step} the key holds {} bytes, not the {} written",
                bytes.len(),
                spec.bytes().len()
            );
        }
    }
    Outcome::Checked
}

/// Create-new fails with AlreadyExists on a taken key and leaves it intact; it succeeds on a
/// free one. Without the capability it is Unsupported.
pub fn create_new_refuses_existing<H: Harness>(harness: &H, case: &str) -> Outcome {
    let storage = harness.fresh();
    // The first create-new spans several parts, so a backend that stages large uploads
    // publishes one here.
    let old = several_parts(harness, 1);
    let new = sample(&[200], 2);
    let create_new = |spec: &ContainerSpec, key: &str| {
        spec.writer()
            .with_mode(WriteMode::CreateNew)
            .write_to(&storage, key)
    };
    if !storage.capabilities().atomic_create_new {
        match create_new(&new, KEY) {
            Err(e) if e.kind() == ErrorKind::Unsupported => return Outcome::Checked,
            other => fail!(
                case,
                "create-new is not declared, expected Unsupported, got {:?}",
                other.map_err(|e| e.kind())
            ),
        }
    }
    create_new(&old, KEY).unwrap_or_else(|e| fail!(case, "create-new on a free key: {e}"));
    match create_new(&new, KEY) {
        Err(e) if e.kind() == ErrorKind::AlreadyExists => {}
        other => fail!(
            case,
            "create-new on a taken key: expected AlreadyExists, got {:?}",
            other.map_err(|e| e.to_string())
        ),
    }
    assert_holds_one_of(
        case,
        "after a refused create-new",
        &storage,
        KEY,
        &[Some(&old.bytes())],
    );
    assert_nothing_pending(case, "after a refused create-new", &storage);
    Outcome::Checked
}

/// Writers racing to create-new the same key: exactly one wins; the others get AlreadyExists;
/// the winner's bytes are intact.
pub fn create_new_race_has_one_winner<H: Harness>(harness: &H, case: &str) -> Outcome {
    race_create_new(harness, case, 8, |w| {
        sample(&[1000 + w * 700, 300], w as u8)
    })
}

/// As [`create_new_race_has_one_winner`], with containers of
/// [`several_parts_len`](Harness::several_parts_len): a backend publishes those another way (an
/// object store's staged upload and conditional copy or completion), which must be as
/// race-free as its single conditional write.
pub fn large_create_new_race_has_one_winner<H: Harness>(harness: &H, case: &str) -> Outcome {
    race_create_new(harness, case, 3, |w| several_parts(harness, w as u8))
}

/// Four writers of `spec(writer)` racing to create-new one key, `rounds` times: one wins, the
/// others fail with AlreadyExists, the key holds the winner's container, nothing is pending.
fn race_create_new<H: Harness>(
    harness: &H,
    case: &str,
    rounds: usize,
    spec: impl Fn(usize) -> ContainerSpec,
) -> Outcome {
    let storage = harness.fresh();
    if !storage.capabilities().atomic_create_new {
        // create_new_refuses_existing checks that it is Unsupported.
        return Outcome::NotApplicable("the backend does not declare create-new".into());
    }
    const WRITERS: usize = 4;
    for round in 0..rounds {
        let key = format!("race/{round}.bpk");
        let barrier = Barrier::new(WRITERS);
        let specs: Vec<ContainerSpec> = (0..WRITERS).map(&spec).collect();
        let results: Vec<_> = std::thread::scope(|scope| {
            let handles: Vec<_> = specs
                .iter()
                .map(|spec| {
                    let (storage, barrier, key) = (&storage, &barrier, &key);
                    scope.spawn(move || {
                        barrier.wait();
                        spec.writer()
                            .with_mode(WriteMode::CreateNew)
                            .write_to(storage, key)
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("writer thread"))
                .collect()
        });
        let winners: Vec<usize> = results
            .iter()
            .enumerate()
            .filter(|(_, r)| r.is_ok())
            .map(|(i, _)| i)
            .collect();
        if winners.len() != 1 {
            fail!(
                case,
                "round {round}: {} writers won: {results:?}",
                winners.len()
            );
        }
        for (i, result) in results.iter().enumerate() {
            if let Err(e) = result
                && e.kind() != ErrorKind::AlreadyExists
            {
                fail!(
                    case,
                    "round {round}: loser {i} got {:?} instead of AlreadyExists: {e}",
                    e.kind()
                );
            }
        }
        assert_holds_one_of(
            case,
            &format!("round {round}"),
            &storage,
            &key,
            &[Some(&specs[winners[0]].bytes())],
        );
    }
    assert_nothing_pending(case, "after the races", &storage);
    Outcome::Checked
}

/// Two saves of one key whose file-system operations alternate one by one, either going first,
/// on backends that work through [`FileSystem`](weightbay::backend_kit::FileSystem): a
/// create-new that checks for the name and then takes it, in two operations, lets both win
/// here every time. Create-new (where declared) has exactly one winner and the other fails
/// with AlreadyExists; an overwrite of an existing key leaves one of the two whole; nothing is
/// left pending.
pub fn create_new_race_step_by_step<H: Harness>(harness: &H, case: &str) -> Outcome {
    let over = |fs| harness.over_file_system(fs);
    if over(Arc::new(SimulatedDisk::new())).is_none() {
        return Outcome::NotApplicable(NO_FILE_SYSTEM.into());
    }
    let old = sample(&[500, 70], 0);
    let pair = [sample(&[1200, 30], 1), sample(&[800, 900], 2)];
    let mut modes = vec![WriteMode::Overwrite];
    if harness.fresh().capabilities().atomic_create_new {
        modes.push(WriteMode::CreateNew);
    }
    for mode in modes {
        for first in [0, 1] {
            let context = format!("{mode:?} saves taking turns, save {first} first");
            let lockstep = Lockstep::new(Arc::new(SimulatedDisk::new()));
            let storage = over(lockstep.clone())
                .unwrap_or_else(|| fail!(case, "over_file_system stopped answering"));
            if mode == WriteMode::Overwrite {
                old.writer()
                    .write_to(&storage, KEY)
                    .unwrap_or_else(|e| fail!(case, "{context}: write the old container: {e}"));
            }
            let save = |spec: &ContainerSpec| spec.writer().with_mode(mode).write_to(&storage, KEY);
            let results = lockstep.play(first, || save(&pair[0]), || save(&pair[1]));
            let outcomes = [results.0, results.1].map(|r| r.map(|_| ()));
            let holds = match (mode, &outcomes) {
                (WriteMode::CreateNew, [Ok(()), Err(e)])
                    if e.kind() == ErrorKind::AlreadyExists =>
                {
                    vec![Some(pair[0].bytes())]
                }
                (WriteMode::CreateNew, [Err(e), Ok(())])
                    if e.kind() == ErrorKind::AlreadyExists =>
                {
                    vec![Some(pair[1].bytes())]
                }
                (WriteMode::CreateNew, _) => fail!(
                    case,
                    "{context}: exactly one create-new must win and the other fail with \
                     AlreadyExists, got {:?}",
                    outcomes.map(|r| r.map_err(|e| e.to_string()))
                ),
                (_, [Ok(()), Ok(())]) => pair.iter().map(|spec| Some(spec.bytes())).collect(),
                (_, _) => fail!(
                    case,
                    "{context}: both overwrites must succeed, got {:?}",
                    outcomes.map(|r| r.map_err(|e| e.to_string()))
                ),
            };
            let holds: Vec<_> = holds.iter().map(|bytes| bytes.as_deref()).collect();
            let reopened =
                over(lockstep).unwrap_or_else(|| fail!(case, "over_file_system stopped answering"));
            assert_holds_one_of(case, &context, &reopened, KEY, &holds);
            assert_nothing_pending(case, &context, &reopened);
        }
    }
    Outcome::Checked
}

/// Two sinks open on one key at once, committed one after the other in both orders, with no
/// thread and no luck involved: an overwrite leaves the key holding exactly the container
/// committed last; create-new (where declared) lets the first commit win and refuses the second
/// with AlreadyExists, for small containers and for ones of several parts (a multipart upload
/// published by a conditional copy or complete), leaving nothing pending.
pub fn interleaved_commits_resolve_in_order<H: Harness>(harness: &H, case: &str) -> Outcome {
    let small = [sample(&[1200, 30], 1), sample(&[800, 900], 2)];
    let large = [several_parts(harness, 3), several_parts(harness, 4)];
    let create_new = harness.fresh().capabilities().atomic_create_new;
    let mut plans = vec![(WriteMode::Overwrite, "small", &small)];
    if create_new {
        plans.push((WriteMode::CreateNew, "small", &small));
        plans.push((WriteMode::CreateNew, "several-parts", &large));
    }
    for (mode, size, pair) in plans {
        for first in [0, 1] {
            let second = 1 - first;
            let context =
                format!("{mode:?} of two {size} containers, sink {first} committed first");
            let storage = harness.fresh();
            let options = CreateOptions::default().with_mode(mode);
            let mut sinks: Vec<_> = pair
                .iter()
                .enumerate()
                .map(|(i, spec)| {
                    let options = options.with_expected_len(spec.bytes().len() as u64);
                    let mut sink = storage
                        .create(KEY, &options)
                        .unwrap_or_else(|e| fail!(case, "{context}: create of sink {i}: {e}"));
                    sink.write(&spec.bytes())
                        .unwrap_or_else(|e| fail!(case, "{context}: write to sink {i}: {e}"));
                    Some(sink)
                })
                .collect();
            let mut commit = |i: usize| {
                sinks[i]
                    .take()
                    .map(|sink| sink.commit())
                    .unwrap_or_else(|| fail!(case, "{context}: sink {i} committed twice"))
            };
            if let Err(e) = commit(first) {
                fail!(case, "{context}: the first commit failed: {e}");
            }
            let later = commit(second);
            let holds = match (mode, later) {
                (WriteMode::CreateNew, Err(e)) if e.kind() == ErrorKind::AlreadyExists => first,
                (WriteMode::CreateNew, other) => fail!(
                    case,
                    "{context}: the second create-new commit must fail with AlreadyExists, got {:?}",
                    other.map_err(|e| e.to_string())
                ),
                (_, Ok(())) => second,
                (_, Err(e)) => fail!(case, "{context}: the second overwrite failed: {e}"),
            };
            let reopened = harness.reopen(&storage);
            assert_holds_one_of(
                case,
                &context,
                &reopened,
                KEY,
                &[Some(&pair[holds].bytes())],
            );
            assert_nothing_pending(case, &context, &reopened);
        }
    }
    Outcome::Checked
}

/// Options the backend does not declare are refused with Unsupported before anything is
/// written; declared ones work.
pub fn undeclared_capabilities_are_unsupported<H: Harness>(harness: &H, case: &str) -> Outcome {
    let storage = harness.fresh();
    let capabilities = storage.capabilities();
    let checks = [
        (
            capabilities.in_place_writes,
            CreateOptions::default().with_mode(WriteMode::InPlace),
            "in-place writes",
        ),
        (
            capabilities.durable_commit,
            CreateOptions::default().with_durability(Durability::Durable),
            "durable commits",
        ),
        (
            capabilities.atomic_create_new,
            CreateOptions::default().with_mode(WriteMode::CreateNew),
            "create-new",
        ),
    ];
    let spec = sample(&[300], 3);
    for (declared, options, what) in checks {
        let result = spec
            .writer()
            .with_mode(options.mode)
            .with_durability(options.durability)
            .write_to(&storage, KEY);
        match (declared, result) {
            (true, Ok(_)) => {
                assert_holds_one_of(case, what, &storage, KEY, &[Some(&spec.bytes())]);
                storage
                    .delete(KEY)
                    .unwrap_or_else(|e| fail!(case, "delete after {what}: {e}"));
            }
            (true, Err(e)) => fail!(case, "{what} are declared but failed: {e}"),
            (false, Err(e)) if e.kind() == ErrorKind::Unsupported => {
                assert_holds_one_of(case, what, &storage, KEY, &[None]);
            }
            (false, other) => fail!(
                case,
                "{what} are not declared: expected Unsupported, got {:?}",
                other.map_err(|e| e.kind())
            ),
        }
    }
    // What they answer must be what is there, not any answer: one container, nothing pending.
    spec.writer()
        .write_to(&storage, KEY)
        .unwrap_or_else(|e| fail!(case, "write: {e}"));
    let held = vec![Listed {
        key: KEY.to_owned(),
        len: spec.bytes().len() as u64,
    }];
    match (capabilities.pending_listing, storage.pending("")) {
        (true, Ok(pending)) if pending.is_empty() => {}
        (true, Ok(pending)) => fail!(
            case,
            "no write is in progress, but pending() lists {pending:?}"
        ),
        (false, Err(e)) if e.kind() == ErrorKind::Unsupported => {}
        (true, Err(e)) => fail!(case, "pending listing is declared but failed: {e}"),
        (false, Err(e)) => fail!(
            case,
            "pending listing is not declared: expected Unsupported, got {:?}: {e}",
            e.kind()
        ),
        (false, Ok(_)) => fail!(
            case,
            "pending listing is not declared but pending() answered"
        ),
    }
    match (capabilities.listing, storage.list("")) {
        (true, Ok(listed)) if listed == held => {}
        (true, Ok(listed)) => fail!(
            case,
            "the storage holds {held:?}, but list(\"\") answers {listed:?}"
        ),
        (false, Err(e)) if e.kind() == ErrorKind::Unsupported => {}
        (true, Err(e)) => fail!(case, "listing is declared but failed: {e}"),
        (false, Err(e)) => fail!(
            case,
            "listing is not declared: expected Unsupported, got {:?}: {e}",
            e.kind()
        ),
        (false, Ok(_)) => fail!(case, "listing is not declared but list() answered"),
    }
    Outcome::Checked
}

/// A sink dropped without commit, after any amount of writing, leaves the key as it was and
/// nothing behind.
pub fn abort_on_drop_leaves_nothing<H: Harness>(harness: &H, case: &str) -> Outcome {
    let storage = harness.fresh();
    let old = sample(&[500, 20], 1).bytes();
    let new = sample(&[90_000, 7000], 2).bytes();
    for existing in [false, true] {
        if existing {
            sample(&[500, 20], 1)
                .writer()
                .write_to(&storage, KEY)
                .unwrap_or_else(|e| fail!(case, "write old: {e}"));
        }
        for cut in [0, 1, 10, 300, new.len() / 2, new.len()] {
            let mut sink = storage
                .create(KEY, &CreateOptions::default())
                .unwrap_or_else(|e| fail!(case, "create: {e}"));
            sink.write(&new[..cut])
                .unwrap_or_else(|e| fail!(case, "write: {e}"));
            drop(sink);
            let context = format!("after dropping a sink with {cut} bytes written");
            let allowed: &[Option<&[u8]>] = if existing { &[Some(&old)] } else { &[None] };
            assert_holds_one_of(case, &context, &harness.reopen(&storage), KEY, allowed);
            assert_nothing_pending(case, &context, &storage);
        }
    }
    Outcome::Checked
}

/// A failing provider, a wrong produced length and a panicking provider each leave the key
/// exactly as it was, with nothing behind, for an existing key and a fresh one.
pub fn failed_writes_leave_key_unchanged<H: Harness>(harness: &H, case: &str) -> Outcome {
    let storage = harness.fresh();
    let old = sample(&[700], 1);
    old.writer()
        .write_to(&storage, KEY)
        .unwrap_or_else(|e| fail!(case, "write old: {e}"));
    type Provider = fn() -> weightbay::Result<Bytes>;
    let providers: [(&str, Provider); 3] = [
        ("provider error", || {
            Err(weightbay::Error::new(
                ErrorKind::Io,
                "device readback failed",
            ))
        }),
        ("wrong length", || Ok(Bytes::from(vec![0u8; 3]))),
        ("provider panic", || panic!("provider panicked on purpose")),
    ];
    for (what, provider) in providers {
        for (key, allowed) in [(KEY, Some(old.bytes())), ("fresh/key.bpk", None)] {
            let writer = Writer::new(vec![
                Tensor::new("before", DType::U8, [100_000], vec![7u8; 100_000]),
                Tensor::deferred("failing", DType::U8, [4], 4, provider),
            ]);
            let result = catch_unwind(AssertUnwindSafe(|| writer.write_to(&storage, key)));
            match result {
                Ok(Err(e)) if e.tensor() == Some("failing") => {}
                Ok(Err(e)) => fail!(case, "{what}: the error does not name the tensor: {e}"),
                Ok(Ok(_)) => fail!(case, "{what}: the write succeeded"),
                Err(_) => fail!(
                    case,
                    "{what}: the write panicked instead of returning an error"
                ),
            }
            let context = format!("{what} writing `{key}`");
            assert_holds_one_of(
                case,
                &context,
                &harness.reopen(&storage),
                key,
                &[allowed.as_deref()],
            );
            assert_nothing_pending(case, &context, &storage);
        }
    }
    Outcome::Checked
}

/// A write past its deadline fails with [`ErrorKind::TimedOut`] and publishes nothing: a sink
/// created with a [`CreateOptions::deadline`] that passes before its last write or its commit
/// (with a container of several parts, so an object store has parts in flight), and a
/// [`Writer::with_deadline`] that has passed, each leave the key holding the old container and
/// nothing pending.
pub fn deadlines_are_kept<H: Harness>(harness: &H, case: &str) -> Outcome {
    let storage = harness.fresh();
    let old = sample(&[700], 1);
    old.writer()
        .write_to(&storage, KEY)
        .unwrap_or_else(|e| fail!(case, "write old: {e}"));
    let new = several_parts(harness, 2);
    let bytes = new.bytes();
    let half = bytes.len() / 2;
    for (what, late) in [("the last write", true), ("the commit", false)] {
        let deadline = Instant::now() + Duration::from_millis(300);
        let options = CreateOptions::default()
            .with_expected_len(bytes.len() as u64)
            .with_deadline(deadline);
        let mut sink = storage
            .create(KEY, &options)
            .unwrap_or_else(|e| fail!(case, "create with a deadline: {e}"));
        let early = if late { &bytes[..half] } else { &bytes[..] };
        sink.write(early)
            .unwrap_or_else(|e| fail!(case, "a write before the deadline failed: {e}"));
        std::thread::sleep(
            deadline.saturating_duration_since(Instant::now()) + Duration::from_millis(50),
        );
        let outcome = if late {
            sink.write(&bytes[half..]).and_then(|()| sink.commit())
        } else {
            sink.commit()
        };
        match outcome {
            Err(e) if e.kind() == ErrorKind::TimedOut => {}
            Err(e) => fail!(
                case,
                "deadline passed before {what}: expected TimedOut, got {e}"
            ),
            Ok(()) => fail!(
                case,
                "a sink committed after its deadline passed before {what}"
            ),
        }
        let context = format!("after a deadline passed before {what}");
        assert_holds_one_of(
            case,
            &context,
            &harness.reopen(&storage),
            KEY,
            &[Some(&old.bytes())],
        );
        assert_nothing_pending(case, &context, &storage);
    }
    match new
        .writer()
        .with_deadline(Instant::now())
        .write_to(&storage, KEY)
    {
        Err(e) if e.kind() == ErrorKind::TimedOut => {}
        Err(e) => fail!(
            case,
            "a writer past its deadline: expected TimedOut, got {e}"
        ),
        Ok(_) => fail!(case, "a writer past its deadline committed"),
    }
    let context = "after a writer past its deadline";
    assert_holds_one_of(
        case,
        context,
        &harness.reopen(&storage),
        KEY,
        &[Some(&old.bytes())],
    );
    assert_nothing_pending(case, context, &storage);
    Outcome::Checked
}

/// A sharded checkpoint exists whole or not at all: a fault at each storage operation of a
/// sharded write leaves no index, so no visible checkpoint; a completed write reads back
/// whole through its index; a second writer cannot claim the same index.
pub fn sharded_checkpoint_is_all_or_nothing<H: Harness>(harness: &H, case: &str) -> Outcome {
    let tensors = || -> Vec<Tensor> {
        (0..4u8)
            .map(|i| Tensor::new(format!("w{i}"), DType::U8, [3000], vec![i; 3000]))
            .collect()
    };
    let write = |storage: &dyn Storage| {
        ShardedWriter::new(Writer::new(tensors()).with_format(weightbay::Format::Safetensors))
            .with_shard_len(6000)
            .write_to(storage, "ckpt")
    };
    let index = "ckpt/model.safetensors.index.json";
    if !harness.fresh().capabilities().atomic_create_new {
        match write(&harness.fresh()) {
            Err(e) if e.kind() == ErrorKind::Unsupported => return Outcome::Checked,
            other => fail!(
                case,
                "without create-new the index cannot be published safely; expected Unsupported, got {:?}",
                other.map_err(|e| e.kind())
            ),
        }
    }
    let counting = Faulty::counting(harness.fresh());
    write(&counting).unwrap_or_else(|e| fail!(case, "sharded write: {e}"));
    let total = counting.operations();
    for n in 1..=total {
        let storage = harness.fresh();
        match write(&Faulty::failing_at(harness.reopen(&storage), n)) {
            Err(e) if is_injected(&e) => {}
            other => fail!(
                case,
                "fault at operation {n} of {total}: expected the injected fault, got {:?}",
                other.map_err(|e| e.to_string())
            ),
        }
        match stored(&harness.reopen(&storage), index) {
            Err(e) if e.kind() == ErrorKind::NotFound => {}
            other => fail!(
                case,
                "fault at operation {n} of {total}: the index is visible: {:?}",
                other.map(|b| b.len())
            ),
        }
    }
    let storage = harness.fresh();
    let summary = write(&storage).unwrap_or_else(|e| fail!(case, "sharded write: {e}"));
    let weights = ShardedWeights::open(Arc::new(harness.reopen(&storage)), &summary.index)
        .unwrap_or_else(|e| fail!(case, "opening the index: {e}"));
    for i in 0..4u8 {
        let spec = WeightComponentSpec::dense(format!("w{i}"), [3000], DType::U8);
        let bytes = weights
            .component(&spec)
            .ok()
            .flatten()
            .and_then(|p| p.bytes.to_vec().ok());
        if bytes != Some(vec![i; 3000]) {
            fail!(case, "tensor w{i} does not read back through the index");
        }
    }
    match write(&storage) {
        Err(e) if e.kind() == ErrorKind::AlreadyExists => {}
        other => fail!(
            case,
            "a second writer claimed the same checkpoint: {:?}",
            other.map_err(|e| e.to_string())
        ),
    }
    Outcome::Checked
}
