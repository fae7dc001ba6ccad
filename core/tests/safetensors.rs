//! The safetensors codec: interop with the `safetensors` crate both ways, Python's
//! `safetensors` reading our output, conversion to and from Burnpack, and hostile headers.

mod common;

use std::collections::{BTreeMap, HashMap};

use proptest::prelude::*;
use weightbay::Format;
use weightbay::{BoolStore, DType, ErrorKind, Reader, Scalar, Tensor, Writer};

fn to_st(dtype: &DType) -> safetensors::Dtype {
    use safetensors::Dtype as S;
    match dtype {
        DType::F64 => S::F64,
        DType::F32 => S::F32,
        DType::F16 => S::F16,
        DType::BF16 => S::BF16,
        DType::I64 => S::I64,
        DType::I32 => S::I32,
        DType::I16 => S::I16,
        DType::I8 => S::I8,
        DType::U64 => S::U64,
        DType::U32 => S::U32,
        DType::U16 => S::U16,
        DType::U8 => S::U8,
        DType::Bool(BoolStore::Native) => S::BOOL,
        DType::F8E4M3 => S::F8_E4M3,
        DType::F8E5M2 => S::F8_E5M2,
        other => panic!("no safetensors dtype for {other}"),
    }
}

/// The dtypes both formats' codecs can write to safetensors.
fn st_dtypes() -> Vec<DType> {
    let mut all: Vec<DType> = DType::FIXED
        .iter()
        .filter(|d| d.safetensors_name().is_some())
        .cloned()
        .collect();
    all.extend([DType::F8E4M3, DType::F8E5M2]);
    all
}

#[derive(Debug, Clone)]
struct Case {
    tensors: Vec<(String, DType, Vec<u64>, Vec<u8>)>,
    metadata: BTreeMap<String, String>,
}

fn case() -> impl Strategy<Value = Case> {
    let tensor = (
        "\\PC{1,12}",
        proptest::sample::select(st_dtypes()),
        proptest::collection::vec(0u64..5, 0..4),
    )
        .prop_flat_map(|(name, dtype, shape)| {
            let weightbay::ByteLen::Exact(len) = dtype.byte_len(&shape) else {
                unreachable!("plain dtypes of small shapes have a length")
            };
            let len = len as usize;
            proptest::collection::vec(any::<u8>(), len)
                .prop_map(move |data| (name.clone(), dtype.clone(), shape.clone(), data))
        });
    (
        proptest::collection::vec(tensor, 0..6),
        proptest::collection::btree_map("[a-z]{1,6}", "\\PC{0,10}", 0..3),
    )
        .prop_map(|(tensors, metadata)| {
            let mut seen = std::collections::BTreeSet::new();
            let tensors = tensors
                .into_iter()
                .filter(|t| seen.insert(t.0.clone()) && t.0 != "__metadata__")
                .collect();
            Case { tensors, metadata }
        })
}

