//! Tiered checkpoints: saves commit on a fast tier (local disk) at its speed, are promoted to a
//! durable tier (object storage) in the background, and a resumed run loads the newest
//! checkpoint either tier holds whole, the fast tier's verified first.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};

use weightbay::{Result, Writer};

use crate::background::SaveHandle;
use crate::checkpoint::Checkpoint;
use crate::listing::{StepState, StepStatus, complete_steps};
use crate::promoter::{Job, Promoter, Tiers};
use crate::promotion::{Promotion, PromotionState};
use crate::ranks::{RankOutcome, RankSave};
use crate::record::CommitRecord;
use crate::retention::{GcReport, PerTier, Retention};
use crate::run::Checkpoints;
use crate::save::SaveOptions;

/// A step found on either tier, with its state on each and its promotion.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct TieredStatus {
    /// The training step.
    pub step: u64,
    /// The step on the fast tier, if it has anything of it.
    pub fast: Option<StepStatus>,
    /// The step on the durable tier, if it has anything of it.
    pub durable: Option<StepStatus>,
    /// Its promotion, when this value saved it (or queued it on resuming); none for steps
    /// of earlier processes.
    pub promotion: Option<PromotionState>,
}

impl TieredStatus {
    /// Whether the durable tier holds the step complete: it survives the loss of the machine.
    pub fn is_durable(&self) -> bool {
        self.durable
            .as_ref()
            .is_some_and(|s| s.state == StepState::Complete)
    }
}

/// The checkpoints of a run on two tiers: a **fast** one that saves commit on (a local
/// directory, at disk speed) and a **durable** one they are promoted to in the background (an
/// object store, which survives the machine), each a [`Checkpoints`] prefix of any storage.
/// Cheap to clone; clones share the promotions in flight.
///
/// - A save commits on the fast tier (its containers, then its commit record, durable there),
///   and queues its promotion; the training loop goes on. The promotion copies the containers
///   with their CRC32C checked on the way and writes the commit record last
///   ([`Checkpoints::copy_from`]), so the durable tier commits a step whole or not at all, with
///   the fast tier's bytes.
/// - A background save that finds no promotion waiting or running is followed instead: while
///   it writes, what it has written is read back ([`Sink::read_back`](weightbay::Sink::read_back))
///   and streamed to the durable tier, so the step is durable about when the slower of the two
///   would be alone, not after both in turn. The save never waits for it; the containers are
///   checked against the fast tier's record and the durable record is written last, as above.
/// - When promotion is slower than saving, newer saves take the place of older waiting
///   promotions by the [`Promotion`] policy, which also bounds how long a save may be held;
///   [`list`](Self::list) shows what was skipped.
/// - [`latest`](Self::latest) resumes from the newest checkpoint either tier holds whole. The
///   fast tier's are verified against their records first, unless this value saved them, so a
///   local copy torn by a crash is never returned; with the fast tier empty or damaged (the
///   machine was replaced), the durable tier serves.
/// - [`retain`](Self::retain) keeps each tier by its own policy and never deletes a fast
///   step whose promotion waits or runs; [`with_retention`](Self::with_retention) applies
///   such a policy on the promotion's thread after each promotion, so the loop never waits for
///   deletes; [`gc`](Self::gc) cleans both, never touching a promotion in flight.
///
/// ```
/// use std::time::Duration;
/// use weightbay::{MemoryStorage, Tensor, Writer};
/// use weightbay_checkpoints::{Checkpoints, PerTier, Promotion, Retention, Tiered};
///
/// let fast = Checkpoints::new(MemoryStorage::new(), "run-1"); // a local directory, say
/// let durable = Checkpoints::new(MemoryStorage::new(), "run-1"); // s3://bucket/runs, say
/// let tiered = Tiered::new(fast, durable)
///     .with_promotion(Promotion::newest_only().with_max_block(Duration::from_millis(50)))
///     .with_retention(PerTier {
///         fast: Retention::keep_last(2),
///         durable: Retention::keep_last(5).and_every(1000),
///     });
/// for step in [100, 200, 300] {
///     let weights = vec![Tensor::from_slice("w", [2], &[step as f32, 1.0])];
///     tiered.save(step, Writer::new(weights))?; // durable on the fast tier when it returns
/// }
/// tiered.flush()?; // every queued promotion has landed, and retention after it
/// let latest = tiered.latest()?.expect("saved");
/// assert_eq!(latest.step(), 300);
/// assert!(tiered.list()?.iter().any(|s| s.step == 300 && s.is_durable()));
/// # Ok::<(), weightbay::Error>(())
/// ```
#[derive(Debug, Clone)]
pub struct Tiered {
    tiers: Arc<Tiers>,
    promotion: Promotion,
}

