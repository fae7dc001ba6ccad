//! One complete checkpoint: its record, its containers opened for a runtime, and a full
//! verification of every byte against the CRC32C the record holds.

use std::ops::Range;
use std::sync::Arc;

use weightbay::backend_kit::read_in_order;
use weightbay::checksum::{crc32c_append, crc32c_combine};
use weightbay::{
    AccessPolicy, Error, ErrorKind, Reader, Result, ShardedWeights, Source, Storage, WeightSource,
};

use crate::assembled::AssembledWeights;
use crate::layout;
use crate::record::CommitRecord;
use crate::spliced::Spliced;

/// A complete checkpoint: its commit record, and its containers to load.
#[derive(Debug, Clone)]
pub struct Checkpoint {
    pub(crate) storage: Arc<dyn Storage>,
    /// The run's prefix, which the keys of pieces are relative to.
    pub(crate) prefix: String,
    pub(crate) dir: String,
    pub(crate) record: CommitRecord,
}

/// What [`Checkpoint::verify`] checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct CheckpointReport {
    /// Containers read.
    pub containers: usize,
    /// Bytes read.
    pub bytes: u64,
}

impl Checkpoint {
    /// The training step.
    pub fn step(&self) -> u64 {
        self.record.step
    }

    /// The commit record.
    pub fn record(&self) -> &CommitRecord {
        &self.record
    }

    /// The directory (key prefix) of the checkpoint's step.
    pub fn dir(&self) -> &str {
        &self.dir
    }

    /// The storage it lives in.
    pub fn storage(&self) -> &Arc<dyn Storage> {
        &self.storage
    }

    /// The key of container `relative` (a key from the record).
    pub(crate) fn key(&self, relative: &str) -> String {
        format!("{}/{relative}", self.dir)
    }

    /// Bytes this checkpoint's own save stored (for an incremental save, only what changed).
    pub fn written_bytes(&self) -> u64 {
        self.record.containers.iter().map(|c| c.len).sum()
    }

    /// Bytes of earlier checkpoints' containers this checkpoint refers to instead of storing
    /// them (0 unless it was saved incrementally).
    pub fn referenced_bytes(&self) -> u64 {
        self.record.references().values().sum()
    }

    /// `error`, a container found gone, as [`ErrorKind::NotFound`] when the checkpoint itself
    /// is gone too (its record deleted, by retention, since it was opened): a reader can tell
    /// a deleted checkpoint from a damaged one, the cause kept.
    fn deleted_or(&self, error: Error) -> Error {
        let record_key = layout::record_key(&self.dir);
        match self.storage.open(&record_key) {
            Err(gone) if gone.kind() == ErrorKind::NotFound => Error::new(
                ErrorKind::NotFound,
                format!(
                    "the checkpoint of step {} was deleted while it was read",
                    self.record.step
                ),
            )
            .with_key(&record_key)
            .with_source(error),
            _ => error,
        }
    }

    /// The checkpoint's one container, opened (for a sharded set, use
    /// [`weights`](Self::weights)). An incremental checkpoint reads exactly like a full one:
    /// its pieces are read from the containers that hold them, a batched read asking each
    /// container once.
    ///
    /// # Errors
    /// [`ErrorKind::InvalidInput`] for a sharded set; [`ErrorKind::NotFound`] when the
    /// checkpoint was deleted since it was opened; [`ErrorKind::Corrupt`] naming the tensor
    /// and the key when an incremental checkpoint refers to a container that is gone; as
    /// [`Reader::open_key`].
    pub fn reader(&self) -> Result<Reader> {
        if let Some(pieces) = &self.record.pieces {
            let spliced = Spliced::open(self.storage.as_ref(), &self.prefix, pieces)
                .map_err(|e| self.deleted_or(e.with_key(&self.dir)))?;
            return Reader::open(Arc::new(spliced)).map_err(|e| e.with_key(&self.dir));
        }
        match (&self.record.index, self.record.containers.as_slice()) {
            (None, [only]) if self.record.world_size.is_none() => {
                Reader::open_key(self.storage.as_ref(), &self.key(&only.key))
            }
            _ => Err(Error::invalid(
                "this checkpoint has several containers (shards or ranks): open it with \
                 Checkpoint::weights",
            )),
        }
    }

    /// The tensors of a checkpoint written by several ranks, whole or by region, for any
    /// rank layout.
    ///
    /// # Errors
    /// [`ErrorKind::InvalidInput`] for a checkpoint written by one process (open it with
    /// [`reader`](Self::reader) or [`weights`](Self::weights)).
    pub fn assembled(&self) -> Result<AssembledWeights> {
        if self.record.world_size.is_none() {
            return Err(Error::invalid(
                "this checkpoint was written by one process: open it with Checkpoint::reader \
                 or Checkpoint::weights",
            ));
        }
        Ok(AssembledWeights::new(
            Arc::clone(&self.storage),
            self.dir.clone(),
            self.record.tensors.clone(),
        ))
    }

    /// The checkpoint's tensors, for a runtime: its one container, or its shards through the
    /// index.
    ///
    /// # Errors
    /// As [`reader`](Self::reader) and [`ShardedWeights::open`].
    pub fn weights(&self) -> Result<Box<dyn WeightSource>> {
        if self.record.world_size.is_some() {
            return Ok(Box::new(self.assembled()?));
        }
        match &self.record.index {
            Some(index) => Ok(Box::new(ShardedWeights::open(
                Arc::clone(&self.storage),
                &self.key(index),
            )?)),
            None => Ok(Box::new(self.reader()?)),
        }
    }

