//! The streaming [`Writer`]: plans the whole layout first, then streams header, metadata,
//! padding, each tensor and the trailer through a [`Sink`] in bounded chunks.

use std::collections::BTreeMap;
use std::ops::Range;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use crate::background::Background;
use crate::checksum;
use crate::dtype::ByteLen;
use crate::format::{Contents, Format, Limits, Plan, burnpack, safetensors, trailer};
use crate::options::{CreateOptions, Durability, WriteMode, check_deadline};
use crate::storage::{Sink, Storage};
use crate::{AccessPolicy, Bytes, Error, ErrorKind, Result, Scalar, Tensor};

/// Largest single write the writer hands a sink, and the size of its write buffer.
pub const WRITE_CHUNK_LEN: usize = 8 * 1024 * 1024;
/// Writes shorter than this are gathered in the write buffer, so many small tensors cost a
/// few large sink writes instead of two calls each.
const GATHER_BELOW: usize = 64 * 1024;

/// What [`Writer::write_to`] published.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct WriteSummary {
    /// Total bytes of the container.
    pub len: u64,
    /// Number of tensors.
    pub tensors: usize,
    /// Whether an integrity trailer was written.
    pub trailer: bool,
}

/// Builds one container from tensors, metadata and scalars.
///
/// ```
/// use weightbay::{DType, MemoryStorage, Reader, Storage, Tensor, Writer};
/// let storage = MemoryStorage::new();
/// let weight = Tensor::new("w", DType::F32, [2], [1.0f32, 2.0].map(f32::to_le_bytes).concat());
/// Writer::new(vec![weight])
///     .with_metadata("producer", "docs")
///     .with_scalar("epoch", 3u64)
///     .write_to(&storage, "model.bpk")?;
///
/// let reader = Reader::open(storage.open("model.bpk")?)?;
/// assert_eq!(reader.read("w")?, [1.0f32, 2.0].map(f32::to_le_bytes).concat());
/// reader.verify()?;
/// # Ok::<(), weightbay::Error>(())
/// ```
#[derive(Debug)]
pub struct Writer {
    tensors: Vec<Tensor>,
    metadata: BTreeMap<String, String>,
    scalars: BTreeMap<String, Scalar>,
    /// `None`: the format's own.
    alignment: Option<u64>,
    trailer: bool,
    mode: WriteMode,
    durability: Durability,
    format: Format,
    limits: Limits,
    cancel: Option<Arc<AtomicBool>>,
    deadline: Option<Instant>,
    /// The CRC32C of some tensors' bytes, by index, as the caller knows them.
    known_crcs: BTreeMap<usize, u32>,
}

impl Writer {
    /// A writer for `tensors`, stored in this order.
    pub fn new(tensors: Vec<Tensor>) -> Self {
        Self {
            tensors,
            metadata: BTreeMap::new(),
            scalars: BTreeMap::new(),
            alignment: None,
            trailer: true,
            mode: WriteMode::Overwrite,
            durability: Durability::Default,
            format: Format::Burnpack,
            limits: Limits::default(),
            cancel: None,
            deadline: None,
            known_crcs: BTreeMap::new(),
        }
    }

    /// Burnpack (the default) or safetensors. safetensors has no parameter ids (they are
    /// dropped), no gaps between tensors (see [`with_alignment`](Self::with_alignment)) and no
    /// trailer; scalars travel in its `__metadata__`
    /// (see [`SCALAR_METADATA_PREFIX`](safetensors::SCALAR_METADATA_PREFIX)); a dtype it
    /// cannot store fails naming the tensor.
    #[must_use]
    pub fn with_format(mut self, format: Format) -> Self {
        self.format = format;
        self
    }

    /// Adds a metadata string.
    #[must_use]
    pub fn with_metadata(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.metadata.insert(key.into(), value.into());
        self
    }

    /// Adds a scalar.
    #[must_use]
    pub fn with_scalar(mut self, key: impl Into<String>, value: impl Into<Scalar>) -> Self {
        self.scalars.insert(key.into(), value.into());
        self
    }

