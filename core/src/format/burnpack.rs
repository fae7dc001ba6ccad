//! The Burnpack v1 codec: a 10-byte header, CBOR metadata, zero padding, then the tensor data
//! with every tensor 256-byte aligned, and weightbay's optional integrity trailer after it.
//! Byte-compatible with burn's `burn-pack`: for the same input, the same bytes.

pub(crate) mod cbor;

use std::collections::BTreeMap;

use super::{
    Contents, DescriptorRef, Layout, Limits, Plan, ReadOptions, align_up, read_header_block,
    trailer, validate,
};
use crate::error::{Error, ErrorKind, Result};
use crate::storage::Source;

/// Magic number at offset 0, little endian (`4e 52 55 42`, "NRUB" on disk).
pub const MAGIC: u32 = 0x4255_524E;
/// The Burnpack format version written and read.
pub const VERSION: u16 = 1;
/// Length of the fixed header: magic (4), version (2), metadata length (4).
pub const HEADER_LEN: u64 = 10;
/// Alignment of the data section and of every tensor's offset within it.
pub const TENSOR_ALIGNMENT: u64 = 256;

/// Where the data section starts for a metadata block of `metadata_len` bytes.
pub fn data_section_start(metadata_len: u64) -> u64 {
    align_up(HEADER_LEN + metadata_len, TENSOR_ALIGNMENT)
}

/// Whether `prefix` starts with Burnpack's magic number.
pub(crate) fn looks_like(prefix: &[u8]) -> bool {
    prefix.get(..4) == Some(&MAGIC.to_le_bytes())
}

/// The 10-byte header for a metadata block of `metadata_len` bytes.
fn encode_header(metadata_len: u32) -> [u8; 10] {
    let mut header = [0u8; 10];
    header[..4].copy_from_slice(&MAGIC.to_le_bytes());
    header[4..6].copy_from_slice(&VERSION.to_le_bytes());
    header[6..].copy_from_slice(&metadata_len.to_le_bytes());
    header
}

