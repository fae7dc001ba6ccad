//! Tensors read ahead of a writer that takes them one at a time, in pieces: while it writes
//! one piece, threads read the next ones in its order, within a byte budget. A source whose
//! reads are round trips (an object store) is so asked for many pieces at once, and a tensor
//! larger than the budget streams through it instead of being held whole.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};

use weightbay::{
    AccessPolicy, AllocationController, AllocationProperty, Bytes, Error, ErrorKind, Result, Tensor,
};

use crate::whole_when_asked::WholeWhenAsked;

/// Threads reading ahead: as many pieces as this are asked for at once.
const READERS: usize = 16;

/// A place in the order the writer takes bytes: a tensor, and an offset in its bytes.
type At = (usize, u64);

/// The tensors of a writer, read ahead of it: [`tensors`](Self::tensors) are what it writes,
/// each taking its bytes from here, and [`read`](Self::read) (on threads of the caller's) reads
/// them until [`finish`](Self::finish).
///
/// A tensor's provider is asked once, by a reader. Bytes it answers resident (already in
/// memory) are handed on whole; lazy ones (a range of a remote object, a tensor assembled from
/// slices) are read in pieces of `piece_len`, each into memory of its own, and the writer
/// streams them in order, each piece dropped once written.
pub(crate) struct TensorsAhead {
    sources: Vec<Tensor>,
    /// Bytes read, or being read, ahead of the piece the writer waits for, at most; that piece
    /// is always read, whatever its size.
    budget: u64,
    piece_len: u64,
    buffers: Arc<Buffers>,
    state: Mutex<State>,
    changed: Condvar,
}

#[derive(Default)]
struct State {
    /// Where the next piece to read starts.
    next: At,
    /// The lazy bytes of the tensor `next` is in, whose later pieces are read from them.
    current: Option<Bytes>,
    /// A reader is asking the provider of tensor `next.0` for its bytes: the rest wait.
    opening: bool,
    /// The piece the writer takes next.
    wanted: At,
    /// Bytes read, or being read, that the writer has not taken.
    held: u64,
    ready: BTreeMap<At, Piece>,
    finished: bool,
}

/// One piece read, waiting for the writer.
struct Piece {
    /// Bytes it counts against the budget.
    held: u64,
    /// Where the piece after it starts.
    after: At,
    bytes: Result<Bytes>,
    /// The tensor's lazy bytes, with its first piece of several: what a reread reads.
    source: Option<Bytes>,
}

/// What a reader claimed.
enum Claim {
    /// The first piece of a tensor, whose provider it asks.
    Open(At, u64),
    /// A later piece, read from the tensor's lazy bytes.
    Read(At, u64, Bytes),
}

impl TensorsAhead {
    /// Reads `sources` ahead, in their order, in pieces of at most `piece_len` bytes, holding
    /// at most `budget` bytes the writer has not taken yet (besides the piece it waits for).
    pub(crate) fn new(sources: Vec<Tensor>, budget: u64, piece_len: u64) -> Arc<Self> {
        let piece_len = piece_len.max(1);
        Arc::new(Self {
            sources,
            budget,
            piece_len,
            buffers: Arc::new(Buffers {
                len: usize::try_from(piece_len).unwrap_or(usize::MAX),
                spare: Mutex::default(),
            }),
            state: Mutex::default(),
            changed: Condvar::new(),
        })
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn wait<'a>(&self, state: MutexGuard<'a, State>) -> MutexGuard<'a, State> {
        self.changed
            .wait(state)
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// The tensors to write, in order: each takes the bytes read ahead for it, waiting for
    /// them if they are not in yet.
    pub(crate) fn tensors(self: &Arc<Self>) -> Vec<Tensor> {
        self.sources
            .iter()
            .enumerate()
            .map(|(index, source)| {
                let ahead = Arc::clone(self);
                Tensor::deferred(
                    source.name(),
                    source.dtype().clone(),
                    source.shape(),
                    source.byte_len(),
                    move || ahead.open(index),
                )
            })
            .collect()
    }

    /// The number of threads [`read`](Self::read) wants.
    pub(crate) fn readers(&self) -> usize {
        READERS.min(self.pieces()).max(1)
    }

