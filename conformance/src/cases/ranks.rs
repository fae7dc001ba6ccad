//! Multi-rank checkpoints on a backend that lists and creates new atomically, one scenario per
//! case: ranks commit exactly once without a coordinator, nobody sees a step complete before
//! every rank's manifest is written, restarts are idempotent, impostors are refused by rank,
//! racing committers make one record, overlapping slices are refused, a rank failing at any
//! operation never damages its step, gc keeps what is committed, and every rank layout loads
//! the same bytes.

use std::sync::{Arc, Barrier};

use weightbay::{ErrorKind, Format, Result, Storage, Tensor, Writer};
use weightbay_checkpoints::{Checkpoints, RankOutcome, RankSave, Region, StepState};

use crate::gate::{Gate, Rendezvous};
use crate::outcome::{Outcome, fail};
use crate::ranked::SlicedModel;
use crate::{Faulty, Harness, is_injected};

/// The ranks of every step but the six-rank one.
const WORLD: u32 = 4;
/// The prefix the cases save under.
const PREFIX: &str = "ranked";

/// A storage for the rank cases, shared, and the checkpoints over it; `None` when the backend
/// does not both list and create new atomically.
struct Ranked<H: Harness> {
    storage: H::Storage,
    shared: Arc<dyn Storage>,
    checkpoints: Checkpoints,
}

impl<H: Harness> Ranked<H> {
    fn new(harness: &H) -> Option<Self> {
        let storage = harness.fresh();
        let capabilities = storage.capabilities();
        if !capabilities.listing || !capabilities.atomic_create_new {
            return None;
        }
        let shared: Arc<dyn Storage> = Arc::new(harness.reopen(&storage));
        let checkpoints = Checkpoints::over(Arc::clone(&shared), PREFIX);
        Some(Self {
            storage,
            shared,
            checkpoints,
        })
    }

    /// Every key under the prefix, sorted.
    fn stored(&self, case: &str, context: &str) -> Vec<String> {
        let mut keys: Vec<String> = self
            .shared
            .list(PREFIX)
            .unwrap_or_else(|e| fail!(case, "{context}: listing: {e}"))
            .into_iter()
            .map(|l| l.key)
            .collect();
        keys.sort();
        keys
    }

    /// Step `step` opens, verifies, and reads the model's bytes whole and in the layouts of 1,
    /// 3 and 4 ranks split along every dimension.
    fn check_loads(&self, step: u64, case: &str, context: &str) {
        let checkpoint = self
            .checkpoints
            .open(step)
            .unwrap_or_else(|e| fail!(case, "{context}: opening step {step}: {e}"));
        if let Err(e) = checkpoint.verify() {
            fail!(case, "{context}: step {step} does not verify: {e}");
        }
        let weights = checkpoint
            .assembled()
            .unwrap_or_else(|e| fail!(case, "{context}: step {step}: {e}"));
        let model = model(step);
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
    }
}

/// Why the rank cases cannot run.
const NO_RANKS: &str = "the backend does not both list and create new atomically";

/// The model of step `step`, sliced over the ranks.
fn model(step: u64) -> SlicedModel {
    SlicedModel::small(step, 9 + step)
}

/// Saves rank `rank` of step `step` (safetensors on even steps, Burnpack on odd ones).
fn save(checkpoints: &Checkpoints, step: u64, rank: u32) -> Result<RankOutcome> {
    let format = if step.is_multiple_of(2) {
        Format::Safetensors
    } else {
        Format::Burnpack
    };
    let save = model(step).rank_save(rank, WORLD, |t| Writer::new(t).with_format(format));
    checkpoints.save_rank(step, save)
}

/// Saves ranks `ranks` of `step`, each expected to succeed.
fn save_ranks(checkpoints: &Checkpoints, step: u64, ranks: std::ops::Range<u32>, case: &str) {
    for rank in ranks {
        if let Err(e) = save(checkpoints, step, rank) {
            fail!(case, "step {step}, rank {rank}: {e}");
        }
    }
}

