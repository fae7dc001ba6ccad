//! Tiered checkpoints over two in-memory storages: saves commit on the fast tier and are
//! promoted with their bytes, newer saves take the place of waiting promotions, the fast tier
//! keeps what waits, a torn fast copy is passed over, an empty fast tier resumes from the
//! durable one, and a durable tier that fails never holds the loop or a half checkpoint. The
//! conformance suite runs promotions failing at every operation of each backend.

use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use weightbay::{
    Bytes, CreateOptions, DType, ErrorKind, MemoryStorage, Sink, Storage, Tensor, WriteMode, Writer,
};
use weightbay_checkpoints::{
    Checkpoints, PerTier, Promotion, PromotionState, RankOutcome, RankSave, Region, Retention,
    SaveOptions, StepState, Tiered,
};

/// Step `step`'s weights.
fn model(step: u64) -> Vec<Tensor> {
    vec![
        Tensor::from_slice("w", [256], &vec![step as f32; 256]),
        Tensor::from_slice("b", [4], &[0.5f32, step as f32, 2.0, 3.0]),
    ]
}

/// What the gate of a [`Remote`] lets through.
#[derive(Debug, Default)]
struct GateState {
    /// Creates wait while closed.
    closed: bool,
    /// Creates fail while down.
    down: bool,
    /// Creates waiting at the gate now.
    waiting: usize,
    /// Deletes fail while set.
    deletes_down: bool,
}

/// A durable tier whose `create` waits while its gate is closed and fails while it is down:
/// a promotion held in flight, or a remote outage. It counts the bytes its sinks receive and
/// notes the length each create announced.
#[derive(Debug, Clone, Default)]
struct Remote {
    inner: Arc<MemoryStorage>,
    gate: Arc<(Mutex<GateState>, Condvar)>,
    received: Arc<(Mutex<u64>, Condvar)>,
    expected_lens: Arc<Mutex<Vec<Option<u64>>>>,
}

/// A sink of a [`Remote`], counting what it receives.
struct Counted {
    inner: Box<dyn Sink>,
    received: Arc<(Mutex<u64>, Condvar)>,
}

impl Sink for Counted {
    fn write(&mut self, data: &[u8]) -> weightbay::Result<()> {
        self.inner.write(data)?;
        let (received, grew) = &*self.received;
        *received.lock().unwrap() += data.len() as u64;
        grew.notify_all();
        Ok(())
    }
    fn commit(self: Box<Self>) -> weightbay::Result<()> {
        self.inner.commit()
    }
}

impl Remote {
    /// Waits until its sinks have received `len` bytes. `patience` only keeps a promotion
    /// that never streams from hanging the test: it then fails, naming what arrived.
    fn wait_to_receive(&self, len: u64, patience: Duration) -> weightbay::Result<()> {
        let (received, grew) = &*self.received;
        let (received, _) = grew
            .wait_timeout_while(received.lock().unwrap(), patience, |r| *r < len)
            .unwrap();
        if *received >= len {
            return Ok(());
        }
        Err(weightbay::Error::new(
            ErrorKind::TimedOut,
            format!(
                "the durable tier received {received} of {len} bytes while the save was being \
                 written"
            ),
        ))
    }

    fn set(&self, change: impl FnOnce(&mut GateState)) {
        let (state, changed) = &*self.gate;
        change(&mut state.lock().unwrap());
        changed.notify_all();
    }

    /// Waits until a create waits at the closed gate: a promotion is in flight.
    fn wait_for_a_held_create(&self) {
        let (state, changed) = &*self.gate;
        let _held = changed
            .wait_while(state.lock().unwrap(), |s| s.waiting == 0)
            .unwrap();
    }
}

impl Storage for Remote {
    fn create(&self, key: &str, options: &CreateOptions) -> weightbay::Result<Box<dyn Sink>> {
        self.expected_lens
            .lock()
            .unwrap()
            .push(options.expected_len);
        let (state, changed) = &*self.gate;
        let mut gate = state.lock().unwrap();
        gate.waiting += 1;
        changed.notify_all();
        gate = changed.wait_while(gate, |s| s.closed).unwrap();
        gate.waiting -= 1;
        if gate.down {
            return Err(weightbay::Error::new(
                ErrorKind::Io,
                "the remote store is unreachable",
            ));
        }
        drop(gate);
        Ok(Box::new(Counted {
            inner: self.inner.create(key, options)?,
            received: Arc::clone(&self.received),
        }))
    }
    fn delete(&self, key: &str) -> weightbay::Result<()> {
        if self.gate.0.lock().unwrap().deletes_down {
            return Err(weightbay::Error::new(
                ErrorKind::Io,
                "the remote store refuses deletes",
            ));
        }
        self.inner.delete(key)
    }
    weightbay::forward_storage!(inner => capabilities, open, pending, clean_pending, list, list_foreign);
}

