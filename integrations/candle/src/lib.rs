//! candle models load from and save to any weightbay storage: local files, memory maps,
//! `s3://`, `gs://`, `memory://`.
//!
//! Loading goes through candle's own `VarBuilder` with a [`WeightbayBackend`] over any
//! [`WeightSource`] (a [`Reader`](weightbay::Reader) over one container, or a sharded set).
//! Tensors are fetched when the model asks for them, one at a time, so a model built from
//! part of a checkpoint reads only that part; over a memory map the bytes are not copied
//! until candle creates its tensor. From an object store, where each ask would be a round trip
//! in sequence, prefetch: [`WeightbayBackend::prefetching`]`(reader, PrefetchPlan::All)` fetches
//! the tensors in batches, in parallel, ahead of the model constructor and within the store's
//! fetch budget. Every read lands in the `Vec` that becomes the candle tensor's storage
//! ([`CandleAllocator`]), so the bytes are written once, not once by the fetch and again by a
//! copy into candle's memory.
//! Saving streams a `VarMap` (or any named tensors) as
//! deferred tensors: each is read back from its device only when the writer reaches it. To a
//! key ([`save_var_map`]), or as a checkpoint of `weightbay-checkpoints` with any of its save
//! options, compressed or incremental ([`var_map_writer`]).
//!
//! ```
//! use candle_core::{DType, Device, Module, Tensor};
//! use candle_nn::{VarBuilder, VarMap};
//! use weightbay::{MemoryStorage, Reader};
//! use weightbay_candle::{WeightbayBackend, save_var_map};
//!
//! let device = Device::Cpu;
//! let varmap = VarMap::new();
//! let layer = candle_nn::linear(4, 2, VarBuilder::from_varmap(&varmap, DType::F32, &device))?;
//! let storage = MemoryStorage::new();
//! save_var_map(&varmap, weightbay::Format::Safetensors, &storage, "model.safetensors")?;
//!
//! let reader = Reader::open_key(&storage, "model.safetensors")?;
//! let vb = VarBuilder::from_backend(Box::new(WeightbayBackend::new(reader)), DType::F32, device.clone());
//! let loaded = candle_nn::linear(4, 2, vb)?;
//! let x = Tensor::ones((1, 4), DType::F32, &device)?;
//! assert_eq!(layer.forward(&x)?.to_vec2::<f32>()?, loaded.forward(&x)?.to_vec2::<f32>()?);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::sync::Arc;

use bytemuck::Pod;
use candle_core::{DType as CandleDType, Device, Shape, Tensor as CandleTensor, WithDType};
use candle_nn::var_builder::SimpleBackend;
use weightbay::{AccessPolicy, Bytes, DType, Error, ErrorKind, Storage, Tensor, Writer};
use weightbay::{AllocationController, AllocationProperty, Format, Result as WbResult};
use weightbay::{PrefetchPlan, Prefetched, StoredTensor, TensorAllocator, WeightSource};

/// A candle `VarBuilder` backend over a weightbay [`WeightSource`]:
/// `VarBuilder::from_backend(Box::new(WeightbayBackend::new(reader)), dtype, device)`.
#[derive(Debug)]
pub struct WeightbayBackend<W> {
    weights: W,
}

impl<W: WeightSource + Send + Sync> WeightbayBackend<W> {
    /// A backend that loads from `weights`, each tensor read when the model asks for it.
    pub fn new(weights: W) -> Self {
        Self { weights }
    }

    /// Tensor `name` as stored, on `device`.
    fn load(&self, name: &str, device: &Device) -> candle_core::Result<CandleTensor> {
        let stored = self
            .weights
            .stored_tensors_in(&[name.to_owned()], &CandleAllocator)
            .map_err(candle_core::Error::wrap)?
            .pop()
            .flatten()
            .ok_or_else(|| {
                candle_core::Error::CannotFindTensor {
                    path: name.to_owned(),
                }
                .bt()
            })?;
        to_candle(name, stored, device).map_err(candle_core::Error::wrap)
    }
}

