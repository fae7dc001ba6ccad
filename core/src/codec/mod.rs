//! Lossless encodings of a stored piece: the bytes a store holds for a run of a container's
//! bytes, decoded back bit for bit.
//!
//! Trained weights are far from random: in bf16 and fp32 values the byte holding the sign and
//! the high exponent bits takes a few dozen values, while the mantissa bytes are close to
//! noise. [`Codec::Planes`] splits a piece into byte planes by the width of its elements (the
//! first byte of every element, then the second, ...) and stores each plane raw, as one
//! repeated byte, or Huffman coded, whichever is smallest, so the cost of coding is paid only
//! where it saves bytes. The layout is in `docs/FORMAT.md`.
//!
//! ```
//! use weightbay::codec::{Codec, encode_planes};
//!
//! // bf16 values near 0.02: the high bytes repeat, the low ones vary.
//! let logical: Vec<u8> = (0..4096u32).flat_map(|i| [(i * 37) as u8, 0x3c + (i % 3) as u8]).collect();
//! let stored = encode_planes(&logical, 2).expect("the high bytes shrink");
//! assert!(stored.len() < logical.len() * 3 / 4);
//! let mut back = vec![0u8; logical.len()];
//! Codec::Planes.decode(&stored, &mut back)?;
//! assert_eq!(back, logical);
//! # Ok::<(), weightbay::Error>(())
//! ```
//!
//! Decoding treats its input as hostile: every length is checked against the bytes there
//! are, the output is the caller's buffer of the logical length (a frame cannot make it
//! allocate more), and a frame that does not decode to exactly that length is
//! [`ErrorKind::Corrupt`](crate::ErrorKind::Corrupt).

mod huffman;

use crate::{Error, Result};

/// The longest piece [`encode_planes`] encodes and a record may declare encoded: a decoder
/// then never writes more than this for one piece, whatever a record claims. Pieces are cut
/// at 1 MiB by default.
pub const MAX_ENCODED_LOGICAL_LEN: u64 = 64 << 20;

/// The widest element [`Codec::Planes`] groups bytes by.
pub const MAX_PLANE_WIDTH: usize = 8;

/// A way a piece's stored bytes encode its logical bytes, named in the commit record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Codec {
    /// Byte planes by element width, each raw, one repeated byte, or Huffman coded
    /// ([`encode_planes`]).
    Planes,
}

impl Codec {
    /// The name a record stores.
    pub const fn name(self) -> &'static str {
        match self {
            Self::Planes => "planes",
        }
    }

    /// The codec a record names.
    ///
    /// # Errors
    /// [`ErrorKind::Unsupported`](crate::ErrorKind::Unsupported) naming `name` when this
    /// version of weightbay does not know it (written by a newer one).
    pub fn from_name(name: &str) -> Result<Self> {
        match name {
            "planes" => Ok(Self::Planes),
            _ => Err(Error::unsupported(format!(
                "pieces encoded with codec `{}`, which this weightbay does not know (it knows `planes`)",
                name.escape_debug()
            ))),
        }
    }

    /// Decodes `stored` into `into`, which must be the piece's logical length.
    ///
    /// # Errors
    /// [`ErrorKind::Corrupt`](crate::ErrorKind::Corrupt) naming what is wrong when `stored`
    /// is not a frame of this codec that decodes to exactly `into.len()` bytes;
    /// [`ErrorKind::LimitExceeded`](crate::ErrorKind::LimitExceeded) when `into` is longer
    /// than [`MAX_ENCODED_LOGICAL_LEN`].
    pub fn decode(self, stored: &[u8], into: &mut [u8]) -> Result<()> {
        match self {
            Self::Planes => decode_planes(stored, into),
        }
    }
}

/// How a plane is stored, the byte before its length in a frame.
const RAW: u8 = 0;
const REPEATED: u8 = 1;
const HUFFMAN: u8 = 2;

