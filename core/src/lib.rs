//! weightbay: the storage layer for model checkpoints.
//!
//! A container format byte-compatible with Burnpack v1 (burn's `burn-pack`), with an optional
//! CRC32C integrity trailer, and a safetensors codec beside it ([`format`](mod@format)); a
//! streaming [`Writer`] that plans the layout first and never holds a whole checkpoint; a
//! validating [`Reader`] that treats every file as untrusted; and the small traits storages plug
//! into ([`Storage`], [`Sink`], [`Source`]), with [`MemoryStorage`] as the reference. Local files,
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
//! Runtimes ask for weights through [`WeightSource`]; checkpoints split in shards are written by
//! [`ShardedWriter`] and read by [`ShardedWeights`]. The checkpoints of a training run (commit
//! records, background and multi-rank saves, retention) are the `weightbay-checkpoints` crate,
//! built over this one.
//!
//! Every public item has one path: the crate root for what users save and load with, and four
//! namespaces: [`format`](mod@format) for the containers' constants and hardening limits,
//! [`checksum`] for CRC32C, [`codec`] for the encodings a stored piece may have, and
//! [`backend_kit`] for backend authors.

pub mod backend_kit;
mod background;
mod batched_reads;
mod bytes;
mod capabilities;
pub mod checksum;
pub mod codec;
mod copy;
mod dtype;
mod error;
pub mod format;
mod forward;
mod fs;
mod keys;
mod lazy;
mod memory;
mod options;
mod prefetch;
mod ranges;
mod reader;
mod sharded;
mod staging;
mod storage;
mod storage_ext;
mod tensor;
mod weights;
mod writer;

pub use background::Background;
pub use bytes::{
    AccessPolicy, AllocationController, AllocationProperty, Bytes, RetainedHostMemoryRegion,
    SharedBytes,
};
pub use capabilities::Capabilities;
pub use dtype::{BoolStore, ByteLen, DType, Element, QuantScheme, Scalar};
pub use error::{BoxError, Error, ErrorKind, Result};
pub use format::types::{Format, Limits, ReadOptions, TensorInfo, Validation};
pub use memory::{MemorySource, MemoryStorage};
pub use options::{CreateOptions, Durability, WriteMode};
pub use prefetch::{PrefetchPlan, Prefetched};
pub use reader::{Loaded, Reader, VerifyReport, retry_on_change};
pub use sharded::{
    SHARD_CHECKSUMS_KEY, ShardChecksum, ShardedSummary, ShardedWeights, ShardedWriter,
};
pub use staging::{Staged, StagedSegment, StagingPool};
pub use storage::{
    ForeignEntry, Listed, PendingWrite, PositionedWrite, ReadBack, Sink, Source, Storage,
};
pub use storage_ext::StorageExt;
pub use tensor::Tensor;
pub use weights::{
    StoredTensor, TensorAllocator, WeightComponentPayload, WeightComponentSpec, WeightEncoding,
    WeightSegment, WeightSource,
};
pub use writer::{WRITE_CHUNK_LEN, WriteSummary, Writer};
