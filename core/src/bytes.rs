//! Where loaded bytes live: the [`AllocationController`] trait and the [`Bytes`] handle.
//!
//! A controller owns one region of bytes and knows what kind of memory it is (heap, a shared
//! buffer, an mmap window, a lazily read file or remote range, pinned or device memory that a
//! user brings). [`Bytes`] is a cheap, shareable handle to a sub-range of one controller:
//! cloning, [`view`](Bytes::view) and [`split`](Bytes::split) never copy, and the first
//! mutation through [`make_mut`](Bytes::make_mut) copies only when the region is shared or
//! read-only (copy on write).

use std::alloc::{self, Layout};
use std::any::Any;
use std::fmt;
use std::ptr::NonNull;
use std::sync::Arc;

use crate::{Error, ErrorKind, Result};

/// A reference-counted, immutable buffer: the `bytes` crate's `Bytes`, re-exported so that
/// every signature that takes or returns one names it the same way and users need not depend
/// on `bytes` themselves. [`Bytes`] (this module's) is what a load returns: bytes behind an
/// [`AllocationController`] that says where they live.
pub use ::bytes::Bytes as SharedBytes;

/// What kind of memory a controller hands out. Runtimes use it to pick a staging strategy
/// (a GPU upload copies `File` or `Remote` bytes through pinned memory, but not `Pinned`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum AllocationProperty {
    /// Ordinary heap memory owned by this process.
    Native,
    /// Host memory shared with other owners (a `bytes::Bytes`, static data).
    Shared,
    /// A file region read lazily through an open handle.
    File,
    /// A window of a memory map: host addressable, paged in by the kernel.
    Mmap,
    /// An object-store range fetched over the network on first access.
    Remote,
    /// Page-locked host memory a user brought (DMA-ready).
    Pinned,
    /// Memory on an accelerator, read back on access.
    Device,
    /// Anything else a user-provided controller manages.
    Other,
}

/// Whether an access may copy (or fetch) bytes to make them host-readable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum AccessPolicy {
    /// Copy, read or fetch as needed (the default).
    #[default]
    AllowCopy,
    /// Only hand out memory that is already host resident; otherwise fail with
    /// [`ErrorKind::WouldCopy`].
    ZeroCopy,
}

/// Owns one region of bytes. Implement it to make your own memory (pinned buffers, device
/// memory, a custom cache) loadable and writable by weightbay.
///
/// # Contract
/// - [`len`](Self::len) is the region's size and never materializes anything.
/// - [`memory`](Self::memory) returns the whole region as host memory. Under
///   [`AccessPolicy::ZeroCopy`] it fails with [`ErrorKind::WouldCopy`] rather than copy or
///   fetch. I/O failures are returned as errors, never panics. Once it has returned `Ok`, later
///   calls return the same bytes.
/// - [`read_at`](Self::read_at) copies a sub-range into `buf`; lazy controllers override it to
///   read just that range.
/// - [`narrow`](Self::narrow) may return a controller for a sub-range when that is cheaper than
///   sharing this one (a lazy region that has not been fetched yet).
/// - Controllers are `Send + Sync`: `Bytes` shares them across threads. They are `Any`, so
///   whoever made one can have it back from its [`Bytes`] ([`Bytes::into_allocation`]).
pub trait AllocationController: Any + Send + Sync + fmt::Debug {
    /// Size of the region in bytes.
    fn len(&self) -> usize;

    /// Whether the region is empty.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Alignment in bytes guaranteed for the start of the region (a power of two).
    fn alignment(&self) -> usize;

    /// What kind of memory this is.
    fn property(&self) -> AllocationProperty;

    /// The whole region as host memory, materializing it if `policy` allows.
    ///
    /// # Errors
    /// [`ErrorKind::WouldCopy`] under `ZeroCopy` when not resident; the backing's error when
    /// materializing fails.
    fn memory(&self, policy: AccessPolicy) -> Result<&[u8]>;

    /// Copies `buf.len()` bytes starting at `offset` into `buf`. The caller guarantees the
    /// range lies within [`len`](Self::len).
    ///
    /// # Errors
    /// The backing's error when reading fails.
    fn read_at(&self, offset: usize, buf: &mut [u8]) -> Result<()> {
        let memory = self.memory(AccessPolicy::AllowCopy)?;
        let range = memory
            .get(offset..offset + buf.len())
            .ok_or_else(|| out_of_range(offset, buf.len(), memory.len()))?;
        buf.copy_from_slice(range);
        Ok(())
    }

