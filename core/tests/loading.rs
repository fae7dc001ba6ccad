//! Loads shaped for cold start: a [`Prefetched`] source reading ahead of a consumer that asks
//! one tensor at a time, and [`Reader::stage`] streaming through a reused [`StagingPool`].

use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use weightbay::{
    AccessPolicy, AllocationController, AllocationProperty, Bytes, DType, ErrorKind, MemorySource,
    PrefetchPlan, Prefetched, Reader, ShardedWeights, ShardedWriter, Source, StagingPool, Tensor,
    TensorAllocator, WeightSource, Writer,
};

/// A memory source that gains from reading ahead, as an object store does, and counts its
/// batched reads and the bytes all reads asked for.
#[derive(Debug)]
struct Remote {
    inner: MemorySource,
    ahead: u64,
    fetches: AtomicUsize,
    /// Single reads (`read_at`): the header's, and a tensor's parts.
    reads: AtomicUsize,
    /// When set, every batched read of more than one range fails.
    refuse_batches: bool,
    fetched: AtomicU64,
}

impl Source for Remote {
    fn len(&self) -> u64 {
        self.inner.len()
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> weightbay::Result<()> {
        self.reads.fetch_add(1, Ordering::SeqCst);
        self.fetched.fetch_add(buf.len() as u64, Ordering::SeqCst);
        self.inner.read_at(offset, buf)
    }
    fn fetch(&self, ranges: &[Range<u64>]) -> weightbay::Result<Vec<Bytes>> {
        self.fetches.fetch_add(1, Ordering::SeqCst);
        if self.refuse_batches && ranges.len() > 1 {
            return Err(weightbay::Error::new(ErrorKind::Io, "refused for the test"));
        }
        let asked: u64 = ranges.iter().map(|r| r.end - r.start).sum();
        self.fetched.fetch_add(asked, Ordering::SeqCst);
        self.inner.fetch(ranges)
    }
    fn fetch_into(&self, jobs: &mut [(u64, &mut [u8])]) -> weightbay::Result<()> {
        self.fetches.fetch_add(1, Ordering::SeqCst);
        let asked: u64 = jobs.iter().map(|(_, buf)| buf.len() as u64).sum();
        self.fetched.fetch_add(asked, Ordering::SeqCst);
        self.inner.fetch_into(jobs)
    }
    fn fetch_ahead(&self) -> u64 {
        self.ahead
    }
}

/// Memory a consumer keeps: a `Vec` it takes back from the tensor's bytes.
#[derive(Debug)]
struct Owned(Vec<u8>);

impl AllocationController for Owned {
    fn len(&self) -> usize {
        self.0.len()
    }
    fn alignment(&self) -> usize {
        1
    }
    fn property(&self) -> AllocationProperty {
        AllocationProperty::Native
    }
    fn memory(&self, _: AccessPolicy) -> weightbay::Result<&[u8]> {
        Ok(&self.0)
    }
    fn memory_mut(&mut self) -> Option<&mut [u8]> {
        Some(&mut self.0)
    }
}

/// Lands every tensor in an [`Owned`], one byte short when `short` (a broken allocator), after
/// failing the first `failures` allocations (memory running out).
#[derive(Debug, Default)]
struct Keep {
    short: bool,
    failures: AtomicUsize,
}

impl TensorAllocator for Keep {
    fn allocate(
        &self,
        _: &str,
        _: &DType,
        _: &[u64],
        len: usize,
    ) -> weightbay::Result<Box<dyn AllocationController>> {
        let out_of_memory = self
            .failures
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |left| {
                left.checked_sub(1)
            })
            .is_ok();
        if out_of_memory {
            return Err(weightbay::Error::new(
                ErrorKind::Io,
                "out of memory for the test",
            ));
        }
        Ok(Box::new(Owned(vec![0; len - usize::from(self.short)])))
    }
}

/// `count` tensors of `len` bytes each, `layers.{i}.w` filled with `i`.
fn container(count: usize, len: usize) -> weightbay::SharedBytes {
    container_of(&vec![len; count])
}