impl<W: WeightSource + 'static> WeightbayBackend<Prefetched<W>> {
    /// A backend that reads the tensors of `plan` ahead of the model constructor, in
    /// parallel within the source's fetch budget ([`Prefetched`]), each landing in the memory
    /// of the candle tensor it becomes.
    ///
    /// # Errors
    /// [`ErrorKind::Io`] when a prefetch thread cannot start.
    pub fn prefetching(weights: W, plan: PrefetchPlan) -> WbResult<Self> {
        Ok(Self::new(Prefetched::landing_in(
            weights,
            plan,
            Arc::new(CandleAllocator),
        )?))
    }
}

/// Lands a read tensor in a zeroed `Vec` of the candle element type its dtype maps to, which
/// [`WeightbayBackend`] turns into the candle tensor without a copy
/// (`Tensor::from_vec`). Pass it to [`WeightSource::stored_tensors_in`] or
/// [`Prefetched::landing_in`]; [`WeightbayBackend`] does both itself.
#[derive(Debug, Clone, Copy, Default)]
pub struct CandleAllocator;

impl TensorAllocator for CandleAllocator {
    fn allocate(
        &self,
        _name: &str,
        dtype: &DType,
        _shape: &[u64],
        len: usize,
    ) -> WbResult<Box<dyn AllocationController>> {
        match candle_dtype(dtype)? {
            CandleDType::U8 => Landed::<u8>::zeroed(len),
            CandleDType::U32 => Landed::<u32>::zeroed(len),
            CandleDType::I16 => Landed::<i16>::zeroed(len),
            CandleDType::I32 => Landed::<i32>::zeroed(len),
            CandleDType::I64 => Landed::<i64>::zeroed(len),
            CandleDType::F16 => Landed::<half::f16>::zeroed(len),
            CandleDType::BF16 => Landed::<half::bf16>::zeroed(len),
            CandleDType::F32 => Landed::<f32>::zeroed(len),
            CandleDType::F64 => Landed::<f64>::zeroed(len),
            other => Err(Error::unsupported(format!(
                "candle has no {other:?} tensors"
            ))),
        }
    }
}

/// A candle tensor's storage-to-be, lent as bytes for a read to land in.
#[derive(Debug)]
struct Landed<T>(Vec<T>);

impl<T: Pod + Send + Sync + std::fmt::Debug> Landed<T> {
    /// `len` bytes of zeroed `T`s: `calloc`, whose large blocks are fresh pages the read
    /// faults in as it writes.
    fn zeroed(len: usize) -> WbResult<Box<dyn AllocationController>> {
        let size = std::mem::size_of::<T>();
        if !len.is_multiple_of(size) {
            return Err(Error::invalid(format!(
                "{len} bytes are not a whole number of {size}-byte elements"
            )));
        }
        let elements = bytemuck::allocation::try_zeroed_vec::<T>(len / size)
            .map_err(|()| Error::new(ErrorKind::Io, format!("could not allocate {len} bytes")))?;
        Ok(Box::new(Self(elements)))
    }
}

impl<T: Pod + Send + Sync + std::fmt::Debug> AllocationController for Landed<T> {
    fn len(&self) -> usize {
        std::mem::size_of_val(self.0.as_slice())
    }
    fn alignment(&self) -> usize {
        std::mem::align_of::<T>()
    }
    fn property(&self) -> AllocationProperty {
        AllocationProperty::Native
    }
    fn memory(&self, _policy: AccessPolicy) -> WbResult<&[u8]> {
        Ok(bytemuck::cast_slice(&self.0))
    }
    fn memory_mut(&mut self) -> Option<&mut [u8]> {
        Some(bytemuck::cast_slice_mut(&mut self.0))
    }
}

