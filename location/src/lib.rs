//! Where a checkpoint lives: a location string (a path, or a URL) resolved to a storage and a
//! key, as the `weightbay` command takes them: a path or `file://` URL is a
//! [`LocalStorage`] on its directory, an object-store URL (`s3://`, `gs://`, `az://`,
//! `memory://`) a store [`weightbay_object_store::open_url`] opens. The CLI, the Python
//! package and programs that take a location from their user share it.

use std::path::Path;
use std::sync::Arc;

use weightbay::{Error, Result, Storage};
use weightbay_local::LocalStorage;
use weightbay_object_store::{ObjectStorage, StallWatch};

/// A storage and the key of one checkpoint in it, plus how to name it in messages.
///
/// ```
/// use weightbay_location::Location;
/// let local = Location::parse("checkpoints/model.bpk")?;
/// assert_eq!((local.store.as_str(), local.key.as_str()), ("checkpoints", "model.bpk"));
/// let memory = Location::parse("memory:///runs/model.safetensors")?;
/// assert_eq!(memory.file_name(), "model.safetensors");
/// # Ok::<(), weightbay::Error>(())
/// ```
#[derive(Debug, Clone)]
pub struct Location {
    /// The storage holding the checkpoint: a local directory or an object-store prefix.
    pub storage: Arc<dyn Storage>,
    /// The checkpoint's key in it (the last segment of the location).
    pub key: String,
    /// The store, as the user wrote it (credentials never appear in URLs we accept).
    pub store: String,
    /// What finds the store's stalled requests, and counts those it cut: an object store
    /// [`open_url`](weightbay_object_store::open_url) built (S3, GCS, Azure); `None` for the
    /// others.
    pub stall_watch: Option<Arc<StallWatch>>,
}

impl Location {
    /// Resolves a path (a [`LocalStorage`] on its directory), a `file://` URL (the same), or an
    /// object-store URL (`s3://`, `gs://`, `az://`, `memory://`, and the https forms
    /// object_store knows; see [`open_url`](weightbay_object_store::open_url)); the key is the
    /// last segment.
    ///
    /// # Errors
    /// [`ErrorKind::InvalidInput`](weightbay::ErrorKind::InvalidInput) for a location that
    /// names no file; [`ErrorKind::Unsupported`](weightbay::ErrorKind::Unsupported) for an
    /// unknown scheme; the store's configuration errors.
    pub fn parse(input: &str) -> Result<Self> {
        Self::parse_with(input, |store| {
            weightbay_object_store::open_url(store, std::iter::empty::<(&str, &str)>())
        })
    }

    /// [`parse`](Self::parse) with a retry policy for the cloud stores, as
    /// [`open_url_with_retry`](weightbay_object_store::open_url_with_retry) takes it.
    ///
    /// # Errors
    /// As [`parse`](Self::parse).
    pub fn parse_with_retry(input: &str, retry: object_store::RetryConfig) -> Result<Self> {
        Self::parse_with(input, |store| {
            weightbay_object_store::open_url_with_retry(
                store,
                std::iter::empty::<(&str, &str)>(),
                retry,
            )
        })
    }

    /// [`parse`](Self::parse), an object store's prefix opened by `open`.
    fn parse_with(input: &str, open: impl FnOnce(&str) -> Result<ObjectStorage>) -> Result<Self> {
        match input.split_once("://") {
            None => Self::local(Path::new(input), input),
            Some(("file", path)) => Self::local(Path::new(path), input),
            Some((scheme, _))
                if matches!(
                    scheme,
                    "s3" | "s3a"
                        | "gs"
                        | "az"
                        | "adl"
                        | "azure"
                        | "abfs"
                        | "abfss"
                        | "memory"
                        | "https"
                        | "http"
                ) =>
            {
                let (store, key) = input
                    .rsplit_once('/')
                    .filter(|(store, key)| {
                        !key.is_empty()
                            && store.contains("://")
                            && store
                                .split("://")
                                .nth(1)
                                .is_some_and(|rest| !rest.is_empty())
                    })
                    .ok_or_else(|| {
                        Error::invalid(format!(
                            "`{input}` names no object: expected {scheme}://bucket/path/file"
                        ))
                    })?;
                let storage = open(store)?;
                Ok(Self {
                    stall_watch: storage.stall_watch().cloned(),
                    storage: Arc::new(storage),
                    key: key.to_owned(),
                    store: store.to_owned(),
                })
            }
            Some((scheme, _)) => Err(Error::unsupported(format!(
                "`{scheme}://` is not a storage weightbay knows (use a path, file://, s3://, gs://, az:// or memory://)"
            ))),
        }
    }

    fn local(path: &Path, input: &str) -> Result<Self> {
        let key = path
            .file_name()
            .and_then(|name| name.to_str())
            .ok_or_else(|| Error::invalid(format!("`{input}` names no file")))?
            .to_owned();
        let directory = match path.parent() {
            Some(parent) if !parent.as_os_str().is_empty() => parent.to_path_buf(),
            _ => Path::new(".").to_path_buf(),
        };
        let store = directory.display().to_string();
        Ok(Self {
            storage: Arc::new(LocalStorage::new(directory)),
            key,
            store,
            stall_watch: None,
        })
    }

    /// The checkpoint's file name, for format detection.
    pub fn file_name(&self) -> &str {
        self.key.rsplit('/').next().unwrap_or(&self.key)
    }
}
