//! Pieces of a compressed save encoded on worker threads, one per core, while the writer
//! streams the next ones: encoding runs near 1.2 GiB/s a core, slower than a store's
//! connections together carry, so on the writer's own thread it would hold the save back.

use std::collections::BTreeMap;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;

use weightbay::checksum::crc32c;
use weightbay::codec::{Elements, MAX_ENCODED_LOGICAL_LEN, encode_planes};
use weightbay::{Error, ErrorKind, Result};

/// A piece handed to a worker: its place in the order, its bytes, a buffer for its frame, and
/// what its elements are.
type Job = (u64, Vec<u8>, Vec<u8>, Elements);

/// A piece a worker is done with.
pub(crate) struct Encoded {
    /// The piece's bytes.
    pub(crate) logical: Vec<u8>,
    /// Its frame, when [`shrank`](Self::shrank).
    pub(crate) frame: Vec<u8>,
    /// Whether the frame is shorter than the piece (else the piece is stored raw).
    pub(crate) shrank: bool,
    /// The CRC32C of the piece's bytes.
    pub(crate) crc32c: u32,
}

/// The workers, and the pieces handed to them that the writer has not taken back.
pub(crate) struct Encoders {
    jobs: Option<SyncSender<Job>>,
    done: Receiver<(u64, Result<Encoded>)>,
    workers: Vec<JoinHandle<()>>,
    next: u64,
    ready: BTreeMap<u64, Result<Encoded>>,
    in_flight: usize,
    /// Pieces handed out and not taken back, at most: the memory a save holds beyond its own.
    limit: usize,
}

impl Encoders {
    /// One worker per core; at most two pieces each in flight.
    pub(crate) fn new() -> Self {
        let threads = std::thread::available_parallelism().map_or(1, usize::from);
        let (jobs, queue) = sync_channel::<Job>(threads);
        let queue = Arc::new(Mutex::new(queue));
        let (finished, done) = sync_channel(2 * threads);
        let workers = (0..threads)
            .map(|_| {
                let (queue, finished) = (Arc::clone(&queue), finished.clone());
                std::thread::spawn(move || {
                    loop {
                        let job = queue.lock().unwrap_or_else(PoisonError::into_inner).recv();
                        let Ok((seq, logical, frame, elements)) = job else {
                            return;
                        };
                        let encoded =
                            catch_unwind(AssertUnwindSafe(|| encode(logical, frame, elements)))
                                .unwrap_or_else(|_| {
                                    Err(Error::new(ErrorKind::Io, "an encoding thread panicked"))
                                });
                        if finished.send((seq, encoded)).is_err() {
                            return;
                        }
                    }
                })
            })
            .collect();
        Self {
            jobs: Some(jobs),
            done,
            workers,
            next: 0,
            ready: BTreeMap::new(),
            in_flight: 0,
            limit: 2 * threads,
        }
    }

    /// Whether as many pieces are out as may be: the writer takes one back before it hands
    /// out another.
    pub(crate) fn is_full(&self) -> bool {
        self.in_flight >= self.limit
    }

    /// Hands `logical` (with `frame`, a buffer for its frame) to a worker; returns the
    /// number to take it back by.
    pub(crate) fn submit(
        &mut self,
        logical: Vec<u8>,
        frame: Vec<u8>,
        elements: Elements,
    ) -> Result<u64> {
        let seq = self.next;
        let sent = self
            .jobs
            .as_ref()
            .is_some_and(|jobs| jobs.send((seq, logical, frame, elements)).is_ok());
        if !sent {
            return Err(Error::new(ErrorKind::Io, "the encoding threads stopped"));
        }
        self.next += 1;
        self.in_flight += 1;
        Ok(seq)
    }

    /// Piece `seq`, if its worker is done with it (`wait`: waiting until it is).
    pub(crate) fn take(&mut self, seq: u64, wait: bool) -> Option<Result<Encoded>> {
        loop {
            if let Some(encoded) = self.ready.remove(&seq) {
                self.in_flight -= 1;
                return Some(encoded);
            }
            let received = if wait {
                self.done.recv().ok()
            } else {
                self.done.try_recv().ok()
            };
            match received {
                Some((done, encoded)) => {
                    self.ready.insert(done, encoded);
                }
                None if wait => {
                    self.in_flight -= 1;
                    return Some(Err(Error::new(
                        ErrorKind::Io,
                        "the encoding threads stopped",
                    )));
                }
                None => return None,
            }
        }
    }
}

impl Drop for Encoders {
    fn drop(&mut self) {
        // Without jobs, every worker returns once it has sent what it holds.
        self.jobs = None;
        while self.done.recv().is_ok() {}
        for worker in self.workers.drain(..) {
            let _ = worker.join();
        }
    }
}

/// The worker's part: the piece's CRC32C and its frame.
fn encode(logical: Vec<u8>, mut frame: Vec<u8>, elements: Elements) -> Result<Encoded> {
    let crc32c = crc32c(&logical);
    let shrank = logical.len() as u64 <= MAX_ENCODED_LOGICAL_LEN
        && encode_planes(&logical, elements, &mut frame);
    Ok(Encoded {
        logical,
        frame,
        shrank,
        crc32c,
    })
}
