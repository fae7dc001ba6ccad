//! Checkpoints split into shards and published as one unit: every shard is written first,
//! under names unique to this writer, then an index naming them is written last with
//! create-new. Readers find the checkpoint through the index alone ([`ShardedWeights`]), so it
//! exists whole or not at all, and of two writers racing for the same index exactly one wins.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use crate::format::MAX_INDEX_LEN;
use crate::keys::unique_token;
use crate::options::WriteMode;
use crate::storage::Storage;
use crate::storage_ext::StorageExt;
use crate::weights::{StoredTensor, TensorAllocator, WeightSource};
use crate::{Error, ErrorKind, Reader, Result, Tensor, Writer};

/// Writes a checkpoint as shards of about `shard_len` bytes plus an index. Every shard is
/// written with the settings of the [`Writer`] it is given (format, metadata, scalars,
/// trailer, alignment, durability, limits, cancellation); its write mode is not used, since
/// shards get names of their own and the index is always created new.
///
/// ```
/// use std::sync::Arc;
/// use weightbay::{
///     DType, Format, MemoryStorage, ShardedWeights, ShardedWriter, Tensor, WeightComponentSpec,
///     WeightSource, Writer,
/// };
///
/// let storage = MemoryStorage::new();
/// let tensors = (0..4).map(|i| Tensor::new(format!("w{i}"), DType::U8, [1000], vec![i as u8; 1000])).collect();
/// let writer = Writer::new(tensors).with_format(Format::Safetensors);
/// let summary = ShardedWriter::new(writer).with_shard_len(2000).write_to(&storage, "ckpt")?;
/// assert_eq!(summary.shards.len(), 2);
///
/// let weights = ShardedWeights::open(Arc::new(storage), &summary.index)?;
/// let payload = weights.component(&WeightComponentSpec::dense("w3", [1000], DType::U8))?.unwrap();
/// assert_eq!(payload.bytes.to_vec()?, vec![3; 1000]);
/// # Ok::<(), weightbay::Error>(())
/// ```
#[derive(Debug)]
pub struct ShardedWriter {
    writer: Writer,
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
    /// Shards of the writer's tensors, in order, of at most 5 GB each, named `model`.
    pub fn new(writer: Writer) -> Self {
        Self {
            writer,
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

    /// The base name of the index and shards (`model` by default).
    #[must_use]
    pub fn with_name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
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
        let format = self.writer.format();
        let extension = format.extension();
        let prefix = if directory.is_empty() {
            String::new()
        } else {
            format!("{}/", directory.trim_end_matches('/'))
        };
        let index = format!("{prefix}{}.{extension}.index.json", self.name);

        let (tensors, settings) = self.writer.into_parts();
        let mut groups: Vec<(Vec<Tensor>, u64)> = Vec::new();
        for tensor in tensors {
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
        let run = unique_token();
        let count = groups.len();
        let mut weight_map = BTreeMap::new();
        let mut shards = Vec::with_capacity(count);
        let mut total_size = 0u64;
        for (number, (group, _)) in groups.into_iter().enumerate() {
            let file = format!(
                "{}-{run}-{:05}-of-{count:05}.{extension}",
                self.name,
                number + 1
            );
            for tensor in &group {
                weight_map.insert(tensor.name().to_owned(), file.clone());
                total_size += tensor.byte_len();
            }
            // Shard names are unique, so a plain overwrite is safe (and, on object stores,
            // cheaper than create-new); only the index needs create-new.
            let key = format!("{prefix}{file}");
            settings
                .with_tensors(group)
                .with_mode(WriteMode::Overwrite)
                .write_to(storage, &key)?;
            shards.push(key);
        }
        let body = serde_json::json!({
            "metadata": { "total_size": total_size },
            "weight_map": weight_map,
        });
        let bytes =
            serde_json::to_vec_pretty(&body).map_err(|e| Error::invalid(format!("index: {e}")))?;
        storage.write_new(&index, &bytes, settings.durability())?;
        Ok(ShardedSummary {
            index,
            shards,
            total_size,
        })
    }
}

/// The key in an index's `metadata` under which a writer that knows them records each shard
/// file's length and CRC32C (`weightbay export` does), so that a verify can check every byte
/// of a format without a trailer. Readers of the Hugging Face layout ignore it.
pub const SHARD_CHECKSUMS_KEY: &str = "weightbay.shards";

/// A shard file's length and CRC32C, as an index records them under [`SHARD_CHECKSUMS_KEY`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ShardChecksum {
    /// The file's length in bytes.
    pub len: u64,
    /// The CRC32C of all of its bytes.
    pub crc32c: u32,
}

/// Checks a shard file name from an index: it must be a valid key
/// ([`validate_key`](crate::keys::validate_key): relative, non-empty, no `.` or `..`
/// segment, no backslash or NUL, at most 1024 bytes).
///
/// # Errors
/// [`ErrorKind::Corrupt`] naming the file.
fn check_shard_name(name: &str) -> Result<()> {
    crate::keys::validate_key(name).map_err(|e| {
        Error::corrupt(format!(
            "index names shard `{name}`, which is not a plain relative path"
        ))
        .with_source(e)
    })
}

/// A checkpoint split into shards, found through an index (`model.safetensors.index.json`,
/// or the Burnpack equivalent written by [`ShardedWriter`]) whose
/// `weight_map` names each tensor's shard, relative to the index. Shards are opened on first
/// use, from any [`Storage`].
pub struct ShardedWeights {
    storage: Arc<dyn Storage>,
    directory: String,
    weight_map: HashMap<String, String>,
    checksums: BTreeMap<String, ShardChecksum>,
    open: Mutex<HashMap<String, Arc<Reader>>>,
}

impl std::fmt::Debug for ShardedWeights {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShardedWeights")
            .field("directory", &self.directory)
            .field("tensors", &self.weight_map.len())
            .finish_non_exhaustive()
    }
}

