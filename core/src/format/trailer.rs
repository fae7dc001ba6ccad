//! weightbay's integrity trailer: CRC32C checksums of the container's bytes, appended after
//! the last tensor byte, where Burnpack readers ignore it.
//!
//! ```text
//! prefix_crc  u32 LE   CRC32C of bytes [0, data_start): header, metadata, padding
//! tensor_crc  u32 LE   × count, CRC32C of each tensor's bytes, in data (offset) order
//! count       u32 LE   number of tensor checksums
//! length      u32 LE   length of the whole trailer: 4 + 4 × count + 16
//! magic       8 bytes  "WBCRC32C"
//! ```

use crate::{Error, Result};

/// The last eight bytes of a container that carries a trailer.
pub(crate) const TRAILER_MAGIC: [u8; 8] = *b"WBCRC32C";
/// Length of the fixed footer: count, length and magic.
pub(crate) const FOOTER_LEN: u64 = 16;

/// The length of a trailer holding `count` tensor checksums.
pub(crate) fn trailer_len(count: usize) -> u64 {
    4 + 4 * count as u64 + FOOTER_LEN
}

/// Encodes a trailer.
pub(crate) fn encode(prefix_crc: u32, tensor_crcs: &[u32]) -> Result<Vec<u8>> {
    let count = u32::try_from(tensor_crcs.len())
        .map_err(|_| Error::invalid("too many tensors for an integrity trailer"))?;
    let len = u32::try_from(trailer_len(tensor_crcs.len()))
        .map_err(|_| Error::invalid("too many tensors for an integrity trailer"))?;
    let mut out = Vec::with_capacity(len as usize);
    out.extend_from_slice(&prefix_crc.to_le_bytes());
    for crc in tensor_crcs {
        out.extend_from_slice(&crc.to_le_bytes());
    }
    out.extend_from_slice(&count.to_le_bytes());
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(&TRAILER_MAGIC);
    Ok(out)
}

/// Checks the footer against the bytes that follow the data (`tail_len` of them) and the
/// number of tensors. Returns `Ok(())` when they form exactly one trailer.
pub(crate) fn check_footer(footer: &[u8; 16], tail_len: u64, tensor_count: usize) -> Result<()> {
    let count = u32::from_le_bytes([footer[0], footer[1], footer[2], footer[3]]);
    let len = u32::from_le_bytes([footer[4], footer[5], footer[6], footer[7]]);
    if footer[8..] != TRAILER_MAGIC {
        return Err(Error::corrupt(format!(
            "{tail_len} unexpected bytes after the last tensor"
        )));
    }
    if u64::from(len) != tail_len || u64::from(len) != trailer_len(count as usize) {
        return Err(Error::corrupt(format!(
            "integrity trailer claims {len} bytes for {count} checksums, but {tail_len} bytes follow the data"
        )));
    }
    if count as usize != tensor_count {
        return Err(Error::corrupt(format!(
            "integrity trailer holds {count} checksums for {tensor_count} tensors"
        )));
    }
    Ok(())
}

/// Splits a whole trailer (already checked by [`check_footer`]) into the prefix checksum and
/// the tensor checksums.
pub(crate) fn decode(trailer: &[u8]) -> (u32, Vec<u32>) {
    let body_len = trailer.len().saturating_sub(FOOTER_LEN as usize);
    let mut words = trailer[..body_len]
        .chunks_exact(4)
        .map(|word| u32::from_le_bytes([word[0], word[1], word[2], word[3]]));
    let prefix = words.next().unwrap_or_default();
    (prefix, words.collect())
}
