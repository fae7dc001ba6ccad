//! The Burnpack v1 container: header, CBOR metadata, aligned tensor data, and weightbay's
//! optional integrity trailer. docs/FORMAT.md specifies it byte by byte.

pub(crate) mod cbor;
pub(crate) mod safetensors;
pub(crate) mod trailer;

/// The container formats weightbay reads and writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Format {
    /// Burnpack v1 (burn's `burn-pack`), with weightbay's optional integrity trailer.
    #[default]
    Burnpack,
    /// safetensors: a JSON header, then the tensors back to back.
    Safetensors,
}

impl Format {
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

/// Scalars have no place in safetensors; they travel in its `__metadata__` under this prefix,
/// spelled `<Kind>:<value>` (`Int:-1`, `Float:0.001`), and come back as scalars when read.
pub const SCALAR_METADATA_PREFIX: &str = "weightbay.scalar.";

/// Magic number at offset 0, little endian (`4e 52 55 42`, "NRUB" on disk).
pub const MAGIC: u32 = 0x4255_524E;
/// The Burnpack format version written and read.
pub const VERSION: u16 = 1;
/// Length of the fixed header: magic (4), version (2), metadata length (4).
pub const HEADER_LEN: u64 = 10;
/// Alignment of the data section and of every tensor's offset within it.
pub const TENSOR_ALIGNMENT: u64 = 256;

/// Largest CBOR metadata block accepted or written (burn-pack's limit).
pub const MAX_METADATA_LEN: u64 = 100 * 1024 * 1024;
/// Most tensors in one container (burn-pack's limit).
pub const MAX_TENSOR_COUNT: usize = 100_000;
/// Largest single tensor (burn-pack's 64-bit limit).
pub const MAX_TENSOR_LEN: u64 = 10 * 1024 * 1024 * 1024;
/// Deepest CBOR nesting accepted in metadata (burn-pack's limit).
pub const MAX_CBOR_DEPTH: usize = 128;
/// Most dimensions in one tensor's shape.
pub const MAX_TENSOR_RANK: usize = 64;

/// The hardening limits a reader enforces and a writer respects. Every limit is checked
/// before anything sized by it is allocated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
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

/// Where the data section starts for a metadata block of `metadata_len` bytes.
pub fn data_section_start(metadata_len: u64) -> u64 {
    align_up(HEADER_LEN + metadata_len, TENSOR_ALIGNMENT)
}

/// `value` rounded up to a multiple of `alignment` (a power of two); saturates near `u64::MAX`.
pub(crate) fn align_up(value: u64, alignment: u64) -> u64 {
    value.saturating_add(alignment - 1) & !(alignment - 1)
}

/// The 10-byte header for a metadata block of `metadata_len` bytes.
pub(crate) fn encode_header(metadata_len: u32) -> [u8; 10] {
    let mut header = [0u8; 10];
    header[..4].copy_from_slice(&MAGIC.to_le_bytes());
    header[4..6].copy_from_slice(&VERSION.to_le_bytes());
    header[6..].copy_from_slice(&metadata_len.to_le_bytes());
    header
}
