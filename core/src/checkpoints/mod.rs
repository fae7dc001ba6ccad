//! The checkpoints of a training run, under one prefix of any [`Storage`]: saved in the
//! foreground or the background, listed, found (the newest complete one), opened, verified
//! against checksums taken while they were written, thinned out and cleaned up.
//!
//! # Layout and the commit point
//!
//! ```text
//! <prefix>/step-1000/commit.json                              the commit record, written last
//! <prefix>/step-1000/<save>/model.bpk                         one container, or
//! <prefix>/step-1000/<save>/model.safetensors.index.json      a sharded set (Hugging Face's
//! <prefix>/step-1000/<save>/model-…-00001-of-00002.safetensors  index and shard names)
//! ```
//!
//! Every save writes its containers in a directory of its own (`<save>` is a token no other
//! save uses, see [`unique_token`]), then the commit record with create-new. **A checkpoint
//! exists exactly when its commit record does**, and the record names each container with its
//! length and the CRC32C of its bytes, taken while they streamed out, so a checkpoint whose
//! containers went missing, were truncated or changed by one bit is reported, never loaded as
//! complete, in either format. Of two saves racing for one step, exactly one record is
//! created; the other save removes its containers and fails with
//! [`ErrorKind::AlreadyExists`]. A save that dies leaves a directory without a record, which
//! [`Checkpoints::gc`] removes once a newer checkpoint is complete.
//!
//! A job of many processes saves one step from every rank with [`Checkpoints::save_rank`]:
//! each rank's container and manifest, committed once by the rank that sees them all, with no
//! coordinator ([`RankSave`] has the protocol). [`Checkpoint::assembled`] loads it in any rank
//! layout, by [`Region`].
//!
//! ```
//! use weightbay::checkpoints::{Checkpoints, Retention};
//! use weightbay::{MemoryStorage, Tensor, Writer};
//!
//! let checkpoints = Checkpoints::new(MemoryStorage::new(), "run-1");
//! for step in [100, 200, 300] {
//!     let weights = vec![Tensor::from_slice("w", [2], &[step as f32, 1.0])];
//!     checkpoints.save(step, Writer::new(weights))?;
//! }
//! let latest = checkpoints.latest()?.expect("three were saved");
//! assert_eq!(latest.step(), 300);
//! assert_eq!(latest.reader()?.read_as::<f32>("w")?, [300.0, 1.0]);
//! latest.verify()?; // every container against the CRC32C in the commit record
//!
//! checkpoints.retain(&Retention::keep_last(2))?;
//! assert_eq!(checkpoints.steps()?, [200, 300]);
//! # Ok::<(), weightbay::Error>(())
//! ```

mod assembled;
mod ranks;
mod region;

pub use assembled::AssembledWeights;
pub use ranks::{
    LogicalTensor, RANKS_DIR, RankManifest, RankOutcome, RankProgress, RankSave, RankTensor,
    Rendezvous, SliceRecord,
};
pub use region::Region;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};

use serde::{Deserialize, Serialize};

use crate::background::Background;
use crate::format::trailer::{crc32c_append, crc32c_combine};
use crate::sharded::ShardedWriter;
use crate::storage::{
    CreateOptions, Durability, Listed, Sink, Source, Storage, WriteMode, unique_token, write_new,
};
use crate::weights::{ShardedWeights, WeightSource};
use crate::{Error, ErrorKind, Reader, Result, Writer};

/// The commit record's name inside a step's directory.
pub const COMMIT_RECORD: &str = "commit.json";
/// The version of the commit record's layout this code writes and reads.
const RECORD_VERSION: u32 = 1;
/// The largest commit record read.
const MAX_RECORD_LEN: u64 = 16 * 1024 * 1024;
/// How much of a container [`Checkpoint::verify`] reads at a time.
const VERIFY_WINDOW: u64 = 8 * 1024 * 1024;

/// What a checkpoint's commit record says: written last, it is the checkpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct CommitRecord {
    /// The layout version of this record (1).
    pub weightbay_checkpoint: u32,
    /// The training step.
    pub step: u64,
    /// When the save committed, in milliseconds since the Unix epoch.
    pub time_unix_ms: u64,
    /// `burnpack` or `safetensors`.
    pub format: String,
    /// The caller's metadata (see [`SaveOptions::with_metadata`]).
    pub metadata: BTreeMap<String, String>,
    /// For a sharded set, the index's key relative to the step's directory.
    pub index: Option<String>,
    /// Every container, with its key relative to the step's directory.
    pub containers: Vec<ContainerRecord>,
    /// For a checkpoint written by several ranks ([`Checkpoints::save_rank`]), how many.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub world_size: Option<u32>,
    /// For a checkpoint written by several ranks, every logical tensor and the slices that
    /// tile it.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub tensors: BTreeMap<String, LogicalTensor>,
}

