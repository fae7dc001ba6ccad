//! Finding checkpoints: every step under the prefix with its state, the newest complete one,
//! and one step opened after checking that its containers are all there. One listing, plus a
//! read per commit record examined.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use weightbay::{Error, ErrorKind, ForeignEntry, Listed, Result};

use crate::checkpoint::Checkpoint;
use crate::layout;
use crate::parallel;
use crate::record::{CommitRecord, ContainerRecord, FAILURE_VERSION, RankFailure, read_json};
use crate::run::Checkpoints;

/// Everything stored under a run's prefix, by step: what [`Checkpoints::listing`] found.
pub(crate) type Listing = BTreeMap<u64, Vec<Listed>>;

/// A step found under the prefix, committed or not.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct StepStatus {
    /// The training step.
    pub step: u64,
    /// Its commit record, when there is one.
    pub record: Option<CommitRecord>,
    /// Whether it is committed and every container it names is present with its length.
    pub state: StepState,
    /// Bytes stored under the step's directory.
    pub stored_bytes: u64,
    /// For a step written by several ranks, the rank manifests listed: which ranks finished.
    pub ranks: Option<RankProgress>,
    /// What lies in the step's directory (or stands for it) that no container can be: a
    /// symlink, an object whose key no store can address
    /// ([`Storage::list_foreign`](weightbay::Storage::list_foreign)). Reported by
    /// [`Checkpoints::list`], never read, walked into or deleted; empty in what
    /// [`Checkpoints::gc`] and [`Checkpoints::retain`] judge, which never look.
    pub foreign: Vec<ForeignEntry>,
}

impl StepStatus {
    /// The other steps whose directories hold containers this step's checkpoint refers to
    /// ([`CommitRecord::references`]): those stay, retired or not, while it is kept.
    pub fn referenced_steps(&self) -> BTreeSet<u64> {
        self.record
            .iter()
            .flat_map(CommitRecord::references)
            .filter_map(|(key, _)| layout::step_of("", &key))
            .collect()
    }
}

/// A [`StepStatus`] whose failure records are named but not yet read.
struct Status {
    /// Why the record could not be read, when the storage failed (not its content).
    unread: Option<Error>,
    step: u64,
    record: Option<CommitRecord>,
    state: StepState,
    stored_bytes: u64,
    ranks: Option<(RankProgress, Vec<String>)>,
}

impl From<Status> for StepStatus {
    fn from(status: Status) -> Self {
        Self {
            step: status.step,
            record: status.record,
            state: status.state,
            stored_bytes: status.stored_bytes,
            ranks: status.ranks.map(|(progress, _)| progress),
            foreign: Vec::new(),
        }
    }
}

/// Whether a step is a checkpoint that can be loaded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StepState {
    /// Committed, and every container is present with the recorded length.
    Complete,
    /// Committed, but something is wrong: what (a container missing or of another length, an
    /// unreadable record).
    Damaged(String),
    /// No commit record: a save in progress, or one that died.
    Uncommitted,
    /// Nothing a checkpoint is made of, only what no container can be
    /// ([`StepStatus::foreign`]): a symlink planted as the step's directory, an object whose
    /// key no store can address. Not a checkpoint; nothing of it is read or deleted.
    Foreign,
}

/// How far the ranks of a step got, from the manifests and failure records listed.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RankProgress {
    /// How many ranks write the step.
    pub world_size: u32,
    /// The ranks whose manifests are written.
    pub written: Vec<u32>,
    /// The ranks without a manifest that recorded why their save failed, with the reason
    /// ([`Checkpoints::list`] reads them; [`Checkpoints::latest`] does not).
    pub failed: Vec<RankFailure>,
}

impl RankProgress {
    /// The ranks whose manifests are not written.
    pub fn missing(&self) -> Vec<u32> {
        let written: BTreeSet<u32> = self.written.iter().copied().collect();
        (0..self.world_size)
            .filter(|rank| !written.contains(rank))
            .collect()
    }
}

