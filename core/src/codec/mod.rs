//! Lossless encodings of a stored piece: the bytes a store holds for a run of a container's
//! bytes, decoded back bit for bit.
//!
//! Trained weights are far from random: in bf16 and fp32 values the byte holding the sign and
//! the high exponent bits takes a few dozen values, while the mantissa bytes are close to
//! noise. [`Codec::Planes`] splits a piece into byte planes by the width of its elements (the
//! first byte of every element, then the second, ...; for floats after moving each sign bit
//! below the mantissa, so one plane holds exactly the exponents) and stores each plane raw, as
//! one repeated byte, or Huffman coded, whichever is smallest, so the cost of coding is paid
//! only where it saves bytes. The layout is in `docs/FORMAT.md`.
//!
//! ```
//! use weightbay::DType;
//! use weightbay::codec::{Codec, Elements, encode_planes};
//!
//! // bf16 values near 0.02: the exponents repeat, the mantissas vary.
//! let logical: Vec<u8> = (0..4096u32).flat_map(|i| [(i * 37) as u8, 0x3c + (i % 3) as u8]).collect();
//! let mut stored = Vec::new();
//! assert!(encode_planes(&logical, Elements::of(&DType::BF16), &mut stored), "the exponents shrink");
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
//! [`ErrorKind::Corrupt`].

mod elements;
mod huffman;
mod planes;
mod words;

pub use elements::Elements;

use crate::{Error, ErrorKind, Result};

/// The longest piece [`encode_planes`] encodes and a record may declare encoded: a decoder
/// then never writes more than this for one piece, whatever a record claims. Pieces are cut
/// at 1 MiB by default.
pub const MAX_ENCODED_LOGICAL_LEN: u64 = 64 << 20;

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
    /// [`ErrorKind::Unsupported`] naming `name` when this version of weightbay does not know it
    /// (written by a newer one).
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
    /// [`ErrorKind::Corrupt`] naming what is wrong when `stored` is not a frame of this codec
    /// that decodes to exactly `into.len()` bytes; [`ErrorKind::LimitExceeded`] when `into` is
    /// longer than [`MAX_ENCODED_LOGICAL_LEN`].
    pub fn decode(self, stored: &[u8], into: &mut [u8]) -> Result<()> {
        if into.len() as u64 > MAX_ENCODED_LOGICAL_LEN {
            return Err(Error::new(
                ErrorKind::LimitExceeded,
                format!(
                    "an encoded piece of {} bytes is over the limit of {MAX_ENCODED_LOGICAL_LEN}",
                    into.len()
                ),
            ));
        }
        match self {
            Self::Planes => planes::decode(stored, into),
        }
    }
}

/// Encodes `logical`, a piece of `elements`, as byte planes ([`Codec::Planes`]) into `out`
/// (cleared first; a buffer kept from piece to piece costs no fresh memory), and says whether
/// that made it smaller: when not, the piece is best stored raw and `out` holds nothing of
/// use.
///
/// A plane is Huffman coded only where that saves at least 1/32 of it, so a decoder spends
/// time only on planes that pay for it.
///
/// # Panics
/// When `logical` is longer than [`MAX_ENCODED_LOGICAL_LEN`]: the caller cuts pieces.
pub fn encode_planes(logical: &[u8], elements: Elements, out: &mut Vec<u8>) -> bool {
    assert!(
        logical.len() as u64 <= MAX_ENCODED_LOGICAL_LEN,
        "a piece of {} bytes is over {MAX_ENCODED_LOGICAL_LEN}",
        logical.len()
    );
    out.clear();
    planes::encode(logical, elements, out)
}

#[cfg(test)]
mod tests;