/// The candle tensor over `bytes` when they are a [`Landed`] `Vec<T>`: no copy on the CPU.
fn from_landed<T: Pod + WithDType + std::fmt::Debug>(
    bytes: Bytes,
    shape: &[usize],
    device: &Device,
) -> Result<candle_core::Result<CandleTensor>, Bytes> {
    let landed = bytes.into_allocation::<Landed<T>>()?;
    Ok(CandleTensor::from_vec(landed.0, shape, device))
}

/// Builds a candle tensor from a stored one: over the `Vec` the bytes landed in
/// ([`CandleAllocator`]) without a copy; otherwise read in place where the source holds them
/// (a map, memory) and copied once, by candle, into its tensor.
fn to_candle(name: &str, stored: StoredTensor, device: &Device) -> WbResult<CandleTensor> {
    let dtype = candle_dtype(&stored.dtype).map_err(|e| e.with_tensor(name))?;
    let shape: Vec<usize> = stored
        .shape
        .iter()
        .map(|&d| usize::try_from(d))
        .collect::<Result<_, _>>()
        .map_err(|_| {
            Error::new(
                ErrorKind::LimitExceeded,
                "a dimension does not fit in memory",
            )
        })?;
    let refused = |e: candle_core::Error| {
        Error::invalid(format!("candle refused the tensor: {e}")).with_tensor(name)
    };
    let landed = match dtype {
        CandleDType::U8 => from_landed::<u8>(stored.bytes, &shape, device),
        CandleDType::U32 => from_landed::<u32>(stored.bytes, &shape, device),
        CandleDType::I16 => from_landed::<i16>(stored.bytes, &shape, device),
        CandleDType::I32 => from_landed::<i32>(stored.bytes, &shape, device),
        CandleDType::I64 => from_landed::<i64>(stored.bytes, &shape, device),
        CandleDType::F16 => from_landed::<half::f16>(stored.bytes, &shape, device),
        CandleDType::BF16 => from_landed::<half::bf16>(stored.bytes, &shape, device),
        CandleDType::F32 => from_landed::<f32>(stored.bytes, &shape, device),
        CandleDType::F64 => from_landed::<f64>(stored.bytes, &shape, device),
        _ => Err(stored.bytes),
    };
    match landed {
        Ok(tensor) => tensor.map_err(refused),
        Err(bytes) => {
            let data = bytes.read(AccessPolicy::AllowCopy)?;
            CandleTensor::from_raw_buffer(data, dtype, &shape, device).map_err(refused)
        }
    }
}

/// candle's name for a weightbay dtype.
fn candle_dtype(dtype: &DType) -> weightbay::Result<CandleDType> {
    Ok(match dtype {
        DType::F64 => CandleDType::F64,
        DType::F32 => CandleDType::F32,
        DType::F16 => CandleDType::F16,
        DType::BF16 => CandleDType::BF16,
        DType::I64 => CandleDType::I64,
        DType::I32 => CandleDType::I32,
        DType::I16 => CandleDType::I16,
        DType::U32 => CandleDType::U32,
        DType::U8 => CandleDType::U8,
        other => {
            return Err(Error::unsupported(format!("candle has no {other} tensors")));
        }
    })
}

/// weightbay's name for a candle dtype.
fn weightbay_dtype(dtype: CandleDType) -> weightbay::Result<DType> {
    Ok(match dtype {
        CandleDType::F64 => DType::F64,
        CandleDType::F32 => DType::F32,
        CandleDType::F16 => DType::F16,
        CandleDType::BF16 => DType::BF16,
        CandleDType::I64 => DType::I64,
        CandleDType::I32 => DType::I32,
        CandleDType::I16 => DType::I16,
        CandleDType::U32 => DType::U32,
        CandleDType::U8 => DType::U8,
        other => {
            return Err(Error::unsupported(format!(
                "weightbay cannot store candle's {other:?} tensors"
            )));
        }
    })
}

