//! Object-storage backend for weightbay, on the `object_store` crate: S3, GCS, Azure, local
//! files and memory behind one [`ObjectStorage`].
//!
//! Writing streams the container as one multipart upload, with the part size chosen from the
//! planned total so no object needs more than 10,000 parts and a bounded number of parts in
//! flight: memory stays at about part size × (parts in flight + 1), whatever the checkpoint's
//! size. Completing the upload is the atomic publish; an error, a panic or a dropped sink
//! aborts it. Containers smaller than one part go as a single PUT. Create-new is race-free
//! (see [`ObjectStorage`] and docs/DURABILITY.md for the protocol).
//!
//! Reading pins the object version (or ETag) seen at open, gets the header and metadata in the
//! same first request, and fetches tensors lazily or with [`ObjectSource::fetch`] in coalesced
//! parallel ranges.
//!
//! The core traits are synchronous; the backend runs `object_store`'s futures on a runtime of
//! its own (or one you lend it with [`Bridge::borrowed`]). From async code, save and load with
//! the `_in_background` calls, which run on a thread of their own and are awaited without
//! blocking any runtime thread (a `current_thread` runtime included):
//!
//! ```
//! use std::sync::Arc;
//! use weightbay::{DType, Reader, Tensor, Writer};
//! use weightbay_object_store::open_url;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let storage = Arc::new(open_url("memory:///checkpoints", std::iter::empty::<(&str, &str)>())?);
//! Writer::new(vec![Tensor::new("w", DType::U8, [3], vec![1, 2, 3])])
//!     .write_in_background(Arc::clone(&storage), "step-1.bpk")?
//!     .await?;
//! let reader = Reader::open_in_background(storage, "step-1.bpk")?.await?;
//! let loaded = reader.load_all_in_background()?.await?;
//! assert_eq!(loaded[0].0.name(), "w");
//! # Ok(())
//! # }
//! ```
#![warn(missing_docs)]

mod error;
mod location;
mod runtime;
mod sink;
mod source;

use std::sync::Arc;
use std::time::Duration;

use futures::TryStreamExt;
pub use location::Location;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, ObjectStoreScheme};
pub use runtime::Bridge;
use sink::ObjectSink;
pub use source::ObjectSource;
use weightbay::backend_kit::{validate_key, validate_prefix};
use weightbay::{
    Capabilities, CreateOptions, Error, ErrorKind, Listed, Result, Sink, Source, Storage,
};

use crate::error::convert;

/// The smallest part S3 and GCS accept (except the last).
pub const MIN_PART_SIZE: usize = 5 * 1024 * 1024;
/// The most parts one multipart upload may have.
pub const MAX_PARTS: u64 = 10_000;
/// Staged uploads for create-new live under this first key segment, which user keys may not
/// use.
pub const STAGING_DIR: &str = ".weightbay-staging";

/// Tuning for an [`ObjectStorage`]: [`ObjectStoreOptions::DEFAULT`] and the `with_` setters
/// (usable in a `const`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct ObjectStoreOptions {
    /// The smallest part size, raised for large containers so they fit in 10,000 parts.
    /// Default 8 MiB. S3 and GCS refuse parts under [`MIN_PART_SIZE`] (except the last);
    /// in-memory and local stores take any size.
    pub part_size: usize,
    /// Parts uploading at once; the writer blocks when this many are in flight. Default 8.
    pub parts_in_flight: usize,
    /// Whether a completed upload survives power loss. Default false; [`open_url`] sets it
    /// for S3, GCS and Azure.
    pub durable: bool,
    /// Bytes [`ObjectSource::fetch`] keeps in flight at once. Default 256 MiB.
    pub fetch_budget: usize,
    /// The largest request [`ObjectSource::fetch`] makes (coalesced ranges up to this long, a
    /// longer tensor in pieces this long), or `None` for one request per run of adjacent
    /// ranges (what `object_store`'s `get_ranges` makes).
    ///
    /// Default 16 MiB: a cloud store caps what one connection carries, so a load runs as
    /// many parallel ranged GETs as the budget allows. Measured against a store with 20 ms to
    /// first byte and 100 MiB/s per connection (docs/BENCHMARKS.md, "remote" rows), 16 MiB
    /// requests within the default budget (16 in flight) load 3.4× faster than 64 MiB ones (4
    /// in flight), and smaller requests lose more to latency than they gain. [`open_url`] picks
    /// `None` for stores on this machine (`memory://`, `file://`, an endpoint on loopback such
    /// as moto, MinIO or LocalStack), where there is no per-connection limit to spread over and
    /// every extra request is work for the same cores; some emulators (moto) even read the
    /// whole object for each ranged GET.
    pub fetch_request_len: Option<u64>,
    /// Staged create-new uploads older than this are [`Storage::clean_pending`]'s to remove.
    /// Default one hour.
    pub stale_after: Duration,
}

