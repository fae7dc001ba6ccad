//! The reader on valid, legacy, corrupt and hostile input.

mod common;

use std::sync::Arc;

use ciborium::Value;
use common::*;
use proptest::prelude::*;
use weightbay::format::{
    MAX_CBOR_DEPTH, MAX_METADATA_LEN, MAX_TENSOR_COUNT, MAX_TENSOR_LEN, MAX_TENSOR_RANK,
};
use weightbay::{
    BoolStore, ByteLen, DType, ErrorKind, ReadOptions, Reader, Scalar, Tensor, Validation, Writer,
};

fn lenient(bytes: Vec<u8>) -> weightbay::Result<Reader> {
    let source = Arc::new(weightbay::MemorySource::new(bytes.into()));
    Reader::open_with(
        source,
        ReadOptions::default().with_validation(Validation::Lenient),
    )
}

fn kind(bytes: Vec<u8>) -> ErrorKind {
    Reader::from_bytes(bytes).unwrap_err().kind()
}

/// The worked example of research/burnpack.md §1.3.
fn golden() -> Writer {
    let weight: Vec<u8> = (1..=6).flat_map(|v| (v as f32).to_le_bytes()).collect();
    let bias: Vec<u8> = [0x3c00u16, 0x4000, 0x4200]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    Writer::new(vec![
        Tensor::new("layer.weight", DType::F32, [2, 3], weight).with_param_id(42),
        Tensor::new("layer.bias", DType::F16, [3], bias),
        Tensor::new(
            "mask",
            DType::Bool(BoolStore::Native),
            [4],
            vec![1, 0, 1, 1],
        ),
    ])
    .with_metadata("producer", "bp_probe")
    .with_metadata("format", "burnpack")
    .with_scalar("epoch", 3u64)
    .with_scalar("lr", Scalar::Float(0.001))
    .with_scalar("offset", -1i64)
    .with_scalar("frozen", true)
}

fn hexdump(bytes: &[u8]) -> String {
    let mut out = String::new();
    let mut previous_zero = false;
    for (row, chunk) in bytes.chunks(16).enumerate() {
        let zero = chunk.iter().all(|&b| b == 0);
        if zero && previous_zero {
            continue;
        }
        previous_zero = zero;
        let hex: Vec<String> = chunk.iter().map(|b| format!("{b:02x}")).collect();
        let ascii: String = chunk
            .iter()
            .map(|&b| if b.is_ascii_graphic() { b as char } else { '.' })
            .collect();
        out += &format!("{:08x}  {:<47}  |{ascii}|\n", row * 16, hex.join(" "));
    }
    out
}

#[test]
fn golden_container_matches_the_documented_bytes() {
    let plain = golden().with_trailer(false).into_bytes().unwrap();
    assert_eq!(plain.len(), 1028);
    assert_eq!(
        &plain[..10],
        &[0x4e, 0x52, 0x55, 0x42, 0x01, 0x00, 0x1e, 0x01, 0x00, 0x00]
    );
    insta::assert_snapshot!("golden_hexdump", hexdump(&golden().into_bytes().unwrap()));
}

#[test]
fn empty_container_is_256_bytes() {
    let bytes = Writer::new(vec![])
        .with_trailer(false)
        .into_bytes()
        .unwrap();
    assert_eq!(bytes.len(), 256);
    let reader = Reader::from_bytes(bytes).unwrap();
    assert!(reader.tensors().is_empty());
    assert!(
        Reader::from_bytes(Writer::new(vec![]).into_bytes().unwrap())
            .unwrap()
            .has_trailer()
    );
}

#[test]
fn verify_names_the_corrupted_tensor() {
    let mut bytes = golden().into_bytes().unwrap();
    let reader = Reader::from_bytes(bytes.clone()).unwrap();
    let report = reader.verify().unwrap();
    assert!(report.checksummed);
    assert_eq!(report.tensors, 3);
    let bias = reader.tensor("layer.bias").unwrap().range();
    bytes[bias.start as usize + 1] ^= 0x10;
    let err = Reader::from_bytes(bytes).unwrap().verify().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Corrupt);
    assert_eq!(err.tensor(), Some("layer.bias"));
}