    /// A controller over `[start, end)` of this one, when cheaper than sharing this one.
    fn narrow(&self, start: usize, end: usize) -> Option<Box<dyn AllocationController>> {
        let _ = (start, end);
        None
    }

    /// Mutable access when this controller exclusively owns writable host memory; `None`
    /// makes [`Bytes::make_mut`] copy instead.
    fn memory_mut(&mut self) -> Option<&mut [u8]> {
        None
    }

    /// An owning handle to `[start, end)` whose address stays fixed for as long as the handle
    /// lives, even after this controller is dropped (an mmap, a shared buffer); `None` when the
    /// memory cannot outlive its controller or is not resident.
    fn retain(&self, start: usize, end: usize) -> Option<SharedBytes> {
        let _ = (start, end);
        None
    }
}

/// A region of host memory kept alive and in place, independent of the source, reader and
/// payload that produced it (an mmap stays mapped while a region of it lives). Its address and
/// contents stay fixed for as long as any clone lives, so a runtime may hand
/// [`as_ptr`](Self::as_ptr) to a device (a DMA source) for that long.
#[derive(Clone)]
pub struct RetainedHostMemoryRegion {
    owner: SharedBytes,
}

impl RetainedHostMemoryRegion {
    /// The retained bytes.
    pub fn as_slice(&self) -> &[u8] {
        &self.owner
    }

    /// Their address.
    pub fn as_ptr(&self) -> *const u8 {
        self.owner.as_ptr()
    }

    /// Their length.
    pub fn len(&self) -> usize {
        self.owner.len()
    }

    /// Whether the region is empty.
    pub fn is_empty(&self) -> bool {
        self.owner.is_empty()
    }

    /// A bounds-checked sub-region, sharing the same memory.
    ///
    /// # Errors
    /// [`ErrorKind::OutOfRange`] when `start > end` or `end > len`.
    pub fn region(&self, start: usize, end: usize) -> Result<Self> {
        if start > end || end > self.owner.len() {
            return Err(out_of_range(
                start,
                end.saturating_sub(start),
                self.owner.len(),
            ));
        }
        Ok(Self {
            owner: self.owner.slice(start..end),
        })
    }
}

impl fmt::Debug for RetainedHostMemoryRegion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "RetainedHostMemoryRegion({:p}, {} bytes)",
            self.owner.as_ptr(),
            self.owner.len()
        )
    }
}

fn out_of_range(offset: usize, len: usize, available: usize) -> Error {
    Error::new(
        ErrorKind::OutOfRange,
        format!(
            "range {offset}..{} exceeds {available} bytes",
            offset.saturating_add(len)
        ),
    )
}

/// The largest power of two dividing `address`, capped at 4096 (a page).
fn alignment_of(address: usize) -> usize {
    const PAGE: usize = 4096;
    if address == 0 {
        PAGE
    } else {
        (1usize << address.trailing_zeros()).min(PAGE)
    }
}

/// Heap memory with a chosen alignment.
///
/// The allocation is made at the system allocator's natural alignment and over-sized by
/// `align`, and the region starts at the first aligned address inside it. Rust's allocator
/// zeroes an allocation aligned beyond 16 bytes with an explicit memset, on the calling thread,
/// before anything is read into it (0.4 to 0.9 s for the 2 GiB of a cold load on the project's
/// machine, a third of the load); at natural alignment it is `calloc`, whose large blocks are
/// fresh zero pages faulted in later by whichever thread fills them.
struct AlignedHeap {
    /// The allocation, which `start` points into.
    base: NonNull<u8>,
    allocation: Layout,
    start: NonNull<u8>,
    len: usize,
    align: usize,
}

// SAFETY: `AlignedHeap` exclusively owns its allocation, like a `Box<[u8]>`.
unsafe impl Send for AlignedHeap {}
// SAFETY: shared access only reads the bytes.
unsafe impl Sync for AlignedHeap {}

/// The alignment every allocator gives (and `calloc` is used for): the platform's `max_align_t`
/// on 64-bit targets.
const NATURAL_ALIGN: usize = 16;

