//! How a runtime asks for weights: by component, validated, zero-copy where the backing
//! allows. A [`WeightSource`] answers with the bytes of the checkpoint tensors that make up a
//! component, checked against the component's declared shape and encoding.

use std::fmt;
use std::sync::Arc;

use crate::bytes::RetainedHostMemoryRegion;
use crate::lazy::lazy_bytes;
use crate::{
    AllocationController, AllocationProperty, Bytes, DType, Error, ErrorKind, Reader, Result,
};

/// How a component's elements are stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WeightEncoding {
    /// One element of `DType` per value.
    Dense(DType),
    /// Blocks of `values_per_block` values stored in `bytes_per_block` bytes each, tiling the
    /// last dimension (a partial last block still takes a whole block).
    BlockQuantized {
        /// Values in one block.
        values_per_block: u64,
        /// Bytes one block takes.
        bytes_per_block: u64,
    },
}

/// What a runtime asks for: one logical weight, made of one or more checkpoint tensors.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WeightComponentSpec {
    /// The component's identity in the runtime (`layers.0.mlp.gate_up`).
    pub id: String,
    /// The checkpoint tensors that make it up, in order (one, or several packed together).
    pub tensors: Vec<String>,
    /// The component's dimensions.
    pub dimensions: Vec<u64>,
    /// How its elements are stored.
    pub encoding: WeightEncoding,
    /// Whether a missing tensor is an error (`true`) or makes the component absent.
    pub required: bool,
}

impl WeightComponentSpec {
    /// A required dense component stored as one tensor of the same name.
    pub fn dense(id: impl Into<String>, dimensions: impl Into<Vec<u64>>, dtype: DType) -> Self {
        let id = id.into();
        Self {
            tensors: vec![id.clone()],
            id,
            dimensions: dimensions.into(),
            encoding: WeightEncoding::Dense(dtype),
            required: true,
        }
    }

    /// The same component, packed from `tensors` in order.
    #[must_use]
    pub fn packed_from(mut self, tensors: impl IntoIterator<Item = impl Into<String>>) -> Self {
        self.tensors = tensors.into_iter().map(Into::into).collect();
        self
    }

    /// The exact byte length the component must have.
    ///
    /// # Errors
    /// [`ErrorKind::InvalidInput`] for an empty or overflowing shape or a zero block size.
    pub fn byte_len(&self) -> Result<u64> {
        let invalid = |message: &str| Error::invalid(message.to_string()).with_tensor(&self.id);
        let Some((&last, outer)) = self.dimensions.split_last() else {
            return Err(invalid("component has no dimensions"));
        };
        let outer = outer.iter().try_fold(1u64, |acc, &d| acc.checked_mul(d));
        let len = match self.encoding {
            WeightEncoding::Dense(ref dtype) => {
                let size = dtype
                    .element_size()
                    .ok_or_else(|| invalid("a dense component needs a fixed-size dtype"))?;
                outer
                    .and_then(|o| o.checked_mul(last))
                    .and_then(|n| n.checked_mul(size))
            }
            WeightEncoding::BlockQuantized {
                values_per_block,
                bytes_per_block,
            } => {
                if values_per_block == 0 || bytes_per_block == 0 {
                    return Err(invalid("block sizes must not be zero"));
                }
                let blocks_per_row = last.div_ceil(values_per_block);
                outer
                    .and_then(|o| o.checked_mul(blocks_per_row))
                    .and_then(|n| n.checked_mul(bytes_per_block))
            }
        };
        len.ok_or_else(|| invalid("component size overflows"))
    }
}

/// One checkpoint tensor's part of a component.
#[derive(Debug, Clone)]
pub struct WeightSegment {
    /// The checkpoint tensor.
    pub tensor: String,
    /// Its bytes.
    pub bytes: Bytes,
}