/// A tensor `layers.{i}.w` of `lens[i]` bytes for each `i`, filled with `i`.
fn container_of(lens: &[usize]) -> weightbay::SharedBytes {
    Writer::new(
        lens.iter()
            .enumerate()
            .map(|(i, &len)| {
                Tensor::new(
                    format!("layers.{i}.w"),
                    DType::U8,
                    [len as u64],
                    vec![i as u8; len],
                )
            })
            .collect(),
    )
    .into_bytes()
    .unwrap()
    .into()
}

fn remote(count: usize, len: usize, ahead: u64) -> (Reader, Arc<Remote>) {
    remote_of(container(count, len), ahead)
}

fn remote_of(container: weightbay::SharedBytes, ahead: u64) -> (Reader, Arc<Remote>) {
    let source = Arc::new(Remote {
        inner: MemorySource::new(container),
        ahead,
        fetches: AtomicUsize::new(0),
        reads: AtomicUsize::new(0),
        refuse_batches: false,
        fetched: AtomicU64::new(0),
    });
    let reader = Reader::open(source.clone()).unwrap();
    // Only what is read after the header counts.
    source.fetched.store(0, Ordering::SeqCst);
    source.reads.store(0, Ordering::SeqCst);
    (reader, source)
}

/// All of [`remote`]'s tensors prefetched within `budget`, once the workers have filled it.
fn filled(count: usize, len: usize, budget: u64) -> (Prefetched<Reader>, Arc<Remote>) {
    let (reader, source) = remote(count, len, budget);
    let prefetched = Prefetched::new(reader, PrefetchPlan::All).unwrap();
    wait_for(
        || source.fetched.load(Ordering::SeqCst) >= budget,
        "the budget to fill",
    );
    (prefetched, source)
}

/// Asks for `layers.{i}.w` of `lens[i]` bytes for each `i` in natural order (`layers.2`
/// before `layers.10`, as the plan fetches them), checking each.
fn ask_all_in_order(weights: &impl WeightSource, lens: &[usize]) {
    for (i, &len) in lens.iter().enumerate() {
        assert_eq!(value(weights, &format!("layers.{i}.w")), vec![i as u8; len]);
    }
}

fn value(weights: &impl WeightSource, name: &str) -> Vec<u8> {
    weights
        .stored_tensor(name)
        .unwrap()
        .unwrap_or_else(|| panic!("{name} missing"))
        .bytes
        .to_vec()
        .unwrap()
}

#[test]
fn a_consumer_asking_one_at_a_time_is_answered_from_a_few_batched_reads() {
    // Batches of a sixteenth of the budget, ten tensors, halved in the plan's last half budget
    // (all of these): five.
    let (reader, source) = remote(40, 1000, 160_000);
    let prefetched = Prefetched::new(reader, PrefetchPlan::All).unwrap();
    ask_all_in_order(&prefetched, &[1000; 40]);
    let fetches = source.fetches.load(Ordering::SeqCst);
    assert!(fetches <= 12, "{fetches} batched reads for 40 tensors");
    assert_eq!(
        source.fetched.load(Ordering::SeqCst),
        40 * 1000,
        "each tensor fetched once"
    );
}

#[test]
fn tensors_out_of_plan_order_or_outside_it_are_read_on_demand_and_right() {
    let (reader, _) = remote(30, 500, 4_000);
    let plan = PrefetchPlan::Names((0..10).map(|i| format!("layers.{i}.w")).collect());
    let prefetched = Prefetched::new(reader, plan).unwrap();
    for i in (0..30).rev() {
        assert_eq!(
            value(&prefetched, &format!("layers.{i}.w")),
            vec![i as u8; 500]
        );
    }
    // Asking again reads again: a prefetched tensor is handed over once.
    assert_eq!(value(&prefetched, "layers.3.w"), vec![3; 500]);
    assert!(prefetched.stored_tensor("absent").unwrap().is_none());
    assert!(prefetched.contains("layers.29.w") && !prefetched.contains("absent"));
    let names: Vec<String> = ["layers.7.w", "absent", "layers.8.w"]
        .map(String::from)
        .to_vec();
    let batch = prefetched.stored_tensors(&names).unwrap();
    assert_eq!(
        batch[0].as_ref().unwrap().bytes.to_vec().unwrap(),
        vec![7; 500]
    );
    assert!(batch[1].is_none());
    assert_eq!(
        batch[2].as_ref().unwrap().bytes.to_vec().unwrap(),
        vec![8; 500]
    );
}

