//! The container formats. This module holds what they share: the tensor layout a reader
//! validates and a writer plans, and the hardening limits. Each format's whole codec (detect,
//! parse and validate, plan and encode) lives in its own module: [`burnpack`] and
//! [`safetensors`]. docs/FORMAT.md specifies both byte by byte.
//!
//! A third format is one new module with the same three functions (`looks_like`, `parse`,
//! `plan`), a [`Format`] variant, and one match arm in each dispatcher: `Reader`'s detection
//! and open, and `Writer`'s plan. The format modules depend on this one, never the reverse,
//! and never on each other (`checks/tests/module_graph.rs` fails on any import cycle).

pub mod burnpack;
pub mod safetensors;
pub(crate) mod trailer;
pub(crate) mod types;

use std::collections::BTreeMap;

use crate::dtype::{ByteLen, DType, Scalar};
use crate::error::{Error, ErrorKind, Result};
use crate::storage::Source;
use crate::tensor::Tensor;
pub(crate) use types::{Format, Limits, ReadOptions, TensorInfo, Validation};
pub use types::{
    MAX_CBOR_DEPTH, MAX_INDEX_LEN, MAX_METADATA_LEN, MAX_TENSOR_COUNT, MAX_TENSOR_LEN,
    MAX_TENSOR_RANK,
};

/// One tensor's entry as a format's header stores it, before validation.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Descriptor {
    pub name: String,
    pub dtype: DType,
    pub shape: Vec<u64>,
    /// Start and end, relative to the data section.
    pub offsets: (u64, u64),
    pub param_id: Option<u64>,
}

/// A borrowed descriptor, for encoding without cloning names and shapes.
pub(crate) struct DescriptorRef<'a> {
    pub name: &'a str,
    pub dtype: &'a DType,
    pub shape: &'a [u64],
    pub offsets: (u64, u64),
    pub param_id: Option<u64>,
}

/// A parsed and validated container, as a format's `parse` returns it.
#[derive(Debug)]
pub(crate) struct Layout {
    /// Sorted by name.
    pub tensors: Vec<TensorInfo>,
    pub metadata: BTreeMap<String, String>,
    pub scalars: BTreeMap<String, Scalar>,
    /// Absolute offset of the data section.
    pub data_start: u64,
    /// End of the header and metadata.
    pub metadata_end: u64,
    /// Where the integrity trailer starts, when the container has one.
    pub trailer_start: Option<u64>,
}

/// What a writer puts in a container, as a format's `plan` takes it.
pub(crate) struct Contents<'a> {
    /// In writer order, each already checked against the limits, names unique.
    pub tensors: &'a [Tensor],
    pub metadata: &'a BTreeMap<String, String>,
    pub scalars: &'a BTreeMap<String, Scalar>,
    /// The caller's alignment, or `None` for the format's own.
    pub alignment: Option<u64>,
    /// Whether to append the integrity trailer (formats without one ignore it).
    pub trailer: bool,
}

/// The layout decided before any byte moves, as a format's `plan` returns it.
#[derive(Debug)]
pub(crate) struct Plan {
    /// Every byte before the data section: header, metadata, padding.
    pub head: Vec<u8>,
    pub data_start: u64,
    /// Each tensor's start relative to the data section, in writer order.
    pub starts: Vec<u64>,
    /// End of the last tensor, relative to the data section.
    pub data_len: u64,
    pub trailer_len: u64,
}

impl Plan {
    pub(crate) fn total_len(&self) -> u64 {
        self.data_start + self.data_len + self.trailer_len
    }
}

/// `value` rounded up to a multiple of `alignment` (a power of two); saturates near `u64::MAX`.
pub(crate) fn align_up(value: u64, alignment: u64) -> u64 {
    value.saturating_add(alignment - 1) & !(alignment - 1)
}

/// Checks a header block's claimed length (`what`: the metadata, the JSON header), which
/// starts at byte `start`, against the limit and the source's length, then reads whatever of it
/// the first read (`prefix`) did not hold. Returns where the block ends.
pub(crate) fn read_header_block(
    source: &dyn Source,
    prefix: &mut Vec<u8>,
    start: u64,
    claimed: u64,
    limits: &Limits,
    what: &str,
) -> Result<u64> {
    if claimed > limits.max_metadata_len {
        return Err(Error::new(
            ErrorKind::LimitExceeded,
            format!(
                "{what} claims {claimed} bytes, over the limit of {}",
                limits.max_metadata_len
            ),
        ));
    }
    let len = source.len();
    let end = start + claimed;
    if end > len {
        return Err(Error::corrupt(format!(
            "{what} claims {claimed} bytes but the container has only {len}"
        )));
    }
    // Bounded by the source's length and the limit, both checked above.
    let read = prefix.len() as u64;
    if end > read {
        prefix.resize(end as usize, 0);
        source.read_at(read, &mut prefix[read as usize..])?;
    }
    Ok(end)
}

/// Checks every descriptor against the container's length and the limits (and, when
/// `alignment` is given, that every tensor starts on it and none overlap), and returns the
/// tensors sorted by name.
pub(crate) fn validate(
    descriptors: Vec<Descriptor>,
    data_start: u64,
    len: u64,
    limits: &Limits,
    alignment: Option<u64>,
) -> Result<Vec<TensorInfo>> {
    let strict = alignment.is_some();
    let mut tensors = Vec::with_capacity(descriptors.len());
    for descriptor in descriptors {
        let info = check_descriptor(descriptor, data_start, len, limits, alignment)?;
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
    alignment: Option<u64>,
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
        ByteLen::Overflow => return fail(format!("{dtype} × {shape:?} overflows")),
        ByteLen::Exact(expected) if expected != byte_len => {
            return fail(format!(
                "declares {byte_len} bytes but {dtype} × {shape:?} needs {expected}"
            ));
        }
        ByteLen::Exact(_) | ByteLen::Unknown => {}
    }
    if let Some(alignment) = alignment
        && start % alignment != 0
    {
        return fail(format!(
            "starts at data offset {start}, not a multiple of {alignment}"
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