/// The manifests listed in `dir`'s `stored`, by world size: the ranks written, and the
/// failure records of ranks without one (as keys, for the caller to read).
fn progress(dir: &str, stored: &[Listed]) -> Option<(RankProgress, Vec<String>)> {
    let mut by_world: BTreeMap<u32, (Vec<u32>, Vec<u32>)> = BTreeMap::new();
    for listed in stored {
        if let Some((rank, world_size)) = layout::parse_manifest_key(dir, &listed.key) {
            by_world.entry(world_size).or_default().0.push(rank);
        } else if let Some((rank, world_size)) = layout::parse_failure_key(dir, &listed.key) {
            by_world.entry(world_size).or_default().1.push(rank);
        }
    }
    // Manifests of another world size are a stale attempt's: report the likeliest layout.
    let (world_size, (mut written, failed)) = by_world
        .into_iter()
        .max_by_key(|(world_size, (ranks, failed))| (ranks.len(), failed.len(), *world_size))?;
    written.sort_unstable();
    let failures = failed
        .into_iter()
        .filter(|rank| written.binary_search(rank).is_err())
        .map(|rank| layout::failure_key(dir, rank, world_size))
        .collect();
    let progress = RankProgress {
        world_size,
        written,
        failed: Vec::new(),
    };
    Some((progress, failures))
}

impl Checkpoints {
    /// Every step under the prefix, committed or not, oldest first, with its state and what
    /// in it no container can be: two listings ([`Storage::list`](weightbay::Storage::list)
    /// and [`Storage::list_foreign`](weightbay::Storage::list_foreign)), plus one read per
    /// commit record.
    ///
    /// # Errors
    /// The storage's errors ([`ErrorKind::Unsupported`] where it cannot list).
    pub fn list(&self) -> Result<Vec<StepStatus>> {
        let mut statuses = self.statuses(&self.listing()?, false)?;
        for entry in self.storage.list_foreign(&self.prefix)? {
            // The entry may be the step's directory itself (`run/step-7`, a symlink).
            let Some(step) = layout::step_of(&self.prefix, &format!("{}/", entry.name)) else {
                continue;
            };
            match statuses.binary_search_by_key(&step, |s| s.step) {
                Ok(at) => statuses[at].foreign.push(entry),
                Err(at) => statuses.insert(
                    at,
                    StepStatus {
                        step,
                        record: None,
                        state: StepState::Foreign,
                        stored_bytes: 0,
                        ranks: None,
                        foreign: vec![entry],
                    },
                ),
            }
        }
        Ok(statuses)
    }

    /// As [`list`](Self::list), for a pass that deletes on what it finds: a record that could
    /// not be read for another reason than its content (the storage's error, a time-out) fails
    /// the listing, where `list` reports the step `Damaged`: nothing is judged on a read that
    /// did not happen. Returns the listing the statuses were judged on too: a pass deletes
    /// only keys of it, listed before it reads the announcements (the protocol on
    /// [`gc`](Self::gc)).
    pub(crate) fn list_judged(&self) -> Result<(Vec<StepStatus>, Listing)> {
        let listing = self.listing()?;
        let statuses = self.statuses(&listing, true)?;
        Ok((statuses, listing))
    }

    /// The status of every step of `listing`, oldest first; `judged` as for
    /// [`list_judged`](Self::list_judged).
    fn statuses(&self, listing: &Listing, judged: bool) -> Result<Vec<StepStatus>> {
        let lengths = lengths(listing);
        listing
            .iter()
            .map(|(&step, stored)| {
                let mut status = self.status(step, stored, &lengths);
                if let Some(e) = status.unread.take().filter(|_| judged) {
                    return Err(e);
                }
                if let Some((progress, failures)) = &mut status.ranks {
                    progress.failed = failures
                        .iter()
                        .map(|key| self.read_failure(step, key))
                        .collect();
                }
                Ok(status.into())
            })
            .collect()
    }

    /// Everything stored under the prefix, by step: one [`Storage::list`].
    pub(crate) fn listing(&self) -> Result<Listing> {
        let mut by_step = Listing::new();
        for listed in self.storage.list(&self.prefix)? {
            if let Some(step) = layout::step_of(&self.prefix, &listed.key) {
                by_step.entry(step).or_default().push(listed);
            }
        }
        Ok(by_step)
    }

