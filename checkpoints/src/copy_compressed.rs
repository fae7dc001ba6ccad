//! Copying a checkpoint with its pieces stored encoded: the container streamed from the
//! source, cut where a compressed save would cut it, each piece encoded on the workers a
//! compressed save uses, and the CRC32C of the whole compared with the source's record
//! before the record is written.

use std::sync::Arc;

use weightbay::backend_kit::{copy_to_sink, unique_token};
use weightbay::codec::Elements;
use weightbay::{
    CreateOptions, Durability, Error, ErrorKind, Reader, Result, Source, Storage, WriteMode,
};

use crate::checkpoint::Checkpoint;
use crate::committed_containers::Recording;
use crate::content::DEFAULT_CHUNK_LEN;
use crate::incremental::{DeltaSink, Plan, combined_crc};
use crate::layout;
use crate::record::{
    CommitRecord, ContainerRecord, ENCODED_RECORD_VERSION, PIECES_RECORD_VERSION, Pieces, encode,
};
use crate::run::Checkpoints;
use crate::spliced::Spliced;

impl Checkpoints {
    /// Copies `checkpoint` (from any storage) here under the same step, as
    /// [`copy_from`](Self::copy_from) does, with its container stored as a compressed save
    /// stores one: cut into the header, 1 MiB chunks of each tensor and the trailer, each
    /// piece encoded ([`weightbay::codec`]) where that makes it shorter. The container it
    /// reads as is the source's byte for byte: its CRC32C is compared with the source's
    /// record before the commit record is written, so the copy's record has the same
    /// container name, length and CRC32C as the source's (and a [`Tiered`](crate::Tiered)
    /// value counts one as the other's promotion). A copy that fails or finds the bytes
    /// changed commits nothing and removes what it wrote, unless the failure was the commit
    /// record's own write, which may have landed all the same (an answer lost): then what it
    /// wrote stays for [`gc`](Self::gc), which removes it if no record names it.
    ///
    /// # Errors
    /// [`ErrorKind::InvalidInput`] for a checkpoint of several containers (a sharded set or
    /// one written by several ranks: copy those with [`copy_from`](Self::copy_from));
    /// [`ErrorKind::Corrupt`] naming the source when its bytes differ from its record; as
    /// [`copy_from`](Self::copy_from).
    pub fn copy_compressed_from(
        &self,
        checkpoint: &Checkpoint,
        durability: Durability,
    ) -> Result<CommitRecord> {
        let step = checkpoint.step();
        let _in_flight = self.saves.begin((step, self.step_dir(step)))?;
        let dir = self.step_dir(step);
        let record_key = self.uncommitted_record_key(step)?;
        let (source, whole, from) = container_of(checkpoint)?;
        let save = unique_token();
        let announced = self.announce(step, &save, Vec::new())?;
        let recording = Recording::new(Arc::clone(&self.storage));
        let key = format!("{dir}/{save}/pieces.bin");
        let written = self
            .write_encoded(&source, (&whole, &from), &recording, &key, durability)
            .and_then(|pieces| {
                self.check_lease(Some(announced))?;
                let containers: Vec<ContainerRecord> = recording
                    .written()
                    .into_iter()
                    .map(|(_, len, crc32c)| ContainerRecord {
                        key: format!("{save}/pieces.bin"),
                        len,
                        crc32c,
                    })
                    .collect();
                self.confirm_written(&dir, &containers)?;
                let mut record = checkpoint.record.clone();
                record.weightbay_checkpoint = if pieces.is_encoded() {
                    ENCODED_RECORD_VERSION
                } else {
                    PIECES_RECORD_VERSION
                };
                record.containers = containers;
                record.pieces = Some(pieces);
                Ok((encode(&record)?, record))
            });
        let save_dir = format!("{dir}/{save}");
        let (body, record) = match written {
            Ok(ready) => ready,
            Err(e) => {
                recording.remove_all();
                self.withdraw(step, &save_dir);
                return Err(e);
            }
        };
        let committed =
            self.commit_record(&record_key, &body, durability, || recording.remove_all());
        self.withdraw(step, &save_dir);
        committed.map(|()| record)
    }

