//! [`WeightbayStore`]: burn-store's `ModuleStore` over any weightbay storage.

use std::collections::BTreeMap;
use std::sync::Arc;

use burn_store::{
    ApplyResult, BurnpackStore, ModuleSnapshot, ModuleStore, PathFilter, StoreTensor,
};
use weightbay::{
    AccessPolicy, AllocationProperty, Bytes, Durability, Error, ErrorKind, Format, PrefetchPlan,
    Prefetched, Reader, Result, Storage, Tensor, WeightSource, WriteMode, Writer,
};

use crate::dtype::{to_burn_dtype, to_weightbay_dtype};

/// Bytes a load reads ahead of burn at least (an object store's fetch budget when larger).
const READ_AHEAD: u64 = 256 << 20;

/// A burn-store `ModuleStore` over one key of any weightbay [`Storage`].
///
/// Defaults follow burn's `BurnpackStore`: Burnpack, its default metadata (`format`,
/// `producer`, `version`), no overwrite of an existing key, durable saves (where the storage
/// offers them, as burn's file saves fsync), validation on, partial loads refused; no
/// integrity trailer, so the bytes equal burn's.
pub struct WeightbayStore {
    /// `None` for a store over an opened container ([`from_reader`](Self::from_reader)).
    storage: Option<Arc<dyn Storage>>,
    key: String,
    /// The opened container of [`from_reader`](Self::from_reader), until the cache takes it.
    opened: Option<Reader>,
    format: Format,
    metadata: BTreeMap<String, String>,
    filter: Option<PathFilter>,
    allow_partial: bool,
    validate: bool,
    overwrite: bool,
    trailer: bool,
    /// `None`: durable where the storage offers it.
    durability: Option<Durability>,
    /// The stored tensors, read lazily from the key, once.
    cache: Option<BTreeMap<String, StoreTensor>>,
}

impl std::fmt::Debug for WeightbayStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WeightbayStore")
            .field("storage", &self.storage)
            .field("key", &self.key)
            .field("format", &self.format)
            .finish_non_exhaustive()
    }
}

impl WeightbayStore {
    /// The module stored at `key` of `storage`.
    pub fn new(storage: Arc<dyn Storage>, key: impl Into<String>) -> Self {
        Self {
            storage: Some(storage),
            key: key.into(),
            ..Self::new_unplaced()
        }
    }

    /// A store that loads the module from `reader`, a container already opened: a
    /// checkpoint's (`Checkpoint::reader` of `weightbay-checkpoints`, an incremental one
    /// included, whose container is pieces of several) or any other. It only loads: saving
    /// through it fails with [`ErrorKind::Unsupported`].
    pub fn from_reader(reader: Reader) -> Self {
        Self {
            storage: None,
            key: "(an opened container)".to_owned(),
            opened: Some(reader),
            ..Self::new_unplaced()
        }
    }

    /// The settings every store starts from, placed nowhere yet.
    fn new_unplaced() -> Self {
        Self {
            storage: None,
            key: String::new(),
            opened: None,
            format: Format::Burnpack,
            metadata: BurnpackStore::default_metadata(),
            filter: None,
            allow_partial: false,
            validate: true,
            overwrite: false,
            trailer: false,
            durability: None,
            cache: None,
        }
    }

    /// Saves in `format` (Burnpack by default; loading detects the format).
    #[must_use]
    pub fn format(mut self, format: Format) -> Self {
        self.format = format;
        self
    }

    /// Adds a metadata entry to what is saved.
    #[must_use]
    pub fn metadata(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.metadata.insert(key.into(), value.into());
        self
    }

    /// Saves and applies only the tensors `filter` passes.
    #[must_use]
    pub fn with_filter(mut self, filter: PathFilter) -> Self {
        self.filter = Some(filter);
        self
    }

    /// Whether a load may leave parameters the storage lacks untouched (default false).
    #[must_use]
    pub fn allow_partial(mut self, allow: bool) -> Self {
        self.allow_partial = allow;
        self
    }

    /// Whether a load fails on shape or dtype mismatches (default true).
    #[must_use]
    pub fn validate(mut self, validate: bool) -> Self {
        self.validate = validate;
        self
    }

    /// Whether a save may replace an existing container (default false: create-new).
    #[must_use]
    pub fn overwrite(mut self, overwrite: bool) -> Self {
        self.overwrite = overwrite;
        self
    }