/// Parses and validates the container in `source`, whose first bytes `prefix` holds (at least
/// [`HEADER_LEN`] of them).
pub(crate) fn parse(
    source: &dyn Source,
    mut prefix: Vec<u8>,
    options: &ReadOptions,
) -> Result<Layout> {
    let strict = options.strict();
    let limits = &options.limits;
    let len = source.len();
    let field = |range: std::ops::Range<usize>| prefix.get(range).unwrap_or_default().to_vec();
    let version = u16::from_le_bytes(field(4..6).try_into().unwrap_or_default());
    if version > VERSION || (strict && version != VERSION) {
        return Err(Error::new(
            ErrorKind::Unsupported,
            format!("Burnpack version {version} (this reader reads version {VERSION})"),
        ));
    }
    let metadata_len = u64::from(u32::from_le_bytes(
        field(6..10).try_into().unwrap_or_default(),
    ));
    let metadata_end = read_header_block(
        source,
        &mut prefix,
        HEADER_LEN,
        metadata_len,
        limits,
        "metadata",
    )?;
    let metadata = cbor::decode(
        &prefix[HEADER_LEN as usize..metadata_end as usize],
        limits,
        strict,
    )?;
    drop(prefix);

    let max_end = metadata
        .tensors
        .iter()
        .map(|d| d.offsets.1)
        .max()
        .unwrap_or(0);
    let mut data_start = data_section_start(metadata_len);
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
    let alignment = strict.then_some(TENSOR_ALIGNMENT);
    let tensors = validate(metadata.tensors, data_start, len, limits, alignment)?;
    let data_end = tensors
        .iter()
        .map(|t| t.range.end)
        .max()
        .unwrap_or(data_start)
        .min(len);
    let trailer_start = find_trailer(
        source,
        data_end.max(data_start.min(len)),
        len,
        tensors.len(),
        strict,
    )?;
    Ok(Layout {
        tensors,
        metadata: metadata.metadata,
        scalars: metadata.scalars,
        data_start,
        metadata_end,
        trailer_start,
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
    let footer = if tail >= trailer::FOOTER_LEN {
        let mut footer = [0u8; trailer::FOOTER_LEN as usize];
        source.read_at(len - trailer::FOOTER_LEN, &mut footer)?;
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

/// Plans the container: metadata encoded as burn-pack encodes it, each tensor at the next
/// multiple of the alignment, and the trailer's length when one is asked for.
pub(crate) fn plan(contents: &Contents<'_>, limits: &Limits) -> Result<Plan> {
    let alignment = contents.alignment.unwrap_or(TENSOR_ALIGNMENT);
    if !alignment.is_power_of_two() || alignment < TENSOR_ALIGNMENT {
        return Err(Error::invalid(format!(
            "alignment {alignment} is not a power of two of at least {TENSOR_ALIGNMENT}"
        )));
    }
    let mut by_name = BTreeMap::new();
    for (index, tensor) in contents.tensors.iter().enumerate() {
        if !tensor.dtype().in_burnpack() {
            let message = format!("{} has no Burnpack counterpart", tensor.dtype());
            return Err(Error::unsupported(message).with_tensor(tensor.name()));
        }
        by_name.insert(tensor.name(), index);
    }
    // Offsets are stored in the metadata, whose length decides where the data section
    // starts. At the default alignment the offsets do not depend on that start, so one
    // pass with minimal integers gives burn-pack's exact bytes. Above it they do, so the
    // offsets take a fixed width: the metadata length is then known before the offsets are.
    let fixed_width = alignment != TENSOR_ALIGNMENT;
    let encode = |starts: &[u64]| {
        let descriptors: Vec<DescriptorRef<'_>> = by_name
            .values()
            .map(|&index| {
                let tensor = &contents.tensors[index];
                DescriptorRef {
                    name: tensor.name(),
                    dtype: tensor.dtype(),
                    shape: tensor.shape(),
                    offsets: (starts[index], starts[index] + tensor.byte_len()),
                    param_id: tensor.param_id(),
                }
            })
            .collect();
        cbor::encode(
            &descriptors,
            contents.metadata,
            contents.scalars,
            fixed_width,
        )
    };
    let (mut starts, mut data_len) = place(contents, alignment, TENSOR_ALIGNMENT)?;
    let mut metadata = encode(&starts);
    let data_start = data_section_start(metadata.len() as u64);
    if fixed_width {
        (starts, data_len) = place(contents, alignment, data_start)?;
        metadata = encode(&starts);
    }
    if metadata.len() as u64 > limits.max_metadata_len {
        return Err(Error::new(
            ErrorKind::LimitExceeded,
            format!(
                "metadata of {} bytes is over the limit of {}",
                metadata.len(),
                limits.max_metadata_len
            ),
        ));
    }
    let trailer_len = if contents.trailer {
        trailer::trailer_len(contents.tensors.len())
    } else {
        0
    };
    let metadata_len = u32::try_from(metadata.len())
        .map_err(|_| Error::new(ErrorKind::LimitExceeded, "metadata longer than 4 GiB"))?;
    let mut head = Vec::with_capacity(usize::try_from(data_start).unwrap_or(0));
    head.extend_from_slice(&encode_header(metadata_len));
    head.extend_from_slice(&metadata);
    head.resize(usize::try_from(data_start).unwrap_or(0), 0);
    Ok(Plan {
        head,
        data_start,
        starts,
        data_len,
        trailer_len,
    })
}

/// Relative starts for every tensor given the data section's start, and the data length.
fn place(contents: &Contents<'_>, alignment: u64, data_start: u64) -> Result<(Vec<u64>, u64)> {
    let mut starts = Vec::with_capacity(contents.tensors.len());
    let mut end = 0u64;
    for tensor in contents.tensors {
        let start = align_up(data_start + end, alignment) - data_start;
        end = start
            .checked_add(tensor.byte_len())
            .ok_or_else(|| Error::new(ErrorKind::OutOfRange, "container larger than 2^64 bytes"))?;
        starts.push(start);
    }
    Ok((starts, end))
}
