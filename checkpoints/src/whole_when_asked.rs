//! What this crate's lazy bytes share (a tensor assembled from slices, one converted as it is
//! read, one streamed in pieces): the whole region, read only when a caller asks for all of it
//! in memory, then kept.

use std::sync::OnceLock;

use weightbay::{AccessPolicy, Error, ErrorKind, Result};

/// The whole of a lazily read region, once asked for.
#[derive(Debug, Default)]
pub(crate) struct WholeWhenAsked(OnceLock<Vec<u8>>);

impl WholeWhenAsked {
    /// The region as [`AllocationController::memory`](weightbay::AllocationController::memory)
    /// hands it: the whole once read; before that, under [`AccessPolicy::ZeroCopy`],
    /// [`ErrorKind::WouldCopy`] saying `what` the bytes are, and otherwise `len` bytes read by
    /// `read_at` and kept.
    pub(crate) fn memory(
        &self,
        policy: AccessPolicy,
        len: usize,
        what: impl FnOnce() -> String,
        read_at: impl FnOnce(&mut [u8]) -> Result<()>,
    ) -> Result<&[u8]> {
        if let Some(whole) = self.0.get() {
            return Ok(whole);
        }
        if policy == AccessPolicy::ZeroCopy {
            return Err(Error::new(ErrorKind::WouldCopy, what()));
        }
        let mut whole = vec![0; len];
        read_at(&mut whole)?;
        Ok(self.0.get_or_init(|| whole))
    }

    /// The whole, when it has been read.
    pub(crate) fn get(&self) -> Option<&[u8]> {
        self.0.get().map(Vec::as_slice)
    }
}
