//! Promotion: the checkpoints a [`Tiered`](crate::Tiered) value saved on its fast tier, copied
//! to its durable tier on a thread of their own, in order, the newest taking the place of older
//! ones that wait when promotion falls behind. The queue holds step numbers only (the bytes
//! wait on the fast tier), so a save is never held back by promotion longer than its policy's
//! bound. A background save that finds nothing waiting or being copied is followed instead,
//! streamed to the durable tier as it writes ([`following`](crate::following)).

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::mpsc::{Receiver, Sender};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use weightbay::backend_kit::unique_token;
use weightbay::checksum::crc32c_append;
use weightbay::{Background, Durability, Error, ErrorKind, Result};

use crate::checkpoint::Checkpoint;
use crate::checkpoints::Checkpoints;
use crate::copy::create_container;
use crate::following::{Followed, Head, Heads};
use crate::layout;
use crate::listing::{StepState, complete_steps};
use crate::record::CommitRecord;
use crate::retention::{PerTier, Retention};

/// How much of a followed container is read back and sent at a time.
const FOLLOW_WINDOW: u64 = 8 << 20;

/// The promotion outcomes a value remembers: older ones are forgotten (a step forgotten shows
/// no promotion state in [`Tiered::list`](crate::Tiered::list)).
const REMEMBERED: usize = 4096;

/// Which checkpoints of a [`Tiered`](crate::Tiered) value are promoted to the durable tier,
/// and what a save does when promotion falls behind.
///
/// Saves queue their promotion; one is copied at a time. A save that finds
/// [`max_waiting`](Self::max_waiting) promotions waiting waits up to
/// [`max_block`](Self::max_block) for one to start, then takes the place of the oldest waiting
/// one, which is reported [`Superseded`](PromotionState::Superseded). The default,
/// [`newest_only`](Self::newest_only), never holds a save back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Promotion {
    /// Only checkpoints whose step is a multiple of this are promoted (1: every one); the
    /// others are [`NotChosen`](PromotionState::NotChosen).
    pub multiple_of: u64,
    /// How many promotions may wait behind the one being copied.
    pub max_waiting: usize,
    /// How long a save may be held waiting for room in a full queue before it supersedes the
    /// oldest waiting promotion.
    pub max_block: Duration,
}

impl Default for Promotion {
    fn default() -> Self {
        Self::newest_only()
    }
}

impl Promotion {
    /// Promotes the newest checkpoint: while one is copied, at most one waits, and a newer save
    /// takes its place at once. The durable tier so stays within one promotion of the fast
    /// tier, and saves are never held back.
    pub fn newest_only() -> Self {
        Self {
            multiple_of: 1,
            max_waiting: 1,
            max_block: Duration::ZERO,
        }
    }

    /// Promotes every checkpoint, in order, however far behind promotion falls (the fast tier
    /// keeps each until it is promoted, see [`Tiered::retain`](crate::Tiered::retain)).
    pub fn every_save() -> Self {
        Self {
            max_waiting: usize::MAX,
            ..Self::newest_only()
        }
    }

    /// Promotes only checkpoints whose step is a multiple of `k` (0 counts as 1).
    #[must_use]
    pub fn multiples_of(mut self, k: u64) -> Self {
        self.multiple_of = k.max(1);
        self
    }

    /// Lets `n` promotions wait behind the one being copied (at least 1).
    #[must_use]
    pub fn with_max_waiting(mut self, n: usize) -> Self {
        self.max_waiting = n.max(1);
        self
    }

    /// Lets a save wait up to `bound` for room in a full queue before it supersedes the
    /// oldest waiting promotion.
    #[must_use]
    pub fn with_max_block(mut self, bound: Duration) -> Self {
        self.max_block = bound;
        self
    }
}

