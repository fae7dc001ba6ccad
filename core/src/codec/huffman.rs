//! Canonical Huffman coding of one byte plane, in four streams decoded side by side.
//!
//! A section is: the longest code length `L` (1 byte, at most [`MAX_CODE_LEN`]); the first
//! symbol with a code and the number of symbols from it on that the table spans, less one (1
//! byte each); their code lengths as 4-bit nibbles (low nibble first, 0 for a symbol that does
//! not occur; an exponent plane's few dozen values take a few dozen bytes, not 128); the byte
//! lengths of streams 0, 1 and 2 (u32 LE each; stream 3 takes the rest); then the four
//! streams. Stream `k` codes the plane's `k`-th quarter (quarters of
//! `ceil(n / 4)` symbols, the last one shorter), least significant bit first, each code
//! bit-reversed so a decoder can look the next `L` bits up in one table of `2^L` entries.
//!
//! The code must be complete (its Kraft sum exactly one): then every `L`-bit pattern decodes
//! to a symbol, the decoding loop needs no check per symbol, and a stream that lies about its
//! length is caught once, at its end, by the number of bits it used.

use crate::{Error, Result};

/// The longest code: a decoding table of `2^11` two-byte entries fits in 4 KiB of L1 cache,
/// and the few symbols that would want longer codes (the rarest exponents) cost little.
pub(super) const MAX_CODE_LEN: u32 = 11;

/// Entries of a decoding table.
const TABLE_LEN: usize = 1 << MAX_CODE_LEN;

/// Bytes of a section before its code lengths: the longest length, the first symbol and the
/// count.
const LENGTHS_AT: usize = 3;

/// Bytes of the stream lengths after the code lengths.
const STREAM_LENS_LEN: usize = 3 * 4;

/// The symbols `lengths` gives codes to, first to last.
fn span(lengths: &[u8; 256]) -> std::ops::Range<usize> {
    let first = lengths.iter().position(|&l| l > 0).unwrap_or(0);
    let last = lengths.iter().rposition(|&l| l > 0).unwrap_or(0);
    first..last.max(first) + 1
}

/// Bytes of a section before its streams.
fn header_len(span: &std::ops::Range<usize>) -> usize {
    LENGTHS_AT + span.len().div_ceil(2) + STREAM_LENS_LEN
}

/// How often each byte occurs in `plane`, counted in four tables so that runs of one byte
/// do not stall on one counter.
pub(super) fn histogram(plane: &[u8]) -> [u64; 256] {
    let mut counts = [[0u32; 256]; 4];
    // u32 counters, flushed before they could overflow.
    for block in plane.chunks(1 << 30) {
        let mut quads = block.chunks_exact(4);
        for quad in &mut quads {
            counts[0][usize::from(quad[0])] += 1;
            counts[1][usize::from(quad[1])] += 1;
            counts[2][usize::from(quad[2])] += 1;
            counts[3][usize::from(quad[3])] += 1;
        }
        for &byte in quads.remainder() {
            counts[0][usize::from(byte)] += 1;
        }
    }
    let mut total = [0u64; 256];
    for (symbol, slot) in total.iter_mut().enumerate() {
        *slot = counts.iter().map(|c| u64::from(c[symbol])).sum();
    }
    total
}

/// Code lengths (0 for an absent symbol) of a complete prefix code no longer than
/// [`MAX_CODE_LEN`], near optimal for `counts`. Needs at least two symbols present.
pub(super) fn code_lengths(counts: &[u64; 256]) -> [u8; 256] {
    use std::cmp::Reverse;
    use std::collections::BinaryHeap;

    let mut lengths = [0u8; 256];
    // Huffman's construction; nodes 0..256 are the symbols, the rest internal.
    let mut parent = vec![0usize; 512];
    let mut heap: BinaryHeap<Reverse<(u64, usize)>> = counts
        .iter()
        .enumerate()
        .filter(|&(_, &c)| c > 0)
        .map(|(symbol, &c)| Reverse((c, symbol)))
        .collect();
    debug_assert!(heap.len() >= 2);
    let mut next = 256;
    while heap.len() > 1 {
        let (Some(Reverse((ca, a))), Some(Reverse((cb, b)))) = (heap.pop(), heap.pop()) else {
            unreachable!("the heap holds two nodes");
        };
        parent[a] = next;
        parent[b] = next;
        heap.push(Reverse((ca + cb, next)));
        next += 1;
    }
    let root = next - 1;
    let mut depth = vec![0u32; 512];
    for node in (256..root).rev() {
        depth[node] = depth[parent[node]] + 1;
    }
    for symbol in 0..256 {
        if counts[symbol] > 0 {
            let d = depth[parent[symbol]] + 1;
            lengths[symbol] = d.min(MAX_CODE_LEN) as u8;
        }
    }
    limit(&mut lengths, counts);
    lengths
}

