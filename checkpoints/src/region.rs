//! The geometry of [`Region`]s, the boxes of tensors that ranks hold, and the byte runs that
//! move one box's elements into another's.
//!
//! A rank that holds part of a tensor holds a [`Region`] of it: a start and a length along
//! every dimension of the tensor's global shape, its elements stored row-major as a tensor of
//! the region's lengths. Loading with another rank layout asks for another region; the
//! elements both share move in [`runs`], each contiguous on both sides, and the byte ranges
//! to fetch are those runs merged ([`coalesce`]).

use std::ops::Range;

use weightbay::{Error, Result};

use crate::record::Region;

impl Region {
    /// The box from `offsets`, `lengths` long along each dimension.
    pub fn new(offsets: impl Into<Vec<u64>>, lengths: impl Into<Vec<u64>>) -> Self {
        Self {
            offsets: offsets.into(),
            lengths: lengths.into(),
        }
    }

    /// All of a tensor of `shape`.
    pub fn whole(shape: &[u64]) -> Self {
        Self::new(vec![0; shape.len()], shape)
    }

    /// How many elements it holds (saturating: [`within`](Self::within) bounds it first).
    pub fn elements(&self) -> u64 {
        self.lengths
            .iter()
            .fold(1u64, |product, &len| product.saturating_mul(len))
    }

    /// The `k`-th part of `len` indices split into `parts` nearly equal parts along dimension
    /// `dim` of `shape`, the whole length along the others: how FSDP and tensor parallelism
    /// split a tensor (the first `len % parts` parts are one longer).
    ///
    /// ```
    /// use weightbay_checkpoints::Region;
    /// assert_eq!(Region::split(&[10, 4], 0, 3, 0), Region::new([0, 0], [4, 4]));
    /// assert_eq!(Region::split(&[10, 4], 0, 3, 2), Region::new([7, 0], [3, 4]));
    /// ```
    pub fn split(shape: &[u64], dim: usize, parts: u64, k: u64) -> Self {
        let mut region = Self::whole(shape);
        if let Some(len) = shape.get(dim).copied()
            && parts > 0
        {
            let (base, extra) = (len / parts, len % parts);
            region.offsets[dim] = k * base + k.min(extra);
            region.lengths[dim] = base + u64::from(k < extra);
        }
        region
    }

    /// Checks that it lies inside a tensor of `shape`, with as many dimensions.
    ///
    /// # Errors
    /// [`ErrorKind::InvalidInput`](weightbay::ErrorKind::InvalidInput) saying which dimension
    /// does not fit.
    pub fn within(&self, shape: &[u64]) -> Result<()> {
        if self.offsets.len() != shape.len() || self.lengths.len() != shape.len() {
            return Err(Error::invalid(format!(
                "a region of {} offsets and {} lengths for a tensor of {} dimensions",
                self.offsets.len(),
                self.lengths.len(),
                shape.len()
            )));
        }
        for (dim, ((&offset, &len), &size)) in self
            .offsets
            .iter()
            .zip(&self.lengths)
            .zip(shape)
            .enumerate()
        {
            if offset.checked_add(len).is_none_or(|end| end > size) {
                return Err(Error::invalid(format!(
                    "dimension {dim}: {offset}..{offset}+{len} is outside 0..{size}"
                )));
            }
        }
        Ok(())
    }

    /// The box both share, or `None` when they share no element.
    pub fn intersect(&self, other: &Self) -> Option<Self> {
        let mut offsets = Vec::with_capacity(self.offsets.len());
        let mut lengths = Vec::with_capacity(self.offsets.len());
        for dim in 0..self.offsets.len() {
            let start = self.offsets[dim].max(other.offsets[dim]);
            let end = (self.offsets[dim] + self.lengths[dim])
                .min(other.offsets[dim] + other.lengths[dim]);
            if end <= start {
                return None;
            }
            offsets.push(start);
            lengths.push(end - start);
        }
        Some(Self::new(offsets, lengths))
    }
}

/// `len` elements contiguous in both the source's and the destination's row-major storage:
/// at element `from` of the source, element `to` of the destination.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Run {
    pub(crate) from: u64,
    pub(crate) to: u64,
    pub(crate) len: u64,
}

