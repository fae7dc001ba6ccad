//! The version-pinned ranged source.

use std::fmt;
use std::ops::Range;
use std::sync::Arc;

use futures::StreamExt;
use object_store::path::Path;
use object_store::{GetOptions, GetRange, ObjectStore, ObjectStoreExt};
use weightbay::reader::OPEN_PREFIX_LEN;
use weightbay::storage::check_range;
use weightbay::{AllocationProperty, Bytes, Error, ErrorKind, LazyRegion, Result, Source};

use crate::error::convert;
use crate::{Bridge, ObjectStoreOptions};

/// Adjacent ranges closer than this are fetched in one request.
const COALESCE_GAP: u64 = 1 << 20;
/// The most requests [`ObjectSource::fetch`] keeps open at once, however small they are: more
/// connections stop adding throughput long before this (`get_ranges` stops at 10).
const MAX_REQUESTS_IN_FLIGHT: u64 = 16;

struct Remote {
    store: Arc<dyn ObjectStore>,
    path: Path,
    key: String,
    len: u64,
    e_tag: Option<String>,
    version: Option<String>,
    /// The first bytes, fetched with the object's size and version in the opening request.
    prefix: bytes::Bytes,
    bridge: Bridge,
    /// [`ObjectStoreOptions::fetch_request_len`] of the storage that opened it.
    fetch_request_len: Option<u64>,
    /// [`ObjectStoreOptions::fetch_budget`] of the storage that opened it.
    fetch_budget: usize,
}

impl fmt::Debug for Remote {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ObjectSource")
            .field("path", &self.path.as_ref())
            .field("len", &self.len)
            .field("version", &self.version)
            .finish_non_exhaustive()
    }
}

impl Remote {
    fn pinned(&self, range: Range<u64>) -> GetOptions {
        GetOptions {
            range: Some(GetRange::Bounded(range)),
            if_match: self.e_tag.clone(),
            version: self.version.clone(),
            ..GetOptions::default()
        }
    }

    fn get(&self, range: Range<u64>) -> Result<bytes::Bytes> {
        let store = Arc::clone(&self.store);
        let path = self.path.clone();
        let options = self.pinned(range.clone());
        let result = self
            .bridge
            .run(async move { store.get_opts(&path, options).await?.bytes().await })?;
        let bytes = result.map_err(|e| self.read_error(range.start, e))?;
        if bytes.len() as u64 != range.end - range.start {
            return Err(Error::new(
                ErrorKind::Io,
                format!(
                    "the store returned {} bytes for a {}-byte range",
                    bytes.len(),
                    range.end - range.start
                ),
            )
            .with_key(&self.key)
            .with_offset(range.start));
        }
        Ok(bytes)
    }

    fn read_error(&self, offset: u64, e: object_store::Error) -> Error {
        let changed = matches!(
            e,
            object_store::Error::Precondition { .. } | object_store::Error::NotFound { .. }
        );
        if changed {
            return Error::new(
                ErrorKind::Changed,
                "the object changed or vanished since it was opened",
            )
            .with_source(e)
            .with_key(&self.key)
            .with_offset(offset);
        }
        convert("reading a range", e)
            .with_key(&self.key)
            .with_offset(offset)
    }
}

impl Source for Remote {
    fn len(&self) -> u64 {
        self.len
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        let end = offset.saturating_add(buf.len() as u64);
        check_range(&(offset..end), self.len)?;
        if end <= self.prefix.len() as u64 {
            // In range, so both ends fit in usize.
            buf.copy_from_slice(&self.prefix[offset as usize..end as usize]);
            return Ok(());
        }
        if buf.is_empty() {
            return Ok(());
        }
        buf.copy_from_slice(&self.get(offset..end)?);
        Ok(())
    }
}

/// An object opened for reading: its size and version (or ETag) are learned in the first
/// request, which also brings the header and metadata, and every later range request is pinned
/// to them, so an object replaced mid-read gives an error, never mixed bytes.
#[derive(Debug, Clone)]
pub struct ObjectSource(Arc<Remote>);

impl ObjectSource {
    pub(crate) fn open(
        store: Arc<dyn ObjectStore>,
        path: Path,
        key: String,
        bridge: Bridge,
        options: &ObjectStoreOptions,
    ) -> Result<Self> {
        let request = (Arc::clone(&store), path.clone());
        let opened = bridge.run(async move {
            let (store, path) = request;
            let options = GetOptions {
                range: Some(GetRange::Bounded(0..OPEN_PREFIX_LEN)),
                ..GetOptions::default()
            };
            match store.get_opts(&path, options).await {
                Ok(result) => {
                    let meta = result.meta.clone();
                    Ok((meta, result.bytes().await?))
                }
                // An empty object has no first byte to range over.
                Err(object_store::Error::NotFound { path, source }) => {
                    Err(object_store::Error::NotFound { path, source })
                }
                Err(_) => Ok((store.head(&path).await?, bytes::Bytes::new())),
            }
        })?;
        let (meta, prefix) = opened.map_err(|e| convert("opening the object", e).with_key(&key))?;
        Ok(Self(Arc::new(Remote {
            store,
            path,
            key,
            len: meta.size,
            e_tag: meta.e_tag,
            version: meta.version,
            prefix,
            bridge,
            fetch_request_len: options.fetch_request_len,
            fetch_budget: options.fetch_budget,
        })))
    }

