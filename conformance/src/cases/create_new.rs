//! Create-new and commits that race: a taken key refused and left intact, one winner among
//! writers racing for a key (small containers and ones of many parts), the race taken step by
//! step on a simulated disk, and two sinks on one key committed in either order.

use std::sync::{Arc, Barrier};

use weightbay::{CreateOptions, ErrorKind, Storage, WriteMode};

use crate::holdings::{KEY, assert_holds_one_of, assert_nothing_pending, several_parts};
use crate::lockstep::Lockstep;
use crate::outcome::{NO_FILE_SYSTEM, Outcome, fail};
use crate::strategies::{ContainerSpec, sample};
use crate::{Harness, SimulatedDisk};

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
