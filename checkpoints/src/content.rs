//! Content identity: how a container is cut into pieces (the header, each tensor in chunks,
//! the trailer) and the XXH3-128 hash each piece is known by, taken from the tensors' own
//! memory on every core before a byte is sent.

use std::ops::Range;

use xxhash_rust::xxh3::Xxh3;

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
    /// bytes it holds; the rest of the piece, to `range.end`, is zero padding.
    pub tensor: Option<(usize, Range<u64>)>,
}

/// The pieces of a container of `len` bytes whose tensors lie at `tensors` (in writer order,
/// ascending, as [`Writer::tensor_ranges`](weightbay::Writer::tensor_ranges) gives them): the
/// header up to the first tensor, each tensor in chunks of at most `chunk_len` bytes (its last
/// chunk running on over the padding to the next tensor), and whatever follows the last
/// tensor. The pieces tile `0..len`; none is empty.
pub(crate) fn cut(len: u64, tensors: &[Range<u64>], chunk_len: u64) -> Vec<Cut> {
    let chunk_len = chunk_len.max(1);
    let mut pieces = Vec::new();
    let first = tensors.first().map_or(len, |t| t.start);
    if first > 0 {
        pieces.push(Cut {
            range: 0..first,
            tensor: None,
        });
    }
    for (index, range) in tensors.iter().enumerate() {
        let next = tensors.get(index + 1).map_or(range.end, |t| t.start);
        let mut at = range.start;
        while at < next {
            let end = if range.end - at.min(range.end) > chunk_len {
                at + chunk_len
            } else {
                next
            };
            let own = at.min(range.end) - range.start..end.min(range.end) - range.start;
            pieces.push(Cut {
                range: at..end,
                tensor: Some((index, own)),
            });
            at = end;
        }
    }
    let last = tensors.last().map_or(len, |t| t.end);
    if last < len {
        pieces.push(Cut {
            range: last..len,
            tensor: None,
        });
    }
    pieces
}

/// A piece's content identity, as the record spells it: 32 hex digits.
pub(crate) fn hex(hash: u128) -> String {
    format!("{hash:032x}")
}

/// The hash of `data` followed by `padding` zero bytes: a chunk of a tensor, as the container
/// holds it.
pub(crate) fn hash_padded(data: &[u8], padding: u64) -> u128 {
    const ZEROS: [u8; 4096] = [0; 4096];
    let mut hasher = Xxh3::new();
    hasher.update(data);
    let mut left = padding;
    while left > 0 {
        let step = left.min(ZEROS.len() as u64);
        hasher.update(&ZEROS[..step as usize]);
        left -= step;
    }
    hasher.digest128()
}

/// The hash of every `(data, padding)` job, in order, spread over every core: a tensor's bytes
/// are read where they lie, never copied.
pub(crate) fn hash_all(jobs: &[(&[u8], u64)]) -> Vec<u128> {
    let total: usize = jobs.iter().map(|(data, _)| data.len()).sum();
    let threads = std::thread::available_parallelism()
        .map_or(1, usize::from)
        .min(jobs.len())
        .min(total / (1 << 20) + 1)
        .max(1);
    if threads == 1 {
        return jobs.iter().map(|&(d, p)| hash_padded(d, p)).collect();
    }
    let mut hashes = vec![0u128; jobs.len()];
    // Each thread takes every `threads`-th job, so the large and small ones spread evenly.
    std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|first| {
                scope.spawn(move || {
                    (first..jobs.len())
                        .step_by(threads)
                        .map(|i| (i, hash_padded(jobs[i].0, jobs[i].1)))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        for worker in workers {
            // Hashing cannot panic; a thread that did would lose only its hashes, which stay 0
            // and so match nothing: those pieces are written.
            for (i, hash) in worker.join().unwrap_or_default() {
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
            [0..100, 100..200, 200..300, 300..356, 356..400, 400..420]
        );
        assert_eq!(pieces[3].tensor, Some((0, 200..250)));
        assert_eq!(pieces[4].tensor, Some((2, 0..44)));
        assert_eq!(pieces[5].tensor, None);
        assert_eq!(cut(10, &[], 4).len(), 1);
    }

    #[test]
    fn a_padded_hash_is_the_hash_of_the_bytes_with_their_zeros() {
        let data = [7u8; 5000];
        let mut padded = data.to_vec();
        padded.extend([0u8; 5000]);
        assert_eq!(
            hash_padded(&data, 5000),
            xxhash_rust::xxh3::xxh3_128(&padded)
        );
        let jobs: Vec<(&[u8], u64)> = vec![(&data, 0), (&padded, 3), (&[], 0)];
        let hashes = hash_all(&jobs);
        assert_eq!(hashes[0], hash_padded(&data, 0));
        assert_eq!(hashes[1], hash_padded(&padded, 3));
        assert_ne!(hashes[0], hashes[1]);
    }
}
