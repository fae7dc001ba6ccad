//! The reader allocates in proportion to the bytes it was given (a small factor for the
//! index), never to what they claim.
//! A counting global allocator records the largest single allocation and the peak of live
//! bytes while hostile containers are opened. One test in its own binary, so nothing else
//! allocates meanwhile.

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use common::*;
use weightbay::{DType, Reader, Tensor, Writer};

struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);
static LARGEST: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards to the system allocator and only adds bookkeeping.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let live = LIVE.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
        PEAK.fetch_max(live, Ordering::Relaxed);
        LARGEST.fetch_max(layout.size(), Ordering::Relaxed);
        // SAFETY: same layout contract as the caller's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: `ptr` came from `alloc` with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Opens `bytes` and returns (largest single allocation, peak growth of live bytes).
fn measure(bytes: Vec<u8>) -> (usize, usize) {
    let shared = bytes::Bytes::from(bytes);
    let baseline = LIVE.load(Ordering::Relaxed);
    PEAK.store(baseline, Ordering::Relaxed);
    LARGEST.store(0, Ordering::Relaxed);
    let result = Reader::from_bytes(shared);
    drop(result);
    (
        LARGEST.load(Ordering::Relaxed),
        PEAK.load(Ordering::Relaxed) - baseline,
    )
}

fn header(metadata_len: u32) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(&0x4255_524Eu32.to_le_bytes());
    out.extend_from_slice(&1u16.to_le_bytes());
    out.extend_from_slice(&metadata_len.to_le_bytes());
    out
}

#[test]
fn hostile_claims_do_not_drive_allocation() {
    let mut cases: Vec<(&str, Vec<u8>)> = Vec::new();
    // Metadata length at the limit on a 20-byte input.
    let mut claim = header(100 * 1024 * 1024);
    claim.extend_from_slice(&[0xa1; 10]);
    cases.push(("metadata length", claim));
    // A tensors map claiming 2^60 entries, a shape claiming 2^40 dims, a 2^40-byte name.
    let map_claim = [
        &[0xa1, 0x67][..],
        b"tensors",
        &[0xbb, 0x10, 0, 0, 0, 0, 0, 0, 0],
    ]
    .concat();
    cases.push(("tensor count", container_raw(&map_claim, &[])));
    let shape_claim = [
        &[0xa1, 0x67][..],
        b"tensors",
        &[0xa1, 0x61, b't', 0xa2, 0x65],
        b"dtype",
        &[0x62],
        b"U8",
        &[0x65],
        b"shape",
        &[0x9b, 0, 0, 1, 0, 0, 0, 0, 0],
    ]
    .concat();
    cases.push(("shape rank", container_raw(&shape_claim, &[])));
    let text_claim = [
        &[0xa1, 0x67][..],
        b"tensors",
        &[0xa1, 0x7b, 0, 0, 1, 0, 0, 0, 0, 0],
    ]
    .concat();
    cases.push(("name length", container_raw(&text_claim, &[])));
    // A trailer footer claiming four billion checksums.
    let mut trailer_claim = Writer::new(vec![Tensor::new("t", DType::U8, [1], vec![1])])
        .with_trailer(false)
        .into_bytes()
        .unwrap();
    trailer_claim.extend_from_slice(&[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff]);
    trailer_claim.extend_from_slice(b"WBCRC32C");
    cases.push(("trailer count", trailer_claim));
    // Many small descriptors: the index grows with the input, by a bounded factor.
    let many: Vec<(&str, ciborium::Value)> = Vec::new();
    let names: Vec<String> = (0..20_000).map(|i| format!("{i}")).collect();
    let mut many = many;
    for name in &names {
        many.push((name.as_str(), descriptor("U8", &[0], 0, 0)));
    }
    cases.push(("20,000 descriptors", container(&tensors(many), &[])));

    for (name, bytes) in cases {
        let len = bytes.len();
        let (largest, peak) = measure(bytes);
        eprintln!("{name}: input {len} bytes, largest allocation {largest}, peak live {peak}");
        // The index costs a bounded multiple of the descriptors' encoded size (at least 34
        // bytes each), and nothing in proportion to what the bytes claim.
        assert!(
            largest <= 4 * len + 4096,
            "{name}: a {largest}-byte allocation for a {len}-byte input"
        );
        assert!(
            peak <= 8 * len + 64 * 1024,
            "{name}: {peak} live bytes for a {len}-byte input"
        );
    }
}