impl WeightSegment {
    /// The bytes as retained host memory that outlives the source, when the backing allows
    /// (an mmap or shared buffer): pointer-identical to [`bytes`](Self::bytes).
    pub fn retained(&self) -> Option<RetainedHostMemoryRegion> {
        self.bytes.retain()
    }
}

/// A validated component.
#[derive(Debug, Clone)]
pub struct WeightComponentPayload {
    /// The component's id.
    pub id: String,
    /// All its bytes, in order: zero-copy for a single tensor, gathered for packed ones.
    pub bytes: Bytes,
}

impl WeightComponentPayload {
    /// The bytes as retained host memory, when zero-copy (see [`WeightSegment::retained`]).
    pub fn retained(&self) -> Option<RetainedHostMemoryRegion> {
        self.bytes.retain()
    }
}

/// A stored tensor: what a [`WeightSource`] knows about one checkpoint name.
#[derive(Debug, Clone)]
pub struct StoredTensor {
    /// Element type.
    pub dtype: DType,
    /// Dimensions.
    pub shape: Vec<u64>,
    /// Bytes.
    pub bytes: Bytes,
}

/// Where fetched tensors land: memory the consumer keeps as its tensors' own storage (a
/// framework's CPU tensor buffer, pinned host memory for an upload), so a tensor's bytes are
/// written once, by the read, instead of into a buffer of the source's and then copied.
///
/// # Contract
/// [`allocate`](Self::allocate) returns an allocation whose
/// [`memory_mut`](AllocationController::memory_mut) lends exactly `len` writable bytes; the
/// consumer takes it back from the tensor's [`Bytes`] with [`Bytes::into_allocation`].
pub trait TensorAllocator: Send + Sync + fmt::Debug {
    /// Memory for the `len` bytes of tensor `name`, of `dtype` and `shape`.
    ///
    /// # Errors
    /// [`ErrorKind::Unsupported`] for a dtype the consumer has no storage for; an allocation
    /// failure.
    fn allocate(
        &self,
        name: &str,
        dtype: &DType,
        shape: &[u64],
        len: usize,
    ) -> Result<Box<dyn AllocationController>>;
}

/// Where a runtime gets its weights.
///
/// # Contract
/// [`stored_tensor`](Self::stored_tensor) returns a checkpoint tensor by its external name, or `None`. The
/// provided methods do the validation, so every source checks the same things: the spec's
/// identity and shape, the tensors' presence and order, the element type, and the exact byte
/// length (block-grid aware).
pub trait WeightSource: Send + Sync {
    /// The checkpoint tensor `name`.
    ///
    /// # Errors
    /// The backing's errors.
    fn stored_tensor(&self, name: &str) -> Result<Option<StoredTensor>>;

    /// The checkpoint tensors `names`, in order, as [`stored_tensor`](Self::stored_tensor)
    /// gives them one by one (the default). A source that reads several at once overrides it:
    /// a [`Reader`] fetches them in one batched read ([`Source::fetch`](crate::Source::fetch)).
    ///
    /// # Errors
    /// The backing's errors.
    fn stored_tensors(&self, names: &[String]) -> Result<Vec<Option<StoredTensor>>> {
        names
            .iter()
            .map(|name| self.stored_tensor(name).map_err(|e| e.with_tensor(name)))
            .collect()
    }

