//! Copying a checkpoint between storages: every container streamed across with its CRC32C
//! compared to the record on the way, the record written last, as a save would.

use weightbay::backend_kit::{copy_to_sink, unique_token};
use weightbay::checksum::crc32c_combine;
use weightbay::{
    CreateOptions, Durability, Error, ErrorKind, Result, Sink, Source, Storage, StorageExt,
    WriteMode,
};

use crate::checkpoint::Checkpoint;
use crate::following::{Head, Heads};
use crate::layout::{self, manifest_key};
use crate::ranks::{RankOutcome, check_same};
use crate::record::{
    CommitRecord, ContainerRecord, PIECES_RECORD_VERSION, PieceRecord, Pieces, RankManifest,
    encode, now_unix_ms, read_json,
};
use crate::run::Checkpoints;
use crate::spliced::Spliced;

impl Checkpoints {
    /// Copies `checkpoint` (from any storage) here under the same step, byte for byte: every
    /// container streams across with its CRC32C compared to the record's on the way, then the
    /// same commit record is written last with create-new. An incremental checkpoint arrives
    /// self-contained: its container is written whole (read from every checkpoint it refers
    /// to), keeping its pieces' hashes, so the copy starts a chain of its own here. A copy
    /// that fails or finds a container changed commits nothing and removes what it wrote,
    /// unless the failure was the commit record's own write, which may have landed all the
    /// same (an answer lost): then what it wrote stays for [`gc`](Self::gc), which removes it
    /// if no record names it (before, it was removed, and such a record named nothing).
    ///
    /// # Errors
    /// [`ErrorKind::AlreadyExists`] when the step is committed here already;
    /// [`ErrorKind::Corrupt`] naming a container whose bytes differ from the record; the
    /// storages' errors.
    pub fn copy_from(
        &self,
        checkpoint: &Checkpoint,
        durability: Durability,
    ) -> Result<CommitRecord> {
        let step = checkpoint.step();
        let _in_flight = self.saves.begin((step, self.step_dir(step)))?;
        self.copy_containers(checkpoint, &unique_token(), Heads::new(), durability)
    }

    /// Copies `checkpoint` into save directory `save` of its step here, going on from `heads`
    /// (containers streamed already, [`following`](crate::following)) where it has them; the
    /// caller holds the step's save slot.
    pub(crate) fn copy_containers(
        &self,
        checkpoint: &Checkpoint,
        save: &str,
        heads: Heads,
        durability: Durability,
    ) -> Result<CommitRecord> {
        let dir = &self.step_dir(checkpoint.step());
        let record_key = self.uncommitted_record_key(checkpoint.step())?;
        // Into a save directory of this copy's own, like any save, so a racing copy or save
        // of the step never writes over these containers.
        let moved = |key: &str| layout::moved_into(save, key);
        if let Some(pieces) = &checkpoint.record.pieces {
            return self.copy_materialized(checkpoint, pieces, dir, save, durability);
        }
        let mut record = checkpoint.record.clone();
        record.index = record.index.as_deref().map(moved);
        for slice in record.tensors.values_mut().flat_map(|t| &mut t.slices) {
            slice.container = moved(&slice.container);
        }
        // A step older than the newest complete one is gc's to clean while it has no record:
        // the copy announces its save directory first, as every save does.
        let step = checkpoint.step();
        let announced = self.announce(step, save, Vec::new())?;
        let copied = self.copy_stored(
            (checkpoint.storage.as_ref(), checkpoint.dir()),
            &checkpoint.record.containers,
            (dir, moved),
            heads,
            durability,
        );
        let ready = copied.and_then(|containers| {
            record.containers = containers;
            let ready = self
                .check_lease(Some(announced))
                .and_then(|()| self.confirm_written(dir, &record.containers))
                .and_then(|()| encode(&record));
            ready.inspect_err(|_| self.remove_containers(dir, &record.containers))
        });
        let committed = ready.and_then(|body| {
            self.commit_record(&record_key, &body, durability, || {
                self.remove_containers(dir, &record.containers);
            })
        });
        self.withdraw(step, &format!("{dir}/{save}"));
        committed.map(|()| record)
    }

