//! The validating [`Reader`]: opens a container over any [`Source`], checks every descriptor
//! before handing out a byte, and verifies the integrity trailer on request.

use std::collections::BTreeMap;
use std::ops::Range;
use std::sync::Arc;

use crate::background::Background;
use crate::batched_reads::read_at_parallel;
use crate::bytes::SharedBytes;
use crate::checksum;
use crate::dtype::Element;
use crate::format::{Format, Layout, burnpack, safetensors, trailer};
use crate::format::{ReadOptions, TensorInfo, Validation};
use crate::storage::{Source, Storage};
use crate::writer::WRITE_CHUNK_LEN;
use crate::{AllocationController, Bytes, DType, Error, ErrorKind, Result, Scalar, Tensor, Writer};

/// How much of a container `open` reads in its first request: enough for the header and the
/// metadata of typical containers, so an object store answers both with one GET.
pub const OPEN_PREFIX_LEN: u64 = 64 * 1024;

/// The shortest container any format allows: Burnpack's 10-byte header.
const MIN_CONTAINER_LEN: u64 = burnpack::HEADER_LEN;

/// What [`Reader::verify`] checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct VerifyReport {
    /// Tensors read.
    pub tensors: usize,
    /// Bytes read.
    pub bytes: u64,
    /// Whether checksums from an integrity trailer were compared (false: structure and
    /// padding only).
    pub checksummed: bool,
}

/// Every tensor of a container with its bytes, owned (what
/// [`Reader::load_all_in_background`] hands back).
pub type Loaded = Vec<(TensorInfo, Bytes)>;

/// A validated container over a [`Source`]. Cloning shares the source and copies the index.
#[derive(Debug, Clone)]
pub struct Reader {
    source: Arc<dyn Source>,
    /// Sorted by name.
    tensors: Vec<TensorInfo>,
    metadata: BTreeMap<String, String>,
    scalars: BTreeMap<String, Scalar>,
    data_start: u64,
    /// End of the metadata block.
    metadata_end: u64,
    /// Where the trailer starts, when the container has one.
    trailer_start: Option<u64>,
    validation: Validation,
    format: Format,
}

impl Reader {
    /// Opens and strictly validates the container in `source`.
    ///
    /// # Errors
    /// [`ErrorKind::Corrupt`] or [`ErrorKind::LimitExceeded`] naming what is wrong (and the
    /// tensor, where one is involved); the source's read errors.
    pub fn open(source: Arc<dyn Source>) -> Result<Self> {
        Self::open_with(source, ReadOptions::default())
    }

    /// Opens and strictly validates the container stored at `key`: the read side of
    /// [`Writer::write_to`].
    ///
    /// # Errors
    /// The storage's errors (such as [`crate::ErrorKind::NotFound`]), and
    /// those of [`open`](Self::open), naming the key.
    pub fn open_key<S: Storage + ?Sized>(storage: &S, key: &str) -> Result<Self> {
        storage
            .open(key)
            .and_then(Self::open)
            .map_err(|e| e.with_key(key))
    }