/// The runs that copy `shared`, a box inside both `source` and `destination`, from the
/// source's storage to the destination's. Runs are as long as both layouts allow: the
/// trailing dimensions `shared` spans whole in both merge into one run.
pub(crate) fn runs(source: &Region, destination: &Region, shared: &Region) -> Vec<Run> {
    let dims = shared.lengths.len();
    if shared.lengths.contains(&0) {
        return Vec::new();
    }
    if dims == 0 {
        return vec![Run {
            from: 0,
            to: 0,
            len: 1,
        }];
    }
    // The outermost dimension the runs start in: every dimension after it is spanned whole in
    // both layouts.
    let mut first = dims - 1;
    while first > 0
        && shared.lengths[first] == source.lengths[first]
        && shared.lengths[first] == destination.lengths[first]
    {
        first -= 1;
    }
    let len = shared.lengths[first..].iter().product();
    let strides = |region: &Region| -> Vec<u64> {
        let mut strides = vec![1; dims];
        for dim in (0..dims - 1).rev() {
            strides[dim] = strides[dim + 1] * region.lengths[dim + 1];
        }
        strides
    };
    let (from_strides, to_strides) = (strides(source), strides(destination));
    let offset_in = |region: &Region, strides: &[u64], index: &[u64]| -> u64 {
        (0..dims)
            .map(|dim| (shared.offsets[dim] + index[dim] - region.offsets[dim]) * strides[dim])
            .sum()
    };
    // An odometer over the dimensions before `first`; `first` and after start at 0.
    let mut index = vec![0; dims];
    let mut runs = Vec::new();
    loop {
        runs.push(Run {
            from: offset_in(source, &from_strides, &index),
            to: offset_in(destination, &to_strides, &index),
            len,
        });
        let mut dim = first;
        loop {
            if dim == 0 {
                return runs;
            }
            dim -= 1;
            index[dim] += 1;
            if index[dim] < shared.lengths[dim] {
                break;
            }
            index[dim] = 0;
        }
    }
}

/// The boxes that hold elements `start..end` of a tensor of `shape` in row-major order, in
/// that order, each contiguous in the tensor's storage: a partial row at each end, whole rows
/// between them, so a byte range of a tensor is read as regions ([`boxes_of_range`] gives at
/// most two boxes per dimension and one more).
pub(crate) fn boxes_of_range(shape: &[u64], start: u64, end: u64) -> Vec<Region> {
    let mut boxes = Vec::new();
    boxes_within(shape, &mut Vec::new(), start, end, &mut boxes);
    boxes
}

/// [`boxes_of_range`] inside the row `prefix` of the outer dimensions, `shape` the rest.
fn boxes_within(shape: &[u64], prefix: &mut Vec<u64>, start: u64, end: u64, out: &mut Vec<Region>) {
    if start >= end {
        return;
    }
    let Some((_, inner_shape)) = shape.split_first() else {
        // A scalar (or the last index fixed): its one element.
        out.push(Region::new(prefix.clone(), vec![1; prefix.len()]));
        return;
    };
    // Non-zero: `start < end` fits in the tensor, so no dimension is 0.
    let inner: u64 = inner_shape.iter().product();
    let (first, last) = (start / inner, end / inner);
    let (start_in, end_in) = (start % inner, end % inner);
    let within = |prefix: &mut Vec<u64>, row: u64, from: u64, to: u64, out: &mut Vec<Region>| {
        prefix.push(row);
        boxes_within(inner_shape, prefix, from, to, out);
        prefix.pop();
    };
    if first == last {
        within(prefix, first, start_in, end_in, out);
        return;
    }
    let mut whole_from = first;
    if start_in != 0 {
        within(prefix, first, start_in, inner, out);
        whole_from += 1;
    }
    if last > whole_from {
        let mut offsets = prefix.clone();
        offsets.push(whole_from);
        offsets.extend(std::iter::repeat_n(0, inner_shape.len()));
        let mut lengths = vec![1; prefix.len()];
        lengths.push(last - whole_from);
        lengths.extend_from_slice(inner_shape);
        out.push(Region::new(offsets, lengths));
    }
    if end_in != 0 {
        within(prefix, last, 0, end_in, out);
    }
}

