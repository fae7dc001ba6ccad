//! Object-storage backend for weightbay, on the `object_store` crate: S3, GCS, Azure, local
//! files and memory behind one [`ObjectStorage`].
//!
//! Writing streams the container as one multipart upload, with the part size chosen from the
//! planned total so no object needs more than 10,000 parts and a bounded number of parts in
//! flight: memory stays at about part size × (parts in flight + 1), whatever the checkpoint's
//! size. Completing the upload is the atomic publish; an error, a panic or a dropped sink
//! aborts it. Containers smaller than one part go as a single PUT. Create-new is race-free
//! (see [`ObjectStorage`] and docs/DURABILITY.md for the protocol).
//!
//! Reading pins the object version (or ETag) seen at open, gets the header and metadata in the
//! same first request, and fetches tensors lazily or with [`ObjectSource::fetch`] in coalesced
//! parallel ranges.
//!
//! The core traits are synchronous; the backend runs `object_store`'s futures on a runtime of
//! its own (or one you lend it with [`Bridge::borrowed`]). From async code, save and load with
//! the `_in_background` calls, which run on a thread of their own and are awaited without
//! blocking any runtime thread (a `current_thread` runtime included):
//!
//! ```
//! use std::sync::Arc;
//! use weightbay::{DType, Reader, Tensor, Writer};
//! use weightbay_object_store::open_url;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let storage = Arc::new(open_url("memory:///checkpoints", std::iter::empty::<(&str, &str)>())?);
//! Writer::new(vec![Tensor::new("w", DType::U8, [3], vec![1, 2, 3])])
//!     .write_in_background(Arc::clone(&storage), "step-1.bpk")?
//!     .await?;
//! let reader = Reader::open_in_background(storage, "step-1.bpk")?.await?;
//! let loaded = reader.load_all_in_background()?.await?;
//! assert_eq!(loaded[0].0.name(), "w");
//! # Ok(())
//! # }
//! ```

#[cfg(feature = "aws")]
mod aws_profile;
mod error;
mod http_client;
mod journal;
mod landed;
mod listing_urls;
mod options;
mod pending;
mod raw_lister;
mod runtime;
mod sink;
mod source;
mod stall;
mod storage;
mod throttle;
mod url;

pub use http_client::http_connector;
pub use options::{MAX_PARTS, MIN_PART_SIZE, ObjectStoreOptions, STAGING_DIR, StallDetection};
pub use runtime::Bridge;
pub use source::ObjectSource;
pub use stall::{StallCounts, StallWatch};
pub use storage::ObjectStorage;
pub use throttle::{Throttle, ThrottleCounts};
pub use url::{open_url, open_url_with_retry};