    /// Places every tensor at an absolute offset that is a multiple of `alignment` (a power
    /// of two, at least 256; 4096 suits direct I/O). Burnpack readers read the result as is.
    ///
    /// safetensors forbids gaps between tensors, so there only the data section starts on
    /// `alignment` (a power of two, at least 8; the header is padded with spaces, which the
    /// spec allows) and each tensor follows the last: a tensor starts aligned when the byte
    /// lengths of those before it are multiples of `alignment`, which the order of the tensors
    /// decides.
    #[must_use]
    pub fn with_alignment(mut self, alignment: u64) -> Self {
        self.alignment = Some(alignment);
        self
    }

    /// Whether to append the integrity trailer to a Burnpack container (on by default).
    /// Without it the bytes equal burn-pack's for the same input.
    #[must_use]
    pub fn with_trailer(mut self, trailer: bool) -> Self {
        self.trailer = trailer;
        self
    }

    /// Overwrite (default), create-new or in-place, for [`write_to`](Self::write_to).
    #[must_use]
    pub fn with_mode(mut self, mode: WriteMode) -> Self {
        self.mode = mode;
        self
    }

    /// The durability [`write_to`](Self::write_to) asks of the storage.
    #[must_use]
    pub fn with_durability(mut self, durability: Durability) -> Self {
        self.durability = durability;
        self
    }

    /// The hardening limits the container must respect (the defaults are burn-pack's), as a
    /// reader takes them in [`ReadOptions`](crate::ReadOptions).
    #[must_use]
    pub fn with_limits(mut self, limits: Limits) -> Self {
        self.limits = limits;
        self
    }

    /// Stops the write when `cancel` becomes true: checked before every write the sink gets
    /// and before the commit, so a cancelled write fails with [`ErrorKind::Interrupted`] and,
    /// like any failed write, leaves the key as it was.
    #[must_use]
    pub fn with_cancel(mut self, cancel: Arc<AtomicBool>) -> Self {
        self.cancel = Some(cancel);
        self
    }

    /// Gives the write up once `deadline` passes, failing with [`ErrorKind::TimedOut`] and,
    /// like any failed write, leaving the key as it was. Checked before every write the sink
    /// gets and before the commit, and handed to the storage
    /// ([`CreateOptions::deadline`]) so a backend waiting on a network (a stalled part, a
    /// store that throttles) gives up at that moment rather than at its next write.
    #[must_use]
    pub fn with_deadline(mut self, deadline: Instant) -> Self {
        self.deadline = Some(deadline);
        self
    }

    /// The format the container is written in.
    pub fn format(&self) -> Format {
        self.format
    }

    /// The durability asked of the storage.
    pub fn durability(&self) -> Durability {
        self.durability
    }

    /// The tensors it writes, in order.
    pub fn tensors(&self) -> &[Tensor] {
        &self.tensors
    }

    /// The metadata it writes.
    pub fn metadata(&self) -> &BTreeMap<String, String> {
        &self.metadata
    }

    /// The tensors, and a writer with the same settings and none (to write several containers
    /// alike, as [`ShardedWriter`](crate::sharded::ShardedWriter) does).
    pub(crate) fn into_parts(self) -> (Vec<Tensor>, Self) {
        let mut settings = self;
        let tensors = std::mem::take(&mut settings.tensors);
        (tensors, settings)
    }

    /// A writer with these settings and `tensors`.
    pub(crate) fn with_tensors(&self, tensors: Vec<Tensor>) -> Self {
        Self {
            tensors,
            metadata: self.metadata.clone(),
            scalars: self.scalars.clone(),
            alignment: self.alignment,
            trailer: self.trailer,
            mode: self.mode,
            durability: self.durability,
            format: self.format,
            limits: self.limits,
            cancel: self.cancel.clone(),
            deadline: self.deadline,
            // Indices are of these tensors, not of the ones the CRCs were known for.
            known_crcs: BTreeMap::new(),
        }
    }