#[test]
fn verify_catches_metadata_and_padding_changes() {
    let pristine = golden().into_bytes().unwrap();
    // A metadata byte that still parses: the producer string's last letter.
    let mut bytes = pristine.clone();
    let at = bytes.windows(8).position(|w| w == b"bp_probe").unwrap() + 7;
    bytes[at] = b'f';
    let err = Reader::from_bytes(bytes).unwrap().verify().unwrap_err();
    assert!(
        err.to_string().contains("header and metadata checksum"),
        "{err}"
    );
    // Padding between the metadata and the data section (the golden metadata ends at 296).
    let mut bytes = pristine.clone();
    bytes[400] = 1;
    let err = Reader::from_bytes(bytes).unwrap().verify().unwrap_err();
    assert!(
        err.to_string().contains("padding after the metadata"),
        "{err}"
    );
    assert_eq!(err.offset(), Some(400));
    // Padding between two tensors.
    let mut bytes = pristine;
    bytes[512 + 100] = 7;
    let err = Reader::from_bytes(bytes).unwrap().verify().unwrap_err();
    assert_eq!(err.tensor(), Some("layer.bias"));
    assert_eq!(err.offset(), Some(612));
}

#[test]
fn lookups_and_errors_name_the_tensor() {
    let reader = Reader::from_bytes(golden().into_bytes().unwrap()).unwrap();
    let names: Vec<&str> = reader.tensors().iter().map(|t| t.name()).collect();
    assert_eq!(names, ["layer.bias", "layer.weight", "mask"]);
    let err = reader.read("missing").unwrap_err();
    assert_eq!(
        (err.kind(), err.tensor()),
        (ErrorKind::NotFound, Some("missing"))
    );
    assert_eq!(reader.scalars()["offset"], Scalar::Int(-1));
    assert_eq!(reader.metadata()["format"], "burnpack");
}

/// A dozen corrupt inputs and the messages a person gets for them.
#[test]
fn corrupt_input_messages() {
    let good = golden().into_bytes().unwrap();
    let one = |d: Value| tensors(vec![("t", d)]);
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("empty", vec![]),
        ("nine bytes", good[..9].to_vec()),
        ("bad magic", b"BURN\x01\x00\x00\x00\x00\x00".to_vec()),
        ("version 2", {
            let mut b = good.clone();
            b[4] = 2;
            b
        }),
        ("metadata past the end", good[..200].to_vec()),
        ("metadata over the limit", {
            let mut b = good.clone();
            b[6..10].copy_from_slice(&u32::MAX.to_le_bytes());
            b
        }),
        ("garbage cbor", container_raw(&[0xff, 0xff, 0xff], &[])),
        (
            "metadata is an array",
            container(&Value::Array(vec![]), &[]),
        ),
        ("missing tensors", container(&Value::Map(vec![]), &[])),
        (
            "end before start",
            container(&one(descriptor("U8", &[0], 8, 0)), &[0; 8]),
        ),
        (
            "shape mismatch",
            container(&one(descriptor("F32", &[3], 0, 8)), &[0; 8]),
        ),
        (
            "unknown dtype",
            container(&one(descriptor("F128", &[1], 0, 16)), &[0; 16]),
        ),
        (
            "tensor past the end",
            container(&one(descriptor("U8", &[64], 0, 64)), &[0; 8]),
        ),
        (
            "unaligned tensor",
            container(
                &tensors(vec![
                    ("a", descriptor("U8", &[1], 0, 1)),
                    ("b", descriptor("U8", &[1], 1, 2)),
                ]),
                &[0; 2],
            ),
        ),
        (
            "overlap",
            container(
                &tensors(vec![
                    ("a", descriptor("U8", &[512], 0, 512)),
                    ("b", descriptor("U8", &[256], 256, 512)),
                ]),
                &[0; 512],
            ),
        ),
        ("trailing junk", {
            let mut b = golden().with_trailer(false).into_bytes().unwrap();
            b.extend_from_slice(b"junk");
            b
        }),
        ("truncated trailer", {
            let b = golden().into_bytes().unwrap();
            b[..b.len() - 1].to_vec()
        }),
    ];
    let mut report = String::new();
    for (name, bytes) in cases {
        let err = Reader::from_bytes(bytes).unwrap_err();
        report += &format!("{name}: [{:?}] {err}\n", err.kind());
    }
    insta::assert_snapshot!("corrupt_input_messages", report);
}

