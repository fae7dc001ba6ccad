//! The writer: streaming, bounded memory, failure atomicity, and its three outputs agreeing.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use weightbay::backend_kit::lazy_bytes;
use weightbay::{
    AllocationProperty, Bytes, DType, ErrorKind, MemorySource, MemoryStorage, Reader, Sink,
    Storage, Tensor, WriteMode, Writer,
};

type FreedLog = Arc<Mutex<Vec<usize>>>;

/// Bytes that record their index in a log when dropped.
struct Tracked {
    data: Vec<u8>,
    index: usize,
    freed: FreedLog,
}

impl AsRef<[u8]> for Tracked {
    fn as_ref(&self) -> &[u8] {
        &self.data
    }
}

impl Drop for Tracked {
    fn drop(&mut self) {
        self.freed.lock().unwrap().push(self.index);
    }
}

const COUNT: usize = 8;
const PAYLOAD: usize = 3000;

/// Deferred tensors whose providers assert that every earlier tensor's bytes are already freed.
fn tracked_tensors(freed: &FreedLog) -> Vec<Tensor> {
    (0..COUNT)
        .map(|index| {
            let freed = freed.clone();
            Tensor::deferred(
                format!("t{index}"),
                DType::U8,
                [PAYLOAD as u64],
                PAYLOAD as u64,
                move || {
                    let already = freed.lock().unwrap().clone();
                    assert_eq!(
                        already,
                        (0..index).collect::<Vec<_>>(),
                        "t{index} requested while earlier bytes were live"
                    );
                    let owner = Tracked {
                        data: vec![index as u8; PAYLOAD],
                        index,
                        freed: freed.clone(),
                    };
                    Ok(Bytes::from_shared(
                        bytes::Bytes::from_owner(owner),
                        AllocationProperty::Native,
                    ))
                },
            )
        })
        .collect()
}

#[test]
fn each_deferred_tensor_is_freed_before_the_next_is_produced() {
    type Write = fn(Writer) -> usize;
    let writes: [(&str, Write); 2] = [
        ("into_bytes", |w| w.into_bytes().unwrap().len()),
        ("write_to", |w| {
            w.write_to(&MemoryStorage::new(), "m.bpk").unwrap().len as usize
        }),
    ];
    for (name, write) in writes {
        let freed = FreedLog::default();
        let written = write(Writer::new(tracked_tensors(&freed)));
        assert_eq!(
            *freed.lock().unwrap(),
            (0..COUNT).collect::<Vec<_>>(),
            "{name}"
        );
        assert!(written >= COUNT * PAYLOAD, "{name}");
    }
}

/// Counts sink calls.
#[derive(Default)]
struct CountingSink {
    writes: usize,
    bytes: u64,
}

impl Sink for CountingSink {
    fn write(&mut self, data: &[u8]) -> weightbay::Result<()> {
        assert!(data.len() <= weightbay::WRITE_CHUNK_LEN);
        self.writes += 1;
        self.bytes += data.len() as u64;
        Ok(())
    }
    fn pad(&mut self, len: u64) -> weightbay::Result<()> {
        self.writes += 1;
        self.bytes += len;
        Ok(())
    }
    fn commit(self: Box<Self>) -> weightbay::Result<()> {
        Ok(())
    }
}

#[test]
fn small_tensors_are_batched_and_large_ones_chunked() {
    let tiny: Vec<Tensor> = (0..20_000)
        .map(|i| Tensor::new(format!("t{i:05}"), DType::U8, [4], vec![1, 2, 3, 4]))
        .collect();
    let writer = Writer::new(tiny);
    let size = writer.size().unwrap();
    let mut sink = CountingSink::default();
    writer.write_to_sink(&mut sink).unwrap();
    assert_eq!(sink.bytes, size);
    assert!(
        sink.writes < 10,
        "20,000 tiny tensors cost {} sink calls",
        sink.writes
    );

    let big = Tensor::new("big", DType::U8, [20 << 20], vec![7u8; 20 << 20]);
    let mut sink = CountingSink::default();
    Writer::new(vec![big]).write_to_sink(&mut sink).unwrap();
    assert!(
        (3..=6).contains(&sink.writes),
        "{} calls for 20 MiB",
        sink.writes
    );
}

#[test]
fn all_outputs_agree() {
    let make = || {
        Writer::new(vec![
            Tensor::new("a", DType::F32, [3], vec![1u8; 12]),
            Tensor::new("b", DType::I64, [2, 2], vec![2u8; 32]),
            Tensor::new("c", DType::U8, [0], vec![]),
        ])
        .with_metadata("k", "v")
    };
    let bytes = make().into_bytes().unwrap();
    assert_eq!(make().size().unwrap(), bytes.len() as u64);
    let mut buf = vec![0xAA; bytes.len() + 10];
    assert_eq!(make().write_into(&mut buf).unwrap(), bytes.len() as u64);
    assert_eq!(&buf[..bytes.len()], &bytes[..]);
    let err = make().write_into(&mut buf[..bytes.len() - 1]).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidInput);
    let storage = MemoryStorage::new();
    make().write_to(&storage, "m.bpk").unwrap();
    let source = storage.open("m.bpk").unwrap();
    let mut stored = vec![0; source.len() as usize];
    source.read_at(0, &mut stored).unwrap();
    assert_eq!(stored, bytes);
}

