//! The `planes` frame: a piece split into byte planes, each stored raw, as one repeated byte,
//! or Huffman coded (docs/FORMAT.md, "Encoded pieces").

use std::cell::RefCell;

use super::elements::Elements;
use super::{huffman, words};
use crate::{Error, Result};

/// How a plane is stored, the byte before its length in a frame.
const RAW: u8 = 0;
const REPEATED: u8 = 1;
const HUFFMAN: u8 = 2;

/// The frame's flag for elements rotated left one bit before they were split.
const ROTATED: u8 = 1;

/// The widest element a frame splits by.
const MAX_WIDTH: usize = 8;

/// Bytes of a frame before its plane headers: the width and the flags.
const FRAME_HEADER_LEN: usize = 2;

/// How many bytes of a piece of `len` lie in plane `p` of `width`.
fn plane_len(len: usize, width: usize, p: usize) -> usize {
    (len + width - 1 - p) / width
}

/// How much of a long plane is counted first to see whether it could shrink at all: the
/// mantissa planes of floats are near noise, and counting all of them would cost as much as
/// coding the exponents.
const SAMPLE_LEN: usize = 64 << 10;

thread_local! {
    /// The planes of the piece being split or joined on this thread, kept from piece to piece
    /// (as long as the longest piece): a fresh buffer per piece cost more in page faults than
    /// the splitting itself.
    static SCRATCH: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// Runs `f` on this thread's scratch buffer cut to `len` bytes.
fn with_scratch<R>(len: usize, f: impl FnOnce(&mut [u8]) -> R) -> R {
    SCRATCH.with(|cell| {
        // Taken out while in use, so a nested call would get a fresh one, not a panic.
        let mut scratch = cell.take();
        if scratch.len() < len {
            scratch.resize(len, 0);
        }
        let result = f(&mut scratch[..len]);
        cell.replace(scratch);
        result
    })
}

/// `planes` (the bytes of plane 0, then plane 1, ...) cut into one slice per plane of a piece
/// of `len` split `width` ways.
fn cut_planes(planes: &mut [u8], len: usize, width: usize) -> Vec<&mut [u8]> {
    let mut cut = Vec::with_capacity(width);
    let mut rest = planes;
    for p in 0..width {
        let (plane, tail) = std::mem::take(&mut rest).split_at_mut(plane_len(len, width, p));
        cut.push(plane);
        rest = tail;
    }
    cut
}

pub(super) fn encode(logical: &[u8], elements: Elements, out: &mut Vec<u8>) -> bool {
    let width = elements.width();
    let rotate = elements.rotated();
    if width == 1 {
        return encode_split(logical.len(), width, rotate, &[logical], out);
    }
    with_scratch(logical.len(), |scratch| {
        let whole = logical.len() / width;
        let mut planes = cut_planes(scratch, logical.len(), width);
        let heads: Vec<&mut [u8]> = planes.iter_mut().map(|p| &mut p[..whole]).collect();
        words::split(&logical[..whole * width], width, rotate, heads);
        // A piece may end inside an element (a tensor's last chunk runs on over padding):
        // those bytes go to their planes as they are.
        for (plane, &byte) in planes.iter_mut().zip(&logical[whole * width..]) {
            plane[whole] = byte;
        }
        let planes: Vec<&[u8]> = planes.into_iter().map(|p| &*p).collect();
        encode_split(logical.len(), width, rotate, &planes, out)
    })
}

/// Appends the frame of a piece of `len` bytes split into `planes` to `out`; whether it is
/// shorter than the piece.
fn encode_split(
    len: usize,
    width: usize,
    rotate: bool,
    planes: &[&[u8]],
    out: &mut Vec<u8>,
) -> bool {
    out.reserve(len);
    out.push(width as u8);
    out.push(if rotate { ROTATED } else { 0 });
    let heads_at = out.len();
    out.resize(heads_at + 5 * width, 0);
    for (p, &plane) in planes.iter().enumerate() {
        let start = out.len();
        let method = encode_plane(plane, out);
        let section = u32::try_from(out.len() - start).expect("a plane is under 64 MiB");
        let head = heads_at + 5 * p;
        out[head] = method;
        out[head + 1..head + 5].copy_from_slice(&section.to_le_bytes());
        if out.len() >= len {
            return false;
        }
    }
    true
}

/// Appends `plane`'s section to `out` in the method that stores it smallest; returns the
/// method.
fn encode_plane(plane: &[u8], out: &mut Vec<u8>) -> u8 {
    // Whether it shrinks at all is judged on a sample first, asking it to save twice the
    // share the whole plane must, so that a plane close to the line is counted in full.
    if plane.len() >= 4 * SAMPLE_LEN && !shrinks(&plane[..SAMPLE_LEN], 16) {
        out.extend_from_slice(plane);
        return RAW;
    }
    let counts = huffman::histogram(plane);
    let present = counts.iter().filter(|&&c| c > 0).count();
    if present == 1 {
        out.push(plane[0]);
        return REPEATED;
    }
    if present > 1 {
        let lengths = huffman::code_lengths(&counts);
        if huffman::section_len(&counts, &lengths) <= (plane.len() - plane.len() / 32) as u64 {
            huffman::encode(plane, &lengths, out);
            return HUFFMAN;
        }
    }
    out.extend_from_slice(plane);
    RAW
}

/// Whether `sample` Huffman codes to at least `1 / share` less than itself.
fn shrinks(sample: &[u8], share: usize) -> bool {
    let counts = huffman::histogram(sample);
    if counts.iter().filter(|&&c| c > 0).count() < 2 {
        return true;
    }
    let lengths = huffman::code_lengths(&counts);
    huffman::section_len(&counts, &lengths) <= (sample.len() - sample.len() / share) as u64
}

pub(super) fn decode(stored: &[u8], into: &mut [u8]) -> Result<()> {
    let &[width, flags] = stored
        .first_chunk::<FRAME_HEADER_LEN>()
        .ok_or_else(|| Error::corrupt(format!("a frame of {} bytes", stored.len())))?;
    let width = usize::from(width);
    if !(1..=MAX_WIDTH).contains(&width) {
        return Err(Error::corrupt(format!(
            "a frame of planes {width} bytes wide (1 to {MAX_WIDTH} are allowed)"
        )));
    }
    let rotate = match flags {
        0 => false,
        ROTATED if matches!(width, 2 | 4 | 8) => true,
        _ => {
            return Err(Error::corrupt(format!(
                "a frame of width {width} with flags {flags:#04x}"
            )));
        }
    };
    let heads_end = FRAME_HEADER_LEN + 5 * width;
    let heads = stored.get(FRAME_HEADER_LEN..heads_end).ok_or_else(|| {
        Error::corrupt(format!(
            "a frame of {} bytes is shorter than its {width} plane headers",
            stored.len()
        ))
    })?;
    with_scratch(into.len(), |scratch| {
        let mut at = heads_end;
        let mut decoded = cut_planes(scratch, into.len(), width).into_iter();
        let mut planes: Vec<&[u8]> = Vec::with_capacity(width);
        for (p, head) in heads.chunks_exact(5).enumerate() {
            let len = u32::from_le_bytes(head[1..5].try_into().expect("4 bytes")) as usize;
            let section = stored.get(at..at.saturating_add(len)).ok_or_else(|| {
                Error::corrupt(format!(
                    "plane {p} claims {len} bytes, the frame has {} left",
                    stored.len().saturating_sub(at)
                ))
            })?;
            at += len;
            let plane = decoded.next().expect("a scratch plane per plane");
            let n = plane.len();
            planes.push(match (head[0], len) {
                (RAW, _) if len == n => section,
                (REPEATED, 1) => {
                    plane.fill(section[0]);
                    plane
                }
                (HUFFMAN, _) => {
                    huffman::decode(section, plane)?;
                    plane
                }
                (RAW | REPEATED, _) => {
                    return Err(Error::corrupt(format!(
                        "plane {p} is {len} bytes, its method stores {n} bytes as {}",
                        if head[0] == RAW { n } else { 1 }
                    )));
                }
                (method, _) => {
                    return Err(Error::corrupt(format!("plane {p} has method {method}")));
                }
            });
        }
        if at != stored.len() {
            return Err(Error::corrupt(format!(
                "a frame of {} bytes ends at byte {at}",
                stored.len()
            )));
        }
        if width == 1 {
            into.copy_from_slice(planes[0]);
            return Ok(());
        }
        let whole = into.len() / width;
        let heads: Vec<&[u8]> = planes.iter().map(|p| &p[..whole]).collect();
        let (elements, tail) = into.split_at_mut(whole * width);
        words::merge(&heads, width, rotate, elements);
        for (slot, plane) in tail.iter_mut().zip(&planes) {
            *slot = plane[whole];
        }
        Ok(())
    })
}