    /// The object version the source is pinned to, if the store reports one.
    pub fn version(&self) -> Option<&str> {
        self.0.version.as_deref()
    }

    /// The ETag the source is pinned to, if the store reports one.
    pub fn e_tag(&self) -> Option<&str> {
        self.0.e_tag.as_deref()
    }

    /// Fetches `ranges` now and returns them resident, in the order given. Ranges closer than
    /// 1 MiB are coalesced into requests of up to
    /// [`fetch_request_len`](ObjectStoreOptions::fetch_request_len) bytes, which run in
    /// parallel within [`fetch_budget`](ObjectStoreOptions::fetch_budget) bytes in flight (at
    /// least one request at a time); every request is pinned to the opened version.
    ///
    /// # Errors
    /// [`ErrorKind::OutOfRange`] for a range past the end; the store's error.
    pub fn fetch(&self, ranges: &[Range<u64>]) -> Result<Vec<Bytes>> {
        let request_len = self.0.fetch_request_len.unwrap_or(u64::MAX);
        for range in ranges {
            check_range(range, self.0.len)?;
        }
        let mut order: Vec<usize> = (0..ranges.len()).collect();
        order.sort_by_key(|&i| ranges[i].start);
        let mut groups: Vec<(Range<u64>, Vec<usize>)> = Vec::new();
        for i in order {
            let range = &ranges[i];
            if range.start == range.end {
                // Nothing to fetch (a zero-element tensor); a zero-length GET is refused.
                continue;
            }
            match groups.last_mut() {
                Some((group, members))
                    if range.start <= group.end + COALESCE_GAP
                        && range.end.max(group.end) - group.start <= request_len =>
                {
                    group.end = group.end.max(range.end);
                    members.push(i);
                }
                _ => groups.push((range.clone(), vec![i])),
            }
        }
        let largest = groups
            .iter()
            .map(|(range, _)| range.end - range.start)
            .max();
        let parallel = (self.0.fetch_budget as u64 / largest.unwrap_or(1).max(1))
            .clamp(1, MAX_REQUESTS_IN_FLIGHT) as usize;
        let remote = Arc::clone(&self.0);
        let requests: Vec<(Range<u64>, GetOptions)> = groups
            .iter()
            .map(|(range, _)| (range.clone(), remote.pinned(range.clone())))
            .collect();
        let store = Arc::clone(&remote.store);
        let path = remote.path.clone();
        let fetched = remote.bridge.run(async move {
            futures::stream::iter(requests)
                .map(|(range, options)| {
                    let (store, path) = (Arc::clone(&store), path.clone());
                    async move {
                        let bytes = match store.get_opts(&path, options).await {
                            Ok(result) => result.bytes().await,
                            Err(e) => Err(e),
                        };
                        (range.start, bytes)
                    }
                })
                .buffered(parallel)
                .collect::<Vec<_>>()
                .await
        })?;
        let mut out = vec![Bytes::from(Vec::new()); ranges.len()];
        for ((group, members), (start, bytes)) in groups.iter().zip(fetched) {
            let bytes = bytes.map_err(|e| remote.read_error(start, e))?;
            if bytes.len() as u64 != group.end - group.start {
                return Err(
                    Error::new(ErrorKind::Io, "the store returned a short range")
                        .with_key(&remote.key)
                        .with_offset(start),
                );
            }
            for &i in members {
                let range = &ranges[i];
                // Within the group, which is in memory.
                let slice = bytes.slice(
                    (range.start - group.start) as usize..(range.end - group.start) as usize,
                );
                out[i] = Bytes::from_shared(slice, AllocationProperty::Shared);
            }
        }
        Ok(out)
    }
}

impl Source for ObjectSource {
    fn len(&self) -> u64 {
        self.0.len
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        self.0.read_at(offset, buf)
    }

    fn bytes(&self, range: Range<u64>) -> Result<Bytes> {
        let region = LazyRegion::new(
            Arc::clone(&self.0) as Arc<dyn Source>,
            range,
            AllocationProperty::Remote,
        )?;
        Ok(Bytes::from_controller(Box::new(region)))
    }

    /// Coalesced, parallel, version-pinned GETs: see [`ObjectSource::fetch`].
    fn fetch(&self, ranges: &[Range<u64>]) -> Result<Vec<Bytes>> {
        ObjectSource::fetch(self, ranges)
    }

    /// The fetch budget: what [`fetch`](Self::fetch) may keep in flight.
    fn fetch_ahead(&self) -> u64 {
        self.0.fetch_budget as u64
    }
}
