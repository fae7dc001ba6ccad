//! Saving a checkpoint in the foreground: its containers into a save directory of its own,
//! each length and CRC32C noted as the bytes stream, then the commit record with create-new.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use weightbay::backend_kit::unique_token;
use weightbay::{
    CreateOptions, Error, ErrorKind, Result, ShardedWriter, StorageExt, WriteMode, Writer,
};

use crate::checkpoints::Checkpoints;
use crate::layout;
use crate::record::{CommitRecord, ContainerRecord, RECORD_VERSION, encode, now_unix_ms};
use crate::recording::Recording;

/// How a checkpoint is saved, beyond what its [`Writer`] says (format, durability, trailer).
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct SaveOptions {
    /// Split into shards of about this many tensor bytes, with an index, instead of one
    /// container.
    pub shard_len: Option<u64>,
    /// Stored in the commit record.
    pub metadata: BTreeMap<String, String>,
    /// How long the whole save (every container and the commit record) may take; past it the
    /// request in flight is cut, nothing is committed, and the save fails with
    /// [`ErrorKind::TimedOut`] naming the key (and the part, on an object store).
    pub timeout: Option<Duration>,
}

impl SaveOptions {
    /// Shards of about `shard_len` tensor bytes each, with a Hugging Face style index.
    #[must_use]
    pub fn sharded(shard_len: u64) -> Self {
        Self {
            shard_len: Some(shard_len),
            ..Self::default()
        }
    }

    /// Sets [`timeout`](Self::timeout).
    #[must_use]
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// Adds an entry to the commit record's metadata.
    #[must_use]
    pub fn with_metadata(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.metadata.insert(key.into(), value.into());
        self
    }
}

impl Checkpoints {
    /// Saves `writer`'s tensors as the checkpoint of `step`, one container in the writer's
    /// format, and commits it. See [`save_with`](Self::save_with).
    ///
    /// # Errors
    /// As [`save_with`](Self::save_with).
    pub fn save(&self, step: u64, writer: Writer) -> Result<CommitRecord> {
        self.save_with(step, writer, SaveOptions::default())
    }

    /// Saves `writer`'s tensors as the checkpoint of `step` (one container, or shards with
    /// [`SaveOptions::sharded`]), then writes its commit record with create-new. Waits first
    /// for a save in flight (from [`save_in_background`](Self::save_in_background)) to end. On
    /// failure the containers this save wrote are removed again, unless the record's own
    /// create-new failed in a way that may have written it (then they stay for
    /// [`gc`](Self::gc), since the record may name them).
    ///
    /// # Errors
    /// [`ErrorKind::AlreadyExists`] when `step` is committed already (by another saver too);
    /// the failure of an earlier background save whose handle was dropped (then nothing is
    /// saved); writer and storage errors.
    pub fn save_with(
        &self,
        step: u64,
        writer: Writer,
        options: SaveOptions,
    ) -> Result<CommitRecord> {
        let save_dir = format!("{}/{}", self.step_dir(step), unique_token());
        self.saves.begin((step, save_dir.clone()))?;
        let result = self.write_and_commit(step, &save_dir, writer, options);
        self.saves.end();
        result
    }

    pub(crate) fn write_and_commit(
        &self,
        step: u64,
        save_dir: &str,
        writer: Writer,
        options: SaveOptions,
    ) -> Result<CommitRecord> {
        let record_key = layout::record_key(&self.step_dir(step));
        match self.storage.open(&record_key) {
            Ok(_) => {
                return Err(Error::new(
                    ErrorKind::AlreadyExists,
                    format!("step {step} is committed already"),
                )
                .with_key(&record_key));
            }
            Err(e) if e.kind() == ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        let recording = Recording::new(Arc::clone(&self.storage));
        let format = writer.format();
        let durability = writer.durability();
        let deadline = options.timeout.map(|timeout| Instant::now() + timeout);
        let writer = match deadline {
            Some(deadline) => writer.with_deadline(deadline),
            None => writer,
        };
        let written = match options.shard_len {
            None => {
                let key = format!("{save_dir}/model.{}", format.extension());
                writer
                    .with_mode(WriteMode::Overwrite)
                    .write_to(&recording, &key)
                    .map(|_| None)
            }
            Some(shard_len) => ShardedWriter::new(writer)
                .with_shard_len(shard_len)
                .write_to(&recording, save_dir)
                .map(|summary| Some(summary.index)),
        };
        let index = match written {
            Ok(index) => index,
            Err(e) => {
                recording.remove_all();
                return Err(e);
            }
        };
        let step_dir = self.step_dir(step);
        let relative = |key: &str| key.strip_prefix(&format!("{step_dir}/")).map(str::to_owned);
        let record = CommitRecord {
            weightbay_checkpoint: RECORD_VERSION,
            step,
            time_unix_ms: now_unix_ms(),
            format: format.to_string(),
            metadata: options.metadata,
            index: index.as_deref().and_then(relative),
            containers: recording
                .written()
                .into_iter()
                .filter_map(|(key, len, crc32c)| {
                    Some(ContainerRecord {
                        key: relative(&key)?,
                        len,
                        crc32c,
                    })
                })
                .collect(),
            world_size: None,
            tensors: BTreeMap::new(),
        };
        let body = encode(&record)?;
        let mut options = CreateOptions::default().with_durability(durability);
        options.deadline = deadline;
        match self.storage.write_new_with(&record_key, &body, options) {
            Ok(()) => Ok(record),
            Err(e) => {
                if e.kind() == ErrorKind::AlreadyExists {
                    recording.remove_all();
                }
                // Otherwise the record may have been written all the same (a request whose
                // answer was lost), naming these containers: they stay, and `gc` removes
                // them if no record names them.
                Err(e)
            }
        }
    }
}