    /// The CRC32C of the bytes of tensor `index` (in writer order), as the caller knows it
    /// already (from a commit record of the same bytes, say): the integrity trailer takes it
    /// instead of summing the bytes again. A wrong value makes a container whose
    /// [`Reader::verify`](crate::Reader::verify) fails; it cannot make wrong bytes.
    #[must_use]
    pub fn with_known_crc32c(mut self, index: usize, crc32c: u32) -> Self {
        self.known_crcs.insert(index, crc32c);
        self
    }

    /// The exact length of the container, computed without producing any tensor.
    ///
    /// # Errors
    /// As for planning: duplicate names, lengths that do not match dtype × shape, limits.
    pub fn size(&self) -> Result<u64> {
        Ok(self.plan()?.total_len())
    }

    /// Where each tensor's bytes will lie in the container, in writer order, computed without
    /// producing any tensor: what a caller that splits a container into pieces (content-hashed
    /// chunks, say) needs before the bytes move. The bytes between these ranges are the
    /// header, zero padding and, with a trailer, the trailer.
    ///
    /// # Errors
    /// As [`size`](Self::size).
    pub fn tensor_ranges(&self) -> Result<Vec<Range<u64>>> {
        let plan = self.plan()?;
        Ok(self
            .tensors
            .iter()
            .zip(&plan.starts)
            .map(|(tensor, &start)| {
                let start = plan.data_start + start;
                start..start + tensor.byte_len()
            })
            .collect())
    }

    /// Writes the container into the start of `buf` and returns its length.
    ///
    /// # Errors
    /// [`ErrorKind::InvalidInput`] when `buf` is too small; planning and provider errors.
    pub fn write_into(self, buf: &mut [u8]) -> Result<u64> {
        let plan = self.plan()?;
        let total = plan.total_len();
        if (buf.len() as u64) < total {
            return Err(Error::invalid(format!(
                "buffer of {} bytes is too small for a {total}-byte container",
                buf.len()
            )));
        }
        let mut sink = SliceSink { buf, position: 0 };
        self.stream(&plan, &mut sink)?;
        Ok(total)
    }

    /// The whole container in memory.
    ///
    /// # Errors
    /// Planning and provider errors.
    pub fn into_bytes(self) -> Result<Vec<u8>> {
        let plan = self.plan()?;
        let total = usize::try_from(plan.total_len())
            .map_err(|_| Error::new(ErrorKind::OutOfRange, "container does not fit in memory"))?;
        let mut buf = vec![0; total];
        let mut sink = SliceSink {
            buf: &mut buf,
            position: 0,
        };
        self.stream(&plan, &mut sink)?;
        Ok(buf)
    }

    /// Streams the container into `storage` at `key` and commits it. Nothing is created when
    /// planning fails; on any later failure the sink is dropped, which leaves the key exactly
    /// as it was.
    ///
    /// # Errors
    /// Planning errors, the storage's errors (named with key and operation), provider errors
    /// (named with the tensor).
    pub fn write_to<S: Storage + ?Sized>(self, storage: &S, key: &str) -> Result<WriteSummary> {
        let plan = self.plan().map_err(|e| e.with_key(key))?;
        let summary = WriteSummary {
            len: plan.total_len(),
            tensors: self.tensors.len(),
            trailer: plan.trailer_len > 0,
        };
        let mut options = CreateOptions::default()
            .with_mode(self.mode)
            .with_durability(self.durability)
            .with_expected_len(summary.len);
        options.deadline = self.deadline;
        let mut sink = storage
            .create(key, &options)
            .map_err(|e| e.with_operation("create").with_key(key))?;
        let (cancel, deadline) = (self.cancel.clone(), self.deadline);
        self.stream(&plan, sink.as_mut())
            .map_err(|e| e.with_operation("write").with_key(key))?;
        Stop {
            cancel: cancel.as_deref(),
            deadline,
        }
        .check("the commit")
        .map_err(|e| e.with_operation("commit").with_key(key))?;
        sink.commit()
            .map_err(|e| e.with_operation("commit").with_key(key))?;
        Ok(summary)
    }

