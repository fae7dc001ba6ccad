//! What `--load-file` runs for `python/bench/load_vs_safetensors.py`: the load that the Python
//! package's `weightbay.load` makes, made from Rust, so that the script pairs the two in one
//! run and their ratio is the binding's own cost.

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use weightbay::{AccessPolicy, Error, Reader, Result};
use weightbay_local::LocalStorage;
use weightbay_mmap::{Prefetch, map_file_private};

/// The stride at which the script reads the torch tensors: one byte a page.
const PAGE: usize = 4096;

/// `runs` times: opens the container at `path` as a Rust program would (mapped, as
/// `weightbay.load` maps a local file, or with each tensor landed in memory of its own by
/// `Reader::load_all`, as `weightbay.load(..., mmap=False)` lands it), reads one byte of every
/// page of every tensor, as the script does of the torch tensors, and prints the seconds
/// that took.
pub(crate) fn run(path: &Path, mapped: bool, runs: usize) -> Result<()> {
    let (Some(dir), Some(name)) = (path.parent(), path.file_name().and_then(|n| n.to_str())) else {
        return Err(Error::invalid(format!("{} names no file", path.display())));
    };
    for _ in 0..runs {
        let started = Instant::now();
        let mut sum = 0u64;
        if mapped {
            let reader = Reader::open(Arc::new(map_file_private(path, Prefetch::Sequential)?))?;
            for info in reader.tensors() {
                let bytes = reader.bytes(info.name())?;
                sum += pages(bytes.read(AccessPolicy::ZeroCopy)?);
            }
        } else {
            let reader = Reader::open_key(&LocalStorage::new(dir), name)?;
            for (_, bytes) in reader.load_all()? {
                sum += pages(bytes.read(AccessPolicy::ZeroCopy)?);
            }
        }
        std::hint::black_box(sum);
        println!("{:.3}", started.elapsed().as_secs_f64());
    }
    Ok(())
}

/// The sum of one byte of every page of `data`.
fn pages(data: &[u8]) -> u64 {
    data.iter().step_by(PAGE).map(|&b| u64::from(b)).sum()
}