    /// [`open_key`](Self::open_key) on a thread of its own, for code that must not block:
    /// `.await` it in async code (no runtime thread waits on the storage) or
    /// [`wait`](Background::wait) for it.
    ///
    /// # Errors
    /// [`ErrorKind::Io`] when the thread cannot start; then, through the handle, as
    /// [`open_key`](Self::open_key).
    pub fn open_in_background<S: Storage + ?Sized + 'static>(
        storage: Arc<S>,
        key: impl Into<String>,
    ) -> Result<Background<Result<Self>>> {
        let key = key.into();
        Background::spawn("weightbay-open", move || Self::open_key(&*storage, &key))
    }

    /// Opens a container held in memory.
    ///
    /// # Errors
    /// As [`open`](Self::open).
    pub fn from_bytes(bytes: impl Into<SharedBytes>) -> Result<Self> {
        Self::open(Arc::new(crate::memory::MemorySource::new(bytes.into())))
    }

    /// Opens with explicit validation and limits.
    ///
    /// # Errors
    /// As [`open`](Self::open).
    pub fn open_with(source: Arc<dyn Source>, options: ReadOptions) -> Result<Self> {
        Self::parse(source, options).map_err(|e| e.with_operation("open"))
    }

    fn parse(source: Arc<dyn Source>, options: ReadOptions) -> Result<Self> {
        let len = source.len();
        if len < MIN_CONTAINER_LEN {
            return Err(Error::corrupt(format!(
                "container is {len} bytes, shorter than the {MIN_CONTAINER_LEN}-byte header"
            )));
        }
        let mut prefix = vec![0; len.min(OPEN_PREFIX_LEN) as usize];
        source.read_at(0, &mut prefix)?;
        let format = detect(&prefix).ok_or_else(|| {
            let magic = u32::from_le_bytes([prefix[0], prefix[1], prefix[2], prefix[3]]);
            Error::corrupt(format!(
                "not a container: tried Burnpack (magic is {magic:#010x}, not {:#010x}) and \
                 safetensors (no JSON header after the 8-byte length); a sharded set opens \
                 through its index (`*.index.json`)",
                burnpack::MAGIC
            ))
        })?;
        let layout = match format {
            Format::Burnpack => burnpack::parse(source.as_ref(), prefix, &options)?,
            Format::Safetensors => safetensors::parse(source.as_ref(), prefix, &options)?,
        };
        let Layout {
            tensors,
            metadata,
            scalars,
            data_start,
            metadata_end,
            trailer_start,
        } = layout;
        Ok(Self {
            source,
            tensors,
            metadata,
            scalars,
            data_start,
            metadata_end,
            trailer_start,
            validation: options.validation,
            format,
        })
    }

    /// The container's format.
    pub fn format(&self) -> Format {
        self.format
    }

    /// The tensors, sorted by name.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    /// One tensor's description.
    ///
    /// # Errors
    /// [`ErrorKind::NotFound`] naming the tensor.
    pub fn tensor(&self, name: &str) -> Result<&TensorInfo> {
        self.tensors
            .binary_search_by(|info| info.name.as_str().cmp(name))
            .map(|index| &self.tensors[index])
            .map_err(|_| Error::new(ErrorKind::NotFound, "no such tensor").with_tensor(name))
    }

    /// The metadata strings.
    pub fn metadata(&self) -> &BTreeMap<String, String> {
        &self.metadata
    }

    /// The scalars.
    pub fn scalars(&self) -> &BTreeMap<String, Scalar> {
        &self.scalars
    }

    /// Absolute offset of the data section.
    pub fn data_start(&self) -> u64 {
        self.data_start
    }

    /// Total length of the container.
    pub fn len(&self) -> u64 {
        self.source.len()
    }

    /// Whether the container is empty (never true for a valid one).
    pub fn is_empty(&self) -> bool {
        self.source.len() == 0
    }

    /// Whether the container carries an integrity trailer.
    pub fn has_trailer(&self) -> bool {
        self.trailer_start.is_some()
    }

    /// The source this reader reads from.
    pub fn source(&self) -> &Arc<dyn Source> {
        &self.source
    }

    /// A tensor's bytes, as the source's best [`Bytes`] (zero-copy view, lazy region, ...).
    ///
    /// # Errors
    /// [`ErrorKind::NotFound`]; the source's errors.
    pub fn bytes(&self, name: &str) -> Result<Bytes> {
        let info = self.tensor(name)?;
        self.source
            .bytes(info.range())
            .map_err(|e| e.with_tensor(name))
    }

    /// A tensor's bytes copied into a `Vec`.
    ///
    /// # Errors
    /// As [`bytes`](Self::bytes).
    pub fn read(&self, name: &str) -> Result<Vec<u8>> {
        self.bytes(name)?.to_vec().map_err(|e| e.with_tensor(name))
    }

    /// A tensor of plain numbers, decoded into a `Vec` of its element type. (`Flex32` tensors
    /// read as `f32`, the type they are stored as.)
    ///
    /// # Errors
    /// [`crate::ErrorKind::InvalidInput`] when the tensor's dtype is
    /// not `T`'s; as [`bytes`](Self::bytes).
    pub fn read_as<T: Element>(&self, name: &str) -> Result<Vec<T>> {
        let info = self.tensor(name)?;
        let stored_as = match info.dtype {
            DType::Flex32 => DType::F32,
            ref dtype => dtype.clone(),
        };
        if stored_as != T::DTYPE {
            return Err(
                Error::invalid(format!("the tensor is {}, not {}", info.dtype, T::DTYPE))
                    .with_tensor(name),
            );
        }
        let bytes = self.read(name)?;
        Ok(bytes.chunks_exact(T::SIZE).map(T::from_le).collect())
    }

    /// The tensors in data order (the order they were written), each with bytes from
    /// [`Source::bytes`].
    ///
    /// # Errors
    /// The source's errors.
    pub fn to_tensors(&self) -> Result<Vec<Tensor>> {
        self.data_order()
            .into_iter()
            .map(|info| {
                let bytes = self
                    .source
                    .bytes(info.range())
                    .map_err(|e| e.with_tensor(&info.name))?;
                let tensor = Tensor::new(&info.name, info.dtype.clone(), info.shape.clone(), bytes);
                Ok(match info.param_id {
                    Some(id) => tensor.with_param_id(id),
                    None => tensor,
                })
            })
            .collect()
    }

    /// The named tensors' bytes, in the order named, read together in one batched read that
    /// the source may coalesce and run in parallel ([`Source::fetch`]).
    ///
    /// # Errors
    /// [`ErrorKind::NotFound`] naming a missing tensor; the source's errors.
    pub fn load(&self, names: &[&str]) -> Result<Vec<Bytes>> {
        let ranges = names
            .iter()
            .map(|name| self.tensor(name).map(TensorInfo::range))
            .collect::<Result<Vec<_>>>()?;
        self.source
            .fetch(&ranges)
            .map_err(|e| e.with_operation("load"))
    }

    /// Every tensor with its bytes, in data order, read together ([`load`](Self::load)). The
    /// whole checkpoint is then in memory; [`to_writer`](Self::to_writer) streams instead.
    ///
    /// # Errors
    /// The source's errors.
    pub fn load_all(&self) -> Result<Vec<(&TensorInfo, Bytes)>> {
        let order = self.data_order();
        let ranges: Vec<Range<u64>> = order.iter().map(|info| info.range()).collect();
        let bytes = self
            .source
            .fetch(&ranges)
            .map_err(|e| e.with_operation("load"))?;
        Ok(order.into_iter().zip(bytes).collect())
    }

    /// [`load_all`](Self::load_all) on a thread of its own (see
    /// [`open_in_background`](Self::open_in_background)), each tensor's description beside its
    /// bytes.
    ///
    /// # Errors
    /// [`ErrorKind::Io`] when the thread cannot start; then, through the handle, as
    /// [`load_all`](Self::load_all).
    pub fn load_all_in_background(&self) -> Result<Background<Result<Loaded>>> {
        let reader = self.clone();
        Background::spawn("weightbay-load", move || {
            let loaded = reader.load_all()?;
            Ok(loaded
                .into_iter()
                .map(|(info, bytes)| (info.clone(), bytes))
                .collect())
        })
    }

    /// Reads a tensor into `buf`, memory the caller owns (a pinned staging buffer, an arena),
    /// which must be exactly the tensor's length: a file source reads straight into it.
    ///
    /// # Errors
    /// [`ErrorKind::InvalidInput`] for a buffer of another length; as [`bytes`](Self::bytes).
    pub fn read_into(&self, name: &str, buf: &mut [u8]) -> Result<()> {
        let range = self.target_range(name, buf)?;
        self.source
            .read_at(range.start, buf)
            .map_err(|e| e.with_tensor(name))
    }

    /// Reads a tensor into an allocation the caller's runtime made (pinned host memory a GPU
    /// runtime allocated for staging, an arena block), through its
    /// [`memory_mut`](AllocationController::memory_mut): as [`read_into`](Self::read_into),
    /// with no intermediate copy on file and object-store sources.
    ///
    /// # Errors
    /// [`ErrorKind::InvalidInput`] when the allocation lends no writable host memory (device
    /// memory: stage it through host memory) or has another length; as
    /// [`read_into`](Self::read_into).
    pub fn read_into_allocation(
        &self,
        name: &str,
        allocation: &mut dyn AllocationController,
    ) -> Result<()> {
        let property = allocation.property();
        let buf = allocation.memory_mut().ok_or_else(|| {
            Error::invalid(format!(
                "the {property:?} allocation lends no writable host memory"
            ))
            .with_tensor(name)
        })?;
        self.read_into(name, buf)
    }

    /// The range of tensor `name`, checked to fit `buf` exactly.
    fn target_range(&self, name: &str, buf: &[u8]) -> Result<Range<u64>> {
        let info = self.tensor(name)?;
        if buf.len() as u64 != info.byte_len() {
            return Err(Error::invalid(format!(
                "a {}-byte buffer for a {}-byte tensor",
                buf.len(),
                info.byte_len()
            ))
            .with_tensor(name));
        }
        Ok(info.range())
    }

    /// Reads many tensors into memory the caller owns, each buffer exactly its tensor's
    /// length, checking every name and length before reading anything. A source that reads
    /// ahead (an object store) fetches them straight into the buffers
    /// ([`Source::fetch_into`]) in batches of [`Source::fetch_ahead`] bytes; any other source
    /// reads them with `read_at`, the tensors shared out over a few threads.
    ///
    /// # Errors
    /// [`ErrorKind::NotFound`] or [`ErrorKind::InvalidInput`] naming the tensor, before any
    /// read; the source's errors.
    pub fn read_many_into(&self, targets: &mut [(&str, &mut [u8])]) -> Result<()> {
        let ranges = targets
            .iter()
            .map(|(name, buf)| self.target_range(name, buf))
            .collect::<Result<Vec<_>>>()?;
        let ahead = self.source.fetch_ahead();
        let mut jobs: Vec<(u64, &mut [u8])> = targets
            .iter_mut()
            .zip(&ranges)
            .map(|((_, buf), range)| (range.start, &mut **buf))
            .collect();
        let read = if ahead > 0 {
            let mut start = 0;
            let mut read = Ok(());
            while start < ranges.len() && read.is_ok() {
                let end = batch_end(&ranges, start, ahead);
                read = self
                    .source
                    .fetch_into(jobs.get_mut(start..end).unwrap_or_default());
                start = end;
            }
            read
        } else {
            read_at_parallel(self.source.as_ref(), &mut jobs)
        };
        read.map_err(|e| {
            // Name the tensor the failed read was for.
            let tensor = e.offset().and_then(|at| {
                ranges
                    .iter()
                    .zip(targets.iter())
                    .find(|(range, _)| range.contains(&at))
                    .map(|(_, (name, _))| (*name).to_owned())
            });
            match tensor {
                Some(name) => e.with_tensor(name),
                None => e,
            }
        })
    }

    /// A writer that re-encodes this container (same tensors in data order, metadata and
    /// scalars) and streams each tensor from the source when it is written, so copying a
    /// container between storages holds at most one write window in memory, plus, from a
    /// source that gains from reading ahead (an object store), [`Source::fetch_ahead`] bytes
    /// of tensors: the batch being written and the next one, fetched meanwhile.
    pub fn to_writer(&self) -> Writer {
        let order = self.data_order();
        let ahead = Arc::new(ReadAhead::new(
            Arc::clone(&self.source),
            order.iter().map(|info| info.range()).collect(),
        ));
        let tensors = order
            .into_iter()
            .enumerate()
            .map(|(index, info)| {
                let ahead = Arc::clone(&ahead);
                let tensor = Tensor::deferred(
                    &info.name,
                    info.dtype.clone(),
                    info.shape.clone(),
                    info.byte_len(),
                    move || ahead.take(index),
                );
                match info.param_id {
                    Some(id) => tensor.with_param_id(id),
                    None => tensor,
                }
            })
            .collect();
        let mut writer = Writer::new(tensors).with_format(self.format);
        for (key, value) in &self.metadata {
            writer = writer.with_metadata(key, value);
        }
        for (key, value) in &self.scalars {
            writer = writer.with_scalar(key, *value);
        }
        writer
    }

    /// Reads every byte: checks the zero padding and, when the container has a trailer,
    /// every checksum.
    ///
    /// # Errors
    /// [`ErrorKind::Corrupt`] naming the first tensor (or region) that differs; the source's
    /// errors.
    pub fn verify(&self) -> Result<VerifyReport> {
        self.verify_inner().map_err(|e| e.with_operation("verify"))
    }

    fn verify_inner(&self) -> Result<VerifyReport> {
        let stored = match self.trailer_start {
            Some(start) => {
                let mut trailer = vec![0; usize::try_from(self.len() - start).unwrap_or(0)];
                self.source.read_at(start, &mut trailer)?;
                Some(trailer::decode(&trailer))
            }
            None => None,
        };
        let window_len = usize::try_from(self.len())
            .unwrap_or(usize::MAX)
            .min(WRITE_CHUNK_LEN);
        let mut window = vec![0; window_len];
        let prefix_end = self.data_start.min(self.len());
        if self.validation == Validation::Strict {
            // The padding between the metadata and the data section must be zero.
            crc_of(
                self.source.as_ref(),
                self.metadata_end..prefix_end,
                &mut window,
                Some(Padding::AfterMetadata),
            )?;
        }
        let prefix_crc = crc_of(self.source.as_ref(), 0..prefix_end, &mut window, None)?;
        if let Some((stored_prefix, _)) = &stored
            && *stored_prefix != prefix_crc
        {
            return Err(Error::corrupt(format!(
                "header and metadata checksum is {prefix_crc:#010x}, the trailer says {stored_prefix:#010x}"
            )));
        }
        let check_padding = self.validation == Validation::Strict;
        let mut cursor = prefix_end;
        let mut bytes = prefix_end;
        let order = self.data_order();
        for (index, info) in order.iter().enumerate() {
            if check_padding && info.range.start > cursor {
                crc_of(
                    self.source.as_ref(),
                    cursor..info.range.start,
                    &mut window,
                    Some(Padding::Before(&info.name)),
                )?;
            }
            let crc = crc_of(self.source.as_ref(), info.range(), &mut window, None)
                .map_err(|e| e.with_tensor(&info.name))?;
            if let Some((_, crcs)) = &stored
                && crcs.get(index) != Some(&crc)
            {
                return Err(Error::corrupt(format!(
                    "checksum is {crc:#010x}, the trailer says {:#010x}",
                    crcs.get(index).copied().unwrap_or_default()
                ))
                .with_tensor(&info.name)
                .with_offset(info.range.start));
            }
            bytes += info.byte_len() + info.range.start.saturating_sub(cursor);
            cursor = cursor.max(info.range.end);
        }
        Ok(VerifyReport {
            tensors: order.len(),
            bytes,
            checksummed: stored.is_some(),
        })
    }

    fn data_order(&self) -> Vec<&TensorInfo> {
        let mut order: Vec<&TensorInfo> = self.tensors.iter().collect();
        order.sort_by_key(|info| (info.range.start, info.range.end));
        order
    }
}

