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
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};

use crate::weights::{StoredTensor, TensorAllocator, WeightSource};
use crate::{Error, ErrorKind, Result};

/// Batches fetched at once, each a sixteenth of the budget: with an object store's default
/// budget (256 MiB) and request length (16 MiB), one request per batch and sixteen in flight,
/// each batch handed over as soon as its one request is in, and a batch held back only as long
/// as the consumer takes to use one. Fewer, larger batches would hold the budget for the
/// slowest request of each.
const WORKERS: usize = 16;

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
/// budget (a tensor larger than that alone, with the small ones before it), at most sixteen
/// batches at once, and held until asked
/// for; fetched tensors not yet asked for and batches in flight together stay within the
/// budget, except that one batch may always run. A tensor asked for while its batch is in
/// flight waits for it; one whose batch has not started has that batch fetched at once on the
/// asking thread (the consumer has caught up with the plan); one the plan does not name is
/// read alone. So memory holds at most the budget plus one batch or the largest tensor. Each
/// planned tensor is handed over once: asking for it again reads it again.
///
/// A budget of 0 (a source that gains nothing from reading ahead: memory, a map, a local file)
/// starts no threads and passes every call through.
///
/// Made with [`landing_in`](Self::landing_in), it fetches each tensor straight into memory a
/// [`TensorAllocator`] gives (a framework's own tensor storage), so the consumer takes the
/// allocation back ([`Bytes::into_allocation`](crate::Bytes::into_allocation)) instead of
/// copying the bytes once more. The budget then bounds the batches in flight alone: tensors
/// fetched and not yet asked for are the consumer's own memory, and up to another budget of
/// them waits beside it.
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
    /// Names the consumer read itself: a batch that reaches them skips them.
    taken: HashSet<String>,
    /// Bytes of the batches in flight.
    in_flight_bytes: u64,
    /// Bytes of the tensors ready.
    ready_bytes: u64,
    /// The consumer dropped the prefetcher: workers end after their batch.
    stopped: bool,
}

impl State {
    /// Takes batch `number` out of the plan (when not started yet) and marks it in flight,
    /// leaving out what the consumer read itself; its bytes count against the budget when
    /// `counted`.
    fn start(&mut self, number: usize, counted: bool) -> Option<Batch> {
        let at = self.plan.binary_search_by_key(&number, |(n, _)| *n).ok()?;
        let (_, batch) = self.plan.remove(at)?;
        let batch: Batch = batch
            .into_iter()
            .filter(|(name, _)| {
                self.planned.remove(name);
                !self.taken.contains(name)
            })
            .collect();
        if counted {
            self.in_flight_bytes += batch.iter().map(|(_, len)| len).sum::<u64>();
        }
        self.in_flight
            .extend(batch.iter().map(|(name, _)| name.clone()));
        Some(batch)
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
        let batches = if budget == 0 {
            Vec::new()
        } else {
            batches(ordered(&weights, plan), budget / WORKERS as u64)
        };
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

impl<W: WeightSource> Shared<W> {
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

    /// Whether a batch of `size` bytes may start: always when nothing is held, else when the
    /// batches in flight and the tensors ready stay within the budget. Landed in the
    /// consumer's own memory ([`Prefetched::landing_in`]), a ready tensor is memory the consumer
    /// keeps anyway, not a buffer of the prefetcher's: the budget then bounds the batches in
    /// flight alone, and the ready tensors wait beside them up to another budget, so a consumer
    /// a little behind does not leave connections idle.
    fn has_room(&self, state: &State, size: u64) -> bool {
        let (held, ready_fits) = match self.allocator {
            Some(_) => (state.in_flight_bytes, state.ready_bytes <= self.budget),
            None => (state.in_flight_bytes + state.ready_bytes, true),
        };
        ready_fits && (held == 0 || held.saturating_add(size) <= self.budget)
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
            if !self.has_room(&state, size) {
                state = self.wait(state);
                continue;
            }
            let number = *number;
            let batch = state.start(number, true).unwrap_or_default();
            state = self.fetch(state, batch, true);
        }
    }

    /// Fetches a started batch without holding the lock, and files what came back.
    fn fetch<'a>(
        &'a self,
        state: MutexGuard<'a, State>,
        batch: Batch,
        counted: bool,
    ) -> MutexGuard<'a, State> {
        drop(state);
        let names: Vec<String> = batch.iter().map(|(name, _)| name.clone()).collect();
        let fetched = self.read(&names);
        let mut state = self.lock();
        match fetched {
            Ok(fetched) => {
                for ((name, len), stored) in batch.into_iter().zip(fetched) {
                    state.in_flight.remove(&name);
                    if counted {
                        state.in_flight_bytes -= len;
                    }
                    if let Some(stored) = stored
                        && !state.taken.contains(&name)
                    {
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
                    }
                }
            }
        }
        self.changed.notify_all();
        state
    }

    /// The fetched tensor `name`, after waiting for its batch (or fetching it, when it has not
    /// started); `None` when it has to be read alone.
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
            let number = state.planned.get(name).copied();
            // The consumer waits for this batch: it runs on the consumer's thread at once, and
            // does not take the room of the batches ahead of it (the one batch beyond the
            // budget that memory may hold).
            match number.and_then(|number| state.start(number, false)) {
                Some(batch) => state = self.fetch(state, batch, false),
                None => {
                    state.taken.insert(name.to_owned());
                    return None;
                }
            }
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

/// `tensors` cut into consecutive batches of at most `batch_bytes` (a larger tensor alone),
/// except that a batch under a sixteenth of that (norms, biases) takes the next tensor along
/// however large: small tensors ride with a large one instead of paying a request of their
/// own.
fn batches(tensors: Vec<(String, u64)>, batch_bytes: u64) -> Vec<Batch> {
    let mut out = Vec::new();
    let mut batch: Batch = Vec::new();
    let mut size = 0u64;
    for (name, len) in tensors {
        if !batch.is_empty() && size >= batch_bytes / 16 && size.saturating_add(len) > batch_bytes {
            out.push(std::mem::take(&mut batch));
            size = 0;
        }
        size = size.saturating_add(len);
        batch.push((name, len));
    }
    if !batch.is_empty() {
        out.push(batch);
    }
    out
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
        batches(tensors, batch_bytes)
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
    }
}
