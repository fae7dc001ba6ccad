//! Multi-writer checkpoints: every rank of a job writes its own part of a step straight to
//! the storage, and the step commits once, without a coordinator. The protocol is described
//! on [`RankSave`], the public face of this module.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use weightbay::backend_kit::unique_token;
use weightbay::{
    CreateOptions, Durability, Error, ErrorKind, Result, Storage, StorageExt, WriteMode, Writer,
};

use crate::committed_containers::{Recording, Summing};
use crate::layout::{self, RANKS_DIR, manifest_key, parse_manifest_key};
use crate::merge::{in_tensor, merge};
use crate::parallel;
use crate::record::{
    CommitRecord, ContainerRecord, FAILURE_VERSION, MANIFEST_VERSION, RankFailure, RankManifest,
    RankTensor, Region, encode, now_unix_ms, read_json,
};
use crate::retention::delete_if_present;
use crate::run::Checkpoints;

/// How long a failed rank may spend recording why it failed.
pub const FAILURE_RECORD_TIMEOUT: Duration = Duration::from_secs(10);

/// Decides, after a rank's manifest is written, whether this rank commits; see
/// [`RankSave::with_rendezvous`].
pub type Rendezvous = Arc<dyn Fn() -> Result<bool> + Send + Sync>;

/// One rank's part of a multi-rank checkpoint: a [`Writer`] of its tensors (format,
/// durability, trailer and metadata as the writer says), and which of them are slices of
/// larger tensors. Saved by [`Checkpoints::save_rank`].
///
/// # The protocol
///
/// ```text
/// <step>/<save>/rank-00003.bpk                     rank 3's tensors and tensor slices
/// <step>/ranks/rank-00003-of-00004.json            rank 3's manifest, written with create-new
/// <step>/ranks/committer                           the commit intent, written with create-new
/// <step>/commit.json                               the merged record, written with create-new
/// ```
///
/// 1. Each rank announces its save (`refs/`, as every save does, naming its manifest too: a
///    gc pass elsewhere leaves both alone for the lease), streams its container into a save
///    directory of its own, then writes its **manifest** with create-new: the container's key, length and CRC32C (taken while it
///    streamed), and every tensor or tensor slice in it with its global shape and
///    [`Region`]. No rank waits for another to write its data.
/// 2. The rank then lists the step's manifests (one listing request per 1,000 ranks). The
///    last manifest written is always followed by a listing that sees it, so some rank sees
///    all `world_size` of them. When ranks finish together several do; they race to create
///    the step's **commit intent** (`ranks/committer`, create-new), and only the one that
///    creates it reads the manifests (up to 64 at a time), checks that every tensor's slices
///    tile it exactly (no overlap, no gap), opens every container of a rank whose
///    announcement is past five sixths of the lease to confirm it is there with its length
///    (64 at a time: such a rank's part may have gone to a gc; a young announcement keeps
///    the rest), and writes the commit record with create-new. The
///    others report [`RankOutcome::Committing`]. Without the intent every rank that sees all
///    would read every manifest: with ranks finishing together that is quadratic (8,027
///    reads for 256 simulated ranks, against 256 with it).
/// 3. A rank looks for its own manifest before it uploads anything. One that exists already
///    (a restart, or a second process running as the same rank) is compared with what this
///    rank would write, its container summed (length, CRC32C) without being uploaded: the
///    same content is success and, being a rerun, the rank commits whether or not another
///    rank holds the intent (that rank may have died before committing; two commits racing
///    still make one record, and the loser checks it); other content is an error naming the
///    rank, so a checkpoint never mixes two writers' data. A restart after the commit so
///    moves none of the model's bytes. (A manifest written by another process between the
///    look and this rank's own create-new is compared the same way, its fresh container
///    removed.)
///
/// A rank that never finishes leaves the step uncommitted; [`Checkpoints::gc`] removes it
/// once a newer checkpoint is complete. A framework that has a process group already can
/// replace the listing with its barrier ([`with_rendezvous`](Self::with_rendezvous)).
///
/// ```
/// use weightbay_checkpoints::{Checkpoints, RankOutcome, RankSave, Region};
/// use weightbay::{MemoryStorage, Tensor, Writer};
///
/// let checkpoints = Checkpoints::new(MemoryStorage::new(), "run-1");
/// // Two ranks each hold half the rows of a 4 × 2 matrix; rank 0 also holds the bias.
/// for rank in 0..2u32 {
///     let rows = Region::split(&[4, 2], 0, 2, u64::from(rank));
///     let base = 4.0 * rank as f32;
///     let mut tensors = vec![Tensor::from_slice("w", [2, 2], &[base, base + 1.0, base + 2.0, base + 3.0])];
///     if rank == 0 {
///         tensors.push(Tensor::from_slice("b", [2], &[0.5f32, 0.5]));
///     }
///     let save = RankSave::new(rank, 2, Writer::new(tensors)).with_slice("w", [4, 2], rows);
///     let outcome = checkpoints.save_rank(100, save)?;
///     // The last rank to finish commits.
///     assert_eq!(matches!(outcome, RankOutcome::Committed(_)), rank == 1);
/// }
/// let weights = checkpoints.open(100)?.assembled()?;
/// assert_eq!(weights.read_as::<f32>("w")?, [0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]);
/// // Only the second column, fetched as the byte runs that hold it.
/// let column = weights.read_region("w", &Region::new([0, 1], [4, 1]))?;
/// assert_eq!(column.to_vec()?, [1.0f32, 3.0, 5.0, 7.0].map(f32::to_le_bytes).concat());
/// # Ok::<(), weightbay::Error>(())
/// ```
pub struct RankSave {
    rank: u32,
    world_size: u32,
    writer: Writer,
    slices: BTreeMap<String, (Vec<u64>, Region)>,
    rendezvous: Option<Rendezvous>,
    timeout: Option<Duration>,
}