/// A step is not a checkpoint until its last rank's manifest is written (listed as missing
/// that rank, and not `latest`); the last rank commits, and every layout loads.
pub fn ranks_commit_when_the_last_finishes<H: Harness>(harness: &H, case: &str) -> Outcome {
    let Some(ranked) = Ranked::new(harness) else {
        return Outcome::NotApplicable(NO_RANKS.into());
    };
    let checkpoints = &ranked.checkpoints;
    for rank in 0..3 {
        match save(checkpoints, 1, rank) {
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
    match save(checkpoints, 1, 3) {
        Ok(RankOutcome::Committed(record)) if record.world_size == Some(WORLD) => {}
        other => fail!(case, "the last rank did not commit: {other:?}"),
    }
    ranked.check_loads(1, case, "after the last rank");
    Outcome::Checked
}

/// A second process running as a rank with other content is refused, naming the rank; a
/// restart with the same content is fine; neither leaves anything behind.
pub fn rank_impostors_are_refused<H: Harness>(harness: &H, case: &str) -> Outcome {
    let Some(ranked) = Ranked::new(harness) else {
        return Outcome::NotApplicable(NO_RANKS.into());
    };
    let checkpoints = &ranked.checkpoints;
    save_ranks(checkpoints, 1, 0..3, case);
    let before = ranked.stored(case, "before the impostor");
    let impostor = model(99).rank_save(1, WORLD, Writer::new);
    match checkpoints.save_rank(1, impostor) {
        Err(e) if e.kind() == ErrorKind::AlreadyExists && e.to_string().contains("rank 1") => {}
        other => fail!(case, "a second rank 1 with other content: {other:?}"),
    }
    match save(checkpoints, 1, 1) {
        Ok(RankOutcome::Written { .. }) => {}
        other => fail!(case, "rank 1 restarted: {other:?}"),
    }
    let after = ranked.stored(case, "after the restart");
    if after != before {
        fail!(case, "a refused or repeated rank left files: {after:?}");
    }
    Outcome::Checked
}

/// Every rank restarting after the commit is told it is committed, and changes nothing.
pub fn rank_restarts_after_commit_change_nothing<H: Harness>(harness: &H, case: &str) -> Outcome {
    let Some(ranked) = Ranked::new(harness) else {
        return Outcome::NotApplicable(NO_RANKS.into());
    };
    let checkpoints = &ranked.checkpoints;
    save_ranks(checkpoints, 1, 0..WORLD, case);
    let committed = ranked.stored(case, "after the commit");
    for rank in 0..WORLD {
        match save(checkpoints, 1, rank) {
            Ok(RankOutcome::CommittedByAnother(_)) => {}
            other => fail!(case, "rank {rank} restarted after the commit: {other:?}"),
        }
    }
    if ranked.stored(case, "after restarts") != committed {
        fail!(case, "restarts after the commit changed the files");
    }
    ranked.check_loads(1, case, "after restarts");
    Outcome::Checked
}

/// Two ranks that both decide to commit (a rendezvous that picks both) race: one record, both
/// succeed with it.
pub fn racing_committers_make_one_record<H: Harness>(harness: &H, case: &str) -> Outcome {
    let Some(ranked) = Ranked::new(harness) else {
        return Outcome::NotApplicable(NO_RANKS.into());
    };
    let checkpoints = &ranked.checkpoints;
    save_ranks(checkpoints, 2, 0..2, case);
    // Bounded: a rank failing before the rendezvous fails the case instead of hanging it.
    let both_done = Arc::new(Rendezvous::new(2));
    let racers: Vec<_> = (2..4u32)
        .map(|rank| {
            let checkpoints = checkpoints.clone();
            let both_done = Arc::clone(&both_done);
            let rank_save = model(2)
                .rank_save(rank, WORLD, |t| {
                    Writer::new(t).with_format(Format::Safetensors)
                })
                .with_rendezvous(move || both_done.wait().map(|()| true));
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
    ranked.check_loads(2, case, "after the race");
    Outcome::Checked
}

/// Six ranks finishing together through the listing: one commits, the others that see every
/// manifest leave it to that one (the commit intent), and the step loads.
pub fn ranks_finishing_together_commit_once<H: Harness>(harness: &H, case: &str) -> Outcome {
    let Some(ranked) = Ranked::new(harness) else {
        return Outcome::NotApplicable(NO_RANKS.into());
    };
    let together = Arc::new(Barrier::new(6));
    let ranks: Vec<_> = (0..6u32)
        .map(|rank| {
            let (checkpoints, together) = (ranked.checkpoints.clone(), Arc::clone(&together));
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
    let weights = ranked
        .checkpoints
        .open(6)
        .and_then(|c| c.assembled())
        .unwrap_or_else(|e| fail!(case, "opening step 6: {e}"));
    for t in &SlicedModel::small(6, 15).tensors {
        match weights.read(&t.name).and_then(|b| b.to_vec()) {
            Ok(bytes) if bytes == t.bytes => {}
            other => fail!(case, "step 6: {} reads as {other:?}", t.name),
        }
    }
    Outcome::Checked
}

/// Slices that overlap are refused at commit, naming the tensor; the step stays uncommitted.
pub fn overlapping_slices_are_refused<H: Harness>(harness: &H, case: &str) -> Outcome {
    let Some(ranked) = Ranked::new(harness) else {
        return Outcome::NotApplicable(NO_RANKS.into());
    };
    let whole_bias = || Region::new([0], [7]);
    for rank in 0..WORLD {
        let save = if rank < 3 {
            let bias = vec![Tensor::from_slice("bias", [7], &[rank as f32; 7])];
            RankSave::new(rank, WORLD, Writer::new(bias)).with_slice("bias", [7], whole_bias())
        } else {
            model(3)
                .rank_save(rank, WORLD, Writer::new)
                .with_slice("bias", [7], whole_bias())
        };
        match (rank, ranked.checkpoints.save_rank(3, save)) {
            (0..3, Ok(RankOutcome::Written { .. })) => {}
            (3, Err(e))
                if e.kind() == ErrorKind::InvalidInput && e.to_string().contains("`bias`") => {}
            (_, other) => fail!(case, "overlapping slices of `bias`, rank {rank}: {other:?}"),
        }
    }
    if ranked.checkpoints.steps().ok().as_deref() != Some(&[]) {
        fail!(case, "a step with overlapping slices is a checkpoint");
    }
    Outcome::Checked
}

/// A rank failing at each storage operation in turn never leaves its step damaged, and a rerun
/// commits it.
pub fn failing_ranks_never_damage_a_step<H: Harness>(harness: &H, case: &str) -> Outcome {
    let Some(ranked) = Ranked::new(harness) else {
        return Outcome::NotApplicable(NO_RANKS.into());
    };
    let checkpoints = &ranked.checkpoints;
    save_ranks(checkpoints, 4, 0..3, case);
    for fail_at in 1.. {
        let faulty: Arc<dyn Storage> =
            Arc::new(Faulty::failing_at(harness.reopen(&ranked.storage), fail_at));
        let result = save(&Checkpoints::over(faulty, PREFIX), 4, 3);
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
    match save(checkpoints, 4, 3) {
        Ok(RankOutcome::CommittedByAnother(_)) => {}
        other => fail!(case, "rank 3 rerun after the failures: {other:?}"),
    }
    ranked.check_loads(4, case, "after failures");
    Outcome::Checked
}

/// gc keeps every committed step's manifests and containers, and a step that never committed
/// while its ranks' announcements are there (a rank may still be running); once they are gone
/// (as their lease's end makes them: removed here by hand), it removes that step; a rank
/// restarted after that is told its step is committed.
pub fn gc_keeps_committed_rank_steps<H: Harness>(harness: &H, case: &str) -> Outcome {
    let Some(ranked) = Ranked::new(harness) else {
        return Outcome::NotApplicable(NO_RANKS.into());
    };
    let checkpoints = &ranked.checkpoints;
    save_ranks(checkpoints, 1, 0..WORLD, case);
    save_ranks(checkpoints, 3, 0..3, case);
    save_ranks(checkpoints, 4, 0..WORLD, case);
    if let Err(e) = checkpoints.gc() {
        fail!(case, "gc: {e}");
    }
    let left = ranked.stored(case, "after gc");
    let unfinished = |left: &[String]| {
        left.iter()
            .filter(|k| k.starts_with("ranked/step-3/"))
            .count()
    };
    // Three containers and three manifests.
    if unfinished(&left) != 6 {
        fail!(
            case,
            "gc removed part of the step 3 whose ranks announced it: {left:?}"
        );
    }
    for announcement in left.iter().filter(|k| k.starts_with("ranked/refs/")) {
        if let Err(e) = ranked.shared.delete(announcement) {
            fail!(case, "removing {announcement}: {e}");
        }
    }
    if let Err(e) = checkpoints.gc() {
        fail!(case, "gc once the announcements are gone: {e}");
    }
    let left = ranked.stored(case, "after gc once the announcements are gone");
    if unfinished(&left) != 0 {
        fail!(case, "gc left the uncommitted step 3: {left:?}");
    }
    for step in [1, 4] {
        ranked.check_loads(step, case, "after gc");
    }
    if checkpoints.steps().ok().as_deref() != Some(&[1, 4]) {
        fail!(
            case,
            "after gc the checkpoints are {:?}",
            checkpoints.steps()
        );
    }
    match save(checkpoints, 1, 0) {
        Ok(RankOutcome::CommittedByAnother(_)) => {}
        other => fail!(case, "rank 0 of step 1 restarted after gc: {other:?}"),
    }
    Outcome::Checked
}

/// Two processes running as the same rank with the same content, their manifests' create-new
/// meeting and going one after the other: both succeed, the step keeps the first's manifest and
/// container alone, and it commits when the other rank finishes.
pub fn interleaved_rank_reruns_keep_one_part<H: Harness>(harness: &H, case: &str) -> Outcome {
    let Some(ranked) = Ranked::new(harness) else {
        return Outcome::NotApplicable(NO_RANKS.into());
    };
    let gate = Gate::new(Arc::clone(&ranked.shared), "-of-00004.json", [0, 1]);
    let outcomes: Vec<_> = std::thread::scope(|scope| {
        let ranks: Vec<_> = (0..2)
            .map(|id| {
                let checkpoints = Checkpoints::over(gate.writer(id), PREFIX);
                scope.spawn(move || save(&checkpoints, 1, 0))
            })
            .collect();
        ranks
            .into_iter()
            .map(|rank| {
                rank.join()
                    .unwrap_or_else(|_| fail!(case, "a racing rank 0 panicked"))
            })
            .collect()
    });
    if !outcomes
        .iter()
        .all(|o| matches!(o, Ok(RankOutcome::Written { .. })))
    {
        fail!(
            case,
            "two processes as rank 0 with the same content: {outcomes:?}"
        );
    }
    let containers: Vec<String> = ranked
        .stored(case, "after the race")
        .into_iter()
        .filter(|key| key.ends_with("rank-00000.bpk"))
        .collect();
    if containers.len() != 1 {
        fail!(
            case,
            "rank 0's part is stored {} times: {containers:?}",
            containers.len()
        );
    }
    save_ranks(&ranked.checkpoints, 1, 1..WORLD, case);
    ranked.check_loads(1, case, "after the race and the other ranks");
    Outcome::Checked
}