/// Tiers over `fast` and `remote`, under the prefix `run`.
fn tiers_over(fast: &Arc<MemoryStorage>, remote: &Remote, policy: Promotion) -> Tiered {
    Tiered::new(
        Checkpoints::over(fast.clone(), "run"),
        Checkpoints::over(Arc::new(remote.clone()), "run"),
    )
    .with_promotion(policy)
}

/// The promotion state of every step `tiered` lists.
fn promotions(tiered: &Tiered) -> Vec<(u64, Option<PromotionState>)> {
    tiered
        .list()
        .unwrap()
        .into_iter()
        .map(|s| (s.step, s.promotion))
        .collect()
}

fn weights(checkpoints: &Checkpoints, step: u64) -> Vec<f32> {
    checkpoints
        .open(step)
        .unwrap()
        .reader()
        .unwrap()
        .read_as::<f32>("w")
        .unwrap()
}

#[test]
fn saves_are_promoted_with_the_fast_tiers_bytes_and_record() {
    let (fast, remote) = (Arc::new(MemoryStorage::new()), Remote::default());
    let tiered = tiers_over(&fast, &remote, Promotion::every_save());
    tiered.save(1, Writer::new(model(1))).unwrap();
    tiered
        .save_in_background(2, Writer::new(model(2)), Default::default())
        .unwrap()
        .wait()
        .unwrap();
    tiered.flush().unwrap();
    assert_eq!(tiered.durable().steps().unwrap(), [1, 2]);
    for step in [1, 2] {
        let (on_fast, on_durable) = (
            tiered.fast().open(step).unwrap(),
            tiered.durable().open(step).unwrap(),
        );
        on_durable.verify().unwrap();
        let crcs = |c: &weightbay_checkpoints::Checkpoint| {
            c.record()
                .containers
                .iter()
                .map(|c| c.crc32c)
                .collect::<Vec<_>>()
        };
        assert_eq!(crcs(&on_fast), crcs(&on_durable));
        assert_eq!(weights(tiered.durable(), step), vec![step as f32; 256]);
    }
    assert!(
        tiered
            .list()
            .unwrap()
            .iter()
            .all(|s| s.is_durable() && s.promotion == Some(PromotionState::Promoted))
    );
}

/// Weights whose second tensor the writer reaches only once `first_len` bytes of the first
/// are written: its provider runs `then` and gives 16 bytes if it succeeds.
fn held_weights(
    first_len: usize,
    then: impl Fn() -> weightbay::Result<()> + Send + Sync + 'static,
) -> Vec<Tensor> {
    let first = Tensor::from_slice(
        "first",
        [first_len as u64 / 4],
        &vec![1.5f32; first_len / 4],
    );
    let second = Tensor::deferred("second", DType::F32, [4], 16, move || {
        then().map(|()| Bytes::from(vec![7u8; 16]))
    });
    vec![first, second]
}

#[test]
fn a_promotion_streams_a_background_save_while_it_is_written() {
    let (fast, remote) = (Arc::new(MemoryStorage::new()), Remote::default());
    let tiered = tiers_over(&fast, &remote, Promotion::newest_only());
    // The writer hands the 8 MiB tensor to the sink before it asks for the second, which
    // waits for the durable tier to have received it: only a promotion that reads the save
    // back as it is written lets the save finish.
    let watched = remote.clone();
    let weights = held_weights(8 << 20, move || {
        watched.wait_to_receive(8 << 20, Duration::from_secs(30))
    });
    let saving = tiered.save_in_background(1, Writer::new(weights), SaveOptions::default());
    saving.unwrap().wait().unwrap();
    tiered.flush().unwrap();
    assert_eq!(promotions(&tiered), [(1, Some(PromotionState::Promoted))]);
    let (fast, durable) = (
        tiered.fast().open(1).unwrap(),
        tiered.durable().open(1).unwrap(),
    );
    durable.verify().unwrap();
    // Announced up front, so an object store sizes its parts for the whole container.
    let lens: Vec<_> = fast
        .record()
        .containers
        .iter()
        .map(|c| Some(c.len))
        .collect();
    let announced = remote.expected_lens.lock().unwrap().clone();
    assert_eq!(
        announced[..lens.len()],
        lens,
        "then the record's own write: {announced:?}"
    );
    let (fast, durable) = (fast.reader().unwrap(), durable.reader().unwrap());
    for name in ["first", "second"] {
        assert_eq!(
            durable.read(name).unwrap(),
            fast.read(name).unwrap(),
            "{name}"
        );
    }
    assert!(remote.inner.pending("run").unwrap().is_empty());
}

