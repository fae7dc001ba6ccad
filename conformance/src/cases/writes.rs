//! Writing: what a committed container holds, overwrite, capabilities declared or refused,
//! aborted and failed writes, deadlines, and sharded sets that exist whole or not at all.
//! Create-new and commits racing are [`create_new`](super::create_new)'s.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::time::{Duration, Instant};

use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use weightbay::{
    Bytes, CreateOptions, DType, Durability, ErrorKind, Listed, Reader, ShardedWeights,
    ShardedWriter, Storage, Tensor, WeightComponentSpec, WeightSource, WriteMode, Writer,
};

use crate::holdings::{
    KEY, assert_holds_one_of, assert_nothing_pending, many_parts, several_parts, stored,
};
use crate::model::{KEYS, Model, Op};
use crate::outcome::{Outcome, fail};
use crate::property::run_property;
use crate::strategies::{self, sample};
use crate::{Faulty, Harness, is_injected};

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
