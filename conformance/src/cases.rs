//! The conformance cases. Each is a public function generic over a [`Harness`]; the
//! [`suite!`](crate::suite) macro makes one `#[test]` of each.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Arc, Barrier};

use proptest::prelude::*;
use proptest::test_runner::{Config, RngAlgorithm, TestCaseError, TestError, TestRng, TestRunner};
use weightbay::Format;
use weightbay::ShardedWeights;
use weightbay::ShardedWriter;
use weightbay::backend_kit::FileSystem;
use weightbay::{
    Bytes, CreateOptions, DType, Durability, ErrorKind, Reader, Storage, Tensor, WriteMode, Writer,
};
use weightbay::{WeightComponentSpec, WeightSource};
use weightbay_checkpoints::{
    Checkpoints, RankOutcome, RankSave, Region, Retention, SaveOptions, StepState,
};

use crate::alloc::CountingAllocator;
use crate::model::{KEYS, Model, Op};
use crate::ranked::SlicedModel;
use crate::strategies::{self, ContainerSpec, sample};
use crate::{FaultPlan, Faulty, FaultyFileSystem, Harness, SimulatedDisk, is_injected};

/// Fails the running case with a message naming it.
macro_rules! fail {
    ($case:expr, $($arg:tt)*) => {
        panic!("conformance case `{}` failed: {}", $case, format!($($arg)*))
    };
}

/// What a case found, when it did not fail.
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use]
pub enum Outcome {
    /// Everything the case covers was checked and held.
    Checked,
    /// The case cannot run on this backend, for the reason given (no simulated file system,
    /// nothing that outlives the process). [`verdict`](crate::verdict) fails it unless the
    /// harness declares it in [`Harness::not_applicable`].
    NotApplicable(String),
}

