//! Local-file storage for weightbay.
//!
//! Saves are atomic and, by default, durable: bytes go to a scratch sibling
//! `<name>.<pid>-<n>.tmp`, which is fsynced, renamed over the destination (or hard-linked for
//! create-new), and the directory is fsynced. A failed or abandoned save removes its scratch
//! file and leaves the destination exactly as it was; `Storage::clean_pending` removes
//! the scratch files of writers that were killed. Sources keep the open file handle, so a file
//! replaced after open keeps reading the old bytes, and one truncated after open gives an
//! error, never a panic. docs/DURABILITY.md states what survives a process kill and a power
//! loss.
//!
//! ```
//! use weightbay::{DType, Reader, Storage, Tensor, Writer};
//! use weightbay_local::LocalStorage;
//!
//! let dir = tempfile::tempdir()?;
//! let storage = LocalStorage::new(dir.path());
//! Writer::new(vec![Tensor::new("w", DType::U8, [3], vec![1, 2, 3])])
//!     .write_to(&storage, "checkpoints/step-1.bpk")?;
//! let reader = Reader::open(storage.open("checkpoints/step-1.bpk")?)?;
//! assert_eq!(reader.read("w")?, vec![1, 2, 3]);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod atomic_sink;
mod file_writes;
mod in_place_sink;
mod scratch;
mod source;
mod std_fs;
mod storage;

pub use std_fs::StdFileSystem;
pub use storage::LocalStorage;
