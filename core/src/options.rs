//! What a write asks of a storage: overwrite, create-new or in place, how durable, and by when.

use std::time::Instant;

/// What happens to an existing container at the key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum WriteMode {
    /// Replace whatever is there, atomically (the default).
    #[default]
    Overwrite,
    /// Fail with [`ErrorKind::AlreadyExists`](crate::ErrorKind::AlreadyExists) if anything is
    /// there, without a race between two writers (needs
    /// [`Capabilities::atomic_create_new`](crate::Capabilities::atomic_create_new)).
    CreateNew,
    /// Write the existing object in place (keeps a file's inode); a failure loses the old
    /// container (needs [`Capabilities::in_place_writes`](crate::Capabilities::in_place_writes)).
    InPlace,
}

/// How hard a commit works to survive a crash.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Durability {
    /// The strongest durability the backend offers.
    #[default]
    Default,
    /// Atomic against a process crash, but may be lost on power failure (no fsync).
    Flushed,
    /// Survives power loss once `commit` returns (needs
    /// [`Capabilities::durable_commit`](crate::Capabilities::durable_commit)).
    Durable,
}

/// Options for [`Storage::create`](crate::Storage::create): `CreateOptions::default()` and the
/// `with_` setters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub struct CreateOptions {
    /// Overwrite, create-new or in-place.
    pub mode: WriteMode,
    /// Crash durability wanted from `commit`.
    pub durability: Durability,
    /// The container's planned total length, when known (the writer always knows it):
    /// backends use it to size parts or preallocate.
    pub expected_len: Option<u64>,
    /// When the write must be committed by, if ever: a sink that cannot finish a `write` or
    /// its `commit` by then gives up with [`ErrorKind::TimedOut`](crate::ErrorKind::TimedOut)
    /// and aborts, leaving the key as it was. Backends that wait on a network cut the request
    /// in flight at this moment; one whose calls do not block for long (local files) checks it
    /// between calls.
    pub deadline: Option<Instant>,
}

impl CreateOptions {
    /// Sets the write mode.
    #[must_use]
    pub fn with_mode(mut self, mode: WriteMode) -> Self {
        self.mode = mode;
        self
    }

    /// Sets the durability.
    #[must_use]
    pub fn with_durability(mut self, durability: Durability) -> Self {
        self.durability = durability;
        self
    }

    /// Sets the expected total length.
    #[must_use]
    pub fn with_expected_len(mut self, len: u64) -> Self {
        self.expected_len = Some(len);
        self
    }

    /// Sets the deadline.
    #[must_use]
    pub fn with_deadline(mut self, deadline: Instant) -> Self {
        self.deadline = Some(deadline);
        self
    }
}

/// [`ErrorKind::TimedOut`](crate::ErrorKind::TimedOut), saying the deadline passed before
/// `what`, once `deadline` has passed: for sinks that keep a
/// [`CreateOptions::deadline`] between calls.
///
/// # Errors
/// As said.
pub fn check_deadline(deadline: Option<Instant>, what: &str) -> crate::Result<()> {
    match deadline {
        Some(deadline) if Instant::now() >= deadline => Err(crate::Error::new(
            crate::ErrorKind::TimedOut,
            format!("the write's deadline passed before {what}"),
        )),
        _ => Ok(()),
    }
}
