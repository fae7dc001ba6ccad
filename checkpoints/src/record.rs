//! The checkpoint's own files, as stored: the commit record that makes a step a checkpoint,
//! the rank manifests it is merged from, and the [`Region`]s they name. Versioned JSON, read
//! with a size bound; nothing here touches the other modules of the crate, so the on-storage
//! schema reads in one place (docs/FORMAT.md describes the same fields).

use std::collections::BTreeMap;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use weightbay::{Error, ErrorKind, Result, Storage};

/// The version of the commit record's layout this code writes for a checkpoint without
/// [`Pieces`], and reads.
pub(crate) const RECORD_VERSION: u32 = 1;
/// The version of the commit record's layout this code writes for a checkpoint with
/// [`Pieces`] (an incremental save, or a full one that records content hashes), and reads.
pub(crate) const PIECES_RECORD_VERSION: u32 = 2;
/// The version of the commit record's layout this code writes for a checkpoint some of whose
/// pieces are stored encoded ([`Encoding`]), and reads: a reader of version 2 would take the
/// stored bytes for the piece's, so it must refuse the record instead.
pub(crate) const ENCODED_RECORD_VERSION: u32 = 3;
/// The version of a save's announcement of the containers it will refer to.
pub(crate) const ANNOUNCEMENT_VERSION: u32 = 1;
/// The version of the rank manifest's layout this code writes and reads.
pub(crate) const MANIFEST_VERSION: u32 = 1;
/// The version of the rank failure record's layout this code writes and reads.
pub(crate) const FAILURE_VERSION: u32 = 1;
/// The largest commit record or manifest read.
const MAX_RECORD_LEN: u64 = 16 * 1024 * 1024;

/// What [`CommitRecord::fingerprint`] returns: format, metadata, and each container's name,
/// length and CRC32C.
pub(crate) type Fingerprint<'a> = (
    &'a str,
    &'a BTreeMap<String, String>,
    Vec<(&'a str, u64, u32)>,
);

/// What a checkpoint's commit record says: written last, it is the checkpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct CommitRecord {
    /// The layout version of this record (1).
    pub weightbay_checkpoint: u32,
    /// The training step.
    pub step: u64,
    /// When the save committed, in milliseconds since the Unix epoch.
    pub time_unix_ms: u64,
    /// `burnpack` or `safetensors`.
    pub format: String,
    /// The caller's metadata (see
    /// [`SaveOptions::with_metadata`](crate::SaveOptions::with_metadata)).
    pub metadata: BTreeMap<String, String>,
    /// For a sharded set, the index's key relative to the step's directory.
    pub index: Option<String>,
    /// Every container, with its key relative to the step's directory.
    pub containers: Vec<ContainerRecord>,
    /// For a checkpoint written by several ranks
    /// ([`Checkpoints::save_rank`](crate::Checkpoints::save_rank)), how many.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub world_size: Option<u32>,
    /// For a checkpoint written by several ranks, every logical tensor and the slices that
    /// tile it.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub tensors: BTreeMap<String, LogicalTensor>,
    /// For a save with [`SaveOptions::incremental`](crate::SaveOptions::incremental) (record
    /// version 2): the checkpoint's one container as a reader sees it, piece by piece, each
    /// piece stored in this save's containers or in an earlier checkpoint's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pieces: Option<Pieces>,
}

impl CommitRecord {
    /// Whether the checkpoint reads as one container: an incremental or compressed save's
    /// pieces, or the one container of a save by one process; not a sharded set, nor the
    /// parts of several ranks.
    pub fn is_one_container(&self) -> bool {
        self.pieces.is_some()
            || (self.index.is_none() && self.world_size.is_none() && self.containers.len() == 1)
    }

    /// Whether any of its pieces is stored encoded (a compressed save or copy).
    pub fn is_encoded(&self) -> bool {
        self.pieces.as_ref().is_some_and(Pieces::is_encoded)
    }

    /// The keys, relative to the run's prefix, of the stored containers of other steps this
    /// checkpoint refers to, each with the bytes it refers to there.
    pub fn references(&self) -> BTreeMap<String, u64> {
        let own = format!("step-{}/", self.step);
        let mut references = BTreeMap::new();
        for piece in self.pieces.iter().flat_map(|p| &p.list) {
            if !piece.key.starts_with(&own) {
                // Lengths come from storage: a planted record's cannot overflow the sum.
                let bytes = references.entry(piece.key.clone()).or_default();
                *bytes = u64::saturating_add(*bytes, piece.stored_len());
            }
        }
        references
    }