#[test]
fn duplicate_keys_are_rejected_strictly_and_last_wins_leniently() {
    let meta = tensors(vec![
        ("t", descriptor("U8", &[1], 0, 1)),
        ("t", descriptor("U8", &[2], 256, 258)),
    ]);
    let mut data = vec![1u8];
    data.resize(256, 0);
    data.extend_from_slice(&[2, 3]);
    let bytes = container(&meta, &data);
    let err = Reader::from_bytes(bytes.clone()).unwrap_err();
    assert_eq!((err.kind(), err.tensor()), (ErrorKind::Corrupt, Some("t")));
    let reader = lenient(bytes).unwrap();
    assert_eq!(reader.read("t").unwrap(), vec![2, 3]);
}

#[test]
fn lenient_mode_reads_legacy_files() {
    // burn 0.19: data right after the metadata, no 256 alignment.
    let meta = cbor(&tensors(vec![("w", descriptor("U8", &[3], 0, 3))]));
    let mut legacy = Vec::new();
    legacy.extend_from_slice(&0x4255_524Eu32.to_le_bytes());
    legacy.extend_from_slice(&1u16.to_le_bytes());
    legacy.extend_from_slice(&(meta.len() as u32).to_le_bytes());
    legacy.extend_from_slice(&meta);
    legacy.extend_from_slice(&[7, 8, 9]);
    assert_eq!(kind(legacy.clone()), ErrorKind::Corrupt);
    assert_eq!(lenient(legacy).unwrap().read("w").unwrap(), vec![7, 8, 9]);

    // burn before 0.21 spelled bool tensors "Bool"; version 0 was accepted by burn.
    let mut old_bool = container(
        &tensors(vec![("m", descriptor("Bool", &[2], 0, 2))]),
        &[1, 0],
    );
    old_bool[4] = 0;
    assert_eq!(kind(old_bool.clone()), ErrorKind::Unsupported);
    let reader = lenient(old_bool).unwrap();
    assert_eq!(
        reader.tensor("m").unwrap().dtype(),
        &DType::Bool(BoolStore::Native)
    );
}

#[test]
fn metadata_length_limit() {
    let mut bytes = golden().into_bytes().unwrap();
    bytes[6..10].copy_from_slice(&((MAX_METADATA_LEN + 1) as u32).to_le_bytes());
    assert_eq!(kind(bytes.clone()), ErrorKind::LimitExceeded);
    bytes[6..10].copy_from_slice(&(MAX_METADATA_LEN as u32).to_le_bytes());
    assert_eq!(
        kind(bytes),
        ErrorKind::Corrupt,
        "at the limit: only too short"
    );
}

#[test]
fn tensor_count_limit() {
    let entries = |n: usize| {
        let mut m: Vec<(Value, Value)> = Vec::with_capacity(n);
        for i in 0..n {
            m.push((text(&format!("{i}")), descriptor("U8", &[0], 0, 0)));
        }
        Value::Map(vec![(text("tensors"), Value::Map(m))])
    };
    assert!(Reader::from_bytes(container(&entries(MAX_TENSOR_COUNT), &[])).is_ok());
    assert_eq!(
        kind(container(&entries(MAX_TENSOR_COUNT + 1), &[])),
        ErrorKind::LimitExceeded
    );

    let tensors = |n: usize| {
        (0..n)
            .map(|i| Tensor::new(format!("{i}"), DType::U8, [0], vec![]))
            .collect()
    };
    assert!(Writer::new(tensors(MAX_TENSOR_COUNT)).size().is_ok());
    let err = Writer::new(tensors(MAX_TENSOR_COUNT + 1))
        .size()
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::LimitExceeded);
}

