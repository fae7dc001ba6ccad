#![doc = include_str!("../../README.md")]

pub mod bytes;
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
    Capabilities, CreateOptions, Durability, LazyRegion, Sink, Source, Storage, WriteMode,
};
pub use tensor::Tensor;
pub use weights::{WeightComponentPayload, WeightComponentSpec, WeightSource};
pub use writer::{WriteSummary, Writer};