impl<W: WeightSource + Send + Sync> SimpleBackend for WeightbayBackend<W> {
    fn get(
        &self,
        shape: Shape,
        name: &str,
        _: candle_nn::Init,
        dtype: CandleDType,
        device: &Device,
    ) -> candle_core::Result<CandleTensor> {
        let tensor = self.load(name, device)?;
        if tensor.shape() != &shape {
            return Err(candle_core::Error::UnexpectedShape {
                msg: format!("shape mismatch for {name}"),
                expected: shape,
                got: tensor.shape().clone(),
            }
            .bt());
        }
        tensor.to_dtype(dtype)
    }

    fn get_unchecked(
        &self,
        name: &str,
        dtype: CandleDType,
        device: &Device,
    ) -> candle_core::Result<CandleTensor> {
        self.load(name, device)?.to_dtype(dtype)
    }

    fn contains_tensor(&self, name: &str) -> bool {
        self.weights.contains(name)
    }
}

/// Saves a candle `VarMap` to `key` of `storage`, in `format` (see [`save_tensors`]).
///
/// # Errors
/// As [`save_tensors`].
pub fn save_var_map<S: Storage + ?Sized>(
    varmap: &candle_nn::VarMap,
    format: Format,
    storage: &S,
    key: &str,
) -> weightbay::Result<weightbay::WriteSummary> {
    var_map_writer(varmap, format)?.write_to(storage, key)
}

/// A writer of a candle `VarMap`'s tensors, in `format` (see [`tensors_writer`]): what a
/// checkpoint saves, with any `SaveOptions` of `weightbay-checkpoints` (compressed,
/// incremental), as `checkpoints.save_with(step, var_map_writer(&varmap, format)?,
/// SaveOptions::compressed())`.
///
/// # Errors
/// As [`tensors_writer`].
pub fn var_map_writer(varmap: &candle_nn::VarMap, format: Format) -> weightbay::Result<Writer> {
    let data = varmap
        .data()
        .lock()
        .map_err(|_| Error::new(ErrorKind::Io, "the VarMap's lock is poisoned"))?;
    let tensors: Vec<(String, CandleTensor)> = data
        .iter()
        .map(|(name, var)| (name.clone(), var.as_tensor().clone()))
        .collect();
    drop(data);
    tensors_writer(tensors, format)
}

/// Saves named candle tensors to `key` of `storage`, in `format`, sorted by name (the
/// writer of [`tensors_writer`]).
///
/// # Errors
/// As [`tensors_writer`]; the writer's and storage's errors.
pub fn save_tensors<S: Storage + ?Sized>(
    tensors: Vec<(String, CandleTensor)>,
    format: Format,
    storage: &S,
    key: &str,
) -> weightbay::Result<weightbay::WriteSummary> {
    tensors_writer(tensors, format)?.write_to(storage, key)
}

/// A writer of named candle tensors, in `format`, sorted by name. Each tensor is a deferred
/// weightbay tensor: copied to the host (from a GPU, say) only when the writer reaches it,
/// and dropped before the next, so memory holds one tensor beyond the model.
///
/// # Errors
/// [`ErrorKind::Unsupported`] for a dtype weightbay cannot store (the F8 and F4 kinds);
/// candle's error reading a tensor back comes when the writer reaches the tensor.
pub fn tensors_writer(
    mut tensors: Vec<(String, CandleTensor)>,
    format: Format,
) -> weightbay::Result<Writer> {
    tensors.sort_by(|a, b| a.0.cmp(&b.0));
    let tensors = tensors
        .into_iter()
        .map(|(name, tensor)| {
            let dtype = weightbay_dtype(tensor.dtype()).map_err(|e| e.with_tensor(&name))?;
            let shape: Vec<u64> = tensor.dims().iter().map(|&d| d as u64).collect();
            let len = (tensor.elem_count() * tensor.dtype().size_in_bytes()) as u64;
            let reported = name.clone();
            Ok(Tensor::deferred(name, dtype, shape, len, move || {
                host_bytes(&tensor).map_err(|e| {
                    Error::new(ErrorKind::Io, format!("reading the tensor back: {e}"))
                        .with_tensor(&reported)
                })
            }))
        })
        .collect::<weightbay::Result<Vec<_>>>()?;
    Ok(Writer::new(tensors).with_format(format))
}