    /// [`write_to`](Self::write_to) on a thread of its own, for code that must not block: a
    /// training loop goes on stepping and [`wait`](Background::wait)s later; async code
    /// `.await`s it and no runtime thread waits on the storage.
    ///
    /// # Errors
    /// [`ErrorKind::Io`] when the thread cannot start; then, through the handle, as
    /// [`write_to`](Self::write_to).
    pub fn write_in_background<S: Storage + ?Sized + 'static>(
        self,
        storage: Arc<S>,
        key: impl Into<String>,
    ) -> Result<Background<Result<WriteSummary>>> {
        let key = key.into();
        Background::spawn("weightbay-write", move || self.write_to(&*storage, &key))
    }

    /// Streams the container into an already opened sink, without committing it. Returns the
    /// number of bytes written.
    ///
    /// # Errors
    /// Planning, sink and provider errors.
    pub fn write_to_sink(self, sink: &mut dyn Sink) -> Result<u64> {
        let plan = self.plan()?;
        self.stream(&plan, sink)?;
        Ok(plan.total_len())
    }

    /// Checks what every format requires (limits, lengths, unique names), then lets the
    /// format lay the container out.
    fn plan(&self) -> Result<Plan> {
        let limits = self.limits;
        if self.tensors.len() > limits.max_tensor_count {
            return Err(Error::new(
                ErrorKind::LimitExceeded,
                format!(
                    "{} tensors, more than the limit of {}",
                    self.tensors.len(),
                    limits.max_tensor_count
                ),
            ));
        }
        let mut names = std::collections::BTreeSet::new();
        for tensor in &self.tensors {
            check_tensor(tensor, &limits).map_err(|e| e.with_tensor(tensor.name()))?;
            if !names.insert(tensor.name()) {
                return Err(Error::invalid("duplicate tensor name").with_tensor(tensor.name()));
            }
        }
        let contents = Contents {
            tensors: &self.tensors,
            metadata: &self.metadata,
            scalars: &self.scalars,
            alignment: self.alignment,
            trailer: self.trailer,
        };
        match self.format {
            Format::Burnpack => burnpack::plan(&contents, &limits),
            Format::Safetensors => safetensors::plan(&contents, &limits),
        }
    }

    fn stream(self, plan: &Plan, sink: &mut dyn Sink) -> Result<()> {
        let stop = Stop {
            cancel: self.cancel.as_deref(),
            deadline: self.deadline,
        };
        let mut out = Emitter::new(sink, plan.trailer_len > 0, stop);
        out.write(&plan.head)?;
        let prefix_crc = out.take_crc();

        let mut crcs = Vec::with_capacity(if plan.trailer_len > 0 {
            self.tensors.len()
        } else {
            0
        });
        let mut position = 0;
        for (index, (tensor, &start)) in self.tensors.iter().zip(&plan.starts).enumerate() {
            out.pad(start - position)?;
            let known = self.known_crcs.get(&index).copied();
            out.sum_next(known.is_none());
            write_tensor(&mut out, tensor).map_err(|e| e.with_tensor(tensor.name()))?;
            position = start + tensor.byte_len();
            let crc = out.take_crc();
            crcs.push(known.unwrap_or(crc));
        }
        out.sum_next(true);
        if plan.trailer_len > 0 {
            out.write(&trailer::encode(prefix_crc, &crcs)?)?;
        }
        out.flush()
    }
}

/// What ends a write early: the caller's cancel flag, and its deadline.
#[derive(Debug, Clone, Copy)]
struct Stop<'a> {
    cancel: Option<&'a AtomicBool>,
    deadline: Option<Instant>,
}