impl Default for ObjectStoreOptions {
    fn default() -> Self {
        Self::DEFAULT
    }
}

impl ObjectStoreOptions {
    /// The defaults each field documents.
    pub const DEFAULT: Self = Self {
        part_size: 8 * 1024 * 1024,
        parts_in_flight: 8,
        durable: false,
        fetch_budget: 256 * 1024 * 1024,
        fetch_request_len: Some(16 * 1024 * 1024),
        stale_after: Duration::from_secs(3600),
    };

    /// Sets [`part_size`](Self::part_size).
    #[must_use]
    pub const fn with_part_size(mut self, part_size: usize) -> Self {
        self.part_size = part_size;
        self
    }

    /// Sets [`parts_in_flight`](Self::parts_in_flight).
    #[must_use]
    pub const fn with_parts_in_flight(mut self, parts: usize) -> Self {
        self.parts_in_flight = parts;
        self
    }

    /// Sets [`durable`](Self::durable).
    #[must_use]
    pub const fn with_durable(mut self, durable: bool) -> Self {
        self.durable = durable;
        self
    }

    /// Sets [`fetch_budget`](Self::fetch_budget).
    #[must_use]
    pub const fn with_fetch_budget(mut self, bytes: usize) -> Self {
        self.fetch_budget = bytes;
        self
    }

    /// Sets [`fetch_request_len`](Self::fetch_request_len).
    #[must_use]
    pub const fn with_fetch_request_len(mut self, len: Option<u64>) -> Self {
        self.fetch_request_len = len;
        self
    }

    /// Sets [`stale_after`](Self::stale_after).
    #[must_use]
    pub const fn with_stale_after(mut self, age: Duration) -> Self {
        self.stale_after = age;
        self
    }

    /// The part size for a container of `total_len` bytes (unknown: the configured size).
    ///
    /// The configured size, exactly, unless the container would then need more than
    /// [`MAX_PARTS`] parts; then the smallest whole number of MiB that fits it in them.
    pub fn part_size_for(&self, total_len: Option<u64>) -> usize {
        let configured = self.part_size.max(1);
        let needed = total_len.map_or(0, |len| len.div_ceil(MAX_PARTS));
        if needed <= configured as u64 {
            configured
        } else {
            usize::try_from(needed.next_multiple_of(1 << 20)).unwrap_or(usize::MAX)
        }
    }

    /// The most bytes a sink holds: one part filling plus the parts in flight.
    pub fn buffer_bound(&self, total_len: Option<u64>) -> u64 {
        self.part_size_for(total_len) as u64 * (self.parts_in_flight as u64 + 1)
    }
}

/// Containers as objects under a prefix of any `object_store` store.
///
/// # Create-new
/// A container that fits in one part is published with a single conditional PUT
/// (`If-None-Match: *` or its store's equivalent). A larger one cannot be: `object_store`
/// sends no condition on completing a multipart upload. It is uploaded to a staging key under
/// [`STAGING_DIR`] and then copied to its key with a conditional copy (`copy_if_not_exists`),
/// which fails if anything is there; the staging object is then deleted. A crash in between
/// leaves a staging object, never a partial container; [`Storage::clean_pending`] removes
/// staging objects older than [`ObjectStoreOptions::stale_after`]. On S3 the conditional
/// copy is a multipart copy of one part, so create-new of containers over 5 GiB is refused
/// there.
#[derive(Debug, Clone)]
pub struct ObjectStorage {
    store: Arc<dyn ObjectStore>,
    prefix: Path,
    bridge: Bridge,
    options: ObjectStoreOptions,
}

impl ObjectStorage {
    /// Objects of `store`, under no prefix, on a runtime owned by this storage.
    ///
    /// # Errors
    /// [`ErrorKind::Io`] when the runtime cannot start.
    pub fn new(store: Arc<dyn ObjectStore>) -> Result<Self> {
        Ok(Self::with_bridge(store, Bridge::owned()?))
    }

    /// Objects of `store` on the given runtime bridge.
    pub fn with_bridge(store: Arc<dyn ObjectStore>, bridge: Bridge) -> Self {
        Self {
            store,
            prefix: Path::default(),
            bridge,
            options: ObjectStoreOptions::default(),
        }
    }