    /// The checkpoint tensors `names`, in order, each in memory `allocator` gave for it. A
    /// [`Reader`] reads straight into those allocations ([`Source::fetch_into`]); the
    /// default reads as [`stored_tensors`](Self::stored_tensors) and copies, and a source
    /// already holding a tensor's bytes (a [`Prefetched`](crate::Prefetched) that fetched
    /// them) may hand them over where they are, so a consumer accepts any [`Bytes`].
    ///
    /// # Errors
    /// The allocator's errors, [`ErrorKind::InvalidInput`] for an allocation of another
    /// length or one that lends no writable memory; the backing's errors.
    ///
    /// [`Source::fetch_into`]: crate::Source::fetch_into
    fn stored_tensors_in(
        &self,
        names: &[String],
        allocator: &dyn TensorAllocator,
    ) -> Result<Vec<Option<StoredTensor>>> {
        let stored = self.stored_tensors(names)?;
        names
            .iter()
            .zip(stored)
            .map(|(name, stored)| {
                let Some(stored) = stored else {
                    return Ok(None);
                };
                let mut allocation = allocate(
                    allocator,
                    name,
                    &stored.dtype,
                    &stored.shape,
                    stored.bytes.len(),
                )?;
                let memory = writable(allocation.as_mut(), name, stored.bytes.len())?;
                stored
                    .bytes
                    .read_at(0, memory)
                    .map_err(|e| e.with_tensor(name))?;
                Ok(Some(StoredTensor {
                    bytes: Bytes::from_controller(allocation),
                    ..stored
                }))
            })
            .collect()
    }

    /// Whether the source holds checkpoint tensor `name`, without reading its bytes. The
    /// default asks [`stored_tensor`](Self::stored_tensor), which a lazy source answers
    /// without reading any.
    fn contains(&self, name: &str) -> bool {
        self.stored_tensor(name).is_ok_and(|t| t.is_some())
    }

    /// The checkpoint tensor `name` with bytes read as they are accessed, so that a consumer
    /// reading a large tensor in parts at once ([`Prefetched`](crate::Prefetched) landing in
    /// its consumer's memory) pays one read per part: [`Bytes::read_at`] on them reads that
    /// part from the backing, from several threads at once. The bytes are the whole tensor,
    /// as long as [`catalog`](Self::catalog) says. `None`, the default, where the source cannot
    /// put off the read: the tensor is then read whole.
    ///
    /// # Errors
    /// The backing's errors.
    fn lazy_tensor(&self, name: &str) -> Result<Option<StoredTensor>> {
        let _ = name;
        Ok(None)
    }

    /// Every checkpoint tensor's name and byte length, for a consumer that plans reads ahead
    /// ([`Prefetched`](crate::Prefetched) with
    /// [`PrefetchPlan::All`](crate::PrefetchPlan::All)). The default lists none.
    ///
    /// # Errors
    /// The backing's errors (a sharded set opens every shard's header).
    fn catalog(&self) -> Result<Vec<(String, u64)>> {
        Ok(Vec::new())
    }

    /// How many bytes a consumer gains from asking for at once
    /// ([`Source::fetch_ahead`](crate::Source::fetch_ahead)): 0, the default, where a tensor
    /// costs the same alone (memory, a map, a local file).
    fn fetch_ahead(&self) -> u64 {
        0
    }