/// Runs `attempt` again while it fails with [`ErrorKind::Changed`] (what it read was replaced
/// while it read it), up to `tries` times in all, telling `on_retry` each time: the opt-in policy
/// for one-shot work such as a copy or a verify, which should then start over on the new
/// version. Readers themselves never retry: a replaced object stays an error, never a mix.
///
/// ```
/// use weightbay::retry_on_change;
/// use weightbay::{Error, ErrorKind};
/// let mut calls = 0;
/// let result = retry_on_change(3, || {
///     calls += 1;
///     if calls < 3 { Err(Error::new(ErrorKind::Changed, "replaced")) } else { Ok(calls) }
/// }, |_, _| {});
/// assert_eq!(result?, 3);
/// # Ok::<(), weightbay::Error>(())
/// ```
///
/// # Errors
/// The last attempt's error.
pub fn retry_on_change<T>(
    tries: usize,
    mut attempt: impl FnMut() -> Result<T>,
    mut on_retry: impl FnMut(&Error, usize),
) -> Result<T> {
    let mut tried = 1;
    loop {
        match attempt() {
            Err(e) if e.kind() == ErrorKind::Changed && tried < tries => {
                tried += 1;
                on_retry(&e, tried);
            }
            outcome => return outcome,
        }
    }
}

