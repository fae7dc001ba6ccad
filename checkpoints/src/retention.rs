//! Thinning out and cleaning up: retention deletes the checkpoints a policy does not keep
//! (commit record first, so a half-deleted one is never complete), and gc removes what dead
//! saves left behind; neither deletes a container a kept checkpoint, or a save in progress,
//! refers to.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Instant;

use weightbay::{Error, ErrorKind, PendingWrite, Result, Storage};

use crate::layout;
use crate::listing::{Listing, StepState, StepStatus, complete_steps};
use crate::record::{ANNOUNCEMENT_VERSION, Announcement, CommitRecord, now_unix_ms, read_json};
use crate::run::Checkpoints;

/// One value for each tier: a retention policy each ([`Tiered::retain`](crate::Tiered::retain),
/// [`Tiered::with_retention`](crate::Tiered::with_retention)), the steps each deleted, gc's
/// report for each ([`Tiered::gc`](crate::Tiered::gc)).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PerTier<T> {
    /// For the fast tier.
    pub fast: T,
    /// For the durable tier.
    pub durable: T,
}

/// Which checkpoints [`Checkpoints::retain`] keeps. The newest complete checkpoint is always
/// kept, whatever the policy.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Retention {
    /// Keep the newest this many complete checkpoints.
    pub keep_last: Option<usize>,
    /// Keep every checkpoint whose step is a multiple of this.
    pub keep_every: Option<u64>,
}

impl Retention {
    /// Keeps the newest `n` complete checkpoints.
    pub fn keep_last(n: usize) -> Self {
        Self {
            keep_last: Some(n),
            keep_every: None,
        }
    }

    /// Also keeps every checkpoint whose step is a multiple of `k` (a `k` of 0 keeps none).
    #[must_use]
    pub fn and_every(mut self, k: u64) -> Self {
        self.keep_every = (k > 0).then_some(k);
        self
    }
}

/// What [`Checkpoints::gc`] removed, or [`Checkpoints::gc_plan`] would remove.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct GcReport {
    /// Steps whose checkpoints a retention policy deleted ([`Checkpoints::gc_retaining`]):
    /// their records first, then their containers no kept checkpoint refers to, which are
    /// among the orphans.
    pub checkpoints: Vec<u64>,
    /// Keys of containers no commit record names or refers to.
    pub orphans: Vec<String>,
    /// Keys of announcements that protect nothing any more: their save committed, or their
    /// lease ran out.
    pub spent: Vec<String>,
    /// Containers of steps that are no longer checkpoints (deleted by retention, or never
    /// committed) that stay, each with why: a kept checkpoint refers to it, or a save in
    /// progress may.
    pub kept: Vec<(String, String)>,
    /// Unfinished writes under the prefix whose writers are gone (scratch files, staged
    /// objects, multipart uploads and their journals): the storage's own cleanup
    /// ([`Storage::clean_pending`]).
    pub pending: Vec<PendingWrite>,
    /// Unfinished-write records under the prefix that the storage refuses to act on
    /// ([`PendingWrite::refused`]: forged, or another tool's): left untouched, for a person
    /// to look at.
    pub refused: Vec<PendingWrite>,
}

/// What no deletion may touch now: every container a commit record names or its pieces lie
/// in, and every container a save in progress announced or writes in its save directory;
/// with the announcements that protect nothing any more (their save committed, or their
/// lease ran out).
struct Protected {
    /// Each protected key, with why.
    keys: BTreeMap<String, String>,
    /// The save directories of saves in progress (each ending in `/`): every key under one is
    /// protected, with why.
    dirs: Vec<(String, String)>,
    spent: Vec<String>,
    /// Until when the pass may delete on what it read: a sixth of the lease after it began
    /// to read the announcements (the protocol on [`Checkpoints::gc`]).
    deadline: Instant,
}

impl Protected {
    /// Why `key` may not be deleted, if it may not.
    fn why(&self, key: &str) -> Option<&String> {
        self.keys.get(key).or_else(|| {
            self.dirs
                .iter()
                .find(|(dir, _)| key.starts_with(dir.as_str()))
                .map(|(_, why)| why)
        })
    }

    /// Fails once the pass has run past its deadline, saying how far it got.
    fn check_deadline(&self, lease: std::time::Duration, deleted: usize) -> Result<()> {
        if Instant::now() < self.deadline {
            return Ok(());
        }
        Err(Error::new(
            ErrorKind::TimedOut,
            format!(
                "the pass stopped after {deleted} deletions: it had run for a sixth of the \
                 reference lease ({:?}) since it read the announcements, and a save announced \
                 after that may refer to what is left; run it again",
                lease / 6
            ),
        ))
    }
}