    /// The component's bytes as ordered segments, one per checkpoint tensor, without copying
    /// them together. `None` when a tensor is missing and the component is not required.
    /// Segment boundaries are not part of the component's ABI: only their total is checked.
    ///
    /// # Errors
    /// [`ErrorKind::InvalidInput`] for a bad spec, [`ErrorKind::NotFound`] for a missing
    /// tensor of a required component, [`ErrorKind::Corrupt`] for a dtype or length that does
    /// not match; each names the component and the tensor.
    fn component_segments(&self, spec: &WeightComponentSpec) -> Result<Option<Vec<WeightSegment>>> {
        let in_component = |e: Error| e.context(format_args!("component `{}`", spec.id));
        if spec.id.is_empty() || spec.tensors.is_empty() {
            return Err(
                Error::invalid("a component needs an id and at least one tensor")
                    .with_tensor(&spec.id),
            );
        }
        let expected = spec.byte_len()?;
        let mut segments = Vec::with_capacity(spec.tensors.len());
        let mut total = 0u64;
        let all_stored = self.stored_tensors(&spec.tensors).map_err(in_component)?;
        for (name, stored) in spec.tensors.iter().zip(all_stored) {
            let Some(stored) = stored else {
                if spec.required {
                    return Err(Error::new(
                        ErrorKind::NotFound,
                        format!("component `{}` needs a missing tensor", spec.id),
                    )
                    .with_tensor(name));
                }
                return Ok(None);
            };
            let dtype_ok = match &spec.encoding {
                WeightEncoding::Dense(dtype) => stored.dtype == *dtype,
                // Packed blocks are raw bytes: stored as U8, I8 or a quantized dtype.
                WeightEncoding::BlockQuantized { .. } => {
                    matches!(stored.dtype, DType::U8 | DType::I8 | DType::QFloat(_))
                }
            };
            if !dtype_ok {
                return Err(Error::corrupt(format!(
                    "component `{}` expects {:?}, the tensor is {}",
                    spec.id, spec.encoding, stored.dtype
                ))
                .with_tensor(name));
            }
            if spec.tensors.len() == 1
                && matches!(spec.encoding, WeightEncoding::Dense(_))
                && stored.shape != spec.dimensions
            {
                return Err(Error::corrupt(format!(
                    "component `{}` has dimensions {:?}, the tensor {:?}",
                    spec.id, spec.dimensions, stored.shape
                ))
                .with_tensor(name));
            }
            total = total.saturating_add(stored.bytes.len() as u64);
            segments.push(WeightSegment {
                tensor: name.clone(),
                bytes: stored.bytes,
            });
        }
        if total != expected {
            return Err(Error::corrupt(format!(
                "component `{}` needs {expected} bytes, its tensors hold {total}",
                spec.id
            ))
            .with_tensor(&spec.id));
        }
        Ok(Some(segments))
    }

    /// The component's bytes in one piece: zero-copy for a single tensor, gathered into one
    /// aligned buffer for a packed one.
    ///
    /// # Errors
    /// As [`component_segments`](Self::component_segments), and the backing's read errors.
    fn component(&self, spec: &WeightComponentSpec) -> Result<Option<WeightComponentPayload>> {
        let Some(mut segments) = self.component_segments(spec)? else {
            return Ok(None);
        };
        let bytes = if segments.len() == 1 {
            segments.remove(0).bytes
        } else {
            let total: usize = segments.iter().map(|s| s.bytes.len()).sum();
            let mut gathered = Bytes::zeroed(total, 64)?;
            let out = gathered.make_mut()?;
            let mut at = 0;
            // `out` is exactly the segments' total length, so each `at..end` is in bounds.
            for segment in &segments {
                let end = at + segment.bytes.len();
                segment
                    .bytes
                    .read_at(0, &mut out[at..end])
                    .map_err(|e| e.with_tensor(&segment.tensor))?;
                at = end;
            }
            gathered
        };
        Ok(Some(WeightComponentPayload {
            id: spec.id.clone(),
            bytes,
        }))
    }
}

impl WeightSource for Reader {
    fn stored_tensor(&self, name: &str) -> Result<Option<StoredTensor>> {
        let Ok(info) = self.tensor(name) else {
            return Ok(None);
        };
        Ok(Some(StoredTensor {
            dtype: info.dtype().clone(),
            shape: info.shape().to_vec(),
            bytes: self.bytes(name)?,
        }))
    }

    fn contains(&self, name: &str) -> bool {
        self.tensor(name).is_ok()
    }

    /// On a source that gains from reading ahead ([`Source::fetch_ahead`](crate::Source::fetch_ahead)
    /// above 0, an object store), the tensor as a lazy range of the source, each
    /// [`Bytes::read_at`] one [`Source::read_at`](crate::Source::read_at); elsewhere `None`:
    /// a local tensor costs no more read whole.
    fn lazy_tensor(&self, name: &str) -> Result<Option<StoredTensor>> {
        let Ok(info) = self.tensor(name) else {
            return Ok(None);
        };
        if self.source().fetch_ahead() == 0 {
            return Ok(None);
        }
        let bytes = lazy_bytes(
            Arc::clone(self.source()),
            info.range(),
            AllocationProperty::Remote,
        )?;
        Ok(Some(StoredTensor {
            dtype: info.dtype().clone(),
            shape: info.shape().to_vec(),
            bytes,
        }))
    }

