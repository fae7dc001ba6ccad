//! Bytes read from a [`Source`] on first access, for backends whose [`Source::bytes`] should
//! not read anything up front (a file, a remote object).

use std::fmt;
use std::ops::Range;
use std::sync::{Arc, OnceLock};

use crate::ranges::check_range;
use crate::storage::Source;
use crate::{
    AccessPolicy, AllocationController, AllocationProperty, Bytes, Error, ErrorKind, Result,
};

/// The bytes of `range` of `source`, read on first access and cached, reported as `property`
/// (`File` or `Remote`): what a backend whose reads cost I/O returns from [`Source::bytes`].
/// Views taken before the first access stay lazy and read only themselves.
///
/// # Errors
/// [`ErrorKind::OutOfRange`] when the range passes the source's end or does not fit in memory.
pub fn lazy_bytes(
    source: Arc<dyn Source>,
    range: Range<u64>,
    property: AllocationProperty,
) -> Result<Bytes> {
    Ok(Bytes::from_controller(Box::new(LazyRegion::new(
        source, range, property,
    )?)))
}

/// A lazily read range of a [`Source`]: nothing is read until first access, then the range
/// is fetched once and cached. Sub-views taken before that stay lazy and fetch only
/// themselves.
struct LazyRegion {
    source: Arc<dyn Source>,
    range: Range<u64>,
    property: AllocationProperty,
    cache: OnceLock<Box<[u8]>>,
}

impl LazyRegion {
    /// A lazy view of `range` of `source`, reported as `property` (`File` or `Remote`).
    ///
    /// # Errors
    /// [`ErrorKind::OutOfRange`] when the range passes the source's end or does not fit in
    /// memory.
    fn new(
        source: Arc<dyn Source>,
        range: Range<u64>,
        property: AllocationProperty,
    ) -> Result<Self> {
        check_range(&range, source.len())?;
        usize::try_from(range.end - range.start)
            .map_err(|_| Error::new(ErrorKind::OutOfRange, "range does not fit in memory"))?;
        Ok(Self {
            source,
            range,
            property,
            cache: OnceLock::new(),
        })
    }
}

impl fmt::Debug for LazyRegion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LazyRegion")
            .field("range", &self.range)
            .field("property", &self.property)
            .field("resident", &self.cache.get().is_some())
            .finish_non_exhaustive()
    }
}

impl AllocationController for LazyRegion {
    fn len(&self) -> usize {
        (self.range.end - self.range.start) as usize
    }

    fn alignment(&self) -> usize {
        // The cache is allocated by the global allocator, which aligns to at least 8.
        8
    }

    fn property(&self) -> AllocationProperty {
        self.property
    }

    fn memory(&self, policy: AccessPolicy) -> Result<&[u8]> {
        if let Some(cached) = self.cache.get() {
            return Ok(cached);
        }
        if policy == AccessPolicy::ZeroCopy {
            return Err(Error::new(
                ErrorKind::WouldCopy,
                format!("{} bytes are not resident yet", self.len()),
            ));
        }
        let mut buf = vec![0; self.len()].into_boxed_slice();
        self.source.read_at(self.range.start, &mut buf)?;
        Ok(self.cache.get_or_init(|| buf))
    }

    fn read_at(&self, offset: usize, buf: &mut [u8]) -> Result<()> {
        if let Some(cached) = self.cache.get() {
            // In range: the controller contract has the caller (`Bytes::read_at`) check it.
            buf.copy_from_slice(&cached[offset..offset + buf.len()]);
            return Ok(());
        }
        self.source.read_at(self.range.start + offset as u64, buf)
    }

    fn narrow(&self, start: usize, end: usize) -> Option<Box<dyn AllocationController>> {
        if self.cache.get().is_some() {
            return None;
        }
        let base = self.range.start;
        let range = base + start as u64..base + end as u64;
        Some(Box::new(Self {
            source: Arc::clone(&self.source),
            range,
            property: self.property,
            cache: OnceLock::new(),
        }))
    }
}
