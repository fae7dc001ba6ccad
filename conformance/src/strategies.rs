//! Named, bounded proptest strategies for containers.

use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;
use weightbay::{Bytes, DType, QuantScheme, Scalar, Tensor, Writer};

/// A container described by plain values, so it can be written any number of times.
#[derive(Debug, Clone)]
pub struct ContainerSpec {
    /// Tensors in write order.
    pub tensors: Vec<TensorSpec>,
    /// Metadata strings.
    pub metadata: BTreeMap<String, String>,
    /// Scalars.
    pub scalars: BTreeMap<String, Scalar>,
    /// Tensor alignment (256, 512 or 4096).
    pub alignment: u64,
    /// Whether to append the integrity trailer.
    pub trailer: bool,
}

/// One tensor of a [`ContainerSpec`].
#[derive(Debug, Clone)]
pub struct TensorSpec {
    /// Name.
    pub name: String,
    /// Element type.
    pub dtype: DType,
    /// Dimensions.
    pub shape: Vec<u64>,
    /// Parameter id.
    pub param_id: Option<u64>,
    /// Raw bytes.
    pub data: Vec<u8>,
    /// Whether the writer gets the bytes from a provider.
    pub deferred: bool,
}

impl ContainerSpec {
    /// A writer for this container.
    pub fn writer(&self) -> Writer {
        let tensors = self
            .tensors
            .iter()
            .map(|t| {
                let tensor = if t.deferred {
                    let data = t.data.clone();
                    Tensor::deferred(
                        &t.name,
                        t.dtype.clone(),
                        t.shape.clone(),
                        t.data.len() as u64,
                        move || Ok(Bytes::from(data.clone())),
                    )
                } else {
                    Tensor::new(&t.name, t.dtype.clone(), t.shape.clone(), t.data.clone())
                };
                match t.param_id {
                    Some(id) => tensor.with_param_id(id),
                    None => tensor,
                }
            })
            .collect();
        let mut writer = Writer::new(tensors)
            .with_alignment(self.alignment)
            .with_trailer(self.trailer);
        for (key, value) in &self.metadata {
            writer = writer.with_metadata(key, value);
        }
        for (key, value) in &self.scalars {
            writer = writer.with_scalar(key, *value);
        }
        writer
    }

    /// The container's bytes.
    ///
    /// # Panics
    /// If the writer rejects the spec (strategies only make valid specs).
    pub fn bytes(&self) -> Vec<u8> {
        self.writer().into_bytes().expect("a valid container spec")
    }
}

/// Tensor names: bytewise-ordering edge cases, dotted paths, unicode, and long names.
pub fn tensor_name() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("B".to_string()),
        Just("aa".to_string()),
        Just("b".to_string()),
        "[a-z][a-z0-9_.]{0,16}",
        "\\PC{1,8}",
        "[a-z]{200,300}",
    ]
}

/// Every fixed-size dtype, and QFloat with an opaque scheme.
pub fn dtype() -> impl Strategy<Value = DType> {
    // A small well-formed CBOR map standing in for a quantization scheme.
    let scheme = QuantScheme::from_cbor(&[
        0xa1, 0x65, b'v', b'a', b'l', b'u', b'e', 0x63, b'Q', b'8', b'F',
    ])
    .expect("a single CBOR item");
    prop_oneof![
        12 => proptest::sample::select(DType::FIXED.to_vec()),
        1 => Just(DType::QFloat(scheme)),
    ]
}

/// A tensor: up to 3 dimensions of up to 5, including zero-size ones, resident or deferred.
pub fn tensor() -> impl Strategy<Value = TensorSpec> {
    (
        tensor_name(),
        dtype(),
        proptest::collection::vec(0u64..6, 0..4),
        proptest::option::of(any::<u64>()),
        any::<bool>(),
    )
        .prop_flat_map(|(name, dtype, shape, param_id, deferred)| {
            let len = match dtype.byte_len(&shape) {
                weightbay::ByteLen::Exact(len) => len as usize..len as usize + 1,
                _ => 0..200,
            };
            proptest::collection::vec(any::<u8>(), len).prop_map(move |data| TensorSpec {
                name: name.clone(),
                dtype: dtype.clone(),
                shape: shape.clone(),
                param_id,
                data,
                deferred,
            })
        })
}

/// A scalar of each kind, with floats of every CBOR width.
pub fn scalar() -> impl Strategy<Value = Scalar> {
    prop_oneof![
        any::<i64>().prop_map(Scalar::Int),
        any::<u64>().prop_map(Scalar::UInt),
        any::<bool>().prop_map(Scalar::Bool),
        any::<f64>().prop_map(Scalar::Float),
    ]
}

/// A container of up to 6 tensors with unique names, metadata, scalars, an alignment and the
/// trailer on or off.
pub fn container() -> impl Strategy<Value = ContainerSpec> {
    (
        proptest::collection::vec(tensor(), 0..6),
        proptest::collection::btree_map("\\PC{0,8}", "\\PC{0,16}", 0..3),
        proptest::collection::btree_map("[a-z_]{1,8}", scalar(), 0..3),
        proptest::sample::select(vec![256u64, 512, 4096]),
        any::<bool>(),
    )
        .prop_map(|(tensors, metadata, scalars, alignment, trailer)| {
            let mut seen = BTreeSet::new();
            let tensors = tensors
                .into_iter()
                .filter(|t| seen.insert(t.name.clone()))
                .collect();
            ContainerSpec {
                tensors,
                metadata,
                scalars,
                alignment,
                trailer,
            }
        })
}

/// A small container with one tensor per entry of `sizes` (U8, odd ones deferred), each
/// filled with `fill`.
pub fn sample(sizes: &[usize], fill: u8) -> ContainerSpec {
    ContainerSpec {
        tensors: sizes
            .iter()
            .enumerate()
            .map(|(i, &len)| TensorSpec {
                name: format!("layer{i}.weight"),
                dtype: DType::U8,
                shape: vec![len as u64],
                param_id: None,
                data: (0..len).map(|j| fill.wrapping_add(j as u8)).collect(),
                deferred: i % 2 == 1,
            })
            .collect(),
        metadata: BTreeMap::from([("fill".to_string(), fill.to_string())]),
        scalars: BTreeMap::new(),
        alignment: 256,
        trailer: true,
    }
}

/// `len` bytes from a small xorshift generator seeded by `seed`: cheap, and different for
/// every seed, so no two chunks of a tensor, nor two tensors, hold the same bytes by accident
/// (constant-filled data would let content hashing find any chunk anywhere).
pub fn noise(seed: u64, len: usize) -> Vec<u8> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        out.extend_from_slice(&state.to_le_bytes());
    }
    out.truncate(len);
    out
}
