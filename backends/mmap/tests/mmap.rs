//! Zero-copy bytes that outlive their source, and map preparation.

use weightbay::{AccessPolicy, AllocationProperty, DType, Reader, Storage, Tensor, Writer};
use weightbay_mmap::{MmapStorage, Prefetch};

#[test]
fn tensor_bytes_outlive_the_reader_and_survive_a_replacement() {
    let dir = tempfile::tempdir().unwrap();
    let storage = MmapStorage::new(dir.path()).with_prefetch(Prefetch::Sequential);
    let data: Vec<u8> = (0..=255).collect();
    Writer::new(vec![Tensor::new("w", DType::U8, [256], data.clone())])
        .write_to(&storage, "m.bpk")
        .unwrap();
    let reader = Reader::open(storage.open("m.bpk").unwrap()).unwrap();
    let bytes = reader.bytes("w").unwrap();
    let address = bytes.read(AccessPolicy::ZeroCopy).unwrap().as_ptr();
    drop(reader);
    // Replace the file: the live map keeps the old inode.
    Writer::new(vec![Tensor::new("w", DType::U8, [256], vec![0; 256])])
        .write_to(&storage, "m.bpk")
        .unwrap();
    let view = bytes.read(AccessPolicy::ZeroCopy).unwrap();
    assert_eq!(view.as_ptr(), address, "still the same mapped memory");
    assert_eq!(view, &data[..]);
    assert_eq!(bytes.property(), AllocationProperty::Mmap);
    assert!(
        bytes.alignment() >= 256,
        "tensors are 256-aligned in the file and the map is page-aligned"
    );
}

#[test]
fn in_place_writes_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let storage = MmapStorage::new(dir.path());
    let err = Writer::new(vec![])
        .with_mode(weightbay::WriteMode::InPlace)
        .write_to(&storage, "m.bpk")
        .unwrap_err();
    assert_eq!(err.kind(), weightbay::ErrorKind::Unsupported);
}

/// A component read through the mmap WeightSource carries a retained region: the same memory
/// as the validated bytes, still mapped after the source, reader and payload are dropped.
#[test]
fn retained_regions_outlive_source_reader_and_payload() {
    use weightbay::{WeightComponentSpec, WeightSource};
    let dir = tempfile::tempdir().unwrap();
    let storage = MmapStorage::new(dir.path());
    let data: Vec<u8> = (0..64).collect();
    Writer::new(vec![Tensor::new("w", DType::U8, [8, 8], data.clone())])
        .write_to(&storage, "m.bpk")
        .unwrap();
    let reader = Reader::open(storage.open("m.bpk").unwrap()).unwrap();
    let payload = reader
        .component(&WeightComponentSpec::dense("w", [8, 8], DType::U8))
        .unwrap()
        .unwrap();
    let region = payload.retained().expect("mapped bytes can be retained");
    assert_eq!(
        region.as_ptr(),
        payload.bytes.read(AccessPolicy::ZeroCopy).unwrap().as_ptr()
    );
    drop(payload);
    drop(reader);
    drop(storage);
    std::fs::remove_file(dir.path().join("m.bpk")).unwrap();
    assert_eq!(
        region.as_slice(),
        &data[..],
        "the map outlives everything that made it"
    );
}

/// A private map hands out the file's bytes; a write through their address (what a Python
/// program does to a tensor it loaded) changes this process's copy of the page, never the
/// file, and never faults.
#[test]
fn writes_through_a_private_map_stay_in_the_process() {
    use weightbay_mmap::{map_file, map_file_private};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("data");
    std::fs::write(&path, [7u8; 4096]).unwrap();
    let source = map_file_private(&path, Prefetch::Sequential).unwrap();
    let bytes = source.as_bytes();
    let view = bytes.read(AccessPolicy::ZeroCopy).unwrap();
    let address = view.as_ptr().cast_mut();
    // SAFETY: the map is private and writable (copy on write), 4096 bytes long, and nothing
    // else reads it while it is written.
    unsafe { address.add(10).write(9) };
    assert_eq!(bytes.read(AccessPolicy::ZeroCopy).unwrap()[10], 9);
    assert_eq!(
        std::fs::read(&path).unwrap(),
        [7u8; 4096],
        "the file is unchanged"
    );
    let shared = map_file(&path, Prefetch::OnDemand).unwrap();
    assert_eq!(shared.as_bytes().to_vec().unwrap()[10], 7);
}
