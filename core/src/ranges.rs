//! Checks of the ranges and lengths a backend is handed, with the errors the contracts name.

use std::ops::Range;

use crate::{Error, ErrorKind, Result};

/// Checks every range of a batched read against a source of `len` bytes.
///
/// # Errors
/// [`ErrorKind::OutOfRange`] for the first range that is reversed or passes `len`.
pub fn check_ranges(ranges: &[Range<u64>], len: u64) -> Result<()> {
    ranges.iter().try_for_each(|range| check_range(range, len))
}

/// Checks every job of a read into caller buffers ([`Source::fetch_into`](crate::Source::fetch_into)),
/// each `(offset, buffer)`, against a source of `len` bytes.
///
/// # Errors
/// [`ErrorKind::OutOfRange`] for the first job whose range passes `len`.
pub fn check_jobs(jobs: &[(u64, &mut [u8])], len: u64) -> Result<()> {
    jobs.iter().try_for_each(|(offset, buf)| {
        let end = offset.checked_add(buf.len() as u64).ok_or_else(|| {
            Error::new(ErrorKind::OutOfRange, "a range ends past u64::MAX").with_offset(*offset)
        })?;
        check_range(&(*offset..end), len)
    })
}

/// Checks, at commit, that a sink received the length the writer planned
/// ([`CreateOptions::expected_len`](crate::CreateOptions::expected_len)): a shorter stream means a
/// writer stopped early.
///
/// # Errors
/// [`ErrorKind::Io`] naming both lengths.
pub fn check_written(expected: Option<u64>, written: u64) -> Result<()> {
    match expected {
        Some(expected) if expected != written => Err(Error::new(
            ErrorKind::Io,
            format!("{written} bytes written, {expected} were planned"),
        )),
        _ => Ok(()),
    }
}

/// Checks `range` against a source of `len` bytes.
///
/// # Errors
/// [`ErrorKind::OutOfRange`] when the range is reversed or passes `len`.
pub fn check_range(range: &Range<u64>, len: u64) -> Result<()> {
    if range.start > range.end || range.end > len {
        return Err(Error::new(
            ErrorKind::OutOfRange,
            format!(
                "range {}..{} of a {len}-byte container",
                range.start, range.end
            ),
        )
        .with_offset(range.start));
    }
    Ok(())
}
