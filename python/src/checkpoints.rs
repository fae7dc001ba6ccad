//! The checkpoints of a training run under one prefix: `weightbay_checkpoints::Checkpoints`,
//! with tensors taken through DLPack.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use weightbay::{AccessPolicy, Bytes, Tensor, Writer};
use weightbay_checkpoints::{
    Checkpoint, Checkpoints as Run, RankOutcome, RankSave, Region, Retention, SaveOptions,
};
use weightbay_location::Location;

use crate::assembled::Assembled;
use crate::containers::{Container, chosen_format, writer};
use crate::errors::to_py;

/// A tensor that is a box of a larger one: the whole tensor's shape and the box's offsets.
type SliceOf = (Vec<u64>, Vec<u64>);

/// Alignment of a background save's snapshot buffers.
const SNAPSHOT_ALIGN: usize = 64;

/// The checkpoints under one prefix (`run-1`, `s3://bucket/runs/run-1`).
#[pyclass(frozen, module = "weightbay._native")]
pub(crate) struct Checkpoints {
    run: Run,
    location: String,
}

impl Checkpoints {
    /// Checkpoint `step`, or the latest complete one.
    fn checkpoint(&self, step: Option<u64>) -> weightbay::Result<Checkpoint> {
        match step {
            Some(step) => self.run.open(step),
            None => self.run.latest()?.ok_or_else(|| {
                weightbay::Error::new(
                    weightbay::ErrorKind::NotFound,
                    "no complete checkpoint under this prefix",
                )
            }),
        }
    }
}

/// The options of a save: `compress` makes it incremental too.
fn options(
    incremental: bool,
    compress: bool,
    metadata: Option<BTreeMap<String, String>>,
) -> SaveOptions {
    let mut options = match (incremental, compress) {
        (_, true) => SaveOptions::compressed(),
        (true, false) => SaveOptions::incremental(),
        (false, false) => SaveOptions::default(),
    };
    options.metadata = metadata.unwrap_or_default();
    options
}

#[pymethods]
impl Checkpoints {
    #[new]
    fn new(py: Python<'_>, location: &str) -> PyResult<Self> {
        let parsed = py.detach(|| Location::parse(location)).map_err(to_py)?;
        Ok(Self {
            run: Run::over(Arc::clone(&parsed.storage), parsed.key),
            location: location.to_owned(),
        })
    }