/// One container of a checkpoint, as its save wrote it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct ContainerRecord {
    /// Key relative to the step's directory.
    pub key: String,
    /// Length in bytes.
    pub len: u64,
    /// CRC32C (Castagnoli) of all its bytes.
    pub crc32c: u32,
}

impl ContainerRecord {
    /// Fails with [`ErrorKind::Corrupt`], naming `key`, unless `len` is the recorded length.
    fn check_len(&self, len: u64, key: &str) -> Result<()> {
        if len == self.len {
            return Ok(());
        }
        Err(Error::new(
            ErrorKind::Corrupt,
            format!("holds {len} bytes, the commit record says {}", self.len),
        )
        .with_key(key))
    }

    /// Fails with [`ErrorKind::Corrupt`], naming `key`, unless `crc` is the recorded CRC32C.
    fn check_crc(&self, crc: u32, key: &str) -> Result<()> {
        if crc == self.crc32c {
            return Ok(());
        }
        Err(Error::new(
            ErrorKind::Corrupt,
            format!(
                "CRC32C {crc:08x}, the commit record says {:08x}",
                self.crc32c
            ),
        )
        .with_key(key))
    }
}

/// How a checkpoint is saved, beyond what its [`Writer`] says (format, durability, trailer).
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct SaveOptions {
    /// Split into shards of about this many tensor bytes, with an index, instead of one
    /// container.
    pub shard_len: Option<u64>,
    /// Stored in the commit record.
    pub metadata: BTreeMap<String, String>,
}

impl SaveOptions {
    /// Shards of about `shard_len` tensor bytes each, with a Hugging Face style index.
    #[must_use]
    pub fn sharded(shard_len: u64) -> Self {
        Self {
            shard_len: Some(shard_len),
            ..Self::default()
        }
    }

    /// Adds an entry to the commit record's metadata.
    #[must_use]
    pub fn with_metadata(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.metadata.insert(key.into(), value.into());
        self
    }
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
}

/// What [`Checkpoints::gc`] removed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct GcReport {
    /// Keys of containers no commit record names, removed.
    pub orphans: Vec<String>,
    /// What the storage's own cleanup ([`Storage::clean_pending`]) removed.
    pub pending: Vec<String>,
}

/// The checkpoints under one prefix of a storage. Cheap to clone; clones share the one save
/// that may be in flight.
#[derive(Debug, Clone)]
pub struct Checkpoints {
    storage: Arc<dyn Storage>,
    prefix: String,
    saves: Arc<Saves>,
}

/// The save in flight, and the failures of background saves whose handles were dropped.
#[derive(Debug, Default)]
struct Saves {
    state: Mutex<SavesState>,
    finished: Condvar,
}

#[derive(Debug, Default)]
struct SavesState {
    /// The step and save directory being written, if any.
    in_flight: Option<(u64, String)>,
    /// The save directories of rank saves being written ([`Checkpoints::save_rank`]): several
    /// ranks may run in one process, side by side.
    ranks_in_flight: Vec<String>,
    /// Failures nobody was there to see: reported by the next save or [`Checkpoints::flush`].
    unobserved: Vec<Error>,
}

impl Saves {
    fn lock(&self) -> MutexGuard<'_, SavesState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Waits until no save is in flight, then marks `save` as in flight. Returns the failures
    /// of earlier background saves nobody saw, which the caller reports instead of saving.
    fn begin(&self, save: (u64, String)) -> Result<()> {
        let mut state = self.lock();
        while state.in_flight.is_some() {
            state = self
                .finished
                .wait(state)
                .unwrap_or_else(PoisonError::into_inner);
        }
        if let Some(error) = take_unobserved(&mut state) {
            return Err(error);
        }
        state.in_flight = Some(save);
        Ok(())
    }

    fn end(&self) {
        self.lock().in_flight = None;
        self.finished.notify_all();
    }
}

/// One error for every unobserved failure (the first as the cause), or `None`.
fn take_unobserved(state: &mut SavesState) -> Option<Error> {
    let mut failures = std::mem::take(&mut state.unobserved);
    if failures.is_empty() {
        return None;
    }
    let count = failures.len();
    let first = failures.remove(0);
    Some(
        Error::new(
            first.kind(),
            format!(
                "{count} background save(s) failed after their handles were dropped; the first"
            ),
        )
        .with_source(first),
    )
}

