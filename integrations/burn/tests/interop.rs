//! Interop with the real `burn-pack` crate: byte-identical output, and each side reads what
//! the other writes.

use std::collections::BTreeMap;

use proptest::prelude::*;
use proptest::test_runner::Config;
use weightbay::{ByteLen, DType, QuantScheme, Reader, Scalar, Tensor, Writer};

use weightbay_burn::{to_burn_dtype, to_burn_pack_tensor, to_burn_scalar};

/// One tensor's parts, kept plain so both crates' tensors can be built from them.
#[derive(Debug, Clone)]
struct TensorParts {
    name: String,
    dtype: DType,
    shape: Vec<u64>,
    param_id: Option<u64>,
    data: Vec<u8>,
}

impl TensorParts {
    /// The tensor as weightbay takes it.
    fn ours(&self) -> Tensor {
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
}

/// The default QFloat scheme, as burn-pack's serde encodes it.
fn burn_qfloat_cbor() -> Vec<u8> {
    let mut out = Vec::new();
    ciborium::ser::into_writer(&burn_std::quantization::QuantScheme::default(), &mut out).unwrap();
    out
}

/// Scalars compared bitwise, so NaN equals itself.
fn scalar_bits(scalar: Scalar) -> (u8, u64) {
    match scalar {
        Scalar::Int(v) => (0, v as u64),
        Scalar::UInt(v) => (1, v),
        Scalar::Float(v) => (2, v.to_bits()),
        Scalar::Bool(v) => (3, u64::from(v)),
    }
}

fn burn_scalar_bits(scalar: &burn_pack::Scalar) -> (u8, u64) {
    match *scalar {
        burn_pack::Scalar::Int(v) => (0, v as u64),
        burn_pack::Scalar::UInt(v) => (1, v),
        burn_pack::Scalar::Float(v) => (2, v.to_bits()),
        burn_pack::Scalar::Bool(v) => (3, u64::from(v)),
    }
}

#[derive(Debug, Clone)]
struct ContainerCase {
    tensors: Vec<TensorParts>,
    metadata: BTreeMap<String, String>,
    scalars: BTreeMap<String, Scalar>,
}

impl ContainerCase {
    fn ours(&self) -> Writer {
        let mut writer = Writer::new(self.tensors.iter().map(TensorParts::ours).collect());
        for (k, v) in &self.metadata {
            writer = writer.with_metadata(k, v);
        }
        for (k, v) in &self.scalars {
            writer = writer.with_scalar(k, *v);
        }
        writer
    }

    fn burn(&self) -> burn_pack::Writer {
        let tensors = self
            .tensors
            .iter()
            .map(|t| to_burn_pack_tensor(&t.ours()).expect("the strategies make burn dtypes only"))
            .collect();
        let mut writer = burn_pack::Writer::new(tensors);
        for (k, v) in &self.metadata {
            writer = writer.with_metadata(k, v);
        }
        for (k, v) in &self.scalars {
            writer = writer.with_scalar(k, to_burn_scalar(*v));
        }
        writer
    }
}

mod strategies {
    use super::*;

    /// Names that exercise bytewise ordering ("B" < "aa" < "b"), dots, unicode and length.
    pub(crate) fn tensor_name() -> impl Strategy<Value = String> {
        prop_oneof![
            Just("B".to_string()),
            Just("aa".to_string()),
            Just("b".to_string()),
            "[a-z][a-z0-9_.]{0,12}",
            "\\PC{1,6}",
            "[a-z]{60,80}",
        ]
    }

    pub(crate) fn dtype() -> impl Strategy<Value = DType> {
        let qfloat = QuantScheme::from_cbor(&burn_qfloat_cbor()).unwrap();
        prop_oneof![
            12 => proptest::sample::select(DType::FIXED.to_vec()),
            1 => Just(DType::QFloat(qfloat)),
        ]
    }

    pub(crate) fn tensor() -> impl Strategy<Value = TensorParts> {
        (
            tensor_name(),
            dtype(),
            proptest::collection::vec(0u64..6, 0..4),
            proptest::option::of(any::<u64>()),
        )
            .prop_flat_map(|(name, dtype, shape, param_id)| {
                let len = match dtype.byte_len(&shape) {
                    ByteLen::Exact(len) => len as usize..len as usize + 1,
                    _ => 0..300, // QFloat: any packed length
                };
                proptest::collection::vec(any::<u8>(), len).prop_map(move |data| TensorParts {
                    name: name.clone(),
                    dtype: dtype.clone(),
                    shape: shape.clone(),
                    param_id,
                    data,
                })
            })
    }

    /// Floats of every CBOR width: f16-exact, f32-exact, f64 only, and the specials.
    pub(crate) fn scalar() -> impl Strategy<Value = Scalar> {
        prop_oneof![
            any::<i64>().prop_map(Scalar::Int),
            any::<u64>().prop_map(Scalar::UInt),
            any::<bool>().prop_map(Scalar::Bool),
            any::<f64>().prop_map(Scalar::Float),
            any::<f32>().prop_map(|v| Scalar::Float(f64::from(v))),
            proptest::sample::select(vec![
                0.0,
                -0.0,
                1.5,
                65504.0,
                f64::NAN,
                f64::INFINITY,
                1e-300
            ])
            .prop_map(Scalar::Float),
        ]
    }