impl std::fmt::Debug for RankSave {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RankSave")
            .field("rank", &self.rank)
            .field("world_size", &self.world_size)
            .field("slices", &self.slices)
            .field("rendezvous", &self.rendezvous.is_some())
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl RankSave {
    /// Rank `rank` of `world_size`, saving `writer`'s tensors: whole tensors unless
    /// [`with_slice`](Self::with_slice) says otherwise. Each whole tensor must be saved by
    /// exactly one rank.
    pub fn new(rank: u32, world_size: u32, writer: Writer) -> Self {
        Self {
            rank,
            world_size,
            writer,
            slices: BTreeMap::new(),
            rendezvous: None,
            timeout: None,
        }
    }

    /// Gives the rank's save up `timeout` after it starts: its container and manifest, and
    /// the commit if this rank makes it, fail with
    /// [`ErrorKind::TimedOut`](weightbay::ErrorKind::TimedOut) past it (the request in flight
    /// cut, nothing published), so one rank's stalled upload cannot hold the job for longer.
    #[must_use]
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// Declares the writer's tensor `name` a slice: the `region` of a tensor of `shape`. The
    /// writer's tensor has the region's lengths as its shape, its elements row-major.
    #[must_use]
    pub fn with_slice(
        mut self,
        name: impl Into<String>,
        shape: impl Into<Vec<u64>>,
        region: Region,
    ) -> Self {
        self.slices.insert(name.into(), (shape.into(), region));
        self
    }

    /// Replaces the listing that decides who commits with the caller's process group: `decide`
    /// runs once the rank's manifest is written and returns whether this rank commits. It
    /// must return `true` only after every rank's manifest is written (after a barrier, say),
    /// and to at least one rank; the committer then reads the manifests by name, without
    /// listing. With a barrier, `move || { barrier.wait(); Ok(rank == 0) }`.
    #[must_use]
    pub fn with_rendezvous(
        mut self,
        decide: impl Fn() -> Result<bool> + Send + Sync + 'static,
    ) -> Self {
        self.rendezvous = Some(Arc::new(decide));
        self
    }

    /// The rank and the world size.
    pub(crate) fn rank(&self) -> (u32, u32) {
        (self.rank, self.world_size)
    }

    /// Whether a rendezvous decides who commits, instead of a listing.
    pub(crate) fn has_rendezvous(&self) -> bool {
        self.rendezvous.is_some()
    }

    /// The manifest entries of the writer's tensors, each checked.
    fn tensors(&self, container: &str) -> Result<BTreeMap<String, RankTensor>> {
        let mut tensors = BTreeMap::new();
        for tensor in self.writer.tensors() {
            let name = tensor.name();
            let (shape, region) = match self.slices.get(name) {
                Some((shape, region)) => {
                    region
                        .within(shape)
                        .map_err(|e| in_tensor(e, name, "its region"))?;
                    if region.lengths != tensor.shape() {
                        return Err(Error::invalid(format!(
                            "tensor `{name}` has shape {:?}, its region {:?}",
                            tensor.shape(),
                            region.lengths
                        )));
                    }
                    if tensor.dtype().element_size().is_none() {
                        return Err(Error::invalid(format!(
                            "tensor `{name}` of {} cannot be sliced: its elements have no fixed size",
                            tensor.dtype()
                        )));
                    }
                    (shape.clone(), region.clone())
                }
                None => (tensor.shape().to_vec(), Region::whole(tensor.shape())),
            };
            tensors.insert(
                name.to_owned(),
                RankTensor {
                    dtype: tensor.dtype().to_string(),
                    shape,
                    region,
                    container: container.to_owned(),
                },
            );
        }
        if let Some(name) = self.slices.keys().find(|name| !tensors.contains_key(*name)) {
            return Err(Error::invalid(format!(
                "a slice of `{name}` is declared, but the writer has no tensor `{name}`"
            )));
        }
        Ok(tensors)
    }
}

/// How [`Checkpoints::save_rank`] ended, when it succeeded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RankOutcome {
    /// This rank saw every manifest and wrote the commit record.
    Committed(CommitRecord),
    /// The step is committed by another rank (or an earlier run of this one), and the record
    /// holds this rank's part as written.
    CommittedByAnother(CommitRecord),
    /// This rank's part is written; the commit is left to the ranks still writing (the last
    /// to finish commits), which this rank's listing did not see: `missing`.
    Written {
        /// The ranks whose manifests were not there yet.
        missing: Vec<u32>,
    },
    /// This rank's part is written, every rank's manifest is, and another rank is committing
    /// (it created the commit intent, or the rendezvous chose it).
    Committing,
}

