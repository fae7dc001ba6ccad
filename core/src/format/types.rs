//! The format types users name, re-exported at the crate root: which format, how strictly a
//! container is read and within which limits, and what it says of each tensor.

use std::ops::Range;

use crate::dtype::DType;

/// Largest metadata block (or safetensors header) accepted or written (burn-pack's limit).
pub const MAX_METADATA_LEN: u64 = 100 * 1024 * 1024;
/// Most tensors in one container (burn-pack's limit).
pub const MAX_TENSOR_COUNT: usize = 100_000;
/// Largest single tensor (burn-pack's 64-bit limit).
pub const MAX_TENSOR_LEN: u64 = 10 * 1024 * 1024 * 1024;
/// Deepest CBOR nesting accepted in metadata (burn-pack's limit).
pub const MAX_CBOR_DEPTH: usize = 128;
/// Most dimensions in one tensor's shape.
pub const MAX_TENSOR_RANK: usize = 64;
/// Largest index of a sharded set (`model.safetensors.index.json`) read.
pub const MAX_INDEX_LEN: u64 = 16 * 1024 * 1024;

/// The container formats weightbay reads and writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum Format {
    /// Burnpack v1 (burn's `burn-pack`), with weightbay's optional integrity trailer.
    #[default]
    Burnpack,
    /// safetensors: a JSON header, then the tensors back to back.
    Safetensors,
}

impl Format {
    /// The file extension of this format's containers: `bpk` or `safetensors`.
    pub fn extension(self) -> &'static str {
        match self {
            Self::Burnpack => "bpk",
            Self::Safetensors => "safetensors",
        }
    }

    /// The format a file name's extension names: `.bpk` or `.safetensors`.
    pub fn from_file_name(name: &str) -> Option<Self> {
        match name.rsplit_once('.')?.1 {
            "bpk" | "burnpack" => Some(Self::Burnpack),
            "safetensors" => Some(Self::Safetensors),
            _ => None,
        }
    }
}

impl std::fmt::Display for Format {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Burnpack => "burnpack",
            Self::Safetensors => "safetensors",
        })
    }
}

/// The hardening limits a reader enforces and a writer respects. Every limit is checked
/// before anything sized by it is allocated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Limits {
    /// Largest metadata block, in bytes.
    pub max_metadata_len: u64,
    /// Most tensors.
    pub max_tensor_count: usize,
    /// Largest tensor, in bytes.
    pub max_tensor_len: u64,
    /// Deepest CBOR nesting.
    pub max_cbor_depth: usize,
    /// Most dimensions per shape.
    pub max_tensor_rank: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_metadata_len: MAX_METADATA_LEN,
            max_tensor_count: MAX_TENSOR_COUNT,
            max_tensor_len: MAX_TENSOR_LEN,
            max_cbor_depth: MAX_CBOR_DEPTH,
            max_tensor_rank: MAX_TENSOR_RANK,
        }
    }
}

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

/// Options for opening a container (`Reader::open_with`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct ReadOptions {
    /// Strict (default) or lenient.
    pub validation: Validation,
    /// Hardening limits.
    pub limits: Limits,
}

impl ReadOptions {
    /// Sets the validation.
    #[must_use]
    pub fn with_validation(mut self, validation: Validation) -> Self {
        self.validation = validation;
        self
    }

    /// Sets the limits.
    #[must_use]
    pub fn with_limits(mut self, limits: Limits) -> Self {
        self.limits = limits;
        self
    }

    pub(crate) fn strict(&self) -> bool {
        self.validation == Validation::Strict
    }
}

/// One tensor as the container describes it.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorInfo {
    pub(crate) name: String,
    pub(crate) dtype: DType,
    pub(crate) shape: Vec<u64>,
    pub(crate) param_id: Option<u64>,
    pub(crate) range: Range<u64>,
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