/// Makes clamped lengths a complete code again: while the Kraft sum is over one, lengthens the
/// rarest codes that can grow; while under, shortens the commonest codes that fit the slack.
fn limit(lengths: &mut [u8; 256], counts: &[u64; 256]) {
    let full = 1u64 << MAX_CODE_LEN;
    let weight = |len: u8| 1u64 << (MAX_CODE_LEN - u32::from(len));
    let mut kraft: u64 = lengths.iter().filter(|&&l| l > 0).map(|&l| weight(l)).sum();
    let mut by_count: Vec<usize> = (0..256).filter(|&s| lengths[s] > 0).collect();
    by_count.sort_by_key(|&s| (counts[s], s));
    while kraft > full {
        // Rarest first; a code that grows from `len` frees half its weight.
        for &symbol in &by_count {
            let len = lengths[symbol];
            if u32::from(len) < MAX_CODE_LEN && kraft > full {
                kraft -= weight(len) / 2;
                lengths[symbol] = len + 1;
            }
        }
    }
    // The slack is a multiple of the lightest weight present, so a longest code always fits
    // it: every pass shortens at least one code until the sum is exactly one.
    while kraft < full {
        for &symbol in by_count.iter().rev() {
            let len = lengths[symbol];
            if len > 1 && full - kraft >= weight(len) {
                kraft += weight(len);
                lengths[symbol] = len - 1;
            }
        }
    }
}

/// The bits `lengths` would code `counts` in, and the section that would hold them.
pub(super) fn section_len(counts: &[u64; 256], lengths: &[u8; 256]) -> u64 {
    let bits: u64 = counts
        .iter()
        .zip(lengths)
        .map(|(&c, &l)| c * u64::from(l))
        .sum();
    // Each of four streams rounds up to a byte.
    header_len(&span(lengths)) as u64 + bits / 8 + 4
}

/// Canonical codes for `lengths`, each bit-reversed for a least-significant-bit-first stream.
fn codes(lengths: &[u8; 256]) -> [u16; 256] {
    let mut per_len = [0u16; MAX_CODE_LEN as usize + 1];
    for &l in lengths {
        per_len[usize::from(l)] += 1;
    }
    per_len[0] = 0;
    let mut next = [0u16; MAX_CODE_LEN as usize + 2];
    let mut code = 0u16;
    for len in 1..=MAX_CODE_LEN as usize {
        code = (code + per_len[len - 1]) << 1;
        next[len] = code;
    }
    let mut codes = [0u16; 256];
    for (symbol, &l) in lengths.iter().enumerate() {
        if l > 0 {
            let c = next[usize::from(l)];
            next[usize::from(l)] += 1;
            codes[symbol] = c.reverse_bits() >> (16 - u32::from(l));
        }
    }
    codes
}

/// Where the four streams' symbols lie in a plane of `n`.
fn quarters(n: usize) -> [std::ops::Range<usize>; 4] {
    let q = n.div_ceil(4);
    std::array::from_fn(|k| (k * q).min(n)..((k + 1) * q).min(n))
}

/// Appends `plane` coded with `lengths` (a complete code) as a section to `out`.
pub(super) fn encode(plane: &[u8], lengths: &[u8; 256], out: &mut Vec<u8>) {
    let codes = codes(lengths);
    // One entry per symbol: its code and length, so each step loads once.
    let mut entries = [0u32; 256];
    for symbol in 0..256 {
        entries[symbol] = u32::from(codes[symbol]) | u32::from(lengths[symbol]) << 16;
    }
    let span = span(lengths);
    out.push(MAX_CODE_LEN as u8);
    out.push(span.start as u8);
    out.push((span.len() - 1) as u8);
    for pair in lengths[span].chunks(2) {
        out.push(pair[0] | pair.get(1).copied().unwrap_or(0) << 4);
    }
    let lens_at = out.len();
    out.extend_from_slice(&[0; 12]);
    let mut stream_lens = [0usize; 4];
    for (k, range) in quarters(plane.len()).into_iter().enumerate() {
        stream_lens[k] = encode_stream(&plane[range], &entries, out);
    }
    for k in 0..3 {
        let len = u32::try_from(stream_lens[k]).expect("a plane is under 4 GiB");
        out[lens_at + 4 * k..lens_at + 4 * k + 4].copy_from_slice(&len.to_le_bytes());
    }
}

