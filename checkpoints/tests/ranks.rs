//! Multi-rank saves over MemoryStorage, behind a storage that counts what reaches it: what gc
//! reports for a committed step, what a rank that runs again costs, and how an assembled
//! checkpoint's tensors are read in parts.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use weightbay::{
    CreateOptions, DType, ErrorKind, MemoryStorage, Result, Sink, Source, Storage, Tensor,
    WeightSource, Writer,
};
use weightbay_checkpoints::{Checkpoints, RankOutcome, RankSave, Region};

/// MemoryStorage, counting the sinks opened and the bytes written through them, and the
/// reads of the sources it opens, which gain from reading `ahead` bytes at once (as an object
/// store's do) when that is above 0.
#[derive(Debug, Default)]
struct Counting {
    inner: MemoryStorage,
    creates: AtomicU64,
    written: Arc<AtomicU64>,
    ahead: u64,
    reads: Arc<AtomicU64>,
}

/// A source of a [`Counting`].
#[derive(Debug)]
struct CountingSource {
    inner: Arc<dyn Source>,
    ahead: u64,
    reads: Arc<AtomicU64>,
}

impl Source for CountingSource {
    fn len(&self) -> u64 {
        self.inner.len()
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        self.reads.fetch_add(1, Ordering::SeqCst);
        self.inner.read_at(offset, buf)
    }
    fn fetch_ahead(&self) -> u64 {
        self.ahead
    }
}

struct CountingSink {
    inner: Box<dyn Sink>,
    written: Arc<AtomicU64>,
}

impl Sink for CountingSink {
    fn write(&mut self, data: &[u8]) -> Result<()> {
        self.written.fetch_add(data.len() as u64, Ordering::SeqCst);
        self.inner.write(data)
    }

    fn commit(self: Box<Self>) -> Result<()> {
        self.inner.commit()
    }
}

#[deny(clippy::missing_trait_methods)]
impl Storage for Counting {
    fn create(&self, key: &str, options: &CreateOptions) -> Result<Box<dyn Sink>> {
        self.creates.fetch_add(1, Ordering::SeqCst);
        Ok(Box::new(CountingSink {
            inner: self.inner.create(key, options)?,
            written: Arc::clone(&self.written),
        }))
    }
    fn open(&self, key: &str) -> Result<Arc<dyn Source>> {
        Ok(Arc::new(CountingSource {
            inner: self.inner.open(key)?,
            ahead: self.ahead,
            reads: Arc::clone(&self.reads),
        }))
    }
    weightbay::forward_storage!(inner => capabilities, delete, pending, clean_pending, list, list_foreign);
}

/// Rank `rank` of 2, holding its half of the rows of a 64 × 1024 f32 tensor `w` (256 KiB).
fn half(rank: u32, fill: f32) -> RankSave {
    let shape = [64u64, 1024];
    let region = Region::split(&shape, 0, 2, u64::from(rank));
    let values = vec![fill + rank as f32; region.elements() as usize];
    let tensor = Tensor::from_slice("w", region.lengths.clone(), &values);
    RankSave::new(rank, 2, Writer::new(vec![tensor])).with_slice("w", shape, region)
}

fn save_step(checkpoints: &Checkpoints, step: u64) {
    for rank in 0..2 {
        checkpoints
            .save_rank(step, half(rank, step as f32))
            .unwrap_or_else(|e| panic!("step {step}, rank {rank}: {e}"));
    }
}

#[test]
fn gc_reports_no_orphans_for_committed_multi_rank_steps() {
    let storage = Arc::new(MemoryStorage::new());
    let checkpoints = Checkpoints::over(Arc::clone(&storage) as Arc<dyn Storage>, "run");
    save_step(&checkpoints, 1);
    save_step(&checkpoints, 2);
    let report = checkpoints.gc().unwrap();
    assert_eq!(report.orphans, Vec::<String>::new(), "{report:?}");
    // The commit intent is part of its step, and stays with it.
    assert!(
        storage
            .keys()
            .iter()
            .any(|key| key == "run/step-1/ranks/committer"),
        "{:?}",
        storage.keys()
    );
    assert_eq!(checkpoints.steps().unwrap(), [1, 2]);
}