    /// How many pieces the tensors are at most read in.
    fn pieces(&self) -> usize {
        self.sources
            .iter()
            .map(|tensor| tensor.byte_len().div_ceil(self.piece_len).max(1))
            .fold(0u64, u64::saturating_add)
            .try_into()
            .unwrap_or(usize::MAX)
    }

    /// The length of the piece at `at`.
    fn piece_len_at(&self, (tensor, offset): At) -> u64 {
        (self.sources[tensor].byte_len() - offset).min(self.piece_len)
    }

    /// Where the piece after the one at `at`, `len` long, starts.
    fn after(&self, (tensor, offset): At, len: u64) -> At {
        if offset + len >= self.sources[tensor].byte_len() {
            (tensor + 1, 0)
        } else {
            (tensor, offset + len)
        }
    }

    /// Reads pieces ahead until every one is read or [`finish`](Self::finish) is called: run
    /// on each of [`readers`](Self::readers) threads.
    pub(crate) fn read(&self) {
        while let Some(claim) = self.claim() {
            let (at, piece) = match claim {
                Claim::Open(at, len) => (at, self.open_first(at, len)),
                Claim::Read(at, len, bytes) => {
                    let read = read_piece(&self.buffers, &bytes, at.1, len);
                    let piece = Piece {
                        held: len,
                        after: self.after(at, len),
                        bytes: read,
                        source: None,
                    };
                    (at, piece)
                }
            };
            let mut state = self.state();
            if at < state.wanted {
                // The writer went past it (a reread skips ahead): nobody takes it.
                state.held -= piece.held;
            } else {
                state.ready.insert(at, piece);
            }
            drop(state);
            self.changed.notify_all();
        }
    }

    /// The next piece to read, once the budget has room for it; `None` once every piece is
    /// claimed or the writer finished.
    fn claim(&self) -> Option<Claim> {
        let mut state = self.state();
        loop {
            if state.finished || state.next.0 >= self.sources.len() {
                return None;
            }
            if !state.opening {
                let len = self.piece_len_at(state.next);
                if state.next == state.wanted || state.held + len <= self.budget {
                    break;
                }
            }
            state = self.wait(state);
        }
        let at = state.next;
        let len = self.piece_len_at(at);
        state.held += len;
        if at.1 == 0 {
            state.opening = true;
            return Some(Claim::Open(at, len));
        }
        // A later piece is claimable only once its tensor opened lazy, which set `current`.
        let bytes = state.current.clone()?;
        state.next = self.after(at, len);
        if state.next.0 != at.0 {
            state.current = None;
        }
        Some(Claim::Read(at, len, bytes))
    }

    /// Asks tensor `at.0`'s provider for its bytes and reads its first piece, `len` long (the
    /// rest of the tensor is then claimable).
    fn open_first(&self, at: At, len: u64) -> Piece {
        let tensor = at.0;
        let whole_len = self.sources[tensor].byte_len();
        let opened = self.sources[tensor].bytes();
        let resident = opened
            .as_ref()
            .is_ok_and(|bytes| bytes.read(AccessPolicy::ZeroCopy).is_ok());
        let mut state = self.state();
        state.opening = false;
        let bytes = match opened {
            Ok(bytes) if !resident && len < whole_len => {
                // Lazy and longer than a piece: its later pieces are for any reader now.
                state.current = Some(bytes.clone());
                state.next = self.after(at, len);
                drop(state);
                self.changed.notify_all();
                return Piece {
                    held: len,
                    after: self.after(at, len),
                    bytes: read_piece(&self.buffers, &bytes, 0, len),
                    source: Some(bytes),
                };
            }
            Ok(bytes) => Ok(bytes),
            Err(e) => Err(e),
        };
        // Handed on whole: resident already, a failure, or lazy and one piece long.
        state.next = (tensor + 1, 0);
        state.current = None;
        // What resident bytes hold, whatever was claimed for them.
        let held = if resident { whole_len } else { len };
        state.held = state.held - len + held;
        drop(state);
        self.changed.notify_all();
        let bytes = bytes.and_then(|bytes| {
            if !resident {
                // Read here, not when the writer reaches it.
                bytes.read(AccessPolicy::AllowCopy)?;
            }
            Ok(bytes)
        });
        Piece {
            held,
            after: (tensor + 1, 0),
            bytes,
            source: None,
        }
    }

