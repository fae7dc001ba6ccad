//! The bodies of weightbay's fuzz targets. The libFuzzer binaries in `fuzz_targets/` call them,
//! and `tests/replay.rs` runs every committed seed through them on stable Rust, so a regression
//! is caught without nightly or libFuzzer.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use arbitrary::Unstructured;
use weightbay::{
    DType, MemorySource, MemoryStorage, ReadOptions, Reader, Scalar,
    Storage, Tensor, Validation, Writer,
};
use weightbay::codec::{Codec, Elements, encode_planes};
use weightbay_conformance::model::{KEYS, Model, Op, VERSIONS};

use weightbay_burn::{to_burn_pack_tensor, to_burn_scalar};

/// Any bytes, as a container: opening never panics; what opens reads, verifies (or reports
/// why not), and re-encodes into a container that opens strictly with the same contents.
pub fn reader(input: &[u8]) {
    for validation in [Validation::Strict, Validation::Lenient] {
        let source = Arc::new(MemorySource::new(bytes::Bytes::copy_from_slice(input)));
        let Ok(reader) = Reader::open_with(source, ReadOptions::default().with_validation(validation)) else {
            continue;
        };
        for info in reader.tensors() {
            let data = reader.read(info.name()).expect("the tensors of an opened in-memory container read");
            assert_eq!(data.len() as u64, info.byte_len());
        }
        let _ = reader.verify();
        let again = reader
            .to_writer()
            .with_trailer(reader.has_trailer())
            .into_bytes()
            .expect("an opened container re-encodes");
        let reread = Reader::from_bytes(again).expect("a re-encoded container opens strictly");
        assert_same(&reader, &reread);
        reread.verify().expect("a re-encoded container verifies");
    }
}

fn scalar_bits(scalar: Scalar) -> (u8, u64) {
    match scalar {
        Scalar::Int(v) => (0, v as u64),
        Scalar::UInt(v) => (1, v),
        Scalar::Float(v) => (2, v.to_bits()),
        Scalar::Bool(v) => (3, u64::from(v)),
    }
}

/// Same tensors (name, dtype, shape, parameter id, bytes), metadata and scalars.
fn assert_same(a: &Reader, b: &Reader) {
    assert_eq!(a.metadata(), b.metadata());
    let bits = |r: &Reader| r.scalars().iter().map(|(k, v)| (k.clone(), scalar_bits(*v))).collect::<Vec<_>>();
    assert_eq!(bits(a), bits(b));
    assert_eq!(a.tensors().len(), b.tensors().len());
    for (x, y) in a.tensors().iter().zip(b.tensors()) {
        assert_eq!((x.name(), x.dtype(), x.shape(), x.param_id()), (y.name(), y.dtype(), y.shape(), y.param_id()));
        assert_eq!(a.read(x.name()).ok(), b.read(y.name()).ok(), "tensor {}", x.name());
    }
}


/// burn's default quantization scheme, exactly as burn-pack encodes it: read back from a
/// one-tensor container burn-pack wrote.
fn qfloat() -> DType {
    let tensor = burn_pack::Tensor::new(
        "q".into(),
        burn_std::DType::QFloat(burn_std::quantization::QuantScheme::default()),
        vec![0usize],
        None,
        burn_pack::Bytes::from_bytes_vec(vec![]),
    );
    let bytes = burn_pack::Writer::new(vec![tensor]).into_bytes().expect("burn-pack writes its own scheme");
    let reader = Reader::from_bytes(bytes.to_vec()).expect("we read burn-pack's bytes");
    reader.tensor("q").expect("the tensor we wrote").dtype().clone()
}

fn tensor_input(u: &mut Unstructured<'_>, qfloat: &DType) -> arbitrary::Result<Tensor> {
    let name: String = u.arbitrary()?;
    let choice = u.int_in_range(0..=DType::FIXED.len())?;
    let dtype = DType::FIXED.get(choice).cloned().unwrap_or_else(|| qfloat.clone());
    let rank = u.int_in_range(0..=3)?;
    let shape = (0..rank).map(|_| u.int_in_range(0..=5u64)).collect::<arbitrary::Result<Vec<_>>>()?;
    let len = match dtype.byte_len(&shape) {
        weightbay::ByteLen::Exact(len) => len as usize,
        _ => u.int_in_range(0..=64)?,
    };
    let fill: u8 = u.arbitrary()?;
    let data: Vec<u8> = (0..len).map(|i| fill.wrapping_add(i as u8)).collect();
    let tensor = Tensor::new(name, dtype, shape, data);
    Ok(match u.arbitrary()? {
        Some(id) => tensor.with_param_id(id),
        None => tensor,
    })
}

