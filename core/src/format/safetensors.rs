//! The safetensors codec: an 8-byte little-endian header length, a JSON header, then the
//! tensors back to back. docs/FORMAT.md describes the validation. Scalars, which safetensors
//! has no place for, travel in its `__metadata__` (see [`SCALAR_METADATA_PREFIX`]).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use serde::Deserialize;
use serde::de::{self, Deserializer, MapAccess, Visitor};
use serde_json::value::RawValue;

use super::{
    Contents, Descriptor, DescriptorRef, Layout, Limits, Plan, ReadOptions, TensorInfo,
    read_header_block, validate,
};
use crate::error::{Error, ErrorKind, Result};
use crate::storage::Source;
use crate::{DType, Scalar};

/// Length of the header-length field.
pub const LEN_FIELD: u64 = 8;
/// The data section starts on a multiple of this unless the writer asks for more, as the
/// safetensors crate's own writer pads it.
const HEADER_ALIGNMENT: u64 = 8;
/// Scalars travel in safetensors' `__metadata__` under this prefix, spelled as
/// [`Scalar`]'s `Display` spells them (`Int:-1`, `Float:0.001`), and come back as scalars when
/// read.
pub const SCALAR_METADATA_PREFIX: &str = "weightbay.scalar.";
/// The key of the free-form string map in the JSON header.
const METADATA_KEY: &str = "__metadata__";

/// Whether `prefix` starts like a safetensors file: a header length, then `{`.
pub(crate) fn looks_like(prefix: &[u8]) -> bool {
    prefix.len() > 8 && prefix[8] == b'{'
}

/// The JSON header's entries in file order, with duplicate keys detected and at most `max`
/// entries kept: the count is checked as they arrive, before more is allocated.
struct Entries(Vec<(String, Box<RawValue>)>);

/// Deserializes [`Entries`] with a cap on their number.
struct CappedEntries {
    max: usize,
}

impl<'de> de::DeserializeSeed<'de> for CappedEntries {
    type Value = Entries;

    fn deserialize<D: Deserializer<'de>>(
        self,
        deserializer: D,
    ) -> std::result::Result<Entries, D::Error> {
        struct EntriesVisitor {
            max: usize,
        }
        impl<'de> Visitor<'de> for EntriesVisitor {
            type Value = Entries;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(
                self,
                mut map: A,
            ) -> std::result::Result<Entries, A::Error> {
                let mut entries = Vec::new();
                let mut seen = BTreeSet::new();
                while let Some(key) = map.next_key::<String>()? {
                    if entries.len() == self.max {
                        return Err(de::Error::custom(format!(
                            "{LIMIT_MARK} more than {} entries",
                            self.max
                        )));
                    }
                    if !seen.insert(key.clone()) {
                        return Err(de::Error::custom(format!("duplicate key `{key}`")));
                    }
                    entries.push((key, map.next_value()?));
                }
                Ok(Entries(entries))
            }
        }
        deserializer.deserialize_map(EntriesVisitor { max: self.max })
    }
}

/// Marks a serde error raised by a limit, so it maps to `LimitExceeded`.
const LIMIT_MARK: &str = "limit:";

/// Parses a JSON object into at most `max` entries.
fn parse_entries(json: &str, max: usize, what: &str) -> Result<Entries> {
    let mut deserializer = serde_json::Deserializer::from_str(json);
    let entries = de::DeserializeSeed::deserialize(CappedEntries { max }, &mut deserializer)
        .and_then(|entries| deserializer.end().map(|()| entries));
    entries.map_err(|e| {
        let message = format!("{what}: {e}");
        if message.contains(LIMIT_MARK) {
            Error::new(
                ErrorKind::LimitExceeded,
                message.replace(LIMIT_MARK, "").replace("  ", " "),
            )
        } else {
            Error::corrupt(message)
        }
    })
}

#[derive(Deserialize)]
struct Entry {
    dtype: String,
    shape: Vec<u64>,
    data_offsets: [u64; 2],
}