impl Tiered {
    /// Checkpoints saved on `fast` and promoted to `durable` by [`Promotion::newest_only`].
    /// Both must list ([`Storage::list`](weightbay::Storage::list)) for everything but saving.
    pub fn new(fast: Checkpoints, durable: Checkpoints) -> Self {
        Self {
            tiers: Arc::new(Tiers {
                fast,
                durable,
                promoter: Promoter::default(),
                passes: Mutex::default(),
            }),
            promotion: Promotion::default(),
        }
    }

    /// Promotes by `policy` instead.
    #[must_use]
    pub fn with_promotion(mut self, policy: Promotion) -> Self {
        self.promotion = policy;
        self
    }

    /// The fast tier.
    pub fn fast(&self) -> &Checkpoints {
        &self.tiers.fast
    }

    /// The durable tier.
    pub fn durable(&self) -> &Checkpoints {
        &self.tiers.durable
    }

    /// Saves `writer`'s tensors as the checkpoint of `step` on the fast tier and queues its
    /// promotion. See [`save_with`](Self::save_with).
    ///
    /// # Errors
    /// As [`save_with`](Self::save_with).
    pub fn save(&self, step: u64, writer: Writer) -> Result<CommitRecord> {
        self.save_with(step, writer, SaveOptions::default())
    }

    /// Saves on the fast tier as [`Checkpoints::save_with`] does, then queues the promotion
    /// (held at most the policy's [`max_block`](Promotion::max_block)). Returns the fast
    /// tier's commit record.
    ///
    /// # Errors
    /// As [`Checkpoints::save_with`] on the fast tier; [`ErrorKind::Io`](weightbay::ErrorKind::Io) when the promotion
    /// thread cannot start (the checkpoint is saved on the fast tier all the same).
    pub fn save_with(
        &self,
        step: u64,
        writer: Writer,
        options: SaveOptions,
    ) -> Result<CommitRecord> {
        let record = self.tiers.fast.save_with(step, writer, options)?;
        self.saved(step, false)?;
        Ok(record)
    }

    /// Starts saving on the fast tier as [`Checkpoints::save_in_background`] does (waiting
    /// first for the fast tier's save in flight, if any). With no promotion waiting or running,
    /// the promotion starts at once and follows the save, streaming what it has written (where
    /// the fast tier's sinks read back, as local files and memory do); otherwise it is queued
    /// and starts once the save has committed. The handle reports the fast tier's save.
    ///
    /// # Errors
    /// As [`Checkpoints::save_in_background`]; [`ErrorKind::Io`](weightbay::ErrorKind::Io) when the promotion thread
    /// cannot start.
    pub fn save_in_background(
        &self,
        step: u64,
        writer: Writer,
        options: SaveOptions,
    ) -> Result<SaveHandle> {
        let follow = || self.tiers.follow_save(step, &self.promotion);
        let (handle, followed) = self
            .tiers
            .fast
            .save_in_background_followed(step, writer, options, follow)?;
        self.saved(step, followed)?;
        Ok(handle)
    }

    /// Trusts `step`, which this value saves on the fast tier (it is complete there only once
    /// the save commits), and queues its promotion unless it follows the save already.
    fn saved(&self, step: u64, followed: bool) -> Result<()> {
        self.tiers.promoter.lock().trust(step);
        if followed {
            return Ok(());
        }
        self.tiers.queue(Job { step, rank: None }, &self.promotion)
    }

    /// Saves one rank's part of `step` on the fast tier ([`Checkpoints::save_rank`]; on a fast
    /// tier each node has to itself, the step never commits there) and queues the promotion
    /// of that part: the rank's containers copied to the durable tier (CRC32C checked), then
    /// its manifest, then the listing after which the rank that sees every manifest commits,
    /// so no node waits for another and the durable tier commits by the protocol of
    /// [`RankSave`]. The policy's [`multiples_of`](Promotion::multiples_of) chooses the steps
    /// promoted, but a rank's part is never superseded (each node would otherwise skip other
    /// steps, and no step would have every part). The save's timeout bounds the fast tier's
    /// save. Returns the fast tier's outcome; the part's promotion shows as the step's in
    /// [`list`](Self::list).
    ///
    /// # Errors
    /// [`ErrorKind::InvalidInput`](weightbay::ErrorKind::InvalidInput) for a save with a
    /// rendezvous; as [`Checkpoints::save_rank`] on the fast tier;
    /// [`ErrorKind::Io`](weightbay::ErrorKind::Io) when the promotion thread cannot start.
    pub fn save_rank(&self, step: u64, save: RankSave) -> Result<RankOutcome> {
        if save.has_rendezvous() {
            return Err(weightbay::Error::invalid(
                "a tiered rank save commits on the durable tier by listing its manifests: a \
                 rendezvous (RankSave::with_rendezvous) would decide on the node's own fast \
                 tier, which holds no other rank's part",
            ));
        }
        let rank = save.rank();
        let outcome = self.tiers.fast.save_rank(step, save)?;
        let job = Job {
            step,
            rank: Some(rank),
        };
        self.tiers.queue(job, &self.promotion)?;
        Ok(outcome)
    }