/// Property cases per run: `WEIGHTBAY_CASES`, default 32.
pub fn property_cases() -> u32 {
    std::env::var("WEIGHTBAY_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(32)
}

/// Runs a property with a reproducible seed: `WEIGHTBAY_SEED` (hex) when set, else a fresh
/// one, printed on failure.
fn run_property<S: Strategy>(
    case: &str,
    strategy: S,
    test: impl Fn(S::Value) -> Result<(), TestCaseError>,
) where
    S::Value: std::fmt::Debug,
{
    let seed: [u8; 32] = match std::env::var("WEIGHTBAY_SEED") {
        Ok(hex) => {
            parse_seed(&hex).unwrap_or_else(|| fail!(case, "WEIGHTBAY_SEED must be 64 hex digits"))
        }
        Err(_) => {
            // A fresh seed from the standard library's per-process random hasher keys.
            let mut seed = [0u8; 32];
            for chunk in seed.chunks_mut(8) {
                let random = std::hash::BuildHasher::hash_one(
                    &std::collections::hash_map::RandomState::new(),
                    0u8,
                );
                chunk.copy_from_slice(&random.to_le_bytes());
            }
            seed
        }
    };
    let config = Config {
        cases: property_cases(),
        failure_persistence: None,
        ..Config::default()
    };
    let mut runner =
        TestRunner::new_with_rng(config, TestRng::from_seed(RngAlgorithm::ChaCha, &seed));
    if let Err(error) = runner.run(&strategy, test) {
        let hex: String = seed.iter().map(|b| format!("{b:02x}")).collect();
        match error {
            TestError::Fail(reason, input) => {
                fail!(
                    case,
                    "{reason}\nminimal input: {input:#?}\nreplay with WEIGHTBAY_SEED={hex}"
                )
            }
            TestError::Abort(reason) => fail!(case, "aborted: {reason} (WEIGHTBAY_SEED={hex})"),
        }
    }
}

fn parse_seed(hex: &str) -> Option<[u8; 32]> {
    let mut seed = [0u8; 32];
    if hex.len() != 64 {
        return None;
    }
    for (i, byte) in seed.iter_mut().enumerate() {
        *byte = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(seed)
}

/// Every byte stored at `key`, or the error of opening or reading it.
pub(crate) fn stored(storage: &dyn Storage, key: &str) -> weightbay::Result<Vec<u8>> {
    let source = storage.open(key)?;
    let len = usize::try_from(source.len()).map_err(|_| weightbay::Error::invalid("too large"))?;
    let mut out = vec![0; len];
    source.read_at(0, &mut out)?;
    Ok(out)
}

/// Asserts `key` holds exactly one of `allowed` (or is absent when `None` is allowed), and that
/// a stored container opens and verifies.
fn assert_holds_one_of(
    case: &str,
    context: &str,
    storage: &dyn Storage,
    key: &str,
    allowed: &[Option<&[u8]>],
) {
    let held = stored(storage, key);
    assert_listing_agrees(
        case,
        context,
        storage,
        key,
        held.as_ref().ok().map(Vec::len),
    );
    match held {
        Ok(bytes) => {
            if !allowed.iter().flatten().any(|a| *a == bytes.as_slice()) {
                fail!(
                    case,
                    "{context}: `{key}` holds {} bytes that are neither the old nor the new container",
                    bytes.len()
                );
            }
            let reader = Reader::from_bytes(bytes)
                .unwrap_or_else(|e| fail!(case, "{context}: stored container does not open: {e}"));
            if let Err(e) = reader.verify() {
                fail!(case, "{context}: stored container does not verify: {e}");
            }
        }
        Err(e) if e.kind() == ErrorKind::NotFound => {
            if !allowed.contains(&None) {
                fail!(
                    case,
                    "{context}: `{key}` is missing but should hold a container"
                );
            }
        }
        Err(e) => fail!(case, "{context}: reading `{key}` failed: {e}"),
    }
}

/// Where the backend lists: `key` is listed exactly when it holds a container (of `held`
/// bytes), and everything listed opens with the listed length: a scratch file, staged upload
/// or half-written container never shows.
fn assert_listing_agrees(
    case: &str,
    context: &str,
    storage: &dyn Storage,
    key: &str,
    held: Option<usize>,
) {
    if !storage.capabilities().listing {
        return;
    }
    let listed = storage
        .list("")
        .unwrap_or_else(|e| fail!(case, "{context}: list failed: {e}"));
    let listed_len = listed.iter().find(|l| l.key == key).map(|l| l.len);
    if listed_len != held.map(|len| len as u64) {
        fail!(
            case,
            "{context}: `{key}` holds {held:?} bytes but the listing says {listed_len:?}: {listed:?}"
        );
    }
    for entry in &listed {
        match storage.open(&entry.key) {
            Ok(source) if source.len() == entry.len => {}
            Ok(source) => fail!(
                case,
                "{context}: `{}` is listed with {} bytes but opens with {}",
                entry.key,
                entry.len,
                source.len()
            ),
            Err(e) => fail!(
                case,
                "{context}: `{}` is listed but does not open: {e}",
                entry.key
            ),
        }
    }
}

fn assert_nothing_pending(case: &str, context: &str, storage: &dyn Storage) {
    if storage.capabilities().pending_listing {
        match storage.pending() {
            Ok(pending) if pending.is_empty() => {}
            Ok(pending) => fail!(
                case,
                "{context}: unfinished writes left behind: {pending:?}"
            ),
            Err(e) => fail!(case, "{context}: pending() failed: {e}"),
        }
    }
}

const KEY: &str = "checkpoints/model.bpk";

/// The key an interrupted-write case writes in `mode`: [`KEY`], which holds the old container,
/// to overwrite; a free key to create new.
fn key_for(mode: WriteMode) -> &'static str {
    if mode == WriteMode::CreateNew {
        "fresh.bpk"
    } else {
        KEY
    }
}

/// After a write in `mode` of `new` over `old` was interrupted: the key holds the new container
/// when the write reported success (`succeeded` names when), else the old one (nothing, for
/// create-new) or the new one; complete and verifying either way.
fn assert_old_or_new(
    case: &str,
    context: &str,
    storage: &dyn Storage,
    mode: WriteMode,
    old: &ContainerSpec,
    new: &ContainerSpec,
    succeeded: Option<&str>,
) {
    let new = new.bytes();
    if let Some(when) = succeeded {
        let context = format!("{context}, {when}");
        assert_holds_one_of(case, &context, storage, key_for(mode), &[Some(&new)]);
        return;
    }
    let old = (mode != WriteMode::CreateNew).then(|| old.bytes());
    assert_holds_one_of(
        case,
        context,
        storage,
        key_for(mode),
        &[old.as_deref(), Some(&new)],
    );
}

/// Why the file-system cases cannot run on a backend.
const NO_FILE_SYSTEM: &str =
    "the backend does not do its I/O through weightbay::backend_kit::FileSystem";

/// A container the backend writes as several pieces ([`Harness::several_parts_len`]), its
/// bytes set by `fill`.
fn several_parts<H: Harness>(harness: &H, fill: u8) -> ContainerSpec {
    let half = harness.several_parts_len() / 2 + 1;
    sample(&[half, 5, half], fill)
}

/// Write → commit → open → read gives back the input, byte for byte what
/// [`Writer::into_bytes`] produces, and the trailer verifies; for every dtype, empty and
/// zero-size tensors, unicode and long names, metadata, scalars and alignments.
pub fn roundtrip_matches_writer<H: Harness>(harness: &H) -> Outcome {
    let case = "roundtrip_matches_writer";
    let storage = harness.fresh();
    // Tensors of 64 KiB and more reach the sink as separate writes; the second container
    // spans several of the backend's parts.
    for (what, large) in [
        (
            "several sink writes",
            sample(&[100_000, 70_000, 5, 90_000, 300_000], 4),
        ),
        ("several parts", several_parts(harness, 5)),
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
pub fn model_based_operations<H: Harness>(harness: &H) -> Outcome {
    let case = "model_based_operations";
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
pub fn open_missing_is_not_found<H: Harness>(harness: &H) -> Outcome {
    let case = "open_missing_is_not_found";
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
pub fn invalid_keys_are_rejected<H: Harness>(harness: &H) -> Outcome {
    let case = "invalid_keys_are_rejected";
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
pub fn overwrite_replaces_whole<H: Harness>(harness: &H) -> Outcome {
    let case = "overwrite_replaces_whole";
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
pub fn create_new_refuses_existing<H: Harness>(harness: &H) -> Outcome {
    let case = "create_new_refuses_existing";
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
pub fn create_new_race_has_one_winner<H: Harness>(harness: &H) -> Outcome {
    let case = "create_new_race_has_one_winner";
    let storage = harness.fresh();
    if !storage.capabilities().atomic_create_new {
        // create_new_refuses_existing checks that it is Unsupported.
        return Outcome::NotApplicable("the backend does not declare create-new".into());
    }
    const WRITERS: usize = 4;
    for round in 0..8 {
        let key = format!("race/{round}.bpk");
        let barrier = Barrier::new(WRITERS);
        let specs: Vec<ContainerSpec> = (0..WRITERS)
            .map(|w| sample(&[1000 + w * 700, 300], w as u8))
            .collect();
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

/// Options the backend does not declare are refused with Unsupported before anything is
/// written; declared ones work.
pub fn undeclared_capabilities_are_unsupported<H: Harness>(harness: &H) -> Outcome {
    let case = "undeclared_capabilities_are_unsupported";
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
    let pending = storage.pending();
    match (capabilities.pending_listing, pending) {
        (true, Ok(_)) => {}
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
        (true, Ok(_)) => {}
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
pub fn abort_on_drop_leaves_nothing<H: Harness>(harness: &H) -> Outcome {
    let case = "abort_on_drop_leaves_nothing";
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
pub fn failed_writes_leave_key_unchanged<H: Harness>(harness: &H) -> Outcome {
    let case = "failed_writes_leave_key_unchanged";
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

/// A sharded checkpoint exists whole or not at all: a fault at each storage operation of a
/// sharded write leaves no index, so no visible checkpoint; a completed write reads back
/// whole through its index; a second writer cannot claim the same index.
pub fn sharded_checkpoint_is_all_or_nothing<H: Harness>(harness: &H) -> Outcome {
    let case = "sharded_checkpoint_is_all_or_nothing";
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

/// The workload the fault and crash cases interrupt: overwrite `KEY` with the new container.
fn write_new(storage: &dyn Storage, spec: &ContainerSpec) -> weightbay::Result<()> {
    spec.writer().write_to(storage, KEY).map(|_| ())
}

/// Read back everything: open, read each tensor, verify.
fn read_back(storage: &dyn Storage) -> weightbay::Result<()> {
    let reader = Reader::open(storage.open(KEY)?)?;
    for info in reader.tensors() {
        reader.read(info.name())?;
    }
    reader.verify().map(|_| ())
}

/// Fails each I/O operation of a write-then-read workload in turn: the error reaches the
/// caller naming the operation, and the key holds the old or the new container, complete and
/// verifying, never anything else, with nothing left behind.
pub fn fault_at_every_operation<H: Harness>(harness: &H) -> Outcome {
    let case = "fault_at_every_operation";
    let old = sample(&[3000, 100], 1);
    let new = sample(&[100_000, 70_000, 20, 0, 90_000], 2);
    let counting = Faulty::counting(harness.fresh());
    old.writer()
        .write_to(&counting, KEY)
        .unwrap_or_else(|e| fail!(case, "write old: {e}"));
    let before = counting.operations();
    write_new(&counting, &new)
        .and_then(|()| read_back(&counting))
        .unwrap_or_else(|e| fail!(case, "workload: {e}"));
    let total = counting.operations() - before;
    for n in 1..=total {
        let storage = harness.fresh();
        old.writer()
            .write_to(&storage, KEY)
            .unwrap_or_else(|e| fail!(case, "write old: {e}"));
        let faulty = Faulty::failing_at(harness.reopen(&storage), n);
        let result = write_new(&faulty, &new).and_then(|()| read_back(&faulty));
        match result {
            Err(e) if is_injected(&e) => {}
            Err(e) => fail!(
                case,
                "fault at operation {n} of {total}: the error lost the cause: {e}"
            ),
            Ok(()) => fail!(
                case,
                "fault at operation {n} of {total} was swallowed: the workload succeeded"
            ),
        }
        let context = format!("fault at operation {n} of {total}");
        let reopened = harness.reopen(&storage);
        assert_holds_one_of(
            case,
            &context,
            &reopened,
            KEY,
            &[Some(&old.bytes()), Some(&new.bytes())],
        );
        assert_nothing_pending(case, &context, &reopened);
    }
    Outcome::Checked
}

/// Fails each file-system operation of a durable overwrite, a create-new and the read back in
/// turn (not a crash: the system keeps running), then looks at the live disk: the error reaches
/// the caller with the injected fault in its cause chain, the key holds the old or the new
/// container, readable and verifying (nothing or the new one, for create-new), and no other
/// file is left that [`Storage::pending`] does not report.
pub fn file_system_fault_at_every_operation<H: Harness>(harness: &H) -> Outcome {
    let case = "file_system_fault_at_every_operation";
    let over = |fs: Arc<dyn FileSystem>| harness.over_file_system(fs);
    if over(Arc::new(SimulatedDisk::new())).is_none() {
        return Outcome::NotApplicable(NO_FILE_SYSTEM.into());
    }
    let storage_over = |fs: Arc<dyn FileSystem>| {
        over(fs).unwrap_or_else(|| fail!(case, "over_file_system stopped answering"))
    };
    let old = sample(&[3000, 100], 1);
    let new = sample(&[20_000, 300, 9000], 2);
    for mode in [WriteMode::Overwrite, WriteMode::CreateNew] {
        let key = key_for(mode);
        let workload = |storage: &H::Storage| {
            new.writer()
                .with_mode(mode)
                .with_durability(Durability::Durable)
                .write_to(storage, key)?;
            let reader = Reader::open(storage.open(key)?)?;
            for info in reader.tensors() {
                reader.read(info.name())?;
            }
            reader.verify().map(|_| ())
        };
        let setup = || {
            let disk = SimulatedDisk::new();
            old.writer()
                .with_durability(Durability::Durable)
                .write_to(&storage_over(Arc::new(disk.clone())), KEY)
                .unwrap_or_else(|e| fail!(case, "write old: {e}"));
            disk
        };
        let disk = setup();
        let plan = FaultPlan::counting();
        workload(&storage_over(Arc::new(FaultyFileSystem::new(
            Arc::new(disk),
            plan.clone(),
        ))))
        .unwrap_or_else(|e| fail!(case, "{mode:?} workload without a fault: {e}"));
        let total = plan.operations();
        for n in 1..=total {
            let disk = setup();
            let before = disk.files();
            let plan = FaultPlan::failing_at(n);
            let faulty = FaultyFileSystem::new(Arc::new(disk.clone()), plan.clone());
            let failed = |plan: &FaultPlan| plan.injected().map_or("", |fault| fault.name);
            let mut context = format!("{mode:?}: file-system operation {n} of {total} failed");
            let succeeded = match workload(&storage_over(Arc::new(faulty))) {
                // A backend may get past a failed step it can do without (a best-effort
                // cleanup), never past a failed sync of a durable write.
                Ok(()) if ["fsync", "sync_dir"].contains(&failed(&plan)) => fail!(
                    case,
                    "{context} ({}), and the durable write reported success",
                    failed(&plan)
                ),
                Ok(()) => true,
                Err(e) if !is_injected(&e) => fail!(
                    case,
                    "{context} ({}): the error lost its cause (no InjectedFault in its source chain): {e}",
                    failed(&plan)
                ),
                Err(_) => false,
            };
            context = format!("{context} ({})", failed(&plan));
            let live = storage_over(Arc::new(disk.clone()));
            assert_old_or_new(
                case,
                &context,
                &live,
                mode,
                &old,
                &new,
                succeeded.then_some("after the workload succeeded"),
            );
            if let Some(vanished) = before.difference(&disk.files()).next() {
                fail!(case, "{context}: {} vanished", vanished.display());
            }
            let pending = if live.capabilities().pending_listing {
                live.pending()
                    .unwrap_or_else(|e| fail!(case, "{context}: pending(): {e}"))
            } else {
                Vec::new()
            };
            let key_path = |path: &std::path::Path| path.ends_with(key);
            for extra in disk.files().difference(&before) {
                let reported = pending.iter().any(|p| extra.ends_with(p));
                if !key_path(extra) && !reported {
                    fail!(
                        case,
                        "{context}: {} was left behind and pending() does not report it",
                        extra.display()
                    );
                }
            }
        }
    }
    Outcome::Checked
}

/// Loses power after each file-system operation of a durable overwrite and of a durable
/// create-new, on a simulated disk that keeps written and durable bytes apart: every crash
/// image holds the old or the new container (or nothing, for create-new), and once `commit`
/// has returned, the new one.
pub fn power_loss_at_every_operation<H: Harness>(harness: &H) -> Outcome {
    let case = "power_loss_at_every_operation";
    let over = |disk: &SimulatedDisk| {
        harness.over_file_system(Arc::new(disk.clone()) as Arc<dyn FileSystem>)
    };
    if over(&SimulatedDisk::new()).is_none() {
        return Outcome::NotApplicable(NO_FILE_SYSTEM.into());
    }
    let old = sample(&[3000, 100], 1);
    let new = sample(&[20_000, 300, 9000], 2);
    for mode in [WriteMode::Overwrite, WriteMode::CreateNew] {
        let key = key_for(mode);
        let write = |storage: &H::Storage, spec: &ContainerSpec| {
            spec.writer()
                .with_mode(mode)
                .with_durability(Durability::Durable)
                .write_to(storage, key)
                .map(|_| ())
        };
        let setup = || {
            let disk = SimulatedDisk::new();
            let storage =
                over(&disk).unwrap_or_else(|| fail!(case, "over_file_system stopped answering"));
            old.writer()
                .with_durability(Durability::Durable)
                .write_to(&storage, KEY)
                .unwrap_or_else(|e| fail!(case, "write old: {e}"));
            (disk, storage)
        };
        let (disk, storage) = setup();
        let before = disk.operations();
        write(&storage, &new)
            .unwrap_or_else(|e| fail!(case, "{mode:?} write without a crash: {e}"));
        let total = disk.operations() - before;
        for n in 0..=total {
            let (disk, storage) = setup();
            disk.crash_after(n);
            let committed = write(&storage, &new).is_ok();
            let image = disk.crash_image();
            let rebooted =
                over(&image).unwrap_or_else(|| fail!(case, "over_file_system stopped answering"));
            let context = format!("{mode:?}: power lost after operation {n} of {total}");
            assert_old_or_new(
                case,
                &context,
                &rebooted,
                mode,
                &old,
                &new,
                committed.then_some("after commit returned"),
            );
        }
    }
    Outcome::Checked
}

/// The name libtest gives the test `case` generated in module `module_path` (the crate name
/// dropped).
pub fn test_path(module_path: &str, case: &str) -> String {
    match module_path.split_once("::") {
        Some((_, rest)) => format!("{rest}::{case}"),
        None => case.to_string(),
    }
}

const CHILD_ENV: &str = "WEIGHTBAY_CONFORMANCE_CRASH_CHILD";

/// Where the crash case's child dies: between the backend's own inner operations (file-system
/// calls, store requests) when the harness can apply faults there, else between storage
/// operations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum KillLayer {
    Inner,
    Storage,
}

/// Reopens `locator` in this process with `plan` applied at `layer`.
fn reopen_with_plan<H: Harness>(
    harness: &H,
    locator: &str,
    layer: KillLayer,
    plan: FaultPlan,
) -> Option<Box<dyn Storage>> {
    match layer {
        KillLayer::Inner => harness
            .reopen_at_with_faults(locator, plan)
            .map(|s| Box::new(s) as Box<dyn Storage>),
        KillLayer::Storage => harness
            .reopen_at(locator)
            .map(|s| Box::new(Faulty::new(s, plan)) as Box<dyn Storage>),
    }
}

/// A child process overwrites the old container with the new one (and, where create-new is
/// declared, creates the new one at a free key) and is SIGKILLed after each operation in turn:
/// each of the backend's inner operations where the harness offers
/// [`Harness::reopen_at_with_faults`], else each storage operation. The key then holds the old
/// or the new container (nothing or the new one, for create-new), and
/// [`Storage::clean_pending`] removes what the dead writer left.
///
/// `this_test` is the test name of the test calling this (the child re-runs it).
pub fn process_crash_at_every_step<H: Harness>(harness: &H, this_test: &str) -> Outcome {
    let case = "process_crash_at_every_step";
    let new = several_parts(harness, 2);
    let old = sample(&[3000, 100], 1);
    let write = |storage: &dyn Storage, mode: WriteMode| {
        let key = key_for(mode);
        new.writer()
            .with_mode(mode)
            .write_to(storage, key)
            .map(|_| ())
    };
    if let Ok(spec) = std::env::var(CHILD_ENV) {
        // In the child: write, and die at the chosen operation.
        let mut parts = spec.splitn(4, ':');
        let (Some(layer), Some(mode), Some(kill_at), Some(locator)) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            fail!(case, "bad child spec {spec}")
        };
        let layer = if layer == "inner" {
            KillLayer::Inner
        } else {
            KillLayer::Storage
        };
        let mode = if mode == "create-new" {
            WriteMode::CreateNew
        } else {
            WriteMode::Overwrite
        };
        let kill_at: u64 = kill_at
            .parse()
            .unwrap_or_else(|_| fail!(case, "bad crash point {kill_at}"));
        let storage = reopen_with_plan(harness, locator, layer, FaultPlan::killing_at(kill_at))
            .unwrap_or_else(|| fail!(case, "child cannot reopen {locator}"));
        let _ = write(&*storage, mode);
        std::process::exit(0);
    }
    let Some(locator) = harness.locator(&harness.fresh()) else {
        return Outcome::NotApplicable("the storage does not outlive its process".into());
    };
    let layer = if harness
        .reopen_at_with_faults(&locator, FaultPlan::counting())
        .is_some()
    {
        KillLayer::Inner
    } else {
        KillLayer::Storage
    };
    let mut modes = vec![WriteMode::Overwrite];
    if harness.fresh().capabilities().atomic_create_new {
        modes.push(WriteMode::CreateNew);
    }
    let exe = std::env::current_exe().unwrap_or_else(|e| fail!(case, "current_exe: {e}"));
    for mode in modes {
        // A fresh storage holding the old container, and where to reopen it.
        let setup = || {
            let storage = harness.fresh();
            let locator = harness
                .locator(&storage)
                .unwrap_or_else(|| fail!(case, "the harness stopped giving locators"));
            old.writer()
                .write_to(&storage, KEY)
                .unwrap_or_else(|e| fail!(case, "write old: {e}"));
            locator
        };
        let plan = FaultPlan::counting();
        let counting = reopen_with_plan(harness, &setup(), layer, plan.clone())
            .unwrap_or_else(|| fail!(case, "cannot reopen {locator}"));
        write(&*counting, mode).unwrap_or_else(|e| fail!(case, "{mode:?} workload: {e}"));
        let total = plan.operations();
        for n in 1..=total {
            let locator = setup();
            let status = std::process::Command::new(&exe)
                .args([this_test, "--exact", "--nocapture", "--test-threads=1"])
                .env(
                    CHILD_ENV,
                    format!(
                        "{}:{}:{n}:{locator}",
                        if layer == KillLayer::Inner {
                            "inner"
                        } else {
                            "storage"
                        },
                        if mode == WriteMode::CreateNew {
                            "create-new"
                        } else {
                            "overwrite"
                        }
                    ),
                )
                .stdout(std::process::Stdio::null())
                .status()
                .unwrap_or_else(|e| fail!(case, "spawning the child: {e}"));
            let context = format!(
                "{mode:?}: writer killed after {layer:?} operation {n} of {total} (child status {status})"
            );
            if status.success() {
                fail!(case, "{context}: the child was not killed");
            }
            let reopened = harness
                .reopen_at(&locator)
                .unwrap_or_else(|| fail!(case, "cannot reopen {locator}"));
            assert_old_or_new(case, &context, &reopened, mode, &old, &new, None);
            if reopened.capabilities().pending_listing {
                reopened
                    .clean_pending()
                    .unwrap_or_else(|e| fail!(case, "{context}: clean_pending: {e}"));
                assert_nothing_pending(case, &format!("{context}, after clean_pending"), &reopened);
            }
        }
    }
    Outcome::Checked
}

/// A source opened before an overwrite keeps reading the old container, or fails with
/// [`ErrorKind::Changed`], never the new bytes: checked on a read past what the backend may
/// have fetched at open, after the overwrite has committed. Readers racing a writer open the key
/// every time (it exists throughout) and see one whole version each time, or `Changed`.
pub fn readers_keep_their_version<H: Harness>(harness: &H) -> Outcome {
    let case = "readers_keep_their_version";
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
    let writing = std::sync::atomic::AtomicBool::new(true);
    std::thread::scope(|scope| {
        let writer = scope.spawn(|| {
            for round in 0..20 {
                let v = round % 4;
                version(v, v as u8)
                    .writer()
                    .write_to(&storage, KEY)
                    .unwrap_or_else(|e| fail!(case, "writer: {e}"));
            }
            writing.store(false, std::sync::atomic::Ordering::SeqCst);
        });
        let readers: Vec<_> = (0..2)
            .map(|_| {
                scope.spawn(|| {
                let mut reads = 0;
                while reads < 40 || writing.load(std::sync::atomic::Ordering::SeqCst) {
                    reads += 1;
                    let source = storage.open(KEY).unwrap_or_else(|e| {
                        fail!(
                            case,
                            "opening a key that exists throughout an overwrite failed with {:?}: {e}",
                            e.kind()
                        )
                    });
                    let mut bytes = vec![0; usize::try_from(source.len()).unwrap_or(0)];
                    match source.read_at(0, &mut bytes) {
                        Ok(()) if versions.contains(&bytes) => {}
                        Ok(()) => fail!(
                            case,
                            "a reader racing the writer saw {} bytes of no single version",
                            bytes.len()
                        ),
                        Err(e) if e.kind() == ErrorKind::Changed => {}
                        Err(e) => fail!(
                            case,
                            "a reader racing the writer failed with {:?} instead of Changed: {e}",
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

/// [`Source::fetch`](weightbay::Source::fetch) of random range lists (unordered, overlapping,
/// repeated, empty, spanning several parts) gives exactly what `read_at` gives for each range,
/// in the order asked; a list with one range past the end fails whole with `OutOfRange`.
pub fn batched_reads_match_single_reads<H: Harness>(harness: &H) -> Outcome {
    let case = "batched_reads_match_single_reads";
    let storage = harness.fresh();
    let spec = several_parts(harness, 7);
    spec.writer()
        .write_to(&storage, KEY)
        .unwrap_or_else(|e| fail!(case, "write: {e}"));
    let source = storage
        .open(KEY)
        .unwrap_or_else(|e| fail!(case, "open: {e}"));
    let len = source.len();
    let ranges = proptest::collection::vec((0..=len, 0u64..200_000), 0..12).prop_map(move |v| {
        v.into_iter()
            .map(|(start, span)| start..start.saturating_add(span).min(len))
            .collect::<Vec<_>>()
    });
    run_property(case, ranges, |ranges| {
        let fetched = source
            .fetch(&ranges)
            .map_err(|e| TestCaseError::fail(format!("fetch: {e}")))?;
        prop_assert_eq!(fetched.len(), ranges.len(), "one result per range");
        for (range, bytes) in ranges.iter().zip(&fetched) {
            let mut single = vec![0; (range.end - range.start) as usize];
            source
                .read_at(range.start, &mut single)
                .map_err(|e| TestCaseError::fail(format!("read_at: {e}")))?;
            let batched = bytes
                .to_vec()
                .map_err(|e| TestCaseError::fail(format!("reading fetched bytes: {e}")))?;
            prop_assert!(batched == single, "fetch of {range:?} differs from read_at");
        }
        Ok(())
    });
    let past_end = [0..10, len - 1..len + 1, 5..6];
    match source.fetch(&past_end) {
        Err(e) if e.kind() == ErrorKind::OutOfRange => {}
        other => fail!(
            case,
            "a range past the end: expected OutOfRange, got {:?}",
            other.map(|v| v.len()).map_err(|e| e.kind())
        ),
    }
    Outcome::Checked
}

/// Truncated, bit-flipped and hostile containers stored in the backend give typed errors on
/// open, read and verify, never a panic; a flipped tensor byte fails verify naming the tensor.
pub fn corrupt_containers_fail_cleanly<H: Harness>(harness: &H) -> Outcome {
    let case = "corrupt_containers_fail_cleanly";
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

/// Writing 64 deferred tensors of 4 MiB through the backend keeps the peak of live heap bytes
/// within one tensor, the writer's buffer, and the backend's declared buffer bound.
pub fn peak_memory_is_bounded<H: Harness>(harness: &H, allocator: &CountingAllocator) -> Outcome {
    let case = "peak_memory_is_bounded";
    const TENSORS: usize = 64;
    const TENSOR_LEN: usize = 4 << 20;
    let storage = harness.fresh();
    let tensors: Vec<Tensor> = (0..TENSORS)
        .map(|i| {
            Tensor::deferred(
                format!("t{i:02}"),
                DType::U8,
                [TENSOR_LEN as u64],
                TENSOR_LEN as u64,
                move || Ok(Bytes::from(vec![i as u8; TENSOR_LEN])),
            )
        })
        .collect();
    let writer = Writer::new(tensors);
    let total = writer.size().unwrap_or_else(|e| fail!(case, "size: {e}"));
    let baseline = allocator.reset();
    writer
        .write_to(&storage, KEY)
        .unwrap_or_else(|e| fail!(case, "write_to: {e}"));
    let peak = allocator.peak().saturating_sub(baseline) as u64;
    let slack = 2 << 20;
    let bound = TENSOR_LEN as u64
        + weightbay::WRITE_CHUNK_LEN as u64
        + harness.write_buffer_bound(total)
        + slack;
    println!("{case}: peak {peak} bytes live while writing {total} bytes (bound {bound})");
    if peak > bound {
        fail!(
            case,
            "writing {total} bytes peaked at {peak} live heap bytes, over the bound of {bound}"
        );
    }
    Outcome::Checked
}

/// The checkpoint lifecycle (`weightbay::checkpoints`) on the backend: saves in both formats,
/// one sharded, are listed, the newest is `latest`, and each verifies against its commit
/// record; a save failing at each storage operation in turn never becomes a checkpoint and
/// leaves nothing that `gc` does not remove once a later save completes; retention keeps what
/// it says, deleting all of the rest; of two savers racing for one step (where create-new is
/// declared) exactly one commits and the other leaves nothing.
pub fn checkpoint_lifecycle<H: Harness>(harness: &H) -> Outcome {
    let case = "checkpoint_lifecycle";
    let storage = harness.fresh();
    if !storage.capabilities().listing {
        return Outcome::NotApplicable("the backend does not list its containers".into());
    }
    let shared: Arc<dyn Storage> = Arc::new(harness.reopen(&storage));
    let checkpoints = Checkpoints::over(Arc::clone(&shared), "ckpt");
    let container = |step: u64, format: Format| {
        let spec = sample(&[300 + step as usize, 7000, 40], step as u8);
        let tensors = spec
            .tensors
            .iter()
            .map(|t| Tensor::new(&t.name, t.dtype.clone(), t.shape.clone(), t.data.clone()))
            .collect();
        Writer::new(tensors).with_format(format)
    };
    let saves = [
        (1, Format::Burnpack, SaveOptions::default()),
        (2, Format::Safetensors, SaveOptions::sharded(4000)),
        (3, Format::Burnpack, SaveOptions::sharded(4000)),
    ];
    for (step, format, options) in saves {
        checkpoints
            .save_with(step, container(step, format), options)
            .unwrap_or_else(|e| fail!(case, "saving step {step}: {e}"));
    }
    let steps = |context: &str| {
        checkpoints
            .steps()
            .unwrap_or_else(|e| fail!(case, "{context}: listing the checkpoints: {e}"))
    };
    if steps("after three saves") != [1, 2, 3] {
        fail!(case, "three saves list as {:?}", steps("again"));
    }
    for step in [1, 2, 3] {
        let checkpoint = checkpoints
            .open(step)
            .unwrap_or_else(|e| fail!(case, "opening step {step}: {e}"));
        if let Err(e) = checkpoint.verify() {
            fail!(case, "step {step} does not verify: {e}");
        }
    }
    match checkpoints.latest() {
        Ok(Some(latest)) if latest.step() == 3 => {}
        other => fail!(
            case,
            "latest is not step 3: {:?}",
            other.map(|c| c.map(|c| c.step()))
        ),
    }

    // A save of step 4 failing at each storage operation in turn.
    for fail_at in 1.. {
        let faulty: Arc<dyn Storage> =
            Arc::new(Faulty::failing_at(harness.reopen(&storage), fail_at));
        let result = Checkpoints::over(faulty, "ckpt").save(4, container(4, Format::Burnpack));
        let context = format!("a save failing at operation {fail_at}");
        match result {
            Ok(_) => break,
            Err(e) if !crate::is_injected(&e) => {
                fail!(case, "{context} failed with its own error: {e}")
            }
            Err(_) => {}
        }
        if steps(&context) != [1, 2, 3] {
            fail!(case, "{context}: the checkpoints are {:?}", steps(&context));
        }
    }
    if steps("after the save of step 4 succeeded") != [1, 2, 3, 4] {
        fail!(
            case,
            "after step 4 saved, the checkpoints are {:?}",
            steps("again")
        );
    }
    if let Err(e) = checkpoints.gc() {
        fail!(case, "gc: {e}");
    }
    // Every key left is a commit record or a container one names.
    let statuses = checkpoints
        .list()
        .unwrap_or_else(|e| fail!(case, "listing: {e}"));
    let named: std::collections::BTreeSet<String> = statuses
        .iter()
        .filter_map(|s| s.record.as_ref())
        .flat_map(|r| {
            let dir = checkpoints.step_dir(r.step);
            r.containers
                .iter()
                .map(move |c| format!("{dir}/{}", c.key))
                .chain(std::iter::once(format!(
                    "{}/commit.json",
                    checkpoints.step_dir(r.step)
                )))
        })
        .collect();
    let listed = shared
        .list("ckpt")
        .unwrap_or_else(|e| fail!(case, "listing ckpt: {e}"));
    if let Some(stray) = listed.iter().find(|l| !named.contains(&l.key)) {
        fail!(
            case,
            "after gc, `{}` is left that no commit record names",
            stray.key
        );
    }

    match checkpoints.retain(&Retention::keep_last(2)) {
        Ok(deleted) if deleted == [1, 2] => {}
        other => fail!(
            case,
            "retention of the last 2 deleted {other:?}, not steps 1 and 2"
        ),
    }
    let left = shared
        .list("ckpt")
        .unwrap_or_else(|e| fail!(case, "listing ckpt: {e}"));
    if let Some(stale) = left
        .iter()
        .find(|l| l.key.starts_with("ckpt/step-1/") || l.key.starts_with("ckpt/step-2/"))
    {
        fail!(case, "retention left `{}` behind", stale.key);
    }

    if storage.capabilities().atomic_create_new {
        let racers: Vec<_> = (0..2u8)
            .map(|i| {
                let checkpoints = Checkpoints::over(Arc::clone(&shared), "ckpt");
                let writer = container(5 + u64::from(i), Format::Burnpack);
                std::thread::spawn(move || checkpoints.save(5, writer))
            })
            .collect();
        let results: Vec<_> = racers
            .into_iter()
            .map(|r| {
                r.join()
                    .unwrap_or_else(|_| fail!(case, "a racing saver panicked"))
            })
            .collect();
        let won = results.iter().filter(|r| r.is_ok()).count();
        let lost_cleanly = results
            .iter()
            .filter(|r| matches!(r, Err(e) if e.kind() == ErrorKind::AlreadyExists))
            .count();
        if (won, lost_cleanly) != (1, 1) {
            fail!(case, "two savers racing for step 5: {results:?}");
        }
        let stored = shared
            .list("ckpt/step-5")
            .unwrap_or_else(|e| fail!(case, "listing step 5: {e}"));
        let record = checkpoints
            .open(5)
            .unwrap_or_else(|e| fail!(case, "opening step 5: {e}"));
        if stored.len() != record.record().containers.len() + 1 {
            fail!(case, "the losing saver left files behind: {stored:?}");
        }
    }
    Outcome::Checked
}

/// Multi-rank checkpoints on a backend that lists and creates new atomically: ranks commit
/// exactly once without a coordinator, nobody sees the step complete before every rank's
/// manifest is written, a restarted rank is idempotent, a second process running as a rank
/// with other content is refused by name, two ranks that both see every manifest commit
/// once, so do six ranks finishing together, slices that overlap are refused, a save failing
/// at any operation never leaves a damaged step, and every layout loads the same bytes.
pub fn multi_rank_commit<H: Harness>(harness: &H) -> Outcome {
    let case = "multi_rank_commit";
    let storage = harness.fresh();
    let capabilities = storage.capabilities();
    if !capabilities.listing || !capabilities.atomic_create_new {
        return Outcome::NotApplicable(
            "the backend does not both list and create new atomically".into(),
        );
    }
    let shared: Arc<dyn Storage> = Arc::new(harness.reopen(&storage));
    let checkpoints = Checkpoints::over(Arc::clone(&shared), "ranked");
    let world = 4u32;
    let model = |step: u64| SlicedModel::small(step, 9 + step);
    let save = |checkpoints: &Checkpoints, step: u64, rank: u32| {
        let format = if step.is_multiple_of(2) {
            Format::Safetensors
        } else {
            Format::Burnpack
        };
        let save = model(step).rank_save(rank, world, |t| Writer::new(t).with_format(format));
        checkpoints.save_rank(step, save)
    };
    let stored = |context: &str| -> Vec<String> {
        let mut keys: Vec<String> = shared
            .list("ranked")
            .unwrap_or_else(|e| fail!(case, "{context}: listing: {e}"))
            .into_iter()
            .map(|l| l.key)
            .collect();
        keys.sort();
        keys
    };
    let check_loads = |step: u64, context: &str| {
        let checkpoint = checkpoints
            .open(step)
            .unwrap_or_else(|e| fail!(case, "{context}: opening step {step}: {e}"));
        if let Err(e) = checkpoint.verify() {
            fail!(case, "{context}: step {step} does not verify: {e}");
        }
        let weights = checkpoint
            .assembled()
            .unwrap_or_else(|e| fail!(case, "{context}: step {step}: {e}"));
        let model = model(step);
        // Whole, and in the layouts of 1, 3 and 4 ranks split along every dimension.
        for t in &model.tensors {
            let mut regions = vec![Region::whole(&t.shape)];
            for dim in 0..t.shape.len() {
                for parts in [3, 4] {
                    regions.extend((0..parts).map(|k| Region::split(&t.shape, dim, parts, k)));
                }
            }
            for region in regions {
                let read = weights
                    .read_region(&t.name, &region)
                    .and_then(|b| b.to_vec())
                    .unwrap_or_else(|e| {
                        fail!(
                            case,
                            "{context}: step {step}: reading {} {region:?}: {e}",
                            t.name
                        )
                    });
                if read != model.region_bytes(t, &region) {
                    fail!(
                        case,
                        "{context}: step {step}: {} {region:?} differs",
                        t.name
                    );
                }
            }
        }
    };

    // Ranks 0..2 finish: the step is not a checkpoint until rank 3 does.
    for rank in 0..3 {
        match save(&checkpoints, 1, rank) {
            Ok(RankOutcome::Written { missing }) if missing.contains(&3) => {}
            other => fail!(case, "rank {rank} of 4 alone: {other:?}"),
        }
    }
    let status = checkpoints
        .list()
        .unwrap_or_else(|e| fail!(case, "listing: {e}"));
    match status.as_slice() {
        [s] if s.state == StepState::Uncommitted
            && s.ranks.as_ref().is_some_and(|p| p.missing() == [3]) => {}
        other => fail!(case, "with rank 3 missing, the steps list as {other:?}"),
    }
    if !matches!(checkpoints.latest(), Ok(None)) {
        fail!(case, "a step missing rank 3 is the latest checkpoint");
    }
    // A second process running as rank 1 with other content is refused, by rank.
    let before = stored("before the impostor");
    let impostor = model(99).rank_save(1, world, Writer::new);
    match checkpoints.save_rank(1, impostor) {
        Err(e) if e.kind() == ErrorKind::AlreadyExists && e.to_string().contains("rank 1") => {}
        other => fail!(case, "a second rank 1 with other content: {other:?}"),
    }
    // A restart of rank 1 with the same content is fine; neither leaves anything behind.
    match save(&checkpoints, 1, 1) {
        Ok(RankOutcome::Written { .. }) => {}
        other => fail!(case, "rank 1 restarted: {other:?}"),
    }
    if stored("after the restart") != before {
        fail!(
            case,
            "a refused or repeated rank left files: {:?}",
            stored("again")
        );
    }
    match save(&checkpoints, 1, 3) {
        Ok(RankOutcome::Committed(record)) if record.world_size == Some(world) => {}
        other => fail!(case, "the last rank did not commit: {other:?}"),
    }
    check_loads(1, "after the last rank");
    // Every rank restarting after the commit is told it is committed, and changes nothing.
    let committed = stored("after the commit");
    for rank in 0..world {
        match save(&checkpoints, 1, rank) {
            Ok(RankOutcome::CommittedByAnother(_)) => {}
            other => fail!(case, "rank {rank} restarted after the commit: {other:?}"),
        }
    }
    if stored("after restarts") != committed {
        fail!(case, "restarts after the commit changed the files");
    }

    // Two ranks that both see every manifest race to commit: one record, both succeed.
    for rank in 0..2 {
        if let Err(e) = save(&checkpoints, 2, rank) {
            fail!(case, "step 2, rank {rank}: {e}");
        }
    }
    let both_done = Arc::new(Barrier::new(2));
    let racers: Vec<_> = (2..4u32)
        .map(|rank| {
            let checkpoints = checkpoints.clone();
            let both_done = Arc::clone(&both_done);
            let rank_save = model(2)
                .rank_save(rank, world, |t| {
                    Writer::new(t).with_format(Format::Safetensors)
                })
                .with_rendezvous(move || {
                    both_done.wait();
                    Ok(true)
                });
            std::thread::spawn(move || checkpoints.save_rank(2, rank_save))
        })
        .collect();
    let outcomes: Vec<_> = racers
        .into_iter()
        .map(|r| {
            r.join()
                .unwrap_or_else(|_| fail!(case, "a racing rank panicked"))
        })
        .collect();
    let records: Vec<_> = outcomes
        .iter()
        .map(|o| match o {
            Ok(outcome) => outcome.record().cloned(),
            Err(e) => fail!(case, "a rank racing to commit failed: {e}"),
        })
        .collect();
    let won = outcomes
        .iter()
        .filter(|o| matches!(o, Ok(RankOutcome::Committed(_))))
        .count();
    if won != 1 || records[0].is_none() || records[0] != records[1] {
        fail!(case, "two ranks racing to commit: {outcomes:?}");
    }
    check_loads(2, "after the race");

    // Six ranks finishing together through the listing: one commits, the others that see
    // every manifest leave it to that one (the commit intent), and it loads.
    let together = Arc::new(Barrier::new(6));
    let ranks: Vec<_> = (0..6u32)
        .map(|rank| {
            let (checkpoints, together) = (checkpoints.clone(), Arc::clone(&together));
            let rank_save = SlicedModel::small(6, 15).rank_save(rank, 6, Writer::new);
            std::thread::spawn(move || {
                together.wait();
                checkpoints.save_rank(6, rank_save)
            })
        })
        .collect();
    let outcomes: Vec<_> = ranks
        .into_iter()
        .map(|r| {
            r.join()
                .unwrap_or_else(|_| fail!(case, "a rank finishing together panicked"))
        })
        .collect();
    let committed = outcomes
        .iter()
        .filter(|o| matches!(o, Ok(RankOutcome::Committed(_))))
        .count();
    if committed != 1 || outcomes.iter().any(Result::is_err) {
        fail!(case, "six ranks finishing together: {outcomes:?}");
    }
    let weights = checkpoints
        .open(6)
        .and_then(|c| c.assembled())
        .unwrap_or_else(|e| fail!(case, "opening step 6: {e}"));
    for t in &SlicedModel::small(6, 15).tensors {
        match weights.read(&t.name).and_then(|b| b.to_vec()) {
            Ok(bytes) if bytes == t.bytes => {}
            other => fail!(case, "step 6: {} reads as {other:?}", t.name),
        }
    }

    // Slices that overlap are refused at commit, naming the tensor; the step stays
    // uncommitted.
    for rank in 0..world {
        let overlapping = model(3).rank_save(rank, world, Writer::new).with_slice(
            "bias",
            [7],
            Region::new([0], [7]),
        );
        let mut tensors = Vec::new();
        if rank < 3 {
            tensors.push(Tensor::from_slice("bias", [7], &[rank as f32; 7]));
        }
        let save = if rank < 3 {
            RankSave::new(rank, world, Writer::new(tensors)).with_slice(
                "bias",
                [7],
                Region::new([0], [7]),
            )
        } else {
            overlapping
        };
        let result = checkpoints.save_rank(3, save);
        match (rank, result) {
            (0..3, Ok(RankOutcome::Written { .. })) => {}
            (3, Err(e))
                if e.kind() == ErrorKind::InvalidInput && e.to_string().contains("`bias`") => {}
            (_, other) => fail!(case, "overlapping slices of `bias`, rank {rank}: {other:?}"),
        }
    }

    // A rank failing at each storage operation in turn never leaves step 4 damaged, and a
    // rerun commits it.
    for rank in 0..3 {
        if let Err(e) = save(&checkpoints, 4, rank) {
            fail!(case, "step 4, rank {rank}: {e}");
        }
    }
    for fail_at in 1.. {
        let faulty: Arc<dyn Storage> =
            Arc::new(Faulty::failing_at(harness.reopen(&storage), fail_at));
        let result = save(&Checkpoints::over(faulty, "ranked"), 4, 3);
        let context = format!("rank 3 failing at operation {fail_at}");
        let state = checkpoints
            .list()
            .unwrap_or_else(|e| fail!(case, "{context}: listing: {e}"))
            .into_iter()
            .find(|s| s.step == 4)
            .map(|s| s.state);
        match (&result, state) {
            (Err(e), _) if !is_injected(e) => fail!(case, "{context}: its own error: {e}"),
            (_, Some(StepState::Damaged(why))) => {
                fail!(case, "{context}: step 4 is damaged: {why}")
            }
            (Ok(_), Some(StepState::Complete)) => break,
            (Ok(outcome), state) => fail!(case, "{context}: {outcome:?} but step 4 is {state:?}"),
            (Err(_), _) => {}
        }
    }
    match save(&checkpoints, 4, 3) {
        Ok(RankOutcome::CommittedByAnother(_)) => {}
        other => fail!(case, "rank 3 rerun after the failures: {other:?}"),
    }
    check_loads(4, "after failures");

    // gc keeps every committed step's manifests and containers, and removes the step that
    // never committed once a newer one did.
    if let Err(e) = checkpoints.gc() {
        fail!(case, "gc: {e}");
    }
    if stored("after gc")
        .iter()
        .any(|k| k.starts_with("ranked/step-3/"))
    {
        fail!(
            case,
            "gc left the uncommitted step 3: {:?}",
            stored("again")
        );
    }
    for step in [1, 2, 4] {
        check_loads(step, "after gc");
    }
    if checkpoints.steps().ok().as_deref() != Some(&[1, 2, 4, 6]) {
        fail!(
            case,
            "after gc the checkpoints are {:?}",
            checkpoints.steps()
        );
    }
    match save(&checkpoints, 2, 0) {
        Ok(RankOutcome::CommittedByAnother(_)) => {}
        other => fail!(case, "rank 0 of step 2 restarted after gc: {other:?}"),
    }
    Outcome::Checked
}