impl Case {
    fn ours(&self) -> Vec<u8> {
        let tensors = self
            .tensors
            .iter()
            .map(|(n, d, s, data)| Tensor::new(n, d.clone(), s.clone(), data.clone()))
            .collect();
        let mut writer = Writer::new(tensors).with_format(Format::Safetensors);
        for (k, v) in &self.metadata {
            writer = writer.with_metadata(k, v);
        }
        writer.into_bytes().unwrap()
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// The safetensors crate reads everything we write.
    #[test]
    fn safetensors_crate_reads_ours(case in case()) {
        let bytes = case.ours();
        let theirs = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        prop_assert_eq!(theirs.len(), case.tensors.len());
        for (name, dtype, shape, data) in &case.tensors {
            let view = theirs.tensor(name).unwrap();
            prop_assert_eq!(view.dtype(), to_st(dtype));
            let view_shape: Vec<u64> = view.shape().iter().map(|&d| d as u64).collect();
            prop_assert_eq!(&view_shape, shape);
            prop_assert_eq!(view.data(), &data[..]);
        }
        let (_, metadata) = safetensors::SafeTensors::read_metadata(&bytes).unwrap();
        let theirs: BTreeMap<String, String> = metadata.metadata().clone().unwrap_or_default().into_iter().collect();
        prop_assert_eq!(&theirs, &case.metadata);
    }

    /// We read everything the safetensors crate writes, and verify it.
    #[test]
    fn we_read_the_safetensors_crate(case in case()) {
        let views: Vec<(String, safetensors::tensor::TensorView<'_>)> = case
            .tensors
            .iter()
            .map(|(n, d, s, data)| {
                let shape: Vec<usize> = s.iter().map(|&x| x as usize).collect();
                (n.clone(), safetensors::tensor::TensorView::new(to_st(d), shape, data).unwrap())
            })
            .collect();
        let info: Option<HashMap<String, String>> = (!case.metadata.is_empty()).then(|| case.metadata.clone().into_iter().collect());
        let bytes = safetensors::serialize(views, info).unwrap();
        let reader = Reader::from_bytes(bytes).unwrap();
        prop_assert_eq!(reader.format(), Format::Safetensors);
        prop_assert_eq!(reader.metadata(), &case.metadata);
        for (name, dtype, shape, data) in &case.tensors {
            let info = reader.tensor(name).unwrap();
            prop_assert_eq!(info.dtype(), dtype);
            prop_assert_eq!(info.shape(), &shape[..]);
            prop_assert_eq!(&reader.read(name).unwrap(), data);
        }
        let report = reader.verify().unwrap();
        prop_assert!(!report.checksummed);
    }
}

#[test]
fn converting_burnpack_and_back_keeps_everything_safetensors_can_hold() {
    let burnpack = Writer::new(vec![
        Tensor::new("w", DType::F32, [2], vec![1u8; 8]).with_param_id(7),
        Tensor::new("m", DType::Bool(BoolStore::Native), [3], vec![1, 0, 1]),
    ])
    .with_metadata("producer", "test")
    .with_scalar("epoch", 3u64)
    .with_scalar("lr", 0.001f64)
    .into_bytes()
    .unwrap();
    let reader = Reader::from_bytes(burnpack).unwrap();
    let st = reader
        .to_writer()
        .with_format(Format::Safetensors)
        .into_bytes()
        .unwrap();
    let st_reader = Reader::from_bytes(st.clone()).unwrap();
    assert_eq!(st_reader.metadata(), reader.metadata());
    assert_eq!(st_reader.scalars(), reader.scalars());
    assert_eq!(st_reader.read("w").unwrap(), vec![1u8; 8]);
    assert!(safetensors::SafeTensors::deserialize(&st).is_ok());
    let back = Reader::from_bytes(
        st_reader
            .to_writer()
            .with_format(Format::Burnpack)
            .into_bytes()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(back.format(), Format::Burnpack);
    assert_eq!(back.scalars()["epoch"], Scalar::UInt(3));
    assert_eq!(back.read("m").unwrap(), vec![1, 0, 1]);
    back.verify().unwrap();
}

#[test]
fn dtypes_without_a_counterpart_fail_naming_the_tensor() {
    for dtype in [DType::Flex32, DType::Bool(BoolStore::U32)] {
        let len = dtype.element_size().unwrap() as usize;
        let err = Writer::new(vec![Tensor::new("odd", dtype.clone(), [1], vec![0; len])])
            .with_format(Format::Safetensors)
            .into_bytes()
            .unwrap_err();
        assert_eq!(
            (err.kind(), err.tensor()),
            (ErrorKind::Unsupported, Some("odd")),
            "{dtype}"
        );
    }
    let err = Writer::new(vec![Tensor::new("f8", DType::F8E4M3, [2], vec![0; 2])])
        .into_bytes()
        .unwrap_err();
    assert_eq!(
        (err.kind(), err.tensor()),
        (ErrorKind::Unsupported, Some("f8"))
    );
    assert!(err.to_string().contains("no Burnpack counterpart"), "{err}");
}

fn raw(header: &str, data: &[u8]) -> Vec<u8> {
    let mut out = (header.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(header.as_bytes());
    out.extend_from_slice(data);
    out
}

#[test]
fn hostile_headers_give_typed_errors() {
    let t =
        |offsets: &str| format!(r#"{{"t":{{"dtype":"U8","shape":[2],"data_offsets":{offsets}}}}}"#);
    let cases: Vec<(&str, Vec<u8>, ErrorKind)> = vec![
        (
            "leading whitespace",
            raw(&format!(" {}", t("[0,2]")), &[0; 2]),
            ErrorKind::Corrupt,
        ),
        (
            "gap at the start",
            raw(&t("[1,3]"), &[0; 3]),
            ErrorKind::Corrupt,
        ),
        (
            "end before the file end",
            raw(&t("[0,2]"), &[0; 3]),
            ErrorKind::Corrupt,
        ),
        (
            "past the end",
            raw(&t("[0,2]"), &[0; 1]),
            ErrorKind::Corrupt,
        ),
        (
            "shape mismatch",
            raw(&t("[0,1]"), &[0; 1]),
            ErrorKind::Corrupt,
        ),
        (
            "duplicate name",
            raw(
                r#"{"t":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"t":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}}"#,
                &[0; 2],
            ),
            ErrorKind::Corrupt,
        ),
        (
            "overlap",
            raw(
                r#"{"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},"b":{"dtype":"U8","shape":[2],"data_offsets":[1,3]}}"#,
                &[0; 3],
            ),
            ErrorKind::Corrupt,
        ),
        (
            "unknown dtype",
            raw(
                r#"{"t":{"dtype":"F128","shape":[1],"data_offsets":[0,16]}}"#,
                &[0; 16],
            ),
            ErrorKind::Corrupt,
        ),
        ("not JSON", raw("{nope", &[]), ErrorKind::Corrupt),
        (
            "header past the end",
            {
                let mut b = raw("{}", &[]);
                b[..8].copy_from_slice(&100u64.to_le_bytes());
                b
            },
            ErrorKind::Corrupt,
        ),
        (
            "huge header claim",
            {
                let mut b = raw("{}", &[]);
                b[..8].copy_from_slice(&u64::MAX.to_le_bytes());
                b
            },
            ErrorKind::LimitExceeded,
        ),
    ];
    for (what, bytes, kind) in cases {
        let err = Reader::from_bytes(bytes).unwrap_err();
        assert_eq!(err.kind(), kind, "{what}: {err}");
    }
    // The dupe names the tensor.
    let err = Reader::from_bytes(raw(&t("[0,1]"), &[0; 1])).unwrap_err();
    assert_eq!(err.tensor(), Some("t"));
}

/// Python's `safetensors` (installed with pip by scripts/test.sh, its interpreter named by
/// WEIGHTBAY_PYTHON) reads what we write.
#[test]
fn python_safetensors_reads_ours() {
    let Ok(python) = std::env::var("WEIGHTBAY_PYTHON") else {
        let why =
            "WEIGHTBAY_PYTHON is unset (scripts/test.sh installs Python's safetensors and sets it)";
        assert!(
            std::env::var("WEIGHTBAY_REQUIRE_SERVERS").as_deref() != Ok("1"),
            "{why}"
        );
        eprintln!("skipped: {why}");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("model.safetensors");
    let values: Vec<f32> = (0..12).map(|i| i as f32 * 0.5).collect();
    let bytes = Writer::new(vec![
        Tensor::new(
            "layer.weight",
            DType::F32,
            [3, 4],
            values
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect::<Vec<u8>>(),
        ),
        Tensor::new(
            "layer.bias",
            DType::I64,
            [2],
            [7i64, -9].map(i64::to_le_bytes).concat(),
        ),
    ])
    .with_metadata("producer", "weightbay")
    .with_format(Format::Safetensors)
    .into_bytes()
    .unwrap();
    std::fs::write(&path, bytes).unwrap();
    let script = r#"
import sys
from safetensors.numpy import load_file
from safetensors import safe_open
t = load_file(sys.argv[1])
with safe_open(sys.argv[1], framework="numpy") as f:
    meta = f.metadata()
print(t["layer.weight"].shape, float(t["layer.weight"].sum()), t["layer.bias"].tolist(), meta["producer"])
"#;
    let output = std::process::Command::new(python)
        .args(["-c", script, path.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&output.stdout).trim(),
        "(3, 4) 33.0 [7, -9] weightbay"
    );
}

#[test]
fn entry_counts_are_capped_as_they_arrive() {
    use weightbay::format::MAX_TENSOR_COUNT;
    let entries: Vec<String> = (0..=MAX_TENSOR_COUNT + 1)
        .map(|i| format!(r#""m{i}":"""#))
        .collect();
    let metadata = format!(r#"{{"__metadata__":{{{}}}}}"#, entries.join(","));
    let err = Reader::from_bytes(raw(&metadata, &[])).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::LimitExceeded, "{err}");
    let tensors: Vec<String> = (0..=MAX_TENSOR_COUNT + 1)
        .map(|i| format!(r#""t{i}":{{"dtype":"U8","shape":[0],"data_offsets":[0,0]}}"#))
        .collect();
    let err = Reader::from_bytes(raw(&format!("{{{}}}", tensors.join(",")), &[])).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::LimitExceeded, "{err}");
}

#[test]
fn an_aligned_file_passes_the_safetensors_crate_with_its_data_on_the_alignment() {
    // Tensor lengths that are multiples of 4096, then one that is not (it goes last).
    let tensors = vec![
        Tensor::new("a", DType::U8, [8192], vec![1; 8192]),
        Tensor::new("b", DType::F32, [1024], vec![2; 4096]),
        Tensor::new("c", DType::U8, [10], vec![3; 10]),
    ];
    let bytes = Writer::new(tensors)
        .with_format(Format::Safetensors)
        .with_alignment(4096)
        .into_bytes()
        .unwrap();
    let header_len = u64::from_le_bytes(bytes[..8].try_into().unwrap());
    let data_start = 8 + header_len as usize;
    assert_eq!(
        data_start % 4096,
        0,
        "the data section starts at {data_start}"
    );
    let theirs = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    for (name, byte, start) in [("a", 1u8, 0usize), ("b", 2, 8192), ("c", 3, 12288)] {
        let view = theirs.tensor(name).unwrap();
        assert!(view.data().iter().all(|&b| b == byte), "{name}");
        let at = view.data().as_ptr() as usize - bytes.as_ptr() as usize;
        assert_eq!(at, data_start + start, "{name}");
    }
    // Not a power of two, or below the format's own 8: refused before anything is written.
    for alignment in [3000, 4] {
        let error = Writer::new(vec![Tensor::new("a", DType::U8, [1], vec![1])])
            .with_format(Format::Safetensors)
            .with_alignment(alignment)
            .into_bytes()
            .unwrap_err();
        assert_eq!(error.kind(), ErrorKind::InvalidInput, "{error}");
    }
}
