//! Multi-rank checkpoints over MemoryStorage: resharding to any layout (a property over
//! random shapes and slicings), the requests each rank and the commit cost, the barrier that
//! replaces the listing, and the refusals of bad slice sets. The conformance case
//! `multi_rank_commit` runs the commit protocol on every backend.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Barrier, Mutex};

use proptest::prelude::*;
use weightbay::{
    Capabilities, CreateOptions, DType, ErrorKind, Listed, MemoryStorage, Sink, Source, Storage,
    Tensor, Writer,
};
use weightbay_checkpoints::{Checkpoints, RankOutcome, RankSave, Region, StepState};
use weightbay_conformance::ranked::{SlicedModel, Split};

/// The whole model saved by `world` ranks, one after another.
fn save_all(checkpoints: &Checkpoints, step: u64, model: &SlicedModel, world: u32) {
    for rank in 0..world {
        let outcome = checkpoints
            .save_rank(step, model.rank_save(rank, world, Writer::new))
            .unwrap();
        assert_eq!(
            matches!(outcome, RankOutcome::Committed(_)),
            rank + 1 == world,
            "rank {rank}: {outcome:?}"
        );
    }
}

fn shape_and_splits() -> impl Strategy<Value = (Vec<u64>, usize, usize, u32, u32)> {
    prop::collection::vec(1u64..9, 1..4).prop_flat_map(|shape| {
        let dims = shape.len();
        (Just(shape), 0..dims, 0..dims, 1u32..6, 1u32..6)
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Written by one rank layout, loaded by another: every rank of the new layout reads
    /// exactly its part of the original tensors, and one rank reads them whole.
    #[test]
    fn any_layout_loads_what_any_layout_wrote(
        (shape, write_dim, read_dim, writers, readers) in shape_and_splits(),
        step in 0u64..1000,
    ) {
        let model = SlicedModel::new(step, &[
            ("t", DType::F32, &shape, Split::Along(write_dim)),
            ("u", DType::U8, &shape, Split::Along(read_dim)),
            ("whole", DType::I16, &[3], Split::Whole),
        ]);
        let checkpoints = Checkpoints::new(MemoryStorage::new(), "run");
        save_all(&checkpoints, step, &model, writers);
        let weights = checkpoints.open(step).unwrap().assembled().unwrap();
        for t in &model.tensors {
            prop_assert_eq!(&weights.read(&t.name).unwrap().to_vec().unwrap(), &t.bytes);
            for k in 0..u64::from(readers) {
                let region = Region::split(&t.shape, read_dim.min(t.shape.len().saturating_sub(1)), u64::from(readers), k);
                let read = weights.read_region(&t.name, &region).unwrap().to_vec().unwrap();
                prop_assert_eq!(read, model.region_bytes(t, &region), "{} {:?}", t.name, region);
            }
        }
    }
}

#[test]
fn four_row_writers_load_as_three_column_readers_and_one_whole() {
    let model = SlicedModel::new(
        7,
        &[
            ("w", DType::F32, &[40, 12], Split::Along(0)),
            ("v", DType::BF16, &[41, 3, 5], Split::Along(0)),
        ],
    );
    let checkpoints = Checkpoints::new(MemoryStorage::new(), "run");
    save_all(&checkpoints, 7, &model, 4);
    let weights = checkpoints.open(7).unwrap().weights().unwrap();
    for t in &model.tensors {
        let whole = weights.stored_tensor(&t.name).unwrap().unwrap();
        assert_eq!(
            (whole.dtype.clone(), whole.shape.clone()),
            (t.dtype.clone(), t.shape.clone())
        );
        assert_eq!(whole.bytes.to_vec().unwrap(), t.bytes);
    }
    let assembled = checkpoints.open(7).unwrap().assembled().unwrap();
    for t in &model.tensors {
        let last = t.shape.len() - 1;
        let columns: Vec<Vec<u8>> = (0..3)
            .map(|k| {
                let region = Region::split(&t.shape, last, 3, k);
                let read = assembled.read_region(&t.name, &region).unwrap();
                assert_eq!(read.to_vec().unwrap(), model.region_bytes(t, &region));
                read.to_vec().unwrap()
            })
            .collect();
        assert_eq!(columns.iter().map(Vec::len).sum::<usize>(), t.bytes.len());
    }
}

/// Storage calls by kind, and bytes read, in front of a MemoryStorage.
#[derive(Debug, Default)]
struct Counting {
    inner: MemoryStorage,
    calls: Arc<Mutex<BTreeMap<&'static str, u64>>>,
    bytes_read: Arc<AtomicU64>,
}

impl Counting {
    fn count(&self, kind: &'static str) {
        *self.calls.lock().unwrap().entry(kind).or_default() += 1;
    }
    fn take(&self) -> BTreeMap<&'static str, u64> {
        std::mem::take(&mut self.calls.lock().unwrap())
    }
}

/// A source whose reads are counted in bytes.
#[derive(Debug)]
struct CountedSource {
    inner: Arc<dyn Source>,
    bytes_read: Arc<AtomicU64>,
}

impl Source for CountedSource {
    fn len(&self) -> u64 {
        self.inner.len()
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> weightbay::Result<()> {
        self.bytes_read
            .fetch_add(buf.len() as u64, Ordering::Relaxed);
        self.inner.read_at(offset, buf)
    }
}

#[deny(clippy::missing_trait_methods)]
impl Storage for Counting {
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }
    fn create(&self, key: &str, options: &CreateOptions) -> weightbay::Result<Box<dyn Sink>> {
        self.count("create");
        self.inner.create(key, options)
    }
    fn open(&self, key: &str) -> weightbay::Result<Arc<dyn Source>> {
        self.count("open");
        Ok(Arc::new(CountedSource {
            inner: self.inner.open(key)?,
            bytes_read: Arc::clone(&self.bytes_read),
        }))
    }
    fn delete(&self, key: &str) -> weightbay::Result<()> {
        self.count("delete");
        self.inner.delete(key)
    }
    fn pending(&self, prefix: &str) -> weightbay::Result<Vec<weightbay::PendingWrite>> {
        self.count("pending");
        self.inner.pending(prefix)
    }
    fn clean_pending(&self, prefix: &str) -> weightbay::Result<Vec<weightbay::PendingWrite>> {
        self.count("clean_pending");
        self.inner.clean_pending(prefix)
    }
    fn list(&self, prefix: &str) -> weightbay::Result<Vec<Listed>> {
        self.count("list");
        self.inner.list(prefix)
    }
    fn list_foreign(&self, prefix: &str) -> weightbay::Result<Vec<weightbay::ForeignEntry>> {
        self.count("list_foreign");
        self.inner.list_foreign(prefix)
    }
}

/// What the docs state: a rank costs a look for its own manifest (a restart finds it there and
/// uploads nothing), its announcement, its container, one create-new manifest and one listing;
/// the committing rank adds the commit intent's create-new, one read per manifest and the
/// commit record's create-new (no container is opened: every announcement is young).
#[test]
fn a_rank_costs_its_upload_a_manifest_and_a_listing_and_the_commit_a_read_per_manifest() {
    let storage = Arc::new(Counting::default());
    let checkpoints = Checkpoints::over(storage.clone(), "run");
    let model = SlicedModel::small(1, 20);
    let world = 6;
    let per_rank = BTreeMap::from([("create", 3), ("list", 1), ("open", 1)]);
    for rank in 0..world - 1 {
        checkpoints
            .save_rank(1, model.rank_save(rank, world, Writer::new))
            .unwrap();
        assert_eq!(storage.take(), per_rank, "rank {rank}");
    }
    checkpoints
        .save_rank(1, model.rank_save(world - 1, world, Writer::new))
        .unwrap();
    let committing = BTreeMap::from([("create", 5), ("list", 1), ("open", u64::from(world) + 1)]);
    assert_eq!(storage.take(), committing);
}

/// With a process group's barrier instead of the listing, rank 0 commits and nobody lists.
#[test]
fn a_barrier_replaces_the_listing() {
    let storage = Arc::new(Counting::default());
    let checkpoints = Checkpoints::over(storage.clone(), "run");
    let model = SlicedModel::small(3, 11);
    let world = 4;
    let barrier = Arc::new(Barrier::new(world as usize));
    let ranks: Vec<_> = (0..world)
        .map(|rank| {
            let barrier = Arc::clone(&barrier);
            let save = model
                .rank_save(rank, world, Writer::new)
                .with_rendezvous(move || {
                    barrier.wait();
                    Ok(rank == 0)
                });
            let checkpoints = checkpoints.clone();
            std::thread::spawn(move || checkpoints.save_rank(3, save).unwrap())
        })
        .collect();
    let outcomes: Vec<RankOutcome> = ranks.into_iter().map(|r| r.join().unwrap()).collect();
    assert!(
        matches!(outcomes[0], RankOutcome::Committed(_)),
        "{outcomes:?}"
    );
    assert!(outcomes[1..].iter().all(|o| *o == RankOutcome::Committing));
    assert!(!storage.take().contains_key("list"));
    assert_eq!(checkpoints.steps().unwrap(), [3]);
}

/// Two ranks' row slices of a tensor of `rows` rows, rank r's starting at row `r * stride`:
/// the commit must be refused with an error naming the tensor and saying `why`.
fn refused_slice_set(name: &str, rows: u64, stride: u64, why: &str) {
    let checkpoints = Checkpoints::new(MemoryStorage::new(), "run");
    for rank in 0..2u32 {
        let region = Region::new([u64::from(rank) * stride, 0], [2, 2]);
        let writer = Writer::new(vec![Tensor::from_slice(name, [2, 2], &[1u8, 2, 3, 4])]);
        let save = RankSave::new(rank, 2, writer).with_slice(name, [rows, 2], region);
        let result = checkpoints.save_rank(1, save);
        if rank == 1 {
            let error = result.unwrap_err();
            assert_eq!(error.kind(), ErrorKind::InvalidInput);
            assert!(error.to_string().contains(&format!("`{name}`")), "{error}");
            assert!(error.to_string().contains(why), "{error}");
        }
    }
    assert_eq!(checkpoints.list().unwrap()[0].state, StepState::Uncommitted);
}

#[test]
fn slices_that_leave_a_gap_are_refused_naming_the_tensor() {
    // Rows 0..2 and 3..5 of 5 rows: row 2 is nobody's.
    refused_slice_set("gappy", 5, 3, "8 of its 10");
}

#[test]
fn slices_that_overlap_are_refused_even_when_the_element_count_adds_up() {
    // Rows 0..2 and 1..3 of 4 rows: row 1 twice, row 3 never, 8 elements in all.
    refused_slice_set("twice", 4, 1, "overlap");
}

#[test]
fn bad_rank_saves_are_refused_before_anything_is_written() {
    let storage = Arc::new(MemoryStorage::new());
    let checkpoints = Checkpoints::over(storage.clone(), "run");
    let tensor = || Tensor::from_slice("w", [2, 2], &[1u8, 2, 3, 4]);
    let cases = [
        (
            RankSave::new(4, 4, Writer::new(vec![tensor()])),
            "rank 4 of a world of 4",
        ),
        (
            RankSave::new(0, 2, Writer::new(vec![tensor()])).with_slice(
                "w",
                [3, 2],
                Region::new([2, 0], [2, 2]),
            ),
            "dimension 0",
        ),
        (
            RankSave::new(0, 2, Writer::new(vec![tensor()])).with_slice(
                "w",
                [4, 2],
                Region::new([0, 0], [1, 2]),
            ),
            "its region",
        ),
        (
            RankSave::new(0, 2, Writer::new(vec![tensor()])).with_slice(
                "x",
                [4, 2],
                Region::new([0, 0], [2, 2]),
            ),
            "no tensor `x`",
        ),
    ];
    for (save, expected) in cases {
        let error = checkpoints.save_rank(1, save).unwrap_err();
        assert_eq!(error.kind(), ErrorKind::InvalidInput);
        let text = format!("{error} {:?}", std::error::Error::source(&error));
        assert!(text.contains(expected), "{text}");
    }
    assert!(storage.list("run").unwrap().is_empty());
}

/// Reading a column of a row-sliced tensor fetches only the runs that hold it, merged across
/// gaps only within the 10% allowance.
#[test]
fn a_region_read_fetches_at_most_a_tenth_more_than_it_needs() {
    let storage = Arc::new(Counting::default());
    let bytes = Arc::clone(&storage.bytes_read);
    let checkpoints = Checkpoints::over(storage, "run");
    let model = SlicedModel::new(1, &[("w", DType::F32, &[256, 64], Split::Along(0))]);
    save_all(&checkpoints, 1, &model, 4);
    let weights = checkpoints.open(1).unwrap().assembled().unwrap();
    for region in [
        Region::split(&[256, 64], 0, 3, 1),
        Region::split(&[256, 64], 1, 3, 2),
        Region::new([10, 5], [100, 50]),
    ] {
        // Every container's reader opens (its header read) before counting starts.
        weights.read("w").unwrap();
        bytes.store(0, Ordering::Relaxed);
        let read = weights.read_region("w", &region).unwrap();
        let fetched = bytes.load(Ordering::Relaxed);
        let needed = read.len() as u64;
        assert!(
            fetched * 10 <= needed * 11,
            "{region:?}: fetched {fetched} bytes for {needed}"
        );
    }
}

/// Sixteen ranks finishing together: one commits, the others that saw every manifest leave it
/// to that one, and the manifests are read once, not once per rank that saw them all.
#[test]
fn ranks_finishing_together_read_the_manifests_once() {
    let storage = Arc::new(Counting::default());
    let checkpoints = Checkpoints::over(storage.clone(), "run");
    let model = SlicedModel::small(5, 40);
    let world = 16;
    let together = Arc::new(Barrier::new(world as usize));
    let ranks: Vec<_> = (0..world)
        .map(|rank| {
            let (checkpoints, together) = (checkpoints.clone(), Arc::clone(&together));
            let save = model.rank_save(rank, world, Writer::new);
            std::thread::spawn(move || {
                together.wait();
                checkpoints.save_rank(5, save).unwrap()
            })
        })
        .collect();
    let outcomes: Vec<RankOutcome> = ranks.into_iter().map(|r| r.join().unwrap()).collect();
    let committed = outcomes
        .iter()
        .filter(|o| matches!(o, RankOutcome::Committed(_)))
        .count();
    assert_eq!(committed, 1, "{outcomes:?}");
    assert!(
        outcomes.iter().all(|o| matches!(
            o,
            RankOutcome::Committed(_) | RankOutcome::Committing | RankOutcome::Written { .. }
        )),
        "{outcomes:?}"
    );
    // Each rank's look for a manifest of its own (a restart's), then the committer's one read
    // of each manifest.
    assert_eq!(storage.take().get("open"), Some(&(2 * u64::from(world))));
    assert_eq!(checkpoints.steps().unwrap(), [5]);
}

/// A commit record edited to disagree with the containers (another dtype, a shape far larger
/// than what is stored, slices moved to overlap while their element count still adds up)
/// gives a clear error when read, never a panic, a huge allocation or zeros for what no slice
/// holds.
#[test]
fn a_record_that_disagrees_with_its_containers_is_refused_when_read() {
    let model = SlicedModel::new(2, &[("w", DType::F32, &[8, 4], Split::Along(0))]);
    for (from, to) in [
        ("\"dtype\": \"F32\"", "\"dtype\": \"F16\""),
        (
            "\"shape\": [\n        8,",
            "\"shape\": [\n        800000000000,",
        ),
        (
            "\"offsets\": [\n              4,",
            "\"offsets\": [\n              3,",
        ),
    ] {
        let storage = Arc::new(MemoryStorage::new());
        let checkpoints = Checkpoints::over(storage.clone(), "run");
        save_all(&checkpoints, 2, &model, 2);
        let key = "run/step-2/commit.json";
        let source = storage.open(key).unwrap();
        let mut record = vec![0; source.len() as usize];
        source.read_at(0, &mut record).unwrap();
        let edited = String::from_utf8(record).unwrap().replacen(from, to, 1);
        assert!(edited.contains(to), "the edit `{to}` did not apply");
        storage.delete(key).unwrap();
        let mut sink = storage.create(key, &CreateOptions::default()).unwrap();
        sink.write(edited.as_bytes()).unwrap();
        sink.commit().unwrap();
        let weights = checkpoints.open(2).unwrap().assembled().unwrap();
        let error = weights.read("w").unwrap_err();
        assert_eq!(error.kind(), ErrorKind::Corrupt, "{to}: {error}");
        // The stored box read into memory of its own size: refused alike where the slices
        // overlap (a box the slices do cover, under the larger shape, reads fine).
        if to.contains("offsets") {
            let mut target = vec![0; 8 * 4 * 4];
            let error = weights
                .read_regions_into(&mut [("w", Region::new([0, 0], [8, 4]), &mut target)])
                .unwrap_err();
            assert_eq!(error.kind(), ErrorKind::Corrupt, "{to}: {error}");
        }
    }
}

/// Regions asked for together may overlap, and may be exactly a stored slice: each reads
/// what it asked for, into memory of its own or into the caller's. A target of the wrong
/// length is refused before any read.
#[test]
fn regions_read_together_each_get_their_bytes() {
    let model = SlicedModel::new(4, &[("w", DType::U16, &[12, 10], Split::Along(0))]);
    let checkpoints = Checkpoints::new(MemoryStorage::new(), "run");
    save_all(&checkpoints, 4, &model, 3);
    let weights = checkpoints.open(4).unwrap().assembled().unwrap();
    let regions = [
        Region::new([0, 0], [12, 10]),
        Region::new([2, 3], [7, 5]),
        Region::new([3, 0], [6, 10]),
        Region::new([5, 0], [2, 10]),
        Region::split(&[12, 10], 0, 3, 1),
    ];
    let expected: Vec<Vec<u8>> = regions
        .iter()
        .map(|region| model.region_bytes(&model.tensors[0], region))
        .collect();
    let wanted: Vec<(&str, Region)> = regions.iter().map(|r| ("w", r.clone())).collect();
    let read: Vec<Vec<u8>> = weights
        .read_regions(&wanted)
        .unwrap()
        .iter()
        .map(|bytes| bytes.to_vec().unwrap())
        .collect();
    assert_eq!(read, expected, "read into memory of its own");
    let mut targets: Vec<Vec<u8>> = expected.iter().map(|e| vec![0xAA; e.len()]).collect();
    let mut wanted: Vec<(&str, Region, &mut [u8])> = regions
        .iter()
        .zip(targets.iter_mut())
        .map(|(r, t)| ("w", r.clone(), t.as_mut_slice()))
        .collect();
    weights.read_regions_into(&mut wanted).unwrap();
    assert_eq!(targets, expected, "read into the caller's memory");
    let mut short = vec![0; 10];
    let error = weights
        .read_regions_into(&mut [("w", Region::new([0, 0], [1, 10]), &mut short)])
        .unwrap_err();
    assert_eq!(error.kind(), ErrorKind::InvalidInput, "{error}");
}