    /// Promotes the checkpoint of `step` now, on the calling thread, whatever the policy: one
    /// the policy skipped, or one whose promotion failed, to retry it (a rank's part is
    /// promoted again by its rank's next [`save_rank`](Self::save_rank) of the step).
    ///
    /// # Errors
    /// [`ErrorKind::NotFound`](weightbay::ErrorKind::NotFound) when the fast tier holds no complete `step`;
    /// [`ErrorKind::AlreadyExists`](weightbay::ErrorKind::AlreadyExists) when the durable tier holds `step` with other bytes; the
    /// copy's errors.
    pub fn promote(&self, step: u64) -> Result<CommitRecord> {
        self.tiers.promote(step)
    }

    /// Waits for the fast tier's save in flight, every queued promotion and the retention
    /// passes after them ([`with_retention`](Self::with_retention)), and reports a queued
    /// promotion that failed with no newer one succeeding since (once: a second flush does not
    /// report it again), else the newest retention pass that failed (once too). Call it
    /// before a program exits: `Ok` means the newest checkpoint promoted is durable.
    ///
    /// # Errors
    /// As [`Checkpoints::flush`] on the fast tier; else that promotion's error, its kind and
    /// cause kept, saying which step is on the fast tier only; else that retention pass's.
    pub fn flush(&self) -> Result<()> {
        let saved = self.tiers.fast.flush();
        self.tiers.promoter.wait_idle();
        saved?;
        let mut queue = self.tiers.promoter.lock();
        if let Some((step, e)) = queue.failure.take() {
            return Err(e.context(format!(
                "step {step} is on the fast tier only: its promotion failed"
            )));
        }
        match queue.retention_failure.take() {
            Some(e) => Err(e.context("the retention pass after a promotion failed")),
            None => Ok(()),
        }
    }

    /// Every step on either tier, oldest first, with its state on each and its promotion.
    ///
    /// # Errors
    /// As [`Checkpoints::list`] on either tier.
    pub fn list(&self) -> Result<Vec<TieredStatus>> {
        let mut steps: BTreeMap<u64, TieredStatus> = BTreeMap::new();
        let entry = |step| TieredStatus {
            step,
            fast: None,
            durable: None,
            promotion: None,
        };
        for status in self.tiers.fast.list()? {
            let step = status.step;
            steps.entry(step).or_insert_with(|| entry(step)).fast = Some(status);
        }
        for status in self.tiers.durable.list()? {
            let step = status.step;
            steps.entry(step).or_insert_with(|| entry(step)).durable = Some(status);
        }
        let queue = self.tiers.promoter.lock();
        Ok(steps
            .into_values()
            .map(|mut status| {
                status.promotion = queue.outcome(status.step).cloned();
                status
            })
            .collect())
    }

    /// The newest checkpoint either tier holds whole: what a resumed run loads. The fast
    /// tier's copy is preferred at the same step (it is local). A fast-tier checkpoint this
    /// value did not save itself is verified first (every byte against its record, once per
    /// value), and one that fails is passed over for an older one or the durable tier's. The
    /// newest fast-tier checkpoint found not yet durable is queued for promotion, so a run
    /// killed before promoting it promotes it on resuming.
    ///
    /// A fast tier that cannot be listed (its directory gone with the machine) counts as
    /// empty; the durable tier's errors count only when the fast tier has nothing to offer.
    ///
    /// # Errors
    /// The durable tier's errors, as [`Checkpoints::latest`], when the fast tier has no
    /// checkpoint to return.
    pub fn latest(&self) -> Result<Option<Checkpoint>> {
        let durable = self.tiers.durable.latest();
        let floor = match &durable {
            Ok(Some(checkpoint)) => checkpoint.step(),
            _ => 0,
        };
        let steps = self
            .tiers
            .fast
            .list()
            .map(|list| complete_steps(&list))
            .unwrap_or_default();
        let fast = steps
            .into_iter()
            .rev()
            .take_while(|&step| step >= floor)
            .find_map(|step| self.trusted_fast(step));
        match fast {
            Some(fast) => {
                let durable_step = durable.ok().flatten().map(|c| c.step());
                let known = self.tiers.promoter.lock().outcome(fast.step()).is_some();
                if durable_step != Some(fast.step()) && !known {
                    let job = Job {
                        step: fast.step(),
                        rank: None,
                    };
                    self.tiers.queue(job, &self.promotion)?;
                }
                Ok(Some(fast))
            }
            None => durable,
        }
    }