/// Parses and validates the file in `source`, whose first bytes `prefix` holds (at least
/// [`LEN_FIELD`] + 1 of them).
pub(crate) fn parse(
    source: &dyn Source,
    mut prefix: Vec<u8>,
    options: &ReadOptions,
) -> Result<Layout> {
    let limits = &options.limits;
    let len = source.len();
    let len_field = prefix.get(..LEN_FIELD as usize).unwrap_or_default();
    let header_len = u64::from_le_bytes(len_field.try_into().unwrap_or_default());
    let data_start = read_header_block(
        source,
        &mut prefix,
        LEN_FIELD,
        header_len,
        limits,
        "safetensors header",
    )?;
    let (descriptors, mut metadata) =
        decode(&prefix[LEN_FIELD as usize..data_start as usize], limits)?;
    drop(prefix);
    let scalars = take_scalars(&mut metadata)?;
    // Alignment and overlap rules are Burnpack's; safetensors has its own tiling rule.
    let tensors = validate(descriptors, data_start, len, limits, None)?;
    check_layout(&tensors, data_start, len)?;
    Ok(Layout {
        tensors,
        metadata,
        scalars,
        data_start,
        metadata_end: data_start,
        trailer_start: None,
    })
}

/// Moves the scalars that travel in the metadata (see [`SCALAR_METADATA_PREFIX`]) out of it.
fn take_scalars(metadata: &mut BTreeMap<String, String>) -> Result<BTreeMap<String, Scalar>> {
    let keys: Vec<String> = metadata
        .keys()
        .filter(|k| k.starts_with(SCALAR_METADATA_PREFIX))
        .cloned()
        .collect();
    let mut scalars = BTreeMap::new();
    for key in keys {
        let value = metadata.remove(&key).unwrap_or_default();
        let scalar: Scalar = value.parse().map_err(|_: Error| {
            Error::corrupt(format!("metadata `{key}` is not a scalar: `{value}`"))
        })?;
        scalars.insert(key[SCALAR_METADATA_PREFIX.len()..].to_string(), scalar);
    }
    Ok(scalars)
}

/// Plans the file: the tensors back to back in writer order after the JSON header. The
/// format forbids gaps between tensors, so an alignment can only pad the header: the data
/// section starts on it, and a tensor does when the lengths before it add up to multiples.
pub(crate) fn plan(contents: &Contents<'_>, limits: &Limits) -> Result<Plan> {
    let alignment = contents.alignment.unwrap_or(HEADER_ALIGNMENT);
    if !alignment.is_power_of_two() || alignment < HEADER_ALIGNMENT {
        return Err(Error::invalid(format!(
            "alignment {alignment} is not a power of two of at least {HEADER_ALIGNMENT}"
        )));
    }
    let mut starts = Vec::with_capacity(contents.tensors.len());
    let mut end = 0u64;
    for tensor in contents.tensors {
        starts.push(end);
        end += tensor.byte_len();
    }
    let descriptors: Vec<DescriptorRef<'_>> = contents
        .tensors
        .iter()
        .zip(&starts)
        .map(|(tensor, &start)| DescriptorRef {
            name: tensor.name(),
            dtype: tensor.dtype(),
            shape: tensor.shape(),
            offsets: (start, start + tensor.byte_len()),
            param_id: None,
        })
        .collect();
    let mut metadata = contents.metadata.clone();
    for (name, scalar) in contents.scalars {
        metadata.insert(
            format!("{SCALAR_METADATA_PREFIX}{name}"),
            scalar.to_string(),
        );
    }
    let head = encode(&descriptors, &metadata, alignment)?;
    if head.len() as u64 > limits.max_metadata_len {
        let message = format!(
            "safetensors header of {} bytes is over the limit",
            head.len()
        );
        return Err(Error::new(ErrorKind::LimitExceeded, message));
    }
    Ok(Plan {
        data_start: head.len() as u64,
        head,
        starts,
        data_len: end,
        trailer_len: 0,
    })
}

