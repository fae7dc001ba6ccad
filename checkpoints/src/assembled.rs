//! Loading a multi-rank checkpoint with any rank layout: whole tensors, or any box of them,
//! assembled from the slices that overlap it, fetching only the bytes that hold it.

use std::collections::BTreeMap;
use std::ops::Range;
use std::sync::{Arc, Mutex, PoisonError};

use weightbay::{
    AccessPolicy, ByteLen, Bytes, DType, Element, Error, ErrorKind, Reader, Result, Storage,
    StoredTensor, WeightSource,
};

use crate::parallel;
use crate::record::{LogicalTensor, Region, SliceRecord};
use crate::region::{coalesce, runs};

/// The bytes fetched beyond what a load needs, at most, as a fraction of it: spent on the
/// smallest gaps between the byte runs it needs, each merge saving a request.
const GAP_ALLOWANCE: u64 = 10;

/// The tensors of a multi-rank checkpoint, whole or by [`Region`], whatever layout wrote
/// them: from [`Checkpoint::assembled`](super::Checkpoint::assembled).
///
/// A read gathers every run of bytes the asked-for boxes need from each container in one
/// batched [`Source::fetch`](weightbay::Source::fetch), merging runs across gaps only while the
/// bytes fetched stay within 10% of the bytes needed. A box that is exactly a stored slice
/// in memory already (a map) is handed out as the container's own bytes, without a copy.
#[derive(Debug)]
pub struct AssembledWeights {
    storage: Arc<dyn Storage>,
    dir: String,
    tensors: BTreeMap<String, LogicalTensor>,
    readers: Mutex<BTreeMap<String, Arc<Reader>>>,
}

/// One copy a read makes: `len` bytes at `at` of container `container`, to byte `to` of
/// output `out`.
struct Copy {
    out: usize,
    to: usize,
    at: u64,
    len: u64,
}

impl AssembledWeights {
    pub(crate) fn new(
        storage: Arc<dyn Storage>,
        dir: String,
        tensors: BTreeMap<String, LogicalTensor>,
    ) -> Self {
        Self {
            storage,
            dir,
            tensors,
            readers: Mutex::default(),
        }
    }