impl AlignedHeap {
    fn zeroed(len: usize, align: usize) -> Result<Self> {
        if !align.is_power_of_two() {
            return Err(Error::invalid(format!(
                "alignment {align} is not a power of two"
            )));
        }
        let too_large = || Error::new(ErrorKind::Io, format!("could not allocate {len} bytes"));
        if len == 0 {
            // A dangling but aligned pointer: zero-sized regions allocate nothing.
            let dangling = NonNull::new(std::ptr::without_provenance_mut(align))
                .ok_or_else(|| Error::invalid("alignment must not be zero"))?;
            return Ok(Self {
                base: dangling,
                allocation: Layout::new::<()>(),
                start: dangling,
                len,
                align,
            });
        }
        let slack = align.saturating_sub(NATURAL_ALIGN);
        let allocation = len
            .checked_add(slack)
            .and_then(|size| Layout::from_size_align(size, align.min(NATURAL_ALIGN)).ok())
            .ok_or_else(too_large)?;
        // SAFETY: the layout has a non-zero size.
        let base =
            NonNull::new(unsafe { alloc::alloc_zeroed(allocation) }).ok_or_else(too_large)?;
        // The base is aligned to `allocation.align()`, so the first address aligned to `align`
        // is at most `slack` bytes on.
        let offset = base.as_ptr().align_offset(align);
        if offset > slack {
            return Err(Error::new(
                ErrorKind::Io,
                format!("the allocator returned memory not aligned to {NATURAL_ALIGN}"),
            ));
        }
        // SAFETY: `offset <= slack`, so `start..start + len` stays inside the allocation.
        let start = unsafe { base.add(offset) };
        Ok(Self {
            base,
            allocation,
            start,
            len,
            align,
        })
    }

    fn as_slice(&self) -> &[u8] {
        // SAFETY: `start..start + len` lies inside the zeroed allocation (see `zeroed`), or
        // `start` is dangling and aligned for a zero-length slice.
        unsafe { std::slice::from_raw_parts(self.start.as_ptr(), self.len) }
    }

    fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as in `as_slice`, and `&mut self` guarantees exclusive access.
        unsafe { std::slice::from_raw_parts_mut(self.start.as_ptr(), self.len) }
    }
}

impl Drop for AlignedHeap {
    fn drop(&mut self) {
        if self.len != 0 {
            // SAFETY: allocated in `zeroed` with this exact layout.
            unsafe { alloc::dealloc(self.base.as_ptr(), self.allocation) };
        }
    }
}

impl fmt::Debug for AlignedHeap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "AlignedHeap({} bytes, align {})", self.len, self.align)
    }
}

impl AllocationController for AlignedHeap {
    fn len(&self) -> usize {
        self.len
    }
    fn alignment(&self) -> usize {
        self.align
    }
    fn property(&self) -> AllocationProperty {
        AllocationProperty::Native
    }
    fn memory(&self, _policy: AccessPolicy) -> Result<&[u8]> {
        Ok(self.as_slice())
    }
    fn memory_mut(&mut self) -> Option<&mut [u8]> {
        Some(self.as_mut_slice())
    }
}

/// `len` zeroed heap bytes aligned to `align`, as a controller that lends them writable.
///
/// # Errors
/// [`ErrorKind::InvalidInput`] for an alignment that is not a power of two; an allocation
/// failure.
pub(crate) fn aligned_heap(len: usize, align: usize) -> Result<Box<dyn AllocationController>> {
    Ok(Box::new(AlignedHeap::zeroed(len, align)?))
}

/// A `Vec<u8>` adopted without a copy.
#[derive(Debug)]
struct HeapVec(Vec<u8>);

impl AllocationController for HeapVec {
    fn len(&self) -> usize {
        self.0.len()
    }
    fn alignment(&self) -> usize {
        alignment_of(self.0.as_ptr().addr())
    }
    fn property(&self) -> AllocationProperty {
        AllocationProperty::Native
    }
    fn memory(&self, _policy: AccessPolicy) -> Result<&[u8]> {
        Ok(&self.0)
    }
    fn memory_mut(&mut self) -> Option<&mut [u8]> {
        Some(&mut self.0)
    }
}

/// A `bytes::Bytes` (static data, a shared buffer, an owner such as an mmap).
#[derive(Debug)]
struct SharedController {
    bytes: SharedBytes,
    property: AllocationProperty,
}

impl AllocationController for SharedController {
    fn len(&self) -> usize {
        self.bytes.len()
    }
    fn alignment(&self) -> usize {
        alignment_of(self.bytes.as_ptr().addr())
    }
    fn property(&self) -> AllocationProperty {
        self.property
    }
    fn memory(&self, _policy: AccessPolicy) -> Result<&[u8]> {
        Ok(&self.bytes)
    }
    fn narrow(&self, start: usize, end: usize) -> Option<Box<dyn AllocationController>> {
        Some(Box::new(Self {
            bytes: self.bytes.slice(start..end),
            property: self.property,
        }))
    }