#[test]
fn planning_errors_name_the_tensor_and_create_nothing() {
    let storage = MemoryStorage::new();
    let dup = Writer::new(vec![
        Tensor::new("x", DType::U8, [1], vec![1]),
        Tensor::new("x", DType::U8, [1], vec![2]),
    ]);
    let err = dup.write_to(&storage, "m.bpk").unwrap_err();
    assert_eq!(
        (err.kind(), err.tensor(), err.key()),
        (ErrorKind::InvalidInput, Some("x"), Some("m.bpk"))
    );
    let wrong = Writer::new(vec![Tensor::new("w", DType::F32, [2], vec![0; 7])]);
    let err = wrong.write_to(&storage, "m.bpk").unwrap_err();
    assert_eq!(
        (err.kind(), err.tensor()),
        (ErrorKind::InvalidInput, Some("w"))
    );
    assert!(err.to_string().contains("needs 8"), "{err}");
    assert_eq!(
        Writer::new(vec![])
            .with_alignment(100)
            .size()
            .unwrap_err()
            .kind(),
        ErrorKind::InvalidInput
    );
    assert!(storage.keys().is_empty());
    assert!(storage.pending("").unwrap().is_empty());
}

/// A failing provider, a wrong produced length and a panicking provider each leave the key
/// exactly as it was and no pending write.
#[test]
fn failed_writes_leave_the_old_container() {
    let storage = MemoryStorage::new();
    let old = Writer::new(vec![Tensor::new("w", DType::U8, [3], vec![1, 2, 3])]);
    old.write_to(&storage, "m.bpk").unwrap();
    let before = read_all(&storage);

    type ProviderFn = fn() -> weightbay::Result<Bytes>;
    let failing = |provider: ProviderFn| {
        Writer::new(vec![
            Tensor::new("ok", DType::U8, [1 << 20], vec![9; 1 << 20]),
            Tensor::deferred("bad", DType::U8, [4], 4, provider),
        ])
    };
    let cases: [(&str, ProviderFn, ErrorKind); 3] = [
        (
            "provider error",
            || {
                Err(weightbay::Error::new(
                    ErrorKind::Io,
                    "device readback failed",
                ))
            },
            ErrorKind::Io,
        ),
        (
            "wrong length",
            || Ok(Bytes::from(vec![0; 5])),
            ErrorKind::InvalidInput,
        ),
        ("panic", || panic!("boom"), ErrorKind::Provider),
    ];
    for (name, provider, kind) in cases {
        for mode in [WriteMode::Overwrite, WriteMode::CreateNew] {
            let err = failing(provider)
                .with_mode(mode)
                .write_to(&storage, "m.bpk")
                .unwrap_err();
            if mode == WriteMode::Overwrite {
                assert_eq!(
                    (err.kind(), err.tensor(), err.key()),
                    (kind, Some("bad"), Some("m.bpk")),
                    "{name}: {err}"
                );
            } else {
                assert_eq!(err.kind(), ErrorKind::AlreadyExists, "{name}");
            }
            assert_eq!(read_all(&storage), before, "{name}");
            assert!(storage.pending("").unwrap().is_empty(), "{name}");
        }
        let err = failing(provider)
            .with_mode(WriteMode::CreateNew)
            .write_to(&storage, "new.bpk")
            .unwrap_err();
        assert_eq!(err.kind(), kind, "{name}");
        assert_eq!(storage.keys(), ["m.bpk"], "{name}");
    }
}

fn read_all(storage: &MemoryStorage) -> Vec<u8> {
    let source = storage.open("m.bpk").unwrap();
    let mut out = vec![0; source.len() as usize];
    source.read_at(0, &mut out).unwrap();
    out
}

/// A source that counts bytes read, to show lazy bytes stream without materializing.
#[derive(Debug)]
struct Counting {
    inner: MemorySource,
    read: AtomicUsize,
}

