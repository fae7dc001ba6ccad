//! Reading weights ahead of a consumer that asks for them one at a time: [`Prefetched`] wraps a
//! [`WeightSource`] and, told which tensors will be asked for in which order ([`PrefetchPlan`]),
//! fetches them in batches on worker threads within a byte budget while the consumer (a model
//! constructor, a module loader) works, handing each over when asked.
//!
//! Model code asks for one tensor, builds a layer, asks for the next: over an object store each
//! ask is a round trip, in sequence. Prefetching turns the asks into batched reads that run in
//! parallel (see [`Source::fetch`](crate::Source::fetch)), kept ahead of the consumer by at
//! most the budget.

use std::cmp::Ordering;
use std::collections::{HashMap, HashSet, VecDeque};
use std::ops::Range;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};

use crate::weights::{StoredTensor, TensorAllocator, WeightSource, allocate, writable};
use crate::{Bytes, Error, ErrorKind, Result};

/// Batches fetched at once, each a sixteenth of the budget (half that in the plan's last half
/// budget): with an object store's default budget (256 MiB) and request length (16 MiB), one
/// request per batch and sixteen in flight, each batch handed over as soon as its one request
/// is in, and a batch held back only as long as the consumer takes to use one. Fewer, larger
/// batches would hold the budget for the slowest request of each.
const WORKERS: usize = 16;

/// The shortest part length a tensor is cut to (its parts, as many as that length divides it
/// into rounded to the nearest, are then at least three quarters of it): below it, a request's
/// round trip takes longer than its bytes, and the tensor is read whole.
const MIN_PART: u64 = 64 << 10;

/// Which tensors a consumer will ask for, and in which order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PrefetchPlan {
    /// Every tensor the source holds ([`WeightSource::catalog`]), in natural name order:
    /// numbers compared as numbers, so `layers.2` comes before `layers.10`, the order model
    /// code builds layers in.
    All,
    /// These tensors, in this order. Names the source does not hold are skipped.
    Names(Vec<String>),
}

/// A [`WeightSource`] that reads ahead of its consumer.
///
/// The tensors of the [`PrefetchPlan`] are fetched in order, in batches of a sixteenth of the
/// budget (a tensor larger than that alone, with the small ones before it; the tensors of the
/// plan's last half budget in batches of half that, so the last requests end closer together),
/// at most sixteen batches at once, and held until asked for; fetched tensors not yet asked for
/// and batches in flight together stay within the budget, except that one batch may always
/// run. A tensor asked for while its batch is in flight waits for it; one whose batch is the
/// next to start has that batch fetched at once on the asking thread (the consumer has caught
/// up with the plan); one further on in the plan (a model's final norm, asked for before its
/// layers) is taken out of its batch and read alone, as is one not in the plan (a tensor read
/// in parts is a batch of its own, fetched at once in its parts). So memory holds at most the
/// budget plus one batch or the largest tensor. Each planned tensor is handed over once: asking
/// for it again reads it again.
///
/// A budget of 0 (a source that gains nothing from reading ahead: memory, a map, a local file)
/// starts no threads and passes every call through.
///
/// Made with [`landing_in`](Self::landing_in), it fetches each tensor straight into memory a
/// [`TensorAllocator`] gives (a framework's own tensor storage), so the consumer takes the
/// allocation back ([`Bytes::into_allocation`](crate::Bytes::into_allocation)) instead of
/// copying the bytes once more. Everything fetched ahead is then the consumer's own memory,
/// and the budget paces the reads instead: a batch starts whenever the reads open are under
/// it (so they may pass it by one batch), and what is fetched ahead, in flight or not yet
/// asked for, stays within two budgets (or one batch, when that is larger). A tensor of one
/// and a half batches or more (an embedding table) is then read in parts of about a batch
/// (half a batch in the plan's last half budget; parts are cut to 64 KiB or more), each
/// started as a batch would be, ahead of the batches after it, where the source can read part
/// of a tensor ([`WeightSource::lazy_tensor`]): held whole, it would hold the room of all its
/// reads until the last one is in.
///
/// A batch that fails is not an error until its tensors are asked for: each is then read
/// alone, and that read's error is the one returned, naming the tensor.
#[derive(Debug)]
pub struct Prefetched<W: WeightSource + 'static> {
    shared: Arc<Shared<W>>,
}