    /// Whether a Burnpack save carries weightbay's CRC32C trailer (default false, so the
    /// bytes equal burn's; burn's reader accepts either).
    #[must_use]
    pub fn with_trailer(mut self, trailer: bool) -> Self {
        self.trailer = trailer;
        self
    }

    /// Saves with `durability` instead of the default (durable where the storage offers it).
    #[must_use]
    pub fn durability(mut self, durability: Durability) -> Self {
        self.durability = Some(durability);
        self
    }

    /// A writer of `module`'s tensors (those the filter passes), in this store's format, with
    /// its metadata and trailer setting: what a checkpoint saves, with any `SaveOptions` of
    /// `weightbay-checkpoints` (compressed, incremental), as
    /// `checkpoints.save_with(step, WeightbayStore::writer_of(&model)?, SaveOptions::compressed())`.
    /// Load it back through [`from_reader`](Self::from_reader) of the checkpoint's reader.
    ///
    /// # Errors
    /// [`ErrorKind::Unsupported`] for a dtype weightbay cannot store.
    pub fn writer_of<M: ModuleSnapshot>(module: &M) -> Result<Writer> {
        Self::new_unplaced().writer(module)
    }

    /// [`writer_of`](Self::writer_of) by this store's settings.
    fn writer<M: ModuleSnapshot>(&self, module: &M) -> Result<Writer> {
        let tensors = module
            .collect(self.filter.clone(), None, false)
            .into_iter()
            .map(to_weightbay)
            .collect::<Result<Vec<_>>>()?;
        let mut writer = Writer::new(tensors).with_format(self.format);
        if self.format == Format::Burnpack {
            writer = writer.with_trailer(self.trailer);
        }
        for (key, value) in &self.metadata {
            writer = writer.with_metadata(key, value);
        }
        Ok(writer)
    }

    /// Reads the index of the stored container, once; the tensors' bytes stay unread until
    /// burn applies them.
    fn cache(&mut self) -> Result<&BTreeMap<String, StoreTensor>> {
        if self.cache.is_none() {
            let reader = match (self.opened.take(), &self.storage) {
                (Some(reader), _) => reader,
                (None, Some(storage)) => Reader::open_key(storage.as_ref(), &self.key)?,
                (None, None) => {
                    return Err(Error::new(
                        ErrorKind::Io,
                        "the opened container failed to load before: open it again",
                    ));
                }
            };
            // burn asks for the tensors one at a time as it walks the module: read ahead of
            // it, so the reads (round trips to an object store, copies out of the page cache)
            // overlap burn's own work.
            let budget = reader.fetch_ahead().max(READ_AHEAD);
            let weights = Arc::new(Prefetched::with_budget(reader, PrefetchPlan::All, budget)?);
            let tensors = weights
                .inner()
                .tensors()
                .iter()
                .map(|info| {
                    let dtype =
                        to_burn_dtype(info.dtype()).map_err(|e| e.with_tensor(info.name()))?;
                    let shape: Vec<usize> = info.shape().iter().map(|&d| d as usize).collect();
                    let (weights, name) = (Arc::clone(&weights), info.name().to_owned());
                    let tensor = burn_pack::Tensor::deferred(
                        info.name().to_owned(),
                        dtype,
                        shape,
                        info.param_id(),
                        info.byte_len() as usize,
                        move || {
                            resident(&weights, &name)
                                .map_err(|e| burn_pack::Error::IoError(e.to_string()))
                        },
                    );
                    Ok((info.name().to_owned(), StoreTensor::from(tensor)))
                })
                .collect::<Result<_>>()?;
            self.cache = Some(tensors);
        }
        Ok(self.cache.get_or_insert_with(BTreeMap::new))
    }
}

impl ModuleStore for WeightbayStore {
    type Error = Error;

    fn collect_from<M: ModuleSnapshot>(&mut self, module: &M) -> Result<()> {
        self.cache = None;
        let mut writer = self.writer(module)?.with_mode(if self.overwrite {
            WriteMode::Overwrite
        } else {
            WriteMode::CreateNew
        });
        let storage = self.storage.as_ref().ok_or_else(|| {
            Error::new(
                ErrorKind::Unsupported,
                "a store over an opened container only loads: save through WeightbayStore::new",
            )
        })?;
        let durable = storage.capabilities().durable_commit;
        writer = writer.with_durability(self.durability.unwrap_or(if durable {
            Durability::Durable
        } else {
            Durability::default()
        }));
        writer.write_to(storage.as_ref(), &self.key).map(drop)
    }