    /// Saves `tensors` as checkpoint `step` and commits it: its record is written last, with
    /// every container's CRC32C. `incremental` writes only the 1 MiB pieces an earlier
    /// checkpoint lacks; `compress` (incremental too) stores them encoded where that saves.
    #[pyo3(signature = (step, tensors, metadata=None, format=None, incremental=false, compress=false))]
    #[expect(
        clippy::too_many_arguments,
        reason = "the Python signature: keyword arguments with defaults"
    )]
    fn save(
        &self,
        py: Python<'_>,
        step: u64,
        tensors: Vec<(String, Bound<'_, PyAny>)>,
        metadata: Option<BTreeMap<String, String>>,
        format: Option<&str>,
        incremental: bool,
        compress: bool,
    ) -> PyResult<()> {
        let writer = writer(&tensors, None, chosen_format(format, "")?)?;
        py.detach(|| {
            self.run
                .save_with(step, writer, options(incremental, compress, metadata))
        })
        .map(drop)
        .map_err(to_py)
    }

    /// Starts saving `step` on a thread of its own and returns once the tensors are copied:
    /// the save keeps the values they had at the call, whatever training does to them next,
    /// at the cost of one copy of them in host memory until the save ends. One save is in
    /// flight at a time: a second call first waits for the first.
    #[pyo3(signature = (step, tensors, metadata=None, format=None, incremental=false, compress=false))]
    #[expect(
        clippy::too_many_arguments,
        reason = "the Python signature: keyword arguments with defaults"
    )]
    fn save_in_background(
        &self,
        py: Python<'_>,
        step: u64,
        tensors: Vec<(String, Bound<'_, PyAny>)>,
        metadata: Option<BTreeMap<String, String>>,
        format: Option<&str>,
        incremental: bool,
        compress: bool,
    ) -> PyResult<SaveHandle> {
        let writer = writer(&tensors, None, chosen_format(format, "")?)?;
        let handle = py
            .detach(|| {
                let writer = snapshot(writer)?;
                self.run
                    .save_in_background(step, writer, options(incremental, compress, metadata))
            })
            .map_err(to_py)?;
        Ok(SaveHandle {
            step,
            handle: Mutex::new(Some(handle)),
        })
    }

    /// Saves rank `rank`'s part of checkpoint `step`, written by `world_size` ranks (the
    /// protocol of `weightbay_checkpoints::RankSave`). `slices` names the tensors that are
    /// boxes of larger ones: name to (the whole tensor's shape, the box's offsets); the box's
    /// lengths are the tensor's shape. With `commit`, the rank that sees every rank's part
    /// commits; without, none does, and the caller commits with `commit_ranks` once all are
    /// written. Returns how the rank ended: `"committed"`, `"committed_by_another"`,
    /// `"written"` (ranks still missing) or `"committing"`.
    #[pyo3(signature = (step, rank, world_size, tensors, slices=None, metadata=None, format=None, commit=true))]
    #[expect(
        clippy::too_many_arguments,
        reason = "the Python signature: keyword arguments with defaults"
    )]
    fn save_rank(
        &self,
        py: Python<'_>,
        step: u64,
        rank: u32,
        world_size: u32,
        tensors: Vec<(String, Bound<'_, PyAny>)>,
        slices: Option<BTreeMap<String, SliceOf>>,
        metadata: Option<BTreeMap<String, String>>,
        format: Option<&str>,
        commit: bool,
    ) -> PyResult<&'static str> {
        let writer = writer(&tensors, metadata, chosen_format(format, "")?)?;
        // A box is as long as the tensor given for it; a slice of a name not given gets no
        // lengths, and the save refuses it, naming it.
        let regions: Vec<(String, Vec<u64>, Region)> = slices
            .unwrap_or_default()
            .into_iter()
            .map(|(name, (shape, offsets))| {
                let lengths = writer
                    .tensors()
                    .iter()
                    .find(|tensor| tensor.name() == name)
                    .map(|tensor| tensor.shape().to_vec())
                    .unwrap_or_default();
                (name, shape, Region::new(offsets, lengths))
            })
            .collect();
        let mut save = RankSave::new(rank, world_size, writer);
        for (name, shape, region) in regions {
            save = save.with_slice(name, shape, region);
        }
        if !commit {
            save = save.with_rendezvous(|| Ok(false));
        }
        let outcome = py
            .detach(|| self.run.save_rank(step, save))
            .map_err(to_py)?;
        Ok(match outcome {
            RankOutcome::Committed(_) => "committed",
            RankOutcome::CommittedByAnother(_) => "committed_by_another",
            RankOutcome::Written { .. } => "written",
            RankOutcome::Committing => "committing",
        })
    }

    /// Commits `step` from its `world_size` rank parts, all of which must be written. A step
    /// committed already is checked to be what the parts make.
    fn commit_ranks(&self, py: Python<'_>, step: u64, world_size: u32) -> PyResult<()> {
        py.detach(|| self.run.commit_ranks(step, world_size))
            .map(drop)
            .map_err(to_py)
    }

    /// The tensors of checkpoint `step` (the latest complete one when `None`), written by
    /// several ranks, for reading by region whatever layout wrote them.
    #[pyo3(signature = (step=None))]
    fn assembled(&self, py: Python<'_>, step: Option<u64>) -> PyResult<Assembled> {
        py.detach(|| {
            let checkpoint = self.checkpoint(step)?;
            let weights = checkpoint.assembled()?;
            Ok(Assembled::new(&checkpoint, weights))
        })
        .map_err(|e: weightbay::Error| to_py(e.with_key(&self.location)))
    }

    /// The newest complete checkpoint's step, or `None`: never a save that did not commit.
    fn latest(&self, py: Python<'_>) -> PyResult<Option<u64>> {
        let latest = py.detach(|| self.run.latest()).map_err(to_py)?;
        Ok(latest.map(|checkpoint| checkpoint.step()))
    }

    /// The steps of the complete checkpoints, oldest first.
    fn steps(&self, py: Python<'_>) -> PyResult<Vec<u64>> {
        py.detach(|| self.run.steps()).map_err(to_py)
    }

    /// Opens checkpoint `step` (the latest complete one when `None`).
    #[pyo3(signature = (step=None))]
    fn open(&self, py: Python<'_>, step: Option<u64>) -> PyResult<Container> {
        let reader = py
            .detach(|| self.checkpoint(step)?.reader())
            .map_err(|e| to_py(e.with_key(&self.location)))?;
        Ok(Container::new(reader, self.location.clone()))
    }

    /// Deletes the checkpoints the policy does not keep (the newest is always kept) and
    /// returns their steps.
    #[pyo3(signature = (keep_last=None, keep_every=None))]
    fn retain(
        &self,
        py: Python<'_>,
        keep_last: Option<usize>,
        keep_every: Option<u64>,
    ) -> PyResult<Vec<u64>> {
        if keep_last.is_none() && keep_every.is_none() {
            return Err(PyValueError::new_err(
                "retain() needs keep_last, keep_every or both",
            ));
        }
        let mut policy = Retention::default();
        policy.keep_last = keep_last;
        policy.keep_every = keep_every.filter(|&k| k > 0);
        py.detach(|| self.run.retain(&policy)).map_err(to_py)
    }

    /// Removes what no complete checkpoint refers to: saves that never committed (once a newer
    /// checkpoint is complete) and abandoned uploads. `dry_run` only reports. Returns the keys
    /// removed (or to remove) by what they were: `orphans`, `spent`, `pending`, and `refused`
    /// (found but left alone: a record weightbay did not write).
    #[pyo3(signature = (dry_run=false))]
    fn gc(&self, py: Python<'_>, dry_run: bool) -> PyResult<BTreeMap<&'static str, Vec<String>>> {
        let report = py
            .detach(|| {
                if dry_run {
                    self.run.gc_plan()
                } else {
                    self.run.gc()
                }
            })
            .map_err(to_py)?;
        let keys = |pending: Vec<weightbay::PendingWrite>| {
            pending.into_iter().map(|p| p.key).collect::<Vec<_>>()
        };
        Ok(BTreeMap::from([
            ("orphans", report.orphans),
            ("spent", report.spent),
            ("pending", keys(report.pending)),
            ("refused", keys(report.refused)),
        ]))
    }

    /// Reads checkpoint `step` (the latest when `None`) and checks every container against the
    /// CRC32C its commit record holds; returns the bytes checked.
    #[pyo3(signature = (step=None))]
    fn verify(&self, py: Python<'_>, step: Option<u64>) -> PyResult<u64> {
        py.detach(|| self.checkpoint(step)?.verify())
            .map(|report| report.bytes)
            .map_err(|e| to_py(e.with_key(&self.location)))
    }

    /// Waits for the background save in flight, and raises the failure of any whose handle was
    /// dropped. Call it before the program exits.
    fn flush(&self, py: Python<'_>) -> PyResult<()> {
        py.detach(|| self.run.flush()).map_err(to_py)
    }
}