    /// The failure record at `key` of `step`, or what stands in for it when it cannot be
    /// read.
    fn read_failure(&self, step: u64, key: &str) -> RankFailure {
        read_json(self.storage.as_ref(), key, "rank failure record").unwrap_or_else(|e| {
            let dir = self.step_dir(step);
            let (rank, world_size) = layout::parse_failure_key(&dir, key).unwrap_or_default();
            RankFailure {
                weightbay_rank_failure: FAILURE_VERSION,
                step,
                rank,
                world_size,
                error: format!("its failure record is unreadable: {e}"),
                time_unix_ms: 0,
            }
        })
    }

    /// The state of `step`, whose directory holds `stored`: its commit record is read, if it
    /// has one, and the containers it names are looked up in `stored`; failure records are
    /// named, not read.
    fn status(&self, step: u64, stored: &[Listed], lengths: &BTreeMap<&str, u64>) -> Status {
        let record_key = layout::record_key(&self.step_dir(step));
        let mut unread = None;
        let (record, state) = if stored.iter().any(|l| l.key == record_key) {
            match self.read_record(step) {
                Ok(record) => {
                    let state = check_present(&self.prefix, &record, lengths);
                    (Some(record), state)
                }
                // Deleted between the listing and the read (retention elsewhere): no
                // checkpoint now, and not a damaged one.
                Err(e) if e.kind() == ErrorKind::NotFound => (None, StepState::Uncommitted),
                Err(e) => {
                    let why = e.to_string();
                    if e.kind() != ErrorKind::Corrupt {
                        unread = Some(e);
                    }
                    (None, StepState::Damaged(why))
                }
            }
        } else {
            (None, StepState::Uncommitted)
        };
        Status {
            unread,
            step,
            record,
            state,
            stored_bytes: stored.iter().map(|l| l.len).sum(),
            ranks: progress(&self.step_dir(step), stored),
        }
    }

    /// The steps of the complete checkpoints, oldest first.
    ///
    /// # Errors
    /// As [`list`](Self::list).
    pub fn steps(&self) -> Result<Vec<u64>> {
        Ok(self
            .list()?
            .into_iter()
            .filter(|s| s.state == StepState::Complete)
            .map(|s| s.step)
            .collect())
    }

    /// The newest complete checkpoint, if any: what a resumed training run loads. Costs one
    /// listing (one request per 1,000 keys on S3, GCS and Azure) and one read per commit
    /// record examined, newest first: one, unless the newest are damaged or uncommitted.
    ///
    /// # Errors
    /// As [`list`](Self::list).
    pub fn latest(&self) -> Result<Option<Checkpoint>> {
        // Newest first, reading commit records only until one is complete: one listing and,
        // usually, one read, however many checkpoints there are.
        let listing = self.listing()?;
        let lengths = lengths(&listing);
        for (&step, stored) in listing.iter().rev() {
            let status = self.status(step, stored, &lengths);
            if let (StepState::Complete, Some(record)) = (status.state, status.record) {
                return Ok(Some(Checkpoint {
                    storage: Arc::clone(&self.storage),
                    prefix: self.prefix.clone(),
                    dir: self.step_dir(step),
                    record,
                }));
            }
        }
        Ok(None)
    }

    /// The checkpoint of `step`, checked to be complete.
    ///
    /// # Errors
    /// [`ErrorKind::NotFound`] when `step` has no commit record; [`ErrorKind::Corrupt`] naming
    /// what is wrong when a container it names is missing or of another length.
    pub fn open(&self, step: u64) -> Result<Checkpoint> {
        let record = self.read_record(step)?;
        let dir = self.step_dir(step);
        // An incremental checkpoint's references lie in other steps' directories.
        let listed = if record.references().is_empty() {
            &dir
        } else {
            &self.prefix
        };
        let stored = self.storage.list(listed)?;
        let lengths = stored.iter().map(|l| (l.key.as_str(), l.len)).collect();
        if let StepState::Damaged(why) = check_present(&self.prefix, &record, &lengths) {
            return Err(Error::new(ErrorKind::Corrupt, why).with_key(&dir));
        }
        Ok(Checkpoint {
            storage: Arc::clone(&self.storage),
            prefix: self.prefix.clone(),
            dir,
            record,
        })
    }
}