/// Appends one stream; returns its length in bytes.
fn encode_stream(symbols: &[u8], entries: &[u32; 256], out: &mut Vec<u8>) -> usize {
    let start = out.len();
    // At most MAX_CODE_LEN bits a symbol, plus the 8 bytes each flush writes whole.
    out.resize(start + symbols.len() * MAX_CODE_LEN as usize / 8 + 16, 0);
    let mut at = start;
    let mut acc = 0u64;
    let mut bits = 0u32;
    let mut fours = symbols.chunks_exact(4);
    for four in &mut fours {
        // Four codes of at most 11 bits on top of at most 7 pending: 51 bits, within 64.
        for &symbol in four {
            let entry = entries[usize::from(symbol)];
            acc |= u64::from(entry & 0xffff) << bits;
            bits += entry >> 16;
        }
        out[at..at + 8].copy_from_slice(&acc.to_le_bytes());
        let whole = (bits / 8) as usize;
        at += whole;
        acc >>= whole * 8;
        bits %= 8;
    }
    for &symbol in fours.remainder() {
        let entry = entries[usize::from(symbol)];
        acc |= u64::from(entry & 0xffff) << bits;
        bits += entry >> 16;
    }
    out[at..at + 8].copy_from_slice(&acc.to_le_bytes());
    at += bits.div_ceil(8) as usize;
    out.truncate(at);
    at - start
}