#[test]
fn a_followed_background_save_that_fails_leaves_nothing_on_either_tier() {
    let (fast, remote) = (Arc::new(MemoryStorage::new()), Remote::default());
    let tiered = tiers_over(&fast, &remote, Promotion::newest_only());
    // The save fails once its promotion has streamed the first tensor.
    let watched = remote.clone();
    let weights = held_weights(1 << 20, move || {
        watched.wait_to_receive(1 << 20, Duration::from_secs(30))?;
        Err(weightbay::Error::new(
            ErrorKind::Io,
            "device readback failed",
        ))
    });
    let saving = tiered.save_in_background(1, Writer::new(weights), SaveOptions::default());
    let error = saving.unwrap().wait().unwrap_err();
    assert!(
        error.to_string().contains("device readback failed"),
        "{error}"
    );
    // The save reported its own failure; the promotion it took with it has nothing to add.
    tiered.flush().unwrap();
    assert!(remote.inner.keys().is_empty(), "{:?}", remote.inner.keys());
    assert!(remote.inner.pending("run").unwrap().is_empty());
    assert!(tiered.fast().steps().unwrap().is_empty());
    tiered.save(2, Writer::new(model(2))).unwrap();
    tiered.flush().unwrap();
    assert_eq!(tiered.durable().steps().unwrap(), [2]);
}

#[test]
fn newer_saves_take_the_place_of_waiting_promotions_and_list_says_which() {
    let (fast, remote) = (Arc::new(MemoryStorage::new()), Remote::default());
    let tiered = tiers_over(&fast, &remote, Promotion::newest_only());
    remote.set(|g| g.closed = true);
    tiered.save(1, Writer::new(model(1))).unwrap();
    remote.wait_for_a_held_create();
    for step in 2..=4 {
        tiered.save(step, Writer::new(model(step))).unwrap();
    }
    assert_eq!(
        promotions(&tiered),
        [
            (1, Some(PromotionState::Copying)),
            (2, Some(PromotionState::Superseded { by: 3 })),
            (3, Some(PromotionState::Superseded { by: 4 })),
            (4, Some(PromotionState::Waiting)),
        ]
    );
    remote.set(|g| g.closed = false);
    tiered.flush().unwrap();
    assert_eq!(tiered.durable().steps().unwrap(), [1, 4]);
    let skipped: Vec<u64> = tiered
        .list()
        .unwrap()
        .into_iter()
        .filter(|s| matches!(s.promotion, Some(PromotionState::Superseded { .. })))
        .map(|s| s.step)
        .collect();
    assert_eq!(skipped, [2, 3]);
}

#[test]
fn every_save_promotes_all_in_order_and_multiples_of_only_those() {
    let (fast, remote) = (Arc::new(MemoryStorage::new()), Remote::default());
    let tiered = tiers_over(&fast, &remote, Promotion::every_save());
    remote.set(|g| g.closed = true);
    for step in 1..=4 {
        tiered.save(step, Writer::new(model(step))).unwrap();
    }
    remote.set(|g| g.closed = false);
    tiered.flush().unwrap();
    assert_eq!(tiered.durable().steps().unwrap(), [1, 2, 3, 4]);

    let (fast, remote) = (Arc::new(MemoryStorage::new()), Remote::default());
    let tiered = tiers_over(&fast, &remote, Promotion::every_save().multiples_of(2));
    for step in 1..=4 {
        tiered.save(step, Writer::new(model(step))).unwrap();
    }
    tiered.flush().unwrap();
    assert_eq!(tiered.durable().steps().unwrap(), [2, 4]);
    assert_eq!(promotions(&tiered)[0].1, Some(PromotionState::NotChosen));
}