impl Stop<'_> {
    /// [`ErrorKind::Interrupted`] once the flag is set, [`ErrorKind::TimedOut`] (before
    /// `next`) once the deadline has passed.
    fn check(&self, next: &str) -> Result<()> {
        if self.cancel.is_some_and(|flag| flag.load(Ordering::SeqCst)) {
            return Err(Error::new(
                ErrorKind::Interrupted,
                "the write was cancelled",
            ));
        }
        check_deadline(self.deadline, next)
    }
}

fn check_tensor(tensor: &Tensor, limits: &Limits) -> Result<()> {
    if tensor.shape().len() > limits.max_tensor_rank {
        return Err(Error::new(
            ErrorKind::LimitExceeded,
            format!(
                "{} dimensions, more than the limit of {}",
                tensor.shape().len(),
                limits.max_tensor_rank
            ),
        ));
    }
    let len = tensor.byte_len();
    if len > limits.max_tensor_len {
        return Err(Error::new(
            ErrorKind::LimitExceeded,
            format!(
                "{len} bytes, more than the limit of {}",
                limits.max_tensor_len
            ),
        ));
    }
    match tensor.dtype().byte_len(tensor.shape()) {
        ByteLen::Overflow => Err(Error::invalid(format!(
            "shape {:?} overflows",
            tensor.shape()
        ))),
        ByteLen::Exact(expected) if expected != len => Err(Error::invalid(format!(
            "{len} bytes, but {} × {:?} needs {expected}",
            tensor.dtype(),
            tensor.shape()
        ))),
        ByteLen::Exact(_) | ByteLen::Unknown => Ok(()),
    }
}

/// Produces one tensor's bytes and streams them, checking the length against the plan. A
/// deferred tensor's bytes are dropped when this returns, before the next provider runs.
fn write_tensor(out: &mut Emitter<'_>, tensor: &Tensor) -> Result<()> {
    let bytes = catch_unwind(AssertUnwindSafe(|| tensor.bytes())).map_err(|panic| {
        let message = panic
            .downcast_ref::<&str>()
            .map(ToString::to_string)
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "a non-string payload".into());
        Error::new(ErrorKind::Provider, format!("provider panicked: {message}"))
    })??;
    if bytes.len() as u64 != tensor.byte_len() {
        return Err(Error::invalid(format!(
            "provider produced {} bytes, {} were planned",
            bytes.len(),
            tensor.byte_len()
        )));
    }
    write_bytes(out, &bytes)
}

fn write_bytes(out: &mut Emitter<'_>, bytes: &Bytes) -> Result<()> {
    match bytes.read(AccessPolicy::ZeroCopy) {
        Ok(resident) => out.write(resident),
        Err(e) if e.kind() == ErrorKind::WouldCopy => {
            // A lazy backing (file region, remote range, device memory): read it in bounded
            // windows instead of materializing it whole.
            let mut window = vec![0; bytes.len().min(WRITE_CHUNK_LEN)];
            let mut offset = 0;
            while offset < bytes.len() {
                let step = (bytes.len() - offset).min(window.len());
                bytes.read_at(offset, &mut window[..step])?;
                out.write(&window[..step])?;
                offset += step;
            }
            Ok(())
        }
        Err(e) => Err(e),
    }
}

/// Writes at least this long have their checksum computed on a second thread.
const CHECKSUM_IN_PARALLEL_FROM: usize = 1 << 20;

/// Gathers small writes, splits large ones into chunks, and keeps a running CRC32C when the
/// container gets a trailer.
struct Emitter<'a> {
    sink: &'a mut dyn Sink,
    stop: Stop<'a>,
    buffer: Vec<u8>,
    checksums: bool,
    /// Whether the bytes being written now are summed (see [`Emitter::sum_next`]).
    summing: bool,
    crc: u32,
}

impl<'a> Emitter<'a> {
    fn new(sink: &'a mut dyn Sink, checksums: bool, stop: Stop<'a>) -> Self {
        Self {
            sink,
            stop,
            // Grown on demand: a checkpoint of large tensors only ever buffers its header.
            buffer: Vec::new(),
            checksums,
            summing: true,
            crc: 0,
        }
    }