/// Where the promotion of one checkpoint stands, as this process saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum PromotionState {
    /// Queued behind the promotion being copied.
    Waiting,
    /// Being copied to the durable tier.
    Copying,
    /// On the durable tier: the checkpoint complete, or, for a rank's part
    /// ([`Tiered::save_rank`](crate::Tiered::save_rank)), the part and its manifest (the step
    /// commits once every rank's part is there).
    Promoted,
    /// Not promoted: the save of step `by` took its place in a full queue.
    Superseded {
        /// The step whose promotion replaced this one.
        by: u64,
    },
    /// Not promoted: the policy promotes only multiples of [`Promotion::multiple_of`].
    NotChosen,
    /// The promotion failed. Nothing of it became complete on the durable tier, but for a
    /// rank's part whose commit failed after its manifest was written; what it left there is
    /// [`Checkpoints::gc`]'s. (A step the durable tier held already, with other bytes, fails
    /// with [`ErrorKind::AlreadyExists`] and stays as it was.)
    Failed {
        /// The failure's kind.
        kind: ErrorKind,
        /// What failed, as the error says it.
        message: String,
    },
}

/// The queue of promotions, its outcomes, and the worker thread that copies.
#[derive(Debug, Default)]
pub(crate) struct Promoter {
    state: Mutex<Queue>,
    changed: Condvar,
}

/// A promotion waiting: a step's checkpoint, or one rank's part of it (rank, world size).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Job {
    pub(crate) step: u64,
    pub(crate) rank: Option<(u32, u32)>,
}

/// The promotions of a [`Tiered`](crate::Tiered) value: waiting, being copied, ended.
#[derive(Debug, Default)]
pub(crate) struct Queue {
    /// Promotions waiting, oldest first.
    waiting: VecDeque<Job>,
    /// The promotions being copied: the worker's, and those [`Tiered::promote`] runs.
    ///
    /// [`Tiered::promote`]: crate::Tiered::promote
    copying: Vec<Job>,
    /// What became of every step this value saved, newest [`REMEMBERED`].
    outcomes: BTreeMap<u64, PromotionState>,
    /// Whether a worker thread runs (it ends when the queue is empty).
    working: bool,
    /// The failure of the newest promotion the worker made, while no newer one succeeded:
    /// what [`Tiered::flush`](crate::Tiered::flush) reports.
    pub(crate) failure: Option<(u64, Error)>,
    /// Steps of the fast tier this value saved or verified against their records: trusted
    /// without reading them again (newest [`REMEMBERED`]).
    trusted: BTreeSet<u64>,
    /// Steps of the fast tier that failed verification: passed over without reading them
    /// again.
    pub(crate) torn: BTreeSet<u64>,
    /// The policy applied after each promotion ends
    /// ([`Tiered::with_retention`](crate::Tiered::with_retention)).
    pub(crate) retention: Option<PerTier<Retention>>,
    /// The failure of the newest pass of that policy, not reported yet: what
    /// [`Tiered::flush`](crate::Tiered::flush) reports when no promotion's failure is to be
    /// reported first.
    pub(crate) retention_failure: Option<Error>,
    /// Passes of that policy running: `flush` waits for them too.
    retaining: usize,
}

impl Queue {
    /// What this value knows of `step`'s promotion.
    pub(crate) fn outcome(&self, step: u64) -> Option<&PromotionState> {
        self.outcomes.get(&step)
    }

    /// Whether this value saved `step` on the fast tier or verified it there.
    pub(crate) fn trusts(&self, step: u64) -> bool {
        self.trusted.contains(&step)
    }

    /// Notes that this value saved `step` on the fast tier, or verified it there.
    pub(crate) fn trust(&mut self, step: u64) {
        self.trusted.insert(step);
        while self.trusted.len() > REMEMBERED {
            self.trusted.pop_first();
        }
    }

    /// Notes that the promotion of `step` ended with `result`. A success forgets the failure
    /// of an older promotion: a newer checkpoint is durable now.
    pub(crate) fn ended<T>(&mut self, step: u64, result: &Result<T>) {
        let state = match result {
            Ok(_) => {
                if self
                    .failure
                    .as_ref()
                    .is_some_and(|(failed, _)| *failed <= step)
                {
                    self.failure = None;
                }
                PromotionState::Promoted
            }
            Err(e) => PromotionState::Failed {
                kind: e.kind(),
                message: e.to_string(),
            },
        };
        self.set(step, state);
    }