#[test]
fn a_tensor_asked_for_far_ahead_of_the_plan_is_read_alone_and_the_next_batch_whole() {
    // Batches of two tensors up to the plan's last half budget; the budget holds sixteen
    // batches, and nothing is taken, so the rest wait in the plan.
    let (prefetched, source) = filled(60, 1000, 32_000);
    let fetched = || source.fetched.load(Ordering::SeqCst);
    // layers.43.w shares a batch with layers.42.w: asked for first (as a model asks for its
    // final norm), it comes alone.
    assert_eq!(value(&prefetched, "layers.43.w"), vec![43; 1000]);
    assert_eq!(
        fetched(),
        33_000,
        "bytes read for a tensor far ahead of the plan"
    );
    assert_eq!(value(&prefetched, "layers.42.w"), vec![42; 1000]);
    assert_eq!(fetched(), 34_000);
    // The consumer caught up with the plan: the next batch comes whole, its other tensor kept.
    assert_eq!(value(&prefetched, "layers.32.w"), vec![32; 1000]);
    assert_eq!(fetched(), 36_000, "bytes read for the plan's next batch");
    for i in (0..60).filter(|i| ![32, 42, 43].contains(i)) {
        assert_eq!(
            value(&prefetched, &format!("layers.{i}.w")),
            vec![i as u8; 1000]
        );
    }
    assert_eq!(fetched(), 60_000, "each tensor fetched once");
    // Every batch but the one both tensors read alone were taken out of came as a batch (the
    // tensors read alone are single reads): left in the plan, that emptied batch would have
    // stood at its front, and the tensors asked for behind it been read alone one by one.
    assert_eq!(source.fetches.load(Ordering::SeqCst), 37);
}

#[test]
fn the_plans_last_half_budget_is_fetched_in_half_batches_and_parts() {
    // Batches of two tensors, but one each for the last 16 (the last half budget).
    let (reader, source) = remote(60, 1000, 32_000);
    let prefetched = Prefetched::new(reader, PrefetchPlan::All).unwrap();
    ask_all_in_order(&prefetched, &[1000; 60]);
    assert_eq!(source.fetches.load(Ordering::SeqCst), 22 + 16);

    // Landed: batches of 128 KiB, and 64 KiB in the last 1 MiB, where the last tensor (192
    // KiB) is read in three parts, not two.
    const KIB: usize = 1024;
    let mut lens = vec![64 * KIB; 40];
    lens.push(192 * KIB);
    let (reader, source) = remote_of(container_of(&lens), 2 << 20);
    let prefetched =
        Prefetched::landing_in(reader, PrefetchPlan::All, Arc::new(Keep::default())).unwrap();
    ask_all_in_order(&prefetched, &lens);
    assert_eq!(
        source.reads.load(Ordering::SeqCst),
        3,
        "parts of the last tensor"
    );
    assert_eq!(source.fetches.load(Ordering::SeqCst), 14 + 13);
}

#[test]
fn what_is_fetched_ahead_stays_within_the_budget() {
    // Nothing is asked for, so the workers fill the budget (ten tensors of 1,000 bytes) and
    // wait. Once they have, the prefetcher is dropped and its workers end; when the last one
    // has let go of the source, every fetch there will be has been counted.
    let (prefetched, source) = filled(50, 1000, 10_000);
    drop(prefetched);
    wait_for(|| Arc::strong_count(&source) == 1, "the workers to end");
    let ahead = source.fetched.load(Ordering::SeqCst);
    assert_eq!(ahead, 10_000, "bytes fetched ahead of a 10,000-byte budget");
}

