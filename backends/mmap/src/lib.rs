//! Memory-mapped reads for weightbay.
//!
//! [`MmapStorage`] saves through the local backend's durable atomic path and opens containers
//! as shared read-only memory maps ([`map_file`], a [`MemorySource`] over the map):
//! [`Source::bytes`] hands out zero-copy [`Bytes`](weightbay::Bytes) (property
//! [`AllocationProperty::Mmap`]) that keep the map alive, so tensor bytes outlive the source
//! and the reader that produced them.
//!
//! # The SIGBUS hazard
//! A mapped file that another process truncates makes any later access to the lost pages raise
//! SIGBUS, which kills the process; no Rust code can turn it into an error. Saves through
//! weightbay replace files by rename (a new inode), which a live map never sees, and this
//! storage refuses in-place writes for that reason. For files other programs may rewrite in
//! place, or on shared and network file systems, read through `weightbay_local::LocalStorage`
//! instead: its pread source turns a truncation into an error.
//!
//! ```
//! use weightbay::{AccessPolicy, AllocationProperty, DType, Reader, Storage, Tensor, Writer};
//! use weightbay_mmap::MmapStorage;
//!
//! let dir = tempfile::tempdir()?;
//! let storage = MmapStorage::new(dir.path());
//! Writer::new(vec![Tensor::new("w", DType::U8, [4], vec![1, 2, 3, 4])]).write_to(&storage, "m.bpk")?;
//! let bytes = Reader::open(storage.open("m.bpk")?)?.bytes("w")?; // the reader is dropped here
//! assert_eq!(bytes.property(), AllocationProperty::Mmap);
//! assert_eq!(bytes.read(AccessPolicy::ZeroCopy)?, &[1, 2, 3, 4]);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use memmap2::{Advice, Mmap, MmapOptions};
use weightbay::backend_kit::validate_key;
use weightbay::{
    AllocationProperty, Capabilities, CreateOptions, Error, MemorySource, Result, Sink, Source,
    Storage,
};
use weightbay_local::LocalStorage;

/// How a map is prepared when it is opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Prefetch {
    /// Let the kernel page in on demand (the default).
    #[default]
    OnDemand,
    /// Tell the kernel the whole file will be read front to back soon (`MADV_WILLNEED` and
    /// `MADV_SEQUENTIAL`): the cheap choice for loading every tensor.
    Sequential,
}

/// Local files, read through shared memory maps and written through [`LocalStorage`].
#[derive(Debug, Clone)]
pub struct MmapStorage {
    local: LocalStorage,
    prefetch: Prefetch,
}

impl MmapStorage {
    /// Files under `root`.
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self::over(LocalStorage::new(root))
    }

    /// Files written through `local` (for example a local storage over a file system of the
    /// caller's) and mapped from its root.
    pub fn over(local: LocalStorage) -> Self {
        Self {
            local,
            prefetch: Prefetch::OnDemand,
        }
    }

    /// Sets how maps are prepared on open.
    #[must_use]
    pub fn with_prefetch(mut self, prefetch: Prefetch) -> Self {
        self.prefetch = prefetch;
        self
    }

    /// The local storage that does the writing.
    pub fn local(&self) -> &LocalStorage {
        &self.local
    }

    /// Maps the container at `key`.
    ///
    /// # Errors
    /// [`NotFound`](weightbay::ErrorKind::NotFound); the operating system's error.
    pub fn open_mmap(&self, key: &str) -> Result<MemorySource> {
        validate_key(key)?;
        map_file(&self.local.root().join(key), self.prefetch).map_err(|e| e.with_key(key))
    }
}

impl Storage for MmapStorage {
    fn capabilities(&self) -> Capabilities {
        let mut capabilities = self.local.capabilities().with_zero_copy_reads();
        // Writing a mapped file in place could truncate it under a live map (SIGBUS).
        capabilities.in_place_writes = false;
        capabilities
    }

    fn create(&self, key: &str, options: &CreateOptions) -> Result<Box<dyn Sink>> {
        self.capabilities().check(options)?;
        self.local.create(key, options)
    }

    fn open(&self, key: &str) -> Result<Arc<dyn Source>> {
        Ok(Arc::new(self.open_mmap(key)?))
    }
    weightbay::forward_storage!(local => delete, pending, clean_pending, list, list_foreign);
}

/// Maps the file at `path`, shared and read-only: a source whose views (property
/// [`AllocationProperty::Mmap`]) share the map, which is unmapped when the last of them is
/// dropped.
///
/// # Errors
/// [`NotFound`](weightbay::ErrorKind::NotFound); the operating system's error.
pub fn map_file(path: &Path, prefetch: Prefetch) -> Result<MemorySource> {
    let file = open_file(path)?;
    // SAFETY: the map is shared and read-only, over an inode that weightbay never modifies in
    // place (its saves replace files by rename, and this storage refuses in-place writes).
    // Another program truncating the file could still raise SIGBUS; the crate docs state the
    // hazard.
    let map = unsafe { Mmap::map(&file) }.map_err(|e| mapping_failed(path, e))?;
    prepare(map.len(), prefetch, |advice| map.advise(advice));
    Ok(over_map(bytes::Bytes::from_owner(map)))
}

/// Maps the file at `path` privately, copy on write: the same page-cache pages as
/// [`map_file`] while they are only read, but a write through an address handed out (a tensor
/// a Python program changes in place) copies the page it touches for this process alone
/// instead of faulting, and never reaches the file.
///
/// # Errors
/// As [`map_file`].
pub fn map_file_private(path: &Path, prefetch: Prefetch) -> Result<MemorySource> {
    let file = open_file(path)?;
    // SAFETY: as in `map_file`: the file is never modified in place by weightbay; writes to
    // this private map stay in the process.
    let map = unsafe { MmapOptions::new().map_copy(&file) }.map_err(|e| mapping_failed(path, e))?;
    prepare(map.len(), prefetch, |advice| map.advise(advice));
    Ok(over_map(bytes::Bytes::from_owner(map)))
}

fn over_map(map: bytes::Bytes) -> MemorySource {
    MemorySource::with_property(map, AllocationProperty::Mmap)
}

fn open_file(path: &Path) -> Result<File> {
    File::open(path).map_err(|e| Error::io(format!("opening {}", path.display()), e))
}

fn mapping_failed(path: &Path, e: std::io::Error) -> Error {
    Error::io(format!("mapping {}", path.display()), e)
}

/// Advice is a hint: a kernel that ignores it changes nothing but speed.
fn prepare(len: usize, prefetch: Prefetch, advise: impl Fn(Advice) -> std::io::Result<()>) {
    if prefetch == Prefetch::Sequential && len > 0 {
        let _ = advise(Advice::Sequential);
        let _ = advise(Advice::WillNeed);
    }
}
