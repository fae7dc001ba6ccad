//! Tensors read ahead of a writer that takes them one at a time: while it writes one, a few
//! threads read the next ones in its order, within a byte budget, so a source whose reads are
//! round trips (an object store) is asked for several at once instead of one after another.

use std::collections::BTreeMap;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};

use weightbay::{AccessPolicy, Bytes, Result, Tensor};

/// Threads reading ahead.
const READERS: usize = 4;

/// The tensors of a writer, read ahead of it: [`tensors`](Self::tensors) are what it writes,
/// each taking its bytes from here, and [`read`](Self::read) (on threads of the caller's) reads
/// them until [`finish`](Self::finish).
pub(crate) struct TensorsAhead {
    sources: Vec<Tensor>,
    /// Bytes read ahead of the one the writer waits for, at most; the one it waits for is
    /// always read, whatever its size.
    budget: u64,
    state: Mutex<State>,
    changed: Condvar,
}

#[derive(Default)]
struct State {
    /// The next tensor to start reading.
    next: usize,
    /// The tensor the writer takes next.
    wanted: usize,
    /// Bytes read, or being read, that the writer has not taken.
    held: u64,
    ready: BTreeMap<usize, Result<Bytes>>,
    finished: bool,
}

impl TensorsAhead {
    /// Reads `sources` ahead, in their order, holding at most `budget` bytes the writer has
    /// not taken yet (besides the one it waits for).
    pub(crate) fn new(sources: Vec<Tensor>, budget: u64) -> Arc<Self> {
        Arc::new(Self {
            sources,
            budget,
            state: Mutex::default(),
            changed: Condvar::new(),
        })
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
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
                    move || ahead.take(index),
                )
            })
            .collect()
    }

    /// The number of threads [`read`](Self::read) wants.
    pub(crate) fn readers(&self) -> usize {
        READERS.min(self.sources.len()).max(1)
    }

    /// Reads tensors ahead until every one is read or [`finish`](Self::finish) is called: run
    /// on each of [`readers`](Self::readers) threads.
    pub(crate) fn read(&self) {
        loop {
            let index = {
                let mut state = self.state();
                loop {
                    if state.finished || state.next >= self.sources.len() {
                        return;
                    }
                    let len = self.sources[state.next].byte_len();
                    if state.next == state.wanted || state.held + len <= self.budget {
                        break;
                    }
                    state = self
                        .changed
                        .wait(state)
                        .unwrap_or_else(PoisonError::into_inner);
                }
                let index = state.next;
                state.next += 1;
                state.held += self.sources[index].byte_len();
                index
            };
            // Read whole here, not when the writer reaches it: a lazy source's bytes come in
            // on this thread.
            let bytes = self.sources[index].bytes().and_then(|bytes| {
                bytes.read(AccessPolicy::AllowCopy)?;
                Ok(bytes)
            });
            self.state().ready.insert(index, bytes);
            self.changed.notify_all();
        }
    }

    /// Stops the readers (at their next tensor): the writer is done, or failed.
    pub(crate) fn finish(&self) {
        self.state().finished = true;
        self.changed.notify_all();
    }

    /// The bytes of tensor `index`, waiting for its reader.
    fn take(&self, index: usize) -> Result<Bytes> {
        let mut state = self.state();
        state.wanted = state.wanted.max(index);
        self.changed.notify_all();
        loop {
            if let Some(bytes) = state.ready.remove(&index) {
                state.held -= self.sources[index].byte_len();
                state.wanted = index + 1;
                self.changed.notify_all();
                return bytes;
            }
            state = self
                .changed
                .wait(state)
                .unwrap_or_else(PoisonError::into_inner);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU64, Ordering};

    use weightbay::DType;

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
        let ahead = TensorsAhead::new(sources, 250);
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

    #[test]
    fn a_tensor_over_the_budget_is_still_read_and_finish_stops_the_readers() {
        let sources = vec![
            Tensor::new("big", DType::U8, [1000], vec![1; 1000]),
            Tensor::new("next", DType::U8, [10], vec![2; 10]),
        ];
        let ahead = TensorsAhead::new(sources, 10);
        std::thread::scope(|scope| {
            let reader = scope.spawn(|| ahead.read());
            let tensors = ahead.tensors();
            assert_eq!(tensors[0].bytes().unwrap().to_vec().unwrap(), vec![1; 1000]);
            ahead.finish();
            reader.join().unwrap();
        });
    }
}