#[test]
fn the_fast_tier_keeps_what_waits_for_promotion_and_each_tier_its_own_policy() {
    let (fast, remote) = (Arc::new(MemoryStorage::new()), Remote::default());
    let tiered = tiers_over(&fast, &remote, Promotion::every_save());
    remote.set(|g| g.closed = true);
    for step in 1..=4 {
        tiered.save(step, Writer::new(model(step))).unwrap();
    }
    let policy = PerTier {
        fast: Retention::keep_last(1),
        durable: Retention::keep_last(2),
    };
    let deleted = tiered.retain(&policy).unwrap();
    assert_eq!(
        deleted,
        PerTier::default(),
        "every step waits for promotion"
    );
    assert_eq!(tiered.fast().steps().unwrap(), [1, 2, 3, 4]);
    remote.set(|g| g.closed = false);
    tiered.flush().unwrap();
    let deleted = tiered.retain(&policy).unwrap();
    assert_eq!(deleted.fast, [1, 2, 3]);
    assert_eq!(deleted.durable, [1, 2]);
    assert_eq!(tiered.fast().steps().unwrap(), [4]);
    assert_eq!(tiered.durable().steps().unwrap(), [3, 4]);
    let report = tiered.gc().unwrap();
    assert!(report.fast.orphans.is_empty() && report.durable.orphans.is_empty());
}

#[test]
fn a_retention_policy_runs_after_each_promotion_and_flush_reports_a_failed_pass() {
    let (fast, remote) = (Arc::new(MemoryStorage::new()), Remote::default());
    let tiered = tiers_over(&fast, &remote, Promotion::every_save()).with_retention(PerTier {
        fast: Retention::keep_last(1),
        durable: Retention::keep_last(2),
    });
    remote.set(|g| g.closed = true);
    for step in 1..=4 {
        tiered.save(step, Writer::new(model(step))).unwrap();
    }
    assert_eq!(
        tiered.fast().steps().unwrap(),
        [1, 2, 3, 4],
        "every step waits for promotion"
    );
    remote.set(|g| g.closed = false);
    tiered.flush().unwrap();
    assert_eq!(tiered.fast().steps().unwrap(), [4]);
    assert_eq!(tiered.durable().steps().unwrap(), [3, 4]);

    // A pass that fails is reported once by flush, with its cause; the next pass catches up.
    remote.set(|g| g.deletes_down = true);
    tiered.save(5, Writer::new(model(5))).unwrap();
    let failed = tiered.flush().unwrap_err();
    assert!(
        failed.to_string().contains("retention pass")
            && format!("{failed:?}").contains("refuses deletes"),
        "{failed:?}"
    );
    tiered.flush().unwrap();
    assert_eq!(tiered.fast().steps().unwrap(), [5]);
    assert_eq!(tiered.durable().steps().unwrap(), [3, 4, 5]);
    remote.set(|g| g.deletes_down = false);
    tiered.save(6, Writer::new(model(6))).unwrap();
    tiered.flush().unwrap();
    assert_eq!(tiered.fast().steps().unwrap(), [6]);
    assert_eq!(tiered.durable().steps().unwrap(), [5, 6]);
}

/// Flips one bit of `step`'s container on the fast tier, as a local disk might; its length
/// stays.
fn tear(fast: &MemoryStorage, checkpoints: &Checkpoints, step: u64) {
    let record = checkpoints.open(step).unwrap().record().clone();
    let key = format!(
        "{}/{}",
        checkpoints.step_dir(step),
        record.containers[0].key
    );
    let mut bytes = fast
        .open(&key)
        .unwrap()
        .bytes(0..record.containers[0].len)
        .unwrap()
        .to_vec()
        .unwrap();
    let last = bytes.len() - 300;
    bytes[last] ^= 1;
    let options = CreateOptions::default().with_mode(WriteMode::Overwrite);
    let mut sink = fast.create(&key, &options).unwrap();
    sink.write(&bytes).unwrap();
    sink.commit().unwrap();
}