    /// Stops the readers (at their next piece): the writer is done, or failed.
    pub(crate) fn finish(&self) {
        self.state().finished = true;
        self.changed.notify_all();
    }

    /// The bytes of tensor `tensor` for the writer: its first piece when that is all of it,
    /// otherwise bytes that stream its pieces as the writer reads them.
    fn open(self: &Arc<Self>, tensor: usize) -> Result<Bytes> {
        let first = self.take((tensor, 0))?;
        let bytes = first.bytes?;
        let len = self.sources[tensor].byte_len();
        let Some(source) = first.source else {
            return Ok(bytes);
        };
        let streamed = Streamed {
            ahead: Arc::clone(self),
            tensor,
            len: usize::try_from(len)
                .map_err(|_| Error::new(ErrorKind::OutOfRange, "does not fit in memory"))?,
            source,
            in_hand: Mutex::new((0, bytes)),
            whole: WholeWhenAsked::default(),
        };
        Ok(Bytes::from_controller(Box::new(streamed)))
    }

    /// The piece at `at`, waiting for its reader; pieces before it that nobody took are
    /// dropped.
    fn take(&self, at: At) -> Result<Piece> {
        let mut state = self.state();
        if state.wanted < at {
            let skipped: Vec<At> = state.ready.range(..at).map(|(&key, _)| key).collect();
            for key in skipped {
                if let Some(piece) = state.ready.remove(&key) {
                    state.held -= piece.held;
                }
            }
            state.wanted = at;
            self.changed.notify_all();
        }
        loop {
            if let Some(piece) = state.ready.remove(&at) {
                state.held -= piece.held;
                state.wanted = piece.after;
                self.changed.notify_all();
                return Ok(piece);
            }
            state = self.wait(state);
        }
    }
}

/// Buffers of one piece's length, handed back when a piece is dropped and reused for the
/// next: sixteen threads that each allocated their pieces afresh left glibc's arenas holding
/// several times the budget (a 2 GiB export peaked at 320 MiB against 64 MiB held).
struct Buffers {
    len: usize,
    spare: Mutex<Vec<Vec<u8>>>,
}

impl Buffers {
    /// A buffer of `self.len` bytes, a spare one where there is one.
    fn get(&self) -> Vec<u8> {
        let spare = self
            .spare
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .pop();
        spare.unwrap_or_else(|| vec![0; self.len])
    }

    /// Keeps `buffer` for the next piece, as many as read at once at most.
    fn put(&self, buffer: Vec<u8>) {
        let mut spare = self.spare.lock().unwrap_or_else(PoisonError::into_inner);
        if spare.len() < READERS {
            spare.push(buffer);
        }
    }
}

/// `len` bytes at `offset` of lazy `bytes`, into a buffer of `buffers` that goes back to them
/// when the piece is dropped.
fn read_piece(buffers: &Arc<Buffers>, bytes: &Bytes, offset: u64, len: u64) -> Result<Bytes> {
    let mut buffer = buffers.get();
    let len = len as usize;
    bytes.read_at(offset as usize, &mut buffer[..len])?;
    Ok(Bytes::from_controller(Box::new(PooledPiece {
        buffer,
        len,
        buffers: Arc::clone(buffers),
    })))
}

/// A piece's bytes in a buffer of [`Buffers`], the first `len` of it.
struct PooledPiece {
    buffer: Vec<u8>,
    len: usize,
    buffers: Arc<Buffers>,
}

impl Drop for PooledPiece {
    fn drop(&mut self) {
        self.buffers.put(std::mem::take(&mut self.buffer));
    }
}

impl AllocationController for PooledPiece {
    fn len(&self) -> usize {
        self.len
    }

    fn alignment(&self) -> usize {
        1
    }

    fn property(&self) -> AllocationProperty {
        AllocationProperty::Native
    }

    fn memory(&self, _policy: AccessPolicy) -> Result<&[u8]> {
        Ok(&self.buffer[..self.len])
    }
}

impl fmt::Debug for PooledPiece {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PooledPiece")
            .field("len", &self.len)
            .finish_non_exhaustive()
    }
}