    /// Whether `step`'s promotion waits or is being copied: the fast tier must keep it.
    pub(crate) fn is_pending(&self, step: u64) -> bool {
        self.copying
            .iter()
            .chain(&self.waiting)
            .any(|job| job.step == step)
    }

    fn set(&mut self, step: u64, state: PromotionState) {
        self.outcomes.insert(step, state);
        while self.outcomes.len() > REMEMBERED {
            self.outcomes.pop_first();
        }
    }
}

/// The two tiers a worker copies between.
#[derive(Debug)]
pub(crate) struct Tiers {
    pub(crate) fast: Checkpoints,
    pub(crate) durable: Checkpoints,
    pub(crate) promoter: Promoter,
    /// Held by every retention and gc pass of this value: the passes after promotions must not
    /// overlap one the caller runs (gc's protocol allows one pass at a time on a prefix).
    pub(crate) passes: Mutex<()>,
}

impl Promoter {
    pub(crate) fn lock(&self) -> MutexGuard<'_, Queue> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Waits until nothing waits or is being copied, and no retention pass runs.
    pub(crate) fn wait_idle(&self) {
        let mut queue = self.lock();
        while !queue.copying.is_empty() || !queue.waiting.is_empty() || queue.retaining > 0 {
            queue = self
                .changed
                .wait(queue)
                .unwrap_or_else(PoisonError::into_inner);
        }
    }
}

impl Tiers {
    /// Queues `job` by `policy`, holding the caller at most `policy.max_block`, and starts a
    /// worker if none runs. A rank's part is never superseded: whether a step's parts are
    /// all promoted must not hang on each node's timing.
    ///
    /// # Errors
    /// [`ErrorKind::Io`] when the worker thread cannot start (the promotion is then
    /// [`Failed`](PromotionState::Failed), and not queued).
    pub(crate) fn queue(self: &Arc<Self>, job: Job, policy: &Promotion) -> Result<()> {
        let step = job.step;
        let promoter = &self.promoter;
        let mut queue = promoter.lock();
        if !step.is_multiple_of(policy.multiple_of) {
            queue.set(step, PromotionState::NotChosen);
            return Ok(());
        }
        let until = Instant::now() + policy.max_block;
        while job.rank.is_none() && queue.waiting.len() >= policy.max_waiting {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                if let Some(oldest) = queue.waiting.pop_front() {
                    queue.set(oldest.step, PromotionState::Superseded { by: step });
                }
                break;
            }
            queue = promoter
                .changed
                .wait_timeout(queue, left)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
        if queue.waiting.contains(&job) || queue.copying.contains(&job) {
            return Ok(());
        }
        queue.waiting.push_back(job);
        queue.set(step, PromotionState::Waiting);
        if queue.working {
            return Ok(());
        }
        let tiers = Arc::clone(self);
        // Detached: the worker ends once the queue is empty, and `flush` waits for that.
        match Background::spawn("weightbay-promotion", move || tiers.work()) {
            Ok(_) => {
                queue.working = true;
                Ok(())
            }
            Err(e) => {
                queue.waiting.retain(|waiting| *waiting != job);
                queue.ended::<()>(step, &Err(Error::new(e.kind(), e.to_string())));
                Err(e)
            }
        }
    }

    /// Starts promoting `step` as its save writes it ([`following`](crate::following)) when
    /// the policy chooses it and no promotion waits or runs, so it would start at once anyway
    /// and never competes with another for the durable tier. Returns where the save announces
    /// its containers, or `None` when the step is left to [`queue`](Self::queue).
    pub(crate) fn follow_save(
        self: &Arc<Self>,
        step: u64,
        policy: &Promotion,
    ) -> Option<Sender<Followed>> {
        let mut queue = self.promoter.lock();
        if !step.is_multiple_of(policy.multiple_of)
            || queue.working
            || !queue.copying.is_empty()
            || !queue.waiting.is_empty()
        {
            return None;
        }
        let job = Job { step, rank: None };
        let (announce, announced) = std::sync::mpsc::channel();
        let tiers = Arc::clone(self);
        let worker = Background::spawn("weightbay-promotion", move || {
            tiers.promote_caught(job, || tiers.follow(step, announced));
            tiers.work();
        });
        // A worker that cannot start leaves the step to the queue, which reports why.
        worker.ok()?;
        queue.working = true;
        queue.copying.push(job);
        queue.set(step, PromotionState::Copying);
        Some(announce)
    }

