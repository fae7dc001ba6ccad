//! A storage in front of another that notes every container committed through it, with its
//! length and CRC32C taken as the bytes stream through: how a save learns what its commit
//! record (or rank manifest) must say without reading anything back.

use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex, PoisonError};

use weightbay::checksum::crc32c_append;
use weightbay::{CreateOptions, Result, Sink, Storage};

use crate::following::{Announced, Followed, Progress};

/// A storage in front of another that records every container committed through it, with
/// its length and the CRC32C of its bytes, taken as they stream through.
#[derive(Debug)]
pub(crate) struct Recording {
    inner: Arc<dyn Storage>,
    written: Arc<Mutex<Vec<(String, u64, u32)>>>,
    /// Where each container whose sink reads back is announced as it is created, for a copy
    /// that follows the save ([`following`](crate::following)).
    follower: Option<Sender<Followed>>,
}

impl Recording {
    pub(crate) fn new(inner: Arc<dyn Storage>) -> Self {
        Self {
            inner,
            written: Arc::default(),
            follower: None,
        }
    }

    /// Announces every container created through it to `follower`, with a reader of its bytes
    /// and their progress, when its sink can read them back.
    pub(crate) fn followed_by(mut self, follower: Option<Sender<Followed>>) -> Self {
        self.follower = follower;
        self
    }

    /// What was committed through it so far: key, length, CRC32C.
    pub(crate) fn written(&self) -> Vec<(String, u64, u32)> {
        self.written
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Removes every container committed through it (a failed save's), best effort: what
    /// cannot be removed now is an orphan for [`Checkpoints::gc`](crate::Checkpoints::gc).
    pub(crate) fn remove_all(&self) {
        for (key, _, _) in self.written() {
            let _ = self.inner.delete(&key);
        }
    }
}

// Every method forwarded: one left to the trait's default would answer `Unsupported` through
// the wrapper.
#[deny(clippy::missing_trait_methods)]
impl Storage for Recording {
    fn create(&self, key: &str, options: &CreateOptions) -> Result<Box<dyn Sink>> {
        let inner = self.inner.create(key, options)?;
        let announced = self.follower.as_ref().and_then(|follower| {
            let progress = Arc::new(Progress::default());
            let followed = Followed {
                key: key.to_owned(),
                expected_len: options.expected_len,
                reader: inner.read_back()?,
                progress: Arc::clone(&progress),
            };
            // A follower gone (its promotion failed) no longer needs to hear of it.
            follower.send(followed).ok()?;
            Some(Announced::new(progress))
        });
        Ok(Box::new(RecordingSink {
            inner,
            key: key.to_owned(),
            len: 0,
            crc: 0,
            written: Arc::clone(&self.written),
            announced,
        }))
    }
    weightbay::forward_storage!(inner => capabilities, open, delete, pending, clean_pending, list, list_foreign);
}

pub(crate) struct RecordingSink {
    inner: Box<dyn Sink>,
    key: String,
    len: u64,
    crc: u32,
    written: Arc<Mutex<Vec<(String, u64, u32)>>>,
    /// The progress a follower reads back behind, if one was told of this container.
    announced: Option<Announced>,
}

// Every method named: padding goes through `write`, so the length and CRC32C count it; the
// bytes are read back, for a follower, from the inner sink's reader taken when the container
// was announced; and no write by position, since the CRC32C is taken in order.
#[deny(clippy::missing_trait_methods)]
impl Sink for RecordingSink {
    fn pad(&mut self, len: u64) -> Result<()> {
        weightbay::backend_kit::pad_with_zeros(self, len)
    }

    fn read_back(&self) -> Option<Arc<dyn weightbay::ReadBack>> {
        None
    }

    fn positioned(&mut self) -> Option<Box<dyn weightbay::PositionedWrite + '_>> {
        None
    }

    fn write(&mut self, data: &[u8]) -> Result<()> {
        self.inner.write(data)?;
        self.crc = crc32c_append(self.crc, data);
        self.len += data.len() as u64;
        if let Some(announced) = &self.announced {
            announced.wrote(self.len);
        }
        Ok(())
    }

    fn commit(self: Box<Self>) -> Result<()> {
        let Self {
            inner,
            key,
            len,
            crc,
            written,
            announced,
        } = *self;
        inner.commit()?;
        if let Some(announced) = announced {
            announced.committed();
        }
        written
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push((key, len, crc));
        Ok(())
    }
}

/// A sink that stores nothing: the length and CRC32C of what a write would store, for a rank
/// that compares its part with a manifest written before without uploading it again.
#[derive(Debug, Default)]
pub(crate) struct Summing {
    crc: u32,
}

impl Summing {
    /// The CRC32C of everything written.
    pub(crate) fn crc32c(&self) -> u32 {
        self.crc
    }
}

impl Sink for Summing {
    fn write(&mut self, data: &[u8]) -> Result<()> {
        self.crc = crc32c_append(self.crc, data);
        Ok(())
    }

    fn commit(self: Box<Self>) -> Result<()> {
        Ok(())
    }
}