    fn retain(&self, start: usize, end: usize) -> Option<SharedBytes> {
        Some(self.bytes.slice(start..end))
    }
}

/// A shareable handle to a range of one [`AllocationController`].
///
/// Clones, views and splits share the controller (zero-copy); [`make_mut`](Self::make_mut)
/// copies on write when the memory is shared or not writable. Reads are fallible: a lazily
/// backed handle reports I/O errors instead of panicking.
///
/// ```
/// use weightbay::{AccessPolicy, Bytes};
/// let bytes = Bytes::from(vec![1u8, 2, 3, 4]);
/// let tail = bytes.view(2, 4)?;
/// assert_eq!(tail.read(AccessPolicy::ZeroCopy)?, &[3, 4]);
/// # Ok::<(), weightbay::Error>(())
/// ```
#[derive(Clone)]
pub struct Bytes {
    controller: Arc<dyn AllocationController>,
    start: usize,
    len: usize,
}

impl Bytes {
    /// Wraps a controller; the handle covers its whole region.
    pub fn from_controller(controller: Box<dyn AllocationController>) -> Self {
        let len = controller.len();
        Self {
            controller: Arc::from(controller),
            start: 0,
            len,
        }
    }

    /// `len` zero bytes on the heap, starting at a multiple of `align` (a power of two).
    ///
    /// # Errors
    /// [`ErrorKind::InvalidInput`] for a bad alignment, [`ErrorKind::Io`] when the allocation
    /// fails.
    pub fn zeroed(len: usize, align: usize) -> Result<Self> {
        Ok(Self::from_controller(Box::new(AlignedHeap::zeroed(
            len, align,
        )?)))
    }

    /// A copy of `data` in heap memory aligned to `align`.
    ///
    /// # Errors
    /// As [`zeroed`](Self::zeroed).
    pub fn copy_from_slice(data: &[u8], align: usize) -> Result<Self> {
        let mut heap = AlignedHeap::zeroed(data.len(), align)?;
        heap.as_mut_slice().copy_from_slice(data);
        Ok(Self::from_controller(Box::new(heap)))
    }

    /// Shares a `bytes::Bytes` (zero-copy), reporting `property` (for example
    /// [`AllocationProperty::Mmap`] for a map wrapped with `bytes::Bytes::from_owner`).
    pub fn from_shared(bytes: SharedBytes, property: AllocationProperty) -> Self {
        Self::from_controller(Box::new(SharedController { bytes, property }))
    }

    /// Number of bytes; never materializes anything.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the handle covers no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// What kind of memory backs these bytes.
    pub fn property(&self) -> AllocationProperty {
        self.controller.property()
    }

    /// Alignment guaranteed for the first byte (a power of two).
    pub fn alignment(&self) -> usize {
        let base = self.controller.alignment();
        if self.start == 0 {
            base
        } else {
            base.min(alignment_of(self.start))
        }
    }

    /// The bytes as host memory.
    ///
    /// # Errors
    /// [`ErrorKind::WouldCopy`] under [`AccessPolicy::ZeroCopy`] for bytes that are not
    /// resident; the backing's error when materializing fails.
    pub fn read(&self, policy: AccessPolicy) -> Result<&[u8]> {
        let memory = self.controller.memory(policy)?;
        memory
            .get(self.start..self.start + self.len)
            .ok_or_else(|| out_of_range(self.start, self.len, memory.len()))
    }

    /// Copies `buf.len()` bytes starting at `offset` into `buf` without materializing the
    /// rest of a lazy backing.
    ///
    /// # Errors
    /// [`ErrorKind::OutOfRange`] when the range exceeds [`len`](Self::len); the backing's error
    /// when reading fails.
    pub fn read_at(&self, offset: usize, buf: &mut [u8]) -> Result<()> {
        if offset
            .checked_add(buf.len())
            .is_none_or(|end| end > self.len)
        {
            return Err(out_of_range(offset, buf.len(), self.len));
        }
        self.controller.read_at(self.start + offset, buf)
    }