    /// The worker: copies the oldest waiting promotion until none waits.
    fn work(&self) {
        loop {
            let job = {
                let mut queue = self.promoter.lock();
                let Some(job) = queue.waiting.pop_front() else {
                    queue.working = false;
                    self.promoter.changed.notify_all();
                    return;
                };
                queue.copying.push(job);
                queue.set(job.step, PromotionState::Copying);
                self.promoter.changed.notify_all();
                job
            };
            self.promote_caught(job, || self.run(job));
        }
    }

    /// Runs `promote`, the promotion of `job` marked as being copied, and records how it
    /// ended. `promote` says how, and whether it failed because the step's save did not
    /// commit.
    fn promote_caught(&self, job: Job, promote: impl FnOnce() -> (Result<()>, bool)) {
        // A panic is this promotion's failure, not the end of the worker: a worker gone with
        // promotions still queued would leave `flush` waiting for ever.
        let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(promote));
        let (promoted, unsaved) = run.unwrap_or_else(|_| {
            let panicked = format!("the promotion of step {} panicked", job.step);
            (Err(Error::new(ErrorKind::Io, panicked)), false)
        });
        let mut queue = self.promoter.lock();
        queue.copying.retain(|copying| *copying != job);
        queue.ended(job.step, &promoted);
        match promoted {
            // A save that did not commit reported that itself, through its handle.
            Err(_) if unsaved => {}
            Err(e) => queue.failure = Some((job.step, e)),
            Ok(()) => {}
        }
        let policy = queue.retention;
        queue.retaining += usize::from(policy.is_some());
        self.promoter.changed.notify_all();
        drop(queue);
        if let Some(policy) = policy {
            self.retain_after_promotion(&policy);
        }
    }

    /// Runs `job`: how it ended, and whether it failed because the fast tier's save of the
    /// step did not commit.
    fn run(&self, job: Job) -> (Result<()>, bool) {
        match job.rank {
            Some(rank) => {
                let copied = self.durable.copy_rank_from(&self.fast, job.step, rank);
                let named = |e: Error| {
                    e.context(format!("rank {} of {}, step {}", rank.0, rank.1, job.step))
                };
                (copied.map(drop).map_err(named), false)
            }
            None => {
                let (opened, unsaved) = self.saved_on_fast(job.step);
                (opened.and_then(|c| self.copy(&c, None)).map(drop), unsaved)
            }
        }
    }

    /// The fast tier's checkpoint of `step` once a background save of it still writing has
    /// ended, and whether it is missing because that save did not commit.
    fn saved_on_fast(&self, step: u64) -> (Result<Checkpoint>, bool) {
        self.fast.saves.wait_while_saving(step);
        let opened = self.fast.open(step);
        let unsaved = opened
            .as_ref()
            .is_err_and(|e| e.kind() == ErrorKind::NotFound);
        (opened, unsaved)
    }

    /// Copies `step` from the fast tier to the durable one now, on the calling thread (see
    /// [`copy`](Self::copy)), once the fast tier's save of it (a background save, maybe) has
    /// ended; marked as being copied meanwhile, so retention keeps it.
    ///
    /// # Errors
    /// [`ErrorKind::NotFound`] when the fast tier holds no complete `step`; as
    /// [`copy`](Self::copy).
    pub(crate) fn promote(&self, step: u64) -> Result<CommitRecord> {
        let job = Job { step, rank: None };
        self.promoter.lock().copying.push(job);
        self.fast.saves.wait_while_saving(step);
        let promoted = self
            .fast
            .open(step)
            .map_err(|e| {
                e.context(format!(
                    "step {step} is not a complete checkpoint on the fast tier"
                ))
            })
            .and_then(|checkpoint| self.copy(&checkpoint, None));
        let mut queue = self.promoter.lock();
        queue.copying.retain(|copying| *copying != job);
        queue.ended(step, &promoted);
        self.promoter.changed.notify_all();
        promoted
    }

    /// Copies `checkpoint` of the fast tier to the durable one: its containers with their
    /// CRC32C checked on the way, the commit record last. A step the durable tier holds
    /// already counts as promoted if its bytes are the fast tier's. Streamed containers
    /// (`heads`) go into save directory `save` of the step, whose save slot the caller holds;
    /// without them the copy is [`Checkpoints::copy_from`].
    ///
    /// # Errors
    /// [`ErrorKind::AlreadyExists`] when the durable tier holds the step with other bytes;
    /// the copy's errors.
    fn copy(
        &self,
        checkpoint: &Checkpoint,
        streamed: Option<(&str, Heads)>,
    ) -> Result<CommitRecord> {
        let step = checkpoint.step();
        let copied = match streamed {
            Some((save, heads)) => {
                self.durable
                    .copy_containers(checkpoint, save, heads, Durability::Default)
            }
            None => self.durable.copy_from(checkpoint, Durability::Default),
        };
        match copied {
            Err(e) if e.kind() == ErrorKind::AlreadyExists => {
                let there = self.durable.read_record(step)?;
                if there.fingerprint() == checkpoint.record().fingerprint() {
                    Ok(there)
                } else {
                    Err(Error::new(
                        ErrorKind::AlreadyExists,
                        format!(
                            "step {step} is committed on the durable tier with other bytes than \
                             the fast tier's (saved by another run?): it stays as it is"
                        ),
                    )
                    .with_source(e))
                }
            }
            copied => copied,
        }
    }
}

