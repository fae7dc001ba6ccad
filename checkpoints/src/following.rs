//! What a save and the promotion that follows it share: while a [`Tiered`](crate::Tiered)
//! background save writes a container on the fast tier, the bytes written so far are read back
//! ([`Sink::read_back`]) and streamed into the durable tier's sink, so the promotion ends about
//! when the slower of the two would alone instead of after both in turn. Nothing waits on the
//! follower: the save only notes how far it got ([`Announced`]). What could not be streamed (a
//! sink that cannot read back) is copied from the committed checkpoint as a queued promotion
//! copies it, and every container's CRC32C is checked against the fast tier's commit record
//! before its durable sink commits; the durable record is written last. The follower is in
//! [`promotion_stream`](crate::promotion_stream).

use std::collections::BTreeMap;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};

use weightbay::{ReadBack, Sink};

/// How far the save has written one container, and how its writing ended.
#[derive(Debug, Default)]
pub(crate) struct Progress {
    state: Mutex<Written>,
    changed: Condvar,
}

#[derive(Debug, Default)]
struct Written {
    len: u64,
    /// `Some(true)` once committed, `Some(false)` once abandoned (the sink failed or dropped).
    end: Option<bool>,
}

impl Progress {
    fn lock(&self) -> MutexGuard<'_, Written> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn update(&self, change: impl FnOnce(&mut Written)) {
        change(&mut self.lock());
        self.changed.notify_all();
    }

    /// Waits until more than `sent` bytes are written or the writing has ended; returns how
    /// many are written and how it ended, if it has.
    pub(crate) fn wait_past(&self, sent: u64) -> (u64, Option<bool>) {
        let mut written = self.lock();
        while written.len <= sent && written.end.is_none() {
            written = self
                .changed
                .wait(written)
                .unwrap_or_else(PoisonError::into_inner);
        }
        (written.len, written.end)
    }
}

/// The save's side of a followed container. Dropped before [`committed`](Self::committed), it
/// tells the follower the container was abandoned.
#[derive(Debug)]
pub(crate) struct Announced(Arc<Progress>);

impl Announced {
    pub(crate) fn new(progress: Arc<Progress>) -> Self {
        Self(progress)
    }

    /// `len` bytes are written and can be read back.
    pub(crate) fn wrote(&self, len: u64) {
        self.0.update(|written| written.len = len);
    }

    /// The container is committed on the fast tier, whole.
    pub(crate) fn committed(self) {
        self.0.update(|written| written.end = Some(true));
    }
}

impl Drop for Announced {
    fn drop(&mut self) {
        self.0.update(|written| {
            written.end.get_or_insert(false);
        });
    }
}

/// A container the save created, announced to the follower: its key on the fast tier, its
/// length if known, a reader of its bytes, and how far they are written.
#[derive(Debug)]
pub(crate) struct Followed {
    pub(crate) key: String,
    /// Its length, when the save said it up front.
    pub(crate) expected_len: Option<u64>,
    pub(crate) reader: Arc<dyn ReadBack>,
    pub(crate) progress: Arc<Progress>,
}

/// A container streamed to the durable tier while it was saved: its sink, not committed, and
/// how many bytes went into it with their CRC32C.
pub(crate) struct Head {
    pub(crate) sink: Box<dyn Sink>,
    pub(crate) len: u64,
    pub(crate) crc: u32,
}

/// The containers streamed, by the key the fast tier's commit record names them with.
pub(crate) type Heads = BTreeMap<String, Head>;
