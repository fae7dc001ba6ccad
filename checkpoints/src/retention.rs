//! Thinning out and cleaning up: retention deletes the checkpoints a policy does not keep
//! (commit record first, so a half-deleted one is never complete), and gc removes what dead
//! saves left behind.

use std::collections::BTreeSet;

use weightbay::{ErrorKind, PendingWrite, Result, Storage};

use crate::checkpoints::Checkpoints;
use crate::layout;
use crate::listing::StepState;

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
    /// Keys of containers no commit record names.
    pub orphans: Vec<String>,
    /// Unfinished writes under the prefix whose writers are gone (scratch files, staged
    /// objects, multipart uploads and their journals): the storage's own cleanup
    /// ([`Storage::clean_pending`]).
    pub pending: Vec<PendingWrite>,
}

impl Checkpoints {
    /// Deletes the committed checkpoints `policy` does not keep ([`retention_plan`]), and
    /// returns their steps. Each goes commit record first, so a checkpoint half deleted is
    /// never complete; then its containers.
    ///
    /// [`retention_plan`]: Self::retention_plan
    ///
    /// # Errors
    /// The storage's errors; what was deleted before stays deleted.
    pub fn retain(&self, policy: &Retention) -> Result<Vec<u64>> {
        let doomed = self.retention_plan(policy)?;
        for &step in &doomed {
            self.delete_step(step)?;
        }
        Ok(doomed)
    }

    /// The committed steps `policy` does not keep, oldest first, without deleting anything
    /// (what [`retain`](Self::retain) would delete). The newest complete checkpoint is always
    /// kept; uncommitted steps are [`gc`](Self::gc)'s.
    ///
    /// # Errors
    /// As [`list`](Self::list).
    pub fn retention_plan(&self, policy: &Retention) -> Result<Vec<u64>> {
        let statuses = self.list()?;
        let complete: Vec<u64> = statuses
            .iter()
            .filter(|s| s.state == StepState::Complete)
            .map(|s| s.step)
            .collect();
        let mut keep: BTreeSet<u64> = complete.last().copied().into_iter().collect();
        if let Some(n) = policy.keep_last {
            keep.extend(complete.iter().rev().take(n));
        }
        Ok(statuses
            .into_iter()
            .filter(|status| {
                let committed = status.state != StepState::Uncommitted;
                let every = policy.keep_every.is_some_and(|k| status.step % k == 0);
                committed && !every && !keep.contains(&status.step)
            })
            .map(|status| status.step)
            .collect())
    }

    /// Deletes the checkpoint of `step`: its commit record first, then everything under its
    /// directory.
    ///
    /// # Errors
    /// The storage's errors.
    pub fn delete_step(&self, step: u64) -> Result<()> {
        let dir = self.step_dir(step);
        match self.storage.delete(&layout::record_key(&dir)) {
            Ok(()) => {}
            Err(e) if e.kind() == ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        for listed in self.storage.list(&dir)? {
            delete_if_present(self.storage.as_ref(), &listed.key)?;
        }
        Ok(())
    }

    /// Removes what dead saves left: containers no commit record names, in steps up to the
    /// newest complete checkpoint (a save of a newer step may still be running elsewhere, so
    /// those are left until a newer checkpoint completes), except the save this value has in
    /// flight; then the unfinished writes under the prefix whose writers are gone
    /// ([`Storage::clean_pending`], where the storage has them): a killed process's scratch
    /// files, staged objects and multipart uploads, which the store would otherwise keep (and
    /// bill) until a lifecycle rule removes them.
    ///
    /// # Errors
    /// The storage's errors.
    pub fn gc(&self) -> Result<GcReport> {
        let orphans = self.orphans()?;
        for key in &orphans {
            delete_if_present(self.storage.as_ref(), key)?;
        }
        let pending = if self.storage.capabilities().pending_listing {
            self.storage.clean_pending(&self.prefix)?
        } else {
            Vec::new()
        };
        Ok(GcReport { orphans, pending })
    }

    /// What [`gc`](Self::gc) would remove now, without removing anything. An unfinished write
    /// listed here may still be left by `gc` when it gets there: one whose upload this storage
    /// cannot abort, or one at a key where a live writer is starting an upload at that moment.
    ///
    /// # Errors
    /// As [`list`](Self::list).
    pub fn gc_plan(&self) -> Result<GcReport> {
        let orphans = self.orphans()?;
        let pending = if self.storage.capabilities().pending_listing {
            let mut pending = self.storage.pending(&self.prefix)?;
            pending.retain(|p| p.abandoned);
            pending
        } else {
            Vec::new()
        };
        Ok(GcReport { orphans, pending })
    }

    /// The containers [`gc`](Self::gc) would remove.
    fn orphans(&self) -> Result<Vec<String>> {
        let statuses = self.list()?;
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
            for listed in self.storage.list(&dir)? {
                let saving = writing
                    .iter()
                    .any(|save_dir| listed.key.starts_with(&format!("{save_dir}/")));
                if !named.contains(&listed.key) && !saving {
                    orphans.push(listed.key);
                }
            }
        }
        Ok(orphans)
    }
}

/// Deletes `key`; one already gone is fine.
pub(crate) fn delete_if_present(storage: &dyn Storage, key: &str) -> Result<()> {
    match storage.delete(key) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e.with_key(key)),
    }
}