/// Parses the JSON header (without its length field).
fn decode(header: &[u8], limits: &Limits) -> Result<(Vec<Descriptor>, BTreeMap<String, String>)> {
    if header.first() != Some(&b'{') {
        return Err(Error::corrupt("safetensors header does not start with `{`"));
    }
    let json = std::str::from_utf8(header)
        .map_err(|_| Error::corrupt("safetensors header is not UTF-8"))?;
    // The writer pads the header with spaces to a multiple of 8.
    // One entry more than the tensor limit leaves room for `__metadata__`.
    let Entries(entries) = parse_entries(
        json.trim_end_matches(' '),
        limits.max_tensor_count + 1,
        "safetensors header",
    )?;
    let mut metadata = BTreeMap::new();
    let mut tensors = Vec::new();
    for (name, raw) in entries {
        if name == METADATA_KEY {
            let Entries(pairs) = parse_entries(
                raw.get(),
                limits.max_tensor_count,
                "safetensors `__metadata__`",
            )?;
            for (key, value) in pairs {
                let value: String = serde_json::from_str(value.get()).map_err(|e| {
                    Error::corrupt(format!(
                        "safetensors `{METADATA_KEY}` value of `{key}`: {e}"
                    ))
                })?;
                metadata.insert(key, value);
            }
            continue;
        }
        if tensors.len() == limits.max_tensor_count {
            return Err(Error::new(
                ErrorKind::LimitExceeded,
                format!("more than {} tensors", limits.max_tensor_count),
            ));
        }
        let entry: Entry = serde_json::from_str(raw.get())
            .map_err(|e| Error::corrupt(format!("safetensors entry: {e}")).with_tensor(&name))?;
        if entry.shape.len() > limits.max_tensor_rank {
            return Err(Error::new(
                ErrorKind::LimitExceeded,
                format!(
                    "{} dimensions, more than the limit of {}",
                    entry.shape.len(),
                    limits.max_tensor_rank
                ),
            )
            .with_tensor(&name));
        }
        let dtype = DType::from_safetensors_name(&entry.dtype).ok_or_else(|| {
            Error::corrupt(format!("unknown safetensors dtype `{}`", entry.dtype))
                .with_tensor(&name)
        })?;
        let [start, end] = entry.data_offsets;
        tensors.push(Descriptor {
            name,
            dtype,
            shape: entry.shape,
            offsets: (start, end),
            param_id: None,
        });
    }
    Ok((tensors, metadata))
}

/// Checks the spec's layout rules: sorted by offset, the tensors tile the data section
/// exactly, from 0 to its end, with no gap or overlap. `tensors` are sorted by name.
fn check_layout(tensors: &[TensorInfo], data_start: u64, len: u64) -> Result<()> {
    let mut by_start: Vec<_> = tensors.iter().collect();
    by_start.sort_by_key(|t| (t.range().start, t.range().end));
    let mut cursor = data_start;
    for info in by_start {
        if info.range().start != cursor {
            return Err(Error::corrupt(format!(
                "safetensors data is not contiguous: tensor starts at byte {} where {cursor} was expected",
                info.range().start
            ))
            .with_tensor(info.name()));
        }
        cursor = info.range().end;
    }
    if cursor != len {
        return Err(Error::corrupt(format!(
            "safetensors data ends at byte {cursor}, the file at {len}"
        )));
    }
    Ok(())
}

/// Encodes the header: the length field, then the JSON padded with spaces (which the spec
/// allows after it) so that the data section starts on a multiple of `alignment`.
fn encode(
    tensors: &[DescriptorRef<'_>],
    metadata: &BTreeMap<String, String>,
    alignment: u64,
) -> Result<Vec<u8>> {
    let string = |s: &str| serde_json::to_string(s).unwrap_or_default();
    let mut json = String::from("{");
    let mut first = true;
    let mut separate = |json: &mut String| {
        if !std::mem::take(&mut first) {
            json.push(',');
        }
    };
    if !metadata.is_empty() {
        separate(&mut json);
        json += &format!(
            "{}:{}",
            string(METADATA_KEY),
            serde_json::to_string(metadata).unwrap_or_default()
        );
    }
    for tensor in tensors {
        let dtype = tensor.dtype.safetensors_name().ok_or_else(|| {
            Error::unsupported(format!("{} has no safetensors counterpart", tensor.dtype))
                .with_tensor(tensor.name)
        })?;
        separate(&mut json);
        let shape: Vec<String> = tensor.shape.iter().map(u64::to_string).collect();
        json += &format!(
            "{}:{{\"dtype\":\"{dtype}\",\"shape\":[{}],\"data_offsets\":[{},{}]}}",
            string(tensor.name),
            shape.join(","),
            tensor.offsets.0,
            tensor.offsets.1
        );
    }
    json.push('}');
    let padded = super::align_up(LEN_FIELD + json.len() as u64, alignment) - LEN_FIELD;
    json.extend(std::iter::repeat_n(' ', (padded as usize) - json.len()));
    let mut out = Vec::with_capacity(8 + json.len());
    out.extend_from_slice(&(json.len() as u64).to_le_bytes());
    out.extend_from_slice(json.as_bytes());
    Ok(out)
}