/// Where a batch of `ranges` that starts at `start` ends: as many ranges as fit in `ahead`
/// bytes, and at least one.
fn batch_end(ranges: &[Range<u64>], start: usize, ahead: u64) -> usize {
    let mut end = start + 1;
    let mut len = ranges.get(start).map_or(0, |r| r.end - r.start);
    while let Some(next) = ranges.get(end) {
        len += next.end - next.start;
        if len > ahead {
            break;
        }
        end += 1;
    }
    end
}

/// Hands out the tensors of a copy in data order, fetching them in batches of up to half the
/// source's [`fetch_ahead`](Source::fetch_ahead) bytes (one tensor at a time where it is 0).
/// While the writer works through one batch, the next is fetched on a thread of its own, so
/// the copy takes about as long as the slower of reading and writing, not their sum, and holds
/// at most `fetch_ahead` bytes of tensors.
#[derive(Debug)]
struct ReadAhead {
    source: Arc<dyn Source>,
    ranges: Arc<[Range<u64>]>,
    batches: std::sync::Mutex<Batches>,
}

#[derive(Debug, Default)]
struct Batches {
    /// The index of the current batch's first range, and its bytes not taken yet.
    first: usize,
    held: Vec<Option<Bytes>>,
    /// The next batch, being fetched: its first index and the fetch.
    next: Option<(usize, Background<Result<Vec<Bytes>>>)>,
}