    fn take_crc(&mut self) -> u32 {
        std::mem::take(&mut self.crc)
    }

    /// Whether the bytes written next are summed (when the container has a trailer at all):
    /// not those of a tensor whose CRC32C the caller knows. Buffered bytes were summed when
    /// they were written, so switching never mixes two tensors' sums.
    fn sum_next(&mut self, sum: bool) {
        self.summing = sum;
    }

    fn write(&mut self, data: &[u8]) -> Result<()> {
        if data.len() < GATHER_BELOW {
            self.checksum(data);
            if self.buffer.len() + data.len() > WRITE_CHUNK_LEN {
                self.flush()?;
            }
            self.buffer.extend_from_slice(data);
            return Ok(());
        }
        self.flush()?;
        if !(self.checksums && self.summing) || data.len() < CHECKSUM_IN_PARALLEL_FROM {
            self.checksum(data);
            for chunk in data.chunks(WRITE_CHUNK_LEN) {
                self.stop.check("the next write")?;
                self.sink.write(chunk)?;
            }
            return Ok(());
        }
        // The checksum runs on a second core while the sink copies the bytes out, so the
        // trailer costs no time on top of the write.
        let (sink, stop) = (&mut self.sink, self.stop);
        let data_crc = std::thread::scope(|scope| {
            let checksum = scope.spawn(|| checksum::crc32c(data));
            for chunk in data.chunks(WRITE_CHUNK_LEN) {
                stop.check("the next write")?;
                sink.write(chunk)?;
            }
            // The checksum cannot panic; recomputing keeps this free of an unwrap all the same.
            Ok::<u32, Error>(checksum.join().unwrap_or_else(|_| checksum::crc32c(data)))
        })?;
        self.crc = checksum::crc32c_combine(self.crc, data_crc, data.len());
        Ok(())
    }

    fn checksum(&mut self, data: &[u8]) {
        if self.checksums && self.summing {
            self.crc = checksum::crc32c_append(self.crc, data);
        }
    }

    /// Zero padding between tensors; not part of any checksum.
    fn pad(&mut self, len: u64) -> Result<()> {
        if len < GATHER_BELOW as u64 && self.buffer.len() as u64 + len <= WRITE_CHUNK_LEN as u64 {
            self.buffer.resize(self.buffer.len() + len as usize, 0);
            return Ok(());
        }
        self.flush()?;
        self.stop.check("the next write")?;
        self.sink.pad(len)
    }

    fn flush(&mut self) -> Result<()> {
        if !self.buffer.is_empty() {
            self.stop.check("the next write")?;
            self.sink.write(&self.buffer)?;
            self.buffer.clear();
        }
        Ok(())
    }
}

/// A sink over a caller's buffer, for `write_into` and `into_bytes`.
struct SliceSink<'a> {
    buf: &'a mut [u8],
    position: usize,
}

impl Sink for SliceSink<'_> {
    fn write(&mut self, data: &[u8]) -> Result<()> {
        let end = self.position + data.len();
        let target = self
            .buf
            .get_mut(self.position..end)
            .ok_or_else(|| Error::new(ErrorKind::OutOfRange, "write past the end of the buffer"))?;
        target.copy_from_slice(data);
        self.position = end;
        Ok(())
    }

    fn pad(&mut self, len: u64) -> Result<()> {
        let end = usize::try_from(len)
            .ok()
            .and_then(|len| self.position.checked_add(len))
            .ok_or_else(|| {
                Error::new(ErrorKind::OutOfRange, "padding past the end of the buffer")
            })?;
        self.buf
            .get_mut(self.position..end)
            .ok_or_else(|| Error::new(ErrorKind::OutOfRange, "padding past the end of the buffer"))?
            .fill(0);
        self.position = end;
        Ok(())
    }

    fn commit(self: Box<Self>) -> Result<()> {
        Ok(())
    }
}
