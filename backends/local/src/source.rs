//! Reading a local file: through the handle opened once (never reopened by path), so a file
//! replaced after open keeps reading the old bytes.

use std::fmt;
use std::io;
use std::ops::Range;
use std::path::PathBuf;
use std::sync::Arc;

use weightbay::backend_kit::{FileHandle, check_range, check_ranges, lazy_bytes, read_at_parallel};
use weightbay::{AllocationProperty, Bytes, Error, ErrorKind, Result, Source};

/// The handle a source reads through, with the length seen at open.
#[derive(Debug)]
struct OpenFile {
    file: Box<dyn FileHandle>,
    len: u64,
    path: PathBuf,
}

impl Source for OpenFile {
    fn len(&self) -> u64 {
        self.len
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        check_range(&(offset..offset.saturating_add(buf.len() as u64)), self.len)?;
        self.file.read_at(offset, buf).map_err(|e| {
            let message = if e.kind() == io::ErrorKind::UnexpectedEof {
                format!("{} shrank after it was opened", self.path.display())
            } else {
                format!("reading {}", self.path.display())
            };
            Error::new(ErrorKind::Io, message)
                .with_offset(offset)
                .with_source(e)
        })
    }
}

/// A file opened for reading: `read_at` through the held handle (never reopened by path);
/// `bytes` are lazy file regions over that handle.
pub(crate) struct LocalSource(Arc<OpenFile>);

impl LocalSource {
    /// Reads `file`, `len` bytes long when opened, found at `path`.
    pub(crate) fn new(file: Box<dyn FileHandle>, len: u64, path: PathBuf) -> Self {
        Self(Arc::new(OpenFile { file, len, path }))
    }
}

impl fmt::Debug for LocalSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("LocalSource").field(&self.0.path).finish()
    }
}

impl Source for LocalSource {
    fn len(&self) -> u64 {
        self.0.len
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        self.0.read_at(offset, buf)
    }

    fn bytes(&self, range: Range<u64>) -> Result<Bytes> {
        lazy_bytes(Arc::clone(&self.0) as _, range, AllocationProperty::File)
    }

    /// `pread`s straight into the returned buffers, the ranges shared out over a few threads
    /// ([`read_at_parallel`]).
    fn fetch(&self, ranges: &[Range<u64>]) -> Result<Vec<Bytes>> {
        check_ranges(ranges, self.len())?;
        let mut out: Vec<Bytes> = ranges
            .iter()
            .map(|range| {
                let len = usize::try_from(range.end - range.start).map_err(|_| {
                    Error::new(ErrorKind::OutOfRange, "range does not fit in memory")
                })?;
                Bytes::zeroed(len, 64)
            })
            .collect::<Result<_>>()?;
        let mut jobs: Vec<(u64, &mut [u8])> = out
            .iter_mut()
            .zip(ranges)
            .map(|(buf, range)| Ok((range.start, buf.make_mut()?)))
            .collect::<Result<_>>()?;
        read_at_parallel(self.0.as_ref(), &mut jobs)?;
        Ok(out)
    }
}
