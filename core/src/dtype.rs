//! Element types and scalar values, as Burnpack spells them.

use std::fmt;

/// How a boolean tensor stores each element.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BoolStore {
    /// One byte per element, the backend's native bool.
    Native,
    /// One `u8` per element.
    U8,
    /// One `u32` per element.
    U32,
}

impl BoolStore {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::Native => "Native",
            Self::U8 => "U8",
            Self::U32 => "U32",
        }
    }
}

/// A quantization scheme, kept as the exact CBOR item the container held.
///
/// weightbay does not interpret quantized tensors: it stores the scheme opaquely so a container
/// read here can be written back byte for byte, and exempts QFloat tensors from the
/// shape × element-size length check (their byte length depends on the scheme's packing).
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct QuantScheme {
    cbor: Box<[u8]>,
}

impl QuantScheme {
    /// Wraps a CBOR item the caller has checked (`from_cbor`, in the Burnpack codec, checks).
    pub(crate) fn from_checked_cbor(cbor: &[u8]) -> Self {
        Self { cbor: cbor.into() }
    }

    /// The scheme's CBOR encoding, exactly as stored.
    pub fn as_cbor(&self) -> &[u8] {
        &self.cbor
    }
}

impl fmt::Debug for QuantScheme {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "QuantScheme({} CBOR bytes)", self.cbor.len())
    }
}

/// A tensor element type: every dtype `burn-pack` 0.23 writes.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum DType {
    /// 64-bit IEEE float.
    F64,
    /// 32-bit IEEE float.
    F32,
    /// Stored as `f32`.
    Flex32,
    /// 16-bit IEEE float.
    F16,
    /// bfloat16: 8 exponent and 7 mantissa bits.
    BF16,
    /// 64-bit signed integer.
    I64,
    /// 32-bit signed integer.
    I32,
    /// 16-bit signed integer.
    I16,
    /// 8-bit signed integer.
    I8,
    /// 64-bit unsigned integer.
    U64,
    /// 32-bit unsigned integer.
    U32,
    /// 16-bit unsigned integer.
    U16,
    /// 8-bit unsigned integer (also raw bytes).
    U8,
    /// Booleans, stored as the [`BoolStore`] says.
    Bool(BoolStore),
    /// A quantized float tensor; see [`QuantScheme`].
    QFloat(QuantScheme),
    /// 8-bit float, 4 exponent and 3 mantissa bits (safetensors `F8_E4M3`; no Burnpack
    /// spelling).
    F8E4M3,
    /// 8-bit float, 5 exponent and 2 mantissa bits (safetensors `F8_E5M2`; no Burnpack
    /// spelling).
    F8E5M2,
}

impl DType {
    /// The plain dtypes that have a fixed element size, in Burnpack's spelling order.
    pub const FIXED: &'static [DType] = &[
        DType::F64,
        DType::F32,
        DType::Flex32,
        DType::F16,
        DType::BF16,
        DType::I64,
        DType::I32,
        DType::I16,
        DType::I8,
        DType::U64,
        DType::U32,
        DType::U16,
        DType::U8,
        DType::Bool(BoolStore::Native),
        DType::Bool(BoolStore::U8),
        DType::Bool(BoolStore::U32),
    ];

    /// Bytes per element, or `None` for QFloat, whose size depends on its scheme.
    pub fn element_size(&self) -> Option<u64> {
        Some(match self {
            Self::F64 | Self::I64 | Self::U64 => 8,
            Self::F32 | Self::Flex32 | Self::I32 | Self::U32 | Self::Bool(BoolStore::U32) => 4,
            Self::F16 | Self::BF16 | Self::I16 | Self::U16 => 2,
            Self::I8 | Self::U8 | Self::F8E4M3 | Self::F8E5M2 => 1,
            Self::Bool(BoolStore::Native | BoolStore::U8) => 1,
            Self::QFloat(_) => return None,
        })
    }

    /// The byte length a tensor of this dtype and `shape` must have.
    pub fn byte_len(&self, shape: &[u64]) -> ByteLen {
        let Some(size) = self.element_size() else {
            return ByteLen::Unknown;
        };
        // A zero dimension makes the product zero, however large the others are.
        if shape.contains(&0) {
            return ByteLen::Exact(0);
        }
        shape
            .iter()
            .try_fold(size, |acc, &dim| acc.checked_mul(dim))
            .map_or(ByteLen::Overflow, ByteLen::Exact)
    }

    /// The Burnpack text spelling of a plain dtype (`"F32"`); `None` for Bool and QFloat,
    /// which are spelled as one-entry maps, and for the dtypes Burnpack cannot store.
    pub(crate) fn plain_name(&self) -> Option<&'static str> {
        Some(match self {
            Self::F64 => "F64",
            Self::F32 => "F32",
            Self::Flex32 => "Flex32",
            Self::F16 => "F16",
            Self::BF16 => "BF16",
            Self::I64 => "I64",
            Self::I32 => "I32",
            Self::I16 => "I16",
            Self::I8 => "I8",
            Self::U64 => "U64",
            Self::U32 => "U32",
            Self::U16 => "U16",
            Self::U8 => "U8",
            Self::Bool(_) | Self::QFloat(_) | Self::F8E4M3 | Self::F8E5M2 => return None,
        })
    }

    /// Whether a Burnpack container can store this dtype.
    pub fn in_burnpack(&self) -> bool {
        !matches!(self, Self::F8E4M3 | Self::F8E5M2)
    }

    /// The safetensors spelling (`"F32"`, `"BOOL"`, `"F8_E4M3"`), or `None` for dtypes
    /// safetensors cannot store (Flex32, Bool stored as U8 or U32, QFloat).
    pub fn safetensors_name(&self) -> Option<&'static str> {
        Some(match self {
            Self::Bool(BoolStore::Native) => "BOOL",
            Self::F8E4M3 => "F8_E4M3",
            Self::F8E5M2 => "F8_E5M2",
            Self::Flex32 | Self::Bool(_) | Self::QFloat(_) => return None,
            plain => return plain.plain_name(),
        })
    }

    /// The dtype a safetensors spelling names.
    pub fn from_safetensors_name(name: &str) -> Option<Self> {
        match name {
            "BOOL" => Some(Self::Bool(BoolStore::Native)),
            "F8_E4M3" => Some(Self::F8E4M3),
            "F8_E5M2" => Some(Self::F8E5M2),
            "Flex32" => None,
            other => Self::from_plain_name(other),
        }
    }

    pub(crate) fn from_plain_name(name: &str) -> Option<Self> {
        Self::FIXED[..13]
            .iter()
            .find(|dtype| dtype.plain_name() == Some(name))
            .cloned()
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Bool(store) => write!(f, "Bool({})", store.name()),
            Self::QFloat(_) => f.write_str("QFloat"),
            Self::F8E4M3 => f.write_str("F8_E4M3"),
            Self::F8E5M2 => f.write_str("F8_E5M2"),
            plain => f.write_str(plain.plain_name().unwrap_or("?")),
        }
    }
}