    /// The logical tensors' names, sorted.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.tensors.keys().map(String::as_str)
    }

    /// The logical tensor `name`: its dtype, global shape and slices.
    pub fn tensor(&self, name: &str) -> Option<&LogicalTensor> {
        self.tensors.get(name)
    }

    /// All of tensor `name`.
    ///
    /// # Errors
    /// As [`read_regions`](Self::read_regions).
    pub fn read(&self, name: &str) -> Result<Bytes> {
        let shape = &self.logical(name)?.shape;
        self.read_region(name, &Region::whole(shape))
    }

    /// All of tensor `name` as numbers of type `T`.
    ///
    /// # Errors
    /// [`ErrorKind::InvalidInput`] when `T` is not the tensor's dtype; as
    /// [`read_regions`](Self::read_regions).
    pub fn read_as<T: Element>(&self, name: &str) -> Result<Vec<T>> {
        let dtype = self.dtype(name)?;
        let stored_as = if dtype == DType::Flex32 {
            DType::F32
        } else {
            dtype.clone()
        };
        if stored_as != T::DTYPE {
            return Err(Error::invalid(format!(
                "tensor `{name}` holds {dtype}, not {}",
                T::DTYPE
            )));
        }
        let bytes = self.read(name)?;
        Ok(bytes
            .read(AccessPolicy::AllowCopy)?
            .chunks_exact(T::SIZE)
            .map(T::from_le)
            .collect())
    }

    /// The box `region` of tensor `name`, its elements row-major.
    ///
    /// # Errors
    /// As [`read_regions`](Self::read_regions).
    pub fn read_region(&self, name: &str, region: &Region) -> Result<Bytes> {
        let mut read = self.read_regions(&[(name, region.clone())])?;
        Ok(read.remove(0))
    }

    /// Each `(name, region)` asked for, in order: one batched fetch per container holding
    /// any of them, of only the byte runs they overlap.
    ///
    /// # Errors
    /// [`ErrorKind::NotFound`] for a name the checkpoint lacks; [`ErrorKind::InvalidInput`]
    /// for a region outside its tensor; [`ErrorKind::Corrupt`] when a container does not hold
    /// a slice as the commit record says; the storage's errors.
    pub fn read_regions(&self, wanted: &[(&str, Region)]) -> Result<Vec<Bytes>> {
        let mut out: Vec<Bytes> = Vec::with_capacity(wanted.len());
        let mut copies: BTreeMap<String, Vec<Copy>> = BTreeMap::new();
        for (index, (name, region)) in wanted.iter().enumerate() {
            let logical = self.logical(name)?;
            // Exactly a stored slice (the layout that wrote it) whose bytes are in memory
            // already (a map): the container's own bytes. Bytes still to fetch join the batch,
            // fetched now with the rest rather than one by one later.
            if let Some(slice) = logical.slices.iter().find(|s| s.region == *region) {
                let reader = self.reader(&slice.container)?;
                stored_slice(&reader, name, logical, slice)?;
                let bytes = reader.bytes(name)?;
                if bytes.read(AccessPolicy::ZeroCopy).is_ok() {
                    out.push(bytes);
                    continue;
                }
            }
            let (len, runs) = self.plan(name, region)?;
            let len = usize::try_from(len)
                .map_err(|_| Error::new(ErrorKind::OutOfRange, "region does not fit in memory"))?;
            out.push(Bytes::zeroed(len, 64)?);
            for (container, run) in runs {
                copies
                    .entry(container)
                    .or_default()
                    .push(Copy { out: index, ..run });
            }
        }
        for (container, copies) in copies {
            self.copy_from(&container, &copies, &mut out)?;
        }
        Ok(out)
    }

    /// Reads each box asked for, `(name, region, target)`, into `target` (its elements
    /// row-major, exactly as long as the box's bytes): the bytes land once, in memory the
    /// caller owns (a framework tensor's own storage), each container asked once with every
    /// run it holds ([`Source::fetch_into`](weightbay::Source::fetch_into), which an object
    /// store runs in parallel), the containers at once.
    ///
    /// # Errors
    /// [`ErrorKind::InvalidInput`] for a target of another length than its box; as
    /// [`read_regions`](Self::read_regions). Nothing is read unless every box is planned.
    pub fn read_regions_into(&self, wanted: &mut [(&str, Region, &mut [u8])]) -> Result<()> {
        let mut jobs: BTreeMap<String, Vec<(u64, &mut [u8])>> = BTreeMap::new();
        for (name, region, target) in wanted.iter_mut() {
            let (len, runs) = self.plan(name, region)?;
            if len != target.len() as u64 {
                return Err(Error::invalid(format!(
                    "tensor `{name}`: {region:?} holds {len} bytes, the target {}",
                    target.len()
                )));
            }
            // Carve the target into the runs' pieces, in order, so each is a buffer of its own.
            let mut rest: &mut [u8] = target;
            let mut at = 0usize;
            for (container, run) in runs {
                // `plan` keeps the runs apart and inside the region, which `len` is.
                let (_, tail) = std::mem::take(&mut rest).split_at_mut(run.to - at);
                let (piece, tail) = tail.split_at_mut(run.len as usize);
                rest = tail;
                at = run.to + run.len as usize;
                jobs.entry(container).or_default().push((run.at, piece));
            }
        }
        // Containers are asked at once: each is a round trip on an object store.
        let mut jobs: Vec<_> = jobs.into_iter().collect();
        parallel::each_mut(&mut jobs, |(container, jobs)| {
            self.reader(container)?
                .source()
                .fetch_into(jobs)
                .map_err(|e| e.with_key(format!("{}/{container}", self.dir)))
        })?;
        Ok(())
    }

    /// The length in bytes of the box `region` of tensor `name`, once the record has been
    /// checked against the stored slices as a read checks it ([`plan`](Self::plan)): a length
    /// safe to allocate a target of.
    pub(crate) fn checked_len(&self, name: &str, region: &Region) -> Result<u64> {
        self.plan(name, region).map(|(len, _)| len)
    }

    /// How to read the box `region` of tensor `name`: its length in bytes, and the runs that
    /// fill it (each with the container it is read from and `out` left 0). The record is read,
    /// not trusted: every overlapping slice must be stored with the record's dtype and shape,
    /// and together they must cover the region, before anything is allocated or copied.
    fn plan(&self, name: &str, region: &Region) -> Result<(u64, Vec<(String, Copy)>)> {
        let logical = self.logical(name)?;
        region
            .within(&logical.shape)
            .map_err(|e| Error::invalid(format!("reading tensor `{name}`")).with_source(e))?;
        let mut planned = Vec::new();
        let mut covered = 0u64;
        let mut element_size = 0;
        for slice in &logical.slices {
            let Some(shared) = slice.region.intersect(region) else {
                continue;
            };
            let reader = self.reader(&slice.container)?;
            let info = stored_slice(&reader, name, logical, slice)?;
            element_size = info.dtype().element_size().ok_or_else(|| {
                Error::invalid(format!(
                    "tensor `{name}` of {} cannot be sliced",
                    info.dtype()
                ))
            })?;
            covered = covered.saturating_add(shared.elements());
            let start = info.range().start;
            let size = element_size;
            // Within the stored slice's bytes, which its reader checked, and within the
            // region's, which `covered` bounds below.
            planned.extend(runs(&slice.region, region, &shared).into_iter().map(|run| {
                let copy = Copy {
                    out: 0,
                    to: (run.to * size) as usize,
                    at: start + run.from * size,
                    len: run.len * size,
                };
                (slice.container.clone(), copy)
            }));
        }
        if covered != region.elements() {
            return Err(Error::new(
                ErrorKind::Corrupt,
                format!(
                    "tensor `{name}`: the stored slices hold {covered} of the {} elements of {region:?}",
                    region.elements()
                ),
            )
            .with_key(&self.dir));
        }
        // Slices that overlap (a planted record) count some elements twice and leave others
        // unread: in order, each run must start where the last one ended.
        planned.sort_unstable_by_key(|(_, run)| run.to);
        let mut end = 0;
        for (_, run) in &planned {
            if run.to != end {
                return Err(Error::new(
                    ErrorKind::Corrupt,
                    format!("tensor `{name}`: the stored slices of {region:?} overlap"),
                )
                .with_key(&self.dir));
            }
            end = run.to + run.len as usize;
        }
        Ok((covered * element_size, planned))
    }

    /// Fetches the byte runs `copies` need from `container`, merged as [`GAP_ALLOWANCE`]
    /// allows, and copies each into its output.
    fn copy_from(&self, container: &str, copies: &[Copy], out: &mut [Bytes]) -> Result<()> {
        let mut runs: Vec<Range<u64>> = copies.iter().map(|c| c.at..c.at + c.len).collect();
        runs.sort_unstable_by_key(|r| r.start);
        // Regions asked for together may overlap: fetch each byte once.
        let mut needed: Vec<Range<u64>> = Vec::with_capacity(runs.len());
        for run in runs {
            match needed.last_mut() {
                Some(last) if run.start <= last.end => last.end = last.end.max(run.end),
                _ => needed.push(run),
            }
        }
        // Touching runs merge for free; the allowance buys merges across the smallest gaps.
        let needed_bytes: u64 = needed.iter().map(|r| r.end - r.start).sum();
        let ranges = coalesce(&needed, needed_bytes / GAP_ALLOWANCE);
        let reader = self.reader(container)?;
        let fetched = reader.source().fetch(&ranges)?;
        for copy in copies {
            // Every copy's run lies inside one merged range, and its target inside the output
            // sized for its region; only a backend whose fetch returned other lengths than
            // asked could miss, and that is its error, not a panic here.
            let i = ranges.partition_point(|r| r.end <= copy.at);
            let len = copy.len as usize;
            let source = ranges
                .get(i)
                .zip(fetched.get(i))
                .and_then(|(range, bytes)| {
                    let from = usize::try_from(copy.at.checked_sub(range.start)?).ok()?;
                    Some((from, bytes))
                });
            let short = || {
                Error::new(
                    ErrorKind::Io,
                    "a batched read returned other lengths than asked",
                )
                .with_key(container)
            };
            let (from, bytes) = source.ok_or_else(short)?;
            let data = bytes.read(AccessPolicy::AllowCopy)?;
            let piece = data.get(from..from + len).ok_or_else(short)?;
            let target = out
                .get_mut(copy.out)
                .ok_or_else(short)?
                .make_mut()?
                .get_mut(copy.to..copy.to + len)
                .ok_or_else(short)?;
            target.copy_from_slice(piece);
        }
        Ok(())
    }

    /// The dtype of tensor `name`, as its first slice's container stores it (the commit
    /// record's spelling of it is for people; this is what a read gives).
    ///
    /// # Errors
    /// [`ErrorKind::NotFound`] for a name the checkpoint lacks, or a container without it;
    /// the storage's errors.
    pub fn dtype(&self, name: &str) -> Result<DType> {
        let logical = self.logical(name)?;
        let first = logical.slices.first().ok_or_else(|| {
            Error::new(ErrorKind::Corrupt, format!("tensor `{name}` has no slices"))
        })?;
        let reader = self.reader(&first.container)?;
        Ok(reader
            .tensor(name)
            .map_err(|e| e.with_key(&first.container))?
            .dtype()
            .clone())
    }

    fn logical(&self, name: &str) -> Result<&LogicalTensor> {
        self.tensors.get(name).ok_or_else(|| {
            Error::new(
                ErrorKind::NotFound,
                format!("no tensor `{name}` in the checkpoint"),
            )
            .with_key(&self.dir)
        })
    }

    /// The reader of `container` (relative to the step), opened once.
    fn reader(&self, container: &str) -> Result<Arc<Reader>> {
        let mut readers = self.readers.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(reader) = readers.get(container) {
            return Ok(Arc::clone(reader));
        }
        let key = format!("{}/{container}", self.dir);
        let reader = Arc::new(Reader::open_key(self.storage.as_ref(), &key)?);
        readers.insert(container.to_owned(), Arc::clone(&reader));
        Ok(reader)
    }
}

