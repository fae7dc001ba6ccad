//! What a save and the promotion that follows it share: while a [`Tiered`](crate::Tiered)
//! background save writes a container on the fast tier, the bytes written so far are read back
//! ([`Sink::read_back`]) and streamed into the durable tier's sink, so the promotion ends about
//! when the slower of the two would alone instead of after both in turn. Nothing waits on the
//! follower: the save only notes how far it got ([`Announced`]). What could not be streamed (a
//! sink that cannot read back) is copied from the committed checkpoint as a queued promotion
//! copies it, and every container's CRC32C is checked against the fast tier's commit record
//! before its durable sink commits; the durable record is written last. The follower is
//! [`Tiers::follow`], at the end of this file.

use std::collections::BTreeMap;
use std::sync::mpsc::Receiver;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};

use weightbay::backend_kit::unique_token;
use weightbay::checksum::crc32c_append;
use weightbay::{Durability, ReadBack, Result, Sink};

use crate::copy::create_container;
use crate::layout;
use crate::promoter::Tiers;

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

/// How much of a followed container is read back and sent at a time.
const FOLLOW_WINDOW: u64 = 8 << 20;

/// A promotion that follows its save ([`following`](crate::following)).
impl Tiers {
    /// Promotes `step` following the fast tier's save of it: streams each container the save
    /// announces on `announced` (the channel closes when the save ends), then copies the
    /// committed step with what was streamed. Returns how it ended and whether it failed
    /// because the save did not commit. It holds the durable tier's save slot throughout, as
    /// a copy does, so gc there leaves its uploads alone and a save or copy made there
    /// directly meanwhile waits for it.
    pub(crate) fn follow(&self, step: u64, announced: Receiver<Followed>) -> (Result<()>, bool) {
        let dir = self.durable.step_dir(step);
        let _in_flight = match self.durable.saves.begin((step, dir.clone())) {
            Ok(in_flight) => in_flight,
            Err(e) => return (Err(e), false),
        };
        let save = unique_token();
        let streamed = self.stream(step, &dir, &save, announced);
        // The channel closed when the save's `write_and_commit` returned, its record written
        // or its failure known; a background save's slot ends just after.
        let (opened, unsaved) = self.saved_on_fast(step);
        let promoted = streamed.and_then(|heads| {
            let checkpoint = opened?;
            self.copy(&checkpoint, Some((&save, heads))).map(drop)
        });
        (promoted, unsaved)
    }

    /// Streams every container announced to directory `save` of `dir` on the durable tier,
    /// until the save ends. The first failure stops the streaming (what it streamed is
    /// dropped, its sinks aborted), but not the save, which it waits for all the same.
    fn stream(
        &self,
        step: u64,
        dir: &str,
        save: &str,
        announced: Receiver<Followed>,
    ) -> Result<Heads> {
        let fast_dir = format!("{}/", self.fast.step_dir(step));
        let mut heads = Heads::new();
        let mut failure = None;
        let mut window = Vec::new();
        for followed in announced {
            let Some(relative) = followed.key.strip_prefix(&fast_dir) else {
                continue;
            };
            if failure.is_some() {
                continue;
            }
            let key = format!("{dir}/{}", layout::moved_into(save, relative));
            match self.stream_one(&followed, &key, &mut window) {
                Ok(Some(head)) => {
                    heads.insert(relative.to_owned(), head);
                }
                Ok(None) => {}
                Err(e) => {
                    // Abort what was streamed now, not when the save ends.
                    heads.clear();
                    failure = Some(e);
                }
            }
        }
        failure.map_or(Ok(heads), Err)
    }

    /// Streams one container to `key` on the durable tier as the save writes it: its head,
    /// or `None` when the save abandoned it.
    fn stream_one(
        &self,
        followed: &Followed,
        key: &str,
        window: &mut Vec<u8>,
    ) -> Result<Option<Head>> {
        let storage = self.durable.storage.as_ref();
        let mut sink = create_container(storage, key, followed.expected_len, Durability::Default)?;
        let (mut len, mut crc) = (0, 0);
        loop {
            let (written, end) = followed.progress.wait_past(len);
            while len < written {
                // At most FOLLOW_WINDOW, so it fits in usize.
                let n = (written - len).min(FOLLOW_WINDOW) as usize;
                window.resize(n, 0);
                followed
                    .reader
                    .read_at(len, window)
                    .map_err(|e| e.context(format!("reading back {}", followed.key)))?;
                sink.write(window)
                    .map_err(|e| e.with_operation("write").with_key(key))?;
                crc = crc32c_append(crc, window);
                len += n as u64;
            }
            match end {
                Some(true) => return Ok(Some(Head { sink, len, crc })),
                Some(false) => return Ok(None),
                None => {}
            }
        }
    }
}