    /// Reads every container in full and compares its length and CRC32C with the commit
    /// record's, so a single flipped bit in any container, of either format, is caught. An
    /// incremental checkpoint's references are followed: every piece it refers to in an
    /// earlier checkpoint's container is read and checked against its recorded CRC32C.
    ///
    /// # Errors
    /// [`ErrorKind::Corrupt`] naming the first container that differs, or the tensor and key of
    /// a piece that is gone or differs; the storage's errors.
    pub fn verify(&self) -> Result<CheckpointReport> {
        let mut bytes = 0;
        for container in &self.record.containers {
            let key = self.key(&container.key);
            let source = self.storage.open(&key).map_err(|e| e.with_key(&key))?;
            container.check_len(source.len(), &key)?;
            let crc = crc_of(source.as_ref()).map_err(|e| e.with_key(&key))?;
            container.check_crc(crc, &key)?;
            bytes += container.len;
        }
        let references = self.record.references();
        for relative in references.keys() {
            let key = layout::under(&self.prefix, relative);
            let source = self.storage.open(&key).map_err(|e| {
                let e = e.with_key(&key);
                if e.kind() == ErrorKind::NotFound {
                    self.deleted_or(
                        Error::new(
                            ErrorKind::Corrupt,
                            "a container this checkpoint refers to is gone",
                        )
                        .with_key(&key)
                        .with_source(e),
                    )
                } else {
                    e
                }
            })?;
            let pieces = self.record.pieces.iter().flat_map(|p| &p.list);
            for piece in pieces.filter(|p| p.key == *relative) {
                // An encoded piece's stored bytes have a CRC32C of their own; what they decode
                // to is checked with the whole container below.
                let expected = piece.encoding.as_ref().map_or(piece.crc32c, |e| e.crc32c);
                let range = piece.offset..piece.offset.saturating_add(piece.stored_len());
                let crc = read_in_order(source.as_ref(), range, |_| Ok(()))
                    .map_err(|e| e.with_key(&key))?;
                if crc != expected {
                    let tensor = piece.tensor.as_deref().unwrap_or("the header");
                    return Err(Error::new(
                        ErrorKind::Corrupt,
                        format!(
                            "the piece of `{tensor}` at {} holds CRC32C {crc:08x}, the commit \
                             record says {expected:08x}",
                            piece.offset
                        ),
                    )
                    .with_key(&key));
                }
                bytes += piece.stored_len();
            }
        }
        if let Some(pieces) = self.record.pieces.as_ref().filter(|p| p.is_encoded()) {
            // Every encoded piece decoded: the container they make up has its recorded CRC32C.
            let spliced = Spliced::open(self.storage.as_ref(), &self.prefix, pieces)?;
            let crc = read_in_order(&spliced, 0..pieces.len, |_| Ok(()))
                .map_err(|e| e.with_key(&self.dir))?;
            if crc != pieces.crc32c {
                return Err(Error::new(
                    ErrorKind::Corrupt,
                    format!(
                        "the pieces decode to a container with CRC32C {crc:08x}, the commit \
                         record says {:08x}",
                        pieces.crc32c
                    ),
                )
                .with_key(&self.dir));
            }
        }
        Ok(CheckpointReport {
            containers: self.record.containers.len() + references.len(),
            bytes,
        })
    }
}

/// CRC32C of every byte of `source`. Bytes already in memory (a memory map, a buffer) are
/// summed where they lie; an object store's are read ahead in parallel and summed as they
/// come in order; a file's are read and summed in parts of at least 64 MiB on up to four
/// threads, their CRCs then combined (reading from the page cache is a copy as costly as the
/// CRC itself, so one core would reach only about half of what the CRC alone runs at).
fn crc_of(source: &dyn Source) -> Result<u32> {
    let len = source.len();
    if let Ok(bytes) = source.bytes(0..len)
        && let Ok(memory) = bytes.read(AccessPolicy::ZeroCopy)
    {
        return on_threads(len, |range| {
            // `range` lies within `0..len`, the length of `memory`.
            Ok(crc32c_append(
                0,
                &memory[range.start as usize..range.end as usize],
            ))
        });
    }
    if source.fetch_ahead() > 0 {
        return read_in_order(source, 0..len, |_| Ok(()));
    }
    on_threads(len, |range| read_in_order(source, range, |_| Ok(())))
}

/// `crc` of `0..len` cut into parts of at least 64 MiB, on up to four threads, combined.
fn on_threads(len: u64, crc: impl Fn(Range<u64>) -> Result<u32> + Sync) -> Result<u32> {
    const PART_AT_LEAST: u64 = 64 * 1024 * 1024;
    let threads = std::thread::available_parallelism()
        .map_or(1, usize::from)
        .min(4)
        .min(usize::try_from(len / PART_AT_LEAST).unwrap_or(usize::MAX))
        .max(1);
    let part = len.div_ceil(threads as u64);
    let parts: Vec<Range<u64>> = (0..threads as u64)
        .map(|i| (i * part).min(len)..((i + 1) * part).min(len))
        .collect();
    let crcs = std::thread::scope(|scope| {
        let workers: Vec<_> = parts
            .iter()
            .map(|range| scope.spawn(|| crc(range.clone())))
            .collect();
        workers
            .into_iter()
            .map(|worker| {
                worker
                    .join()
                    .unwrap_or_else(|_| Err(Error::new(ErrorKind::Io, "a verify thread panicked")))
            })
            .collect::<Result<Vec<u32>>>()
    })?;
    Ok(parts.iter().zip(crcs).fold(0, |crc, (range, part_crc)| {
        crc32c_combine(crc, part_crc, (range.end - range.start) as usize)
    }))
}