impl RankOutcome {
    /// The commit record, once the step is committed.
    pub fn record(&self) -> Option<&CommitRecord> {
        match self {
            Self::Committed(record) | Self::CommittedByAnother(record) => Some(record),
            Self::Written { .. } | Self::Committing => None,
        }
    }
}

impl Checkpoints {
    /// Saves one rank's part of the checkpoint of `step` and, if this rank is the one that
    /// sees every rank's manifest and creates the commit intent, commits it (see
    /// [`RankSave`] for the protocol). Costs a read of its own manifest (absent, on a first
    /// run), the announcement's create-new, the container's upload, one create-new for the
    /// manifest and one listing (a request per 1,000 ranks); a rank that sees every manifest
    /// adds the intent's create-new, and the one that creates it a read per manifest (64 at a
    /// time), an open per container of a rank that announced past five sixths of the lease
    /// before (none, in a job whose ranks finish within it), and the commit record's
    /// create-new. A rank whose manifest exists uploads nothing and announces nothing.
    ///
    /// If the committing rank dies between its intent and the record, the step stays
    /// uncommitted with every manifest written until any rank runs again (its rerun commits)
    /// or the launcher calls [`commit_ranks`](Self::commit_ranks).
    ///
    /// A rank whose save fails (for any reason but a caller's mistake or an impostor's
    /// refusal) records why beside where its manifest would be (best effort, for at most
    /// [`FAILURE_RECORD_TIMEOUT`]), so [`list`](Self::list) and `weightbay ls` show the failed
    /// rank and its reason to a launcher deciding whether to wait. Once the rank's manifest is
    /// written the record no longer shows; the rank's next listing removes it (a rank saving
    /// with a rendezvous does not list, so then `gc` does).
    ///
    /// # Errors
    /// Every error names the rank (`rank 3 of 8, step 100: …`).
    /// [`ErrorKind::InvalidInput`] for a rank outside the world or a slice that does not fit,
    /// and, at commit, for a tensor whose slices overlap or leave a gap (naming it);
    /// [`ErrorKind::AlreadyExists`] when another process wrote this rank's manifest with
    /// other content; [`ErrorKind::TimedOut`] past [`RankSave::with_timeout`]; the storage's
    /// errors.
    pub fn save_rank(&self, step: u64, save: RankSave) -> Result<RankOutcome> {
        let (rank, world_size) = (save.rank, save.world_size);
        if world_size == 0 || rank >= world_size {
            return Err(Error::invalid(format!(
                "rank {rank} of a world of {world_size}"
            )));
        }
        let named = |e: Error| e.context(format!("rank {rank} of {world_size}, step {step}"));
        let save_dir = format!("{}/{}", self.step_dir(step), unique_token());
        self.saves.lock().ranks_in_flight.push(save_dir.clone());
        let result = self.write_rank(step, &save_dir, save);
        self.saves
            .lock()
            .ranks_in_flight
            .retain(|dir| *dir != save_dir);
        result.map_err(|e| {
            let e = named(e);
            // A caller's mistake (a bad slice) or an impostor's refusal is not a rank failing:
            // nothing of the rank's is written, and the rank that owns the slot may yet succeed.
            if !matches!(e.kind(), ErrorKind::InvalidInput | ErrorKind::AlreadyExists) {
                let failure = layout::failure_key(&self.step_dir(step), rank, world_size);
                self.record_failure(step, rank, world_size, &failure, &e);
            }
            e
        })
    }