    /// The key of `step`'s commit record here, which a copy is to write.
    ///
    /// # Errors
    /// [`ErrorKind::AlreadyExists`] when a record stands there already.
    pub(crate) fn uncommitted_record_key(&self, step: u64) -> Result<String> {
        let record_key = layout::record_key(&self.step_dir(step));
        if self.storage.open(&record_key).is_ok() {
            return Err(Error::new(
                ErrorKind::AlreadyExists,
                format!("step {step} is committed already"),
            )
            .with_key(&record_key));
        }
        Ok(record_key)
    }

    /// Writes a copy's commit record `body` at `record_key` with create-new. When another
    /// record stands there, `remove` removes what the copy wrote; after any other failure the
    /// record may have been written all the same (a request whose answer was lost), naming
    /// those containers, so they stay and gc removes them if no record names them.
    pub(crate) fn commit_record(
        &self,
        record_key: &str,
        body: &[u8],
        durability: Durability,
        remove: impl FnOnce(),
    ) -> Result<()> {
        self.storage
            .write_new(record_key, body, durability)
            .inspect_err(|e| {
                if e.kind() == ErrorKind::AlreadyExists {
                    remove();
                }
            })
    }
}

impl Checkpoints {
    /// Writes the container `pieces` make up whole, at `dir/save/<name>`, then a record whose
    /// pieces all lie in it.
    fn copy_materialized(
        &self,
        checkpoint: &Checkpoint,
        pieces: &Pieces,
        dir: &str,
        save: &str,
        durability: Durability,
    ) -> Result<CommitRecord> {
        let key = format!("{dir}/{save}/{}", pieces.name);
        let whole = ContainerRecord {
            key: format!("{save}/{}", pieces.name),
            len: pieces.len,
            crc32c: pieces.crc32c,
        };
        let source = Spliced::open(checkpoint.storage.as_ref(), &checkpoint.prefix, pieces)?;
        let from = (&source as &dyn Source, checkpoint.dir());
        let step = checkpoint.step();
        let announced = self.announce(step, save, Vec::new())?;
        let copied = copy_checked(from, &whole, self.storage.as_ref(), &key, durability)
            .and_then(|()| self.check_lease(Some(announced)))
            .and_then(|()| self.confirm_written(dir, std::slice::from_ref(&whole)));
        let stored = layout::relative(&self.prefix, &key).to_owned();
        let mut at = 0;
        let list = pieces
            .list
            .iter()
            .map(|piece| {
                // The copy is the container itself: every piece raw.
                let moved = PieceRecord {
                    key: stored.clone(),
                    offset: at,
                    encoding: None,
                    ..piece.clone()
                };
                at += piece.len;
                moved
            })
            .collect();
        let mut record = checkpoint.record.clone();
        record.weightbay_checkpoint = PIECES_RECORD_VERSION;
        record.containers = vec![whole];
        record.pieces = Some(Pieces {
            increment: 0,
            list,
            ..pieces.clone()
        });
        let record_key = layout::record_key(dir);
        let remove = || drop(self.storage.delete(&key));
        let committed = match copied.and_then(|()| encode(&record)) {
            Ok(body) => self.commit_record(&record_key, &body, durability, remove),
            Err(e) => {
                remove();
                Err(e)
            }
        };
        self.withdraw(step, &format!("{dir}/{save}"));
        committed.map(|()| record)
    }
}

