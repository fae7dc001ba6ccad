//! Work on a thread of its own, for callers that must not block: a training loop that keeps
//! stepping while a checkpoint streams out, or an async program whose runtime threads must keep
//! serving while a load runs.
//!
//! Saving and loading are blocking (files, `pread`, a storage's own bridge to its runtime).
//! [`Background`] runs such work on a dedicated thread and hands back a handle that sync code
//! [`wait`](Background::wait)s on and async code `.await`s. The future needs no particular
//! runtime (it is woken from the worker thread), and awaiting it never blocks the thread that
//! polls it, so it is safe inside a tokio `current_thread` runtime.
//! [`Writer::write_in_background`](crate::Writer::write_in_background) and
//! [`Reader::open_in_background`](crate::Reader::open_in_background) are built on it.

use std::fmt;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll, Waker};

use crate::error::{Error, Result};

/// The handle to work running on its own thread.
///
/// `wait` blocks until the work returns; `.await` yields until it does. A panic in the work is
/// resumed in whoever waits. Dropping the handle detaches the work: it runs to its end and its
/// output is dropped, as with a thread's `JoinHandle`.
pub struct Background<T> {
    shared: Arc<Shared<T>>,
}

struct Shared<T> {
    state: Mutex<State<T>>,
    finished: Condvar,
}

struct State<T> {
    /// The work's output, or its panic; taken by whoever waits.
    outcome: Option<std::thread::Result<T>>,
    /// The task to wake when the outcome arrives.
    waker: Option<Waker>,
}

impl<T> Shared<T> {
    /// The state; never poisoned in practice, since no user code runs while it is held.
    fn lock(&self) -> MutexGuard<'_, State<T>> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl<T: Send + 'static> Background<T> {
    /// Starts `work` on a new thread named `name`.
    ///
    /// # Errors
    /// [`ErrorKind::Io`](crate::ErrorKind::Io) when the thread cannot start.
    pub fn spawn(name: &str, work: impl FnOnce() -> T + Send + 'static) -> Result<Self> {
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                outcome: None,
                waker: None,
            }),
            finished: Condvar::new(),
        });
        let worker = Arc::clone(&shared);
        std::thread::Builder::new()
            .name(name.to_string())
            .spawn(move || {
                let outcome = std::panic::catch_unwind(AssertUnwindSafe(work));
                let waker = {
                    let mut state = worker.lock();
                    state.outcome = Some(outcome);
                    state.waker.take()
                };
                worker.finished.notify_all();
                if let Some(waker) = waker {
                    waker.wake();
                }
            })
            .map_err(|e| Error::io(format!("starting the thread {name}"), e))?;
        Ok(Self { shared })
    }
}

impl<T> Background<T> {
    /// Whether the work has returned (so `wait` would not block).
    pub fn is_finished(&self) -> bool {
        self.shared.lock().outcome.is_some()
    }

    /// Blocks until the work returns, and returns its output.
    ///
    /// # Panics
    /// With the work's panic, if it panicked.
    pub fn wait(self) -> T {
        let mut state = self.shared.lock();
        loop {
            if let Some(outcome) = state.outcome.take() {
                return unwrap_outcome(outcome);
            }
            state = self
                .shared
                .finished
                .wait(state)
                .unwrap_or_else(PoisonError::into_inner);
        }
    }
}

fn unwrap_outcome<T>(outcome: std::thread::Result<T>) -> T {
    outcome.unwrap_or_else(|panic| std::panic::resume_unwind(panic))
}

impl<T> Future for Background<T> {
    type Output = T;

    /// # Panics
    /// With the work's panic, if it panicked; when polled again after it returned `Ready`.
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<T> {
        let mut state = self.shared.lock();
        match state.outcome.take() {
            Some(outcome) => Poll::Ready(unwrap_outcome(outcome)),
            None => {
                // Registered under the lock the worker stores its outcome under, so a wake-up
                // cannot slip between this check and the registration.
                state.waker = Some(cx.waker().clone());
                Poll::Pending
            }
        }
    }
}

impl<T> fmt::Debug for Background<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Background")
            .field("finished", &self.is_finished())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;
    use std::task::Wake;

    /// Wakes a thread parked in `block_on`.
    struct Unpark(std::thread::Thread);

    impl Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }

    /// The smallest executor: polls, parks until woken, polls again.
    fn block_on<F: Future + Unpin>(mut future: F) -> F::Output {
        let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
        let mut cx = Context::from_waker(&waker);
        loop {
            if let Poll::Ready(output) = Pin::new(&mut future).poll(&mut cx) {
                return output;
            }
            std::thread::park();
        }
    }

    #[test]
    fn waiting_returns_the_output() {
        let work = Background::spawn("test", || 6 * 7).unwrap();
        assert_eq!(work.wait(), 42);
    }

    #[test]
    fn awaiting_is_pending_until_the_worker_wakes_it() {
        let (release, gate) = mpsc::channel::<()>();
        let mut work = Background::spawn("test", move || gate.recv().map(|()| "done")).unwrap();
        // The worker is held at the gate, so the first poll must be pending.
        let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
        let pending = Pin::new(&mut work).poll(&mut Context::from_waker(&waker));
        assert!(pending.is_pending());
        release.send(()).unwrap();
        assert_eq!(block_on(work), Ok("done"));
    }

    #[test]
    fn is_finished_only_after_the_work_returns() {
        let (release, gate) = mpsc::channel::<()>();
        let work = Background::spawn("test", move || gate.recv().is_ok()).unwrap();
        assert!(!work.is_finished());
        release.send(()).unwrap();
        while !work.is_finished() {
            std::thread::yield_now();
        }
        assert!(work.wait());
    }

    #[test]
    fn a_panic_reaches_whoever_waits() {
        let work = Background::spawn("test", || -> u8 { panic!("deliberate") }).unwrap();
        let caught = std::panic::catch_unwind(AssertUnwindSafe(|| work.wait())).unwrap_err();
        assert_eq!(caught.downcast_ref::<&str>(), Some(&"deliberate"));
    }
}