impl Checkpoints {
    /// Deletes the committed checkpoints `policy` does not keep ([`retention_plan`]), and
    /// returns their steps. Each goes commit record first, so a checkpoint half deleted is
    /// never complete; then the containers of theirs no kept checkpoint refers to (those stay
    /// until none does, when [`gc`](Self::gc) removes them).
    ///
    /// [`retention_plan`]: Self::retention_plan
    ///
    /// # Errors
    /// The storage's errors; what was deleted before stays deleted.
    pub fn retain(&self, policy: &Retention) -> Result<Vec<u64>> {
        let doomed = self.retention_plan(policy)?;
        self.delete_steps(&doomed)?;
        Ok(doomed)
    }

    /// The complete checkpoints `policy` does not keep, oldest first, without deleting
    /// anything (what [`retain`](Self::retain) would delete). The newest complete checkpoint
    /// is always kept; uncommitted steps are [`gc`](Self::gc)'s; damaged ones are left for a
    /// person to look at (what they name may come back, or be read by hand), and only
    /// [`delete_step`](Self::delete_step) deletes them.
    ///
    /// # Errors
    /// As [`list`](Self::list).
    pub fn retention_plan(&self, policy: &Retention) -> Result<Vec<u64>> {
        Ok(retention_plan(&self.list_judged()?.0, policy))
    }

    /// Deletes the checkpoint of `step`: its commit record first, then everything under its
    /// directory that no other checkpoint refers to.
    ///
    /// # Errors
    /// The storage's errors.
    pub fn delete_step(&self, step: u64) -> Result<()> {
        self.delete_steps(&[step])
    }

    /// Deletes the commit records of `steps`, then what of their directories nothing refers
    /// to.
    pub(crate) fn delete_steps(&self, steps: &[u64]) -> Result<()> {
        if steps.is_empty() {
            return Ok(());
        }
        // The records go first; what they said stays known, so the announcements of their
        // saves are seen as spent.
        let mut deleted = Vec::with_capacity(steps.len());
        for &step in steps {
            if let Ok(record) = self.read_record(step) {
                deleted.push(record);
            }
            delete_if_present(
                self.storage.as_ref(),
                &layout::record_key(&self.step_dir(step)),
            )?;
        }
        let (statuses, listing) = self.list_judged()?;
        let retired = Retired {
            records: &deleted,
            steps: &steps.iter().copied().collect(),
            still_listed: false,
        };
        let protected = self.protected(&statuses, &retired)?;
        let announcements = protected.spent.iter().filter(|key| {
            layout::parse_announcement_key(&self.prefix, key)
                .is_some_and(|(step, _)| retired.steps.contains(&step))
        });
        let stored = steps
            .iter()
            .flat_map(|step| listing.get(step).into_iter().flatten());
        let unprotected = stored
            .map(|listed| &listed.key)
            .filter(|key| protected.why(key).is_none());
        for (count, key) in (steps.len()..).zip(unprotected.chain(announcements)) {
            protected.check_deadline(self.lease, count)?;
            delete_if_present(self.storage.as_ref(), key)?;
        }
        Ok(())
    }