impl weightbay::Source for Counting {
    fn len(&self) -> u64 {
        self.inner.len()
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> weightbay::Result<()> {
        self.read.fetch_add(buf.len(), Ordering::Relaxed);
        self.inner.read_at(offset, buf)
    }
}

#[test]
fn lazy_regions_stream_in_windows_and_copy_between_storages() {
    let big = vec![5u8; 20 << 20];
    let source = Arc::new(Counting {
        inner: MemorySource::new(big.clone().into()),
        read: AtomicUsize::new(0),
    });
    let bytes = lazy_bytes(
        source.clone(),
        0..big.len() as u64,
        AllocationProperty::File,
    )
    .unwrap();
    assert_eq!(
        source.read.load(Ordering::Relaxed),
        0,
        "nothing read before access"
    );
    let view = bytes.view(10, 20).unwrap();
    assert_eq!(view.to_vec().unwrap(), vec![5; 10]);
    assert_eq!(
        source.read.load(Ordering::Relaxed),
        10,
        "a view of a lazy region reads only itself"
    );
    assert_eq!(
        view.read(weightbay::AccessPolicy::ZeroCopy)
            .unwrap_err()
            .kind(),
        ErrorKind::WouldCopy
    );

    let mut sink = CountingSink::default();
    Writer::new(vec![Tensor::new("t", DType::U8, [big.len() as u64], bytes)])
        .write_to_sink(&mut sink)
        .unwrap();
    assert_eq!(source.read.load(Ordering::Relaxed), 10 + big.len());

    // Copy a container from one storage to another through `to_writer`.
    let from = MemoryStorage::new();
    Writer::new(vec![Tensor::new("t", DType::U8, [big.len() as u64], big)])
        .with_metadata("a", "b")
        .write_to(&from, "x.bpk")
        .unwrap();
    let reader = Reader::open(from.open("x.bpk").unwrap()).unwrap();
    let to = MemoryStorage::new();
    reader.to_writer().write_to(&to, "y.bpk").unwrap();
    assert_eq!(
        Reader::open(to.open("y.bpk").unwrap())
            .unwrap()
            .read("t")
            .unwrap(),
        reader.read("t").unwrap()
    );
}

/// A cancelled write stops before its next sink write with `Interrupted`, and the key keeps
/// what it held.
#[test]
fn a_cancelled_write_is_interrupted_and_leaves_the_key() {
    let storage = MemoryStorage::new();
    Writer::new(vec![Tensor::from_slice("w", [2], &[1u32, 2])])
        .write_to(&storage, "m.bpk")
        .unwrap();
    let cancel = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let trigger = Arc::clone(&cancel);
    let tensors = vec![
        Tensor::new("a", DType::U8, [1 << 20], vec![1u8; 1 << 20]),
        // Cancelled while the writer produces the second tensor, as Ctrl-C would.
        Tensor::deferred("b", DType::U8, [1 << 20], 1 << 20, move || {
            trigger.store(true, Ordering::SeqCst);
            Ok(Bytes::from(vec![2u8; 1 << 20]))
        }),
    ];
    let error = Writer::new(tensors)
        .with_cancel(cancel)
        .write_to(&storage, "m.bpk")
        .unwrap_err();
    assert_eq!(error.kind(), ErrorKind::Interrupted, "{error}");
    let reader = Reader::open_key(&storage, "m.bpk").unwrap();
    assert_eq!(reader.read_as::<u32>("w").unwrap(), [1, 2]);
}

/// Typed reads check the element type.
#[test]
fn typed_reads_check_the_dtype() {
    let storage = MemoryStorage::new();
    Writer::new(vec![
        Tensor::from_slice("f", [3], &[0.5f64, -1.0, 2.25]),
        Tensor::from_slice("i", [2], &[-7i16, 9]),
    ])
    .write_to(&storage, "m.bpk")
    .unwrap();
    let reader = Reader::open_key(&storage, "m.bpk").unwrap();
    assert_eq!(reader.tensor("f").unwrap().dtype(), &DType::F64);
    assert_eq!(reader.read_as::<f64>("f").unwrap(), [0.5, -1.0, 2.25]);
    assert_eq!(reader.read_as::<i16>("i").unwrap(), [-7, 9]);
    let error = reader.read_as::<f32>("f").unwrap_err();
    assert_eq!(error.kind(), ErrorKind::InvalidInput);
    assert_eq!(error.tensor(), Some("f"));
}

#[test]
fn tensor_ranges_are_where_the_tensors_land_and_known_crcs_go_into_the_trailer() {
    let tensors = vec![
        Tensor::new("a", DType::U8, [300], vec![1u8; 300]),
        Tensor::new("b", DType::U8, [5], vec![2u8; 5]),
    ];
    let writer = Writer::new(tensors.clone());
    let ranges = writer.tensor_ranges().unwrap();
    let bytes = writer.into_bytes().unwrap();
    let reader = Reader::from_bytes(bytes.clone()).unwrap();
    for (info, range) in reader.tensors().iter().zip(&ranges) {
        assert_eq!(info.range(), *range, "{}", info.name());
    }
    reader.verify().unwrap();
    // The right CRC32C, known: the same container. A wrong one: a container verify rejects.
    let right = weightbay::checksum::crc32c(&[1u8; 300]);
    let known = Writer::new(tensors.clone())
        .with_known_crc32c(0, right)
        .into_bytes()
        .unwrap();
    assert_eq!(known, bytes);
    let wrong = Writer::new(tensors)
        .with_known_crc32c(0, right ^ 1)
        .into_bytes()
        .unwrap();
    let error = Reader::from_bytes(wrong).unwrap().verify().unwrap_err();
    assert_eq!(error.kind(), ErrorKind::Corrupt, "{error}");
}
