//! A checkpoint written by several ranks, read by region whatever layout wrote it:
//! `weightbay_checkpoints::AssembledWeights`, with regions handed out through DLPack.

use std::collections::BTreeMap;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyAny;
use weightbay_checkpoints::{AssembledWeights, Checkpoint, Region};

use crate::dlpack::{self, HostTensor, TargetTensor};
use crate::errors::to_py;

/// One logical tensor: its dtype (safetensors' spelling), its whole shape, and the boxes
/// (offsets, lengths) the ranks stored it in.
type TensorLayout = (String, Vec<u64>, Vec<(Vec<u64>, Vec<u64>)>);

/// A box to read in place: the tensor's name, the box's offsets and lengths, and the target.
type InPlace<'py> = (String, Vec<u64>, Vec<u64>, Bound<'py, PyAny>);

/// The tensors of one multi-rank checkpoint.
#[pyclass(frozen, module = "weightbay._native")]
pub(crate) struct Assembled {
    weights: AssembledWeights,
    step: u64,
    metadata: BTreeMap<String, String>,
}

impl Assembled {
    pub(crate) fn new(checkpoint: &Checkpoint, weights: AssembledWeights) -> Self {
        Self {
            weights,
            step: checkpoint.step(),
            metadata: checkpoint.record().metadata.clone(),
        }
    }
}

#[pymethods]
impl Assembled {
    /// The checkpoint's step.
    #[getter]
    fn step(&self) -> u64 {
        self.step
    }

    /// The commit record's metadata (rank 0's).
    fn metadata(&self) -> BTreeMap<String, String> {
        self.metadata.clone()
    }

    /// Every logical tensor by name: dtype, whole shape and stored boxes. Reads each
    /// container's header once, for the dtypes as stored.
    fn tensors(&self, py: Python<'_>) -> PyResult<BTreeMap<String, TensorLayout>> {
        py.detach(|| {
            self.weights
                .names()
                .map(|name| {
                    let dtype = self.weights.dtype(name)?;
                    let logical = self
                        .weights
                        .tensor(name)
                        .expect("a listed name has a tensor");
                    let boxes = logical
                        .slices
                        .iter()
                        .map(|slice| (slice.region.offsets.clone(), slice.region.lengths.clone()))
                        .collect();
                    let spelled = dtype
                        .safetensors_name()
                        .map_or_else(|| dtype.to_string(), str::to_owned);
                    Ok((name.to_owned(), (spelled, logical.shape.clone(), boxes)))
                })
                .collect::<weightbay::Result<_>>()
        })
        .map_err(to_py)
    }

    /// Each box asked for, `(name, offsets, lengths)`, its elements row-major: one batched
    /// fetch per container holding any of them, of only the byte runs they need.
    fn read_regions(
        &self,
        py: Python<'_>,
        wanted: Vec<(String, Vec<u64>, Vec<u64>)>,
    ) -> PyResult<Vec<HostTensor>> {
        let regions: Vec<(&str, Region)> = wanted
            .iter()
            .map(|(name, offsets, lengths)| {
                (name.as_str(), Region::new(offsets.clone(), lengths.clone()))
            })
            .collect();
        let (dtypes, read) = py
            .detach(|| {
                let dtypes = regions
                    .iter()
                    .map(|(name, _)| self.weights.dtype(name))
                    .collect::<weightbay::Result<Vec<_>>>()?;
                Ok((dtypes, self.weights.read_regions(&regions)?))
            })
            .map_err(to_py)?;
        read.into_iter()
            .zip(dtypes)
            .zip(&wanted)
            .map(|((bytes, dtype), (name, _, lengths))| {
                let dl = dlpack::dlpack_type(&dtype).ok_or_else(|| {
                    PyValueError::new_err(format!(
                        "tensor `{name}` is {dtype}, which has no DLPack type"
                    ))
                })?;
                HostTensor::new(bytes, dl, lengths)
            })
            .collect()
    }

    /// Reads each box asked for, `(name, offsets, lengths, target)`, into `target`'s own
    /// memory: a compact host tensor of the stored dtype with as many elements as the box.
    /// Nothing is read unless every target passes; the targets must not share memory, and
    /// nothing else may use them until the call returns (the GIL is released meanwhile).
    fn read_regions_into(&self, py: Python<'_>, wanted: Vec<InPlace<'_>>) -> PyResult<()> {
        let mut targets: Vec<(String, Region, TargetTensor)> = Vec::with_capacity(wanted.len());
        for (name, offsets, lengths, object) in wanted {
            let target = dlpack::import_target(&name, &object)?;
            let stored = py.detach(|| self.weights.dtype(&name)).map_err(to_py)?;
            if target.dtype != stored {
                return Err(PyValueError::new_err(format!(
                    "tensor `{name}` is stored as {stored}, the target is {}",
                    target.dtype
                )));
            }
            let region = Region::new(offsets, lengths);
            if target.shape.iter().product::<u64>() != region.elements() {
                return Err(PyValueError::new_err(format!(
                    "tensor `{name}`: the target's shape {:?} does not hold {region:?}",
                    target.shape
                )));
            }
            targets.push((name, region, target));
        }
        let mut spans: Vec<(usize, usize, &str)> = targets
            .iter_mut()
            .map(|(name, _, target)| {
                let len = target.bytes_mut().len();
                (target.address(), len, name.as_str())
            })
            .filter(|&(_, len, _)| len > 0)
            .collect();
        spans.sort_unstable();
        for pair in spans.windows(2) {
            let ((start, len, first), (next, _, second)) = (pair[0], pair[1]);
            if start + len > next {
                return Err(PyValueError::new_err(format!(
                    "the targets of `{first}` and `{second}` share memory"
                )));
            }
        }
        let mut jobs: Vec<(&str, Region, &mut [u8])> = targets
            .iter_mut()
            .map(|(name, region, target)| (name.as_str(), region.clone(), target.bytes_mut()))
            .collect();
        py.detach(|| self.weights.read_regions_into(&mut jobs))
            .map_err(to_py)
    }
}
