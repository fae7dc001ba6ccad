//! What both sinks share: writes by position into their open file, the length they wrote, and
//! errors that name the file.

use std::io;
use std::path::Path;
use std::time::Instant;

use weightbay::backend_kit::{FileHandle, check_deadline, check_range};
use weightbay::{Error, PositionedWrite, Result};

pub(crate) fn io_error(what: &str, path: &Path, e: io::Error) -> Error {
    Error::io(format!("{what} {}", path.display()), e)
}

/// How many bytes a local sink wrote: its appends, or where it was written by position, the
/// file's length.
pub(crate) fn written_len(
    file: &dyn FileHandle,
    positioned: bool,
    appended: u64,
    path: &Path,
) -> Result<u64> {
    if !positioned {
        return Ok(appended);
    }
    file.file_len()
        .map_err(|e| io_error("reading the length of", path, e))
}

/// A local sink's file written by position ([`Sink::positioned`]).
pub(crate) struct FileWrites<'a> {
    pub(crate) file: &'a dyn FileHandle,
    pub(crate) path: &'a Path,
    pub(crate) expected_len: u64,
    pub(crate) deadline: Option<Instant>,
}

impl PositionedWrite for FileWrites<'_> {
    fn write_at(&self, offset: u64, data: &[u8]) -> Result<()> {
        check_deadline(self.deadline, "writing")?;
        check_range(
            &(offset..offset.saturating_add(data.len() as u64)),
            self.expected_len,
        )?;
        self.file
            .write_at(offset, data)
            .map_err(|e| io_error("writing", self.path, e).with_offset(offset))
    }
}