/// A candle tensor's elements as little-endian bytes, in row-major order, on the host.
fn host_bytes(tensor: &CandleTensor) -> candle_core::Result<Bytes> {
    fn le<T, const N: usize>(values: Vec<T>, to_le: impl Fn(T) -> [u8; N]) -> Bytes {
        values
            .into_iter()
            .flat_map(to_le)
            .collect::<Vec<u8>>()
            .into()
    }
    let flat = tensor.flatten_all()?;
    Ok(match tensor.dtype() {
        CandleDType::U8 => flat.to_vec1::<u8>()?.into(),
        CandleDType::U32 => le(flat.to_vec1::<u32>()?, u32::to_le_bytes),
        CandleDType::I16 => le(flat.to_vec1::<i16>()?, i16::to_le_bytes),
        CandleDType::I32 => le(flat.to_vec1::<i32>()?, i32::to_le_bytes),
        CandleDType::I64 => le(flat.to_vec1::<i64>()?, i64::to_le_bytes),
        CandleDType::F16 => le(flat.to_vec1::<half::f16>()?, half::f16::to_le_bytes),
        CandleDType::BF16 => le(flat.to_vec1::<half::bf16>()?, half::bf16::to_le_bytes),
        CandleDType::F32 => le(flat.to_vec1::<f32>()?, f32::to_le_bytes),
        CandleDType::F64 => le(flat.to_vec1::<f64>()?, f64::to_le_bytes),
        other => {
            return Err(candle_core::Error::Msg(format!(
                "weightbay cannot store candle's {other:?} tensors"
            )));
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stored(bytes: Bytes) -> StoredTensor {
        StoredTensor {
            dtype: DType::F32,
            shape: vec![2, 3],
            bytes,
        }
    }

    fn storage_address(tensor: &CandleTensor) -> usize {
        let (storage, _) = tensor.storage_and_layout();
        match &*storage {
            candle_core::Storage::Cpu(candle_core::CpuStorage::F32(values)) => {
                values.as_ptr().addr()
            }
            _ => panic!("not a CPU f32 tensor"),
        }
    }

    #[test]
    fn a_tensor_landed_in_candles_memory_becomes_the_tensor_without_a_copy() {
        let values: Vec<u8> = (1..=6u8).flat_map(|v| f32::from(v).to_le_bytes()).collect();
        let mut allocation = CandleAllocator
            .allocate("t", &DType::F32, &[2, 3], values.len())
            .unwrap();
        let memory = allocation.memory_mut().unwrap();
        memory.copy_from_slice(&values);
        let landed_at = memory.as_ptr().addr();
        let tensor = to_candle(
            "t",
            stored(Bytes::from_controller(allocation)),
            &Device::Cpu,
        )
        .unwrap();
        assert_eq!(
            storage_address(&tensor),
            landed_at,
            "the Vec the read landed in"
        );
        assert_eq!(
            tensor.to_vec2::<f32>().unwrap(),
            [[1., 2., 3.], [4., 5., 6.]]
        );

        // Bytes of anyone else's memory, or shared with another handle, are copied.
        let other = Bytes::from(values.clone());
        let copied = to_candle("t", stored(other.clone()), &Device::Cpu).unwrap();
        let other_at = other.read(AccessPolicy::ZeroCopy).unwrap().as_ptr().addr();
        assert_ne!(storage_address(&copied), other_at);
        assert_eq!(
            copied.to_vec2::<f32>().unwrap(),
            [[1., 2., 3.], [4., 5., 6.]]
        );
    }

    #[test]
    fn an_allocation_of_a_partial_element_is_refused() {
        let err = CandleAllocator
            .allocate("t", &DType::F32, &[1], 7)
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidInput, "{err}");
    }
}