    /// Keys live under `prefix` (a `/`-separated path).
    ///
    /// # Errors
    /// [`ErrorKind::InvalidInput`] for a prefix `object_store` cannot express.
    pub fn with_prefix(mut self, prefix: &str) -> Result<Self> {
        self.prefix =
            Path::parse(prefix).map_err(|e| Error::invalid("bad object prefix").with_source(e))?;
        Ok(self)
    }

    /// Sets the tuning options.
    #[must_use]
    pub fn with_options(mut self, options: ObjectStoreOptions) -> Self {
        self.options = options;
        self
    }

    /// The tuning options.
    pub fn options(&self) -> &ObjectStoreOptions {
        &self.options
    }

    /// The underlying store.
    pub fn store(&self) -> &Arc<dyn ObjectStore> {
        &self.store
    }

    /// The prefix keys live under.
    pub fn prefix(&self) -> &Path {
        &self.prefix
    }

    /// The object path of `key`.
    fn path(&self, key: &str) -> Result<Path> {
        validate_key(key)?;
        if key.split('/').next() == Some(STAGING_DIR) {
            return Err(
                Error::invalid(format!("keys under `{STAGING_DIR}/` are reserved")).with_key(key),
            );
        }
        Ok(key
            .split('/')
            .fold(self.prefix.clone(), |path, segment| path.join(segment)))
    }

    /// Opens `key` as an [`ObjectSource`], for [`ObjectSource::fetch`].
    ///
    /// # Errors
    /// [`ErrorKind::NotFound`]; the store's error.
    pub fn open_object(&self, key: &str) -> Result<ObjectSource> {
        let path = self.path(key)?;
        ObjectSource::open(
            Arc::clone(&self.store),
            path,
            key.to_owned(),
            self.bridge.clone(),
            &self.options,
        )
    }

    fn staging_prefix(&self) -> Path {
        self.prefix.clone().join(STAGING_DIR)
    }

    /// Staging objects, with their age.
    fn staged(&self) -> Result<Vec<(Path, Duration)>> {
        let store = Arc::clone(&self.store);
        let prefix = self.staging_prefix();
        let listed = self
            .bridge
            .run(async move { store.list(Some(&prefix)).try_collect::<Vec<_>>().await })?;
        let objects = listed.map_err(|e| convert("listing staged uploads", e))?;
        let now = chrono_now();
        Ok(objects
            .into_iter()
            .map(|meta| {
                let age =
                    now.saturating_sub(meta.last_modified.timestamp().try_into().unwrap_or(0));
                (meta.location, Duration::from_secs(age))
            })
            .collect())
    }

    fn relative(&self, path: &Path) -> String {
        path.prefix_match(&self.prefix)
            .map(|parts| {
                parts
                    .map(|part| part.as_ref().to_owned())
                    .collect::<Vec<_>>()
                    .join("/")
            })
            .unwrap_or_else(|| path.to_string())
    }
}

impl ObjectStorage {
    /// Refuses a configured part size the store would refuse: S3 and GCS take no part under
    /// [`MIN_PART_SIZE`] but the last; Azure, in-memory and local stores take any size.
    fn check_part_size(&self) -> Result<()> {
        let name = self.store.to_string();
        let strict = name.starts_with("AmazonS3") || name.starts_with("GoogleCloudStorage");
        if strict && self.options.part_size < MIN_PART_SIZE {
            return Err(Error::invalid(format!(
                "a part size of {} bytes is under the 5 MiB that {name} accepts for every part \
                 but the last; set ObjectStoreOptions::part_size to at least MIN_PART_SIZE",
                self.options.part_size
            )));
        }
        Ok(())
    }
}

/// Seconds since the Unix epoch.
fn chrono_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

impl Storage for ObjectStorage {
    fn capabilities(&self) -> Capabilities {
        let capabilities = Capabilities::NONE
            .with_atomic_create_new()
            .with_pending_listing()
            .with_listing();
        if self.options.durable {
            capabilities.with_durable_commit()
        } else {
            capabilities
        }
    }

    fn create(&self, key: &str, options: &CreateOptions) -> Result<Box<dyn Sink>> {
        let path = self.path(key)?;
        self.capabilities().check(options)?;
        self.check_part_size().map_err(|e| e.with_key(key))?;
        Ok(Box::new(ObjectSink::new(self.clone(), key, path, options)?))
    }

