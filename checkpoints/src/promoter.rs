//! The promotion queue of a [`Tiered`](crate::Tiered) value and its worker: checkpoints saved
//! on the fast tier, copied to the durable tier on a thread of their own, in order, the newest
//! taking the place of older ones that wait when promotion falls behind. The queue holds step
//! numbers only (the bytes wait on the fast tier), so a save is never held back by promotion
//! longer than its policy's bound. A background save that finds nothing waiting or being
//! copied is followed instead, streamed to the durable tier as it writes
//! ([`following`](crate::following)).

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::mpsc::Sender;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::Instant;

use weightbay::{Background, Durability, Error, ErrorKind, Result};

use crate::checkpoint::Checkpoint;
use crate::following::{Followed, Heads};
use crate::promotion::{Promotion, PromotionState};
use crate::record::CommitRecord;
use crate::retention::{PerTier, Retention};
use crate::run::Checkpoints;

/// The promotion outcomes a value remembers: older ones are forgotten (a step forgotten shows
/// no promotion state in [`Tiered::list`](crate::Tiered::list)).
const REMEMBERED: usize = 4096;

/// The queue of promotions, its outcomes, and the worker thread that copies.
#[derive(Debug, Default)]
pub(crate) struct Promoter {
    state: Mutex<Queue>,
    pub(crate) changed: Condvar,
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
    pub(crate) retaining: usize,
    /// Whether promotions store the durable tier's pieces encoded
    /// ([`Tiered::with_compressed_promotion`](crate::Tiered::with_compressed_promotion)).
    pub(crate) compress: bool,
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
        // A followed save streams its containers raw: a compressed promotion waits for the
        // save to commit instead.
        if !step.is_multiple_of(policy.multiple_of)
            || queue.compress
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
    pub(crate) fn saved_on_fast(&self, step: u64) -> (Result<Checkpoint>, bool) {
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
    /// without them the copy is [`Checkpoints::copy_from`], or with compressed promotions
    /// [`Checkpoints::copy_compressed_from`] for a checkpoint of one container (sharded sets
    /// and rank parts are promoted raw).
    ///
    /// # Errors
    /// [`ErrorKind::AlreadyExists`] when the durable tier holds the step with other bytes;
    /// the copy's errors.
    pub(crate) fn copy(
        &self,
        checkpoint: &Checkpoint,
        streamed: Option<(&str, Heads)>,
    ) -> Result<CommitRecord> {
        let step = checkpoint.step();
        let compress = self.promoter.lock().compress && checkpoint.record().is_one_container();
        let copied = match streamed {
            Some((save, heads)) => {
                self.durable
                    .copy_containers(checkpoint, save, heads, Durability::Default)
            }
            None if compress => self
                .durable
                .copy_compressed_from(checkpoint, Durability::Default),
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