#[derive(Debug)]
struct Shared<W> {
    weights: W,
    budget: u64,
    /// Where fetched tensors land, when the consumer gave memory of its own.
    allocator: Option<Arc<dyn TensorAllocator>>,
    /// The tensors read in parts at once ([`Shared::fetch_parts`]), with bytes read as they are
    /// accessed, and the length their parts are cut to.
    lazy: HashMap<String, (StoredTensor, u64)>,
    state: Mutex<State>,
    changed: Condvar,
}

/// A batch of the plan: names with their byte lengths.
type Batch = Vec<(String, u64)>;

#[derive(Debug, Default)]
struct State {
    /// Batches not started, in plan order, each with its number.
    plan: VecDeque<(usize, Batch)>,
    /// Which batch each planned name is in, until the batch starts.
    planned: HashMap<String, usize>,
    /// Names of the batches being fetched.
    in_flight: HashSet<String>,
    /// Fetched and not yet asked for, with the bytes each reserves.
    ready: HashMap<String, (StoredTensor, u64)>,
    /// Bytes of the batches in flight.
    in_flight_bytes: u64,
    /// Bytes of the reads open for batches in flight: all of a batch's, or the parts of a
    /// tensor read in parts that have started and not ended.
    reading_bytes: u64,
    /// Bytes of the tensors ready.
    ready_bytes: u64,
    /// Parts of a tensor read in parts waiting for room: batches not started wait behind them.
    parts_waiting: usize,
    /// The consumer dropped the prefetcher: workers end after their batch (a tensor read in
    /// parts, after the parts already started, filing nothing).
    stopped: bool,
}

impl State {
    /// Takes batch `number` out of the plan (when not started yet) and marks it in flight.
    fn start(&mut self, number: usize) -> Option<Batch> {
        let at = self.plan.binary_search_by_key(&number, |(n, _)| *n).ok()?;
        let (_, batch) = self.plan.remove(at)?;
        for (name, _) in &batch {
            self.planned.remove(name);
            self.in_flight.insert(name.clone());
        }
        Some(batch)
    }

    /// Takes `name` out of batch `number`, not started yet, for the consumer to read alone; a
    /// batch left empty leaves the plan.
    fn unplan(&mut self, name: &str, number: usize) {
        self.planned.remove(name);
        if let Ok(at) = self.plan.binary_search_by_key(&number, |(n, _)| *n) {
            let batch = &mut self.plan[at].1;
            batch.retain(|(planned, _)| planned != name);
            if batch.is_empty() {
                self.plan.remove(at);
            }
        }
    }
}

