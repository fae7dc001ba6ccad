//! The [`Checkpoints`] value: a run's prefix of a storage and the saves in flight there. What
//! it does is spread over the modules by concern (saving, listing, retention, copying, ranks);
//! this one holds what they share: where a step lives and how its record is read.

use std::sync::Arc;
use std::time::Duration;

use weightbay::{Error, ErrorKind, Result, Storage};

use crate::in_flight::Saves;
use crate::layout;
use crate::record::{
    CommitRecord, ENCODED_RECORD_VERSION, PIECES_RECORD_VERSION, RECORD_VERSION, read_json,
};

/// How long gc keeps what a save announced (what it writes, and what it may refer to), unless
/// told otherwise ([`Checkpoints::with_reference_lease`]). An incremental save or a copy must
/// commit within five sixths of it.
pub const DEFAULT_REFERENCE_LEASE: Duration = Duration::from_secs(3600);

/// The checkpoints under one prefix of a storage. Cheap to clone; clones share the one save
/// that may be in flight.
#[derive(Debug, Clone)]
pub struct Checkpoints {
    pub(crate) storage: Arc<dyn Storage>,
    pub(crate) prefix: String,
    pub(crate) saves: Arc<Saves>,
    /// How long gc keeps what a save announced.
    pub(crate) lease: Duration,
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
            lease: DEFAULT_REFERENCE_LEASE,
        }
    }

    /// How long [`gc`](Self::gc) and [`retain`](Self::retain) keep what a save announced: the
    /// containers an incremental save may refer to, and whatever any save, copy or rank
    /// writes in its own directory ([`DEFAULT_REFERENCE_LEASE`] unless set). An incremental
    /// save or a copy must commit within five sixths of it after announcing; a rank commit
    /// checks the containers of ranks that announced longer ago than that; a gc pass stops
    /// deleting once it has run a sixth of it; clocks of the machines sharing the prefix must
    /// agree to within a sixth of it too.
    #[must_use]
    pub fn with_reference_lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// The storage the checkpoints live in.
    pub fn storage(&self) -> &Arc<dyn Storage> {
        &self.storage
    }

    /// The directory (key prefix) of `step`.
    pub fn step_dir(&self, step: u64) -> String {
        layout::step_dir(&self.prefix, step)
    }

    /// The commit record of `step`, checked to be of this version and for this step.
    ///
    /// # Errors
    /// [`ErrorKind::NotFound`] when there is none; [`ErrorKind::Corrupt`] when it is
    /// unreadable or of another version or step; the storage's errors.
    pub(crate) fn read_record(&self, step: u64) -> Result<CommitRecord> {
        let key = layout::record_key(&self.step_dir(step));
        let record: CommitRecord = read_json(self.storage.as_ref(), &key, "commit record")?;
        let known = [
            RECORD_VERSION,
            PIECES_RECORD_VERSION,
            ENCODED_RECORD_VERSION,
        ];
        if !known.contains(&record.weightbay_checkpoint) || record.step != step {
            return Err(Error::new(
                ErrorKind::Corrupt,
                format!(
                    "commit record of version {} for step {}, expected version {RECORD_VERSION} \
                     to {ENCODED_RECORD_VERSION} for step {step}",
                    record.weightbay_checkpoint, record.step
                ),
            )
            .with_key(&key));
        }
        Ok(record)
    }
}