fn scalar(u: &mut Unstructured<'_>) -> arbitrary::Result<Scalar> {
    Ok(match u.int_in_range(0..=3)? {
        0 => Scalar::Int(u.arbitrary()?),
        1 => Scalar::UInt(u.arbitrary()?),
        2 => Scalar::Float(u.arbitrary()?),
        _ => Scalar::Bool(u.arbitrary()?),
    })
}

/// Any bytes as an encoded piece: the first two bytes are the logical length it claims (up to
/// 64 KiB), the rest the frame. Decoding never panics and writes only that length. The same
/// rest, as a piece's logical bytes, encodes and decodes back bit for bit as elements of the
/// dtype the first byte picks.
pub fn codec(input: &[u8]) {
    let Some((claim, frame)) = input.split_first_chunk::<2>() else {
        return;
    };
    let mut into = vec![0u8; usize::from(u16::from_le_bytes(*claim))];
    let _ = Codec::Planes.decode(frame, &mut into);
    let dtypes = [DType::U8, DType::BF16, DType::I16, DType::F32, DType::I32, DType::F64];
    let elements = Elements::of(&dtypes[usize::from(claim[0]) % dtypes.len()]);
    let mut stored = Vec::new();
    if encode_planes(frame, elements, &mut stored) {
        assert!(stored.len() < frame.len(), "an encoded piece is shorter");
        let mut back = vec![0u8; frame.len()];
        Codec::Planes.decode(&stored, &mut back).expect("an encoded piece decodes");
        assert_eq!(back, frame, "an encoded piece decodes to its bytes");
    }
}

/// Structured containers (any dtype, shape, unicode names, metadata, scalars, alignment,
/// trailer): written and read back equal; at the default alignment, byte-identical to what
/// burn-pack writes for the same input.
pub fn roundtrip(input: &[u8]) {
    static QFLOAT: OnceLock<DType> = OnceLock::new();
    let qfloat = QFLOAT.get_or_init(qfloat);
    let mut u = Unstructured::new(input);
    let Ok(count) = u.int_in_range(0..=6) else { return };
    let mut names = BTreeSet::new();
    let mut tensors = Vec::new();
    for _ in 0..count {
        let Ok(tensor) = tensor_input(&mut u, qfloat) else { break };
        if names.insert(tensor.name().to_owned()) {
            tensors.push(tensor);
        }
    }
    let mut metadata = BTreeMap::new();
    let mut scalars = BTreeMap::new();
    for _ in 0..u.int_in_range(0..=3).unwrap_or(0) {
        if let (Ok(k), Ok(v)) = (u.arbitrary::<String>(), u.arbitrary::<String>()) {
            metadata.insert(k, v);
        }
    }
    for _ in 0..u.int_in_range(0..=3).unwrap_or(0) {
        if let (Ok(k), Ok(v)) = (u.arbitrary::<String>(), scalar(&mut u)) {
            scalars.insert(k, v);
        }
    }
    let alignment = [256u64, 512, 4096][u.int_in_range(0..=2).unwrap_or(0)];
    let trailer: bool = u.arbitrary().unwrap_or(true);

    let writer = || {
        let mut writer = Writer::new(tensors.clone()).with_alignment(alignment);
        for (k, v) in &metadata {
            writer = writer.with_metadata(k, v);
        }
        for (k, v) in &scalars {
            writer = writer.with_scalar(k, *v);
        }
        writer
    };
    let bytes = writer().with_trailer(trailer).into_bytes().expect("valid input writes");
    let reader = Reader::from_bytes(bytes).expect("written containers open");
    assert_eq!(reader.metadata(), &metadata);
    let bits = |m: &BTreeMap<String, Scalar>| m.iter().map(|(k, v)| (k.clone(), scalar_bits(*v))).collect::<Vec<_>>();
    assert_eq!(bits(reader.scalars()), bits(&scalars));
    for t in &tensors {
        let info = reader.tensor(t.name()).expect("every tensor is listed");
        assert_eq!((info.dtype(), info.shape(), info.param_id()), (t.dtype(), t.shape(), t.param_id()));
        let data = t.bytes().and_then(|b| b.to_vec()).expect("eager tensors hold their bytes");
        assert_eq!(reader.read(t.name()).expect("tensors read"), data);
        assert_eq!(info.range().start % alignment, 0);
    }
    reader.verify().expect("written containers verify");

    if alignment == 256 {
        // Every dtype the input makes (DType::FIXED and QFloat) is one burn-pack has.
        let theirs = tensors
            .iter()
            .map(|t| to_burn_pack_tensor(t).expect("burn-pack has every dtype the input makes"))
            .collect();
        let mut burn = burn_pack::Writer::new(theirs);
        for (k, v) in &metadata {
            burn = burn.with_metadata(k, v);
        }
        for (k, v) in &scalars {
            burn = burn.with_scalar(k, to_burn_scalar(*v));
        }
        let theirs = burn.into_bytes().expect("burn-pack writes the same input").to_vec();
        let ours = writer().with_trailer(false).into_bytes().expect("valid input writes");
        assert!(ours == theirs, "bytes differ from burn-pack's for the same input");
    }
}