/// Sorted, disjoint `ranges` merged where they touch, then across the smallest gaps while the
/// bytes fetched beyond the ranges stay within `allowance`: each merge saves a request, and
/// the smallest gaps save one for the fewest extra bytes.
pub(crate) fn coalesce(ranges: &[Range<u64>], allowance: u64) -> Vec<Range<u64>> {
    let mut gaps: Vec<(u64, usize)> = ranges
        .windows(2)
        .enumerate()
        .map(|(i, pair)| (pair[1].start - pair[0].end, i))
        .collect();
    gaps.sort_unstable();
    let mut merge_after = vec![false; ranges.len()];
    let mut spent = 0u64;
    for (gap, i) in gaps {
        if gap > 0 && spent + gap > allowance {
            break;
        }
        spent += gap;
        merge_after[i] = true;
    }
    let mut merged: Vec<Range<u64>> = Vec::new();
    for (i, range) in ranges.iter().enumerate() {
        match merged.last_mut() {
            Some(last) if i > 0 && merge_after[i - 1] => last.end = range.end,
            _ => merged.push(range.clone()),
        }
    }
    merged
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// The row-major indices of `region`'s elements in a tensor of `shape`, in order.
    fn indices_of(shape: &[u64], region: &Region) -> Vec<u64> {
        let mut out = Vec::new();
        let mut index = vec![0u64; shape.len()];
        for _ in 0..region.elements() {
            out.push((0..shape.len()).fold(0, |acc, dim| {
                acc * shape[dim] + region.offsets[dim] + index[dim]
            }));
            for dim in (0..shape.len()).rev() {
                index[dim] += 1;
                if index[dim] < region.lengths[dim] {
                    break;
                }
                index[dim] = 0;
            }
        }
        out
    }

    proptest! {
        #[test]
        fn boxes_of_a_range_hold_exactly_its_elements_in_order(
            shape in proptest::collection::vec(1u64..5, 0..4),
            ends in (0u64..1000, 0u64..1000),
        ) {
            let total: u64 = shape.iter().product();
            let (a, b) = (ends.0 % (total + 1), ends.1 % (total + 1));
            let (start, end) = (a.min(b), a.max(b));
            let boxes = boxes_of_range(&shape, start, end);
            prop_assert!(boxes.len() <= 2 * shape.len() + 1, "{boxes:?}");
            let mut covered = Vec::new();
            for region in &boxes {
                region.within(&shape).unwrap();
                covered.extend(indices_of(&shape, region));
            }
            prop_assert_eq!(covered, (start..end).collect::<Vec<_>>());
        }
    }

    /// Copies `shared` element by element, the obvious way, as the reference.
    fn copy_by_element(source: &Region, destination: &Region, shared: &Region) -> Vec<(u64, u64)> {
        let dims = shared.lengths.len();
        let flat = |region: &Region, index: &[u64]| {
            (0..dims).fold(0, |acc, dim| {
                acc * region.lengths[dim] + shared.offsets[dim] + index[dim] - region.offsets[dim]
            })
        };
        let mut pairs = Vec::new();
        let mut index = vec![0; dims];
        if shared.elements() == 0 {
            return pairs;
        }
        'outer: loop {
            pairs.push((flat(source, &index), flat(destination, &index)));
            for dim in (0..dims).rev() {
                index[dim] += 1;
                if index[dim] < shared.lengths[dim] {
                    continue 'outer;
                }
                index[dim] = 0;
            }
            return pairs;
        }
    }

    fn region_in(shape: Vec<u64>) -> impl Strategy<Value = Region> {
        shape
            .into_iter()
            .map(|size| (0..size).prop_flat_map(move |start| (Just(start), 1..=size - start)))
            .collect::<Vec<_>>()
            .prop_map(|bounds| {
                let (offsets, lengths): (Vec<u64>, Vec<u64>) = bounds.into_iter().unzip();
                Region::new(offsets, lengths)
            })
    }

    proptest! {
        /// The runs move exactly the elements an element-by-element copy moves.
        #[test]
        fn runs_move_what_an_element_copy_moves(
            (source, destination) in prop::collection::vec(1u64..6, 0..4)
                .prop_flat_map(|shape| (region_in(shape.clone()), region_in(shape)))
        ) {
            let Some(shared) = source.intersect(&destination) else {
                return Ok(());
            };
            let mut by_runs: Vec<(u64, u64)> = runs(&source, &destination, &shared)
                .into_iter()
                .flat_map(|run| (0..run.len).map(move |i| (run.from + i, run.to + i)))
                .collect();
            by_runs.sort_unstable();
            let mut expected = copy_by_element(&source, &destination, &shared);
            expected.sort_unstable();
            prop_assert_eq!(by_runs, expected);
        }

        /// Coalescing covers every range, never overlaps, and fetches at most the allowance
        /// beyond them.
        #[test]
        fn coalescing_stays_within_its_allowance(
            lens in prop::collection::vec((0u64..100, 1u64..100), 0..40),
            allowance in 0u64..500,
        ) {
            let mut ranges = Vec::new();
            let mut at = 0;
            for (gap, len) in lens {
                ranges.push(at + gap..at + gap + len);
                at += gap + len;
            }
            let merged = coalesce(&ranges, allowance);
            let needed: u64 = ranges.iter().map(|r| r.end - r.start).sum();
            let fetched: u64 = merged.iter().map(|r| r.end - r.start).sum();
            prop_assert!(fetched <= needed + allowance);
            prop_assert!(merged.windows(2).all(|pair| pair[0].end < pair[1].start));
            prop_assert!(ranges.iter().all(|r| merged.iter().any(|m| m.start <= r.start && r.end <= m.end)));
        }
    }

    #[test]
    fn whole_rows_are_one_run_and_columns_one_per_row() {
        let rows = Region::new([2, 0], [2, 6]);
        let whole = Region::whole(&[8, 6]);
        assert_eq!(
            runs(&whole, &rows, &rows),
            [Run {
                from: 12,
                to: 0,
                len: 12
            }]
        );
        let columns = Region::new([0, 1], [8, 2]);
        assert_eq!(runs(&whole, &columns, &columns).len(), 8);
    }

    #[test]
    fn regions_outside_their_tensor_are_refused() {
        let error = Region::new([3], [6]).within(&[8]).unwrap_err();
        assert!(error.to_string().contains("dimension 0"), "{error}");
        assert!(Region::new([0], [1]).within(&[2, 2]).is_err());
    }
}