/// `writer` with every tensor's bytes copied into memory of its own: what a background save
/// writes, so the caller may change its tensors as soon as the call returns. The copies run on
/// every core (up to 8), the tensors dealt out by size: the caller waits for them (torch's own
/// copies are as parallel), and on one thread the fresh pages' faults set the pace.
fn snapshot(writer: Writer) -> weightbay::Result<Writer> {
    let format = writer.format();
    let metadata = writer.metadata().clone();
    let tensors = writer.tensors();
    // Past a few threads the copies wait on memory bandwidth, not on one another.
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get().min(8));
    let mut shares: Vec<(u64, Vec<usize>)> = vec![(0, Vec::new()); threads];
    let mut by_size: Vec<usize> = (0..tensors.len()).collect();
    by_size.sort_unstable_by_key(|&i| std::cmp::Reverse(tensors[i].byte_len()));
    for index in by_size {
        let least = shares
            .iter_mut()
            .min_by_key(|(bytes, _)| *bytes)
            .expect("at least one thread");
        least.0 += tensors[index].byte_len();
        least.1.push(index);
    }
    let copy = |tensor: &Tensor| -> weightbay::Result<Tensor> {
        let bytes = tensor.bytes()?;
        let copy = Bytes::copy_from_slice(bytes.read(AccessPolicy::AllowCopy)?, SNAPSHOT_ALIGN)?;
        Ok(Tensor::new(
            tensor.name(),
            tensor.dtype().clone(),
            tensor.shape(),
            copy,
        ))
    };
    let copied: Vec<Vec<(usize, weightbay::Result<Tensor>)>> = std::thread::scope(|scope| {
        let workers: Vec<_> = shares
            .iter()
            .map(|(_, share)| {
                scope.spawn(|| share.iter().map(|&i| (i, copy(&tensors[i]))).collect())
            })
            .collect();
        workers
            .into_iter()
            .map(|worker| {
                worker
                    .join()
                    .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
            })
            .collect()
    });
    let mut in_order: Vec<(usize, weightbay::Result<Tensor>)> =
        copied.into_iter().flatten().collect();
    in_order.sort_unstable_by_key(|(index, _)| *index);
    let tensors = in_order
        .into_iter()
        .map(|(_, tensor)| tensor)
        .collect::<weightbay::Result<Vec<_>>>()?;
    let mut copied = Writer::new(tensors).with_format(format);
    for (key, value) in metadata {
        copied = copied.with_metadata(key, value);
    }
    Ok(copied)
}

/// A checkpoint saving in the background.
#[pyclass(frozen, module = "weightbay._native")]
pub(crate) struct SaveHandle {
    step: u64,
    handle: Mutex<Option<weightbay_checkpoints::SaveHandle>>,
}

#[pymethods]
impl SaveHandle {
    /// The step being saved.
    #[getter]
    fn step(&self) -> u64 {
        self.step
    }

    /// Whether the save has ended (committed or failed).
    fn done(&self) -> bool {
        self.handle
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref()
            .is_none_or(weightbay_checkpoints::SaveHandle::is_finished)
    }

    /// Waits for the save to commit, and raises its failure. A second call returns at once.
    fn wait(&self, py: Python<'_>) -> PyResult<()> {
        let handle = self
            .handle
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        match handle {
            Some(handle) => py.detach(|| handle.wait()).map(drop).map_err(to_py),
            None => Ok(()),
        }
    }
}
