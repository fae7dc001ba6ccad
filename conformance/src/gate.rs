//! A storage in front of another that makes two writers' commits meet: each writer goes through
//! its own handle, the commits of keys ending in a suffix wait until both writers are there,
//! then go in the order the case chose. An interleaving that threads would hit only by luck,
//! every time.

use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::Duration;

use weightbay::{CreateOptions, Error, ErrorKind, Result, Sink, Storage};

/// How long a commit waits for the other writer before the case gives up on it.
const PATIENCE: Duration = Duration::from_secs(60);

#[derive(Debug, Default)]
struct Meeting {
    /// Writers whose gated commit is waiting.
    arrived: usize,
    /// How many gated commits have gone through.
    done: usize,
}

/// The meeting point two writers share.
#[derive(Debug)]
pub(crate) struct Gate {
    inner: Arc<dyn Storage>,
    suffix: &'static str,
    /// Writer ids in the order their gated commits go.
    order: [usize; 2],
    meeting: Arc<(Mutex<Meeting>, Condvar)>,
}

impl Gate {
    /// Commits of keys ending in `suffix` go in `order` (writer ids 0 and 1).
    pub(crate) fn new(
        inner: Arc<dyn Storage>,
        suffix: &'static str,
        order: [usize; 2],
    ) -> Arc<Self> {
        Arc::new(Self {
            inner,
            suffix,
            order,
            meeting: Arc::default(),
        })
    }

    /// Writer `id`'s handle.
    pub(crate) fn writer(self: &Arc<Self>, id: usize) -> Arc<dyn Storage> {
        Arc::new(Handle {
            gate: Arc::clone(self),
            id,
        })
    }

    /// Waits until both writers are at their gated commit and it is `id`'s turn, runs `commit`,
    /// and lets the other go.
    fn commit_in_turn(&self, id: usize, commit: impl FnOnce() -> Result<()>) -> Result<()> {
        let (lock, turn) = &*self.meeting;
        let mut meeting = lock.lock().unwrap_or_else(PoisonError::into_inner);
        meeting.arrived += 1;
        turn.notify_all();
        let position = self.order.iter().position(|&w| w == id).unwrap_or(0);
        while meeting.arrived < 2 || meeting.done != position {
            let (next, timeout) = turn
                .wait_timeout(meeting, PATIENCE)
                .unwrap_or_else(PoisonError::into_inner);
            meeting = next;
            if timeout.timed_out() {
                return Err(Error::new(
                    ErrorKind::Io,
                    format!("writer {id}: the other writer never reached its commit"),
                ));
            }
        }
        drop(meeting);
        let result = commit();
        let mut meeting = lock.lock().unwrap_or_else(PoisonError::into_inner);
        meeting.done += 1;
        turn.notify_all();
        result
    }
}

/// One writer's view of the gate.
#[derive(Debug)]
struct Handle {
    gate: Arc<Gate>,
    id: usize,
}

#[deny(clippy::missing_trait_methods)]
impl Storage for Handle {
    fn create(&self, key: &str, options: &CreateOptions) -> Result<Box<dyn Sink>> {
        let inner = self.gate.inner.create(key, options)?;
        if !key.ends_with(self.gate.suffix) {
            return Ok(inner);
        }
        Ok(Box::new(GatedSink {
            inner,
            gate: Arc::clone(&self.gate),
            id: self.id,
        }))
    }
    weightbay::forward_storage!(gate.inner => capabilities, open, delete, pending, clean_pending, list, list_foreign);
}

struct GatedSink {
    inner: Box<dyn Sink>,
    gate: Arc<Gate>,
    id: usize,
}

// Every method named. Reading back and writing by position answer `None`, as the trait's
// defaults did: the cases that gate commits write in order, and a gate that offered them
// would have to order those writes too.
#[deny(clippy::missing_trait_methods)]
impl Sink for GatedSink {
    fn read_back(&self) -> Option<Arc<dyn weightbay::ReadBack>> {
        None
    }
    fn positioned(&mut self) -> Option<Box<dyn weightbay::PositionedWrite + '_>> {
        None
    }
    fn commit(self: Box<Self>) -> Result<()> {
        let Self { inner, gate, id } = *self;
        gate.commit_in_turn(id, || inner.commit())
    }
    weightbay::forward_sink!(inner => write, pad);
}

/// A meeting of a number of threads that gives up after [`PATIENCE`]: a barrier that cannot
/// hang a case when one party fails before it gets there.
#[derive(Debug)]
pub(crate) struct Rendezvous {
    parties: usize,
    arrived: Mutex<usize>,
    all_here: Condvar,
}

impl Rendezvous {
    pub(crate) fn new(parties: usize) -> Self {
        Self {
            parties,
            arrived: Mutex::new(0),
            all_here: Condvar::new(),
        }
    }

    /// Waits until every party has arrived.
    ///
    /// # Errors
    /// [`ErrorKind::Io`] when they have not after [`PATIENCE`].
    pub(crate) fn wait(&self) -> Result<()> {
        let mut arrived = self.arrived.lock().unwrap_or_else(PoisonError::into_inner);
        *arrived += 1;
        self.all_here.notify_all();
        while *arrived < self.parties {
            let (next, timeout) = self
                .all_here
                .wait_timeout(arrived, PATIENCE)
                .unwrap_or_else(PoisonError::into_inner);
            arrived = next;
            if timeout.timed_out() && *arrived < self.parties {
                return Err(Error::new(
                    ErrorKind::Io,
                    format!(
                        "{} of {} parties never arrived",
                        self.parties - *arrived,
                        self.parties
                    ),
                ));
            }
        }
        Ok(())
    }
}