#[test]
fn metadata_and_scalar_entries_count_against_the_tensor_limit() {
    let entries = |n: usize, value: &dyn Fn() -> Value| {
        Value::Map((0..n).map(|i| (text(&format!("k{i}")), value())).collect())
    };
    for field in ["metadata", "scalars"] {
        let value: &dyn Fn() -> Value = if field == "metadata" {
            &|| text("")
        } else {
            &|| Value::Map(vec![(text("Bool"), Value::Bool(true))])
        };
        let at = |n| {
            Value::Map(vec![
                (text("tensors"), Value::Map(vec![])),
                (text(field), entries(n, value)),
            ])
        };
        assert!(
            Reader::from_bytes(container(&at(MAX_TENSOR_COUNT), &[])).is_ok(),
            "{field}"
        );
        assert_eq!(
            kind(container(&at(MAX_TENSOR_COUNT + 1), &[])),
            ErrorKind::LimitExceeded,
            "{field}"
        );
    }
    // A zero dimension makes a tensor empty however large the others are.
    assert_eq!(
        DType::F32.byte_len(&[1 << 40, 1 << 40, 0]),
        ByteLen::Exact(0)
    );
}

#[test]
fn tensor_length_limit() {
    // Claimed in a small container: the limit is checked before the range.
    let at = |len: u64| {
        container(
            &tensors(vec![("t", descriptor("U8", &[len], 0, len))]),
            &[0; 16],
        )
    };
    assert_eq!(kind(at(MAX_TENSOR_LEN + 1)), ErrorKind::LimitExceeded);
    assert_eq!(
        kind(at(MAX_TENSOR_LEN)),
        ErrorKind::Corrupt,
        "at the limit: only out of range"
    );

    let deferred = |len: u64| {
        Writer::new(vec![Tensor::deferred("t", DType::U8, [len], len, || {
            unreachable!("never produced")
        })])
    };
    assert!(deferred(MAX_TENSOR_LEN).size().is_ok());
    assert_eq!(
        deferred(MAX_TENSOR_LEN + 1).size().unwrap_err().kind(),
        ErrorKind::LimitExceeded
    );
}

#[test]
fn cbor_depth_limit() {
    // Nesting inside an unknown field, which the reader skips.
    let nested = |depth: usize| {
        let mut v = uint(0);
        for _ in 0..depth {
            v = Value::Array(vec![v]);
        }
        Value::Map(vec![
            (text("tensors"), Value::Map(vec![])),
            (text("extra"), v),
        ])
    };
    // The unknown field's value sits one level below the top-level map.
    assert!(Reader::from_bytes(container(&nested(MAX_CBOR_DEPTH - 2), &[])).is_ok());
    assert_eq!(
        kind(container(&nested(MAX_CBOR_DEPTH - 1), &[])),
        ErrorKind::LimitExceeded
    );
    // Far deeper than any stack could recurse, in a hundred kilobytes: refused, no overflow.
    let mut deep = vec![0xa2, 0x67];
    deep.extend_from_slice(b"tensors");
    deep.extend_from_slice(&[0xa0, 0x65]);
    deep.extend_from_slice(b"extra");
    deep.extend(std::iter::repeat_n(0x81, 100_000));
    deep.push(0);
    assert_eq!(kind(container_raw(&deep, &[])), ErrorKind::LimitExceeded);
}

#[test]
fn tensor_rank_limit() {
    let at = |rank: usize| {
        container(
            &tensors(vec![("t", descriptor("U8", &vec![1; rank], 0, 1))]),
            &[0],
        )
    };
    assert!(Reader::from_bytes(at(MAX_TENSOR_RANK)).is_ok());
    assert_eq!(kind(at(MAX_TENSOR_RANK + 1)), ErrorKind::LimitExceeded);
    let writer =
        |rank: usize| Writer::new(vec![Tensor::new("t", DType::U8, vec![1; rank], vec![0])]);
    assert!(writer(MAX_TENSOR_RANK).size().is_ok());
    assert_eq!(
        writer(MAX_TENSOR_RANK + 1).size().unwrap_err().kind(),
        ErrorKind::LimitExceeded
    );
}