    /// Writes rank `rank`'s failure record, best effort and within
    /// [`FAILURE_RECORD_TIMEOUT`].
    fn record_failure(&self, step: u64, rank: u32, world_size: u32, key: &str, error: &Error) {
        let failure = RankFailure {
            weightbay_rank_failure: FAILURE_VERSION,
            step,
            rank,
            world_size,
            error: error.to_string(),
            time_unix_ms: now_unix_ms(),
        };
        let Ok(body) = encode(&failure) else {
            return;
        };
        let options = CreateOptions::default()
            .with_expected_len(body.len() as u64)
            .with_deadline(Instant::now() + FAILURE_RECORD_TIMEOUT);
        if let Ok(mut sink) = self.storage.create(key, &options)
            && sink.write(&body).is_ok()
        {
            let _ = sink.commit();
        }
    }

    fn write_rank(&self, step: u64, save_dir: &str, mut save: RankSave) -> Result<RankOutcome> {
        let dir = self.step_dir(step);
        let format = save.writer.format();
        let durability = save.writer.durability();
        let deadline = save.timeout.map(|timeout| Instant::now() + timeout);
        if let Some(deadline) = deadline {
            save.writer = save.writer.with_deadline(deadline);
        }
        let mut small = CreateOptions::default().with_durability(durability);
        small.deadline = deadline;
        let key = format!("{save_dir}/rank-{:05}.{}", save.rank, format.extension());
        // `save_dir` is `dir` and a token, so the keys written here all start with `dir/`.
        let relative = key[dir.len() + 1..].to_owned();
        let tensors = save.tensors(&relative)?;
        let (rank, world_size) = (save.rank, save.world_size);
        let metadata = save.writer.metadata().clone();
        let manifest_of = |containers: Vec<ContainerRecord>| RankManifest {
            weightbay_rank_manifest: MANIFEST_VERSION,
            step,
            rank,
            world_size,
            format: format.to_string(),
            metadata: metadata.clone(),
            containers,
            tensors: tensors.clone(),
            announced_unix_ms: None,
        };
        let manifest_key = manifest_key(&dir, save.rank, save.world_size);
        // A rank that ran before (a restart, or a second process running as this rank) finds
        // its manifest first and compares what it would write, summed without uploading: a
        // restart after a commit moves none of the model's bytes.
        let (manifest, rerun) = match read_json::<RankManifest>(
            self.storage.as_ref(),
            &manifest_key,
            "rank manifest",
        ) {
            Ok(first) => {
                let mut summing = Summing::default();
                let len = save.writer.write_to_sink(&mut summing)?;
                let planned = manifest_of(vec![ContainerRecord {
                    key: relative,
                    len,
                    crc32c: summing.crc32c(),
                }]);
                check_same(&first, &planned, &manifest_key)?;
                (first, true)
            }
            Err(e) if e.kind() == ErrorKind::NotFound => {
                // Announced as every save is, with the manifest, so a gc pass elsewhere leaves
                // both until the step commits (or the lease ends), even when the step is older
                // than the newest complete one. The announcement stays after the manifest:
                // the rank's part is needed until some rank commits.
                let token = layout::save_token(save_dir);
                let announced_manifest = layout::relative(&self.prefix, &manifest_key);
                let announced_unix_ms = now_unix_ms();
                self.announce(step, token, vec![announced_manifest.to_owned()])?;
                let recording = Recording::new(Arc::clone(&self.storage));
                let written = save
                    .writer
                    .with_mode(WriteMode::Overwrite)
                    .write_to(&recording, &key);
                if let Err(e) = written {
                    recording.remove_all();
                    self.withdraw(step, save_dir);
                    return Err(e);
                }
                let manifest = RankManifest {
                    announced_unix_ms: Some(announced_unix_ms),
                    ..manifest_of(
                        recording
                            .written()
                            .into_iter()
                            // Written at `key` above, under `dir/` like it.
                            .map(|(key, len, crc32c)| ContainerRecord {
                                key: key[dir.len() + 1..].to_owned(),
                                len,
                                crc32c,
                            })
                            .collect(),
                    )
                };
                match self
                    .storage
                    .write_new_with(&manifest_key, &encode(&manifest)?, small)
                {
                    Ok(()) => (manifest, false),
                    Err(e) if e.kind() == ErrorKind::AlreadyExists => {
                        // Another process running as this rank wrote it since: only the same
                        // content may stand in for the manifest written first.
                        recording.remove_all();
                        self.withdraw(step, save_dir);
                        let first: RankManifest =
                            read_json(self.storage.as_ref(), &manifest_key, "rank manifest")?;
                        check_same(&first, &manifest, &manifest_key)?;
                        (first, true)
                    }
                    // The manifest may have been written all the same (a request whose answer
                    // was lost), naming this container: it stays, a rerun finds the manifest
                    // and reuses it, and `gc` removes the container if nothing names it.
                    Err(e) => return Err(e),
                }
            }
            Err(e) => return Err(e),
        };
        self.conclude_rank(step, &manifest, rerun, save.rendezvous.as_ref(), small)
    }