    /// The checkpoint of `step`: the fast tier's when it is complete there and trusted (as in
    /// [`latest`](Self::latest)), else the durable tier's.
    ///
    /// # Errors
    /// As [`Checkpoints::open`] on the durable tier.
    pub fn open(&self, step: u64) -> Result<Checkpoint> {
        match self.trusted_fast(step) {
            Some(checkpoint) => Ok(checkpoint),
            None => self.tiers.durable.open(step),
        }
    }

    /// The fast tier's checkpoint of `step` when it is complete there and this value saved it
    /// or it verifies.
    fn trusted_fast(&self, step: u64) -> Option<Checkpoint> {
        if self.tiers.promoter.lock().torn.contains(&step) {
            return None;
        }
        let checkpoint = self.tiers.fast.open(step).ok()?;
        if self.tiers.promoter.lock().trusts(step) {
            return Some(checkpoint);
        }
        let verified = checkpoint.verify();
        let mut queue = self.tiers.promoter.lock();
        match verified {
            Ok(_) => {
                queue.trust(step);
                Some(checkpoint)
            }
            Err(_) => {
                queue.torn.insert(step);
                None
            }
        }
    }

    /// Deletes, on each tier, the committed checkpoints its policy does not keep (as
    /// [`Checkpoints::retain`]), except that the fast tier keeps every step whose promotion
    /// waits or is being copied, and the newest step not found torn (the one
    /// [`latest`](Self::latest) serves when a newer one is torn, which a policy counting the
    /// torn one would delete). On the fast tier, rank parts of steps it never committed
    /// (each node saving to a disk of its own) go once the durable tier's newest complete
    /// checkpoint is as new as they are. Returns the steps deleted on each.
    ///
    /// # Errors
    /// Either tier's errors; what was deleted before stays deleted.
    pub fn retain(&self, policy: &PerTier<Retention>) -> Result<PerTier<Vec<u64>>> {
        self.tiers.retain(policy)
    }

    /// Applies `policy` as [`retain`](Self::retain) does, on the promotion's thread after
    /// each queued or followed promotion ends (promoted or failed; not after an explicit
    /// [`promote`](Self::promote)), instead of on the caller's: a training loop then never
    /// waits for retention, whose deletes can take a second each while a background save
    /// keeps the disk busy (a directory's fsync waits for the file system's journal, which
    /// waits for the save's data).
    ///
    /// - Until the next promotion ends, the fast tier may hold the steps saved since the last.
    /// - The pass runs before the next promotion starts: a save that comes meanwhile is
    ///   queued, not followed, and with [`Promotion::newest_only`] a slow pass means more
    ///   superseded steps.
    /// - Passes never overlap this value's [`retain`](Self::retain) or [`gc`](Self::gc). A
    ///   prefix takes one pass at a time from one process: with ranks saving from several
    ///   nodes ([`save_rank`](Self::save_rank)), set a policy on one rank only.
    /// - A pass that fails is reported by [`flush`](Self::flush) unless a later pass
    ///   succeeded; the next promotion's pass tries again.
    /// - The policy is the promotions', which clones of this value share: it applies to
    ///   theirs too.
    #[must_use]
    pub fn with_retention(self, policy: PerTier<Retention>) -> Self {
        self.tiers.promoter.lock().retention = Some(policy);
        self
    }

    /// Stores what promotions copy to the durable tier compressed
    /// ([`Checkpoints::copy_compressed_from`]): the fast tier keeps its containers raw, so
    /// they stay mmap-able and load at disk speed, and the durable tier, across the slower
    /// link, stores and sends fewer bytes. A promotion then starts once its save has
    /// committed, never following a save as it writes. Sharded sets and rank parts are
    /// promoted raw. Clones of this value share the setting, as they share the promotions.
    #[must_use]
    pub fn with_compressed_promotion(self) -> Self {
        self.tiers.promoter.lock().compress = true;
        self
    }

    /// [`Checkpoints::gc`] on each tier. A promotion in flight is this value's durable tier's
    /// save in flight, which its gc leaves alone.
    ///
    /// # Errors
    /// Either tier's errors.
    pub fn gc(&self) -> Result<PerTier<GcReport>> {
        let _pass = self
            .tiers
            .passes
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        Ok(PerTier {
            fast: self.tiers.fast.gc()?,
            durable: self.tiers.durable.gc()?,
        })
    }
}
