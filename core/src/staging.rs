//! Loads that land in a reused pool of host buffers, the shape a GPU upload takes: a runtime
//! allocates a few pinned (page-locked) staging buffers once, and every load streams through
//! them, each filled buffer handed over to be copied to the device and then given back.
//!
//! Fetched bytes that land in fresh memory pay for it: the kernel clears every new page before
//! the first write (measured on the project's machine, the fill rate of fresh memory is what a
//! load over 16 connections ran into). A pool's buffers are faulted in once, when it is made,
//! and reused for every load after.
//!
//! [`AllocationController`] is the seam: a pool holds controllers that lend writable host
//! memory ([`memory_mut`](AllocationController::memory_mut)), so a CUDA or wgpu runtime brings
//! buffers from its own pinned allocator (`cudaHostAlloc`, a mapped staging buffer) with
//! [`StagingPool::from_buffers`], and reports them as [`AllocationProperty::Pinned`] so the
//! consumer knows it may start an asynchronous copy from them.

use std::collections::VecDeque;
use std::ops::Range;
use std::sync::mpsc;
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};

use crate::bytes::aligned_heap;
use crate::{AccessPolicy, AllocationController, AllocationProperty, Error, ErrorKind, Reader};
use crate::{Result, TensorInfo};

/// Tensors closer than this in the container share a buffer: the bytes between them are read
/// too, which costs less than a request of their own.
const SHARE_GAP: u64 = 64 << 10;

/// A fixed set of equally sized, writable host buffers that loads fill and consumers give
/// back. As many reads run at once as the pool has buffers, so a pool of 16 buffers of 16 MiB
/// keeps 16 requests in flight from an object store, at 256 MiB of memory.
#[derive(Debug)]
pub struct StagingPool {
    buffer_len: usize,
    count: usize,
    property: AllocationProperty,
    free: Mutex<Vec<Box<dyn AllocationController>>>,
    returned: Condvar,
}

impl StagingPool {
    /// `count` buffers of `buffer_len` bytes on the heap, aligned to 4 KiB (a page) and
    /// written once now, so no load after pays for fresh pages.
    ///
    /// # Errors
    /// [`ErrorKind::InvalidInput`] for no buffers or an empty buffer length; an allocation
    /// failure.
    pub fn new(count: usize, buffer_len: usize) -> Result<Self> {
        let buffers = (0..count)
            .map(|_| {
                let mut buffer = aligned_heap(buffer_len, 4096)?;
                if let Some(memory) = buffer.memory_mut() {
                    // Faults every page in: calloc'd memory is mapped only when first written.
                    memory.fill(0);
                }
                Ok(buffer)
            })
            .collect::<Result<Vec<_>>>()?;
        Self::from_buffers(buffers)
    }

    /// A pool of buffers the caller's runtime allocated (pinned host memory, say). Every buffer
    /// must lend writable host memory and all must have the same length.
    ///
    /// # Errors
    /// [`ErrorKind::InvalidInput`] for no buffers, empty ones, buffers of different lengths or
    /// kinds, or one that lends no writable memory (device memory: stage through host memory).
    pub fn from_buffers(mut buffers: Vec<Box<dyn AllocationController>>) -> Result<Self> {
        let first = buffers
            .first_mut()
            .ok_or_else(|| Error::invalid("a staging pool needs at least one buffer"))?;
        let (buffer_len, property) = (first.len(), first.property());
        if buffer_len == 0 {
            return Err(Error::invalid("staging buffers must not be empty"));
        }
        for buffer in &mut buffers {
            if buffer.len() != buffer_len || buffer.property() != property {
                return Err(Error::invalid(format!(
                    "staging buffers must be alike: one is {} bytes of {:?} memory, another {} bytes of {:?}",
                    buffer_len,
                    property,
                    buffer.len(),
                    buffer.property()
                )));
            }
            if buffer.memory_mut().is_none() {
                return Err(Error::invalid(format!(
                    "a {property:?} staging buffer lends no writable host memory"
                )));
            }
        }
        Ok(Self {
            buffer_len,
            count: buffers.len(),
            property,
            free: Mutex::new(buffers),
            returned: Condvar::new(),
        })
    }

