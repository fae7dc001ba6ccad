//! Where a checkpoint lives: a URL or path, resolved to a storage and a key.

use std::path::Path;
use std::sync::Arc;

use weightbay::{Error, Result, Storage};
use weightbay_local::LocalStorage;

/// A storage and the key of one checkpoint in it, plus how to name it in messages.
pub struct Location {
    pub storage: Arc<dyn Storage>,
    pub key: String,
    /// The store, as the user wrote it (credentials never appear in URLs we accept).
    pub store: String,
}

/// object_store's retry policy, with `WEIGHTBAY_MAX_RETRIES` capping the retries of each
/// request (0: fail at the first error).
fn retry() -> object_store::RetryConfig {
    let mut retry = object_store::RetryConfig::default();
    if let Some(max) = std::env::var("WEIGHTBAY_MAX_RETRIES")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        retry.max_retries = max;
        retry.retry_timeout = std::time::Duration::from_secs(if max == 0 { 0 } else { 30 });
    }
    retry
}

impl Location {
    /// Resolves a path, `file://` URL, or object-store URL (`s3://`, `gs://`, `az://`,
    /// `memory://`, and the https forms object_store knows).
    pub fn parse(input: &str) -> Result<Self> {
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
                let storage = weightbay_object_store::open_url_with_retry(
                    store,
                    std::iter::empty::<(&str, &str)>(),
                    retry(),
                )?;
                Ok(Self {
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
        })
    }

    /// The checkpoint's file name, for format detection.
    pub fn file_name(&self) -> &str {
        self.key.rsplit('/').next().unwrap_or(&self.key)
    }
}
