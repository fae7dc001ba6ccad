//! The validating [`Reader`]: opens a container over any [`Source`], checks every descriptor
//! before handing out a byte, and verifies the integrity trailer on request.

use std::collections::BTreeMap;
use std::ops::Range;
use std::sync::Arc;

use crate::format::cbor::{self, Descriptor};
use crate::format::safetensors::{self, LEN_FIELD};
use crate::format::trailer::{self, FOOTER_LEN};
use crate::format::{
    self, Format, HEADER_LEN, Limits, MAGIC, SCALAR_METADATA_PREFIX, TENSOR_ALIGNMENT, VERSION,
};
use crate::storage::Source;
use crate::writer::WRITE_CHUNK_LEN;
use crate::{Bytes, DType, Error, ErrorKind, Result, Scalar, Tensor, Writer};

/// How much of a container `open` reads in its first request: enough for the header and the
/// metadata of typical containers, so an object store answers both with one GET.
pub const OPEN_PREFIX_LEN: u64 = 64 * 1024;

/// How strictly a container is validated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Validation {
    /// The default: version 1, 256-aligned and non-overlapping tensors, no duplicate keys,
    /// no extra bytes in the metadata block, nothing after the data but a valid trailer, and
    /// (checked by `verify`) zero padding. Like burn-pack, it ignores unknown fields and reads
    /// any well-formed CBOR encoding (non-minimal integers, indefinite lengths, a null
    /// `param_id`), so newer writers stay readable.
    #[default]
    Strict,
    /// Also older Burnpack files: version 0, burn 0.19's unaligned data section, the
    /// pre-0.21 `"Bool"` dtype spelling, unaligned or overlapping tensors, duplicate keys
    /// (the last wins), trailing bytes. Still bounded and panic-free.
    Lenient,
}

/// Options for [`Reader::open_with`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ReadOptions {
    /// Strict (default) or lenient.
    pub validation: Validation,
    /// Hardening limits.
    pub limits: Limits,
}

/// One tensor as the container describes it.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorInfo {
    name: String,
    dtype: DType,
    shape: Vec<u64>,
    param_id: Option<u64>,
    range: Range<u64>,
}

impl TensorInfo {
    /// The tensor's name.
    pub fn name(&self) -> &str {
        &self.name
    }
    /// The element type.
    pub fn dtype(&self) -> &DType {
        &self.dtype
    }
    /// The dimensions.
    pub fn shape(&self) -> &[u64] {
        &self.shape
    }
    /// The parameter id, if any.
    pub fn param_id(&self) -> Option<u64> {
        self.param_id
    }
    /// Absolute byte range within the container.
    pub fn range(&self) -> Range<u64> {
        self.range.clone()
    }
    /// Byte length.
    pub fn byte_len(&self) -> u64 {
        self.range.end - self.range.start
    }
}

/// What [`Reader::verify`] checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VerifyReport {
    /// Tensors read.
    pub tensors: usize,
    /// Bytes read.
    pub bytes: u64,
    /// Whether checksums from an integrity trailer were compared (false: structure and
    /// padding only).
    pub checksummed: bool,
}