#[test]
fn a_rank_that_runs_again_after_the_commit_uploads_nothing() {
    let storage = Arc::new(Counting::default());
    let checkpoints = Checkpoints::over(Arc::clone(&storage) as Arc<dyn Storage>, "run");
    save_step(&checkpoints, 1);
    let (creates, written) = (
        storage.creates.load(Ordering::SeqCst),
        storage.written.load(Ordering::SeqCst),
    );
    match checkpoints.save_rank(1, half(0, 1.0)) {
        Ok(RankOutcome::CommittedByAnother(_)) => {}
        other => panic!("rank 0 restarted after the commit: {other:?}"),
    }
    assert_eq!(
        (
            storage.creates.load(Ordering::SeqCst) - creates,
            storage.written.load(Ordering::SeqCst) - written
        ),
        (0, 0),
        "a restarted rank wrote (sinks opened, bytes) before learning its part was committed"
    );
    // A zombie with other content is still refused by rank, and uploads nothing either.
    match checkpoints.save_rank(1, half(1, 99.0)) {
        Err(e) if e.kind() == ErrorKind::AlreadyExists && e.to_string().contains("rank 1") => {}
        other => panic!("a second rank 1 with other content: {other:?}"),
    }
    assert_eq!(
        storage.written.load(Ordering::SeqCst) - written,
        0,
        "the zombie uploaded its container"
    );
}

#[test]
fn a_tensor_one_rank_saved_whole_reads_in_parts_and_a_sliced_one_whole() {
    let storage = Arc::new(Counting {
        ahead: 1 << 20,
        ..Counting::default()
    });
    let checkpoints = Checkpoints::over(Arc::clone(&storage) as Arc<dyn Storage>, "run");
    // Rank 0 also saves `emb` (64 × 1024 f32, 256 KiB) whole; `w` is split between the ranks.
    let emb: Vec<f32> = (0..64 * 1024).map(|i| i as f32).collect();
    let whole = Tensor::from_slice("emb", [64u64, 1024], &emb);
    let shape = [64u64, 1024];
    let region = Region::split(&shape, 0, 2, 0);
    let values = vec![0.0f32; region.elements() as usize];
    let half_w = Tensor::from_slice("w", region.lengths.clone(), &values);
    checkpoints
        .save_rank(
            1,
            RankSave::new(0, 2, Writer::new(vec![half_w, whole])).with_slice("w", shape, region),
        )
        .unwrap();
    checkpoints.save_rank(1, half(1, 0.0)).unwrap();
    let weights = checkpoints.open(1).unwrap().assembled().unwrap();

    assert!(
        weights.lazy_tensor("w").unwrap().is_none(),
        "a sliced tensor"
    );
    assert!(weights.lazy_tensor("absent").unwrap().is_none());
    let lazy = weights.lazy_tensor("emb").unwrap().expect("a whole tensor");
    assert_eq!((lazy.dtype, lazy.shape), (DType::F32, vec![64, 1024]));
    let expected: Vec<u8> = emb.iter().flat_map(|v| v.to_le_bytes()).collect();
    assert_eq!(lazy.bytes.len(), expected.len());
    // Four parts of 64 KiB, one read each.
    let before = storage.reads.load(Ordering::SeqCst);
    for (i, part) in expected.chunks(64 << 10).enumerate() {
        let offset = i * (64 << 10);
        let mut buf = vec![0; part.len()];
        lazy.bytes.read_at(offset, &mut buf).unwrap();
        assert_eq!(buf, part, "the part at {offset}");
    }
    assert_eq!(storage.reads.load(Ordering::SeqCst) - before, 4, "reads");
}