    /// What the record says the checkpoint is, wherever its bytes are stored: its format and
    /// metadata, and for an incremental save its one container's name, length and CRC32C,
    /// otherwise each container's name within its save directory, length and CRC32C. A
    /// checkpoint and its copies ([`Checkpoints::copy_from`](crate::Checkpoints::copy_from))
    /// have the same.
    pub(crate) fn fingerprint(&self) -> Fingerprint<'_> {
        let containers = match &self.pieces {
            Some(pieces) => vec![(pieces.name.as_str(), pieces.len, pieces.crc32c)],
            None => self.containers_by_name(),
        };
        (self.format.as_str(), &self.metadata, containers)
    }

    /// Each container's name within its save directory, length and CRC32C.
    fn containers_by_name(&self) -> Vec<(&str, u64, u32)> {
        self.containers
            .iter()
            .map(|c| {
                let name = c
                    .key
                    .split_once('/')
                    .map_or(c.key.as_str(), |(_, rest)| rest);
                (name, c.len, c.crc32c)
            })
            .collect()
    }
}

/// A container recorded piece by piece: the header, then each tensor in chunks of at most
/// [`chunk_len`](Self::chunk_len) bytes (the last chunk of a tensor running on over the zero
/// padding to the next tensor), then the trailer. The container's bytes are the pieces' bytes
/// in order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Pieces {
    /// The name the container is read under (`model.bpk`, `model.safetensors`).
    pub name: String,
    /// The container's length: the sum of the pieces' lengths.
    pub len: u64,
    /// The CRC32C of the container's bytes.
    pub crc32c: u32,
    /// The longest chunk a tensor was cut into.
    pub chunk_len: u64,
    /// Saves since the last one that wrote every piece (0 for that one).
    pub increment: u32,
    /// The pieces, in the container's order.
    pub list: Vec<PieceRecord>,
}

/// One piece of a [`Pieces`] container and where its bytes are stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct PieceRecord {
    /// Its length in bytes.
    pub len: u64,
    /// The stored container holding it, key relative to the run's prefix
    /// (`step-200/<save>/delta.bin`).
    pub key: String,
    /// Where in that container it starts.
    pub offset: u64,
    /// The CRC32C of its bytes.
    pub crc32c: u32,
    /// Its content identity: the XXH3-128 hash of its bytes, 32 hex digits.
    pub xxh3: String,
    /// The tensor it is a chunk of; none for the header and the trailer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tensor: Option<String>,
    /// How its stored bytes encode it (record version 3); none when they are its bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encoding: Option<Encoding>,
}

impl Pieces {
    /// Whether any piece is stored encoded.
    pub fn is_encoded(&self) -> bool {
        self.list.iter().any(|piece| piece.encoding.is_some())
    }
}

impl PieceRecord {
    /// How many bytes of its stored container it takes.
    pub fn stored_len(&self) -> u64 {
        self.encoding.as_ref().map_or(self.len, |e| e.len)
    }
}

/// How a piece is stored encoded: its stored bytes are a frame of
/// [`codec`](weightbay::codec::Codec) that decodes to the piece's [`len`](PieceRecord::len)
/// bytes, whose CRC32C and hash stay the piece's own.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Encoding {
    /// The codec's name (`planes`).
    pub codec: String,
    /// The stored bytes' length.
    pub len: u64,
    /// The stored bytes' CRC32C, checked before they are decoded.
    pub crc32c: u32,
}

/// What a save about to refer to earlier checkpoints' containers announces first, so a gc
/// running meanwhile keeps them (see [`Checkpoints::gc`](crate::Checkpoints::gc)).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Announcement {
    /// The layout version of this announcement (1).
    pub weightbay_announcement: u32,
    /// The step being saved.
    pub step: u64,
    /// When it was written, in milliseconds since the Unix epoch, by the saver's clock.
    pub time_unix_ms: u64,
    /// The containers the save may refer to, keys relative to the run's prefix.
    pub keys: Vec<String>,
}

/// One container of a checkpoint, as its save wrote it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct ContainerRecord {
    /// Key relative to the step's directory.
    pub key: String,
    /// Length in bytes.
    pub len: u64,
    /// CRC32C (Castagnoli) of all its bytes.
    pub crc32c: u32,
}

impl ContainerRecord {
    /// Fails with [`ErrorKind::Corrupt`], naming `key`, unless `len` is the recorded length.
    pub(crate) fn check_len(&self, len: u64, key: &str) -> Result<()> {
        if len == self.len {
            return Ok(());
        }
        Err(Error::new(
            ErrorKind::Corrupt,
            format!("holds {len} bytes, the commit record says {}", self.len),
        )
        .with_key(key))
    }

    /// Fails with [`ErrorKind::Corrupt`], naming `key`, unless `crc` is the recorded CRC32C.
    pub(crate) fn check_crc(&self, crc: u32, key: &str) -> Result<()> {
        if crc == self.crc32c {
            return Ok(());
        }
        Err(Error::new(
            ErrorKind::Corrupt,
            format!(
                "CRC32C {crc:08x}, the commit record says {:08x}",
                self.crc32c
            ),
        )
        .with_key(key))
    }
}