/// Retention on both tiers: [`Tiered::retain`](crate::Tiered::retain), and the pass after
/// each promotion when [`Tiered::with_retention`](crate::Tiered::with_retention) set a policy.
impl Tiers {
    /// See [`Tiered::retain`](crate::Tiered::retain).
    pub(crate) fn retain(&self, policy: &PerTier<Retention>) -> Result<PerTier<Vec<u64>>> {
        let _pass = self.passes.lock().unwrap_or_else(PoisonError::into_inner);
        let mut doomed = self.fast.retention_plan(&policy.fast)?;
        let listed = self.fast.list()?;
        let rank_parts: Vec<u64> = listed
            .iter()
            .filter(|s| s.state == StepState::Uncommitted && s.ranks.is_some())
            .map(|s| s.step)
            .collect();
        if !rank_parts.is_empty() {
            let newest = self.durable.steps()?.last().copied();
            doomed.extend(rank_parts.into_iter().filter(|&s| Some(s) <= newest));
            doomed.sort_unstable();
        }
        // Pending steps are known under the lock; the deletes run outside it, or every save
        // queueing its promotion meanwhile would wait for them. A step queued after this is
        // almost always a newer save's, or the newest trusted one (resuming). One that meets
        // its deletion (an explicit `promote` of a doomed step) fails, or lands with every byte
        // checked against the record read before: the durable tier never commits other bytes.
        //
        // The newest fast step not known to be torn is the one `latest` serves a resumed run,
        // which may still be reading it: it stays, even where the policy, counting a torn step
        // above it as complete, would delete it. Without a torn step, no policy deletes it. A pass
        // that ran before `latest` found the tear cannot know of it, and may still delete it.
        {
            let queue = self.promoter.lock();
            let served = complete_steps(&listed)
                .into_iter()
                .rev()
                .find(|step| !queue.torn.contains(step));
            doomed.retain(|&step| !queue.is_pending(step) && Some(step) != served);
        }
        self.fast.delete_steps(&doomed)?;
        let durable = self.durable.retain(&policy.durable)?;
        Ok(PerTier {
            fast: doomed,
            durable,
        })
    }