#[test]
fn tensors_land_in_the_consumers_memory_and_come_back_as_its_own() {
    let (reader, source) = remote(40, 1000, 160_000);
    let prefetched =
        Prefetched::landing_in(reader, PrefetchPlan::All, Arc::new(Keep::default())).unwrap();
    for i in 0..40 {
        let name = format!("layers.{i}.w");
        let stored = prefetched.stored_tensor(&name).unwrap().unwrap();
        let Ok(Owned(bytes)) = stored.bytes.into_allocation::<Owned>() else {
            panic!("{name} did not land in the allocator's memory");
        };
        assert_eq!(bytes, vec![i as u8; 1000]);
    }
    // Outside the plan, and asked again: read alone, into the allocator's memory too.
    let again = prefetched.stored_tensor("layers.3.w").unwrap().unwrap();
    assert!(again.bytes.into_allocation::<Owned>().is_ok());
    assert!(source.fetches.load(Ordering::SeqCst) <= 13);

    // A reader lands them itself; an allocation of the wrong length is refused, naming the
    // tensor, before anything is read.
    let (reader, source) = remote(3, 100, 0);
    let names: Vec<String> = ["layers.2.w", "absent", "layers.0.w"]
        .map(String::from)
        .to_vec();
    let landed = reader.stored_tensors_in(&names, &Keep::default()).unwrap();
    assert!(landed[1].is_none());
    let first = landed[0].clone().unwrap().bytes.into_allocation::<Owned>();
    assert!(first.is_err(), "shared with the clone still in `landed`");
    let Some(Some(last)) = landed.into_iter().nth(2) else {
        panic!("layers.0.w missing")
    };
    assert_eq!(
        last.bytes.into_allocation::<Owned>().unwrap().0,
        vec![0; 100]
    );
    let before = source.fetched.load(Ordering::SeqCst);
    let err = reader
        .stored_tensors_in(
            &names,
            &Keep {
                short: true,
                ..Keep::default()
            },
        )
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidInput, "{err}");
    assert!(err.to_string().contains("layers.2.w"), "{err}");
    assert_eq!(source.fetched.load(Ordering::SeqCst), before);
}

#[test]
fn landed_tensors_wait_beside_the_budget_in_flight_up_to_another_budget() {
    // Nothing is asked for. Landed in the consumer's memory, ready tensors do not hold the
    // budget's room for requests: more than a budget is fetched ahead, and at most two.
    let (reader, source) = remote(50, 1000, 10_000);
    let prefetched =
        Prefetched::landing_in(reader, PrefetchPlan::All, Arc::new(Keep::default())).unwrap();
    wait_for(
        || source.fetched.load(Ordering::SeqCst) > 10_000,
        "more than the budget to be fetched",
    );
    drop(prefetched);
    wait_for(|| Arc::strong_count(&source) == 1, "the workers to end");
    let ahead = source.fetched.load(Ordering::SeqCst);
    assert!(
        ahead <= 20_000,
        "{ahead} bytes fetched ahead of a 10,000-byte budget"
    );
}

/// A remote source whose reads, once `armed` (after the header is read), each wait up to five
/// seconds until `want` of them have been open at once; it records the most that were and
/// counts the batched reads and the single ones done.
#[derive(Debug)]
struct Rendezvous {
    inner: MemorySource,
    ahead: u64,
    want: usize,
    armed: AtomicBool,
    open: Mutex<usize>,
    changed: Condvar,
    most_open: AtomicUsize,
    batched: AtomicUsize,
    single: AtomicUsize,
}