/// What a rank wrote: its manifest, the unit the commit merges.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct RankManifest {
    /// The layout version of this manifest (1).
    pub weightbay_rank_manifest: u32,
    /// The training step.
    pub step: u64,
    /// This rank.
    pub rank: u32,
    /// How many ranks write the step.
    pub world_size: u32,
    /// `burnpack` or `safetensors`.
    pub format: String,
    /// The caller's metadata; rank 0's becomes the commit record's.
    pub metadata: BTreeMap<String, String>,
    /// The rank's containers, keys relative to the step's directory.
    pub containers: Vec<ContainerRecord>,
    /// Every tensor the rank holds, whole or a slice, by its logical name.
    pub tensors: BTreeMap<String, RankTensor>,
    /// When the rank announced its save, in milliseconds since the Unix epoch by its clock (a
    /// moment at or before the announcement's own time); absent in manifests of writers that
    /// did not announce. While the announcement is young, gc keeps the rank's containers, so
    /// the commit need not check them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub announced_unix_ms: Option<u64>,
}

/// A tensor, or a slice of one, that a rank holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct RankTensor {
    /// The element type, as [`DType`](weightbay::DType) displays it.
    pub dtype: String,
    /// The whole tensor's shape.
    pub shape: Vec<u64>,
    /// The part this rank holds (all of it for a whole tensor).
    pub region: Region,
    /// The container (key relative to the step's directory) it is stored in, under its
    /// logical name, as a tensor of the region's lengths.
    pub container: String,
}

/// A logical tensor of a multi-rank checkpoint, as the commit record lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct LogicalTensor {
    /// The element type, as [`DType`](weightbay::DType) displays it.
    pub dtype: String,
    /// The whole tensor's shape.
    pub shape: Vec<u64>,
    /// The slices that tile it, in rank order.
    pub slices: Vec<SliceRecord>,
}

/// One stored slice of a logical tensor.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct SliceRecord {
    /// The rank that wrote it.
    pub rank: u32,
    /// Its container, key relative to the step's directory.
    pub container: String,
    /// The part of the tensor it holds.
    pub region: Region,
}

/// Why a rank's save of a step failed, recorded beside where its manifest would be, so a
/// job's launcher sees the failed rank in [`Checkpoints::list`](crate::Checkpoints::list)
/// instead of waiting for it. A rank that then succeeds removes it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct RankFailure {
    /// The layout version of this record (1).
    pub weightbay_rank_failure: u32,
    /// The training step.
    pub step: u64,
    /// The rank that failed.
    pub rank: u32,
    /// How many ranks write the step.
    pub world_size: u32,
    /// The error, as the rank saw it (naming the key, the part and the store's answer).
    pub error: String,
    /// When it failed, in milliseconds since the Unix epoch.
    pub time_unix_ms: u64,
}

/// A box of a tensor: where it starts and how long it is along every dimension.
///
/// ```
/// use weightbay_checkpoints::Region;
/// // Rows 2..4 of an 8 × 6 matrix.
/// let rows = Region::new([2, 0], [2, 6]);
/// assert_eq!(rows.elements(), 12);
/// assert!(rows.within(&[8, 6]).is_ok());
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Region {
    /// The first index along each dimension.
    pub offsets: Vec<u64>,
    /// How many indices along each dimension.
    pub lengths: Vec<u64>,
}

/// `value` as pretty-printed JSON.
pub(crate) fn encode<T: Serialize>(value: &T) -> Result<Vec<u8>> {
    serde_json::to_vec_pretty(value).map_err(|e| Error::invalid(format!("encoding JSON: {e}")))
}

/// Reads and decodes the small JSON file at `key` (`what` names it in errors).
pub(crate) fn read_json<T: DeserializeOwned>(
    storage: &dyn Storage,
    key: &str,
    what: &str,
) -> Result<T> {
    let source = storage.open(key).map_err(|e| e.with_key(key))?;
    if source.len() > MAX_RECORD_LEN {
        return Err(Error::new(
            ErrorKind::LimitExceeded,
            format!("{what} over {MAX_RECORD_LEN} bytes"),
        )
        .with_key(key));
    }
    let mut body = vec![0; source.len() as usize];
    source.read_at(0, &mut body).map_err(|e| e.with_key(key))?;
    serde_json::from_slice(&body).map_err(|e| {
        Error::new(ErrorKind::Corrupt, format!("unreadable {what}: {e}")).with_key(key)
    })
}

/// Now, in milliseconds since the Unix epoch, as records store it.
pub(crate) fn now_unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}