    /// All bytes copied into a `Vec`.
    ///
    /// # Errors
    /// The backing's error when reading fails.
    pub fn to_vec(&self) -> Result<Vec<u8>> {
        let mut out = vec![0; self.len];
        self.read_at(0, &mut out)?;
        Ok(out)
    }

    /// A zero-copy handle to `[start, end)` of these bytes.
    ///
    /// # Errors
    /// [`ErrorKind::OutOfRange`] when `start > end` or `end > len`.
    pub fn view(&self, start: usize, end: usize) -> Result<Self> {
        if start > end || end > self.len {
            return Err(Error::new(
                ErrorKind::OutOfRange,
                format!("view {start}..{end} of {} bytes", self.len),
            ));
        }
        let (absolute_start, absolute_end) = (self.start + start, self.start + end);
        match self.controller.narrow(absolute_start, absolute_end) {
            Some(narrow) => Ok(Self::from_controller(narrow)),
            None => Ok(Self {
                controller: Arc::clone(&self.controller),
                start: absolute_start,
                len: end - start,
            }),
        }
    }

    /// Splits into `[0, at)` and `[at, len)`, both zero-copy.
    ///
    /// # Errors
    /// [`ErrorKind::OutOfRange`] when `at > len`.
    pub fn split(&self, at: usize) -> Result<(Self, Self)> {
        Ok((self.view(0, at)?, self.view(at, self.len)?))
    }

    /// These bytes as a [`RetainedHostMemoryRegion`] that outlives every other handle, when
    /// the controller allows (mmap and shared memory do): the region's pointer equals the one
    /// [`read`](Self::read) returns.
    pub fn retain(&self) -> Option<RetainedHostMemoryRegion> {
        let owner = self.controller.retain(self.start, self.start + self.len)?;
        Some(RetainedHostMemoryRegion { owner })
    }

    /// The controller itself, when it is a `T`, this handle covers all of it and no other
    /// handle shares it: memory a consumer allocated for a tensor
    /// ([`TensorAllocator`](crate::TensorAllocator)) comes back as the consumer's own type, to
    /// become its tensor without a copy. Otherwise the handle, unchanged.
    ///
    /// # Errors
    /// `self`, when the controller is not a `T` or is shared.
    pub fn into_allocation<T: AllocationController>(self) -> std::result::Result<T, Self> {
        let whole = self.start == 0 && self.len == self.controller.len();
        let controller: &dyn Any = &*self.controller;
        if !whole || !controller.is::<T>() || Arc::strong_count(&self.controller) != 1 {
            return Err(self);
        }
        let any: Arc<dyn Any + Send + Sync> = self.controller;
        // A `T`, held by this handle alone (no weak handles are ever made): both succeed.
        match any.downcast::<T>().map(Arc::try_unwrap) {
            Ok(Ok(owned)) => Ok(owned),
            _ => unreachable!("checked to be the only handle to a `T`"),
        }
    }

    /// Mutable access, copying first (into 64-byte aligned heap memory) when the bytes are
    /// shared with another handle, only part of their controller, or not writable.
    ///
    /// # Errors
    /// The backing's error when copying a lazy backing fails.
    pub fn make_mut(&mut self) -> Result<&mut [u8]> {
        let whole = self.start == 0 && self.len == self.controller.len();
        let writable_in_place =
            whole && Arc::get_mut(&mut self.controller).is_some_and(|c| c.memory_mut().is_some());
        if !writable_in_place {
            let copy = Self::copy_from_slice(self.read(AccessPolicy::AllowCopy)?, 64)?;
            *self = copy;
        }
        Arc::get_mut(&mut self.controller)
            .and_then(|controller| controller.memory_mut())
            .ok_or_else(|| Error::new(ErrorKind::Unsupported, "bytes are not writable"))
    }
}

impl fmt::Debug for Bytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Bytes")
            .field("len", &self.len)
            .field("property", &self.property())
            .finish_non_exhaustive()
    }
}

impl From<Vec<u8>> for Bytes {
    fn from(data: Vec<u8>) -> Self {
        Self::from_controller(Box::new(HeapVec(data)))
    }
}

impl From<SharedBytes> for Bytes {
    fn from(data: SharedBytes) -> Self {
        Self::from_shared(data, AllocationProperty::Shared)
    }
}

