//! A whole tensor of a multi-rank checkpoint as lazy [`Bytes`]: nothing is read until a range
//! of it is asked for, and then only the slices' bytes that hold that range, so a writer that
//! streams it in windows (an export) never holds the tensor whole.

use std::fmt;
use std::sync::Arc;

use weightbay::{AccessPolicy, AllocationController, AllocationProperty, Bytes, Result};

use crate::assembled::AssembledWeights;
use crate::region::boxes_of_range;
use crate::whole_when_asked::WholeWhenAsked;

/// Tensor `name` of `assembled` as bytes read when asked for. `len` must be its length as
/// [`AssembledWeights::checked_len`] gave it, `element_size` its dtype's.
pub(crate) fn assembled_bytes(
    assembled: Arc<AssembledWeights>,
    name: String,
    shape: Vec<u64>,
    element_size: usize,
    len: usize,
) -> Bytes {
    Bytes::from_controller(Box::new(AssembledTensor {
        assembled,
        name,
        shape,
        element_size,
        len,
        whole: WholeWhenAsked::default(),
    }))
}

struct AssembledTensor {
    assembled: Arc<AssembledWeights>,
    name: String,
    shape: Vec<u64>,
    element_size: usize,
    len: usize,
    whole: WholeWhenAsked,
}

impl AssembledTensor {
    /// Reads whole elements `first..first + buf.len() / element_size` into `buf`, each
    /// contiguous box of them in its own part of `buf`, every container holding one at once.
    fn read_elements(&self, first: u64, buf: &mut [u8]) -> Result<()> {
        let size = self.element_size as u64;
        let end = first + buf.len() as u64 / size;
        let boxes = boxes_of_range(&self.shape, first, end);
        let mut rest: &mut [u8] = buf;
        let mut wanted = Vec::with_capacity(boxes.len());
        for region in boxes {
            // The boxes hold `first..end` in order, so their lengths sum to `buf`'s.
            let (part, tail) =
                std::mem::take(&mut rest).split_at_mut((region.elements() * size) as usize);
            rest = tail;
            wanted.push((self.name.as_str(), region, part));
        }
        self.assembled.read_regions_into(&mut wanted)
    }
}

impl AllocationController for AssembledTensor {
    fn len(&self) -> usize {
        self.len
    }

    fn alignment(&self) -> usize {
        1
    }

    fn property(&self) -> AllocationProperty {
        AllocationProperty::Remote
    }

    fn memory(&self, policy: AccessPolicy) -> Result<&[u8]> {
        self.whole.memory(
            policy,
            self.len,
            || {
                format!(
                    "tensor `{}` is read from its slices when asked for",
                    self.name
                )
            },
            |whole| self.read_at(0, whole),
        )
    }

    fn read_at(&self, offset: usize, buf: &mut [u8]) -> Result<()> {
        if let Some(whole) = self.whole.get() {
            buf.copy_from_slice(&whole[offset..offset + buf.len()]);
            return Ok(());
        }
        let size = self.element_size;
        let (start, end) = (offset, offset + buf.len());
        if start % size == 0 && end % size == 0 {
            return self.read_elements((start / size) as u64, buf);
        }
        // Cut inside an element: the elements it touches, then the part asked for.
        let (first, last) = (start / size, end.div_ceil(size));
        let mut elements = vec![0; (last - first) * size];
        self.read_elements(first as u64, &mut elements)?;
        let skip = start - first * size;
        buf.copy_from_slice(&elements[skip..skip + buf.len()]);
        Ok(())
    }
}

impl fmt::Debug for AssembledTensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AssembledTensor")
            .field("name", &self.name)
            .field("len", &self.len)
            .finish_non_exhaustive()
    }
}