/// Encodes `logical` as byte planes of elements `width` bytes wide (2 for bf16 and f16, 4 for
/// f32, 1 for bytes and fp8), or `None` when that would not make it smaller: the piece is then
/// best stored raw.
///
/// A plane is Huffman coded only where that saves at least 1/32 of it, so a decoder spends
/// time only on planes that pay for it.
///
/// # Panics
/// When `width` is 0 or over [`MAX_PLANE_WIDTH`], or `logical` is longer than
/// [`MAX_ENCODED_LOGICAL_LEN`]: both are the caller's choice, not input.
pub fn encode_planes(logical: &[u8], width: usize) -> Option<Vec<u8>> {
    assert!(
        (1..=MAX_PLANE_WIDTH).contains(&width),
        "plane width {width} is not 1 to {MAX_PLANE_WIDTH}"
    );
    assert!(
        logical.len() as u64 <= MAX_ENCODED_LOGICAL_LEN,
        "a piece of {} bytes is over {MAX_ENCODED_LOGICAL_LEN}",
        logical.len()
    );
    let planes = split(logical, width);
    let mut out = Vec::with_capacity(logical.len());
    out.push(width as u8);
    let heads_at = out.len();
    out.resize(heads_at + 5 * width, 0);
    for (p, plane) in planes.iter().enumerate() {
        let plane: &[u8] = plane.as_ref();
        let start = out.len();
        let counts = huffman::histogram(plane);
        let present = counts.iter().filter(|&&c| c > 0).count();
        let method = if present == 1 {
            out.push(plane[0]);
            REPEATED
        } else {
            let lengths = (present > 1).then(|| huffman::code_lengths(&counts));
            match lengths {
                Some(lengths)
                    if huffman::section_len(&counts, &lengths)
                        <= (plane.len() - plane.len() / 32) as u64 =>
                {
                    huffman::encode(plane, &lengths, &mut out);
                    HUFFMAN
                }
                _ => {
                    out.extend_from_slice(plane);
                    RAW
                }
            }
        };
        let len = u32::try_from(out.len() - start).expect("a plane is under 64 MiB");
        let head = heads_at + 5 * p;
        out[head] = method;
        out[head + 1..head + 5].copy_from_slice(&len.to_le_bytes());
        if out.len() >= logical.len() {
            return None;
        }
    }
    Some(out)
}

/// The planes of `logical`: plane `p` holds bytes `p, p + width, p + 2 * width, ...`; a plane
/// of width 1 is `logical` itself.
fn split(logical: &[u8], width: usize) -> Vec<std::borrow::Cow<'_, [u8]>> {
    use std::borrow::Cow;
    let mut planes: Vec<Vec<u8>> = (0..width)
        .map(|p| vec![0; plane_len(logical.len(), width, p)])
        .collect();
    match width {
        1 => return vec![Cow::Borrowed(logical)],
        2 => split_by::<2>(logical, &mut planes),
        4 => split_by::<4>(logical, &mut planes),
        8 => split_by::<8>(logical, &mut planes),
        _ => {
            for (i, &byte) in logical.iter().enumerate() {
                planes[i % width][i / width] = byte;
            }
        }
    }
    planes.into_iter().map(Cow::Owned).collect()
}

/// [`split`] for a width known when compiled: one pass, every plane's byte of an element
/// written together, which the compiler turns into shuffles of whole vectors.
fn split_by<const W: usize>(logical: &[u8], planes: &mut [Vec<u8>]) {
    let (elements, tail) = logical.as_chunks::<W>();
    let n = elements.len();
    let (heads, tails): (Vec<&mut [u8]>, Vec<&mut [u8]>) =
        planes.iter_mut().map(|plane| plane.split_at_mut(n)).unzip();
    let Ok::<[&mut [u8]; W], _>(whole) = heads.try_into() else {
        unreachable!("one plane per byte of an element");
    };
    for (i, element) in elements.iter().enumerate() {
        for p in 0..W {
            whole[p][i] = element[p];
        }
    }
    for (rest, &byte) in tails.into_iter().zip(tail) {
        rest[0] = byte;
    }
}

/// How many bytes of a piece of `len` lie in plane `p` of `width`.
fn plane_len(len: usize, width: usize, p: usize) -> usize {
    (len + width - 1 - p) / width
}