impl Rendezvous {
    fn new(count: usize, len: usize, ahead: u64, want: usize) -> (Reader, Arc<Self>) {
        let source = Arc::new(Self {
            inner: MemorySource::new(container(count, len)),
            ahead,
            want,
            armed: AtomicBool::new(false),
            open: Mutex::new(0),
            changed: Condvar::new(),
            most_open: AtomicUsize::new(0),
            batched: AtomicUsize::new(0),
            single: AtomicUsize::new(0),
        });
        let reader = Reader::open(source.clone()).unwrap();
        source.armed.store(true, Ordering::SeqCst);
        (reader, source)
    }

    /// Runs `read` once `want` reads have been open at once (or five seconds passed).
    fn meet(
        &self,
        done: &AtomicUsize,
        read: impl FnOnce() -> weightbay::Result<()>,
    ) -> weightbay::Result<()> {
        let mut open = self.open.lock().unwrap();
        *open += 1;
        self.most_open.fetch_max(*open, Ordering::SeqCst);
        self.changed.notify_all();
        let (open, _) = self
            .changed
            .wait_timeout_while(open, Duration::from_secs(5), |_| {
                self.most_open.load(Ordering::SeqCst) < self.want
            })
            .unwrap();
        drop(open);
        let read = read();
        *self.open.lock().unwrap() -= 1;
        done.fetch_add(1, Ordering::SeqCst);
        read
    }
}

impl Source for Rendezvous {
    fn len(&self) -> u64 {
        self.inner.len()
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> weightbay::Result<()> {
        if !self.armed.load(Ordering::SeqCst) {
            return self.inner.read_at(offset, buf);
        }
        self.meet(&self.single, || self.inner.read_at(offset, buf))
    }
    fn fetch_into(&self, jobs: &mut [(u64, &mut [u8])]) -> weightbay::Result<()> {
        self.meet(&self.batched, || self.inner.fetch_into(jobs))
    }
    fn fetch_ahead(&self) -> u64 {
        self.ahead
    }
}

/// A prefetcher landing in a consumer's memory, over a [`Rendezvous`] of `count` tensors of
/// `len` bytes with a budget of `ahead` whose reads wait for `reads` of them, once those reads
/// are done: nothing is asked for until then, so only the prefetcher reads.
fn landed_after_reads(
    count: usize,
    len: usize,
    ahead: u64,
    reads: usize,
) -> (Prefetched<Reader>, Arc<Rendezvous>) {
    let (reader, source) = Rendezvous::new(count, len, ahead, reads);
    let prefetched =
        Prefetched::landing_in(reader, PrefetchPlan::All, Arc::new(Keep::default())).unwrap();
    let done = || source.batched.load(Ordering::SeqCst) + source.single.load(Ordering::SeqCst);
    wait_for(|| done() == reads, "the reads to be done");
    (prefetched, source)
}

#[test]
fn a_landed_batch_larger_than_the_room_left_starts_beside_the_batches_in_flight() {
    // Twelve tensors of 140 bytes against a 1,600-byte budget (batches of 100 bytes, so each
    // tensor is one): the twelfth does not fit beside the other eleven, but landed in the
    // consumer's memory it needs no room of the prefetcher's, and waiting for the others to
    // drain would leave a connection idle.
    let (prefetched, source) = landed_after_reads(12, 140, 1600, 12);
    assert_eq!(source.batched.load(Ordering::SeqCst), 12, "batched reads");
    for i in 0..12 {
        assert_eq!(
            value(&prefetched, &format!("layers.{i}.w")),
            vec![i as u8; 140]
        );
    }
    assert_eq!(
        source.most_open.load(Ordering::SeqCst),
        12,
        "batched reads open at once"
    );
}

#[test]
fn a_landed_tensor_of_many_batches_is_read_in_parts_at_once() {
    // One tensor of 640 KiB against a 1 MiB budget: ten batches' worth, read as ten reads of
    // 64 KiB, all open at once, into one allocation of the consumer's.
    let (prefetched, source) = landed_after_reads(1, 640 << 10, 1 << 20, 10);
    let stored = prefetched.stored_tensor("layers.0.w").unwrap().unwrap();
    let Ok(Owned(bytes)) = stored.bytes.into_allocation::<Owned>() else {
        panic!("the tensor did not land in the allocator's memory");
    };
    assert_eq!(bytes, vec![0; 640 << 10]);
    assert_eq!(
        source.most_open.load(Ordering::SeqCst),
        10,
        "parts read at once"
    );
    assert_eq!(
        source.single.load(Ordering::SeqCst),
        10,
        "reads of a part each"
    );
    assert_eq!(source.batched.load(Ordering::SeqCst), 0, "batched reads");
}

#[test]
fn allocations_that_fail_give_back_the_room_of_the_parts_they_counted() {
    // Twenty tensors of 640 KiB read in parts of 64 KiB against a 1 MiB budget, the first
    // seventeen allocations failing: each failure gives back the first part it had counted, or
    // seventeen of them would fill the budget and the parts of the rest would wait for ever.
    let (reader, _) = remote(20, 640 << 10, 1 << 20);
    let allocator = Arc::new(Keep {
        failures: AtomicUsize::new(17),
        ..Keep::default()
    });
    let prefetched = Prefetched::landing_in(reader, PrefetchPlan::All, allocator).unwrap();
    let (sender, received) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = sender.send(value(&prefetched, "layers.19.w"));
    });
    let last = received
        .recv_timeout(Duration::from_secs(30))
        .expect("the last tensor within 30 s");
    assert_eq!(last, vec![19; 640 << 10]);
}

