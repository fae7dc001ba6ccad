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
    /// Wraps one complete CBOR data item (the value of the `QFloat` key).
    ///
    /// # Errors
    /// [`ErrorKind::Corrupt`](crate::ErrorKind::Corrupt) when `cbor` is not exactly one
    /// well-formed CBOR item.
    pub fn from_cbor(cbor: &[u8]) -> crate::Result<Self> {
        crate::format::cbor::check_single_item(cbor)?;
        Ok(Self { cbor: cbor.into() })
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
    F64,
    F32,
    /// Stored as `f32`.
    Flex32,
    F16,
    BF16,
    I64,
    I32,
    I16,
    I8,
    U64,
    U32,
    U16,
    U8,
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
    pub const FIXED: [DType; 16] = [
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

    /// The byte length a tensor of this dtype and `shape` must have: `None` when it
    /// overflows `u64`, `Some(None)` for QFloat (not derivable from the shape).
    pub fn byte_len(&self, shape: &[u64]) -> Option<Option<u64>> {
        let Some(size) = self.element_size() else {
            return Some(None);
        };
        // A zero dimension makes the product zero, however large the others are.
        if shape.contains(&0) {
            return Some(Some(0));
        }
        shape
            .iter()
            .try_fold(size, |acc, &dim| acc.checked_mul(dim))
            .map(Some)
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

/// A named scalar stored beside the tensors (an epoch, a learning rate, a flag).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Scalar {
    Int(i64),
    UInt(u64),
    Float(f64),
    Bool(bool),
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