    /// What a rank does once its `manifest` is written (or was found written: a `rerun`): the
    /// rendezvous, or a listing of the manifests, decides whether it commits, and a record it
    /// finds or makes must hold its part.
    pub(crate) fn conclude_rank(
        &self,
        step: u64,
        manifest: &RankManifest,
        rerun: bool,
        rendezvous: Option<&Rendezvous>,
        small: CreateOptions,
    ) -> Result<RankOutcome> {
        let dir = self.step_dir(step);
        let (rank, world_size) = (manifest.rank, manifest.world_size);
        let outcome = match rendezvous {
            Some(decide) if decide()? => self.commit_unless_committed(step, world_size, small)?,
            Some(_) => RankOutcome::Committing,
            None => {
                let listed = self.storage.list(&format!("{dir}/{RANKS_DIR}"))?;
                // A failure this rank recorded before is history now.
                let failure = layout::failure_key(&dir, rank, world_size);
                if listed.iter().any(|l| l.key == failure) {
                    let _ = delete_if_present(self.storage.as_ref(), &failure);
                }
                let seen: BTreeSet<u32> = listed
                    .iter()
                    .filter_map(|l| parse_manifest_key(&dir, &l.key))
                    .filter(|&(_, listed_world)| listed_world == world_size)
                    .map(|(rank, _)| rank)
                    .collect();
                let missing: Vec<u32> = (0..world_size).filter(|r| !seen.contains(r)).collect();
                if !missing.is_empty() {
                    return Ok(RankOutcome::Written { missing });
                }
                if rerun {
                    self.commit_unless_committed(step, world_size, small)?
                } else {
                    let intent = layout::intent_key(&dir);
                    let body = format!("{{\"rank\": {rank}}}\n");
                    match self.storage.write_new_with(&intent, body.as_bytes(), small) {
                        Ok(()) => self.commit_merged(step, world_size, small)?,
                        Err(e) if e.kind() == ErrorKind::AlreadyExists => RankOutcome::Committing,
                        Err(e) => return Err(e),
                    }
                }
            }
        };
        if let Some(record) = outcome.record() {
            check_holds(record, manifest)?;
        }
        Ok(outcome)
    }

    /// Commits `step` from its `world_size` rank manifests, all of which must be written:
    /// what the rank that sees them all does, for a caller that knows they are (a job's
    /// launcher after every rank exited, or a rendezvous that left the commit to nobody).
    /// Idempotent: a step committed already is checked to be what these manifests make.
    ///
    /// # Errors
    /// [`ErrorKind::NotFound`] naming a missing manifest; [`ErrorKind::InvalidInput`] naming a
    /// tensor whose slices overlap, leave a gap or disagree on dtype or shape;
    /// [`ErrorKind::Corrupt`] when the committed record differs from these manifests'; the
    /// storage's errors.
    pub fn commit_ranks(&self, step: u64, world_size: u32) -> Result<RankOutcome> {
        self.commit_unless_committed(step, world_size, CreateOptions::default())
    }