    /// Removes what dead saves left: containers no commit record names or refers to, in steps
    /// up to the newest complete checkpoint (a save of a newer step may still be running
    /// elsewhere, so those are left until a newer checkpoint completes), except the save this
    /// value has in flight, and announcements past their lease; then the unfinished writes
    /// under the prefix whose writers are gone ([`Storage::clean_pending`], where the storage
    /// has them): a killed process's scratch files, staged objects and multipart uploads,
    /// which the store would otherwise keep (and bill) until a lifecycle rule removes them.
    ///
    /// # References and saves racing gc
    ///
    /// An incremental save refers to containers of earlier checkpoints, and any save may be of
    /// a step older than the newest complete one (a backfill, a copy, a rank run again); gc
    /// (and [`retain`](Self::retain)) never deletes a container a commit record names or
    /// refers to, nor one a save in progress writes or will refer to. The protocol, safe
    /// against any number of savers in any processes, any of them killed at any step, while
    /// one gc or retention pass at a time runs on the prefix:
    /// 1. A save first writes an announcement (`refs/step-<n>-<save>.json`): its key names the
    ///    save's own directory (`step-<n>/<save>/`), and it lists every container the save may
    ///    refer to. Only then does it write anything, and an incremental save reads its
    ///    base's commit record again and refers to the base only if the record is still
    ///    there. It commits within five sixths of the lease
    ///    ([`with_reference_lease`](Self::with_reference_lease)) after announcing, or fails
    ///    with nothing committed (a full save or a rank, whose containers are its own, checks
    ///    instead that they are all there right before its commit record, and fails naming
    ///    one that is gone). A save removes its announcement once committed or failed; a
    ///    rank's stays until its step commits.
    /// 2. A pass lists the prefix and reads the commit records, *then* lists the
    ///    announcements, *then* lists the records again and reads the ones that are new. It
    ///    deletes only keys of its first listing, and keeps every container a record it read
    ///    names or refers to, every container an announcement names and everything in an
    ///    announced save's directory, unless the announcement's step has a record (its save
    ///    committed, and the record protects what it needs, or can no longer commit, since
    ///    the record's create-new would fail it), the pass retires that step, or the
    ///    announcement is older than the lease; those announcements it removes.
    ///
    /// A container in the pass's first listing was written after its save's announcement,
    /// so the pass lists that announcement, or the save had removed it, committed, and its
    /// record is in the second reading. A save whose announcement the pass did not list
    /// announced after the pass's first reading, so it read its base's record after that;
    /// the record was then there in the pass's second reading (only a pass deletes records),
    /// so the pass kept what it refers to. A save whose announcement the pass listed is kept
    /// by it; if the announcement was past its lease, an incremental save or a copy had
    /// committed before the listing and its record is in the second reading (a full save or a
    /// rank past its lease is covered by its check before its record instead).
    ///
    /// # Errors
    /// [`ErrorKind::Corrupt`] naming an announcement of an unknown version (it may protect
    /// anything, so nothing is removed); the storage's errors.
    pub fn gc(&self) -> Result<GcReport> {
        self.collect(None, Pass::Delete)
    }

    /// What [`gc`](Self::gc) would remove now, without removing anything. An unfinished write
    /// listed here may still be left by `gc` when it gets there: one whose upload this storage
    /// cannot abort, or one at a key where a live writer is starting an upload at that moment.
    ///
    /// # Errors
    /// As [`list`](Self::list).
    pub fn gc_plan(&self) -> Result<GcReport> {
        self.collect(None, Pass::Plan)
    }

    /// Deletes the complete checkpoints `policy` does not keep and then cleans up as
    /// [`gc`](Self::gc), in one pass whose report names every deletion: the steps, and their
    /// containers among the orphans. What [`retain`](Self::retain) and then `gc` do, reported
    /// so that [`gc_plan_retaining`](Self::gc_plan_retaining) shows the same deletions.
    ///
    /// # Errors
    /// As [`gc`](Self::gc); what was deleted before an error stays deleted.
    pub fn gc_retaining(&self, policy: &Retention) -> Result<GcReport> {
        self.collect(Some(policy), Pass::Delete)
    }

    /// What [`gc_retaining`](Self::gc_retaining) would delete now, deleting nothing: on a
    /// prefix nothing else writes meanwhile, exactly the same report.
    ///
    /// # Errors
    /// As [`list`](Self::list).
    pub fn gc_plan_retaining(&self, policy: &Retention) -> Result<GcReport> {
        self.collect(Some(policy), Pass::Plan)
    }

    /// One pass of gc, after retention by `policy` if given: deleting, or planning what it
    /// would delete. A plan reads the listing as the deleting pass would find it after
    /// deleting the retired records, so the two reports agree.
    fn collect(&self, policy: Option<&Retention>, pass: Pass) -> Result<GcReport> {
        let (mut statuses, mut listing) = self.list_judged()?;
        let doomed = policy.map_or_else(Vec::new, |policy| retention_plan(&statuses, policy));
        let doomed_set: BTreeSet<u64> = doomed.iter().copied().collect();
        let records: Vec<CommitRecord> = statuses
            .iter()
            .filter(|s| doomed_set.contains(&s.step))
            .filter_map(|s| s.record.clone())
            .collect();
        let still_listed = match pass {
            Pass::Delete if !doomed.is_empty() => {
                // The records go first, so a checkpoint half deleted is never complete; the
                // listing is read again after, as the protocol on `gc` needs.
                for &step in &doomed {
                    let key = layout::record_key(&self.step_dir(step));
                    delete_if_present(self.storage.as_ref(), &key)?;
                }
                (statuses, listing) = self.list_judged()?;
                false
            }
            Pass::Delete => false,
            Pass::Plan => {
                for status in statuses.iter_mut().filter(|s| doomed_set.contains(&s.step)) {
                    status.record = None;
                    status.state = StepState::Uncommitted;
                }
                true
            }
        };
        let retired = Retired {
            records: &records,
            steps: &doomed_set,
            still_listed,
        };
        let (mut report, protected) = self.sweep(&statuses, &listing, &retired)?;
        report.checkpoints = doomed;
        let pending = self.storage.capabilities().pending_listing;
        match pass {
            Pass::Delete => {
                let doomed_keys = report.orphans.iter().chain(&report.spent);
                for (count, key) in doomed_keys.enumerate() {
                    protected.check_deadline(self.lease, report.checkpoints.len() + count)?;
                    delete_if_present(self.storage.as_ref(), key)?;
                }
                if pending {
                    (report.refused, report.pending) = self
                        .storage
                        .clean_pending(&self.prefix)?
                        .into_iter()
                        .partition(|p| p.refused.is_some());
                }
            }
            Pass::Plan if pending => {
                let (refused, pending) = self
                    .storage
                    .pending(&self.prefix)?
                    .into_iter()
                    .partition(|p| p.refused.is_some());
                report.refused = refused;
                report.pending = pending;
                report.pending.retain(|p| p.abandoned);
            }
            Pass::Plan => {}
        }
        Ok(report)
    }