    /// The pass of the policy set by [`Tiered::with_retention`](crate::Tiered::with_retention)
    /// after a promotion ended, counted in [`Queue::retaining`] by the caller. A failure (a
    /// panic too: the worker must go on, or `flush` would wait for ever) is kept for `flush`;
    /// a pass that succeeds forgets it.
    fn retain_after_promotion(&self, policy: &PerTier<Retention>) {
        let retained =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.retain(policy)))
                .unwrap_or_else(|_| {
                    Err(Error::new(
                        ErrorKind::Io,
                        "the retention pass after a promotion panicked",
                    ))
                });
        let mut queue = self.promoter.lock();
        queue.retaining -= 1;
        queue.retention_failure = retained.err();
        self.promoter.changed.notify_all();
    }
}

/// A promotion that follows its save ([`following`](crate::following)).
impl Tiers {
    /// Promotes `step` following the fast tier's save of it: streams each container the save
    /// announces on `announced` (the channel closes when the save ends), then copies the
    /// committed step with what was streamed. Returns how it ended and whether it failed
    /// because the save did not commit. It holds the durable tier's save slot throughout, as
    /// a copy does, so gc there leaves its uploads alone and a save or copy made there
    /// directly meanwhile waits for it.
    fn follow(&self, step: u64, announced: Receiver<Followed>) -> (Result<()>, bool) {
        let dir = self.durable.step_dir(step);
        let _in_flight = match self.durable.saves.begin((step, dir.clone())) {
            Ok(in_flight) => in_flight,
            Err(e) => return (Err(e), false),
        };
        let save = unique_token();
        let streamed = self.stream(step, &dir, &save, announced);
        // The channel closed when the save's `write_and_commit` returned, its record written
        // or its failure known; a background save's slot ends just after.
        let (opened, unsaved) = self.saved_on_fast(step);
        let promoted = streamed.and_then(|heads| {
            let checkpoint = opened?;
            self.copy(&checkpoint, Some((&save, heads))).map(drop)
        });
        (promoted, unsaved)
    }

    /// Streams every container announced to directory `save` of `dir` on the durable tier,
    /// until the save ends. The first failure stops the streaming (what it streamed is
    /// dropped, its sinks aborted), but not the save, which it waits for all the same.
    fn stream(
        &self,
        step: u64,
        dir: &str,
        save: &str,
        announced: Receiver<Followed>,
    ) -> Result<Heads> {
        let fast_dir = format!("{}/", self.fast.step_dir(step));
        let mut heads = Heads::new();
        let mut failure = None;
        let mut window = Vec::new();
        for followed in announced {
            let Some(relative) = followed.key.strip_prefix(&fast_dir) else {
                continue;
            };
            if failure.is_some() {
                continue;
            }
            let key = format!("{dir}/{}", layout::moved_into(save, relative));
            match self.stream_one(&followed, &key, &mut window) {
                Ok(Some(head)) => {
                    heads.insert(relative.to_owned(), head);
                }
                Ok(None) => {}
                Err(e) => {
                    // Abort what was streamed now, not when the save ends.
                    heads.clear();
                    failure = Some(e);
                }
            }
        }
        failure.map_or(Ok(heads), Err)
    }

    /// Streams one container to `key` on the durable tier as the save writes it: its head,
    /// or `None` when the save abandoned it.
    fn stream_one(
        &self,
        followed: &Followed,
        key: &str,
        window: &mut Vec<u8>,
    ) -> Result<Option<Head>> {
        let storage = self.durable.storage.as_ref();
        let mut sink = create_container(storage, key, followed.expected_len, Durability::Default)?;
        let (mut len, mut crc) = (0, 0);
        loop {
            let (written, end) = followed.progress.wait_past(len);
            while len < written {
                // At most FOLLOW_WINDOW, so it fits in usize.
                let n = (written - len).min(FOLLOW_WINDOW) as usize;
                window.resize(n, 0);
                followed
                    .reader
                    .read_at(len, window)
                    .map_err(|e| e.context(format!("reading back {}", followed.key)))?;
                sink.write(window)
                    .map_err(|e| e.with_operation("write").with_key(key))?;
                crc = crc32c_append(crc, window);
                len += n as u64;
            }
            match end {
                Some(true) => return Ok(Some(Head { sink, len, crc })),
                Some(false) => return Ok(None),
                None => {}
            }
        }
    }
}