/// The stored tensor `name` of `reader`, checked to be `slice` of `logical` as the commit
/// record says: the slice's lengths as its shape, the logical tensor's dtype.
fn stored_slice<'r>(
    reader: &'r Reader,
    name: &str,
    logical: &LogicalTensor,
    slice: &SliceRecord,
) -> Result<&'r weightbay::TensorInfo> {
    let info = reader
        .tensor(name)
        .map_err(|e| e.with_key(&slice.container))?;
    if info.shape() != slice.region.lengths || info.dtype().to_string() != logical.dtype {
        return Err(Error::new(
            ErrorKind::Corrupt,
            format!(
                "tensor `{name}` is stored as {} {:?}, the commit record says {} {:?}",
                info.dtype(),
                info.shape(),
                logical.dtype,
                slice.region.lengths
            ),
        )
        .with_key(&slice.container));
    }
    Ok(info)
}

impl WeightSource for AssembledWeights {
    fn stored_tensor(&self, name: &str) -> Result<Option<StoredTensor>> {
        let names = [name.to_owned()];
        Ok(self.stored_tensors(&names)?.pop().flatten())
    }

    fn contains(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
    }

    /// A tensor one rank saved whole, as its container's [`Reader`] gives it (a lazy range on
    /// an object store); a tensor assembled from slices is read whole.
    fn lazy_tensor(&self, name: &str) -> Result<Option<StoredTensor>> {
        let Some(logical) = self.tensors.get(name) else {
            return Ok(None);
        };
        let [slice] = logical.slices.as_slice() else {
            return Ok(None);
        };
        if slice.region != Region::whole(&logical.shape) {
            return Ok(None);
        }
        let reader = self.reader(&slice.container)?;
        stored_slice(&reader, name, logical, slice)?;
        reader.lazy_tensor(name)
    }

