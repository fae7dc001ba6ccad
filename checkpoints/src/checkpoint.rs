//! One complete checkpoint: its record, its containers opened for a runtime, and a full
//! verification of every byte against the CRC32C the record holds.

use std::ops::Range;
use std::sync::Arc;

use weightbay::checksum::{crc32c_append, crc32c_combine};
use weightbay::{Error, ErrorKind, Reader, Result, ShardedWeights, Source, Storage, WeightSource};

use crate::assembled::AssembledWeights;
use crate::record::CommitRecord;

/// How much of a container [`Checkpoint::verify`] reads at a time.
const VERIFY_WINDOW: u64 = 8 * 1024 * 1024;

/// A complete checkpoint: its commit record, and its containers to load.
#[derive(Debug, Clone)]
pub struct Checkpoint {
    pub(crate) storage: Arc<dyn Storage>,
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

    /// The checkpoint's one container, opened (for a sharded set, use
    /// [`weights`](Self::weights)).
    ///
    /// # Errors
    /// [`ErrorKind::InvalidInput`] for a sharded set; as [`Reader::open_key`].
    pub fn reader(&self) -> Result<Reader> {
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
    /// record's, so a single flipped bit in any container, of either format, is caught.
    ///
    /// # Errors
    /// [`ErrorKind::Corrupt`] naming the first container that differs; the storage's errors.
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
        Ok(CheckpointReport {
            containers: self.record.containers.len(),
            bytes,
        })
    }
}

/// CRC32C of every byte of `source`: parts of at least 64 MiB read and summed on up to four
/// threads, their CRCs then combined. Reading from the page cache is a copy as costly as the
/// CRC itself, so one core reaches only about half of what the CRC alone runs at.
fn crc_of(source: &dyn Source) -> Result<u32> {
    const PART_AT_LEAST: u64 = 64 * 1024 * 1024;
    let len = source.len();
    let threads = std::thread::available_parallelism()
        .map_or(1, usize::from)
        .min(4)
        .min(usize::try_from(len / PART_AT_LEAST).unwrap_or(usize::MAX))
        .max(1);
    let part = len.div_ceil(threads as u64);
    let parts: Vec<std::ops::Range<u64>> = (0..threads as u64)
        .map(|i| (i * part).min(len)..((i + 1) * part).min(len))
        .collect();
    let crcs = std::thread::scope(|scope| {
        let workers: Vec<_> = parts
            .iter()
            .map(|range| scope.spawn(|| for_each_window(source, range.clone(), |_| Ok(()))))
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

/// Reads `range` of `source` in windows, handing each to `each`, and returns the CRC32C of
/// all of it.
pub(crate) fn for_each_window(
    source: &dyn Source,
    range: Range<u64>,
    mut each: impl FnMut(&[u8]) -> Result<()>,
) -> Result<u32> {
    let mut crc = 0;
    let mut window = vec![0; VERIFY_WINDOW.min(range.end - range.start) as usize];
    let mut offset = range.start;
    while offset < range.end {
        // At most the window's length: both are capped by VERIFY_WINDOW and the range.
        let len = (range.end - offset).min(VERIFY_WINDOW) as usize;
        let chunk = &mut window[..len];
        source.read_at(offset, chunk)?;
        crc = crc32c_append(crc, chunk);
        each(chunk)?;
        offset += len as u64;
    }
    Ok(crc)
}