    fn catalog(&self) -> Result<Vec<(String, u64)>> {
        Ok(self
            .tensors()
            .iter()
            .map(|info| (info.name().to_owned(), info.byte_len()))
            .collect())
    }

    fn fetch_ahead(&self) -> u64 {
        self.source().fetch_ahead()
    }

    fn stored_tensors_in(
        &self,
        names: &[String],
        allocator: &dyn TensorAllocator,
    ) -> Result<Vec<Option<StoredTensor>>> {
        let infos: Vec<_> = names.iter().map(|name| self.tensor(name).ok()).collect();
        let mut allocations = infos
            .iter()
            .flatten()
            .map(|info| {
                let len = usize::try_from(info.byte_len()).map_err(|_| {
                    Error::new(ErrorKind::LimitExceeded, "a tensor does not fit in memory")
                        .with_tensor(info.name())
                })?;
                allocate(allocator, info.name(), info.dtype(), info.shape(), len)
            })
            .collect::<Result<Vec<_>>>()?;
        let mut targets = allocations
            .iter_mut()
            .zip(infos.iter().flatten())
            .map(|(allocation, info)| {
                let buf = writable(allocation.as_mut(), info.name(), info.byte_len() as usize)?;
                Ok((info.name(), buf))
            })
            .collect::<Result<Vec<_>>>()?;
        self.read_many_into(&mut targets)?;
        drop(targets);
        let mut allocations = allocations.into_iter();
        Ok(infos
            .into_iter()
            .map(|info| {
                let info = info?;
                let allocation = allocations.next()?;
                Some(StoredTensor {
                    dtype: info.dtype().clone(),
                    shape: info.shape().to_vec(),
                    bytes: Bytes::from_controller(allocation),
                })
            })
            .collect())
    }

    fn stored_tensors(&self, names: &[String]) -> Result<Vec<Option<StoredTensor>>> {
        let infos: Vec<_> = names.iter().map(|name| self.tensor(name).ok()).collect();
        let ranges: Vec<_> = infos.iter().flatten().map(|info| info.range()).collect();
        let mut fetched = self.source().fetch(&ranges)?.into_iter();
        infos
            .into_iter()
            .map(|info| {
                let Some(info) = info else {
                    return Ok(None);
                };
                let bytes = fetched.next().ok_or_else(|| {
                    Error::new(ErrorKind::Io, "a batched read returned too few ranges")
                })?;
                Ok(Some(StoredTensor {
                    dtype: info.dtype().clone(),
                    shape: info.shape().to_vec(),
                    bytes,
                }))
            })
            .collect()
    }
}

/// An allocation for tensor `name`, with the allocator's error naming it.
pub(crate) fn allocate(
    allocator: &dyn TensorAllocator,
    name: &str,
    dtype: &DType,
    shape: &[u64],
    len: usize,
) -> Result<Box<dyn AllocationController>> {
    allocator
        .allocate(name, dtype, shape, len)
        .map_err(|e| e.with_tensor(name))
}

/// The allocation's writable memory, checked to be `len` bytes ([`TensorAllocator`]'s
/// contract).
pub(crate) fn writable<'a>(
    allocation: &'a mut dyn AllocationController,
    name: &str,
    len: usize,
) -> Result<&'a mut [u8]> {
    let property = allocation.property();
    let memory = allocation.memory_mut().ok_or_else(|| {
        Error::invalid(format!(
            "the {property:?} allocation lends no writable host memory"
        ))
        .with_tensor(name)
    })?;
    if memory.len() != len {
        return Err(Error::invalid(format!(
            "a {}-byte allocation for a {len}-byte tensor",
            memory.len()
        ))
        .with_tensor(name));
    }
    Ok(memory)
}
