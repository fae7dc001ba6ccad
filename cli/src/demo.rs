//! `weightbay demo`: the main job on embedded defaults. A synthetic checkpoint streams to a
//! local file (durable, atomic) and to an in-process object store (multipart), is read back
//! through an mmap and ranged GETs, and verified; every step reports its speed.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use weightbay::{AccessPolicy, Bytes, DType, Reader, Result, Storage, Tensor, Writer};
use weightbay_mmap::{MmapStorage, Prefetch};
use weightbay_object_store::ObjectStorage;

const TENSOR_MIB: u64 = 16;

/// Deferred tensors of 16 MiB, produced one at a time, as a training loop would hand them over.
fn checkpoint(size_mib: u64) -> Writer {
    let count = size_mib.div_ceil(TENSOR_MIB).max(1);
    let tensors = (0..count)
        .map(|i| {
            let len = TENSOR_MIB << 20;
            Tensor::deferred(
                format!("layers.{i}.weight"),
                DType::F32,
                [len / 4],
                len,
                move || {
                    Ok(Bytes::from(vec![
                        (i % 251) as u8;
                        usize::try_from(len).unwrap_or(0)
                    ]))
                },
            )
        })
        .collect();
    Writer::new(tensors)
        .with_metadata("producer", "weightbay demo")
        .with_scalar("step", 1000u64)
}

fn rate(bytes: u64, start: Instant) -> String {
    let seconds = start.elapsed().as_secs_f64();
    format!(
        "{:.2} s, {:.0} MiB/s",
        seconds,
        bytes as f64 / (1 << 20) as f64 / seconds.max(1e-9)
    )
}

/// Reads every tensor back and checks its fill, then verifies every checksum.
fn read_back(reader: &Reader) -> Result<()> {
    for (i, info) in reader.tensors().iter().enumerate() {
        let bytes = reader.bytes(info.name())?;
        let expected = (info
            .name()
            .split('.')
            .nth(1)
            .and_then(|n| n.parse::<u64>().ok())
            .unwrap_or(i as u64)
            % 251) as u8;
        let memory = bytes.read(AccessPolicy::AllowCopy)?;
        if memory.iter().any(|&b| b != expected) {
            return Err(
                weightbay::Error::corrupt("read back other bytes than were written")
                    .with_tensor(info.name()),
            );
        }
    }
    Ok(())
}

pub(crate) fn run(size_mib: u64, dir: Option<PathBuf>) -> Result<()> {
    let temporary = match dir {
        Some(_) => None,
        None => Some(
            tempfile::tempdir()
                .map_err(|e| weightbay::Error::io("creating a temporary directory", e))?,
        ),
    };
    let dir = dir.unwrap_or_else(|| {
        temporary
            .as_ref()
            .map(|t| t.path().to_path_buf())
            .unwrap_or_default()
    });
    let total = checkpoint(size_mib).size()?;
    println!(
        "weightbay demo: a {} MiB checkpoint of {TENSOR_MIB} MiB tensors, each produced only when written",
        total >> 20
    );

    let local = MmapStorage::new(&dir).with_prefetch(Prefetch::Sequential);
    let start = Instant::now();
    checkpoint(size_mib).write_to(&local, "demo.bpk")?;
    println!(
        "  saved to {} (durable, atomic): {}",
        dir.join("demo.bpk").display(),
        rate(total, start)
    );
    let start = Instant::now();
    let reader = Reader::open(local.open("demo.bpk")?)?;
    read_back(&reader)?;
    println!(
        "  read back through an mmap, zero-copy: {}",
        rate(total, start)
    );
    let start = Instant::now();
    let report = reader.verify()?;
    println!(
        "  verified {} tensors against their CRC32C checksums: {}",
        report.tensors,
        rate(total, start)
    );

    let store = ObjectStorage::new(Arc::new(object_store::memory::InMemory::new()))?;
    let start = Instant::now();
    checkpoint(size_mib).write_to(&store, "checkpoints/demo.bpk")?;
    let parts = store.options().part_size_for(Some(total)) >> 20;
    println!(
        "  streamed to an in-memory object store as a multipart upload ({parts} MiB parts): {}",
        rate(total, start)
    );
    let start = Instant::now();
    let remote = Reader::open(store.open("checkpoints/demo.bpk")?)?;
    read_back(&remote)?;
    println!(
        "  read back with ranged GETs pinned to the object's version: {}",
        rate(total, start)
    );
    remote.verify()?;
    println!(
        "done: both copies verify. Inspect one with `weightbay inspect {}`",
        dir.join("demo.bpk").display()
    );
    if temporary.is_some() {
        println!(
            "(the local copy was in a temporary directory and is removed now; pass --dir to keep it)"
        );
    }
    Ok(())
}