    fn open(&self, key: &str) -> Result<Arc<dyn Source>> {
        Ok(Arc::new(self.open_object(key)?))
    }

    fn delete(&self, key: &str) -> Result<()> {
        let path = self.path(key)?;
        let store = Arc::clone(&self.store);
        let result = self.bridge.run(async move {
            // object_store's delete succeeds on a missing object on some stores: ask first.
            store.head(&path).await?;
            store.delete(&path).await
        })?;
        result.map_err(|e| convert("deleting the object", e).with_key(key))
    }

    fn pending(&self) -> Result<Vec<String>> {
        Ok(self
            .staged()?
            .iter()
            .map(|(path, _)| self.relative(path))
            .collect())
    }

    fn clean_pending(&self) -> Result<Vec<String>> {
        let mut removed = Vec::new();
        for (path, age) in self.staged()? {
            if age >= self.options.stale_after {
                let store = Arc::clone(&self.store);
                let target = path.clone();
                self.bridge
                    .run(async move { store.delete(&target).await })?
                    .map_err(|e| convert("removing a staged upload", e))?;
                removed.push(self.relative(&path));
            }
        }
        Ok(removed)
    }

    /// One LIST request per page of 1,000 objects (S3, GCS, Azure); staged create-new uploads
    /// and unfinished multipart uploads are not objects and never appear.
    fn list(&self, prefix: &str) -> Result<Vec<Listed>> {
        validate_prefix(prefix)?;
        let under = if prefix.is_empty() {
            self.prefix.clone()
        } else {
            self.path(prefix)?
        };
        let store = Arc::clone(&self.store);
        let listed = self.bridge.run(async move {
            let under = (!under.as_ref().is_empty()).then_some(under);
            store.list(under.as_ref()).try_collect::<Vec<_>>().await
        })?;
        let objects = listed.map_err(|e| convert("listing objects", e))?;
        let mut found: Vec<Listed> = objects
            .into_iter()
            .filter_map(|meta| {
                let key = self.relative(&meta.location);
                let listed =
                    key.split('/').next() != Some(STAGING_DIR) && validate_key(&key).is_ok();
                listed.then_some(Listed {
                    key,
                    len: meta.size,
                })
            })
            .collect();
        found.sort();
        Ok(found)
    }
}

/// Opens the store a URL names: `s3://bucket/prefix`, `gs://bucket/prefix`,
/// `az://container/prefix` (and the https forms `object_store` recognises), `file:///dir`,
/// `memory:///prefix`. Cloud stores start from their standard environment variables
/// (`AWS_*`, `GOOGLE_*`, `AZURE_*`), then apply `options` (object_store configuration keys,
/// such as `aws_endpoint`), exactly as `object_store` users configure them. Credentials are
/// never logged or put in error messages.
///
/// # Errors
/// [`ErrorKind::InvalidInput`] for a URL that is not one of these, or a bad option.
pub fn open_url<I, K, V>(url: &str, options: I) -> Result<ObjectStorage>
where
    I: IntoIterator<Item = (K, V)>,
    K: AsRef<str>,
    V: Into<String>,
{
    open_url_with(url, options, Retry::default())
}

/// How cloud stores retry: object_store's policy when a cloud store is built in.
#[cfg(any(feature = "aws", feature = "gcp", feature = "azure"))]
type Retry = object_store::RetryConfig;
#[cfg(not(any(feature = "aws", feature = "gcp", feature = "azure")))]
type Retry = ();

/// [`open_url`] with an explicit retry policy for the cloud stores (object_store's default
/// retries for up to three minutes; a command-line tool may want to give up sooner).
///
/// # Errors
/// As [`open_url`].
#[cfg(any(feature = "aws", feature = "gcp", feature = "azure"))]
pub fn open_url_with_retry<I, K, V>(
    url: &str,
    options: I,
    retry: object_store::RetryConfig,
) -> Result<ObjectStorage>
where
    I: IntoIterator<Item = (K, V)>,
    K: AsRef<str>,
    V: Into<String>,
{
    open_url_with(url, options, retry)
}