impl<W: WeightSource + 'static> Prefetched<W> {
    /// Prefetches `plan` from `weights` within [`WeightSource::fetch_ahead`] bytes.
    ///
    /// # Errors
    /// [`ErrorKind::Io`] when a worker thread cannot start.
    pub fn new(weights: W, plan: PrefetchPlan) -> Result<Self> {
        let budget = weights.fetch_ahead();
        Self::with_budget(weights, plan, budget)
    }

    /// As [`new`](Self::new), within `budget` bytes (0: no reading ahead).
    ///
    /// # Errors
    /// [`ErrorKind::Io`] when a worker thread cannot start.
    pub fn with_budget(weights: W, plan: PrefetchPlan, budget: u64) -> Result<Self> {
        Self::start(weights, plan, budget, None)
    }

    /// As [`new`](Self::new), each tensor fetched into memory `allocator` gives for it,
    /// including those read alone.
    ///
    /// # Errors
    /// [`ErrorKind::Io`] when a worker thread cannot start.
    pub fn landing_in(
        weights: W,
        plan: PrefetchPlan,
        allocator: Arc<dyn TensorAllocator>,
    ) -> Result<Self> {
        let budget = weights.fetch_ahead();
        Self::start(weights, plan, budget, Some(allocator))
    }

    fn start(
        weights: W,
        plan: PrefetchPlan,
        budget: u64,
        allocator: Option<Arc<dyn TensorAllocator>>,
    ) -> Result<Self> {
        let batch_bytes = budget / WORKERS as u64;
        let mut tensors = if budget == 0 {
            Vec::new()
        } else {
            ordered(&weights, plan)
        };
        // The plan's last half budget, its last round of requests, is cut to half a batch.
        let tail_at = tail_start(&tensors, budget);
        let tail_batch_bytes = batch_bytes / 2;
        // Only landed in the consumer's memory: read in parts, a tensor needs its whole memory
        // before its first part starts, which the consumer's allocator gives.
        let lazy: HashMap<String, (StoredTensor, u64)> = match allocator {
            Some(_) => tensors
                .iter()
                .enumerate()
                .filter_map(|(at, (name, len))| {
                    let part_bytes = if at < tail_at {
                        batch_bytes
                    } else {
                        tail_batch_bytes
                    };
                    if part_bytes < MIN_PART || part_count(*len, part_bytes) == 1 {
                        return None;
                    }
                    let lazy = weights.lazy_tensor(name).ok().flatten()?;
                    // Parts are cut from the catalog's length: other bytes are not this tensor.
                    (lazy.bytes.len() as u64 == *len).then(|| (name.clone(), (lazy, part_bytes)))
                })
                .collect(),
            None => HashMap::new(),
        };
        let in_parts = |name: &str| lazy.contains_key(name);
        let tail = tensors.split_off(tail_at);
        let mut cut = batches(tensors, batch_bytes, in_parts);
        cut.extend(batches(tail, tail_batch_bytes, in_parts));
        let batches = cut;
        let workers = batches.len().min(WORKERS);
        let planned = batches
            .iter()
            .enumerate()
            .flat_map(|(number, batch)| batch.iter().map(move |(name, _)| (name.clone(), number)))
            .collect();
        let shared = Arc::new(Shared {
            weights,
            budget,
            allocator,
            lazy,
            state: Mutex::new(State {
                plan: batches.into_iter().enumerate().collect(),
                planned,
                ..State::default()
            }),
            changed: Condvar::new(),
        });
        for _ in 0..workers {
            let worker = Arc::clone(&shared);
            std::thread::Builder::new()
                .name("weightbay-prefetch".into())
                .spawn(move || worker.run())
                .map_err(|e| Error::io("starting a prefetch thread", e))?;
        }
        Ok(Self { shared })
    }

    /// The source read from.
    pub fn inner(&self) -> &W {
        &self.shared.weights
    }
}

impl<W: WeightSource + 'static> Drop for Prefetched<W> {
    fn drop(&mut self) {
        self.shared.lock().stopped = true;
        self.shared.changed.notify_all();
    }
}

impl<W> Shared<W> {
    fn lock(&self) -> MutexGuard<'_, State> {
        // Every update is a few inserts and removes that leave the state consistent between
        // them, so a panic elsewhere while holding the lock leaves nothing half-done.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn wait<'a>(&self, guard: MutexGuard<'a, State>) -> MutexGuard<'a, State> {
        self.changed
            .wait(guard)
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Gives back the room of a part's read that ended.
    fn release(&self, len: u64) {
        self.lock().reading_bytes -= len;
        self.changed.notify_all();
    }
}

/// A part's read, counted against the budget until dropped: when the read ends, however it
/// ends, or when it never starts.
struct OpenRead<'a, W> {
    shared: &'a Shared<W>,
    len: u64,
}

impl<W> Drop for OpenRead<'_, W> {
    fn drop(&mut self) {
        self.shared.release(self.len);
    }
}