impl Checkpoints {
    /// Copies rank `rank`'s part of `step` from `from` here, and goes on as the rank's own
    /// save would ([`RankSave`](crate::RankSave)'s protocol): its containers streamed into a
    /// save directory of their own with their CRC32C checked, then its manifest with
    /// create-new, then the listing after which the rank that sees every manifest commits. A
    /// manifest here already (a copy that ran before) must hold the same content, and nothing
    /// is copied again.
    ///
    /// # Errors
    /// [`ErrorKind::NotFound`] when `from` holds no manifest of the rank;
    /// [`ErrorKind::AlreadyExists`] when the manifest here holds other content;
    /// [`ErrorKind::Corrupt`] naming a container whose bytes differ from its manifest; the
    /// storages' errors.
    pub(crate) fn copy_rank_from(
        &self,
        from: &Checkpoints,
        step: u64,
        (rank, world_size): (u32, u32),
    ) -> Result<RankOutcome> {
        let from_dir = from.step_dir(step);
        let theirs: RankManifest = read_json(
            from.storage.as_ref(),
            &manifest_key(&from_dir, rank, world_size),
            "rank manifest",
        )?;
        let dir = self.step_dir(step);
        let key = manifest_key(&dir, rank, world_size);
        let placed = match read_json::<RankManifest>(self.storage.as_ref(), &key, "rank manifest") {
            Ok(first) => check_same(&first, &theirs, &key).map(|()| (first, true)),
            Err(e) if e.kind() == ErrorKind::NotFound => {
                let save = unique_token();
                let save_dir = format!("{dir}/{save}");
                // gc leaves a directory being written alone, as it does a rank's own save: in
                // this process by its slot, in others by its announcement.
                self.saves.lock().ranks_in_flight.push(save_dir.clone());
                let manifest = layout::relative(&self.prefix, &key).to_owned();
                let announced_unix_ms = now_unix_ms();
                let placed = self.announce(step, &save, vec![manifest]).and_then(|_| {
                    let theirs = RankManifest {
                        announced_unix_ms: Some(announced_unix_ms),
                        ..theirs
                    };
                    self.place_rank(from, &theirs, &save, &key)
                });
                self.saves
                    .lock()
                    .ranks_in_flight
                    .retain(|dir| *dir != save_dir);
                if placed.is_err() {
                    self.withdraw(step, &save_dir);
                }
                placed
            }
            Err(e) => Err(e),
        };
        let (manifest, rerun) = placed?;
        self.conclude_rank(step, &manifest, rerun, None, CreateOptions::default())
    }

    /// Copies the containers `theirs` names from `from` into save directory `save` of its step
    /// here and writes the manifest, moved there (and with the time the copy announced, which
    /// `theirs` carries), at `key` with create-new; returns it, and whether another copy's
    /// manifest stood there already.
    fn place_rank(
        &self,
        from: &Checkpoints,
        theirs: &RankManifest,
        save: &str,
        key: &str,
    ) -> Result<(RankManifest, bool)> {
        let (dir, from_dir) = (self.step_dir(theirs.step), from.step_dir(theirs.step));
        let moved = |relative: &str| {
            let file = relative.rsplit('/').next().unwrap_or(relative);
            format!("{save}/{file}")
        };
        let mut manifest = theirs.clone();
        manifest.containers = self.copy_stored(
            (from.storage.as_ref(), &from_dir),
            &theirs.containers,
            (&dir, moved),
            Heads::new(),
            Durability::Default,
        )?;
        for tensor in manifest.tensors.values_mut() {
            tensor.container = moved(&tensor.container);
        }
        match self
            .storage
            .write_new(key, &encode(&manifest)?, Durability::Default)
        {
            Ok(()) => Ok((manifest, false)),
            Err(e) if e.kind() == ErrorKind::AlreadyExists => {
                self.remove_containers(&dir, &manifest.containers);
                let first: RankManifest = read_json(self.storage.as_ref(), key, "rank manifest")?;
                check_same(&first, &manifest, key).map(|()| (first, true))
            }
            // The manifest may have been written all the same (an answer lost), naming these
            // containers: they stay, as a rank's own save leaves them.
            Err(e) => Err(e),
        }
    }
}