#[test]
fn a_torn_fast_copy_is_passed_over_and_a_resumed_run_promotes_the_newest() {
    let (fast, remote) = (Arc::new(MemoryStorage::new()), Remote::default());
    let first = tiers_over(&fast, &remote, Promotion::newest_only());
    first.save(1, Writer::new(model(1))).unwrap();
    first.flush().unwrap();
    // Saved on the fast tier by a run killed before promoting them.
    for step in [2, 3] {
        first.fast().save(step, Writer::new(model(step))).unwrap();
    }
    tear(&fast, first.fast(), 3);

    let resumed = tiers_over(&fast, &remote, Promotion::newest_only());
    let latest = resumed.latest().unwrap().unwrap();
    assert_eq!(latest.step(), 2, "the torn step 3 is passed over");
    resumed.flush().unwrap();
    assert_eq!(
        resumed.durable().steps().unwrap(),
        [1, 2],
        "resuming promoted the newest fast checkpoint"
    );
    assert_eq!(weights(resumed.durable(), 2), vec![2.0; 256]);
    // Promoting the torn step on demand fails on its CRC32C, and does not make it trusted.
    let error = resumed.promote(3).unwrap_err();
    assert_eq!(error.kind(), ErrorKind::Corrupt, "{error}");
    assert_eq!(resumed.latest().unwrap().unwrap().step(), 2);
    assert_eq!(resumed.durable().steps().unwrap(), [1, 2]);
}

#[test]
fn retention_keeps_the_step_a_resumed_run_is_served_below_a_torn_one() {
    let (fast, remote) = (Arc::new(MemoryStorage::new()), Remote::default());
    let first = tiers_over(&fast, &remote, Promotion::newest_only());
    // Saved on the fast tier by a run killed before promoting them; the newest is torn.
    for step in [1, 2, 3] {
        first.fast().save(step, Writer::new(model(step))).unwrap();
    }
    tear(&fast, first.fast(), 3);

    let resumed = tiers_over(&fast, &remote, Promotion::newest_only()).with_retention(PerTier {
        fast: Retention::keep_last(1),
        durable: Retention::keep_last(1),
    });
    assert_eq!(resumed.latest().unwrap().unwrap().step(), 2);
    // The promotion `latest` queued ends, and the pass after it runs: a policy counting the
    // torn step 3 as the one to keep would delete step 2 under the run reading it.
    resumed.flush().unwrap();
    assert_eq!(resumed.fast().steps().unwrap(), [2, 3]);
    assert_eq!(weights(resumed.fast(), 2), vec![2.0; 256]);
    assert_eq!(resumed.durable().steps().unwrap(), [2]);
}

#[test]
fn with_the_fast_tier_gone_the_durable_tier_serves() {
    let (fast, remote) = (Arc::new(MemoryStorage::new()), Remote::default());
    let first = tiers_over(&fast, &remote, Promotion::newest_only());
    for step in [1, 2] {
        first.save(step, Writer::new(model(step))).unwrap();
    }
    first.flush().unwrap();
    // The machine is replaced: a new, empty local disk.
    let replaced = tiers_over(
        &Arc::new(MemoryStorage::new()),
        &remote,
        Promotion::newest_only(),
    );
    let latest = replaced.latest().unwrap().unwrap();
    assert_eq!(latest.step(), 2);
    assert!(Arc::ptr_eq(latest.storage(), replaced.durable().storage()));
    assert_eq!(
        latest.reader().unwrap().read_as::<f32>("w").unwrap(),
        vec![2.0; 256]
    );
}

#[test]
fn a_remote_outage_never_holds_the_loop_and_flush_names_the_step_left_behind() {
    let (fast, remote) = (Arc::new(MemoryStorage::new()), Remote::default());
    let tiered = tiers_over(&fast, &remote, Promotion::newest_only());
    remote.set(|g| g.down = true);
    for step in [1, 2] {
        tiered.save(step, Writer::new(model(step))).unwrap();
    }
    let error = tiered.flush().unwrap_err();
    assert_eq!(error.kind(), ErrorKind::Io);
    assert!(
        error
            .to_string()
            .contains("step 2 is on the fast tier only"),
        "{error}"
    );
    assert!(tiered.durable().steps().unwrap().is_empty());
    assert!(matches!(
        promotions(&tiered)[1].1,
        Some(PromotionState::Failed { .. })
    ));
    // The store is back: the step is promoted on demand, and the next save's promotion works.
    remote.set(|g| g.down = false);
    tiered.promote(2).unwrap();
    tiered.save(3, Writer::new(model(3))).unwrap();
    tiered.flush().unwrap();
    assert_eq!(tiered.durable().steps().unwrap(), [2, 3]);
    let listed = tiered.durable().list().unwrap();
    assert!(listed.iter().all(|s| s.state == StepState::Complete));
}