impl<W: WeightSource> Shared<W> {
    /// Whether a batch of `size` bytes may start: always when nothing is held, else when the
    /// batches in flight and the tensors ready stay within the budget.
    ///
    /// Landed in the consumer's own memory ([`Prefetched::landing_in`]), a batch in flight or a
    /// ready tensor is memory the consumer keeps anyway, not a buffer of the prefetcher's: the
    /// budget then paces the reads instead. A batch starts whenever the reads open are under
    /// the budget, so a batch larger than the room left does not leave connections idle while
    /// the batches ahead of it drain; and what is fetched ahead, in flight or ready, stays
    /// within two budgets, so a consumer a little behind does not leave connections idle
    /// either.
    fn has_room(&self, state: &State, size: u64) -> bool {
        let held = state.in_flight_bytes + state.ready_bytes;
        if held == 0 {
            return true;
        }
        match self.allocator {
            Some(_) => {
                state.reading_bytes < self.budget
                    && held.saturating_add(size) <= self.budget.saturating_mul(2)
            }
            None => held.saturating_add(size) <= self.budget,
        }
    }

    /// A worker: fetches the next batch whenever the budget has room, until the plan is done
    /// or the prefetcher is dropped.
    fn run(&self) {
        let mut state = self.lock();
        loop {
            if state.stopped {
                return;
            }
            let Some((number, next)) = state.plan.front() else {
                return;
            };
            let size: u64 = next.iter().map(|(_, len)| len).sum();
            if state.parts_waiting > 0 || !self.has_room(&state, size) {
                state = self.wait(state);
                continue;
            }
            let number = *number;
            let batch = state.start(number).unwrap_or_default();
            state.in_flight_bytes += batch.iter().map(|(_, len)| len).sum::<u64>();
            state.reading_bytes += self.first_read(&batch);
            state = self.fetch(state, batch, true);
        }
    }

    /// The bytes of the first read of `batch` as it starts: all of them, or the first part of
    /// a tensor read in parts.
    fn first_read(&self, batch: &Batch) -> u64 {
        if let [(name, len)] = batch.as_slice()
            && let Some((_, part_bytes)) = self.lazy.get(name)
        {
            return parts(*len, *part_bytes)
                .next()
                .map_or(0, |part| part.end - part.start);
        }
        batch.iter().map(|(_, len)| len).sum()
    }

