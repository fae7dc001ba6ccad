//! The names burn and weightbay give the same things: dtypes, scalars, and a tensor as
//! burn-pack takes it. The store uses them, and so do the interop tests and the fuzzer that
//! compare weightbay's bytes with burn-pack's.

use weightbay::{BoolStore, DType, Error, Result, Scalar, Tensor};

/// weightbay's name for a burn dtype.
///
/// # Errors
/// [`ErrorKind::Unsupported`](weightbay::ErrorKind::Unsupported) for a burn dtype weightbay
/// does not store yet.
pub fn to_weightbay_dtype(dtype: &burn_std::DType) -> Result<DType> {
    use burn_std::DType as B;
    Ok(match dtype {
        B::F64 => DType::F64,
        B::F32 => DType::F32,
        B::Flex32 => DType::Flex32,
        B::F16 => DType::F16,
        B::BF16 => DType::BF16,
        B::I64 => DType::I64,
        B::I32 => DType::I32,
        B::I16 => DType::I16,
        B::I8 => DType::I8,
        B::U64 => DType::U64,
        B::U32 => DType::U32,
        B::U16 => DType::U16,
        B::U8 => DType::U8,
        B::Bool(burn_std::BoolStore::Native) => DType::Bool(BoolStore::Native),
        B::Bool(burn_std::BoolStore::U8) => DType::Bool(BoolStore::U8),
        B::Bool(burn_std::BoolStore::U32) => DType::Bool(BoolStore::U32),
        other => {
            return Err(Error::unsupported(format!(
                "weightbay-burn does not store {other:?} tensors yet"
            )));
        }
    })
}

/// burn's name for a weightbay dtype.
///
/// # Errors
/// [`ErrorKind::Unsupported`](weightbay::ErrorKind::Unsupported) for the dtypes burn does not
/// have (FP8, sub-byte); [`ErrorKind::Corrupt`](weightbay::ErrorKind::Corrupt) for a
/// quantization scheme that is not one of burn's.
pub fn to_burn_dtype(dtype: &DType) -> Result<burn_std::DType> {
    use burn_std::DType as B;
    Ok(match dtype {
        DType::F64 => B::F64,
        DType::F32 => B::F32,
        DType::Flex32 => B::Flex32,
        DType::F16 => B::F16,
        DType::BF16 => B::BF16,
        DType::I64 => B::I64,
        DType::I32 => B::I32,
        DType::I16 => B::I16,
        DType::I8 => B::I8,
        DType::U64 => B::U64,
        DType::U32 => B::U32,
        DType::U16 => B::U16,
        DType::U8 => B::U8,
        DType::Bool(BoolStore::Native) => B::Bool(burn_std::BoolStore::Native),
        DType::Bool(BoolStore::U8) => B::Bool(burn_std::BoolStore::U8),
        DType::Bool(BoolStore::U32) => B::Bool(burn_std::BoolStore::U32),
        DType::QFloat(scheme) => {
            B::QFloat(ciborium::from_reader(scheme.as_cbor()).map_err(|e| {
                Error::corrupt(format!("a quantization scheme burn cannot read: {e}"))
            })?)
        }
        other => {
            return Err(Error::unsupported(format!("burn has no {other} tensors")));
        }
    })
}

/// burn-pack's scalar for a weightbay scalar.
pub fn to_burn_scalar(scalar: Scalar) -> burn_pack::Scalar {
    match scalar {
        Scalar::Int(v) => burn_pack::Scalar::Int(v),
        Scalar::UInt(v) => burn_pack::Scalar::UInt(v),
        Scalar::Float(v) => burn_pack::Scalar::Float(v),
        Scalar::Bool(v) => burn_pack::Scalar::Bool(v),
    }
}

/// The same tensor as burn-pack takes it, its bytes copied.
///
/// # Errors
/// As [`to_burn_dtype`]; the tensor's provider's error for a deferred tensor.
pub fn to_burn_pack_tensor(tensor: &Tensor) -> Result<burn_pack::Tensor> {
    let dtype = to_burn_dtype(tensor.dtype()).map_err(|e| e.with_tensor(tensor.name()))?;
    Ok(burn_pack::Tensor::new(
        tensor.name().to_owned(),
        dtype,
        tensor
            .shape()
            .iter()
            .map(|&d| d as usize)
            .collect::<Vec<_>>(),
        tensor.param_id(),
        burn_pack::Bytes::from_bytes_vec(tensor.bytes()?.to_vec()?),
    ))
}