/// A tensor of several pieces as the writer reads it: each piece taken from the readers when
/// its first byte is asked for, the one before it dropped then.
struct Streamed {
    ahead: Arc<TensorsAhead>,
    tensor: usize,
    len: usize,
    /// The tensor's lazy bytes, for a read behind the piece in hand.
    source: Bytes,
    /// The piece in hand and where it starts.
    in_hand: Mutex<(usize, Bytes)>,
    whole: WholeWhenAsked,
}

impl AllocationController for Streamed {
    fn len(&self) -> usize {
        self.len
    }

    fn alignment(&self) -> usize {
        1
    }

    fn property(&self) -> AllocationProperty {
        self.source.property()
    }

    fn memory(&self, policy: AccessPolicy) -> Result<&[u8]> {
        self.whole.memory(
            policy,
            self.len,
            || "a tensor streamed in pieces".to_owned(),
            |whole| self.source.read_at(0, whole),
        )
    }

    fn read_at(&self, offset: usize, buf: &mut [u8]) -> Result<()> {
        let mut in_hand = self.in_hand.lock().unwrap_or_else(PoisonError::into_inner);
        let mut done = 0;
        while done < buf.len() {
            let at = offset + done;
            let (start, piece) = &*in_hand;
            if at < *start {
                // Behind the pieces taken: read again from the tensor's own bytes.
                return self.source.read_at(at, &mut buf[done..]);
            }
            if let Some(available) = piece.len().checked_sub(at - start).filter(|&n| n > 0) {
                let step = available.min(buf.len() - done);
                piece.read_at(at - start, &mut buf[done..done + step])?;
                done += step;
                continue;
            }
            let piece_len = self.ahead.piece_len as usize;
            let next = at - at % piece_len;
            let taken = self.ahead.take((self.tensor, next as u64))?;
            *in_hand = (next, taken.bytes?);
        }
        Ok(())
    }
}

