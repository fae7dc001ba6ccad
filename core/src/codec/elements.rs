//! What a piece's elements are, which decides the planes it is split into.

use crate::DType;

/// How a piece's bytes are split into planes: by the width of its elements, and for floats
/// with each element's sign bit moved below its mantissa first, so that one plane holds the
/// whole exponent (the byte that repeats) and the others the sign and mantissa (near noise).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Elements {
    width: u8,
    float: bool,
}

impl Elements {
    /// Single bytes: one plane (fp8, u8, packed and quantized data, headers).
    pub const BYTES: Self = Self {
        width: 1,
        float: false,
    };

    /// The elements of a tensor of `dtype`: floats of 2, 4 and 8 bytes by width with their
    /// sign moved, integers by width, everything else as [`BYTES`](Self::BYTES).
    pub fn of(dtype: &DType) -> Self {
        let float = matches!(
            dtype,
            DType::F64 | DType::F32 | DType::Flex32 | DType::F16 | DType::BF16
        );
        match dtype.element_size() {
            Some(width @ (2 | 4 | 8)) => Self {
                width: width as u8,
                float,
            },
            _ => Self::BYTES,
        }
    }

    /// Bytes per element, and so the number of planes.
    pub fn width(self) -> usize {
        usize::from(self.width)
    }

    /// Whether each element is rotated left one bit before it is split (floats of 2 bytes or
    /// more).
    pub(super) fn rotated(self) -> bool {
        self.float && self.width > 1
    }
}