/// Opens `bytes`; when it opens, reads and verifies everything. Must never panic.
fn exercise(bytes: Vec<u8>) {
    for validation in [Validation::Strict, Validation::Lenient] {
        let source = Arc::new(weightbay::MemorySource::new(bytes.clone().into()));
        if let Ok(reader) =
            Reader::open_with(source, ReadOptions::default().with_validation(validation))
        {
            for info in reader.tensors() {
                let data = reader.read(info.name()).unwrap();
                assert_eq!(data.len() as u64, info.byte_len());
            }
            let _ = reader.verify();
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..600)) {
        exercise(bytes);
    }

    #[test]
    fn mutated_containers_never_panic(
        flips in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8),
        cut in any::<prop::sample::Index>(),
        truncate in any::<bool>(),
    ) {
        let mut bytes = golden().into_bytes().unwrap();
        for (at, value) in flips {
            let i = at.index(bytes.len());
            bytes[i] = value;
        }
        if truncate {
            let len = cut.index(bytes.len());
            bytes.truncate(len);
        }
        exercise(bytes);
    }

    /// Corrupting one byte of a tensor is always caught by verify, naming that tensor.
    #[test]
    fn any_tensor_byte_flip_fails_verify(at in any::<prop::sample::Index>(), bit in 0u8..8) {
        let bytes = golden().into_bytes().unwrap();
        let reader = Reader::from_bytes(bytes.clone()).unwrap();
        let spans: Vec<(String, std::ops::Range<u64>)> =
            reader.tensors().iter().map(|t| (t.name().to_string(), t.range())).collect();
        let total: u64 = spans.iter().map(|(_, r)| r.end - r.start).sum();
        let mut pick = at.index(total as usize) as u64;
        let (name, offset) = spans.iter().find_map(|(name, r)| {
            if pick < r.end - r.start { Some((name.clone(), r.start + pick)) } else { pick -= r.end - r.start; None }
        }).unwrap();
        let mut corrupted = bytes;
        corrupted[offset as usize] ^= 1 << bit;
        let err = Reader::from_bytes(corrupted).unwrap().verify().unwrap_err();
        prop_assert_eq!(err.tensor(), Some(name.as_str()));
    }
}

/// Batched loads and reads into caller memory give what single reads give.
#[test]
fn load_load_all_and_read_into_agree_with_read() {
    let storage = weightbay::MemoryStorage::new();
    Writer::new(vec![
        Tensor::from_slice("b", [3], &[1u16, 2, 3]),
        Tensor::from_slice("a", [2], &[7u64, 8]),
        Tensor::new("empty", DType::U8, [0], Vec::new()),
    ])
    .write_to(&storage, "m.bpk")
    .unwrap();
    let reader = Reader::open_key(&storage, "m.bpk").unwrap();
    let loaded = reader.load(&["a", "empty", "b", "a"]).unwrap();
    let expected: Vec<Vec<u8>> = ["a", "empty", "b", "a"]
        .iter()
        .map(|name| reader.read(name).unwrap())
        .collect();
    let loaded: Vec<Vec<u8>> = loaded.iter().map(|b| b.to_vec().unwrap()).collect();
    assert_eq!(loaded, expected);
    let names: Vec<&str> = reader
        .load_all()
        .unwrap()
        .iter()
        .map(|(info, _)| info.name())
        .collect();
    assert_eq!(names, ["b", "a", "empty"], "data order");
    let mut buf = vec![0u8; 16];
    reader.read_into("a", &mut buf).unwrap();
    assert_eq!(buf, reader.read("a").unwrap());
    let err = reader.read_into("a", &mut [0u8; 3]).unwrap_err();
    assert_eq!(
        (err.kind(), err.tensor()),
        (ErrorKind::InvalidInput, Some("a"))
    );
    let err = reader.load(&["a", "missing"]).unwrap_err();
    assert_eq!(
        (err.kind(), err.tensor()),
        (ErrorKind::NotFound, Some("missing"))
    );
}

