//! The bridge from weightbay's synchronous traits to `object_store`'s async API.

use std::future::Future;
use std::sync::Arc;

use weightbay::{Error, ErrorKind, Result};

/// Runs futures on a tokio runtime and waits for them on the calling thread.
///
/// Work is always spawned onto the runtime and awaited through a channel, never with
/// `block_on` on the caller's thread, so calling from plain code, from a runtime worker, or
/// from a current-thread runtime never panics. Blocking a runtime worker this way stalls that
/// worker, and a bridge borrowed from a current-thread runtime cannot be called from that
/// runtime's own thread (it answers `Unsupported`): async callers save and load with the
/// `_in_background` calls ([`weightbay::Background`]), as the crate docs show.
#[derive(Debug, Clone)]
pub struct Bridge {
    handle: tokio::runtime::Handle,
    /// Keeps an owned runtime alive; `None` when borrowing the caller's.
    _owned: Option<Arc<OwnedRuntime>>,
}

/// A runtime that shuts down without blocking when dropped, so the last handle to a storage
/// may be dropped anywhere, inside an async context too.
#[derive(Debug)]
struct OwnedRuntime(Option<tokio::runtime::Runtime>);

impl Drop for OwnedRuntime {
    fn drop(&mut self) {
        if let Some(runtime) = self.0.take() {
            runtime.shutdown_background();
        }
    }
}

impl Bridge {
    /// A bridge with its own small multi-threaded runtime.
    ///
    /// # Errors
    /// [`ErrorKind::Io`] when the runtime cannot start.
    pub fn owned() -> Result<Self> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("weightbay-object-store")
            .enable_all()
            .build()
            .map_err(|e| Error::io("starting the object-store runtime", e))?;
        Ok(Self {
            handle: runtime.handle().clone(),
            _owned: Some(Arc::new(OwnedRuntime(Some(runtime)))),
        })
    }

    /// A bridge onto an existing runtime (which must have I/O and time enabled).
    pub fn borrowed(handle: tokio::runtime::Handle) -> Self {
        Self {
            handle,
            _owned: None,
        }
    }

    /// Runs `future` to completion on the runtime and returns its output.
    pub(crate) fn run<F>(&self, future: F) -> Result<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        self.check_may_wait()?;
        let (sender, receiver) = std::sync::mpsc::sync_channel(1);
        self.handle.spawn(async move {
            let _ = sender.send(future.await);
        });
        receiver
            .recv()
            .map_err(|_| Error::new(ErrorKind::Io, "the object-store runtime shut down"))
    }

    /// [`run`](Self::run), giving up at `deadline` (when there is one): the future is then
    /// dropped, which cancels the requests it had in flight, and the answer is `None`.
    pub(crate) fn run_until<F>(
        &self,
        deadline: Option<std::time::Instant>,
        future: F,
    ) -> Result<Option<F::Output>>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        match deadline {
            None => self.run(future).map(Some),
            Some(deadline) => {
                self.run(async move { tokio::time::timeout_at(deadline.into(), future).await.ok() })
            }
        }
    }

    /// Whether the calling thread may wait for work on the runtime.
    ///
    /// # Errors
    /// [`ErrorKind::Unsupported`] on the thread of the current-thread runtime the work runs on:
    /// waiting there would stop the only thread that can run it, so refuse instead of hanging.
    pub(crate) fn check_may_wait(&self) -> Result<()> {
        if let Ok(current) = tokio::runtime::Handle::try_current()
            && current.runtime_flavor() == tokio::runtime::RuntimeFlavor::CurrentThread
            && self.handle.runtime_flavor() == tokio::runtime::RuntimeFlavor::CurrentThread
        {
            return Err(Error::unsupported(
                "called on the thread of the current-thread runtime it runs on; use the _in_background calls",
            ));
        }
        Ok(())
    }

    /// Starts `future` on the runtime without waiting for it.
    pub(crate) fn spawn<F>(&self, future: F) -> tokio::task::JoinHandle<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        self.handle.spawn(future)
    }
}
