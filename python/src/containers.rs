//! One container: `save`, `load`, and `open` for a lazy reader, at any location the CLI takes.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use weightbay::{AllocationProperty, Bytes, Format, Reader, Result, Tensor, TensorInfo, Writer};
use weightbay_location::Location;
use weightbay_mmap::{Prefetch, map_file_private};

use crate::dlpack::{self, HostTensor};
use crate::errors::to_py;

/// Alignment of the buffers tensors land in: a cache line, as torch's own allocator gives.
const LANDING_ALIGN: usize = 64;

/// A writer of `tensors` (name, DLPack object), each read where it lies. Every tensor is
/// checked before anything is written, so a refused one leaves nothing behind.
pub(crate) fn writer(
    tensors: &[(String, Bound<'_, PyAny>)],
    metadata: Option<BTreeMap<String, String>>,
    format: Format,
) -> PyResult<Writer> {
    let tensors = tensors
        .iter()
        .map(|(name, object)| {
            let imported = dlpack::import(name, object)?;
            Ok(Tensor::new(
                name.as_str(),
                imported.dtype,
                imported.shape,
                imported.bytes,
            ))
        })
        .collect::<PyResult<Vec<_>>>()?;
    let mut writer = Writer::new(tensors).with_format(format);
    for (key, value) in metadata.unwrap_or_default() {
        writer = writer.with_metadata(key, value);
    }
    Ok(writer)
}

/// The format `format` names (`"safetensors"`, `"burnpack"`), or else the one `location`'s
/// extension names, or Burnpack.
pub(crate) fn chosen_format(format: Option<&str>, location: &str) -> PyResult<Format> {
    match format {
        Some("safetensors") => Ok(Format::Safetensors),
        Some("burnpack" | "bpk") => Ok(Format::Burnpack),
        Some(other) => Err(PyValueError::new_err(format!(
            "unknown format `{other}`: \"safetensors\" or \"burnpack\""
        ))),
        None => Ok(Format::from_file_name(location).unwrap_or_default()),
    }
}

/// Saves `tensors` as one container at `location`, durably (a local file is fsynced and
/// renamed into place; an object is complete or absent).
#[pyfunction]
#[pyo3(signature = (tensors, location, metadata=None, format=None))]
pub(crate) fn save(
    py: Python<'_>,
    tensors: Vec<(String, Bound<'_, PyAny>)>,
    location: &str,
    metadata: Option<BTreeMap<String, String>>,
    format: Option<&str>,
) -> PyResult<()> {
    let writer = writer(&tensors, metadata, chosen_format(format, location)?)?;
    py.detach(|| {
        let location = Location::parse(location)?;
        writer.write_to(location.storage.as_ref(), &location.key)
    })
    .map(drop)
    .map_err(to_py)
}

/// Every tensor of the container at `location`, in its order, each landed once in memory of
/// its own (or, from a memory map, viewing the mapped pages).
#[pyfunction]
#[pyo3(signature = (location, mmap=true))]
pub(crate) fn load(
    py: Python<'_>,
    location: &str,
    mmap: bool,
) -> PyResult<Vec<(String, HostTensor)>> {
    let (reader, landed) = py
        .detach(|| {
            let reader = open_reader(location, mmap)?;
            let names: Vec<&str> = reader.tensors().iter().map(|t| t.name()).collect();
            let landed = land(&reader, &names)?;
            Ok((reader, landed))
        })
        .map_err(to_py)?;
    reader
        .tensors()
        .iter()
        .zip(landed)
        .map(|(info, bytes)| Ok((info.name().to_owned(), host_tensor(info, bytes)?)))
        .collect()
}

/// Opens the container at `location`: a local path is mapped (privately, see
/// [`map_file_private`]) when `mmap` is set; anything else is read through its store.
pub(crate) fn open_reader(location: &str, mmap: bool) -> Result<Reader> {
    let local = match location.split_once("://") {
        None => Some(location),
        Some(("file", path)) => Some(path),
        Some(_) => None,
    };
    if let Some(path) = local.filter(|_| mmap) {
        let source = map_file_private(Path::new(path), Prefetch::Sequential)?;
        return Reader::open(Arc::new(source)).map_err(|e| e.with_key(location));
    }
    let parsed = Location::parse(location)?;
    let source = parsed.storage.open(&parsed.key)?;
    Reader::open(source).map_err(|e| e.with_key(location))
}

/// The bytes of the tensors `names`: mapped bytes as they lie; anything else read once, in one
/// batch the source may fetch in parallel, into a buffer per tensor.
fn land(reader: &Reader, names: &[&str]) -> Result<Vec<Bytes>> {
    let mut landed = Vec::with_capacity(names.len());
    let mut to_read = Vec::new();
    for (index, name) in names.iter().enumerate() {
        let bytes = reader.bytes(name)?;
        if bytes.property() == AllocationProperty::Mmap {
            landed.push(bytes);
        } else {
            landed.push(Bytes::zeroed(bytes.len(), LANDING_ALIGN)?);
            to_read.push(index);
        }
    }
    let mut targets = Vec::with_capacity(to_read.len());
    let mut buffers = landed.iter_mut().enumerate();
    for index in to_read {
        // Indices ascend, so each buffer is found further on.
        let buffer = buffers
            .find(|(at, _)| *at == index)
            .map(|(_, buffer)| buffer)
            .expect("every index to read has a buffer");
        targets.push((names[index], buffer.make_mut()?));
    }
    reader.read_many_into(&mut targets)?;
    Ok(landed)
}

fn host_tensor(info: &TensorInfo, bytes: Bytes) -> PyResult<HostTensor> {
    let dtype = dlpack::dlpack_type(info.dtype()).ok_or_else(|| {
        PyValueError::new_err(format!(
            "tensor `{}` is {}, which has no DLPack type",
            info.name(),
            info.dtype()
        ))
    })?;
    HostTensor::new(bytes, dtype, info.shape())
}

/// A container opened for reading tensor by tensor, as safetensors' `safe_open`; `close()`
/// (or leaving a `with` block) ends it, and any use after that is an error.
#[pyclass(frozen, module = "weightbay._native")]
pub(crate) struct Container {
    reader: Mutex<Option<Reader>>,
    location: String,
}

impl Container {
    pub(crate) fn new(reader: Reader, location: String) -> Self {
        Self {
            reader: Mutex::new(Some(reader)),
            location,
        }
    }

    fn reader(&self) -> PyResult<Reader> {
        self.reader
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
            .ok_or_else(|| {
                PyValueError::new_err(format!("the container `{}` is closed", self.location))
            })
    }
}

#[pymethods]
impl Container {
    #[new]
    #[pyo3(signature = (location, mmap=true))]
    fn open(py: Python<'_>, location: &str, mmap: bool) -> PyResult<Self> {
        let reader = py.detach(|| open_reader(location, mmap)).map_err(to_py)?;
        Ok(Self::new(reader, location.to_owned()))
    }

    /// The tensor names, in the container's order.
    fn keys(&self) -> PyResult<Vec<String>> {
        Ok(self
            .reader()?
            .tensors()
            .iter()
            .map(|t| t.name().to_owned())
            .collect())
    }

    /// The string metadata (safetensors' `__metadata__`, Burnpack's metadata map).
    fn metadata(&self) -> PyResult<BTreeMap<String, String>> {
        Ok(self.reader()?.metadata().clone())
    }

    /// `"safetensors"` or `"burnpack"`.
    fn format(&self) -> PyResult<String> {
        Ok(self.reader()?.format().to_string())
    }

    /// A tensor's stored dtype (`"BF16"`, `"F8_E4M3"`) and shape, without reading it.
    fn info(&self, name: &str) -> PyResult<(String, Vec<u64>)> {
        let reader = self.reader()?;
        let info = reader.tensor(name).map_err(to_py)?;
        Ok((info.dtype().to_string(), info.shape().to_vec()))
    }

    /// The named tensors, read together (one batch the store may fetch in parallel).
    fn get_tensors(&self, py: Python<'_>, names: Vec<String>) -> PyResult<Vec<HostTensor>> {
        let reader = self.reader()?;
        let wanted: Vec<&str> = names.iter().map(String::as_str).collect();
        let landed = py.detach(|| land(&reader, &wanted)).map_err(to_py)?;
        names
            .iter()
            .zip(landed)
            .map(|(name, bytes)| host_tensor(reader.tensor(name).map_err(to_py)?, bytes))
            .collect()
    }

    /// Reads every byte and checks it against the integrity trailer (a Burnpack container
    /// written by weightbay) or, without one, the structure; returns the bytes checked.
    fn verify(&self, py: Python<'_>) -> PyResult<u64> {
        let reader = self.reader()?;
        let report = py.detach(|| reader.verify()).map_err(to_py)?;
        Ok(report.bytes)
    }

    /// Ends this reader; tensors already given out stay valid.
    fn close(&self) {
        self.reader
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
    }
}