impl ReadAhead {
    fn new(source: Arc<dyn Source>, ranges: Vec<Range<u64>>) -> Self {
        Self {
            source,
            ranges: ranges.into(),
            batches: std::sync::Mutex::default(),
        }
    }

    /// Starts fetching the batch that begins at range `start` on a thread of its own.
    fn prefetch(
        &self,
        start: usize,
        batch_len: u64,
    ) -> Result<(usize, Background<Result<Vec<Bytes>>>)> {
        let (source, ranges) = (Arc::clone(&self.source), Arc::clone(&self.ranges));
        let end = batch_end(&ranges, start, batch_len);
        let fetch = Background::spawn("weightbay-read-ahead", move || {
            source.fetch(ranges.get(start..end).unwrap_or_default())
        })?;
        Ok((start, fetch))
    }

    /// The bytes of range `index`: from the current batch, or from the next one, which then
    /// becomes current while the one after it is fetched.
    fn take(&self, index: usize) -> Result<Bytes> {
        let ahead = self.source.fetch_ahead();
        if ahead == 0 {
            let range = self.ranges.get(index).cloned().unwrap_or(0..0);
            return self.source.bytes(range);
        }
        let batch_len = (ahead / 2).max(1);
        let mut batches = self
            .batches
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let batches = &mut *batches;
        if let Some(bytes) = index
            .checked_sub(batches.first)
            .and_then(|i| batches.held.get_mut(i))
            .and_then(Option::take)
        {
            return Ok(bytes);
        }
        // Drops the current batch first, so only the next one is held while it is awaited.
        batches.held.clear();
        let next = match batches.next.take() {
            Some((first, fetch)) if first == index => fetch,
            // Out of order (a writer never asks so): start over from here.
            _ => self.prefetch(index, batch_len)?.1,
        };
        let fetched = next.wait()?;
        let end = index + fetched.len();
        if end < self.ranges.len() {
            batches.next = Some(self.prefetch(end, batch_len)?);
        }
        let mut fetched = fetched.into_iter().map(Some).collect::<Vec<_>>();
        let bytes = fetched
            .first_mut()
            .and_then(Option::take)
            .ok_or_else(|| Error::new(ErrorKind::Io, "a batched read returned nothing"))?;
        batches.first = index;
        batches.held = fetched;
        Ok(bytes)
    }
}