impl fmt::Debug for Streamed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Streamed")
            .field("tensor", &self.tensor)
            .field("len", &self.len)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU64, Ordering};

    use weightbay::{DType, MemorySource};

    use super::*;

    #[test]
    fn tensors_come_in_order_and_the_budget_bounds_what_is_held() {
        let held = Arc::new(AtomicU64::new(0));
        let most = Arc::new(AtomicU64::new(0));
        let sources: Vec<Tensor> = (0..20u8)
            .map(|i| {
                let (held, most) = (Arc::clone(&held), Arc::clone(&most));
                Tensor::deferred(format!("t{i}"), DType::U8, [100], 100, move || {
                    let now = held.fetch_add(100, Ordering::SeqCst) + 100;
                    most.fetch_max(now, Ordering::SeqCst);
                    Ok(Bytes::from(vec![i; 100]))
                })
            })
            .collect();
        let ahead = TensorsAhead::new(sources, 250, 1000);
        std::thread::scope(|scope| {
            for _ in 0..ahead.readers() {
                scope.spawn(|| ahead.read());
            }
            for (i, tensor) in ahead.tensors().iter().enumerate() {
                let bytes = tensor.bytes().unwrap().to_vec().unwrap();
                assert_eq!(bytes, vec![i as u8; 100]);
                held.fetch_sub(100, Ordering::SeqCst);
            }
            ahead.finish();
        });
        // The one taken and written, plus at most 250 bytes ahead of it.
        assert!(most.load(Ordering::SeqCst) <= 300, "{most:?}");
    }

    /// Lazy bytes whose reads take a while, counting what they read and how many at once.
    #[derive(Debug)]
    struct Slow {
        len: usize,
        counts: Arc<Counts>,
    }

    #[derive(Debug, Default)]
    struct Counts {
        read: AtomicU64,
        in_flight: AtomicU64,
        most_in_flight: AtomicU64,
        longest_read: AtomicU64,
    }

    impl AllocationController for Slow {
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
            assert_eq!(
                policy,
                AccessPolicy::ZeroCopy,
                "nothing materializes it whole"
            );
            Err(Error::new(ErrorKind::WouldCopy, "lazy"))
        }
        fn read_at(&self, offset: usize, buf: &mut [u8]) -> Result<()> {
            let counts = &self.counts;
            let now = counts.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
            counts.most_in_flight.fetch_max(now, Ordering::SeqCst);
            counts
                .longest_read
                .fetch_max(buf.len() as u64, Ordering::SeqCst);
            std::thread::sleep(std::time::Duration::from_millis(20));
            for (i, byte) in buf.iter_mut().enumerate() {
                *byte = pattern(offset + i);
            }
            counts.read.fetch_add(buf.len() as u64, Ordering::SeqCst);
            counts.in_flight.fetch_sub(1, Ordering::SeqCst);
            Ok(())
        }
    }

    fn pattern(at: usize) -> u8 {
        (at * 7 % 251) as u8
    }

    #[test]
    fn lazy_tensors_stream_in_pieces_many_at_once_within_the_budget() {
        let counts = Arc::new(Counts::default());
        let sources: Vec<Tensor> = (0..3)
            .map(|i| {
                let counts = Arc::clone(&counts);
                Tensor::deferred(format!("t{i}"), DType::U8, [1000], 1000, move || {
                    Ok(Bytes::from_controller(Box::new(Slow {
                        len: 1000,
                        counts: Arc::clone(&counts),
                    })))
                })
            })
            .collect();
        let (budget, piece, window) = (256u64, 64u64, 100usize);
        let ahead = TensorsAhead::new(sources, budget, piece);
        let mut most_ahead = 0;
        std::thread::scope(|scope| {
            for _ in 0..ahead.readers() {
                scope.spawn(|| ahead.read());
            }
            let mut consumed = 0u64;
            for tensor in ahead.tensors() {
                let bytes = tensor.bytes().unwrap();
                // As the writer reads lazy bytes: in windows, in order.
                let mut out = vec![0; 1000];
                for (i, chunk) in out.chunks_mut(window).enumerate() {
                    bytes.read_at(i * window, chunk).unwrap();
                    consumed += chunk.len() as u64;
                    most_ahead = most_ahead.max(counts.read.load(Ordering::SeqCst) - consumed);
                }
                assert_eq!(out, (0..1000).map(pattern).collect::<Vec<_>>());
            }
            ahead.finish();
        });
        assert!(
            most_ahead <= budget + piece,
            "{most_ahead} bytes read ahead"
        );
        assert_eq!(counts.longest_read.load(Ordering::SeqCst), piece);
        assert!(
            counts.most_in_flight.load(Ordering::SeqCst) >= 2,
            "pieces read one at a time"
        );
    }

    #[test]
    fn a_streamed_tensor_reads_behind_its_pieces_and_whole() {
        let data: Vec<u8> = (0..1000).map(pattern).collect();
        let source = MemorySource::new(data.clone().into());
        let lazy = weightbay::backend_kit::lazy_bytes(
            Arc::new(source),
            0..1000,
            AllocationProperty::Remote,
        )
        .unwrap();
        let sources = vec![Tensor::deferred("t", DType::U8, [1000], 1000, move || {
            Ok(lazy.clone())
        })];
        let ahead = TensorsAhead::new(sources, 128, 64);
        std::thread::scope(|scope| {
            scope.spawn(|| ahead.read());
            let bytes = ahead.tensors()[0].bytes().unwrap();
            let mut buf = vec![0; 100];
            bytes.read_at(700, &mut buf).unwrap();
            assert_eq!(buf, data[700..800]);
            bytes.read_at(10, &mut buf).unwrap();
            assert_eq!(buf, data[10..110]);
            assert_eq!(bytes.read(AccessPolicy::AllowCopy).unwrap(), data);
            ahead.finish();
        });
    }

    #[test]
    fn a_tensor_over_the_budget_is_still_read_and_finish_stops_the_readers() {
        let sources = vec![
            Tensor::new("big", DType::U8, [1000], vec![1; 1000]),
            Tensor::new("next", DType::U8, [10], vec![2; 10]),
        ];
        let ahead = TensorsAhead::new(sources, 10, 64);
        std::thread::scope(|scope| {
            let reader = scope.spawn(|| ahead.read());
            let tensors = ahead.tensors();
            assert_eq!(tensors[0].bytes().unwrap().to_vec().unwrap(), vec![1; 1000]);
            ahead.finish();
            reader.join().unwrap();
        });
    }
}
