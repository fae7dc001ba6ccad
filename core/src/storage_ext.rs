//! [`StorageExt`]: conveniences over any [`Storage`], built on its required methods.

use crate::Result;
use crate::copy::copy_to_sink;
use crate::options::{CreateOptions, Durability, WriteMode};
use crate::storage::{Source, Storage};

/// Conveniences over any [`Storage`], built on its required methods.
pub trait StorageExt: Storage {
    /// Writes `body`, a small file such as an index or a commit record, to `key` with
    /// create-new: it appears whole, and only if the key was free.
    ///
    /// # Errors
    /// [`ErrorKind::AlreadyExists`](crate::ErrorKind::AlreadyExists) when the key is taken;
    /// the storage's errors, naming the key and the operation.
    fn write_new(&self, key: &str, body: &[u8], durability: Durability) -> Result<()> {
        self.write_new_with(
            key,
            body,
            CreateOptions::default().with_durability(durability),
        )
    }

    /// [`write_new`](Self::write_new) with `options`' durability and deadline (its mode and
    /// length are create-new and the body's).
    ///
    /// # Errors
    /// As [`write_new`](Self::write_new);
    /// [`ErrorKind::TimedOut`](crate::ErrorKind::TimedOut) past the deadline.
    fn write_new_with(&self, key: &str, body: &[u8], options: CreateOptions) -> Result<()> {
        self.write_whole(key, body, options.with_mode(WriteMode::CreateNew))
    }

    /// Writes `body`, a small file, to `key` in one sink with `options` (their mode included;
    /// the length is the body's), committed once it is all written: it appears whole.
    ///
    /// # Errors
    /// The storage's errors, naming the key and the operation.
    fn write_whole(&self, key: &str, body: &[u8], options: CreateOptions) -> Result<()> {
        let options = options.with_expected_len(body.len() as u64);
        let mut sink = self
            .create(key, &options)
            .map_err(|e| e.with_operation("create").with_key(key))?;
        sink.write(body)
            .map_err(|e| e.with_operation("write").with_key(key))?;
        sink.commit()
            .map_err(|e| e.with_operation("commit").with_key(key))
    }

    /// Copies all of `source` to `key`, byte for byte, and returns the CRC32C of the bytes
    /// copied: from a store that gains from reading ahead, read in parallel and written by
    /// position as they arrive where the sink allows, else written in order
    /// ([`copy_to_sink`](crate::backend_kit::copy_to_sink)); committed last with `options`
    /// (their expected length is the source's). A failure leaves `key` as it was.
    ///
    /// # Errors
    /// The source's and the storage's errors, naming the key and the operation.
    fn copy_in(&self, key: &str, source: &dyn Source, options: CreateOptions) -> Result<u32> {
        let len = source.len();
        let mut sink = self
            .create(key, &options.with_expected_len(len))
            .map_err(|e| e.with_operation("create").with_key(key))?;
        let crc = copy_to_sink(source, 0..len, sink.as_mut())
            .map_err(|e| e.with_operation("copy").with_key(key))?;
        sink.commit()
            .map_err(|e| e.with_operation("commit").with_key(key))?;
        Ok(crc)
    }
}

impl<S: Storage + ?Sized> StorageExt for S {}
