//! The checkpoints of a training run, under one prefix of any weightbay
//! [`Storage`](weightbay::Storage): saved in the foreground or the background, listed, found
//! (the newest complete one), opened, verified against checksums taken while they were
//! written, thinned out and cleaned up.
//!
//! # Layout and the commit point
//!
//! ```text
//! <prefix>/step-1000/commit.json                              the commit record, written last
//! <prefix>/step-1000/<save>/model.bpk                         one container, or
//! <prefix>/step-1000/<save>/model.safetensors.index.json      a sharded set (Hugging Face's
//! <prefix>/step-1000/<save>/model-…-00001-of-00002.safetensors  index and shard names)
//! ```
//!
//! Every save writes its containers in a directory of its own (`<save>` is a token no other
//! save uses, see [`unique_token`](weightbay::backend_kit::unique_token)), then the commit
//! record with create-new. **A checkpoint exists exactly when its commit record does**, and the
//! record names each container with its length and the CRC32C of its bytes, taken while they
//! streamed out, so a checkpoint whose containers went missing, were truncated or changed by
//! one bit is reported, never loaded as complete, in either format. Of two saves racing for one
//! step, exactly one record is created; the other save removes its containers and fails with
//! [`ErrorKind::AlreadyExists`](weightbay::ErrorKind::AlreadyExists). A save that dies leaves a
//! directory without a record, which [`Checkpoints::gc`] removes once a newer checkpoint is
//! complete.
//!
//! A job of many processes saves one step from every rank with [`Checkpoints::save_rank`]:
//! each rank's container and manifest, committed once by the rank that sees them all, with no
//! coordinator ([`RankSave`] has the protocol). [`Checkpoint::assembled`] loads it in any rank
//! layout, by [`Region`].
//!
//! ```
//! use weightbay_checkpoints::{Checkpoints, Retention};
//! use weightbay::{MemoryStorage, Tensor, Writer};
//!
//! let checkpoints = Checkpoints::new(MemoryStorage::new(), "run-1");
//! for step in [100, 200, 300] {
//!     let weights = vec![Tensor::from_slice("w", [2], &[step as f32, 1.0])];
//!     checkpoints.save(step, Writer::new(weights))?;
//! }
//! let latest = checkpoints.latest()?.expect("three were saved");
//! assert_eq!(latest.step(), 300);
//! assert_eq!(latest.reader()?.read_as::<f32>("w")?, [300.0, 1.0]);
//! latest.verify()?; // every container against the CRC32C in the commit record
//!
//! checkpoints.retain(&Retention::keep_last(2))?;
//! assert_eq!(checkpoints.steps()?, [200, 300]);
//! # Ok::<(), weightbay::Error>(())
//! ```
//!
//! With [`SaveOptions::incremental`], a save writes only the pieces (1 MiB chunks of tensors,
//! by XXH3-128 hash) an earlier checkpoint lacks, and its record refers to that checkpoint's
//! bytes for the rest; it reads like a full one, and [`Checkpoints::retain`] and
//! [`Checkpoints::gc`] never delete a byte a kept checkpoint or a save in progress refers to.
//!
//! [`Tiered`] puts two prefixes together: saves commit on a fast tier (a local disk) and are
//! promoted to a durable one (object storage) in the background, and a resumed run loads the
//! newest checkpoint either tier holds whole. [`Checkpoint::export`] writes any checkpoint in
//! the Hugging Face layout (`model-0000k-of-0000N.safetensors` and its index, written last).
//!
//! The crate is built over `weightbay`'s public API only. Its files are its own formats
//! (commit records and rank manifests, versioned JSON: docs/FORMAT.md), and each concern has a
//! module:
//!
//! - the value and what its modules share (`run`), the stored schema (`record`), where
//!   keys lie (`layout`);
//! - saving in the foreground (`save`) and the background (`background`), the saves in flight
//!   (`in_flight`), what a save learns of its containers as they stream (`committed_containers`);
//! - incremental saves (`incremental`, `content`) and their reads (`spliced`), their pieces
//!   encoded as the writer streams (`encoders`) and decoded into place when read (`decoded`);
//! - finding checkpoints (`listing`), retention and gc (`retention`), copies (`copy`, and with their pieces encoded
//!   `copy_compressed`), one
//!   checkpoint and its verification (`checkpoint`);
//! - rank saves (`ranks`) and their merge (`merge`), loading in any rank layout (`assembled`,
//!   `region`), requests made several at a time (`parallel`);
//! - tiers (`tiered`): the promotion policy (`promotion`), the queue and its worker
//!   (`promoter`), retention on both tiers (`tier_retention`), and a promotion that follows a
//!   save as it writes (`promotion_stream`, over what the two share: `following`);
//! - export to the Hugging Face layout (`export`): tensors read in pieces ahead of its writer
//!   (`tensors_ahead`), assembled from rank slices by range (`assembled_bytes`) and converted
//!   to another dtype as they are read (`converted`), each read whole only when asked
//!   (`whole_when_asked`).

/// The README's examples (which use this crate and `weightbay`), compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
pub struct ReadmeDoctests;

mod assembled;
mod assembled_bytes;
mod background;
mod checkpoint;
mod committed_containers;
mod content;
mod converted;
mod copy;
mod copy_compressed;
mod decoded;
mod encoders;
mod export;
mod following;
mod in_flight;
mod incremental;
mod layout;
mod listing;
mod merge;
mod parallel;
mod promoter;
mod promotion;
mod promotion_stream;
mod ranks;
mod record;
mod region;
mod retention;
mod run;
mod save;
mod spliced;
mod tensors_ahead;
mod tier_retention;
mod tiered;
mod whole_when_asked;

pub use assembled::AssembledWeights;
pub use background::SaveHandle;
pub use checkpoint::{Checkpoint, CheckpointReport};
pub use content::DEFAULT_CHUNK_LEN;
pub use export::{EXPORT_INDEX, ExportOptions, ExportSummary, export_tensors};
pub use incremental::Incremental;
pub use layout::{COMMIT_RECORD, RANKS_DIR};
pub use listing::{RankProgress, StepState, StepStatus};
pub use promotion::{Promotion, PromotionState};
pub use ranks::{FAILURE_RECORD_TIMEOUT, RankOutcome, RankSave, Rendezvous};
pub use record::{
    CommitRecord, ContainerRecord, Encoding, LogicalTensor, PieceRecord, Pieces, RankFailure,
    RankManifest, RankTensor, Region, SliceRecord,
};
pub use retention::{GcReport, PerTier, Retention};
pub use run::{Checkpoints, DEFAULT_REFERENCE_LEASE};
pub use save::SaveOptions;
pub use tiered::{Tiered, TieredStatus};
