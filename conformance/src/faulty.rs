//! [`Faulty`]: a decorator over any storage that fails its N-th I/O operation.

use std::fmt;
use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use weightbay::{
    Bytes, Capabilities, CreateOptions, Error, ErrorKind, Result, Sink, Source, Storage,
};

/// Counts operations and fails the one numbered `fail_at` (1-based) with
/// [`ErrorKind::Io`] naming the operation, or kills the whole process (SIGKILL, no destructors
/// run) right after the one numbered `kill_after`. Deterministic and free of global state:
/// clones share one counter.
#[derive(Clone)]
pub struct Faulty<S> {
    inner: S,
    counter: Arc<Counter>,
}

struct Counter {
    done: AtomicU64,
    fail_at: Option<u64>,
    kill_after: Option<u64>,
}

impl Counter {
    /// Counts the operation about to run, failing it if it is the chosen one.
    fn tick(&self, operation: &'static str) -> Result<u64> {
        let n = self.done.fetch_add(1, Ordering::SeqCst) + 1;
        if self.fail_at == Some(n) {
            return Err(Error::new(
                ErrorKind::Io,
                format!("injected fault at operation {n} ({operation})"),
            )
            .with_operation(operation));
        }
        Ok(n)
    }

    /// Called after operation `n` ran: dies if it is the chosen one.
    fn ran(&self, n: u64) {
        if self.kill_after == Some(n) {
            kill_this_process();
        }
    }

    fn around<T>(&self, operation: &'static str, f: impl FnOnce() -> Result<T>) -> Result<T> {
        let n = self.tick(operation)?;
        let result = f();
        self.ran(n);
        result
    }
}

/// Ends the process at once, as a crash or `kill -9` would: no destructor or cleanup runs.
fn kill_this_process() -> ! {
    #[cfg(unix)]
    // SAFETY: sending a signal to our own pid has no memory-safety preconditions.
    unsafe {
        libc::kill(libc::getpid(), libc::SIGKILL);
    }
    std::process::abort()
}

impl<S: Storage> Faulty<S> {
    /// Fails operation number `fail_at` (1-based).
    pub fn failing_at(inner: S, fail_at: u64) -> Self {
        Self::new(inner, Some(fail_at), None)
    }

    /// Kills this process right after operation number `kill_after` (1-based) ran.
    pub fn killing_at(inner: S, kill_after: u64) -> Self {
        Self::new(inner, None, Some(kill_after))
    }

    /// Counts operations without failing any.
    pub fn counting(inner: S) -> Self {
        Self::new(inner, None, None)
    }

    fn new(inner: S, fail_at: Option<u64>, kill_after: Option<u64>) -> Self {
        Self {
            inner,
            counter: Arc::new(Counter {
                done: AtomicU64::new(0),
                fail_at,
                kill_after,
            }),
        }
    }

    /// Operations performed so far.
    pub fn operations(&self) -> u64 {
        self.counter.done.load(Ordering::SeqCst)
    }
}

impl<S> fmt::Debug for Faulty<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Faulty")
            .field("fail_at", &self.counter.fail_at)
            .finish_non_exhaustive()
    }
}

#[deny(clippy::missing_trait_methods)]
impl<S: Storage> Storage for Faulty<S> {
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }

    fn create(&self, key: &str, options: &CreateOptions) -> Result<Box<dyn Sink>> {
        let inner = self
            .counter
            .around("create", || self.inner.create(key, options))?;
        Ok(Box::new(FaultySink {
            inner,
            counter: Arc::clone(&self.counter),
        }))
    }

    fn open(&self, key: &str) -> Result<Arc<dyn Source>> {
        let inner = self.counter.around("open", || self.inner.open(key))?;
        Ok(Arc::new(FaultySource {
            inner,
            counter: Arc::clone(&self.counter),
        }))
    }

    fn delete(&self, key: &str) -> Result<()> {
        self.counter.around("delete", || self.inner.delete(key))
    }

    fn pending(&self) -> Result<Vec<String>> {
        self.inner.pending()
    }

    fn clean_pending(&self) -> Result<Vec<String>> {
        self.inner.clean_pending()
    }
}

struct FaultySink {
    inner: Box<dyn Sink>,
    counter: Arc<Counter>,
}

#[deny(clippy::missing_trait_methods)]
impl Sink for FaultySink {
    fn write(&mut self, data: &[u8]) -> Result<()> {
        self.counter.around("write", || self.inner.write(data))
    }

    fn pad(&mut self, len: u64) -> Result<()> {
        self.counter.around("pad", || self.inner.pad(len))
    }

    fn commit(self: Box<Self>) -> Result<()> {
        let counter = Arc::clone(&self.counter);
        counter.around("commit", || self.inner.commit())
    }
}

struct FaultySource {
    inner: Arc<dyn Source>,
    counter: Arc<Counter>,
}

impl fmt::Debug for FaultySource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("FaultySource").field(&self.inner).finish()
    }
}

#[deny(clippy::missing_trait_methods)]
impl Source for FaultySource {
    fn len(&self) -> u64 {
        self.inner.len()
    }

    fn is_empty(&self) -> bool {
        self.inner.is_empty()
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        self.counter
            .around("read", || self.inner.read_at(offset, buf))
    }

    fn bytes(&self, range: Range<u64>) -> Result<Bytes> {
        self.counter.around("bytes", || self.inner.bytes(range))
    }
}