impl ShardedWeights {
    /// Reads the index at `index_key` in `storage`.
    ///
    /// # Errors
    /// [`ErrorKind::NotFound`]; [`ErrorKind::Corrupt`] for an index that is not valid JSON
    /// with a `weight_map` of relative shard names.
    pub fn open(storage: Arc<dyn Storage>, index_key: &str) -> Result<Self> {
        let source = storage.open(index_key)?;
        if source.len() > MAX_INDEX_LEN {
            return Err(
                Error::new(ErrorKind::LimitExceeded, "index file over 16 MiB").with_key(index_key),
            );
        }
        let mut text = vec![0; usize::try_from(source.len()).unwrap_or(0)];
        source.read_at(0, &mut text)?;
        // Other writers put what they like in `metadata`; only our own key is read, and
        // only that must parse.
        #[derive(serde::Deserialize)]
        struct Metadata {
            #[serde(default, rename = "weightbay.shards")]
            checksums: BTreeMap<String, ShardChecksum>,
        }
        #[derive(serde::Deserialize)]
        struct Index {
            weight_map: HashMap<String, String>,
            #[serde(default)]
            metadata: Option<serde_json::Value>,
        }
        let corrupt =
            |e: serde_json::Error| Error::corrupt(format!("index: {e}")).with_key(index_key);
        let index: Index = serde_json::from_slice(&text).map_err(corrupt)?;
        let checksums = match index.metadata {
            Some(metadata) if metadata.get(SHARD_CHECKSUMS_KEY).is_some() => {
                serde_json::from_value::<Metadata>(metadata)
                    .map_err(corrupt)?
                    .checksums
            }
            _ => BTreeMap::new(),
        };
        for file in index.weight_map.values().chain(checksums.keys()) {
            check_shard_name(file).map_err(|e| e.with_key(index_key))?;
        }
        let directory = index_key
            .rsplit_once('/')
            .map(|(dir, _)| format!("{dir}/"))
            .unwrap_or_default();
        Ok(Self {
            storage,
            directory,
            weight_map: index.weight_map,
            checksums,
            open: Mutex::new(HashMap::new()),
        })
    }

    /// The length and CRC32C the index records for the shard at `key` (one of
    /// [`shard_keys`](Self::shard_keys)), if it records them.
    pub fn recorded_checksum(&self, key: &str) -> Option<ShardChecksum> {
        let file = key.strip_prefix(&self.directory)?;
        self.checksums.get(file).copied()
    }