/// Spins until `done`, failing the test if it never happens.
fn wait_for(done: impl Fn() -> bool, what: &str) {
    for _ in 0..100_000_000u64 {
        if done() {
            return;
        }
        std::thread::yield_now();
    }
    panic!("gave up waiting for {what}");
}

#[test]
fn a_failed_batch_surfaces_as_each_tensors_own_read() {
    let source = Arc::new(Remote {
        inner: MemorySource::new(container(10, 100)),
        ahead: 1_000,
        fetches: AtomicUsize::new(0),
        reads: AtomicUsize::new(0),
        refuse_batches: true,
        fetched: AtomicU64::new(0),
    });
    let prefetched =
        Prefetched::new(Reader::open(source.clone()).unwrap(), PrefetchPlan::All).unwrap();
    // The batches fail; each ask then reads its tensor alone, which succeeds.
    for i in 0..10 {
        assert_eq!(
            value(&prefetched, &format!("layers.{i}.w")),
            vec![i as u8; 100]
        );
    }
    assert!(
        source.fetches.load(Ordering::SeqCst) > 0,
        "no batch was tried"
    );
}

#[test]
fn a_local_source_is_passed_through_without_threads() {
    let reader = Reader::from_bytes(container(5, 10)).unwrap();
    let prefetched = Prefetched::new(reader, PrefetchPlan::All).unwrap();
    assert_eq!(prefetched.fetch_ahead(), 0);
    assert_eq!(value(&prefetched, "layers.4.w"), vec![4; 10]);
}

#[test]
fn a_sharded_set_prefetches_across_its_shards() {
    let storage = Arc::new(weightbay::MemoryStorage::new());
    let tensors = (0..12)
        .map(|i| Tensor::new(format!("layers.{i}.w"), DType::U8, [64], vec![i as u8; 64]))
        .collect();
    let summary =
        ShardedWriter::new(Writer::new(tensors).with_format(weightbay::Format::Safetensors))
            .with_shard_len(200)
            .write_to(storage.as_ref(), "m")
            .unwrap();
    assert!(summary.shards.len() > 2, "{} shards", summary.shards.len());
    let sharded = ShardedWeights::open(storage, &summary.index).unwrap();
    assert_eq!(sharded.catalog().unwrap().len(), 12);
    // Read into a consumer's memory, shard by shard.
    let names: Vec<String> = (0..12).rev().map(|i| format!("layers.{i}.w")).collect();
    let landed = sharded.stored_tensors_in(&names, &Keep::default()).unwrap();
    for (i, stored) in (0..12).rev().zip(landed) {
        let owned = stored.unwrap().bytes.into_allocation::<Owned>().unwrap();
        assert_eq!(owned.0, vec![i as u8; 64]);
    }
    let prefetched = Prefetched::with_budget(sharded, PrefetchPlan::All, 1 << 20).unwrap();
    for i in 0..12 {
        assert_eq!(
            value(&prefetched, &format!("layers.{i}.w")),
            vec![i as u8; 64]
        );
    }
}

