//! burn modules save to and load from any weightbay storage: local files, memory maps, `s3://`,
//! `gs://`, `memory://`, as Burnpack (byte for byte what burn's own `BurnpackStore` writes) or
//! safetensors.
//!
//! [`WeightbayStore`] is a burn-store `ModuleStore`, so `module.save_into(&mut store)` and
//! `module.load_from(&mut store)` work as with burn's stores. Saving streams: every parameter
//! is a deferred tensor, read back from its device only when the writer reaches it and dropped
//! before the next, so a save holds about one tensor beyond the model. Loading reads ahead of
//! burn as it applies the tensors ([`weightbay::Prefetched`], within 256 MiB or an object
//! store's fetch budget), so the reads (round trips, copies out of the page cache) overlap
//! burn's own work. A module saves as a checkpoint of `weightbay-checkpoints`, with any of
//! its save options (compressed, incremental), through [`WeightbayStore::writer_of`], and
//! loads from one through [`WeightbayStore::from_reader`].
//!
//! ```
//! use std::sync::Arc;
//! use burn_store::{ModuleSnapshot, ModuleStore};
//! use weightbay::MemoryStorage;
//! use weightbay_burn::WeightbayStore;
//!
//! let device = Default::default();
//! let model = burn_nn::LinearConfig::new(4, 2).init(&device);
//! let storage = Arc::new(MemoryStorage::new());
//! model.save_into(&mut WeightbayStore::new(storage.clone(), "linear.bpk"))?;
//!
//! let mut fresh = burn_nn::LinearConfig::new(4, 2).init(&device);
//! let result = fresh.load_from(&mut WeightbayStore::new(storage, "linear.bpk"))?;
//! assert!(result.is_success());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod dtype;
#[cfg(feature = "store")]
mod store;

pub use dtype::{to_burn_dtype, to_burn_pack_tensor, to_burn_scalar, to_weightbay_dtype};
#[cfg(feature = "store")]
pub use store::WeightbayStore;
