//! weightbay: the storage layer for model checkpoints.
//!
//! A container format byte-compatible with Burnpack v1 (burn's `burn-pack`), with an optional
//! CRC32C integrity trailer, and a safetensors codec beside it ([`format`](mod@format)); a streaming
//! [`Writer`] that plans the layout first and never holds a whole checkpoint; a validating
//! [`Reader`] that treats every file as untrusted; and the small traits storages plug into
//! ([`Storage`], [`Sink`], [`Source`]), with [`MemoryStorage`] as the reference. Local files,
//! memory maps and object stores are the `weightbay-local`, `weightbay-mmap` and
//! `weightbay-object-store` crates.
//!
//! ```
//! use weightbay::{MemoryStorage, Reader, Tensor, Writer};
//!
//! let storage = MemoryStorage::new();
//! Writer::new(vec![Tensor::from_slice("layer.weight", [2, 2], &[1.0f32, 2.0, 3.0, 4.0])])
//!     .with_scalar("step", 1000u64)
//!     .write_to(&storage, "checkpoints/step-1000.bpk")?;
//!
//! let reader = Reader::open_key(&storage, "checkpoints/step-1000.bpk")?;
//! assert_eq!(reader.read_as::<f32>("layer.weight")?, [1.0, 2.0, 3.0, 4.0]);
//! reader.verify()?; // every byte against the integrity trailer
//! # Ok::<(), weightbay::Error>(())
//! ```
//!
//! Runtimes ask for weights through [`WeightSource`]; checkpoints split in shards are
//! [`sharded`]; backend authors find the file-system seam their tests run on in [`fs`].
#![warn(missing_docs)]

/// The README's examples, compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
pub struct ReadmeDoctests;

pub mod background;
pub mod bytes;
pub mod checkpoints;
pub mod dtype;
pub mod error;
pub mod format;
pub mod fs;
pub mod memory;
pub mod reader;
pub mod sharded;
pub mod storage;
pub mod tensor;
pub mod weights;
pub mod writer;

pub use background::Background;
pub use bytes::{
    AccessPolicy, AllocationController, AllocationProperty, Bytes, RetainedHostMemoryRegion,
    SharedBytes,
};
pub use dtype::{BoolStore, ByteLen, DType, Element, QuantScheme, Scalar};
pub use error::{Error, ErrorKind, Result};
pub use format::Format;
pub use memory::{MemorySource, MemoryStorage};
pub use reader::{ReadOptions, Reader, TensorInfo, Validation, VerifyReport};
pub use storage::{
    Capabilities, CreateOptions, Durability, LazyRegion, Listed, Sink, Source, Storage, WriteMode,
};
pub use tensor::Tensor;
pub use weights::{WeightComponentPayload, WeightComponentSpec, WeightSource};
pub use writer::{WriteSummary, Writer};