fn open_url_with<I, K, V>(url: &str, options: I, retry: Retry) -> Result<ObjectStorage>
where
    I: IntoIterator<Item = (K, V)>,
    K: AsRef<str>,
    V: Into<String>,
{
    let bad = |message: String| Error::invalid(message);
    let parsed = url::Url::parse(url).map_err(|e| bad(format!("`{url}` is not a URL: {e}")))?;
    let (scheme, prefix) = ObjectStoreScheme::parse(&parsed)
        .map_err(|e| bad(format!("`{url}` names no known object store: {e}")))?;
    #[cfg(any(feature = "aws", feature = "gcp", feature = "azure"))]
    let configure =
        |message: &str, e: object_store::Error| convert(message.to_owned(), e).with_key(url);
    #[cfg(not(any(feature = "aws", feature = "gcp", feature = "azure")))]
    let _ = (retry, options);
    let mut durable = true;
    // Whether the store runs on this machine, which changes how loads are split.
    let local;
    let store: Arc<dyn ObjectStore> = match scheme {
        #[cfg(feature = "aws")]
        ObjectStoreScheme::AmazonS3 => {
            use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey};
            let mut builder = AmazonS3Builder::from_env().with_url(url).with_retry(retry);
            for (key, value) in options {
                let key: AmazonS3ConfigKey = key
                    .as_ref()
                    .parse()
                    .map_err(|e| configure("bad S3 option", e))?;
                builder = builder.with_config(key, value);
            }
            if builder
                .get_config_value(&AmazonS3ConfigKey::CopyIfNotExists)
                .is_none()
            {
                // Create-new of large containers needs a conditional copy.
                builder = builder.with_config(AmazonS3ConfigKey::CopyIfNotExists, "multipart");
            }
            local = builder
                .get_config_value(&AmazonS3ConfigKey::Endpoint)
                .is_some_and(|endpoint| is_loopback(&endpoint));
            Arc::new(
                builder
                    .build()
                    .map_err(|e| configure("configuring S3", e))?,
            )
        }
        #[cfg(feature = "gcp")]
        ObjectStoreScheme::GoogleCloudStorage => {
            use object_store::gcp::{GoogleCloudStorageBuilder, GoogleConfigKey};
            let mut builder = GoogleCloudStorageBuilder::from_env()
                .with_url(url)
                .with_retry(retry);
            for (key, value) in options {
                let key: GoogleConfigKey = key
                    .as_ref()
                    .parse()
                    .map_err(|e| configure("bad GCS option", e))?;
                builder = builder.with_config(key, value);
            }
            local = builder
                .get_config_value(&GoogleConfigKey::BaseUrl)
                .is_some_and(|endpoint| is_loopback(&endpoint));
            Arc::new(
                builder
                    .build()
                    .map_err(|e| configure("configuring GCS", e))?,
            )
        }
        #[cfg(feature = "azure")]
        ObjectStoreScheme::MicrosoftAzure => {
            use object_store::azure::{AzureConfigKey, MicrosoftAzureBuilder};
            let mut builder = MicrosoftAzureBuilder::from_env()
                .with_url(url)
                .with_retry(retry);
            for (key, value) in options {
                let key: AzureConfigKey = key
                    .as_ref()
                    .parse()
                    .map_err(|e| configure("bad Azure option", e))?;
                builder = builder.with_config(key, value);
            }
            local = builder
                .get_config_value(&AzureConfigKey::UseEmulator)
                .is_some_and(|on| on == "true")
                || builder
                    .get_config_value(&AzureConfigKey::Endpoint)
                    .is_some_and(|endpoint| is_loopback(&endpoint));
            Arc::new(
                builder
                    .build()
                    .map_err(|e| configure("configuring Azure", e))?,
            )
        }
        ObjectStoreScheme::Local => {
            (durable, local) = (false, true);
            Arc::new(object_store::local::LocalFileSystem::new())
        }
        ObjectStoreScheme::Memory => {
            (durable, local) = (false, true);
            Arc::new(object_store::memory::InMemory::new())
        }
        other => {
            return Err(Error::new(
                ErrorKind::Unsupported,
                format!(
                    "{other:?} stores are not supported (weightbay-object-store has the features \
                     aws, gcp and azure for S3, GCS and Azure)"
                ),
            )
            .with_key(url));
        }
    };
    let defaults = ObjectStoreOptions::DEFAULT;
    let options = defaults
        .with_durable(durable)
        .with_fetch_request_len(defaults.fetch_request_len.filter(|_| !local));
    Ok(ObjectStorage::new(store)?
        .with_prefix(prefix.as_ref())?
        .with_options(options))
}

/// Whether `endpoint` (a URL) names this machine.
fn is_loopback(endpoint: &str) -> bool {
    match url::Url::parse(endpoint)
        .ok()
        .and_then(|url| url.host().map(|h| h.to_owned()))
    {
        Some(url::Host::Domain(name)) => name.eq_ignore_ascii_case("localhost"),
        Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
        Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
        None => false,
    }
}