    /// Fetches a started batch without holding the lock, and files what came back; its bytes
    /// and its reads count against the budget when `counted`.
    fn fetch<'a>(
        &'a self,
        state: MutexGuard<'a, State>,
        batch: Batch,
        counted: bool,
    ) -> MutexGuard<'a, State> {
        if let [(name, len)] = batch.as_slice()
            && self.lazy.contains_key(name)
        {
            return self.fetch_parts(state, name.clone(), *len, counted);
        }
        drop(state);
        let names: Vec<String> = batch.iter().map(|(name, _)| name.clone()).collect();
        let fetched = self.read(&names);
        let mut state = self.lock();
        match fetched {
            Ok(fetched) => {
                // A source that returned fewer tensors than asked for leaves the rest to be
                // read alone, as a failed batch does.
                let mut fetched = fetched.into_iter();
                for (name, len) in batch {
                    let stored = fetched.next().flatten();
                    state.in_flight.remove(&name);
                    if counted {
                        state.in_flight_bytes -= len;
                        state.reading_bytes -= len;
                    }
                    if let Some(stored) = stored {
                        state.ready.insert(name, (stored, len));
                        state.ready_bytes += len;
                    }
                }
            }
            Err(_) => {
                // Asked for, each tensor is read alone and reports its own error.
                for (name, len) in &batch {
                    state.in_flight.remove(name);
                    if counted {
                        state.in_flight_bytes -= len;
                        state.reading_bytes -= len;
                    }
                }
            }
        }
        self.changed.notify_all();
        state
    }

    /// Fetches tensor `name`, `len` bytes, in parts at once into one allocation of the
    /// consumer's, each part started when the reads open are under the budget, ahead of
    /// batches not started (the first part as its batch started, counted when `counted`); and
    /// files it.
    fn fetch_parts<'a>(
        &'a self,
        state: MutexGuard<'a, State>,
        name: String,
        len: u64,
        counted: bool,
    ) -> MutexGuard<'a, State> {
        drop(state);
        let landed = self.read_parts(&name, counted);
        let mut state = self.lock();
        state.in_flight.remove(&name);
        if counted {
            state.in_flight_bytes -= len;
        }
        // A part that failed is not an error until the tensor is asked for: it is then read
        // alone, and that read's error is the one returned.
        if let Ok(stored) = landed {
            state.ready.insert(name, (stored, len));
            state.ready_bytes += len;
        }
        self.changed.notify_all();
        state
    }

    /// Reads tensor `name` in parts, each on a thread of its own, into the allocator's memory.
    fn read_parts(&self, name: &str, first_counted: bool) -> Result<StoredTensor> {
        let (Some((lazy, part_bytes)), Some(allocator)) = (self.lazy.get(name), &self.allocator)
        else {
            return Err(Error::new(ErrorKind::Io, "not a tensor read in parts").with_tensor(name));
        };
        let len = lazy.bytes.len();
        let mut parts = parts(len as u64, *part_bytes);
        let first = parts.next();
        // The first part's read was counted as its batch started: this gives the room back if
        // the allocation fails, and the part's thread when its read ends.
        let first_open = first
            .as_ref()
            .filter(|_| first_counted)
            .map(|part| OpenRead {
                shared: self,
                len: part.end - part.start,
            });
        let mut allocation = allocate(allocator.as_ref(), name, &lazy.dtype, &lazy.shape, len)?;
        let memory = writable(allocation.as_mut(), name, len)?;
        let mut next = first.map(|part| (part, first_open));
        let read = std::thread::scope(|scope| {
            let mut rest = memory;
            let mut reading = Vec::new();
            let mut started = Ok(());
            while let Some((part, open)) = next.take() {
                // The parts tile the tensor in order, so each is the front of what is left.
                let (chunk, tail) =
                    std::mem::take(&mut rest).split_at_mut((part.end - part.start) as usize);
                rest = tail;
                // A closure whose thread does not start is dropped, `open` with it.
                let spawned = std::thread::Builder::new()
                    .name("weightbay-prefetch-part".into())
                    .spawn_scoped(scope, move || {
                        let _open = open;
                        lazy.bytes.read_at(part.start as usize, chunk)
                    });
                match spawned {
                    Ok(thread) => reading.push(thread),
                    Err(e) => {
                        started = Err(Error::io("starting a prefetch thread", e));
                        break;
                    }
                }
                if let Some(part) = parts.next() {
                    match self.claim_part(part.end - part.start) {
                        Some(open) => next = Some((part, Some(open))),
                        None => {
                            started = Err(Error::new(ErrorKind::Io, "the prefetcher was dropped"));
                        }
                    }
                }
            }
            reading.into_iter().fold(started, |result, thread| {
                let read = thread.join().unwrap_or_else(|_| {
                    Err(Error::new(ErrorKind::Io, "a prefetch thread panicked"))
                });
                result.and(read)
            })
        });
        read.map_err(|e| e.with_tensor(name))?;
        Ok(StoredTensor {
            dtype: lazy.dtype.clone(),
            shape: lazy.shape.clone(),
            bytes: Bytes::from_controller(allocation),
        })
    }

    /// Waits until a part of `len` bytes may start (the reads open under the budget) and
    /// counts its read; batches not started wait behind it. `None` when the prefetcher was
    /// dropped.
    fn claim_part(&self, len: u64) -> Option<OpenRead<'_, W>> {
        let mut state = self.lock();
        state.parts_waiting += 1;
        while !state.stopped && state.reading_bytes >= self.budget {
            state = self.wait(state);
        }
        state.parts_waiting -= 1;
        let stopped = state.stopped;
        if !stopped {
            state.reading_bytes += len;
        }
        self.changed.notify_all();
        (!stopped).then_some(OpenRead { shared: self, len })
    }

    /// The fetched tensor `name`, after waiting for its batch (or fetching it, when it is the
    /// next to start or a tensor read in parts); `None` when it has to be read alone.
    fn take(&self, name: &str) -> Option<StoredTensor> {
        let mut state = self.lock();
        loop {
            if let Some((stored, len)) = state.ready.remove(name) {
                state.ready_bytes -= len;
                self.changed.notify_all();
                return Some(stored);
            }
            if state.in_flight.contains(name) {
                state = self.wait(state);
                continue;
            }
            // The consumer waits for the batch next in the plan, or for a tensor read in parts
            // (a batch of its own): it runs on the consumer's thread at once, and does not
            // take the room of the batches ahead of it (the one batch beyond the budget that
            // memory may hold); of a tensor read in parts, only the first part. A tensor
            // further on is read alone and taken out of its batch, so the consumer does not
            // wait for bytes it did not ask for: a model's final norm, last in the file and in
            // a batch of the last layer's weights, asked for before the first layer, kept
            // candle's Llama constructor waiting over 100 ms for 12.5 MiB.
            let number = state.planned.get(name).copied()?;
            let next = state.plan.front().is_some_and(|(next, _)| *next == number);
            if !next && !self.lazy.contains_key(name) {
                state.unplan(name, number);
                // The batch at the front of the plan may have changed.
                self.changed.notify_all();
                return None;
            }
            let batch = state.start(number)?;
            state = self.fetch(state, batch, false);
        }
    }
}

