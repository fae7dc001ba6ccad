//! weightbay's types as the real burn-pack crate spells them, for the interop tests
//! (core/tests/interop.rs) and the round-trip fuzzer (fuzz/src/lib.rs), which includes this
//! file by path.

use weightbay::{BoolStore, DType, Scalar, Tensor};

/// One tensor's parts, kept plain so both crates' tensors can be built from them.
#[derive(Debug, Clone)]
pub struct TensorParts {
    pub name: String,
    pub dtype: DType,
    pub shape: Vec<u64>,
    pub param_id: Option<u64>,
    pub data: Vec<u8>,
}

impl TensorParts {
    /// The tensor as weightbay takes it.
    pub fn ours(&self) -> Tensor {
        let tensor = Tensor::new(
            &self.name,
            self.dtype.clone(),
            self.shape.clone(),
            self.data.clone(),
        );
        match self.param_id {
            Some(id) => tensor.with_param_id(id),
            None => tensor,
        }
    }

    /// The same tensor as burn-pack takes it; `None` for a dtype burn-pack does not have.
    pub fn burn(&self) -> Option<burn_pack::Tensor> {
        Some(burn_pack::Tensor::new(
            self.name.clone(),
            to_burn_dtype(&self.dtype)?,
            self.shape.iter().map(|&d| d as usize).collect::<Vec<_>>(),
            self.param_id,
            burn_pack::Bytes::from_bytes_vec(self.data.clone()),
        ))
    }
}

/// The burn dtype for `dtype`; `None` for dtypes burn-pack does not have (the FP8 and
/// sub-byte ones).
pub fn to_burn_dtype(dtype: &DType) -> Option<burn_std::DType> {
    use burn_std::DType as B;
    Some(match dtype {
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
        DType::QFloat(_) => B::QFloat(burn_std::quantization::QuantScheme::default()),
        _ => return None,
    })
}

/// The burn-pack scalar for `scalar`.
pub fn to_burn_scalar(scalar: Scalar) -> burn_pack::Scalar {
    match scalar {
        Scalar::Int(v) => burn_pack::Scalar::Int(v),
        Scalar::UInt(v) => burn_pack::Scalar::UInt(v),
        Scalar::Float(v) => burn_pack::Scalar::Float(v),
        Scalar::Bool(v) => burn_pack::Scalar::Bool(v),
    }
}
