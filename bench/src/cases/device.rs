//! A checkpoint staged into GPU memory: `Reader::stage` through a pool of pinned buffers from
//! the CUDA driver (the shape a CUDA runtime's own pool takes), each filled buffer copied to the
//! device asynchronously while the next ones are read. The file is in the page cache, so the
//! limits are this machine's: reading the same pieces into host buffers, and copying the same
//! bytes from pinned memory to the device, each measured alone in the same run; a pipeline
//! that overlaps the two can at best match the slower. Beside them, what a user gets today:
//! safetensors' `load_file(path, device="cuda:0")` under torch, in a process of its own, and
//! reading each tensor into pageable memory and copying it from there.
//!
//! Skipped where the CUDA driver is missing (every machine without an NVIDIA GPU).

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use weightbay::{
    AccessPolicy, AllocationController, DType, Error, ErrorKind, Format, Reader, Result, Staged,
    StagingPool, Tensor, Writer,
};

use crate::context::Bench;
use crate::cuda::{Cuda, DeviceMemory, Event};
use crate::harness::{Start, paired, python_peer, timed};
use crate::report::Row;

/// The pool: as many reads in flight as buffers, and at most half the buffers held by copies.
const BUFFERS: usize = 16;
const BUFFER_LEN: usize = 16 << 20;
/// Where each tensor starts in device memory: as the CUDA allocator aligns its blocks.
const DEVICE_ALIGNMENT: u64 = 256;
const KEY: &str = "device.safetensors";

/// The peer: safetensors' torch loader straight to the device, timed inside its own process
/// after CUDA is up (so neither side pays for starting CUDA), until the device has every byte.
const TORCH_PEER: &str = r#"
import sys, time
import torch
from safetensors.torch import load_file
torch.empty(1, device="cuda:0")
torch.cuda.synchronize()
start = time.perf_counter()
tensors = load_file(sys.argv[1], device="cuda:0")
torch.cuda.synchronize()
print(time.perf_counter() - start)
"#;

