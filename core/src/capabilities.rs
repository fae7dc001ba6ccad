//! What a backend promises beyond the base contract, declared once and checked before a write
//! asks for more.

use crate::options::{CreateOptions, Durability, WriteMode};
use crate::{Error, Result};

/// What a backend promises beyond the base contract. Each declared capability is tested by the
/// conformance suite; asking for an undeclared one fails with
/// [`ErrorKind::Unsupported`](crate::ErrorKind::Unsupported).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub struct Capabilities {
    /// [`WriteMode::CreateNew`] is race-free: of two concurrent creators exactly one wins.
    pub atomic_create_new: bool,
    /// [`Durability::Durable`] commits survive power loss.
    pub durable_commit: bool,
    /// [`Source::bytes`](crate::Source::bytes) returns host memory without copying (memory, mmap).
    pub zero_copy_reads: bool,
    /// [`WriteMode::InPlace`] is supported.
    pub in_place_writes: bool,
    /// [`Storage::pending`](crate::Storage::pending) lists unfinished writes and
    /// [`Storage::clean_pending`](crate::Storage::clean_pending) removes those of dead writers.
    pub pending_listing: bool,
    /// [`Storage::list`](crate::Storage::list) lists committed containers.
    pub listing: bool,
}

impl Capabilities {
    /// No capability beyond the base contract.
    pub const NONE: Self = Self {
        atomic_create_new: false,
        durable_commit: false,
        zero_copy_reads: false,
        in_place_writes: false,
        pending_listing: false,
        listing: false,
    };

    /// Declares race-free create-new.
    #[must_use]
    pub const fn with_atomic_create_new(mut self) -> Self {
        self.atomic_create_new = true;
        self
    }

    /// Declares power-loss durable commits.
    #[must_use]
    pub const fn with_durable_commit(mut self) -> Self {
        self.durable_commit = true;
        self
    }

    /// Declares zero-copy reads.
    #[must_use]
    pub const fn with_zero_copy_reads(mut self) -> Self {
        self.zero_copy_reads = true;
        self
    }

    /// Declares in-place writes.
    #[must_use]
    pub const fn with_in_place_writes(mut self) -> Self {
        self.in_place_writes = true;
        self
    }

    /// Declares listing of unfinished writes.
    #[must_use]
    pub const fn with_pending_listing(mut self) -> Self {
        self.pending_listing = true;
        self
    }

    /// Declares listing of committed containers.
    #[must_use]
    pub const fn with_listing(mut self) -> Self {
        self.listing = true;
        self
    }

    /// Fails with [`ErrorKind::Unsupported`](crate::ErrorKind::Unsupported) when `options` ask for
    /// something undeclared.
    ///
    /// # Errors
    /// As described.
    pub fn check(&self, options: &CreateOptions) -> Result<()> {
        let missing = match (options.mode, options.durability) {
            (WriteMode::CreateNew, _) if !self.atomic_create_new => "create-new writes",
            (WriteMode::InPlace, _) if !self.in_place_writes => "in-place writes",
            (_, Durability::Durable) if !self.durable_commit => "durable commits",
            _ => return Ok(()),
        };
        Err(Error::unsupported(format!(
            "this storage does not offer {missing}"
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorKind;

    #[test]
    fn undeclared_capabilities_are_unsupported() {
        let none = Capabilities::NONE;
        for options in [
            CreateOptions::default().with_mode(WriteMode::CreateNew),
            CreateOptions::default().with_mode(WriteMode::InPlace),
            CreateOptions::default().with_durability(Durability::Durable),
        ] {
            assert_eq!(
                none.check(&options).unwrap_err().kind(),
                ErrorKind::Unsupported
            );
        }
        none.check(&CreateOptions::default()).unwrap();
        let all = Capabilities::NONE
            .with_atomic_create_new()
            .with_in_place_writes()
            .with_durable_commit();
        all.check(&CreateOptions::default().with_mode(WriteMode::CreateNew))
            .unwrap();
    }
}