impl<W: WeightSource> Shared<W> {
    /// `names` read from the source, into the allocator's memory when there is one.
    fn read(&self, names: &[String]) -> Result<Vec<Option<StoredTensor>>> {
        match &self.allocator {
            Some(allocator) => self.weights.stored_tensors_in(names, allocator.as_ref()),
            None => self.weights.stored_tensors(names),
        }
    }

    /// `names`, each handed over when fetched and the rest read with `read`.
    fn take_or_read(
        &self,
        names: &[String],
        read: impl FnOnce(&[String]) -> Result<Vec<Option<StoredTensor>>>,
    ) -> Result<Vec<Option<StoredTensor>>> {
        let mut out: Vec<Option<StoredTensor>> = names.iter().map(|n| self.take(n)).collect();
        let missing: Vec<String> = names
            .iter()
            .zip(&out)
            .filter(|(_, taken)| taken.is_none())
            .map(|(name, _)| name.clone())
            .collect();
        if missing.is_empty() {
            return Ok(out);
        }
        let mut read = read(&missing)?.into_iter();
        for slot in out.iter_mut().filter(|slot| slot.is_none()) {
            *slot = read.next().ok_or_else(|| {
                Error::new(ErrorKind::Io, "a batched read returned too few tensors")
            })?;
        }
        Ok(out)
    }
}

impl<W: WeightSource + 'static> WeightSource for Prefetched<W> {
    fn stored_tensor(&self, name: &str) -> Result<Option<StoredTensor>> {
        if let Some(stored) = self.shared.take(name) {
            return Ok(Some(stored));
        }
        match &self.shared.allocator {
            Some(_) => Ok(self.shared.read(&[name.to_owned()])?.pop().flatten()),
            None => self.shared.weights.stored_tensor(name),
        }
    }

    fn stored_tensors(&self, names: &[String]) -> Result<Vec<Option<StoredTensor>>> {
        self.shared
            .take_or_read(names, |names| self.shared.read(names))
    }

    /// The tensors fetched ahead as they landed (in the prefetcher's allocator's memory, when it
    /// has one); the rest read into `allocator`'s.
    fn stored_tensors_in(
        &self,
        names: &[String],
        allocator: &dyn TensorAllocator,
    ) -> Result<Vec<Option<StoredTensor>>> {
        self.shared.take_or_read(names, |names| {
            self.shared.weights.stored_tensors_in(names, allocator)
        })
    }

    fn contains(&self, name: &str) -> bool {
        self.shared.weights.contains(name)
    }

    fn catalog(&self) -> Result<Vec<(String, u64)>> {
        self.shared.weights.catalog()
    }

    fn fetch_ahead(&self) -> u64 {
        // Already reading ahead: a prefetcher over this one would only add threads.
        0
    }
}