/// A validated container over a [`Source`].
#[derive(Debug)]
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

    /// Opens a container held in memory.
    ///
    /// # Errors
    /// As [`open`](Self::open).
    pub fn from_bytes(bytes: impl Into<bytes::Bytes>) -> Result<Self> {
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
        let strict = options.validation == Validation::Strict;
        let limits = options.limits;
        let len = source.len();
        if len < HEADER_LEN {
            return Err(Error::corrupt(format!(
                "container is {len} bytes, shorter than the {HEADER_LEN}-byte header"
            )));
        }
        let mut prefix = vec![0; len.min(OPEN_PREFIX_LEN) as usize];
        source.read_at(0, &mut prefix)?;
        let magic = u32::from_le_bytes([prefix[0], prefix[1], prefix[2], prefix[3]]);
        if magic != MAGIC {
            if safetensors::looks_like(&prefix) {
                return Self::parse_safetensors(source, prefix, options);
            }
            return Err(Error::corrupt(format!(
                "magic is {magic:#010x}, not Burnpack's {MAGIC:#010x}, and this is not safetensors either"
            )));
        }
        let version = u16::from_le_bytes([prefix[4], prefix[5]]);
        if version > VERSION || (strict && version != VERSION) {
            return Err(Error::new(
                ErrorKind::Unsupported,
                format!("Burnpack version {version} (this reader reads version {VERSION})"),
            ));
        }
        let metadata_len = u64::from(u32::from_le_bytes([
            prefix[6], prefix[7], prefix[8], prefix[9],
        ]));
        if metadata_len > limits.max_metadata_len {
            return Err(Error::new(
                ErrorKind::LimitExceeded,
                format!(
                    "metadata claims {metadata_len} bytes, over the limit of {}",
                    limits.max_metadata_len
                ),
            ));
        }
        let metadata_end = HEADER_LEN + metadata_len;
        if metadata_end > len {
            return Err(Error::corrupt(format!(
                "metadata claims {metadata_len} bytes but the container has only {len}"
            )));
        }
        // Bounded by the source's length and the metadata limit, both checked above.
        extend_prefix(source.as_ref(), &mut prefix, metadata_end)?;
        let metadata = cbor::decode(
            &prefix[HEADER_LEN as usize..metadata_end as usize],
            &limits,
            strict,
        )?;
        drop(prefix);

        let max_end = metadata
            .tensors
            .iter()
            .map(|d| d.offsets.1)
            .max()
            .unwrap_or(0);
        let mut data_start = format::data_section_start(metadata_len);
        if !strict
            && data_start.saturating_add(max_end) > len
            && metadata_end.saturating_add(max_end) <= len
        {
            // burn 0.19 started the data section right after the metadata.
            data_start = metadata_end;
        }
        if strict && data_start > len {
            return Err(Error::corrupt(format!(
                "data section starts at byte {data_start} but the container has only {len}"
            )));
        }
        let tensors = validate(metadata.tensors, data_start, len, &limits, strict)?;
        let data_end = tensors
            .iter()
            .map(|t| t.range.end)
            .max()
            .unwrap_or(data_start)
            .min(len);
        let trailer_start = find_trailer(
            source.as_ref(),
            data_end.max(data_start.min(len)),
            len,
            tensors.len(),
            strict,
        )?;
        Ok(Self {
            source,
            tensors,
            metadata: metadata.metadata,
            scalars: metadata.scalars,
            data_start,
            metadata_end,
            trailer_start,
            validation: options.validation,
            format: Format::Burnpack,
        })
    }

    fn parse_safetensors(
        source: Arc<dyn Source>,
        mut prefix: Vec<u8>,
        options: ReadOptions,
    ) -> Result<Self> {
        let limits = options.limits;
        let len = source.len();
        let header_len = u64::from_le_bytes(prefix[..8].try_into().unwrap_or_default());
        if header_len > limits.max_metadata_len {
            return Err(Error::new(
                ErrorKind::LimitExceeded,
                format!(
                    "safetensors header claims {header_len} bytes, over the limit of {}",
                    limits.max_metadata_len
                ),
            ));
        }
        let data_start = LEN_FIELD + header_len;
        if data_start > len {
            return Err(Error::corrupt(format!(
                "safetensors header claims {header_len} bytes but the file has only {len}"
            )));
        }
        // Bounded by the source's length and the header limit, both checked above.
        extend_prefix(source.as_ref(), &mut prefix, data_start)?;
        let (descriptors, mut metadata) =
            safetensors::decode(&prefix[LEN_FIELD as usize..data_start as usize], &limits)?;
        drop(prefix);
        let scalars = take_scalars(&mut metadata)?;
        // Alignment and overlap rules are Burnpack's; safetensors has its own tiling rule.
        let tensors = validate(descriptors, data_start, len, &limits, false)?;
        safetensors::check_layout(&tensors, data_start, len)?;
        Ok(Self {
            source,
            tensors,
            metadata,
            scalars,
            data_start,
            metadata_end: data_start,
            trailer_start: None,
            validation: options.validation,
            format: Format::Safetensors,
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

    /// A writer that re-encodes this container (same tensors in data order, metadata and
    /// scalars) and streams each tensor from the source when it is written, so copying a
    /// container between storages holds at most one write window in memory.
    pub fn to_writer(&self) -> Writer {
        let tensors = self
            .data_order()
            .into_iter()
            .map(|info| {
                let source = Arc::clone(&self.source);
                let range = info.range();
                let tensor = Tensor::deferred(
                    &info.name,
                    info.dtype.clone(),
                    info.shape.clone(),
                    info.byte_len(),
                    move || source.bytes(range.clone()),
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
        crc = trailer::crc32c_append(crc, chunk);
        offset += step as u64;
    }
    Ok(crc)
}

/// Reads the rest of a header that did not fit in the first read, up to `end` (which the
/// caller has checked against the source's length and the limits).
fn extend_prefix(source: &dyn Source, prefix: &mut Vec<u8>, end: u64) -> Result<()> {
    let start = prefix.len() as u64;
    if end > start {
        prefix.resize(end as usize, 0);
        source.read_at(start, &mut prefix[start as usize..])?;
    }
    Ok(())
}

/// Moves the scalars that travel in safetensors metadata (see [`SCALAR_METADATA_PREFIX`])
/// out of it.
fn take_scalars(metadata: &mut BTreeMap<String, String>) -> Result<BTreeMap<String, Scalar>> {
    let keys: Vec<String> = metadata
        .keys()
        .filter(|k| k.starts_with(SCALAR_METADATA_PREFIX))
        .cloned()
        .collect();
    let mut scalars = BTreeMap::new();
    for key in keys {
        let value = metadata.remove(&key).unwrap_or_default();
        let parsed = match value.split_once(':') {
            Some(("Int", v)) => v.parse().ok().map(Scalar::Int),
            Some(("UInt", v)) => v.parse().ok().map(Scalar::UInt),
            Some(("Float", v)) => v.parse().ok().map(Scalar::Float),
            Some(("Bool", v)) => v.parse().ok().map(Scalar::Bool),
            _ => None,
        };
        let scalar = parsed.ok_or_else(|| {
            Error::corrupt(format!("metadata `{key}` is not a scalar: `{value}`"))
        })?;
        scalars.insert(key[SCALAR_METADATA_PREFIX.len()..].to_string(), scalar);
    }
    Ok(scalars)
}

/// Checks every descriptor and returns the tensors sorted by name.
fn validate(
    descriptors: Vec<Descriptor>,
    data_start: u64,
    len: u64,
    limits: &Limits,
    strict: bool,
) -> Result<Vec<TensorInfo>> {
    let mut tensors = Vec::with_capacity(descriptors.len());
    for descriptor in descriptors {
        let info = check_descriptor(descriptor, data_start, len, limits, strict)?;
        tensors.push(info);
    }
    // Stable: among duplicates, the last in map order ends up last.
    tensors.sort_by(|a, b| a.name.cmp(&b.name));
    let mut duplicate = None;
    tensors.dedup_by(|later, earlier| {
        let same = later.name == earlier.name;
        if same {
            duplicate.get_or_insert_with(|| later.name.clone());
            // Keep the later entry, as burn-pack's map decoding does.
            std::mem::swap(later, earlier);
        }
        same
    });
    if strict && let Some(name) = duplicate {
        return Err(Error::corrupt("duplicate tensor name in metadata").with_tensor(name));
    }
    if strict {
        let mut by_start: Vec<&TensorInfo> = tensors.iter().filter(|t| t.byte_len() > 0).collect();
        by_start.sort_by_key(|t| t.range.start);
        for pair in by_start.windows(2) {
            if pair[1].range.start < pair[0].range.end {
                return Err(
                    Error::corrupt(format!("overlaps tensor `{}`", pair[0].name))
                        .with_tensor(&pair[1].name)
                        .with_offset(pair[1].range.start),
                );
            }
        }
    }
    Ok(tensors)
}

fn check_descriptor(
    descriptor: Descriptor,
    data_start: u64,
    len: u64,
    limits: &Limits,
    strict: bool,
) -> Result<TensorInfo> {
    let Descriptor {
        name,
        dtype,
        shape,
        offsets: (start, end),
        param_id,
    } = descriptor;
    let fail = |message: String| Err(Error::corrupt(message).with_tensor(&name));
    if end < start {
        return fail(format!("data_offsets end {end} is before start {start}"));
    }
    let byte_len = end - start;
    if byte_len > limits.max_tensor_len {
        return Err(Error::new(
            ErrorKind::LimitExceeded,
            format!(
                "{byte_len} bytes, more than the limit of {}",
                limits.max_tensor_len
            ),
        )
        .with_tensor(&name));
    }
    match dtype.byte_len(&shape) {
        None => return fail(format!("{dtype} × {shape:?} overflows")),
        Some(Some(expected)) if expected != byte_len => {
            return fail(format!(
                "declares {byte_len} bytes but {dtype} × {shape:?} needs {expected}"
            ));
        }
        Some(_) => {}
    }
    if strict && start % TENSOR_ALIGNMENT != 0 {
        return fail(format!(
            "starts at data offset {start}, not a multiple of {TENSOR_ALIGNMENT}"
        ));
    }
    let range = match (data_start.checked_add(start), data_start.checked_add(end)) {
        (Some(abs_start), Some(abs_end)) if abs_end <= len => abs_start..abs_end,
        _ => {
            return fail(format!(
                "ends past the end of the container ({len} bytes): data_offsets [{start}, {end}] after byte {data_start}"
            ));
        }
    };
    Ok(TensorInfo {
        name,
        dtype,
        shape,
        param_id,
        range,
    })
}

/// Finds and checks the trailer in the `len - data_end` bytes after the data.
fn find_trailer(
    source: &dyn Source,
    data_end: u64,
    len: u64,
    tensor_count: usize,
    strict: bool,
) -> Result<Option<u64>> {
    let tail = len - data_end;
    if tail == 0 {
        return Ok(None);
    }
    let footer = if tail >= FOOTER_LEN {
        let mut footer = [0u8; FOOTER_LEN as usize];
        source.read_at(len - FOOTER_LEN, &mut footer)?;
        trailer::check_footer(&footer, tail, tensor_count)
    } else {
        Err(Error::corrupt(format!(
            "{tail} unexpected bytes after the last tensor"
        )))
    };
    match footer {
        Ok(()) => Ok(Some(data_end)),
        Err(e) if strict => Err(e.with_offset(data_end)),
        Err(_) => Ok(None),
    }
}