fn decode_planes(stored: &[u8], into: &mut [u8]) -> Result<()> {
    if into.len() as u64 > MAX_ENCODED_LOGICAL_LEN {
        return Err(Error::new(
            crate::ErrorKind::LimitExceeded,
            format!(
                "an encoded piece of {} bytes is over the limit of {MAX_ENCODED_LOGICAL_LEN}",
                into.len()
            ),
        ));
    }
    let width = usize::from(
        *stored
            .first()
            .ok_or_else(|| Error::corrupt("an empty frame"))?,
    );
    if !(1..=MAX_PLANE_WIDTH).contains(&width) {
        return Err(Error::corrupt(format!(
            "a frame of planes {width} bytes wide (1 to {MAX_PLANE_WIDTH} are allowed)"
        )));
    }
    let heads_end = 1 + 5 * width;
    let heads = stored.get(1..heads_end).ok_or_else(|| {
        Error::corrupt(format!(
            "a frame of {} bytes is shorter than its {width} plane headers",
            stored.len()
        ))
    })?;
    let mut at = heads_end;
    // Decoded planes; raw ones are read where they lie.
    let mut decoded: Vec<Vec<u8>> = Vec::new();
    let mut methods = Vec::with_capacity(width);
    for (p, head) in heads.chunks_exact(5).enumerate() {
        let len = u32::from_le_bytes(head[1..5].try_into().expect("4 bytes")) as usize;
        let section = stored.get(at..at.saturating_add(len)).ok_or_else(|| {
            Error::corrupt(format!(
                "plane {p} claims {len} bytes, the frame has {} left",
                stored.len().saturating_sub(at)
            ))
        })?;
        at += len;
        let n = plane_len(into.len(), width, p);
        match (head[0], len) {
            (RAW, _) if len == n => {}
            (REPEATED, 1) => decoded.push(vec![section[0]; n]),
            (HUFFMAN, _) if width == 1 => huffman::decode(section, into)?,
            (HUFFMAN, _) => {
                let mut plane = vec![0; n];
                huffman::decode(section, &mut plane)?;
                decoded.push(plane);
            }
            (RAW | REPEATED, _) => {
                return Err(Error::corrupt(format!(
                    "plane {p} is {len} bytes, its method stores {n} bytes as {}",
                    if head[0] == RAW { n } else { 1 }
                )));
            }
            (method, _) => return Err(Error::corrupt(format!("plane {p} has method {method}"))),
        }
        methods.push((head[0], section));
    }
    expect_end(stored, at)?;
    if width == 1 && methods[0].0 == HUFFMAN {
        return Ok(());
    }
    let mut decoded = decoded.iter();
    let planes: Vec<&[u8]> = methods
        .iter()
        .map(|&(method, section)| match method {
            RAW => section,
            _ => decoded
                .next()
                .expect("a decoded plane per method that decodes"),
        })
        .collect();
    merge(into, &planes);
    Ok(())
}

fn expect_end(stored: &[u8], at: usize) -> Result<()> {
    if at == stored.len() {
        Ok(())
    } else {
        Err(Error::corrupt(format!(
            "a frame of {} bytes ends at byte {at}",
            stored.len()
        )))
    }
}

/// Writes plane `p` of `planes` to bytes `p, p + width, ...` of `into`: the inverse of
/// [`split`].
fn merge(into: &mut [u8], planes: &[&[u8]]) {
    match planes.len() {
        1 => into.copy_from_slice(planes[0]),
        2 => merge_by::<2>(into, planes),
        4 => merge_by::<4>(into, planes),
        8 => merge_by::<8>(into, planes),
        width => {
            for (i, slot) in into.iter_mut().enumerate() {
                *slot = planes[i % width][i / width];
            }
        }
    }
}

/// [`merge`] for a width known when compiled, one pass over `into`.
fn merge_by<const W: usize>(into: &mut [u8], planes: &[&[u8]]) {
    let (elements, tail) = into.as_chunks_mut::<W>();
    let n = elements.len();
    let whole: [&[u8]; W] = std::array::from_fn(|p| &planes[p][..n]);
    for (i, element) in elements.iter_mut().enumerate() {
        for p in 0..W {
            element[p] = whole[p][i];
        }
    }
    for (p, slot) in tail.iter_mut().enumerate() {
        *slot = planes[p][n];
    }
}

#[cfg(test)]
mod tests;