/// Every staged byte put back where its segments say, per tensor.
fn staged(reader: &Reader, names: &[&str], pool: &StagingPool) -> Vec<Vec<u8>> {
    let mut out: Vec<Vec<u8>> = names
        .iter()
        .map(|name| vec![0xEE; reader.tensor(name).unwrap().byte_len() as usize])
        .collect();
    reader
        .stage(names, pool, |piece| {
            for segment in piece.segments() {
                let at = segment.tensor_offset as usize;
                let bytes = &piece.bytes()[segment.range.clone()];
                out[segment.tensor][at..at + bytes.len()].copy_from_slice(bytes);
            }
            Ok(())
        })
        .unwrap();
    out
}

#[test]
fn staged_tensors_arrive_whole_through_buffers_smaller_and_larger_than_them() {
    let (reader, _) = remote(20, 3000, 0);
    let names: Vec<String> = (0..20).map(|i| format!("layers.{i}.w")).collect();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    for buffer_len in [1000, 3000, 7000, 100_000] {
        let pool = StagingPool::new(3, buffer_len).unwrap();
        let out = staged(&reader, &names, &pool);
        for (i, bytes) in out.iter().enumerate() {
            assert_eq!(
                bytes,
                &vec![i as u8; 3000],
                "tensor {i}, {buffer_len}-byte buffers"
            );
        }
    }
    // A subset, repeated, out of order.
    let pool = StagingPool::new(2, 4096).unwrap();
    let subset = ["layers.9.w", "layers.1.w", "layers.9.w"];
    let out = staged(&reader, &subset, &pool);
    assert_eq!(out, [vec![9; 3000], vec![1; 3000], vec![9; 3000]]);
}

#[test]
fn staged_buffers_are_filled_whole_but_the_last() {
    let (reader, _) = remote(20, 3000, 0);
    let names: Vec<String> = (0..20).map(|i| format!("layers.{i}.w")).collect();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    for buffer_len in [1000, 7000, 25_000] {
        let pool = StagingPool::new(3, buffer_len).unwrap();
        let mut lens = Vec::new();
        reader
            .stage(&names, &pool, |staged| {
                lens.push(staged.bytes().len());
                Ok(())
            })
            .unwrap();
        lens.sort_unstable();
        // Tensors are cut where a buffer ends: one read short of a buffer, at the end.
        assert!(
            lens[1..].iter().all(|&len| len == buffer_len),
            "{buffer_len}-byte buffers read {lens:?}"
        );
    }
}

#[test]
fn staging_checks_names_first_and_stops_on_the_consumers_error() {
    let (reader, _) = remote(10, 1000, 0);
    let pool = StagingPool::new(2, 1000).unwrap();
    let err = reader
        .stage(&["layers.1.w", "nope"], &pool, |_| {
            panic!("nothing may be read")
        })
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotFound);
    let names: Vec<String> = (0..10).map(|i| format!("layers.{i}.w")).collect();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let mut seen = 0;
    let err = reader
        .stage(&names, &pool, |_| {
            seen += 1;
            Err(weightbay::Error::invalid("the device is full"))
        })
        .unwrap_err();
    assert_eq!((err.kind(), seen), (ErrorKind::InvalidInput, 1));
    // Every buffer came back: a full load through the same pool still runs.
    assert_eq!(staged(&reader, &names, &pool).len(), 10);
}

#[test]
fn a_pool_refuses_buffers_it_cannot_write_or_that_differ() {
    let err = StagingPool::from_buffers(Vec::new()).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidInput);
    let err = StagingPool::new(1, 0).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidInput);
}