/// Decodes a section holding exactly `into.len()` symbols.
///
/// # Errors
/// [`ErrorKind::Corrupt`](crate::ErrorKind::Corrupt) naming what is wrong when the section is
/// short, its code lengths are not a complete code, or a stream's length is not the bytes its
/// symbols take.
pub(super) fn decode(section: &[u8], into: &mut [u8]) -> Result<()> {
    let &[max_len, first, count] = section.first_chunk::<LENGTHS_AT>().ok_or_else(|| {
        Error::corrupt(format!(
            "a Huffman plane of {} bytes is shorter than its table",
            section.len()
        ))
    })?;
    let max_len = u32::from(max_len);
    if !(1..=MAX_CODE_LEN).contains(&max_len) {
        return Err(Error::corrupt(format!(
            "a Huffman plane's longest code is {max_len} bits (1 to {MAX_CODE_LEN} are allowed)"
        )));
    }
    let span = usize::from(first)..usize::from(first) + usize::from(count) + 1;
    if span.end > 256 {
        return Err(Error::corrupt(format!(
            "a Huffman plane's table spans symbols {} to {}, past 255",
            span.start,
            span.end - 1
        )));
    }
    let streams_at = header_len(&span);
    if section.len() < streams_at {
        return Err(Error::corrupt(format!(
            "a Huffman plane of {} bytes is shorter than its table",
            section.len()
        )));
    }
    let mut lengths = [0u8; 256];
    let nibbles = &section[LENGTHS_AT..streams_at - STREAM_LENS_LEN];
    for (i, symbol) in span.enumerate() {
        let pair = nibbles[i / 2];
        lengths[symbol] = if i % 2 == 0 { pair & 0xf } else { pair >> 4 };
    }
    let table = table(&lengths, max_len)?;
    let mut stream_lens = [0usize; 4];
    let mut rest = section.len() - streams_at;
    for (k, (slot, field)) in stream_lens
        .iter_mut()
        .zip(section[streams_at - STREAM_LENS_LEN..streams_at].chunks_exact(4))
        .enumerate()
    {
        let len = u32::from_le_bytes(field.try_into().expect("4 bytes")) as usize;
        if len > rest {
            return Err(Error::corrupt(format!(
                "a Huffman plane's stream {k} claims {len} bytes, {rest} are left"
            )));
        }
        *slot = len;
        rest -= len;
    }
    stream_lens[3] = rest;
    let mut streams: [&[u8]; 4] = [&[]; 4];
    let mut at = streams_at;
    for k in 0..4 {
        streams[k] = &section[at..at + stream_lens[k]];
        at += stream_lens[k];
    }
    let ranges = quarters(into.len());
    let outs: [&mut [u8]; 4] = {
        let (a, rest) = into.split_at_mut(ranges[0].len());
        let (b, rest) = rest.split_at_mut(ranges[1].len());
        let (c, d) = rest.split_at_mut(ranges[2].len());
        [a, b, c, d]
    };
    let mask = TABLE_LEN as u64 - 1;
    let triples = triples(&table);
    let mut pos = [0usize; 4];
    let mut done = [0usize; 4];
    // Side by side while every stream has 8 bytes to load and room for 16 symbols: four
    // independent chains keep the core's units busy, and each lookup yields one to three
    // symbols (an exponent's code is three bits or so).
    while (0..4).all(|k| pos[k] / 8 + 8 <= streams[k].len() && done[k] + 16 <= outs[k].len()) {
        for k in 0..4 {
            let at = pos[k] / 8;
            let mut v = u64::from_le_bytes(streams[k][at..at + 8].try_into().expect("8 bytes"))
                >> (pos[k] % 8);
            // 57 bits are loaded; four lookups take at most 44.
            for _ in 0..4 {
                let entry = triples[(v & mask) as usize];
                // Four bytes always: those past the symbols decoded are written over next.
                outs[k][done[k]..done[k] + 4].copy_from_slice(&entry.to_le_bytes());
                let len = (entry >> 24) & 0x1f;
                v >>= len;
                pos[k] += len as usize;
                done[k] += (entry >> 29) as usize;
            }
        }
    }
    for k in 0..4 {
        let stream = streams[k];
        let mut j = done[k];
        while j < outs[k].len() {
            let at = pos[k] / 8;
            let mut word = [0u8; 8];
            let have = stream.len().saturating_sub(at).min(8);
            word[..have]
                .copy_from_slice(&stream[at.min(stream.len())..at.min(stream.len()) + have]);
            let v = u64::from_le_bytes(word) >> (pos[k] % 8);
            let entry = table[(v & mask) as usize];
            outs[k][j] = entry as u8;
            pos[k] += usize::from(entry >> 8);
            j += 1;
            if pos[k] > stream.len() * 8 {
                break;
            }
        }
        if pos[k].div_ceil(8) != stream.len() || j != outs[k].len() {
            return Err(Error::corrupt(format!(
                "a Huffman plane's stream {k} holds {} bytes, its {} symbols take {} bits",
                stream.len(),
                outs[k].len(),
                pos[k]
            )));
        }
    }
    Ok(())
}

/// The decoding table for up to three symbols a lookup: entry `b` holds the symbol whose code
/// is the low bits of `b` and, while the next codes fit in the bits left, the symbols after it
/// (bytes 0 to 2, 5 bits of length in byte 3's low bits, and how many symbols above them).
fn triples(single: &[u16; TABLE_LEN]) -> Box<[u32; TABLE_LEN]> {
    let mut triples = Box::new([0u32; TABLE_LEN]);
    for (index, slot) in triples.iter_mut().enumerate() {
        let (mut symbols, mut used, mut count) = (0u32, 0u32, 0u32);
        while count < 3 {
            // The bits after the codes taken; those past the table's are zero, which a code
            // that fits in the rest does not look at (each code fills every entry it
            // prefixes).
            let entry = u32::from(single[index >> used]);
            let len = entry >> 8;
            if used + len > MAX_CODE_LEN {
                break;
            }
            symbols |= (entry & 0xff) << (8 * count);
            used += len;
            count += 1;
        }
        *slot = symbols | used << 24 | count << 29;
    }
    triples
}