/// The bench's tensors, each byte a function of its tensor and position, so a byte that lands
/// in the wrong place on the device is found.
fn patterned(b: &Bench<'_>) -> Vec<Tensor> {
    b.big
        .tensors
        .iter()
        .enumerate()
        .map(|(i, (name, data))| {
            let mut bytes = vec![0u8; data.len()];
            for (j, word) in bytes.chunks_mut(8).enumerate() {
                let mut x = ((i as u64) << 40 | j as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
                x ^= x >> 29;
                // `chunks_mut(8)` makes every word 8 bytes or fewer.
                word.copy_from_slice(&x.to_le_bytes()[..word.len()]);
            }
            let len = bytes.len() as u64 / 4;
            Tensor::new(name, DType::F32, [len], weightbay::Bytes::from(bytes))
        })
        .collect()
}

/// Where each tensor lies in device memory, and the memory's length.
fn device_layout(reader: &Reader) -> (Vec<u64>, u64) {
    let mut at = 0;
    let offsets = reader
        .tensors()
        .iter()
        .map(|info| {
            let here = at;
            at = (at + info.byte_len()).div_ceil(DEVICE_ALIGNMENT) * DEVICE_ALIGNMENT;
            here
        })
        .collect();
    (offsets, at)
}

/// Every tensor through the pool onto the device: each filled buffer's segments are queued as
/// asynchronous copies, and the buffer goes back to the pool once the stream has passed them.
/// Buffers whose copies are done are given back at every arrival, and no more than half the
/// pool is held, so the reads always have buffers to fill (a consumer that holds them all
/// stops the load).
fn stage_to_device(
    cuda: &Arc<Cuda>,
    reader: &Reader,
    pool: &StagingPool,
    (memory, offsets): (&DeviceMemory, &[u64]),
) -> Result<()> {
    let names: Vec<&str> = reader.tensors().iter().map(|info| info.name()).collect();
    let mut copies: VecDeque<(Staged<'_>, Event)> = VecDeque::new();
    let staged = reader.stage(&names, pool, |staged| {
        for segment in staged.segments() {
            let from = staged
                .bytes()
                .get(segment.range.clone())
                .ok_or_else(|| Error::invalid("a staged segment lies past its buffer's bytes"))?;
            let start = offsets
                .get(segment.tensor)
                .ok_or_else(|| Error::invalid("a staged segment names no tensor of the load"))?;
            cuda.copy_async(memory, start + segment.tensor_offset, from)?;
        }
        let event = cuda.record()?;
        copies.push_back((staged, event));
        while let Some((_, oldest)) = copies.front() {
            if copies.len() > pool.count() / 2 {
                oldest.wait()?;
            } else if !oldest.done()? {
                break;
            }
            copies.pop_front();
        }
        Ok(())
    });
    // Whatever happened, no buffer goes back to the pool while a copy may still read it.
    let synchronized = cuda.synchronize();
    drop(copies);
    staged.and(synchronized)
}

/// The device's bytes, tensor by tensor, against the container's.
fn check_device_bytes(
    cuda: &Cuda,
    reader: &Reader,
    (memory, offsets): (&DeviceMemory, &[u64]),
) -> Result<()> {
    let mut expected = Vec::new();
    let mut landed = Vec::new();
    for (info, &at) in reader.tensors().iter().zip(offsets) {
        let len = info.byte_len() as usize;
        expected.resize(len, 0);
        landed.resize(len, 0);
        reader.read_into(info.name(), &mut expected)?;
        cuda.copy_back(memory, at, &mut landed)?;
        if let Some(first) = expected.iter().zip(&landed).position(|(a, b)| a != b) {
            return Err(Error::new(
                ErrorKind::Corrupt,
                format!(
                    "tensor {} differs on the device from byte {first} on",
                    info.name()
                ),
            ));
        }
    }
    Ok(())
}

/// The torch peer's own time for one load, or why it cannot run.
fn torch_peer(path: &std::path::Path) -> std::result::Result<Duration, String> {
    python_peer(TORCH_PEER, &[&path])?
        .trim()
        .parse::<f64>()
        .map(Duration::from_secs_f64)
        .map_err(|e| format!("the torch peer printed no time: {e}"))
}

pub(crate) fn device_cases(b: &mut Bench<'_>) -> Result<()> {
    let cuda = match Cuda::load() {
        Ok(cuda) => Arc::new(cuda),
        Err(why) => {
            println!("  staging into device memory: skipped: {why}");
            return Ok(());
        }
    };
    Writer::new(patterned(b))
        .with_format(Format::Safetensors)
        .write_to(&b.local, KEY)?;
    let reader = Reader::open_key(&b.local, KEY)?;
    let bytes: u64 = reader.tensors().iter().map(|info| info.byte_len()).sum();
    let (offsets, device_len) = device_layout(&reader);
    let memory = cuda.device_memory(device_len as usize)?;
    let target = (&memory, offsets.as_slice());
    let buffers = (0..BUFFERS)
        .map(|_| {
            cuda.pinned(BUFFER_LEN)
                .map(|buffer| Box::new(buffer) as Box<dyn AllocationController>)
        })
        .collect::<Result<Vec<_>>>()?;
    let pool = StagingPool::from_buffers(buffers)?;
    println!(
        "  staging into device memory: {} MiB in {} tensors onto {}, {BUFFERS} × {} MiB pinned buffers",
        bytes >> 20,
        offsets.len(),
        cuda.device_name(),
        BUFFER_LEN >> 20
    );
    stage_to_device(&cuda, &reader, &pool, target)?;
    check_device_bytes(&cuda, &reader, target)?;
    println!("    the device's bytes match the container's, tensor by tensor");

    // The limits, each alone: the same pieces read into host buffers of the same shape, and
    // the same bytes copied to the device from pinned buffers of the same length.
    let host_pool = StagingPool::new(BUFFERS, BUFFER_LEN)?;
    let copy_from = cuda.pinned(BUFFER_LEN)?;
    let names: Vec<&str> = reader.tensors().iter().map(|info| info.name()).collect();
    let case = format!(
        "staging into device memory ({BUFFERS} × {} MiB pinned)",
        BUFFER_LEN >> 20
    );
    let (mut reads, mut copies) = (Vec::new(), Vec::new());
    let (ours, limit) = paired(
        b.table.runs,
        Start::Cached,
        || timed(|| stage_to_device(&cuda, &reader, &pool, target)),
        || {
            let read = timed(|| reader.stage(&names, &host_pool, |_| Ok(())))?;
            let copy = timed(|| {
                let from = copy_from.memory(AccessPolicy::ZeroCopy)?;
                let mut at = 0;
                while at < bytes {
                    let len = BUFFER_LEN.min((bytes - at) as usize);
                    // `len` is at most BUFFER_LEN, the length of `from`.
                    cuda.copy_async(&memory, at, &from[..len])?;
                    at += len as u64;
                }
                cuda.synchronize()
            })?;
            reads.push(read);
            copies.push(copy);
            Ok(read.max(copy))
        },
    )?;
    println!(
        "    the limit's parts, seconds: read into host buffers {}; pinned copy to the device {}",
        crate::harness::seconds(&reads),
        crate::harness::seconds(&copies)
    );
    b.table.push(Row {
        case: case.clone(),
        ours,
        peer: Some(("read or pinned copy alone, the slower".into(), limit)),
        bytes,
    });

    // What a program without a pool does: each tensor read into pageable memory (reused, so
    // no fresh pages), then copied from there (the driver bounces it through a pinned buffer).
    let mut pageable = vec![0u8; BUFFER_LEN];
    b.table.compare(
        Start::Cached,
        &case,
        bytes,
        "read each tensor, copy from pageable memory",
        || stage_to_device(&cuda, &reader, &pool, target),
        || {
            for (info, &at) in reader.tensors().iter().zip(&offsets) {
                let len = info.byte_len() as usize;
                if pageable.len() < len {
                    pageable.resize(len, 0);
                }
                // Grown above to at least `len`.
                reader.read_into(info.name(), &mut pageable[..len])?;
                cuda.copy(&memory, at, &pageable[..len])?;
            }
            Ok(())
        },
    )?;

    let path = b.dir.join(KEY);
    match torch_peer(&path) {
        Err(why) => println!("    safetensors under torch: skipped: {why}"),
        Ok(_) => {
            let (ours, peer) = paired(
                b.table.runs,
                Start::Cached,
                || timed(|| stage_to_device(&cuda, &reader, &pool, target)),
                || torch_peer(&path).map_err(|why| Error::new(ErrorKind::Io, why)),
            )?;
            b.table.push(Row {
                case,
                ours,
                peer: Some((
                    "safetensors load_file(device=\"cuda:0\"), torch".into(),
                    peer,
                )),
                bytes,
            });
        }
    }
    std::fs::remove_file(&path).map_err(crate::harness::io("removing the device case's file"))
}