    fn apply_to<M: ModuleSnapshot>(&mut self, module: &mut M) -> Result<ApplyResult> {
        let (filter, allow_partial, validate) =
            (self.filter.clone(), self.allow_partial, self.validate);
        let tensors: Vec<StoreTensor> = self.cache()?.values().cloned().collect();
        let result = module.apply(tensors, filter, None, false);
        if validate && !result.errors.is_empty() {
            return Err(Error::new(
                ErrorKind::Corrupt,
                format!(
                    "the stored tensors do not fit the module: {:?}",
                    result.errors
                ),
            )
            .with_key(&self.key));
        }
        if !allow_partial && !result.missing.is_empty() {
            return Err(Error::new(
                ErrorKind::NotFound,
                format!(
                    "tensors the module needs are not stored: {:?}",
                    result.missing
                ),
            )
            .with_key(&self.key));
        }
        Ok(result)
    }

    fn get_tensor(&mut self, name: &str) -> Result<Option<&StoreTensor>> {
        Ok(self.cache()?.get(name))
    }

    fn get_all_tensors(&mut self) -> Result<&BTreeMap<String, StoreTensor>> {
        self.cache()
    }

    fn keys(&mut self) -> Result<Vec<String>> {
        Ok(self.cache()?.keys().cloned().collect())
    }
}

/// Tensor `name`, resident, lent to burn without another copy: the prefetched buffer when
/// one was fetched ahead, else one batched read ([`Reader::load`]: aligned fresh memory from a
/// file, a view of a map or of memory, the fetched buffer from an object store).
fn resident(weights: &Prefetched<Reader>, name: &str) -> Result<burn_std::Bytes> {
    // A tensor the prefetcher had not fetched comes back as a lazy region, which has read
    // nothing yet: dropped for the batched read below.
    let ahead = weights
        .stored_tensor(name)?
        .map(|stored| stored.bytes)
        .filter(|bytes| bytes.read(AccessPolicy::ZeroCopy).is_ok());
    let bytes = match ahead {
        Some(bytes) => bytes,
        None => weights
            .inner()
            .load(&[name])?
            .pop()
            .ok_or_else(|| Error::new(ErrorKind::Io, "a batched read returned nothing"))?,
    };
    // Checked here, so the owner below always has its bytes to lend.
    bytes.read(AccessPolicy::ZeroCopy)?;
    Ok(burn_std::Bytes::from_shared(
        weightbay::SharedBytes::from_owner(Resident(bytes)),
        burn_std::AllocationProperty::Native,
    ))
}

/// weightbay bytes known to be resident, lent to burn.
struct Resident(Bytes);

impl AsRef<[u8]> for Resident {
    fn as_ref(&self) -> &[u8] {
        // `resident` read them with ZeroCopy before wrapping them: memory that is there.
        self.0.read(AccessPolicy::ZeroCopy).unwrap_or_default()
    }
}

/// A burn parameter as a deferred weightbay tensor: read back when the writer reaches it.
fn to_weightbay(tensor: burn_pack::Tensor) -> Result<Tensor> {
    let name = tensor.name.clone();
    let dtype = to_weightbay_dtype(&tensor.dtype).map_err(|e| e.with_tensor(&name))?;
    let shape: Vec<u64> = tensor.shape.iter().map(|&d| d as u64).collect();
    let len = tensor.byte_len() as u64;
    let param_id = tensor.param_id;
    let reported = name.clone();
    let deferred = Tensor::deferred(name, dtype, shape, len, move || {
        let bytes = tensor.to_bytes().map_err(|e| {
            Error::new(ErrorKind::Io, format!("reading the parameter back: {e}"))
                .with_tensor(&reported)
        })?;
        Ok(Bytes::from_shared(
            weightbay::SharedBytes::from_owner(BurnBytes(bytes)),
            AllocationProperty::Native,
        ))
    });
    Ok(match param_id {
        Some(id) => deferred.with_param_id(id),
        None => deferred,
    })
}

/// burn's bytes, lent to weightbay without a copy.
struct BurnBytes(burn_std::Bytes);

impl AsRef<[u8]> for BurnBytes {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}