/// The decoding table of a complete code: entry `b` is the symbol whose code is the low bits
/// of `b`, and that code's length in the high byte. It always spans [`MAX_CODE_LEN`] bits (a
/// shorter code fills every entry it prefixes), so a lookup by an 11-bit mask needs no bounds
/// check.
fn table(lengths: &[u8; 256], max_len: u32) -> Result<Box<[u16; TABLE_LEN]>> {
    let mut kraft = 0u64;
    for &l in lengths {
        if u32::from(l) > max_len {
            return Err(Error::corrupt(format!(
                "a Huffman plane has a {l}-bit code, over its longest of {max_len}"
            )));
        }
        if l > 0 {
            kraft += 1 << (max_len - u32::from(l));
        }
    }
    if kraft != 1 << max_len {
        // Incomplete: some bit patterns would decode to nothing.
        return Err(Error::corrupt(
            "a Huffman plane's code lengths are not a complete prefix code",
        ));
    }
    let codes = codes(lengths);
    let mut table = Box::new([0u16; TABLE_LEN]);
    for (symbol, &l) in lengths.iter().enumerate() {
        if l == 0 {
            continue;
        }
        let l = u32::from(l);
        let entry = symbol as u16 | (l as u16) << 8;
        let step = 1usize << l;
        let mut at = usize::from(codes[symbol]);
        while at < table.len() {
            table[at] = entry;
            at += step;
        }
    }
    Ok(table)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip(plane: &[u8]) -> usize {
        let counts = histogram(plane);
        let lengths = code_lengths(&counts);
        let mut out = Vec::new();
        encode(plane, &lengths, &mut out);
        assert!(out.len() as u64 <= section_len(&counts, &lengths));
        let mut back = vec![0u8; plane.len()];
        decode(&out, &mut back).unwrap();
        assert_eq!(back, plane);
        out.len()
    }

    #[test]
    fn skewed_planes_round_trip_and_shrink() {
        // Exponent-like: a few values common, the rest rare.
        let plane: Vec<u8> = (0..100_003u32)
            .map(|i| match i % 16 {
                0..=7 => 60,
                8..=11 => 61,
                12 | 13 => 59,
                14 => 62,
                _ => (i % 251) as u8,
            })
            .collect();
        let len = round_trip(&plane);
        assert!(len < plane.len() / 2, "{len}");
    }

    #[test]
    fn every_length_and_two_symbols_round_trip() {
        for n in 0..40 {
            let plane: Vec<u8> = (0..n).map(|i| (i % 2) as u8 * 200).collect();
            if n >= 2 {
                round_trip(&plane);
            }
        }
    }

    #[test]
    fn a_code_too_deep_for_huffman_is_limited_to_a_complete_code() {
        // Fibonacci counts make Huffman's tree a chain as deep as the symbols.
        let mut counts = [0u64; 256];
        let (mut a, mut b) = (1u64, 1u64);
        for slot in counts.iter_mut().take(40) {
            *slot = a;
            (a, b) = (b, a + b);
        }
        let lengths = code_lengths(&counts);
        assert!(lengths.iter().all(|&l| u32::from(l) <= MAX_CODE_LEN));
        let kraft: u64 = lengths
            .iter()
            .filter(|&&l| l > 0)
            .map(|&l| 1u64 << (MAX_CODE_LEN - u32::from(l)))
            .sum();
        assert_eq!(kraft, 1 << MAX_CODE_LEN);
    }

    #[test]
    fn an_incomplete_code_and_a_lying_stream_are_refused() {
        let plane: Vec<u8> = (0..4000u32).map(|i| (i % 3) as u8).collect();
        let lengths = code_lengths(&histogram(&plane));
        let mut good = Vec::new();
        encode(&plane, &lengths, &mut good);
        let mut back = vec![0u8; plane.len()];

        let mut incomplete = good.clone();
        incomplete[3] = 0; // symbols 0 and 1 lose their codes
        let err = decode(&incomplete, &mut back).unwrap_err();
        assert!(err.to_string().contains("complete prefix code"), "{err}");

        let mut short = good.clone();
        short.pop();
        let err = decode(&short, &mut back).unwrap_err();
        assert!(err.to_string().contains("stream 3"), "{err}");

        let mut long = good.clone();
        long.push(0);
        assert!(decode(&long, &mut back).is_err());

        let mut lying = good;
        // Symbols 0 to 2: two bytes of lengths, then stream 0's length.
        lying[5..9].copy_from_slice(&u32::MAX.to_le_bytes());
        let err = decode(&lying, &mut back).unwrap_err();
        assert!(err.to_string().contains("claims"), "{err}");
    }
}