    /// The length of each buffer.
    pub fn buffer_len(&self) -> usize {
        self.buffer_len
    }

    /// How many buffers the pool has.
    pub fn count(&self) -> usize {
        self.count
    }

    /// What kind of memory the buffers are.
    pub fn property(&self) -> AllocationProperty {
        self.property
    }

    fn lock(&self) -> MutexGuard<'_, Vec<Box<dyn AllocationController>>> {
        // Pushing or popping a buffer cannot be left half-done.
        self.free.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A free buffer, waiting for one to be given back; `None` once `stop` says so.
    fn take(&self, stop: &Mutex<bool>) -> Option<Box<dyn AllocationController>> {
        let mut free = self.lock();
        loop {
            if *stop.lock().unwrap_or_else(PoisonError::into_inner) {
                return None;
            }
            if let Some(buffer) = free.pop() {
                return Some(buffer);
            }
            free = self
                .returned
                .wait(free)
                .unwrap_or_else(PoisonError::into_inner);
        }
    }

    fn give_back(&self, buffer: Box<dyn AllocationController>) {
        self.lock().push(buffer);
        self.returned.notify_all();
    }
}

/// Where a run of bytes in a [`Staged`] buffer belongs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StagedSegment {
    /// The tensor's position in the names given to [`Reader::stage`].
    pub tensor: usize,
    /// Where in the tensor these bytes start.
    pub tensor_offset: u64,
    /// Where in the buffer they lie.
    pub range: Range<usize>,
}

/// A filled staging buffer, lent to the consumer: it goes back to the pool when dropped.
#[derive(Debug)]
pub struct Staged<'pool> {
    pool: &'pool StagingPool,
    buffer: Option<Box<dyn AllocationController>>,
    len: usize,
    segments: Vec<StagedSegment>,
}

impl Staged<'_> {
    /// The bytes read into the buffer (its first part; the segments say whose they are).
    pub fn bytes(&self) -> &[u8] {
        self.buffer
            .as_ref()
            .and_then(|buffer| buffer.memory(AccessPolicy::ZeroCopy).ok())
            .and_then(|memory| memory.get(..self.len))
            .unwrap_or_default()
    }

    /// Where each run of [`bytes`](Self::bytes) belongs, in buffer order.
    pub fn segments(&self) -> &[StagedSegment] {
        &self.segments
    }

    /// The buffer itself (its property, for a runtime that copies pinned memory
    /// asynchronously).
    pub fn allocation(&self) -> Option<&dyn AllocationController> {
        self.buffer.as_deref()
    }
}

impl Drop for Staged<'_> {
    fn drop(&mut self) {
        if let Some(buffer) = self.buffer.take() {
            self.pool.give_back(buffer);
        }
    }
}

/// One read: a range of the container, into one buffer.
#[derive(Debug)]
struct Piece {
    range: Range<u64>,
    segments: Vec<StagedSegment>,
}