    /// The tensor names the index lists.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.weight_map.keys().map(String::as_str)
    }

    /// The keys of the shards the index names, sorted, each once.
    pub fn shard_keys(&self) -> Vec<String> {
        let files: std::collections::BTreeSet<&String> = self.weight_map.values().collect();
        files
            .into_iter()
            .map(|file| format!("{}{file}", self.directory))
            .collect()
    }

    /// Checks the index against its shards both ways: every tensor it maps is in the shard it
    /// names, and every tensor of every shard it names is mapped to that shard. The index is
    /// input like any other: one that lists tensors no shard holds, or leaves out tensors its
    /// shards hold, describes another model than the one stored.
    ///
    /// # Errors
    /// [`ErrorKind::Corrupt`] naming the tensor and the shard's key, or for an index that maps
    /// no tensor; as a shard's [`Reader::open`].
    pub fn check_map(&self) -> Result<()> {
        if self.weight_map.is_empty() {
            return Err(Error::corrupt("the index's weight_map names no tensor"));
        }
        let mut files: Vec<&String> = self.weight_map.values().collect();
        files.sort_unstable();
        files.dedup();
        for file in files {
            let key = format!("{}{file}", self.directory);
            let shard = self.shard(file)?;
            for tensor in shard.tensors() {
                if self.weight_map.get(tensor.name()) != Some(file) {
                    return Err(Error::corrupt(format!(
                        "`{file}` holds it, and the index does not map it there"
                    ))
                    .with_tensor(tensor.name())
                    .with_key(&key));
                }
            }
        }
        let mut mapped: Vec<(&String, &String)> = self.weight_map.iter().collect();
        mapped.sort_unstable();
        for (name, file) in mapped {
            if self.shard(file)?.tensor(name).is_err() {
                return Err(Error::corrupt(format!(
                    "the index puts it in `{file}`, which does not hold it"
                ))
                .with_tensor(name)
                .with_key(format!("{}{file}", self.directory)));
            }
        }
        Ok(())
    }

    fn shard(&self, file: &str) -> Result<Arc<Reader>> {
        let mut open = self
            .open
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(reader) = open.get(file) {
            return Ok(Arc::clone(reader));
        }
        let key = format!("{}{file}", self.directory);
        let reader =
            Arc::new(Reader::open(self.storage.open(&key)?).map_err(|e| e.with_key(&key))?);
        open.insert(file.to_owned(), Arc::clone(&reader));
        Ok(reader)
    }
}

impl WeightSource for ShardedWeights {
    fn stored_tensor(&self, name: &str) -> Result<Option<StoredTensor>> {
        let Some(file) = self.weight_map.get(name) else {
            return Ok(None);
        };
        let shard = self.shard(file)?;
        match shard.stored_tensor(name)? {
            Some(stored) => Ok(Some(stored)),
            None => Err(Error::corrupt(format!(
                "the index puts it in `{file}`, which does not hold it"
            ))
            .with_tensor(name)),
        }
    }

    fn contains(&self, name: &str) -> bool {
        self.weight_map.contains_key(name)
    }

    /// As its shard's [`Reader`] gives it.
    fn lazy_tensor(&self, name: &str) -> Result<Option<StoredTensor>> {
        match self.weight_map.get(name) {
            Some(file) => self.shard(file)?.lazy_tensor(name),
            None => Ok(None),
        }
    }

    /// Opens every shard (one header read each) to learn the tensors' lengths.
    fn catalog(&self) -> Result<Vec<(String, u64)>> {
        let files: std::collections::BTreeSet<&String> = self.weight_map.values().collect();
        let mut catalog = Vec::with_capacity(self.weight_map.len());
        for file in files {
            let shard = self.shard(file)?;
            catalog.extend(
                shard
                    .catalog()?
                    .into_iter()
                    .filter(|(name, _)| self.weight_map.get(name) == Some(file)),
            );
        }
        Ok(catalog)
    }

    /// The first shard's: every shard is on the same storage.
    fn fetch_ahead(&self) -> u64 {
        let first = self.weight_map.values().min();
        first
            .and_then(|file| self.shard(file).ok())
            .map_or(0, |shard| shard.fetch_ahead())
    }

    /// One batched read per shard the names touch.
    fn stored_tensors(&self, names: &[String]) -> Result<Vec<Option<StoredTensor>>> {
        self.by_shard(names, |shard, wanted| shard.stored_tensors(wanted))
    }

    /// One batched read per shard the names touch, each into `allocator`'s memory.
    fn stored_tensors_in(
        &self,
        names: &[String],
        allocator: &dyn TensorAllocator,
    ) -> Result<Vec<Option<StoredTensor>>> {
        self.by_shard(names, |shard, wanted| {
            shard.stored_tensors_in(wanted, allocator)
        })
    }
}

impl ShardedWeights {
    /// `names`, in order, read with one `read` of each shard they touch.
    fn by_shard(
        &self,
        names: &[String],
        read: impl Fn(&Reader, &[String]) -> Result<Vec<Option<StoredTensor>>>,
    ) -> Result<Vec<Option<StoredTensor>>> {
        let mut by_shard: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
        for (i, name) in names.iter().enumerate() {
            if let Some(file) = self.weight_map.get(name) {
                by_shard.entry(file.as_str()).or_default().push(i);
            }
        }
        let mut out: Vec<Option<StoredTensor>> = vec![None; names.len()];
        for (file, indices) in by_shard {
            let first = indices.first().map_or("", |&i| names[i].as_str());
            let shard = self.shard(file).map_err(|e| e.with_tensor(first))?;
            let wanted: Vec<String> = indices.iter().map(|&i| names[i].clone()).collect();
            for (i, stored) in indices.into_iter().zip(read(&shard, &wanted)?) {
                if stored.is_none() {
                    return Err(Error::corrupt(format!(
                        "the index puts it in `{file}`, which does not hold it"
                    ))
                    .with_tensor(&names[i]));
                }
                out[i] = stored;
            }
        }
        Ok(out)
    }
}