impl Checkpoints {
    /// Fails unless every one of `containers` (keys relative to `dir`) is stored with its
    /// length: what a save, copy or rank commit checks right before it writes a commit
    /// record, so that no record is created naming a container that a gc pass removed
    /// meanwhile. Each is opened, one request per container on an object store (a listing
    /// costs more there, and moto's grows with the bucket), several at a time
    /// ([`parallel::each`]).
    ///
    /// # Errors
    /// [`ErrorKind::NotFound`] naming a container that is gone; [`ErrorKind::Corrupt`] naming
    /// one of another length; the storage's errors.
    pub(crate) fn confirm_written(&self, dir: &str, containers: &[ContainerRecord]) -> Result<()> {
        parallel::each(containers, |container| self.confirm_one(dir, container)).map(|_| ())
    }

    /// [`confirm_written`](Self::confirm_written) of one container.
    fn confirm_one(&self, dir: &str, container: &ContainerRecord) -> Result<()> {
        let key = format!("{dir}/{}", container.key);
        let len = match self.storage.open(&key) {
            Ok(source) => source.len(),
            Err(e) if e.kind() == ErrorKind::NotFound => {
                return Err(Error::new(
                    ErrorKind::NotFound,
                    "written for this checkpoint, it is gone (a gc pass may have removed \
                     it): nothing was committed",
                )
                .with_key(&key)
                .with_source(e));
            }
            Err(e) => return Err(e.with_key(&key)),
        };
        if len != container.len {
            return Err(Error::new(
                ErrorKind::Corrupt,
                format!(
                    "it holds {len} bytes where {} were written: nothing was committed",
                    container.len
                ),
            )
            .with_key(&key));
        }
        Ok(())
    }
}

/// The length of every key listed, by key.
fn lengths(listing: &Listing) -> BTreeMap<&str, u64> {
    listing
        .values()
        .flatten()
        .map(|l| (l.key.as_str(), l.len))
        .collect()
}

/// Whether every container `record` names is listed in `lengths` with its recorded length,
/// and every container its pieces lie in is listed and long enough to hold them.
fn check_present(prefix: &str, record: &CommitRecord, lengths: &BTreeMap<&str, u64>) -> StepState {
    let dir = layout::step_dir(prefix, record.step);
    for container in &record.containers {
        let key = format!("{dir}/{}", container.key);
        match lengths.get(key.as_str()) {
            Some(&len) if len == container.len => {}
            Some(&len) => {
                return StepState::Damaged(format!(
                    "{key} holds {len} bytes, the commit record says {}",
                    container.len
                ));
            }
            None => return StepState::Damaged(format!("{key} is missing")),
        }
    }
    for piece in record.pieces.iter().flat_map(|p| &p.list) {
        let key = layout::under(prefix, &piece.key);
        let end = piece.offset.saturating_add(piece.stored_len());
        let what = piece
            .tensor
            .as_deref()
            .map_or_else(|| "the header".to_owned(), |t| format!("tensor `{t}`"));
        match lengths.get(key.as_str()) {
            Some(&len) if len >= end => {}
            Some(&len) => {
                return StepState::Damaged(format!(
                    "{key} holds {len} bytes, a piece of {what} needs {end}"
                ));
            }
            None => {
                return StepState::Damaged(format!(
                    "{key}, which holds a piece of {what}, is missing"
                ));
            }
        }
    }
    StepState::Complete
}

/// The complete steps of a listing, oldest first.
pub(crate) fn complete_steps(list: &[StepStatus]) -> Vec<u64> {
    list.iter()
        .filter(|s| s.state == StepState::Complete)
        .map(|s| s.step)
        .collect()
}