    pub(crate) fn container() -> impl Strategy<Value = ContainerCase> {
        (
            proptest::collection::vec(tensor(), 0..8),
            proptest::collection::btree_map("\\PC{0,8}", "\\PC{0,16}", 0..4),
            proptest::collection::btree_map("[a-z_]{1,8}", scalar(), 0..5),
        )
            .prop_map(|(tensors, metadata, scalars)| {
                let mut seen = std::collections::BTreeSet::new();
                let tensors = tensors
                    .into_iter()
                    .filter(|t| seen.insert(t.name.clone()))
                    .collect();
                ContainerCase {
                    tensors,
                    metadata,
                    scalars,
                }
            })
    }
}

fn config() -> Config {
    Config {
        cases: 256,
        ..Config::default()
    }
}

proptest! {
    #![proptest_config(config())]

    /// (a) Same input, same bytes as burn-pack; with the trailer on, the same bytes up to it.
    #[test]
    fn bytes_equal_burn_pack(case in strategies::container()) {
        let theirs = case.burn().into_bytes().unwrap().to_vec();
        let plain = case.ours().with_trailer(false).into_bytes().unwrap();
        prop_assert_eq!(&plain, &theirs);
        let with_trailer = case.ours().into_bytes().unwrap();
        prop_assert_eq!(&with_trailer[..theirs.len()], &theirs[..]);
        prop_assert!(with_trailer.len() > theirs.len());
    }

    /// (b) burn-pack reads everything we write, trailer included.
    #[test]
    fn burn_pack_reads_ours(case in strategies::container()) {
        let ours = case.ours().into_bytes().unwrap();
        let reader = burn_pack::Reader::from_bytes(burn_pack::Bytes::from_bytes_vec(ours)).unwrap();
        prop_assert_eq!(reader.metadata(), &case.metadata);
        let scalars: BTreeMap<_, _> = reader.scalars().iter().map(|(k, v)| (k.clone(), burn_scalar_bits(v))).collect();
        let expected: BTreeMap<_, _> = case.scalars.iter().map(|(k, v)| (k.clone(), scalar_bits(*v))).collect();
        prop_assert_eq!(scalars, expected);
        prop_assert_eq!(reader.tensor_names().len(), case.tensors.len());
        for tensor in &case.tensors {
            prop_assert_eq!(&reader.tensor_data(&tensor.name).unwrap(), &tensor.data);
        }
        let tensors = reader.into_tensors().unwrap();
        for theirs in tensors {
            let ours = case.tensors.iter().find(|t| t.name == theirs.name).unwrap();
            prop_assert_eq!(Some(theirs.dtype), to_burn_dtype(&ours.dtype).ok());
            prop_assert_eq!(theirs.param_id, ours.param_id);
            let shape: Vec<u64> = theirs.shape.iter().map(|&d| d as u64).collect();
            prop_assert_eq!(shape, ours.shape.clone());
        }
    }

    /// (c) We read everything burn-pack writes, with equal values, and verify it.
    #[test]
    fn we_read_burn_pack(case in strategies::container()) {
        let theirs = case.burn().into_bytes().unwrap().to_vec();
        let reader = Reader::from_bytes(theirs.clone()).unwrap();
        prop_assert!(!reader.has_trailer());
        prop_assert_eq!(reader.metadata(), &case.metadata);
        let scalars: BTreeMap<_, _> = reader.scalars().iter().map(|(k, v)| (k.clone(), scalar_bits(*v))).collect();
        let expected: BTreeMap<_, _> = case.scalars.iter().map(|(k, v)| (k.clone(), scalar_bits(*v))).collect();
        prop_assert_eq!(scalars, expected);
        prop_assert_eq!(reader.tensors().len(), case.tensors.len());
        for tensor in &case.tensors {
            let info = reader.tensor(&tensor.name).unwrap();
            prop_assert_eq!(info.dtype(), &tensor.dtype);
            prop_assert_eq!(info.shape(), &tensor.shape[..]);
            prop_assert_eq!(info.param_id(), tensor.param_id);
            prop_assert_eq!(&reader.read(&tensor.name).unwrap(), &tensor.data);
        }
        reader.verify().unwrap();
        // Re-encoding what we read reproduces burn-pack's bytes exactly (QFloat schemes too).
        let again = reader.to_writer().with_trailer(false).into_bytes().unwrap();
        prop_assert_eq!(again, theirs);
    }
}

/// The alignment option stays readable by burn-pack and puts every tensor at an absolute
/// offset that is a multiple of the alignment.
#[test]
fn aligned_containers_read_in_burn_pack() {
    for alignment in [512u64, 4096, 65536] {
        let tensors: Vec<Tensor> = (0..5)
            .map(|i| {
                Tensor::new(
                    format!("t{i}"),
                    DType::U8,
                    [100 * i + 1],
                    vec![i as u8; 100 * i as usize + 1],
                )
            })
            .collect();
        let bytes = Writer::new(tensors)
            .with_alignment(alignment)
            .into_bytes()
            .unwrap();
        let reader = Reader::from_bytes(bytes.clone()).unwrap();
        for info in reader.tensors() {
            assert_eq!(
                info.range().start % alignment,
                0,
                "{} at {alignment}",
                info.name()
            );
        }
        reader.verify().unwrap();
        let theirs =
            burn_pack::Reader::from_bytes(burn_pack::Bytes::from_bytes_vec(bytes)).unwrap();
        for i in 0..5u8 {
            assert_eq!(
                theirs.tensor_data(&format!("t{i}")).unwrap(),
                vec![i; 100 * usize::from(i) + 1]
            );
        }
    }
}