    /// [`commit_ranks`](Self::commit_ranks) within `options`' deadline.
    fn commit_unless_committed(
        &self,
        step: u64,
        world_size: u32,
        options: CreateOptions,
    ) -> Result<RankOutcome> {
        match self.read_record(step) {
            Ok(record) => return Ok(RankOutcome::CommittedByAnother(record)),
            Err(e) if e.kind() == ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        self.commit_merged(step, world_size, options)
    }

    /// Reads the manifests, merges them and writes the commit record with create-new (with
    /// `options`' deadline; the record is written with the default durability, the strongest);
    /// a record written first by another must be the same (but for its time).
    fn commit_merged(
        &self,
        step: u64,
        world_size: u32,
        options: CreateOptions,
    ) -> Result<RankOutcome> {
        let dir = self.step_dir(step);
        let record_key = layout::record_key(&dir);
        let keys: Vec<String> = (0..world_size)
            .map(|rank| manifest_key(&dir, rank, world_size))
            .collect();
        let manifests = read_all(self.storage.as_ref(), &keys)?;
        // No record may name a container a gc pass removed after its rank's announcement ran
        // out (a rank that finished long before the last one, or one that did not announce).
        // A young announcement keeps the rest until this record is written.
        let young_ms = u64::try_from(self.commit_window().as_millis()).unwrap_or(u64::MAX);
        let now = now_unix_ms();
        let unprotected: Vec<ContainerRecord> = manifests
            .iter()
            .filter(|m| {
                m.announced_unix_ms
                    .is_none_or(|at| now.saturating_sub(at) >= young_ms)
            })
            .flat_map(|m| m.containers.iter().cloned())
            .collect();
        self.confirm_written(&dir, &unprotected)?;
        let record = merge(step, world_size, manifests)?;
        let options = options.with_durability(Durability::default());
        match self
            .storage
            .write_new_with(&record_key, &encode(&record)?, options)
        {
            Ok(()) => Ok(RankOutcome::Committed(record)),
            Err(e) if e.kind() == ErrorKind::AlreadyExists => {
                let committed = self.read_record(step)?;
                let timeless = |r: &CommitRecord| CommitRecord {
                    time_unix_ms: 0,
                    ..r.clone()
                };
                if timeless(&committed) != timeless(&record) {
                    return Err(Error::new(
                        ErrorKind::Corrupt,
                        format!(
                            "step {step} is committed with a record these manifests do not make"
                        ),
                    )
                    .with_key(&record_key));
                }
                Ok(RankOutcome::CommittedByAnother(committed))
            }
            Err(e) => Err(e),
        }
    }
}

/// Whether two manifests hold the same content, wherever and whenever their containers were
/// written.
fn same_content(a: &RankManifest, b: &RankManifest) -> bool {
    let placeless = |m: &RankManifest| {
        let file = |key: &str| key.rsplit('/').next().unwrap_or(key).to_owned();
        let mut m = m.clone();
        m.announced_unix_ms = None;
        for container in &mut m.containers {
            container.key = file(&container.key);
        }
        for tensor in m.tensors.values_mut() {
            tensor.container = file(&tensor.container);
        }
        m
    };
    placeless(a) == placeless(b)
}

/// Fails with [`ErrorKind::AlreadyExists`], naming the rank, unless `planned` holds the same
/// content as `first`, the manifest written first at `key`.
pub(crate) fn check_same(first: &RankManifest, planned: &RankManifest, key: &str) -> Result<()> {
    if same_content(first, planned) {
        return Ok(());
    }
    Err(Error::new(
        ErrorKind::AlreadyExists,
        format!(
            "rank {} of step {}: a manifest with other content is written already (is another \
             process running as rank {}?)",
            planned.rank, planned.step, planned.rank
        ),
    )
    .with_key(key))
}

/// Fails unless `record` holds `manifest`'s containers and slices as written.
fn check_holds(record: &CommitRecord, manifest: &RankManifest) -> Result<()> {
    let containers_held = manifest
        .containers
        .iter()
        .all(|c| record.containers.contains(c));
    let slices_held = manifest.tensors.iter().all(|(name, tensor)| {
        record.tensors.get(name).is_some_and(|logical| {
            logical.slices.iter().any(|slice| {
                slice.rank == manifest.rank
                    && slice.container == tensor.container
                    && slice.region == tensor.region
            })
        })
    });
    if containers_held && slices_held && record.world_size == Some(manifest.world_size) {
        return Ok(());
    }
    Err(Error::new(
        ErrorKind::Corrupt,
        format!(
            "step {} is committed without rank {}'s part as its manifest has it",
            manifest.step, manifest.rank
        ),
    ))
}

/// Every manifest at `keys`, in order, read several at a time ([`parallel::each`]).
fn read_all(storage: &dyn Storage, keys: &[String]) -> Result<Vec<RankManifest>> {
    parallel::each(keys, |key| read_json(storage, key, "rank manifest"))
}