    /// Opens every container's header (each once) to learn the tensors' element types. A
    /// tensor whose length its shape does not give (a quantized one) is left out: it is read
    /// when asked for.
    fn catalog(&self) -> Result<Vec<(String, u64)>> {
        let mut catalog = Vec::with_capacity(self.tensors.len());
        for (name, logical) in &self.tensors {
            if let ByteLen::Exact(len) = self.dtype(name)?.byte_len(&logical.shape) {
                catalog.push((name.clone(), len));
            }
        }
        Ok(catalog)
    }

    /// The first container's: every container is on the same storage.
    fn fetch_ahead(&self) -> u64 {
        let first = self
            .tensors
            .values()
            .find_map(|logical| logical.slices.first());
        first
            .and_then(|slice| self.reader(&slice.container).ok())
            .map_or(0, |reader| reader.fetch_ahead())
    }

    fn stored_tensors(&self, names: &[String]) -> Result<Vec<Option<StoredTensor>>> {
        let wanted: Vec<(&str, Region)> = names
            .iter()
            .filter_map(|name| {
                let logical = self.tensors.get(name)?;
                Some((name.as_str(), Region::whole(&logical.shape)))
            })
            .collect();
        let mut read = self.read_regions(&wanted)?.into_iter();
        names
            .iter()
            .map(|name| {
                let Some(logical) = self.tensors.get(name) else {
                    return Ok(None);
                };
                let bytes = read
                    .next()
                    .ok_or_else(|| Error::new(ErrorKind::Io, "a batched read returned too few"))?;
                Ok(Some(StoredTensor {
                    dtype: self.dtype(name)?,
                    shape: logical.shape.clone(),
                    bytes,
                }))
            })
            .collect()
    }
}