impl Checkpoints {
    /// Streams every one of `containers`, stored under directory `from_dir` of `from`, here to
    /// `dir` and the key `moved` makes of its own, each CRC32C checked against its record and
    /// going on from its head when `heads` has one; returns their records with the new keys.
    /// On a failure it removes what it wrote.
    fn copy_stored(
        &self,
        (from, from_dir): (&dyn Storage, &str),
        containers: &[ContainerRecord],
        (dir, moved): (&str, impl Fn(&str) -> String),
        mut heads: Heads,
        durability: Durability,
    ) -> Result<Vec<ContainerRecord>> {
        let mut copied = Vec::with_capacity(containers.len());
        for container in containers {
            let to = ContainerRecord {
                key: moved(&container.key),
                ..container.clone()
            };
            let from_key = format!("{from_dir}/{}", container.key);
            let key = format!("{dir}/{}", to.key);
            let written = from
                .open(&from_key)
                .map_err(|e| e.with_key(&from_key))
                .and_then(|source| {
                    let head = match heads.remove(&container.key) {
                        Some(head) => head,
                        None => create_for(container, self.storage.as_ref(), &key, durability)?,
                    };
                    finish_checked((source.as_ref(), &from_key), container, head, &key)
                });
            if let Err(e) = written {
                // The one that failed left nothing: its sink aborted.
                self.remove_containers(dir, &copied);
                return Err(e);
            }
            copied.push(to);
        }
        Ok(copied)
    }

    /// Removes `containers` (keys relative to `dir`), best effort: what is left is gc's.
    fn remove_containers(&self, dir: &str, containers: &[ContainerRecord]) {
        for container in containers {
            let _ = self.storage.delete(&format!("{dir}/{}", container.key));
        }
    }
}

/// A sink at `key` of `storage` for a container of `len` bytes, when known (an object store
/// sizes its parts by it, so that a large container stays within the store's part count).
pub(crate) fn create_container(
    storage: &dyn Storage,
    key: &str,
    len: Option<u64>,
    durability: Durability,
) -> Result<Box<dyn Sink>> {
    let mut options = CreateOptions::default()
        .with_mode(WriteMode::Overwrite)
        .with_durability(durability);
    options.expected_len = len;
    storage
        .create(key, &options)
        .map_err(|e| e.with_operation("create").with_key(key))
}

/// A sink at `key` of `storage` for `container`'s bytes, nothing written yet.
fn create_for(
    container: &ContainerRecord,
    storage: &dyn Storage,
    key: &str,
    durability: Durability,
) -> Result<Head> {
    Ok(Head {
        sink: create_container(storage, key, Some(container.len), durability)?,
        len: 0,
        crc: 0,
    })
}

/// Streams `source` (`from` names it in errors), whose bytes `container` records, to `key` of
/// `storage`, comparing length and CRC32C with the record before committing.
fn copy_checked(
    (source, from): (&dyn Source, &str),
    container: &ContainerRecord,
    storage: &dyn Storage,
    key: &str,
    durability: Durability,
) -> Result<()> {
    let head = create_for(container, storage, key, durability)?;
    finish_checked((source, from), container, head, key)
}

/// Writes the bytes of `source` past what `head` holds into its sink, compares length and
/// CRC32C of everything it holds then with `container`'s record, and commits it.
fn finish_checked(
    (source, from): (&dyn Source, &str),
    container: &ContainerRecord,
    head: Head,
    key: &str,
) -> Result<()> {
    container.check_len(source.len(), from)?;
    let Head { mut sink, len, crc } = head;
    if len > source.len() {
        return Err(Error::new(
            ErrorKind::Corrupt,
            format!(
                "{len} bytes were streamed into the copy, more than the {} the commit record says",
                container.len
            ),
        )
        .with_key(key));
    }
    let rest =
        copy_to_sink(source, len..source.len(), sink.as_mut()).map_err(|e| e.with_key(key))?;
    let rest_len = usize::try_from(source.len() - len).unwrap_or(usize::MAX);
    container.check_crc(crc32c_combine(crc, rest, rest_len), from)?;
    sink.commit()
        .map_err(|e| e.with_operation("commit").with_key(key))
}