/// The backend `storage_ops` runs against: `WEIGHTBAY_FUZZ_BACKEND`, one of `memory` (the
/// default), `local`, `mmap`, `object-memory`, `object-local`, `s3` (needs the S3 server's
/// environment, see scripts/servers.sh).
pub fn backend_name() -> String {
    std::env::var("WEIGHTBAY_FUZZ_BACKEND").unwrap_or_else(|_| "memory".into())
}

fn bridge() -> weightbay_object_store::Bridge {
    static BRIDGE: OnceLock<weightbay_object_store::Bridge> = OnceLock::new();
    BRIDGE.get_or_init(|| weightbay_object_store::Bridge::owned().expect("an object-store runtime")).clone()
}

/// Small parts, so the model's containers are multipart uploads.
fn small_parts() -> weightbay_object_store::ObjectStoreOptions {
    weightbay_object_store::ObjectStoreOptions::DEFAULT.with_part_size(512).with_parts_in_flight(2)
}

/// A fresh storage of the chosen backend, and what must live as long as it.
fn fresh_storage() -> (Box<dyn Storage>, Option<tempfile::TempDir>) {
    let dir = || tempfile::tempdir().expect("a temporary directory");
    match backend_name().as_str() {
        "memory" => (Box::new(MemoryStorage::new()), None),
        "local" => {
            let dir = dir();
            (Box::new(weightbay_local::LocalStorage::new(dir.path())), Some(dir))
        }
        "mmap" => {
            let dir = dir();
            (Box::new(weightbay_mmap::MmapStorage::new(dir.path())), Some(dir))
        }
        "object-memory" => {
            let store = Arc::new(object_store::memory::InMemory::new());
            (Box::new(weightbay_object_store::ObjectStorage::with_bridge(store, bridge()).with_options(small_parts())), None)
        }
        "object-local" => {
            let dir = dir();
            let store = Arc::new(object_store::local::LocalFileSystem::new_with_prefix(dir.path()).expect("a store over the directory"));
            (Box::new(weightbay_object_store::ObjectStorage::with_bridge(store, bridge()).with_options(small_parts())), Some(dir))
        }
        "s3" => {
            static RUN: AtomicU64 = AtomicU64::new(0);
            let base = std::env::var("WEIGHTBAY_S3_URL").expect("WEIGHTBAY_S3_URL (scripts/servers.sh start s3)");
            let url = format!("{base}/fuzz-{}-{}", std::process::id(), RUN.fetch_add(1, Ordering::Relaxed));
            let storage = weightbay_object_store::open_url(&url, std::iter::empty::<(&str, &str)>()).expect("the S3 server");
            (Box::new(storage), None)
        }
        other => panic!("unknown WEIGHTBAY_FUZZ_BACKEND `{other}`"),
    }
}

fn op(u: &mut Unstructured<'_>) -> arbitrary::Result<Op> {
    let key = u.int_in_range(0..=KEYS.len() - 1)?;
    Ok(match u.int_in_range(0..=4u8)? {
        0 => Op::Put {
            key,
            version: u.int_in_range(0..=VERSIONS - 1)?,
            create_new: u.arbitrary()?,
            fail_at: if u.arbitrary()? { Some(u.int_in_range(1..=12)?) } else { None },
        },
        1 => Op::Abort { key, version: u.int_in_range(0..=VERSIONS - 1)? },
        2 => Op::Delete { key },
        3 => Op::Open { key },
        _ => Op::ReadRange { key, start: u.int_in_range(0..=2000)?, len: u.int_in_range(0..=700)? },
    })
}

/// A sequence of storage operations (create, overwrite, create-new, abort, delete, open,
/// ranged reads, each write with an optional fault point) against the chosen backend and the
/// conformance model, compared after every step.
pub fn storage_ops(input: &[u8]) {
    let mut u = Unstructured::new(input);
    let (storage, _dir) = fresh_storage();
    let mut model = Model::default();
    for step in 0..16 {
        let Ok(op) = op(&mut u) else { break };
        if let Err(e) = model.apply(&storage, &op).and_then(|()| model.check(&storage)) {
            panic!("backend {}: step {step} ({op:?}): {e}", backend_name());
        }
    }
}
