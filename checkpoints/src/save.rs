//! Saving a checkpoint in the foreground: its containers into a save directory of its own,
//! each length and CRC32C noted as the bytes stream, then the commit record with create-new.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::mpsc::Sender;
use std::time::{Duration, Instant};

use weightbay::backend_kit::unique_token;
use weightbay::codec::Elements;
use weightbay::{
    CreateOptions, Error, ErrorKind, Result, ShardedWriter, Storage, StorageExt, WriteMode, Writer,
};

use crate::committed_containers::Recording;
use crate::following::Followed;
use crate::incremental::{Base, DeltaSink, Incremental, combined_crc, plan};
use crate::layout;
use crate::record::{
    CommitRecord, ContainerRecord, ENCODED_RECORD_VERSION, PIECES_RECORD_VERSION, Pieces,
    RECORD_VERSION, encode, now_unix_ms,
};
use crate::run::Checkpoints;

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
    /// Write only the pieces an earlier checkpoint does not hold (see
    /// [`incremental`](Self::incremental)).
    pub incremental: Option<Incremental>,
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

    /// An incremental save: the container is cut into pieces (the header, each tensor in
    /// chunks of at most 1 MiB, the trailer), each hashed (XXH3-128) before it is sent, and a
    /// piece the newest complete checkpoint already holds is not written: the commit record
    /// refers to that checkpoint's bytes. Every reader reads the result like a full save. The
    /// first such save, and any whose base has no pieces, writes everything and records the
    /// hashes a chain starts from. Finding the base takes a storage that lists.
    ///
    /// ```
    /// use weightbay_checkpoints::{Checkpoints, SaveOptions};
    /// use weightbay::{MemoryStorage, Tensor, Writer};
    ///
    /// let checkpoints = Checkpoints::new(MemoryStorage::new(), "run");
    /// let frozen = Tensor::from_slice("base", [1 << 18], &vec![1.0f32; 1 << 18]);
    /// for step in [1, 2] {
    ///     let adapter = Tensor::from_slice("adapter", [4], &[step as f32; 4]);
    ///     let writer = Writer::new(vec![frozen.clone(), adapter]);
    ///     checkpoints.save_with(step, writer, SaveOptions::incremental())?;
    /// }
    /// let latest = checkpoints.latest()?.expect("saved");
    /// assert!(latest.written_bytes() < 4096); // the 1 MiB base was not written again
    /// assert_eq!(latest.reader()?.read_as::<f32>("adapter")?, [2.0; 4]);
    /// # Ok::<(), weightbay::Error>(())
    /// ```
    #[must_use]
    pub fn incremental() -> Self {
        Self {
            incremental: Some(Incremental::default()),
            ..Self::default()
        }
    }

    /// The incremental settings, made incremental first if it was not.
    fn incremental_mut(&mut self) -> &mut Incremental {
        self.incremental.get_or_insert_with(Incremental::default)
    }

    /// An incremental save against checkpoint `step` instead of the newest.
    #[must_use]
    pub fn with_base(mut self, step: u64) -> Self {
        self.incremental_mut().base = Some(step);
        self
    }

    /// An incremental save cutting tensors into pieces of at most `chunk_len` bytes.
    #[must_use]
    pub fn with_chunk_len(mut self, chunk_len: u64) -> Self {
        self.incremental_mut().chunk_len = chunk_len.max(1);
        self
    }

    /// An incremental save that writes every piece once its base is `increments` saves from
    /// the last full one, so a chain never grows past it.
    #[must_use]
    pub fn rebase_after(mut self, increments: u32) -> Self {
        self.incremental_mut().rebase_after = Some(increments);
        self
    }

    /// An incremental save told that `names` have not changed since the base (frozen weights):
    /// their pieces are referred to without hashing their bytes. A name the base does not
    /// hold, or holds cut otherwise, is hashed as usual.
    #[must_use]
    pub fn with_unchanged<I, S>(mut self, names: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.incremental_mut()
            .unchanged
            .extend(names.into_iter().map(Into::into));
        self
    }

    /// Hashes the tensors declared [unchanged](Self::with_unchanged) all the same and fails
    /// the save ([`ErrorKind::InvalidInput`] naming the tensor) if one differs from the base.
    #[must_use]
    pub fn check_unchanged(mut self) -> Self {
        self.incremental_mut().check_unchanged = true;
        self
    }

    /// A save whose stored pieces are encoded where that makes them smaller: each tensor's
    /// chunks split into byte planes by its element width, each plane Huffman coded where
    /// that saves (docs/FORMAT.md, "Encoded pieces"). It is an incremental save, so it
    /// composes with every setting above; a reader decodes each piece on the thread that
    /// fetched it, and a piece's CRC32C and hash stay those of its bytes. Memory maps hand out
    /// the stored bytes of raw pieces only: an encoded one is decoded into memory.
    ///
    /// ```
    /// use weightbay_checkpoints::{Checkpoints, SaveOptions};
    /// use weightbay::{MemoryStorage, Tensor, Writer};
    ///
    /// let checkpoints = Checkpoints::new(MemoryStorage::new(), "run");
    /// // Values like trained weights: small, their exponents few.
    /// let values: Vec<f32> = (0..1 << 16).map(|i| ((i * 7919) % 2001) as f32 * 1e-5 - 0.01).collect();
    /// let writer = Writer::new(vec![Tensor::from_slice("w", [1 << 16], &values)]);
    /// checkpoints.save_with(1, writer, SaveOptions::compressed())?;
    /// let saved = checkpoints.latest()?.expect("saved");
    /// assert!(saved.written_bytes() < 4 << 16);
    /// assert_eq!(saved.reader()?.read_as::<f32>("w")?, values);
    /// # Ok::<(), weightbay::Error>(())
    /// ```
    #[must_use]
    pub fn compressed() -> Self {
        Self::default().with_compression()
    }

    /// Makes this save [`compressed`](Self::compressed) (and incremental).
    #[must_use]
    pub fn with_compression(mut self) -> Self {
        self.incremental_mut().compress = true;
        self
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
        let _in_flight = self.saves.begin((step, save_dir.clone()))?;
        self.write_and_commit(step, &save_dir, writer, options, None)
    }

    /// Writes the containers of a save and its commit record. An incremental save is never
    /// followed: what it writes is not the container the record names.
    pub(crate) fn write_and_commit(
        &self,
        step: u64,
        save_dir: &str,
        writer: Writer,
        options: SaveOptions,
        follower: Option<Sender<Followed>>,
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
        if options.incremental.is_none() {
            // Every save announces itself before it writes (an incremental one as it finds its
            // base), so a gc pass elsewhere leaves its directory alone even when its step is
            // older than the newest complete one (a backfill, a rerun).
            self.announce(step, layout::save_token(save_dir), Vec::new())?;
        }
        let follower = follower.filter(|_| options.incremental.is_none());
        let recording = Recording::new(Arc::clone(&self.storage)).followed_by(follower);
        let format = writer.format();
        let durability = writer.durability();
        let deadline = options.timeout.map(|timeout| Instant::now() + timeout);
        let writer = match deadline {
            Some(deadline) => writer.with_deadline(deadline),
            None => writer,
        };
        let written = match (&options.incremental, options.shard_len) {
            (Some(_), Some(_)) => Err(Error::invalid(
                "an incremental save writes one container: it cannot be sharded too",
            )),
            (Some(incremental), None) => self
                .write_pieces(step, save_dir, writer, incremental, &recording, deadline)
                .map(|(base, pieces)| (None, base, Some(pieces))),
            (None, None) => {
                let key = format!("{save_dir}/model.{}", format.extension());
                writer
                    .with_mode(WriteMode::Overwrite)
                    .write_to(&recording, &key)
                    .map(|_| (None, None, None))
            }
            (None, Some(shard_len)) => ShardedWriter::new(writer)
                .with_shard_len(shard_len)
                .write_to(&recording, save_dir)
                .map(|summary| (Some(summary.index), None, None)),
        };
        let written = written.and_then(|(index, base, pieces)| {
            self.check_lease(base.as_ref().map(|b| b.announced))?;
            Ok((index, pieces))
        });
        let (index, pieces) = match written {
            Ok(written) => written,
            Err(e) => {
                recording.remove_all();
                self.withdraw(step, save_dir);
                return Err(e);
            }
        };
        let step_dir = self.step_dir(step);
        let relative = |key: &str| key.strip_prefix(&format!("{step_dir}/")).map(str::to_owned);
        let record = CommitRecord {
            weightbay_checkpoint: match &pieces {
                Some(pieces) if pieces.is_encoded() => ENCODED_RECORD_VERSION,
                Some(_) => PIECES_RECORD_VERSION,
                None => RECORD_VERSION,
            },
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
            pieces,
        };
        if let Err(e) = self.confirm_written(&step_dir, &record.containers) {
            recording.remove_all();
            self.withdraw(step, save_dir);
            return Err(e);
        }
        let body = encode(&record)?;
        let mut options = CreateOptions::default().with_durability(durability);
        options.deadline = deadline;
        match self.storage.write_new_with(&record_key, &body, options) {
            Ok(()) => {
                self.withdraw(step, save_dir);
                Ok(record)
            }
            Err(e) => {
                if e.kind() == ErrorKind::AlreadyExists {
                    recording.remove_all();
                    self.withdraw(step, save_dir);
                }
                // Otherwise the record may have been written all the same (a request whose
                // answer was lost), naming these containers: they stay, and `gc` removes
                // them if no record names them.
                Err(e)
            }
        }
    }

    /// Streams `writer`'s container through a [`DeltaSink`]: only the pieces the announced
    /// base does not hold are stored (in `delta.bin`, or when there is no base the whole
    /// container as `model.<format>`, or its pieces encoded as `pieces.bin`). Returns the
    /// base and the pieces.
    fn write_pieces(
        &self,
        step: u64,
        save_dir: &str,
        writer: Writer,
        incremental: &Incremental,
        recording: &Recording,
        deadline: Option<Instant>,
    ) -> Result<(Option<Base>, Pieces)> {
        let base = self.announce_base(step, layout::save_token(save_dir), incremental)?;
        let base_pieces = base.as_ref().and_then(|b| b.record.pieces.as_ref());
        let name = format!("model.{}", writer.format().extension());
        let mut plan = plan(&writer, base_pieces, incremental)?;
        let len = plan.len;
        let mut writer = writer;
        for (index, crc) in std::mem::take(&mut plan.known_crcs) {
            writer = writer.with_known_crc32c(index, crc);
        }
        // Without a base and uncompressed, the stored container is the container itself;
        // otherwise its pieces back to back, no container of their own.
        let key = match (base_pieces, incremental.compress) {
            (None, false) => format!("{save_dir}/{name}"),
            (None, true) => format!("{save_dir}/pieces.bin"),
            (Some(_), _) => format!("{save_dir}/delta.bin"),
        };
        let mut create = CreateOptions::default()
            .with_mode(WriteMode::Overwrite)
            .with_durability(writer.durability());
        if base_pieces.is_none() && !incremental.compress {
            create = create.with_expected_len(len);
        }
        create.deadline = deadline;
        let inner = recording
            .create(&key, &create)
            .map_err(|e| e.with_operation("create").with_key(&key))?;
        let names = writer
            .tensors()
            .iter()
            .map(|t| t.name().to_owned())
            .collect();
        let elements = incremental.compress.then(|| {
            writer
                .tensors()
                .iter()
                .map(|t| Elements::of(t.dtype()))
                .collect()
        });
        let stored_key = layout::relative(&self.prefix, &key).to_owned();
        let mut sink = DeltaSink::new(inner, stored_key, plan, names, elements);
        writer
            .write_to_sink(&mut sink)
            .map_err(|e| e.with_operation("write").with_key(&key))?;
        let list = sink.pieces()?.to_vec();
        sink.commit()
            .map_err(|e| e.with_operation("commit").with_key(&key))?;
        let pieces = Pieces {
            name,
            len,
            crc32c: combined_crc(&list),
            chunk_len: incremental.chunk_len,
            increment: base_pieces.map_or(0, |b| b.increment + 1),
            list,
        };
        Ok((base, pieces))
    }
}
