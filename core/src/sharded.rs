//! Checkpoints split into shards and published as one unit: every shard is written first,
//! under names unique to this writer, then an index naming them is written last with
//! create-new. Readers find the checkpoint through the index alone, so it exists whole or not
//! at all, and of two writers racing for the same index exactly one wins.

use std::collections::BTreeMap;

use crate::format::Format;
use crate::storage::{CreateOptions, Storage, WriteMode};
use crate::{Error, Result, Tensor, Writer};

/// Writes a checkpoint as shards of about `shard_len` bytes plus an index.
///
/// ```
/// use std::sync::Arc;
/// use weightbay::sharded::ShardedWriter;
/// use weightbay::weights::{ShardedWeights, WeightComponentSpec, WeightSource};
/// use weightbay::{DType, MemoryStorage, Tensor};
///
/// let storage = MemoryStorage::new();
/// let tensors = (0..4).map(|i| Tensor::new(format!("w{i}"), DType::U8, [1000], vec![i as u8; 1000])).collect();
/// let summary = ShardedWriter::new(tensors).with_shard_len(2000).write_to(&storage, "ckpt")?;
/// assert_eq!(summary.shards.len(), 2);
///
/// let weights = ShardedWeights::open(Arc::new(storage), &summary.index)?;
/// let payload = weights.component(&WeightComponentSpec::dense("w3", [1000], DType::U8))?.unwrap();
/// assert_eq!(payload.bytes.to_vec()?, vec![3; 1000]);
/// # Ok::<(), weightbay::Error>(())
/// ```
#[derive(Debug)]
pub struct ShardedWriter {
    tensors: Vec<Tensor>,
    metadata: BTreeMap<String, String>,
    format: Format,
    shard_len: u64,
    name: String,
}

/// What [`ShardedWriter::write_to`] published.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardedSummary {
    /// The index's key: the checkpoint's commit point.
    pub index: String,
    /// The shards' keys, in order.
    pub shards: Vec<String>,
    /// Bytes of tensor data in all shards.
    pub total_size: u64,
}

impl ShardedWriter {
    /// Shards of `tensors`, in order; by default safetensors shards of at most 5 GB, named
    /// `model`.
    pub fn new(tensors: Vec<Tensor>) -> Self {
        Self {
            tensors,
            metadata: BTreeMap::new(),
            format: Format::Safetensors,
            shard_len: 5_000_000_000,
            name: "model".into(),
        }
    }

    /// The most tensor bytes per shard (a larger tensor gets a shard of its own).
    #[must_use]
    pub fn with_shard_len(mut self, shard_len: u64) -> Self {
        self.shard_len = shard_len;
        self
    }

    /// The shards' format (safetensors by default).
    #[must_use]
    pub fn with_format(mut self, format: Format) -> Self {
        self.format = format;
        self
    }

    /// The base name of the index and shards (`model` by default).
    #[must_use]
    pub fn with_name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// Adds a metadata string to every shard.
    #[must_use]
    pub fn with_metadata(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.metadata.insert(key.into(), value.into());
        self
    }

    /// Writes the shards under `directory` (a key prefix; empty for the top level), then the
    /// index `<directory>/<name>.<ext>.index.json` with create-new. On any failure the index
    /// is not written, so no checkpoint is visible; the shards already written stay behind
    /// under this writer's unique names until deleted.
    ///
    /// # Errors
    /// [`ErrorKind::AlreadyExists`](crate::ErrorKind::AlreadyExists) when another writer
    /// published the index first; writer and storage errors otherwise.
    pub fn write_to<S: Storage + ?Sized>(
        self,
        storage: &S,
        directory: &str,
    ) -> Result<ShardedSummary> {
        let extension = match self.format {
            Format::Burnpack => "bpk",
            Format::Safetensors => "safetensors",
        };
        let prefix = if directory.is_empty() {
            String::new()
        } else {
            format!("{}/", directory.trim_end_matches('/'))
        };
        let index = format!("{prefix}{}.{extension}.index.json", self.name);

        let mut groups: Vec<(Vec<Tensor>, u64)> = Vec::new();
        for tensor in self.tensors {
            let len = tensor.byte_len();
            match groups.last_mut() {
                Some((group, size)) if *size + len <= self.shard_len => {
                    group.push(tensor);
                    *size += len;
                }
                _ => groups.push((vec![tensor], len)),
            }
        }
        if groups.is_empty() {
            groups.push((Vec::new(), 0));
        }
        // Unique to this writer, so two writers racing never overwrite each other's shards.
        let run = {
            use std::hash::BuildHasher;
            std::collections::hash_map::RandomState::new()
                .hash_one((std::process::id(), std::time::SystemTime::now()))
        };
        let count = groups.len();
        let mut weight_map = BTreeMap::new();
        let mut shards = Vec::with_capacity(count);
        let mut total_size = 0u64;
        for (number, (group, _)) in groups.into_iter().enumerate() {
            let file = format!(
                "{}-{run:016x}-{:05}-of-{count:05}.{extension}",
                self.name,
                number + 1
            );
            for tensor in &group {
                weight_map.insert(tensor.name().to_owned(), file.clone());
                total_size += tensor.byte_len();
            }
            // Shard names are unique, so a plain overwrite is safe (and, on object stores,
            // cheaper than create-new); only the index needs create-new.
            let mut writer = Writer::new(group).with_format(self.format);
            for (key, value) in &self.metadata {
                writer = writer.with_metadata(key, value);
            }
            let key = format!("{prefix}{file}");
            writer.write_to(storage, &key)?;
            shards.push(key);
        }
        let body = serde_json::json!({
            "metadata": { "total_size": total_size },
            "weight_map": weight_map,
        });
        let bytes =
            serde_json::to_vec_pretty(&body).map_err(|e| Error::invalid(format!("index: {e}")))?;
        let options = CreateOptions::default()
            .with_mode(WriteMode::CreateNew)
            .with_expected_len(bytes.len() as u64);
        let mut sink = storage
            .create(&index, &options)
            .map_err(|e| e.with_operation("create").with_key(&index))?;
        sink.write(&bytes)
            .map_err(|e| e.with_operation("write").with_key(&index))?;
        sink.commit()
            .map_err(|e| e.with_operation("commit").with_key(&index))?;
        Ok(ShardedSummary {
            index,
            shards,
            total_size,
        })
    }
}