/// Pinned host memory as a GPU runtime would lend it: its own allocation, written in place.
#[derive(Debug)]
struct PinnedStaging(Vec<u8>);

impl weightbay::AllocationController for PinnedStaging {
    fn len(&self) -> usize {
        self.0.len()
    }
    fn alignment(&self) -> usize {
        1
    }
    fn property(&self) -> weightbay::AllocationProperty {
        weightbay::AllocationProperty::Pinned
    }
    fn memory(&self, _: weightbay::AccessPolicy) -> weightbay::Result<&[u8]> {
        Ok(&self.0)
    }
    fn memory_mut(&mut self) -> Option<&mut [u8]> {
        Some(&mut self.0)
    }
}

/// Device memory: nothing the host can write.
#[derive(Debug)]
struct DeviceOnly;

impl weightbay::AllocationController for DeviceOnly {
    fn len(&self) -> usize {
        16
    }
    fn alignment(&self) -> usize {
        256
    }
    fn property(&self) -> weightbay::AllocationProperty {
        weightbay::AllocationProperty::Device
    }
    fn memory(&self, _: weightbay::AccessPolicy) -> weightbay::Result<&[u8]> {
        Err(weightbay::Error::unsupported("device memory"))
    }
}

#[test]
fn read_into_allocation_writes_the_callers_memory_in_place() {
    let reader = Reader::from_bytes(
        Writer::new(vec![Tensor::new(
            "a",
            DType::U8,
            [16],
            (0..16).collect::<Vec<u8>>(),
        )])
        .into_bytes()
        .unwrap(),
    )
    .unwrap();
    let mut pinned = PinnedStaging(vec![0; 16]);
    let address = pinned.0.as_ptr();
    reader.read_into_allocation("a", &mut pinned).unwrap();
    assert_eq!(pinned.0, (0..16).collect::<Vec<u8>>());
    assert_eq!(pinned.0.as_ptr(), address, "in place");
    let err = reader
        .read_into_allocation("a", &mut DeviceOnly)
        .unwrap_err();
    assert_eq!(
        (err.kind(), err.tensor()),
        (ErrorKind::InvalidInput, Some("a"))
    );
    assert!(err.to_string().contains("Device"), "{err}");
}

/// Many tensors into caller buffers, checked before anything is read, on one thread or several.
#[test]
fn read_many_into_fills_every_buffer() {
    let storage = weightbay::MemoryStorage::new();
    // Over the 4 MiB from which reads are spread over threads.
    let tensors: Vec<Tensor> = (0..8u8)
        .map(|i| Tensor::new(format!("t{i}"), DType::U8, [1 << 20], vec![i; 1 << 20]))
        .collect();
    Writer::new(tensors).write_to(&storage, "m.bpk").unwrap();
    let reader = Reader::open_key(&storage, "m.bpk").unwrap();
    let names: Vec<String> = (0..8).map(|i| format!("t{i}")).collect();
    let mut buffers = vec![vec![0xffu8; 1 << 20]; 8];
    let mut targets: Vec<(&str, &mut [u8])> = names
        .iter()
        .zip(buffers.iter_mut())
        .map(|(name, buf)| (name.as_str(), buf.as_mut_slice()))
        .collect();
    reader.read_many_into(&mut targets).unwrap();
    for (i, buf) in buffers.iter().enumerate() {
        assert!(buf.iter().all(|&b| b == i as u8), "t{i}");
    }
    let mut short = [0u8; 10];
    let mut whole = vec![0u8; 1 << 20];
    let err = reader
        .read_many_into(&mut [("t0", &mut whole), ("t1", &mut short)])
        .unwrap_err();
    assert_eq!(
        (err.kind(), err.tensor()),
        (ErrorKind::InvalidInput, Some("t1"))
    );
    assert!(
        whole.iter().all(|&b| b == 0),
        "nothing is read before every target is checked"
    );
}