/// The plan's tensors, in order, with their lengths; names the source does not hold dropped.
fn ordered<W: WeightSource>(weights: &W, plan: PrefetchPlan) -> Vec<(String, u64)> {
    // A source that cannot list its tensors gets nothing read ahead, not an error: every ask
    // then reads, as without a prefetcher.
    let catalog = weights.catalog().unwrap_or_default();
    match plan {
        PrefetchPlan::All => {
            let mut all = catalog;
            all.sort_by(|a, b| natural_order(&a.0, &b.0));
            all
        }
        PrefetchPlan::Names(names) => {
            let lengths: HashMap<String, u64> = catalog.into_iter().collect();
            let mut seen = HashSet::new();
            names
                .into_iter()
                .filter_map(|name| {
                    let len = *lengths.get(&name)?;
                    seen.insert(name.clone()).then_some((name, len))
                })
                .collect()
        }
    }
}

/// Where the plan's last half budget starts, the tensors that fit whole in it: the last round of
/// requests, cut to half a batch. Requests started at different times end at different times,
/// and while the last ones run the connections that finished idle; halving the last round's
/// requests halves that run-down, for a few more round trips (measured on the cold-start
/// bench's Llama: 8 more requests, about 35 ms sooner of 1.57 s).
fn tail_start(tensors: &[(String, u64)], budget: u64) -> usize {
    let mut left = budget / 2;
    tensors
        .iter()
        .rposition(|(_, len)| match left.checked_sub(*len) {
            Some(rest) => {
                left = rest;
                false
            }
            None => true,
        })
        .map_or(0, |at| at + 1)
}

/// `tensors` cut into consecutive batches of at most `batch_bytes` (a larger tensor alone),
/// except that a batch under a sixteenth of that (norms, biases) takes the next tensor along
/// however large: small tensors ride with a large one instead of paying a request of their
/// own. A tensor read in parts (`in_parts`) is a batch of its own.
fn batches(
    tensors: Vec<(String, u64)>,
    batch_bytes: u64,
    in_parts: impl Fn(&str) -> bool,
) -> Vec<Batch> {
    let mut out = Vec::new();
    let mut batch: Batch = Vec::new();
    let mut size = 0u64;
    for (name, len) in tensors {
        let alone = in_parts(&name);
        let full = size >= batch_bytes / 16 && size.saturating_add(len) > batch_bytes;
        if !batch.is_empty() && (alone || full) {
            out.push(std::mem::take(&mut batch));
            size = 0;
        }
        size = size.saturating_add(len);
        batch.push((name, len));
        if alone {
            out.push(std::mem::take(&mut batch));
            size = 0;
        }
    }
    if !batch.is_empty() {
        out.push(batch);
    }
    out
}

/// How many parts a tensor of `len` bytes is read in: as many as `part_bytes` divides it
/// into, rounded to the nearest (at least one), as an object store cuts a long range into
/// requests.
fn part_count(len: u64, part_bytes: u64) -> u64 {
    let part_bytes = part_bytes.max(1);
    (len / part_bytes + u64::from(len % part_bytes >= part_bytes.div_ceil(2))).max(1)
}

/// The [`part_count`] parts of a tensor of `len` bytes, of equal length.
fn parts(len: u64, part_bytes: u64) -> impl Iterator<Item = Range<u64>> {
    let count = part_count(len, part_bytes);
    let part = len.div_ceil(count).max(1);
    (0..count)
        .map(move |i| i.saturating_mul(part).min(len)..(i + 1).saturating_mul(part).min(len))
        .filter(|part| !part.is_empty())
}

/// Compares names with runs of digits compared as numbers (`a.2` < `a.10`), otherwise bytewise.
pub(crate) fn natural_order(a: &str, b: &str) -> Ordering {
    let (mut a, mut b) = (a.as_bytes(), b.as_bytes());
    loop {
        match (a.first(), b.first()) {
            (None, None) => return Ordering::Equal,
            (None, Some(_)) => return Ordering::Less,
            (Some(_), None) => return Ordering::Greater,
            (Some(x), Some(y)) if x.is_ascii_digit() && y.is_ascii_digit() => {
                let (da, ra) = split_digits(a);
                let (db, rb) = split_digits(b);
                let (ta, tb) = (trim_zeros(da), trim_zeros(db));
                let by_value = ta.len().cmp(&tb.len()).then_with(|| ta.cmp(tb));
                let order = by_value.then_with(|| da.len().cmp(&db.len()));
                if order != Ordering::Equal {
                    return order;
                }
                (a, b) = (ra, rb);
            }
            (Some(x), Some(y)) => {
                if x != y {
                    return x.cmp(y);
                }
                // Both are non-empty: each has a first byte.
                (a, b) = (&a[1..], &b[1..]);
            }
        }
    }
}

