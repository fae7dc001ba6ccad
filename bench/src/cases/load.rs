//! Loads from local files: mapped, pread, cold from disk, and into caller memory.

use std::hint::black_box;
use std::io::Read;

use weightbay::{Format, Reader, Result, Storage, Writer};
use weightbay_mmap::MmapStorage;

use crate::context::{Bench, save_big};
use crate::harness::{Start, io, touch_all};
use crate::peers::{self, dd};

/// The large checkpoint as `big.bpk` and `big.safetensors`, for the load cases.
pub(crate) fn save_load_files(b: &Bench<'_>) -> Result<()> {
    save_big(&b.local, &b.big)?;
    Writer::new(b.big.ours())
        .with_format(Format::Safetensors)
        .write_to(&b.local, "big.safetensors")
        .map(drop)
}

pub(crate) fn mmap_load(b: &mut Bench<'_>) -> Result<()> {
    save_load_files(b)?;
    let dir = b.dir.clone();
    let mmap = MmapStorage::new(&dir);
    let safetensors_peer = || peers::safetensors_mmap_touch(&dir.join("big.safetensors"));
    b.table.compare(
        Start::Cached,
        "mmap open + touch every byte",
        b.big.bytes(),
        "safetensors crate over memmap2",
        || touch_all(&Reader::open(mmap.open("big.bpk")?)?, false),
        safetensors_peer,
    )?;
    b.table.compare(
        Start::Cached,
        "WeightSource components over mmap (safetensors)",
        b.big.bytes(),
        "safetensors crate over memmap2",
        || touch_all(&Reader::open(mmap.open("big.safetensors")?)?, true),
        safetensors_peer,
    )
}

pub(crate) fn pread(b: &mut Bench<'_>) -> Result<()> {
    save_load_files(b)?;
    let (local, dir) = (&b.local, &b.dir);
    b.table.compare(
        Start::Cached,
        "pread every tensor into fresh buffers",
        b.big.bytes(),
        "sequential read into fresh buffers",
        || {
            let reader = Reader::open(local.open("big.bpk")?)?;
            for info in reader.tensors() {
                black_box(reader.read(info.name())?);
            }
            Ok(())
        },
        || {
            let reader = Reader::open(local.open("big.bpk")?)?;
            let mut file = std::fs::File::open(dir.join("big.bpk")).map_err(io("opening"))?;
            let mut position = 0u64;
            let mut in_file_order: Vec<_> = reader.tensors().iter().collect();
            in_file_order.sort_by_key(|info| info.range().start);
            for info in in_file_order {
                let range = info.range();
                let mut skip = vec![0u8; (range.start.saturating_sub(position)) as usize];
                file.read_exact(&mut skip).map_err(io("reading"))?;
                let mut buf = vec![0u8; info.byte_len() as usize];
                file.read_exact(&mut buf).map_err(io("reading"))?;
                black_box(buf);
                position = range.end;
            }
            Ok(())
        },
    )
}

/// Every tensor of the 2 GiB file from a cold page cache through the public API (`load_all`,
/// parallel `pread`s into fresh buffers), against `dd` reading the file with `O_DIRECT`.
pub(crate) fn cold_load(b: &mut Bench<'_>) -> Result<()> {
    save_load_files(b)?;
    let (local, dir) = (&b.local, &b.dir);
    b.table.compare(
        Start::Emptied,
        "cold load: Reader::load_all from a local file",
        b.big.bytes(),
        "dd bs=64M iflag=direct",
        || {
            Reader::open_key(local, "big.bpk")?
                .load_all()
                .map(|all| drop(black_box(all)))
        },
        || {
            dd(&[
                &format!("if={}", dir.join("big.bpk").display()),
                "of=/dev/null",
                "bs=64M",
                "iflag=direct",
            ])
        },
    )
}

/// Every tensor of the page-cached file read into buffers the caller already owns and has
/// touched (`Reader::read_many_into`, which spreads the reads over up to 4 threads), against
/// memcpy of the same bytes into the same buffers (one thread).
pub(crate) fn into_caller_memory(b: &mut Bench<'_>) -> Result<()> {
    save_load_files(b)?;
    let reader = Reader::open_key(&b.local, "big.bpk")?;
    let names: Vec<&str> = reader.tensors().iter().map(|t| t.name()).collect();
    let resident: Vec<Vec<u8>> = names
        .iter()
        .map(|name| reader.read(name))
        .collect::<Result<_>>()?;
    // Touched once here, so neither side pays to fault them in.
    let buffers = std::cell::RefCell::new(
        resident
            .iter()
            .map(|data| vec![1u8; data.len()])
            .collect::<Vec<_>>(),
    );
    b.table.compare(
        Start::Cached,
        "Reader::read_many_into caller buffers (page cache)",
        b.big.bytes(),
        "memcpy into the same buffers",
        || {
            let mut buffers = buffers.borrow_mut();
            let mut targets: Vec<(&str, &mut [u8])> = names
                .iter()
                .zip(buffers.iter_mut())
                .map(|(name, buf)| (*name, buf.as_mut_slice()))
                .collect();
            reader.read_many_into(&mut targets)
        },
        || {
            for (data, buf) in resident.iter().zip(buffers.borrow_mut().iter_mut()) {
                buf.copy_from_slice(data);
            }
            black_box(&buffers);
            Ok(())
        },
    )
}
