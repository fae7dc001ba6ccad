//! A storage in front of another that notes every container committed through it, with its
//! length and CRC32C taken as the bytes stream through: how a save learns what its commit
//! record (or rank manifest) must say without reading anything back.

use std::sync::{Arc, Mutex, PoisonError};

use weightbay::checksum::crc32c_append;
use weightbay::{Capabilities, CreateOptions, Result, Sink, Source, Storage};

/// A storage in front of another that records every container committed through it, with
/// its length and the CRC32C of its bytes, taken as they stream through.
#[derive(Debug)]
pub(crate) struct Recording {
    inner: Arc<dyn Storage>,
    written: Arc<Mutex<Vec<(String, u64, u32)>>>,
}

impl Recording {
    pub(crate) fn new(inner: Arc<dyn Storage>) -> Self {
        Self {
            inner,
            written: Arc::default(),
        }
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

impl Storage for Recording {
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }

    fn create(&self, key: &str, options: &CreateOptions) -> Result<Box<dyn Sink>> {
        Ok(Box::new(RecordingSink {
            inner: self.inner.create(key, options)?,
            key: key.to_owned(),
            len: 0,
            crc: 0,
            written: Arc::clone(&self.written),
        }))
    }

    fn open(&self, key: &str) -> Result<Arc<dyn Source>> {
        self.inner.open(key)
    }

    fn delete(&self, key: &str) -> Result<()> {
        self.inner.delete(key)
    }
}

pub(crate) struct RecordingSink {
    inner: Box<dyn Sink>,
    key: String,
    len: u64,
    crc: u32,
    written: Arc<Mutex<Vec<(String, u64, u32)>>>,
}

impl Sink for RecordingSink {
    fn write(&mut self, data: &[u8]) -> Result<()> {
        self.inner.write(data)?;
        self.crc = crc32c_append(self.crc, data);
        self.len += data.len() as u64;
        Ok(())
    }

    fn commit(self: Box<Self>) -> Result<()> {
        let Self {
            inner,
            key,
            len,
            crc,
            written,
        } = *self;
        inner.commit()?;
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
