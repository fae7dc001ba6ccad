//! The sink of an in-place save: the destination file itself, written through its own inode.

use std::path::PathBuf;
use std::time::Instant;

use weightbay::backend_kit::{FileHandle, check_deadline, check_written};
use weightbay::{PositionedWrite, Result, Sink};

use crate::file_writes::{FileWrites, io_error, written_len};

/// Writes the destination itself, keeping its inode. The old container is gone as soon as
/// the sink is created; a failure leaves a truncated file.
pub(crate) struct InPlaceSink {
    pub(crate) file: Box<dyn FileHandle>,
    pub(crate) path: PathBuf,
    pub(crate) durable: bool,
    pub(crate) written: u64,
    pub(crate) expected_len: Option<u64>,
    /// As [`AtomicSink::positioned`].
    pub(crate) positioned: bool,
    pub(crate) deadline: Option<Instant>,
}

impl Sink for InPlaceSink {
    fn write(&mut self, data: &[u8]) -> Result<()> {
        check_deadline(self.deadline, "writing")?;
        self.file
            .write_all(data)
            .map_err(|e| io_error("writing", &self.path, e))?;
        self.written += data.len() as u64;
        Ok(())
    }

    fn commit(self: Box<Self>) -> Result<()> {
        check_written(
            self.expected_len,
            written_len(
                self.file.as_ref(),
                self.positioned,
                self.written,
                &self.path,
            )?,
        )?;
        check_deadline(self.deadline, "committing")?;
        if self.durable {
            self.file
                .sync_all()
                .map_err(|e| io_error("syncing", &self.path, e))?;
        }
        Ok(())
    }

    fn positioned(&mut self) -> Option<Box<dyn PositionedWrite + '_>> {
        let expected_len = self.expected_len?;
        self.positioned = true;
        Some(Box::new(FileWrites {
            file: self.file.as_ref(),
            path: &self.path,
            expected_len,
            deadline: self.deadline,
        }))
    }
}