#[test]
fn a_durable_step_holding_other_bytes_is_not_overwritten() {
    let (fast, remote) = (Arc::new(MemoryStorage::new()), Remote::default());
    let tiered = tiers_over(&fast, &remote, Promotion::newest_only());
    tiered.durable().save(5, Writer::new(model(50))).unwrap();
    tiered.save(5, Writer::new(model(5))).unwrap();
    let error = tiered.flush().unwrap_err();
    assert_eq!(error.kind(), ErrorKind::AlreadyExists, "{error}");
    assert_eq!(weights(tiered.durable(), 5), vec![50.0; 256]);
    // The same bytes there already count as promoted.
    tiered.fast().save(6, Writer::new(model(6))).unwrap();
    tiered.durable().save(6, Writer::new(model(6))).unwrap();
    tiered.promote(6).unwrap();
}

#[test]
fn ranks_promote_their_own_parts_and_the_durable_tier_commits_the_step() {
    let remote = Remote::default();
    let shape = [4u64, 2];
    // Each rank saves to a local disk of its own.
    let nodes: Vec<(Arc<MemoryStorage>, Tiered)> = (0..2)
        .map(|_| {
            let fast = Arc::new(MemoryStorage::new());
            let tiered = tiers_over(&fast, &remote, Promotion::newest_only());
            (fast, tiered)
        })
        .collect();
    let save = |rank: u32| {
        let base = 4.0 * rank as f32;
        let rows = [base, base + 1.0, base + 2.0, base + 3.0];
        let writer = Writer::new(vec![Tensor::from_slice("w", [2, 2], &rows)]);
        let region = Region::split(&shape, 0, 2, u64::from(rank));
        RankSave::new(rank, 2, writer).with_slice("w", shape, region)
    };
    for (rank, (_, tiered)) in nodes.iter().enumerate() {
        let outcome = tiered.save_rank(7, save(rank as u32)).unwrap();
        assert!(
            matches!(outcome, RankOutcome::Written { .. }),
            "a node's own disk never holds the other rank's manifest: {outcome:?}"
        );
    }
    for (_, tiered) in &nodes {
        tiered.flush().unwrap();
    }
    let durable = nodes[0].1.durable();
    assert_eq!(durable.steps().unwrap(), [7]);
    let weights = durable.open(7).unwrap().assembled().unwrap();
    assert_eq!(
        weights.read_as::<f32>("w").unwrap(),
        [0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]
    );
    assert_eq!(nodes[1].1.latest().unwrap().unwrap().step(), 7);
    // The local parts are of no use once the durable tier holds the step: retention drops them.
    let (fast, tiered) = &nodes[0];
    let deleted = tiered
        .retain(&PerTier {
            fast: Retention::keep_last(1),
            durable: Retention::keep_last(1),
        })
        .unwrap();
    assert_eq!(deleted.fast, [7]);
    assert!(fast.list("run").unwrap().is_empty());
    assert_eq!(durable.steps().unwrap(), [7]);
}

#[test]
fn rank_parts_are_never_superseded_and_a_rendezvous_is_refused() {
    let (fast, remote) = (Arc::new(MemoryStorage::new()), Remote::default());
    let tiered = tiers_over(&fast, &remote, Promotion::newest_only());
    let save = |step: u64| {
        let writer = Writer::new(model(step));
        RankSave::new(0, 1, writer)
    };
    remote.set(|g| g.closed = true);
    for step in 1..=3 {
        tiered.save_rank(step, save(step)).unwrap();
    }
    remote.set(|g| g.closed = false);
    tiered.flush().unwrap();
    // One rank of one: each part promoted commits its step on the durable tier.
    assert_eq!(tiered.durable().steps().unwrap(), [1, 2, 3]);
    let error = tiered
        .save_rank(4, save(4).with_rendezvous(|| Ok(true)))
        .unwrap_err();
    assert_eq!(error.kind(), ErrorKind::InvalidInput, "{error}");
}