/// A plain number type: its [`DType`] and its little-endian encoding, so tensors of it are
/// built and read without byte juggling or `unsafe` in user code
/// ([`Tensor::from_slice`](crate::Tensor::from_slice),
/// [`Reader::read_as`](crate::Reader::read_as)). Implemented for `f32`, `f64`, `i8` to `i64`
/// and `u8` to `u64`; sealed.
pub trait Element: Copy + sealed::Sealed + Send + Sync + 'static {
    /// The dtype a tensor of this type has.
    const DTYPE: DType;
    /// Bytes per element.
    const SIZE: usize;
    /// Appends the element's little-endian bytes.
    fn put_le(self, out: &mut Vec<u8>);
    /// The element whose little-endian bytes `bytes` (exactly [`SIZE`](Self::SIZE) of them)
    /// holds.
    fn from_le(bytes: &[u8]) -> Self;
}

mod sealed {
    pub trait Sealed {}
}

macro_rules! element {
    ($($type:ty => $dtype:ident),*) => {
        $(
            impl sealed::Sealed for $type {}
            impl Element for $type {
                const DTYPE: DType = DType::$dtype;
                const SIZE: usize = size_of::<$type>();
                fn put_le(self, out: &mut Vec<u8>) {
                    out.extend_from_slice(&self.to_le_bytes());
                }
                fn from_le(bytes: &[u8]) -> Self {
                    // Callers pass exactly SIZE bytes; a short slice reads as zero-padded.
                    let mut le = [0u8; size_of::<$type>()];
                    let n = bytes.len().min(le.len());
                    le[..n].copy_from_slice(&bytes[..n]);
                    <$type>::from_le_bytes(le)
                }
            }
        )*
    };
}
element!(f32 => F32, f64 => F64, i8 => I8, i16 => I16, i32 => I32, i64 => I64,
         u8 => U8, u16 => U16, u32 => U32, u64 => U64);

/// The byte length [`DType::byte_len`] derives from a shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ByteLen {
    /// Exactly this many bytes.
    Exact(u64),
    /// Not derivable from the shape: a QFloat tensor's length depends on its scheme's packing.
    Unknown,
    /// The shape's element count times the element size does not fit in `u64`.
    Overflow,
}

/// A named scalar stored beside the tensors (an epoch, a learning rate, a flag).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Scalar {
    /// A signed integer.
    Int(i64),
    /// An unsigned integer.
    UInt(u64),
    /// A float.
    Float(f64),
    /// A flag.
    Bool(bool),
}

/// `Kind:value`, the spelling weightbay uses where a scalar must travel as text (safetensors
/// metadata, the command line): `Int:-1`, `UInt:7`, `Float:0.001`, `Bool:true`. A float keeps
/// every digit needed to read back the same value.
impl fmt::Display for Scalar {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Int(v) => write!(f, "Int:{v}"),
            Self::UInt(v) => write!(f, "UInt:{v}"),
            Self::Float(v) => write!(f, "Float:{v:?}"),
            Self::Bool(v) => write!(f, "Bool:{v}"),
        }
    }
}

/// Parses the [`Display`](fmt::Display) spelling back.
impl std::str::FromStr for Scalar {
    type Err = crate::Error;

    fn from_str(text: &str) -> crate::Result<Self> {
        let parsed = match text.split_once(':') {
            Some(("Int", v)) => v.parse().ok().map(Self::Int),
            Some(("UInt", v)) => v.parse().ok().map(Self::UInt),
            Some(("Float", v)) => v.parse().ok().map(Self::Float),
            Some(("Bool", v)) => v.parse().ok().map(Self::Bool),
            _ => None,
        };
        parsed.ok_or_else(|| {
            crate::Error::invalid(format!(
                "`{text}` is not a scalar (Int:-1, UInt:7, Float:0.5, Bool:true)"
            ))
        })
    }
}

macro_rules! scalar_from {
    ($variant:ident as $target:ty: $($source:ty),*) => {
        $(impl From<$source> for Scalar {
            fn from(value: $source) -> Self {
                Self::$variant(<$target>::from(value))
            }
        })*
    };
}
scalar_from!(Int as i64: i8, i16, i32, i64);
scalar_from!(UInt as u64: u8, u16, u32, u64);
scalar_from!(Float as f64: f32, f64);
scalar_from!(Bool as bool: bool);