/// The format whose opening bytes `prefix` has (at least 10 of them), or `None`.
fn detect(prefix: &[u8]) -> Option<Format> {
    if burnpack::looks_like(prefix) {
        Some(Format::Burnpack)
    } else if safetensors::looks_like(prefix) {
        Some(Format::Safetensors)
    } else {
        None
    }
}

/// Which padding a zero check covers, for the error message.
#[derive(Clone, Copy)]
enum Padding<'a> {
    AfterMetadata,
    Before(&'a str),
}

/// CRC32C of `range`, read in windows. With `padding` set, the range is padding and must be
/// all zeros.
fn crc_of(
    source: &dyn Source,
    range: Range<u64>,
    window: &mut [u8],
    padding: Option<Padding<'_>>,
) -> Result<u32> {
    let mut crc = 0;
    let mut offset = range.start;
    while offset < range.end {
        let step = (range.end - offset).min(window.len() as u64) as usize;
        let chunk = &mut window[..step];
        source.read_at(offset, chunk)?;
        if let Some(padding) = padding
            && let Some(at) = chunk.iter().position(|&b| b != 0)
        {
            let error = match padding {
                Padding::AfterMetadata => Error::corrupt("non-zero padding after the metadata"),
                Padding::Before(tensor) => {
                    Error::corrupt("non-zero padding before the tensor").with_tensor(tensor)
                }
            };
            return Err(error.with_offset(offset + at as u64));
        }
        crc = checksum::crc32c_append(crc, chunk);
        offset += step as u64;
    }
    Ok(crc)
}
