//! Content identity: how a container is cut into pieces (the header, each tensor in chunks,
//! the trailer) and the XXH3-128 hash each piece is known by, taken from the tensors' own
//! memory on every core before a byte is sent.

use std::ops::Range;

pub(crate) use xxhash_rust::xxh3::xxh3_128;

/// The chunk length an incremental save cuts tensors into unless told otherwise: small
/// enough that a changed row of an embedding table rewrites 1 MiB, large enough that a 2 GiB
/// model is 2,048 pieces (a 300 KB record) and hashing runs at full speed (docs/BENCHMARKS.md,
/// "Incremental checkpoints").
pub const DEFAULT_CHUNK_LEN: u64 = 1 << 20;

/// One piece of a container, as [`cut`] plans it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Cut {
    /// Its bytes in the container.
    pub range: Range<u64>,
    /// The tensor (its index in writer order) it is a chunk of, and which of the tensor's own
    /// bytes it holds; `None` for the header, the padding between tensors and the trailer.
    pub tensor: Option<(usize, Range<u64>)>,
}

/// The pieces of a container of `len` bytes whose tensors lie at `tensors` (in writer order,
/// ascending, as [`Writer::tensor_ranges`](weightbay::Writer::tensor_ranges) gives them): the
/// header up to the first tensor, each tensor in chunks of at most `chunk_len` bytes counted
/// from its own first byte, the zero padding after it, and whatever follows the last tensor.
/// A tensor's CRC32C is then its chunks' combined. The pieces tile `0..len`; none is empty.
pub(crate) fn cut(len: u64, tensors: &[Range<u64>], chunk_len: u64) -> Vec<Cut> {
    let chunk_len = chunk_len.max(1);
    let mut pieces = Vec::new();
    let gap = |pieces: &mut Vec<Cut>, range: Range<u64>| {
        if range.start < range.end {
            pieces.push(Cut {
                range,
                tensor: None,
            });
        }
    };
    gap(&mut pieces, 0..tensors.first().map_or(len, |t| t.start));
    for (index, range) in tensors.iter().enumerate() {
        let mut at = range.start;
        while at < range.end {
            let end = range.end.min(at + chunk_len);
            pieces.push(Cut {
                range: at..end,
                tensor: Some((index, at - range.start..end - range.start)),
            });
            at = end;
        }
        let next = tensors.get(index + 1).map_or(len, |t| t.start);
        gap(&mut pieces, range.end..next);
    }
    pieces
}

/// A piece's content identity, as the record spells it: 32 hex digits.
pub(crate) fn hex(hash: u128) -> String {
    format!("{hash:032x}")
}

/// The hash of every piece of `pieces`, in order, spread over every core: a tensor's bytes are
/// read where they lie, never copied.
pub(crate) fn hash_all(pieces: &[&[u8]]) -> Vec<u128> {
    let total: usize = pieces.iter().map(|data| data.len()).sum();
    let threads = std::thread::available_parallelism()
        .map_or(1, usize::from)
        .min(pieces.len())
        .min(total / (1 << 20) + 1)
        .max(1);
    if threads == 1 {
        return pieces.iter().map(|data| xxh3_128(data)).collect();
    }
    // Each thread takes every `threads`-th piece, so the large and small ones spread evenly.
    let every = |first: usize| -> Vec<(usize, u128)> {
        (first..pieces.len())
            .step_by(threads)
            .map(|i| (i, xxh3_128(pieces[i])))
            .collect()
    };
    let mut hashes = vec![0u128; pieces.len()];
    std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|first| scope.spawn(move || every(first)))
            .collect();
        for (first, worker) in workers.into_iter().enumerate() {
            // Hashing cannot panic; should a thread have all the same, its share is done here.
            for (i, hash) in worker.join().unwrap_or_else(|_| every(first)) {
                hashes[i] = hash;
            }
        }
    });
    hashes
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_tile_the_container_and_cut_tensors_at_their_own_start() {
        // Header 0..100, tensor 0 at 100..350 (padded to 356), tensor 1 at 356..356 (empty),
        // tensor 2 at 356..400, trailer 400..420.
        let pieces = cut(420, &[100..350, 356..356, 356..400], 100);
        let ranges: Vec<_> = pieces.iter().map(|p| p.range.clone()).collect();
        assert_eq!(
            ranges,
            [
                0..100,
                100..200,
                200..300,
                300..350,
                350..356,
                356..400,
                400..420
            ]
        );
        assert_eq!(pieces[3].tensor, Some((0, 200..250)));
        assert_eq!(pieces[4].tensor, None);
        assert_eq!(pieces[5].tensor, Some((2, 0..44)));
        assert_eq!(pieces[6].tensor, None);
        assert_eq!(cut(10, &[], 4).len(), 1);
    }

    #[test]
    fn hashing_on_every_core_gives_each_piece_its_own_hash() {
        let big = vec![7u8; 3 << 20];
        let pieces: Vec<&[u8]> = vec![&big, &big[1..], &[], &big[..10]];
        let hashes = hash_all(&pieces);
        let one_by_one: Vec<u128> = pieces.iter().map(|p| xxh3_128(p)).collect();
        assert_eq!(hashes, one_by_one);
        assert_ne!(hashes[0], hashes[1]);
    }
}