fn split_digits(s: &[u8]) -> (&[u8], &[u8]) {
    let end = s
        .iter()
        .position(|c| !c.is_ascii_digit())
        .unwrap_or(s.len());
    s.split_at(end)
}

fn trim_zeros(digits: &[u8]) -> &[u8] {
    let start = digits
        .iter()
        .position(|&c| c != b'0')
        .unwrap_or(digits.len());
    &digits[start..]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layers_sort_by_number() {
        let mut names = vec![
            "model.layers.10.mlp",
            "model.layers.2.mlp",
            "model.layers.1.attn",
            "lm_head",
            "model.layers.02.mlp",
            "model.norm",
        ];
        names.sort_by(|a, b| natural_order(a, b));
        assert_eq!(
            names,
            [
                "lm_head",
                "model.layers.1.attn",
                "model.layers.2.mlp",
                "model.layers.02.mlp",
                "model.layers.10.mlp",
                "model.norm",
            ]
        );
    }

    /// The lengths of the batches tensors of `lens` are cut into.
    fn cut(lens: &[u64], batch_bytes: u64) -> Vec<Vec<u64>> {
        let tensors = lens
            .iter()
            .enumerate()
            .map(|(i, &len)| (format!("t{i}"), len))
            .collect();
        batches(tensors, batch_bytes, |name| name == "t9")
            .into_iter()
            .map(|b| b.into_iter().map(|(_, len)| len).collect())
            .collect()
    }

    #[test]
    fn batches_keep_order_and_size() {
        assert_eq!(
            cut(&[3, 3, 3, 10, 1], 6),
            [vec![3, 3], vec![3], vec![10], vec![1]]
        );
        // Under a sixteenth of a batch, a norm rides with the large tensor after it.
        assert_eq!(
            cut(&[1, 100, 1, 50, 50], 64),
            [vec![1, 100], vec![1, 50], vec![50]]
        );
        // Except one read in parts (`t9` here), which is a batch of its own.
        let mut lens = vec![1; 9];
        lens.extend([1000, 1]);
        assert_eq!(cut(&lens, 640), [vec![1; 9], vec![1000], vec![1]]);
    }

    #[test]
    fn the_tail_is_the_tensors_that_fit_whole_in_the_last_half_budget() {
        let tensors = |lens: &[u64]| -> Vec<(String, u64)> {
            lens.iter().map(|&len| (String::new(), len)).collect()
        };
        assert_eq!(tail_start(&tensors(&[50, 30, 20, 10]), 60), 2);
        assert_eq!(tail_start(&tensors(&[50, 30, 20, 10]), 120), 1);
        // A plan within half the budget is all tail; one whose last tensor is larger, none.
        assert_eq!(tail_start(&tensors(&[5, 5]), 100), 0);
        assert_eq!(tail_start(&tensors(&[5, 80]), 100), 2);
        assert_eq!(tail_start(&[], 100), 0);
    }

    #[test]
    fn parts_are_even_and_about_a_batch() {
        let lens = |parts: &mut dyn Iterator<Item = Range<u64>>| -> Vec<u64> {
            parts.map(|p| p.end - p.start).collect()
        };
        assert_eq!(
            lens(&mut parts(156, 16)),
            [16, 16, 16, 16, 16, 16, 16, 16, 16, 12]
        );
        // Up to half a batch over is one part, not a second that pays a round trip for little.
        assert_eq!(lens(&mut parts(23, 16)), [23]);
        assert_eq!(lens(&mut parts(24, 16)), [12, 12]);
        assert_eq!(lens(&mut parts(0, 16)), Vec::<u64>::new());
    }
}
