//! Export's dtype conversion: a floating-point tensor's bytes as another float type,
//! converted as they are read, piece by piece, so a converted tensor streams through the
//! export like any other instead of being held whole.

use std::fmt;

use weightbay::{
    AccessPolicy, AllocationController, AllocationProperty, ByteLen, Bytes, DType, Error,
    ErrorKind, Result, Tensor,
};

use crate::whole_when_asked::WholeWhenAsked;

/// `tensor` under `name`, its bytes converted to `dtype` when both are floating point.
pub(crate) fn converted(tensor: Tensor, name: String, dtype: Option<&DType>) -> Result<Tensor> {
    let from = tensor.dtype().clone();
    let shape = tensor.shape().to_vec();
    let to = match dtype {
        Some(to) if is_float(&from) && *to != from => to.clone(),
        _ => {
            // Renamed only: the same bytes, read when the shard reaches them.
            let len = tensor.byte_len();
            return Ok(Tensor::deferred(name, from, shape, len, move || {
                tensor.bytes()
            }));
        }
    };
    if !is_float(&to) {
        return Err(Error::invalid(format!(
            "export converts floating-point tensors to F64, F32, F16 or BF16, not {to}"
        )));
    }
    let ByteLen::Exact(len) = to.byte_len(&shape) else {
        return Err(Error::new(ErrorKind::OutOfRange, "tensor too large").with_tensor(&name));
    };
    let label = name.clone();
    let out_len = usize::try_from(len).map_err(|_| {
        Error::new(ErrorKind::OutOfRange, "does not fit in memory").with_tensor(&name)
    })?;
    Ok(Tensor::deferred(name, to.clone(), shape, len, move || {
        let source = tensor.bytes().map_err(|e| e.with_tensor(&label))?;
        Ok(Bytes::from_controller(Box::new(Converted {
            source,
            from: from.clone(),
            to: to.clone(),
            len: out_len,
            whole: WholeWhenAsked::default(),
        })))
    }))
}

/// The bytes of `source` (of `from`) as elements of `to`, converted when read.
struct Converted {
    source: Bytes,
    from: DType,
    to: DType,
    len: usize,
    whole: WholeWhenAsked,
}

impl AllocationController for Converted {
    fn len(&self) -> usize {
        self.len
    }

    fn alignment(&self) -> usize {
        1
    }

    fn property(&self) -> AllocationProperty {
        self.source.property()
    }

    fn memory(&self, policy: AccessPolicy) -> Result<&[u8]> {
        self.whole.memory(
            policy,
            self.len,
            || format!("converted from {} when read", self.from),
            |whole| self.read_at(0, whole),
        )
    }

    fn read_at(&self, offset: usize, buf: &mut [u8]) -> Result<()> {
        let width = |dtype: &DType| dtype.element_size().unwrap_or(1) as usize;
        let (from, to) = (width(&self.from), width(&self.to));
        // The elements the range touches, read and converted whole.
        let (first, last) = (offset / to, (offset + buf.len()).div_ceil(to));
        let mut stored = vec![0; (last - first) * from];
        self.source.read_at(first * from, &mut stored)?;
        let converted = convert(&stored, &self.from, &self.to);
        let skip = offset - first * to;
        buf.copy_from_slice(&converted[skip..skip + buf.len()]);
        Ok(())
    }
}

impl fmt::Debug for Converted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Converted")
            .field("from", &self.from)
            .field("to", &self.to)
            .field("len", &self.len)
            .finish_non_exhaustive()
    }
}

pub(crate) fn is_float(dtype: &DType) -> bool {
    matches!(dtype, DType::F64 | DType::F32 | DType::F16 | DType::BF16)
}

/// Little-endian floats of `from` as floats of `to` (both of [`is_float`]) as torch casts
/// them: through f32, which holds every F16 and BF16 value exactly, rounding to nearest even
/// (an F64 narrowed to F16 or BF16 is rounded to f32 first, as torch's casts do).
fn convert(bytes: &[u8], from: &DType, to: &DType) -> Vec<u8> {
    let width = |dtype: &DType| dtype.element_size().unwrap_or(1) as usize;
    let mut out = Vec::with_capacity(bytes.len() / width(from) * width(to));
    for element in bytes.chunks_exact(width(from)) {
        let wide = match from {
            DType::F64 => f64::from_le_bytes(element.try_into().unwrap_or_default()),
            DType::F32 => f64::from(f32::from_le_bytes(element.try_into().unwrap_or_default())),
            DType::F16 => half::f16::from_le_bytes([element[0], element[1]]).to_f64(),
            _ => half::bf16::from_le_bytes([element[0], element[1]]).to_f64(),
        };
        // Exact for every source but F64, which `as` rounds to nearest even.
        let value = wide as f32;
        match to {
            DType::F64 => out.extend_from_slice(&wide.to_le_bytes()),
            DType::F32 => out.extend_from_slice(&value.to_le_bytes()),
            DType::F16 => out.extend_from_slice(&half::f16::from_f32(value).to_le_bytes()),
            _ => out.extend_from_slice(&half::bf16::from_f32(value).to_le_bytes()),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conversions_round_to_nearest_even_and_widen_exactly() {
        let bf16 = |x: f32| half::bf16::from_f32(x).to_le_bytes().to_vec();
        let values = [1.0f32, -2.5, 3.140625, 65504.0, 1e-3];
        let f32s: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        let narrowed = convert(&f32s, &DType::F32, &DType::BF16);
        let expected: Vec<u8> = values.iter().flat_map(|&v| bf16(v)).collect();
        assert_eq!(narrowed, expected);
        // bf16 → f32 → bf16 is the identity.
        let widened = convert(&narrowed, &DType::BF16, &DType::F32);
        assert_eq!(convert(&widened, &DType::F32, &DType::BF16), narrowed);
        let halves = convert(&f32s, &DType::F32, &DType::F16);
        assert_eq!(
            half::f16::from_le_bytes([halves[6], halves[7]]).to_f32(),
            65504.0
        );
    }
}