    /// What references protect, read in the order the protocol on [`gc`](Self::gc) needs:
    /// `statuses` (the first reading of the records), then the announcements, then the
    /// records that are new since `statuses`. What the pass `retired` protects nothing, but
    /// its saves' announcements, and every announcement of a retired step, are spent. A
    /// record that is damaged protects nothing it could name: its step is kept whole instead.
    fn protected(&self, statuses: &[StepStatus], retired: &Retired<'_>) -> Result<Protected> {
        let deadline = Instant::now() + self.lease / 6;
        let records: Vec<&CommitRecord> =
            statuses.iter().filter_map(|s| s.record.as_ref()).collect();
        let mut keys = BTreeMap::new();
        for record in &records {
            self.protect(record, &mut keys);
        }
        let now = now_unix_ms();
        let lease = u64::try_from(self.lease.as_millis()).unwrap_or(u64::MAX);
        let mut spent = Vec::new();
        let mut dirs = Vec::new();
        let dir = layout::announcements_dir(&self.prefix);
        for listed in self.storage.list(&dir)? {
            let read: Result<Announcement> =
                read_json(self.storage.as_ref(), &listed.key, "announcement");
            let announcement = match read {
                Ok(a) if a.weightbay_announcement == ANNOUNCEMENT_VERSION => a,
                // Spent and removed by another pass meanwhile.
                Err(e) if e.kind() == ErrorKind::NotFound => continue,
                Ok(a) => {
                    return Err(Error::new(
                        ErrorKind::Corrupt,
                        format!("an announcement of version {}", a.weightbay_announcement),
                    )
                    .with_key(&listed.key));
                }
                Err(e) => return Err(e),
            };
            let save = layout::parse_announcement_key(&self.prefix, &listed.key);
            // Once its step has a record, a save committed it, or can no longer (the record's
            // create-new fails it): its record protects what it needs. A step retired is
            // deleted whole, saves of it in progress included (each fails at its check before
            // its record).
            let committed = save.as_ref().is_some_and(|(step, _)| {
                let mut recorded = records.iter().copied().chain(retired.records);
                recorded.any(|r| r.step == *step) || retired.steps.contains(step)
            });
            if committed || now.saturating_sub(announcement.time_unix_ms) >= lease {
                spent.push(listed.key);
                continue;
            }
            for key in &announcement.keys {
                let why = format!(
                    "a save of step {} in progress may refer to it",
                    announcement.step
                );
                keys.entry(layout::under(&self.prefix, key)).or_insert(why);
            }
            // Whatever the save writes lies in its own directory, named by the announcement's
            // key: a full save of a step older than the newest complete one, a copy, a rank.
            if let Some((step, token)) = save {
                let why = format!("a save of step {step} in progress writes it");
                dirs.push((format!("{}/{token}/", self.step_dir(step)), why));
            }
        }
        let read: BTreeSet<u64> = records.iter().map(|r| r.step).collect();
        for (step, stored) in self.listing()? {
            let record_key = layout::record_key(&self.step_dir(step));
            let listed = stored.iter().any(|l| l.key == record_key);
            let ignored = retired.still_listed && retired.steps.contains(&step);
            if read.contains(&step) || ignored || !listed {
                continue;
            }
            match self.read_record(step) {
                Ok(record) => self.protect(&record, &mut keys),
                // Gone since, or damaged (as `list` reports it): the sweep keeps a damaged
                // step whole.
                Err(e) if matches!(e.kind(), ErrorKind::NotFound | ErrorKind::Corrupt) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(Protected {
            keys,
            dirs,
            spent,
            deadline,
        })
    }

    /// Adds every container `record` names or its pieces lie in to `keys`.
    fn protect(&self, record: &CommitRecord, keys: &mut BTreeMap<String, String>) {
        let dir = self.step_dir(record.step);
        for container in &record.containers {
            keys.entry(format!("{dir}/{}", container.key))
                .or_insert_with(|| format!("step {} holds it", record.step));
        }
        for piece in record.pieces.iter().flat_map(|p| &p.list) {
            keys.entry(layout::under(&self.prefix, &piece.key))
                .or_insert_with(|| format!("step {} refers to it", record.step));
        }
    }

    /// What [`gc`](Self::gc) would remove and keep of `statuses`, but for unfinished
    /// writes, with what protects the rest ([`protected`](Self::protected)'s arguments).
    /// Only keys of `listing`, the listing `statuses` were judged on, are candidates: they
    /// were listed before the announcements were, so a save that wrote one had announced it
    /// by then.
    fn sweep(
        &self,
        statuses: &[StepStatus],
        listing: &Listing,
        retired: &Retired<'_>,
    ) -> Result<(GcReport, Protected)> {
        let protected = self.protected(statuses, retired)?;
        let newest_complete = statuses
            .iter()
            .rev()
            .find(|s| s.state == StepState::Complete)
            .map(|s| s.step);
        let writing: Vec<String> = {
            let state = self.saves.lock();
            let one = state.in_flight.iter().map(|(_, save_dir)| save_dir.clone());
            one.chain(state.ranks_in_flight.iter().cloned()).collect()
        };
        let mut orphans = Vec::new();
        let mut kept = Vec::new();
        for status in statuses {
            if newest_complete.is_none_or(|newest| status.step > newest) {
                continue;
            }
            if status.state != StepState::Uncommitted && status.record.is_none() {
                // Damaged beyond reading its record: what it names is unknown, so keep all.
                continue;
            }
            let dir = self.step_dir(status.step);
            let world_size = status
                .record
                .as_ref()
                .and_then(|r| r.world_size)
                .unwrap_or(0);
            let manifests =
                (0..world_size).map(|rank| layout::manifest_key(&dir, rank, world_size));
            // A multi-rank step keeps its commit intent: it is part of the step, not an orphan.
            let intent = (world_size > 0).then(|| layout::intent_key(&dir));
            let named: BTreeSet<String> = status
                .record
                .iter()
                .flat_map(|r| r.containers.iter().map(|c| format!("{dir}/{}", c.key)))
                .chain(manifests)
                .chain(intent)
                .chain(std::iter::once(layout::record_key(&dir)))
                .collect();
            for listed in listing.get(&status.step).into_iter().flatten() {
                let saving = writing
                    .iter()
                    .any(|save_dir| listed.key.starts_with(&format!("{save_dir}/")));
                if named.contains(&listed.key) || saving {
                    continue;
                }
                match protected.why(&listed.key) {
                    Some(why) => kept.push((listed.key.clone(), why.clone())),
                    None => orphans.push(listed.key.clone()),
                }
            }
        }
        let report = GcReport {
            checkpoints: Vec::new(),
            orphans,
            spent: protected.spent.clone(),
            kept,
            pending: Vec::new(),
            refused: Vec::new(),
        };
        Ok((report, protected))
    }
}

/// What a pass retires: the commit records it deleted (or, planning, would delete), and the
/// steps it deletes whole.
struct Retired<'a> {
    records: &'a [CommitRecord],
    steps: &'a BTreeSet<u64>,
    /// A plan's: the retired records are still there, and the second reading skips them.
    still_listed: bool,
}

/// Whether a gc pass deletes, or only says what it would delete.
#[derive(Clone, Copy)]
enum Pass {
    Delete,
    Plan,
}

/// The complete steps of `statuses` that `policy` does not keep, oldest first; the newest
/// complete one is always kept.
fn retention_plan(statuses: &[StepStatus], policy: &Retention) -> Vec<u64> {
    let complete = complete_steps(statuses);
    let mut keep: BTreeSet<u64> = complete.last().copied().into_iter().collect();
    if let Some(n) = policy.keep_last {
        keep.extend(complete.iter().rev().take(n));
    }
    complete
        .into_iter()
        .filter(|&step| {
            let every = policy.keep_every.is_some_and(|k| step % k == 0);
            !every && !keep.contains(&step)
        })
        .collect()
}

/// Deletes `key`; one already gone is fine.
pub(crate) fn delete_if_present(storage: &dyn Storage, key: &str) -> Result<()> {
    match storage.delete(key) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e.with_key(key)),
    }
}