impl From<&'static [u8]> for Bytes {
    fn from(data: &'static [u8]) -> Self {
        Self::from(bytes::Bytes::from_static(data))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zeroed_memory_has_the_requested_alignment() {
        // Small blocks come from the allocator's heap, 4 MiB ones from fresh pages.
        for len in [1, 1000, 4 << 20] {
            for align in [1, 16, 64, 256, 4096] {
                let mut bytes = Bytes::zeroed(len, align).unwrap();
                let memory = bytes.read(AccessPolicy::ZeroCopy).unwrap();
                assert_eq!(memory.as_ptr().addr() % align, 0);
                assert_eq!(memory.len(), len);
                assert!(bytes.alignment() >= align);
                assert!(memory.iter().all(|&b| b == 0));
                // Every byte is writable, the last included.
                bytes.make_mut().unwrap().fill(0xAB);
            }
        }
        assert_eq!(
            Bytes::zeroed(usize::MAX, 64).unwrap_err().kind(),
            ErrorKind::Io
        );
        assert_eq!(
            Bytes::zeroed(0, 256)
                .unwrap()
                .read(AccessPolicy::ZeroCopy)
                .unwrap(),
            &[] as &[u8]
        );
        assert_eq!(
            Bytes::zeroed(8, 3).unwrap_err().kind(),
            ErrorKind::InvalidInput
        );
    }

    #[test]
    fn views_and_splits_share_the_controller() {
        let bytes = Bytes::from((0u8..100).collect::<Vec<_>>());
        let view = bytes.view(10, 20).unwrap();
        let base = bytes.read(AccessPolicy::ZeroCopy).unwrap().as_ptr();
        assert_eq!(
            view.read(AccessPolicy::ZeroCopy).unwrap().as_ptr(),
            base.wrapping_add(10)
        );
        let (left, right) = view.split(4).unwrap();
        assert_eq!(left.to_vec().unwrap(), vec![10, 11, 12, 13]);
        assert_eq!(right.to_vec().unwrap(), (14..20).collect::<Vec<_>>());
        assert_eq!(bytes.view(5, 4).unwrap_err().kind(), ErrorKind::OutOfRange);
        assert_eq!(
            bytes.view(0, 101).unwrap_err().kind(),
            ErrorKind::OutOfRange
        );
        let mut buf = [0; 3];
        assert_eq!(
            view.read_at(8, &mut buf).unwrap_err().kind(),
            ErrorKind::OutOfRange
        );
    }

    #[test]
    fn into_allocation_gives_back_a_whole_unshared_controller_of_its_type() {
        let bytes = Bytes::zeroed(64, 64).unwrap();
        let shared = bytes.clone();
        let bytes = bytes.into_allocation::<AlignedHeap>().unwrap_err();
        drop(shared);
        let view = bytes.view(0, 32).unwrap();
        let bytes = bytes.into_allocation::<AlignedHeap>().unwrap_err();
        assert!(
            view.into_allocation::<AlignedHeap>().is_err(),
            "a part of it"
        );
        assert!(
            bytes.clone().into_allocation::<HeapVec>().is_err(),
            "another type"
        );
        let heap = bytes.into_allocation::<AlignedHeap>().unwrap();
        assert_eq!(heap.len(), 64);
    }

    #[test]
    fn make_mut_copies_only_when_shared() {
        let mut owned = Bytes::from(vec![1u8, 2, 3]);
        let before = owned.read(AccessPolicy::ZeroCopy).unwrap().as_ptr();
        owned.make_mut().unwrap()[0] = 9;
        assert_eq!(owned.read(AccessPolicy::ZeroCopy).unwrap().as_ptr(), before);

        let original = Bytes::from(vec![1u8, 2, 3]);
        let mut shared = original.clone();
        shared.make_mut().unwrap()[0] = 9;
        assert_eq!(original.to_vec().unwrap(), vec![1, 2, 3]);
        assert_eq!(shared.to_vec().unwrap(), vec![9, 2, 3]);

        let mut readonly = Bytes::from(&b"abc"[..]);
        readonly.make_mut().unwrap()[0] = b'x';
        assert_eq!(readonly.to_vec().unwrap(), b"xbc");
        assert_eq!(readonly.property(), AllocationProperty::Native);
    }

    #[test]
    fn shared_bytes_narrow_to_their_own_slice() {
        let shared = Bytes::from_shared(
            bytes::Bytes::from_static(b"hello world"),
            AllocationProperty::Mmap,
        );
        let view = shared.view(6, 11).unwrap();
        assert_eq!(view.read(AccessPolicy::ZeroCopy).unwrap(), b"world");
        assert_eq!(view.property(), AllocationProperty::Mmap);
    }
}