    /// Streams `source`, the container `whole` records (`from` names it), through a
    /// [`DeltaSink`] with no base that encodes every piece into `key`, and checks the length
    /// and CRC32C of what streamed against `whole`; returns the pieces.
    fn write_encoded(
        &self,
        source: &Arc<dyn Source>,
        (whole, from): (&ContainerRecord, &str),
        recording: &Recording,
        key: &str,
        durability: Durability,
    ) -> Result<Pieces> {
        whole.check_len(source.len(), from)?;
        let reader = Reader::open(Arc::clone(source)).map_err(|e| e.with_key(from))?;
        let mut tensors: Vec<_> = reader.tensors().iter().collect();
        tensors.sort_by_key(|t| (t.range().start, t.range().end));
        if let Some(pair) = tensors
            .windows(2)
            .find(|pair| pair[1].range().start < pair[0].range().end)
        {
            return Err(Error::new(
                ErrorKind::Unsupported,
                format!(
                    "tensors `{}` and `{}` share bytes: the container cannot be cut into pieces",
                    pair[0].name(),
                    pair[1].name()
                ),
            )
            .with_key(from));
        }
        let ranges: Vec<_> = tensors.iter().map(|t| t.range()).collect();
        let names = tensors.iter().map(|t| t.name().to_owned()).collect();
        let elements = tensors.iter().map(|t| Elements::of(t.dtype())).collect();
        let plan = Plan::whole(whole.len, &ranges, DEFAULT_CHUNK_LEN);
        let create = CreateOptions::default()
            .with_mode(WriteMode::Overwrite)
            .with_durability(durability);
        let inner = recording
            .create(key, &create)
            .map_err(|e| e.with_operation("create").with_key(key))?;
        let stored_key = layout::relative(&self.prefix, key).to_owned();
        let mut sink = DeltaSink::new(inner, stored_key, plan, names, Some(elements));
        let crc = copy_to_sink(source.as_ref(), 0..whole.len, &mut sink)
            .map_err(|e| e.with_operation("write").with_key(key))?;
        whole.check_crc(crc, from)?;
        let list = sink.pieces()?.to_vec();
        sink.commit()
            .map_err(|e| e.with_operation("commit").with_key(key))?;
        Ok(Pieces {
            name: from.rsplit('/').next().unwrap_or(from).to_owned(),
            len: whole.len,
            crc32c: combined_crc(&list),
            chunk_len: DEFAULT_CHUNK_LEN,
            increment: 0,
            list,
        })
    }
}

/// The one container `checkpoint` reads as (its pieces spliced, or its only container), the
/// record of its whole bytes, and the key that names it in errors.
fn container_of(checkpoint: &Checkpoint) -> Result<(Arc<dyn Source>, ContainerRecord, String)> {
    if let Some(pieces) = &checkpoint.record.pieces {
        let source = Spliced::open(checkpoint.storage.as_ref(), &checkpoint.prefix, pieces)?;
        let whole = ContainerRecord {
            key: pieces.name.clone(),
            len: pieces.len,
            crc32c: pieces.crc32c,
        };
        let from = format!("{}/{}", checkpoint.dir(), pieces.name);
        return Ok((Arc::new(source), whole, from));
    }
    let record = &checkpoint.record;
    let (true, [only]) = (record.is_one_container(), record.containers.as_slice()) else {
        return Err(Error::invalid(
            "this checkpoint has several containers (shards or ranks): a compressed copy \
             stores one; copy it with Checkpoints::copy_from",
        ));
    };
    let from = checkpoint.key(&only.key);
    let source = checkpoint
        .storage
        .open(&from)
        .map_err(|e| e.with_key(&from))?;
    Ok((source, only.clone(), from))
}