impl Checkpoints {
    /// The checkpoints under `prefix` (a key prefix such as `runs/42`; empty for the
    /// storage's top level) of `storage`, which must list ([`Storage::list`]) for everything
    /// but saving.
    pub fn new<S: Storage + 'static>(storage: S, prefix: impl Into<String>) -> Self {
        Self::over(Arc::new(storage), prefix)
    }

    /// As [`new`](Self::new), over a storage already shared.
    pub fn over(storage: Arc<dyn Storage>, prefix: impl Into<String>) -> Self {
        Self {
            storage,
            prefix: prefix.into().trim_matches('/').to_owned(),
            saves: Arc::default(),
        }
    }

    /// The storage the checkpoints live in.
    pub fn storage(&self) -> &Arc<dyn Storage> {
        &self.storage
    }

    /// The directory (key prefix) of `step`.
    pub fn step_dir(&self, step: u64) -> String {
        if self.prefix.is_empty() {
            format!("step-{step}")
        } else {
            format!("{}/step-{step}", self.prefix)
        }
    }

    /// Saves `writer`'s tensors as the checkpoint of `step`, one container in the writer's
    /// format, and commits it. See [`save_with`](Self::save_with).
    ///
    /// # Errors
    /// As [`save_with`](Self::save_with).
    pub fn save(&self, step: u64, writer: Writer) -> Result<CommitRecord> {
        self.save_with(step, writer, SaveOptions::default())
    }

    /// Saves `writer`'s tensors as the checkpoint of `step` (one container, or shards with
    /// [`SaveOptions::sharded`]), then writes its commit record with create-new. Waits first
    /// for a save in flight (from [`save_in_background`](Self::save_in_background)) to end. On
    /// failure the containers this save wrote are removed again, unless the record's own
    /// create-new failed in a way that may have written it (then they stay for
    /// [`gc`](Self::gc), since the record may name them).
    ///
    /// # Errors
    /// [`ErrorKind::AlreadyExists`] when `step` is committed already (by another saver too);
    /// the failure of an earlier background save whose handle was dropped (then nothing is
    /// saved); writer and storage errors.
    pub fn save_with(
        &self,
        step: u64,
        writer: Writer,
        options: SaveOptions,
    ) -> Result<CommitRecord> {
        let save_dir = format!("{}/{}", self.step_dir(step), unique_token());
        self.saves.begin((step, save_dir.clone()))?;
        let result = self.write_and_commit(step, &save_dir, writer, options);
        self.saves.end();
        result
    }

    /// Starts saving the checkpoint of `step` on a thread of its own and returns at once, so
    /// training goes on while it streams out. One save is in flight at a time: when one is,
    /// this call first **waits** for it to end (a training loop saving faster than its storage
    /// takes is held back rather than piling up checkpoints in memory).
    ///
    /// The outcome comes back through the handle. A handle dropped before the save ends does
    /// not cancel it: the save completes or removes what it wrote, and if it failed, the next
    /// save or [`flush`](Self::flush) reports that failure, so it is never lost silently.
    ///
    /// # Errors
    /// The failure of an earlier background save whose handle was dropped (then nothing is
    /// started); [`ErrorKind::Io`] when the thread cannot start.
    pub fn save_in_background(
        &self,
        step: u64,
        writer: Writer,
        options: SaveOptions,
    ) -> Result<SaveHandle> {
        let save_dir = format!("{}/{}", self.step_dir(step), unique_token());
        self.saves.begin((step, save_dir.clone()))?;
        let outcome = Arc::new(Mutex::new(Outcome::Running));
        let (checkpoints, theirs) = (self.clone(), Arc::clone(&outcome));
        let work = Background::spawn("weightbay-checkpoint", move || {
            let result = checkpoints.write_and_commit(step, &save_dir, writer, options);
            let mut outcome = theirs.lock().unwrap_or_else(PoisonError::into_inner);
            match (&*outcome, result) {
                (Outcome::Abandoned, Err(e)) => checkpoints.saves.lock().unobserved.push(e),
                (Outcome::Abandoned, Ok(_)) => {}
                (_, result) => *outcome = Outcome::Done(result),
            }
            drop(outcome);
            checkpoints.saves.end();
        });
        match work {
            Ok(work) => Ok(SaveHandle {
                step,
                work: Some(work),
                outcome,
                saves: Arc::clone(&self.saves),
            }),
            Err(e) => {
                self.saves.end();
                Err(e)
            }
        }
    }

    /// Waits for the save in flight, if any, and reports the failures of background saves
    /// whose handles were dropped. Call it before a program exits.
    ///
    /// # Errors
    /// Those failures, as one error (the first as its cause).
    pub fn flush(&self) -> Result<()> {
        let mut state = self.saves.lock();
        while state.in_flight.is_some() {
            state = self
                .saves
                .finished
                .wait(state)
                .unwrap_or_else(PoisonError::into_inner);
        }
        take_unobserved(&mut state).map_or(Ok(()), Err)
    }

    fn write_and_commit(
        &self,
        step: u64,
        save_dir: &str,
        writer: Writer,
        options: SaveOptions,
    ) -> Result<CommitRecord> {
        let record_key = format!("{}/{COMMIT_RECORD}", self.step_dir(step));
        match self.storage.open(&record_key) {
            Ok(_) => {
                return Err(Error::new(
                    ErrorKind::AlreadyExists,
                    format!("step {step} is committed already"),
                )
                .with_key(&record_key));
            }
            Err(e) if e.kind() == ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        let recording = Recording::new(Arc::clone(&self.storage));
        let format = writer.format();
        let durability = writer.durability();
        let written = match options.shard_len {
            None => {
                let key = format!("{save_dir}/model.{}", format.extension());
                writer
                    .with_mode(WriteMode::Overwrite)
                    .write_to(&recording, &key)
                    .map(|_| None)
            }
            Some(shard_len) => ShardedWriter::new(writer)
                .with_shard_len(shard_len)
                .write_to(&recording, save_dir)
                .map(|summary| Some(summary.index)),
        };
        let index = match written {
            Ok(index) => index,
            Err(e) => {
                recording.remove_all();
                return Err(e);
            }
        };
        let step_dir = self.step_dir(step);
        let relative = |key: &str| key.strip_prefix(&format!("{step_dir}/")).map(str::to_owned);
        let record = CommitRecord {
            weightbay_checkpoint: RECORD_VERSION,
            step,
            time_unix_ms: now_unix_ms(),
            format: format.to_string(),
            metadata: options.metadata,
            index: index.as_deref().and_then(relative),
            containers: recording
                .written()
                .into_iter()
                .filter_map(|(key, len, crc32c)| {
                    Some(ContainerRecord {
                        key: relative(&key)?,
                        len,
                        crc32c,
                    })
                })
                .collect(),
            world_size: None,
            tensors: BTreeMap::new(),
        };
        let body = serde_json::to_vec_pretty(&record)
            .map_err(|e| Error::invalid(format!("encoding the commit record: {e}")))?;
        match write_new(self.storage.as_ref(), &record_key, &body, durability) {
            Ok(()) => Ok(record),
            Err(e) => {
                if e.kind() == ErrorKind::AlreadyExists {
                    recording.remove_all();
                }
                // Otherwise the record may have been written all the same (a request whose
                // answer was lost), naming these containers: they stay, and `gc` removes
                // them if no record names them.
                Err(e)
            }
        }
    }

    /// Every step under the prefix, committed or not, oldest first, with its state: one
    /// listing, plus one read per commit record.
    ///
    /// # Errors
    /// The storage's errors ([`ErrorKind::Unsupported`] where it cannot list).
    pub fn list(&self) -> Result<Vec<StepStatus>> {
        Ok(self
            .listing()?
            .into_iter()
            .map(|(step, stored)| self.status(step, &stored))
            .collect())
    }

    /// Everything stored under the prefix, by step: one [`Storage::list`].
    fn listing(&self) -> Result<BTreeMap<u64, Vec<Listed>>> {
        let mut by_step: BTreeMap<u64, Vec<Listed>> = BTreeMap::new();
        for listed in self.storage.list(&self.prefix)? {
            if let Some(step) = self.step_of(&listed.key) {
                by_step.entry(step).or_default().push(listed);
            }
        }
        Ok(by_step)
    }

    /// The state of `step`, whose directory holds `stored`: its commit record is read, if it
    /// has one, and the containers it names are looked up in `stored`.
    fn status(&self, step: u64, stored: &[Listed]) -> StepStatus {
        let record_key = format!("{}/{COMMIT_RECORD}", self.step_dir(step));
        let (record, state) = if stored.iter().any(|l| l.key == record_key) {
            match self.read_record(step) {
                Ok(record) => {
                    let state = check_present(&self.step_dir(step), &record, stored);
                    (Some(record), state)
                }
                Err(e) => (None, StepState::Damaged(e.to_string())),
            }
        } else {
            (None, StepState::Uncommitted)
        };
        StepStatus {
            step,
            record,
            state,
            stored_bytes: stored.iter().map(|l| l.len).sum(),
            ranks: ranks::progress(&self.step_dir(step), stored),
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
        for (step, stored) in self.listing()?.into_iter().rev() {
            let status = self.status(step, &stored);
            if let (StepState::Complete, Some(record)) = (status.state, status.record) {
                return Ok(Some(Checkpoint {
                    storage: Arc::clone(&self.storage),
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
        let stored = self.storage.list(&dir)?;
        if let StepState::Damaged(why) = check_present(&dir, &record, &stored) {
            return Err(Error::new(ErrorKind::Corrupt, why).with_key(&dir));
        }
        Ok(Checkpoint {
            storage: Arc::clone(&self.storage),
            dir,
            record,
        })
    }

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
        match self.storage.delete(&format!("{dir}/{COMMIT_RECORD}")) {
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
    /// flight; then the storage's own unfinished writes of dead writers
    /// ([`Storage::clean_pending`], where it has them).
    ///
    /// # Errors
    /// The storage's errors.
    pub fn gc(&self) -> Result<GcReport> {
        let orphans = self.orphans()?;
        for key in &orphans {
            delete_if_present(self.storage.as_ref(), key)?;
        }
        let pending = if self.storage.capabilities().pending_listing {
            self.storage.clean_pending()?
        } else {
            Vec::new()
        };
        Ok(GcReport { orphans, pending })
    }

    /// The containers [`gc`](Self::gc) would remove, without removing anything.
    ///
    /// # Errors
    /// As [`list`](Self::list).
    pub fn orphans(&self) -> Result<Vec<String>> {
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
            let manifests = (0..world_size).map(|rank| ranks::manifest_key(&dir, rank, world_size));
            let named: BTreeSet<String> = status
                .record
                .iter()
                .flat_map(|r| r.containers.iter().map(|c| format!("{dir}/{}", c.key)))
                .chain(manifests)
                .chain(std::iter::once(format!("{dir}/{COMMIT_RECORD}")))
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

    /// Copies `checkpoint` (from any storage) here under the same step, byte for byte: every
    /// container streams across with its CRC32C compared to the record's on the way, then the
    /// same commit record is written last with create-new. A copy that fails or finds a
    /// container changed removes what it wrote and commits nothing.
    ///
    /// # Errors
    /// [`ErrorKind::AlreadyExists`] when the step is committed here already;
    /// [`ErrorKind::Corrupt`] naming a container whose bytes differ from the record; the
    /// storages' errors.
    pub fn copy_from(
        &self,
        checkpoint: &Checkpoint,
        durability: Durability,
    ) -> Result<CommitRecord> {
        let step = checkpoint.step();
        let dir = self.step_dir(step);
        self.saves.begin((step, dir.clone()))?;
        let result = self.copy_containers(checkpoint, &dir, durability);
        self.saves.end();
        result
    }

    fn copy_containers(
        &self,
        checkpoint: &Checkpoint,
        dir: &str,
        durability: Durability,
    ) -> Result<CommitRecord> {
        let record_key = format!("{dir}/{COMMIT_RECORD}");
        if self.storage.open(&record_key).is_ok() {
            return Err(Error::new(
                ErrorKind::AlreadyExists,
                format!("step {} is committed already", checkpoint.step()),
            )
            .with_key(&record_key));
        }
        // Into a save directory of this copy's own, like any save, so a racing copy or save
        // of the step never writes over these containers.
        let save = unique_token();
        let moved = |key: &str| match key.split_once('/') {
            Some((_, rest)) => format!("{save}/{rest}"),
            None => format!("{save}/{key}"),
        };
        let mut record = checkpoint.record.clone();
        record.index = record.index.as_deref().map(moved);
        for slice in record.tensors.values_mut().flat_map(|t| &mut t.slices) {
            slice.container = moved(&slice.container);
        }
        let mut written = Vec::new();
        let copied = checkpoint
            .record
            .containers
            .iter()
            .zip(record.containers.iter_mut())
            .try_for_each(|(from, to)| {
                to.key = moved(&from.key);
                let key = format!("{dir}/{}", to.key);
                written.push(key.clone());
                copy_checked(checkpoint, from, self.storage.as_ref(), &key, durability)
            });
        let committed = copied
            .and_then(|()| {
                serde_json::to_vec_pretty(&record)
                    .map_err(|e| Error::invalid(format!("encoding the commit record: {e}")))
            })
            .and_then(|body| write_new(self.storage.as_ref(), &record_key, &body, durability));
        if let Err(e) = committed {
            for key in written {
                let _ = self.storage.delete(&key);
            }
            return Err(e);
        }
        Ok(record)
    }

    /// The step whose directory `key` lies in, if it lies in one.
    fn step_of(&self, key: &str) -> Option<u64> {
        let rest = if self.prefix.is_empty() {
            key
        } else {
            key.strip_prefix(&self.prefix)?.strip_prefix('/')?
        };
        let (dir, _) = rest.split_once('/')?;
        let digits = dir.strip_prefix("step-")?;
        // Only the canonical spelling, so one step has one directory.
        let step: u64 = digits.parse().ok()?;
        (step.to_string() == digits).then_some(step)
    }

    fn read_record(&self, step: u64) -> Result<CommitRecord> {
        let key = format!("{}/{COMMIT_RECORD}", self.step_dir(step));
        let record: CommitRecord = ranks::read_json(self.storage.as_ref(), &key, "commit record")?;
        if record.weightbay_checkpoint != RECORD_VERSION || record.step != step {
            return Err(Error::new(
                ErrorKind::Corrupt,
                format!(
                    "commit record of version {} for step {}, expected version {RECORD_VERSION} for step {step}",
                    record.weightbay_checkpoint, record.step
                ),
            )
            .with_key(&key));
        }
        Ok(record)
    }
}

/// Whether every container `record` names is among `stored` with its recorded length.
fn check_present(dir: &str, record: &CommitRecord, stored: &[Listed]) -> StepState {
    let lengths: BTreeMap<&str, u64> = stored.iter().map(|l| (l.key.as_str(), l.len)).collect();
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
    StepState::Complete
}

/// A complete checkpoint: its commit record, and its containers to load.
#[derive(Debug, Clone)]
pub struct Checkpoint {
    storage: Arc<dyn Storage>,
    dir: String,
    record: CommitRecord,
}

/// What [`Checkpoint::verify`] checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct CheckpointReport {
    /// Containers read.
    pub containers: usize,
    /// Bytes read.
    pub bytes: u64,
}

impl Checkpoint {
    /// The training step.
    pub fn step(&self) -> u64 {
        self.record.step
    }

    /// The commit record.
    pub fn record(&self) -> &CommitRecord {
        &self.record
    }

    /// The directory (key prefix) of the checkpoint's step.
    pub fn dir(&self) -> &str {
        &self.dir
    }

    /// The storage it lives in.
    pub fn storage(&self) -> &Arc<dyn Storage> {
        &self.storage
    }

    /// The key of container `relative` (a key from the record).
    fn key(&self, relative: &str) -> String {
        format!("{}/{relative}", self.dir)
    }

    /// The checkpoint's one container, opened (for a sharded set, use
    /// [`weights`](Self::weights)).
    ///
    /// # Errors
    /// [`ErrorKind::InvalidInput`] for a sharded set; as [`Reader::open_key`].
    pub fn reader(&self) -> Result<Reader> {
        match (&self.record.index, self.record.containers.as_slice()) {
            (None, [only]) if self.record.world_size.is_none() => {
                Reader::open_key(self.storage.as_ref(), &self.key(&only.key))
            }
            _ => Err(Error::invalid(
                "this checkpoint has several containers (shards or ranks): open it with \
                 Checkpoint::weights",
            )),
        }
    }

    /// The tensors of a checkpoint written by several ranks, whole or by region, for any
    /// rank layout.
    ///
    /// # Errors
    /// [`ErrorKind::InvalidInput`] for a checkpoint written by one process (open it with
    /// [`reader`](Self::reader) or [`weights`](Self::weights)).
    pub fn assembled(&self) -> Result<AssembledWeights> {
        if self.record.world_size.is_none() {
            return Err(Error::invalid(
                "this checkpoint was written by one process: open it with Checkpoint::reader \
                 or Checkpoint::weights",
            ));
        }
        Ok(AssembledWeights::new(
            Arc::clone(&self.storage),
            self.dir.clone(),
            self.record.tensors.clone(),
        ))
    }

    /// The checkpoint's tensors, for a runtime: its one container, or its shards through the
    /// index.
    ///
    /// # Errors
    /// As [`reader`](Self::reader) and [`ShardedWeights::open`].
    pub fn weights(&self) -> Result<Box<dyn WeightSource>> {
        if self.record.world_size.is_some() {
            return Ok(Box::new(self.assembled()?));
        }
        match &self.record.index {
            Some(index) => Ok(Box::new(ShardedWeights::open(
                Arc::clone(&self.storage),
                &self.key(index),
            )?)),
            None => Ok(Box::new(self.reader()?)),
        }
    }

    /// Reads every container in full and compares its length and CRC32C with the commit
    /// record's, so a single flipped bit in any container, of either format, is caught.
    ///
    /// # Errors
    /// [`ErrorKind::Corrupt`] naming the first container that differs; the storage's errors.
    pub fn verify(&self) -> Result<CheckpointReport> {
        let mut bytes = 0;
        for container in &self.record.containers {
            let key = self.key(&container.key);
            let source = self.storage.open(&key).map_err(|e| e.with_key(&key))?;
            container.check_len(source.len(), &key)?;
            let crc = crc_of(source.as_ref()).map_err(|e| e.with_key(&key))?;
            container.check_crc(crc, &key)?;
            bytes += container.len;
        }
        Ok(CheckpointReport {
            containers: self.record.containers.len(),
            bytes,
        })
    }
}

/// Streams `container` of `checkpoint` to `key` of `storage`, comparing length and CRC32C
/// with the record before committing.
fn copy_checked(
    checkpoint: &Checkpoint,
    container: &ContainerRecord,
    storage: &dyn Storage,
    key: &str,
    durability: Durability,
) -> Result<()> {
    let from = checkpoint.key(&container.key);
    let source = checkpoint
        .storage
        .open(&from)
        .map_err(|e| e.with_key(&from))?;
    container.check_len(source.len(), &from)?;
    let options = CreateOptions::default()
        .with_mode(WriteMode::Overwrite)
        .with_durability(durability)
        .with_expected_len(container.len);
    let mut sink = storage
        .create(key, &options)
        .map_err(|e| e.with_operation("create").with_key(key))?;
    let crc = for_each_window(source.as_ref(), 0..source.len(), |window| {
        sink.write(window)
    })
    .map_err(|e| e.with_key(key))?;
    container.check_crc(crc, &from)?;
    sink.commit()
        .map_err(|e| e.with_operation("commit").with_key(key))
}

/// CRC32C of every byte of `source`: parts of at least 64 MiB read and summed on up to four
/// threads, their CRCs then combined. Reading from the page cache is a copy as costly as the
/// CRC itself, so one core reaches only about half of what the CRC alone runs at.
fn crc_of(source: &dyn Source) -> Result<u32> {
    const PART_AT_LEAST: u64 = 64 * 1024 * 1024;
    let len = source.len();
    let threads = std::thread::available_parallelism()
        .map_or(1, usize::from)
        .min(4)
        .min(usize::try_from(len / PART_AT_LEAST).unwrap_or(usize::MAX))
        .max(1);
    let part = len.div_ceil(threads as u64);
    let parts: Vec<std::ops::Range<u64>> = (0..threads as u64)
        .map(|i| (i * part).min(len)..((i + 1) * part).min(len))
        .collect();
    let crcs = std::thread::scope(|scope| {
        let workers: Vec<_> = parts
            .iter()
            .map(|range| scope.spawn(|| for_each_window(source, range.clone(), |_| Ok(()))))
            .collect();
        workers
            .into_iter()
            .map(|worker| {
                worker
                    .join()
                    .unwrap_or_else(|_| Err(Error::new(ErrorKind::Io, "a verify thread panicked")))
            })
            .collect::<Result<Vec<u32>>>()
    })?;
    Ok(parts.iter().zip(crcs).fold(0, |crc, (range, part_crc)| {
        crc32c_combine(crc, part_crc, (range.end - range.start) as usize)
    }))
}

/// Reads `range` of `source` in windows, handing each to `each`, and returns the CRC32C of
/// all of it.
fn for_each_window(
    source: &dyn Source,
    range: std::ops::Range<u64>,
    mut each: impl FnMut(&[u8]) -> Result<()>,
) -> Result<u32> {
    let mut crc = 0;
    let mut window = vec![0; VERIFY_WINDOW.min(range.end - range.start) as usize];
    let mut offset = range.start;
    while offset < range.end {
        // At most the window's length: both are capped by VERIFY_WINDOW and the range.
        let len = (range.end - offset).min(VERIFY_WINDOW) as usize;
        let chunk = &mut window[..len];
        source.read_at(offset, chunk)?;
        crc = crc32c_append(crc, chunk);
        each(chunk)?;
        offset += len as u64;
    }
    Ok(crc)
}

/// The handle of a save running in the background: [`wait`](Self::wait) for it from sync
/// code, `.await` it from async code.
#[derive(Debug)]
pub struct SaveHandle {
    step: u64,
    work: Option<Background<()>>,
    outcome: Arc<Mutex<Outcome>>,
    saves: Arc<Saves>,
}

/// Where a background save's result goes.
#[derive(Debug)]
enum Outcome {
    Running,
    Done(Result<CommitRecord>),
    /// The handle was dropped first: a failure goes to the next save instead.
    Abandoned,
}

impl SaveHandle {
    /// The step being saved.
    pub fn step(&self) -> u64 {
        self.step
    }

    /// Whether the save has ended (so `wait` would not block).
    pub fn is_finished(&self) -> bool {
        self.work.as_ref().is_none_or(Background::is_finished)
    }

    /// Blocks until the save ends, and returns its commit record.
    ///
    /// # Errors
    /// As [`Checkpoints::save_with`].
    pub fn wait(mut self) -> Result<CommitRecord> {
        if let Some(work) = self.work.take() {
            work.wait();
        }
        self.take()
    }

    fn take(&self) -> Result<CommitRecord> {
        let mut outcome = self.outcome.lock().unwrap_or_else(PoisonError::into_inner);
        match std::mem::replace(&mut *outcome, Outcome::Abandoned) {
            Outcome::Done(result) => result,
            // The worker stores its result before it ends; reaching here means it panicked.
            _ => Err(Error::new(
                ErrorKind::Io,
                format!("the background save of step {} panicked", self.step),
            )),
        }
    }
}

impl std::future::Future for SaveHandle {
    type Output = Result<CommitRecord>;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        if let Some(work) = self.work.as_mut() {
            match std::pin::Pin::new(work).poll(cx) {
                std::task::Poll::Pending => return std::task::Poll::Pending,
                std::task::Poll::Ready(()) => self.work = None,
            }
        }
        std::task::Poll::Ready(self.take())
    }
}

impl Drop for SaveHandle {
    /// Dropped before the outcome was taken: a failure goes to the checkpoints' unobserved
    /// list, which the next save or [`Checkpoints::flush`] reports.
    fn drop(&mut self) {
        if self.work.is_none() {
            return;
        }
        let mut outcome = self.outcome.lock().unwrap_or_else(PoisonError::into_inner);
        match std::mem::replace(&mut *outcome, Outcome::Abandoned) {
            Outcome::Done(Err(e)) => self.saves.lock().unobserved.push(e),
            Outcome::Running | Outcome::Done(Ok(_)) | Outcome::Abandoned => {}
        }
    }
}

/// A storage in front of another that records every container committed through it, with
/// its length and the CRC32C of its bytes, taken as they stream through.
#[derive(Debug)]
struct Recording {
    inner: Arc<dyn Storage>,
    written: Arc<Mutex<Vec<(String, u64, u32)>>>,
}

impl Recording {
    fn new(inner: Arc<dyn Storage>) -> Self {
        Self {
            inner,
            written: Arc::default(),
        }
    }

    /// What was committed through it so far: key, length, CRC32C.
    fn written(&self) -> Vec<(String, u64, u32)> {
        self.written
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Removes every container committed through it (a failed save's), best effort: what
    /// cannot be removed now is an orphan for [`Checkpoints::gc`].
    fn remove_all(&self) {
        for (key, _, _) in self.written() {
            let _ = self.inner.delete(&key);
        }
    }
}

impl Storage for Recording {
    fn capabilities(&self) -> crate::Capabilities {
        self.inner.capabilities()
    }

    fn create(&self, key: &str, options: &CreateOptions) -> Result<Box<dyn Sink>> {
        Ok(Box::new(RecordingSink {
            inner: self.inner.create(key, options)?,
            key: key.to_owned(),
            len: 0,
            crc: 0,
            written: Arc::clone(&self.written),
        }))
    }

    fn open(&self, key: &str) -> Result<Arc<dyn Source>> {
        self.inner.open(key)
    }

    fn delete(&self, key: &str) -> Result<()> {
        self.inner.delete(key)
    }
}

struct RecordingSink {
    inner: Box<dyn Sink>,
    key: String,
    len: u64,
    crc: u32,
    written: Arc<Mutex<Vec<(String, u64, u32)>>>,
}

impl Sink for RecordingSink {
    fn write(&mut self, data: &[u8]) -> Result<()> {
        self.inner.write(data)?;
        self.crc = crc32c_append(self.crc, data);
        self.len += data.len() as u64;
        Ok(())
    }

    fn commit(self: Box<Self>) -> Result<()> {
        let Self {
            inner,
            key,
            len,
            crc,
            written,
        } = *self;
        inner.commit()?;
        written
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push((key, len, crc));
        Ok(())
    }
}

/// Deletes `key`; one already gone is fine.
fn delete_if_present(storage: &dyn Storage, key: &str) -> Result<()> {
    match storage.delete(key) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e.with_key(key)),
    }
}

fn now_unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}