impl Reader {
    /// Streams the named tensors through the pool's buffers: as many reads run at once as
    /// the pool has buffers, each filling one whole buffer with a range of the container (a
    /// tensor that does not fit what is left of a buffer goes on in the next), and `consume`
    /// is called on this thread with each filled buffer as it arrives, in no set order. A
    /// buffer goes back to the pool when its [`Staged`] is dropped, so a consumer may keep one
    /// while an asynchronous copy from it runs, but must not keep them all: the reads wait for
    /// a free buffer.
    ///
    /// Every name is checked before anything is read. The bytes are not checked against a
    /// trailer; [`verify`](Self::verify) does that.
    ///
    /// # Errors
    /// [`ErrorKind::NotFound`] naming a missing tensor, before any read; the source's error
    /// for a read, naming the tensor; `consume`'s error, which stops the load.
    pub fn stage<'pool>(
        &self,
        names: &[&str],
        pool: &'pool StagingPool,
        mut consume: impl FnMut(Staged<'pool>) -> Result<()>,
    ) -> Result<()> {
        let infos = names
            .iter()
            .map(|name| self.tensor(name))
            .collect::<Result<Vec<_>>>()?;
        let pieces: Mutex<VecDeque<Piece>> = Mutex::new(plan(&infos, pool.buffer_len).into());
        let total = pieces.lock().map_or(0, |p| p.len());
        let stop = Mutex::new(false);
        let halt = || {
            *stop.lock().unwrap_or_else(PoisonError::into_inner) = true;
            pool.returned.notify_all();
        };
        std::thread::scope(|scope| {
            let (filled, arrived) = mpsc::channel::<Result<Staged<'pool>>>();
            for _ in 0..pool.count.min(total) {
                let filled = filled.clone();
                let (pieces, stop, source, infos) = (&pieces, &stop, self.source(), &infos);
                std::thread::Builder::new()
                    .name("weightbay-stage".into())
                    .spawn_scoped(scope, move || {
                        loop {
                            let Some(piece) = pieces
                                .lock()
                                .unwrap_or_else(PoisonError::into_inner)
                                .pop_front()
                            else {
                                return;
                            };
                            let Some(mut buffer) = pool.take(stop) else {
                                return;
                            };
                            let len = (piece.range.end - piece.range.start) as usize;
                            let read = match buffer.memory_mut().and_then(|m| m.get_mut(..len)) {
                                Some(target) => source.read_at(piece.range.start, target),
                                None => Err(Error::invalid("a staging buffer shrank")),
                            };
                            let staged = Staged {
                                pool,
                                buffer: Some(buffer),
                                len,
                                segments: piece.segments,
                            };
                            let sent = read.map(|()| staged).map_err(|e| {
                                let tensor = names.get(piece_tensor(&e, infos)).copied();
                                match tensor {
                                    Some(name) => e.with_tensor(name),
                                    None => e,
                                }
                            });
                            if filled.send(sent).is_err() {
                                return;
                            }
                        }
                    })
                    .map_err(|e| Error::io("starting a staging thread", e))?;
            }
            drop(filled);
            let mut outcome = Ok(());
            let mut received = 0;
            while received < total {
                let Ok(next) = arrived.recv() else {
                    outcome = Err(Error::new(
                        ErrorKind::Io,
                        "a staging thread ended before its reads",
                    ));
                    break;
                };
                received += 1;
                if let Err(e) = next.and_then(&mut consume) {
                    outcome = Err(e);
                    break;
                }
            }
            if outcome.is_err() {
                halt();
            }
            outcome
        })
    }
}

/// The tensor a failed read was for, by the offset the error names.
fn piece_tensor(error: &Error, infos: &[&TensorInfo]) -> usize {
    error
        .offset()
        .and_then(|at| infos.iter().position(|info| info.range().contains(&at)))
        .unwrap_or(usize::MAX)
}

/// The reads that bring `infos` into buffers of `buffer_len`: in container order, neighbours
/// closer than [`SHARE_GAP`] sharing a buffer and filling it, a tensor cut where a buffer
/// ends, so that every read but those before a gap is a whole buffer (a tensor that started
/// a buffer of its own left buffers part-empty: 174 reads of 16 MiB buffers for 2 GiB, where
/// 124 fill them).
fn plan(infos: &[&TensorInfo], buffer_len: usize) -> Vec<Piece> {
    let buffer_len = buffer_len as u64;
    let mut order: Vec<usize> = (0..infos.len()).collect();
    order.sort_by_key(|&i| infos[i].range().start);
    let mut pieces: Vec<Piece> = Vec::new();
    for i in order {
        let range = infos[i].range();
        let mut start = range.start;
        while start < range.end {
            // The start of the buffer this run of bytes goes on filling, if any.
            let shared = pieces
                .last()
                .filter(|last| {
                    start >= last.range.end
                        && start - last.range.end <= SHARE_GAP
                        && start - last.range.start < buffer_len
                })
                .map(|last| last.range.start);
            let end = range.end.min(shared.unwrap_or(start) + buffer_len);
            if shared.is_none() {
                pieces.push(Piece {
                    range: start..start,
                    segments: Vec::new(),
                });
            }
            if let Some(piece) = pieces.last_mut() {
                let at = (start - piece.range.start) as usize;
                piece.segments.push(StagedSegment {
                    tensor: i,
                    tensor_offset: start - range.start,
                    range: at..at + (end - start) as usize,
                });
                piece.range.end = end;
            }
            start = end;
        }
    }
    pieces
}
