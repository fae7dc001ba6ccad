//! Multi-rank saves over MemoryStorage, behind a storage that counts what reaches it: what gc
//! reports for a committed step, and what a rank that runs again costs.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use weightbay::{
    Capabilities, CreateOptions, ErrorKind, Listed, MemoryStorage, Result, Sink, Source, Storage,
    Tensor, Writer,
};
use weightbay_checkpoints::{Checkpoints, RankOutcome, RankSave, Region};

/// MemoryStorage, counting the sinks opened and the bytes written through them.
#[derive(Debug, Default)]
struct Counting {
    inner: MemoryStorage,
    creates: AtomicU64,
    written: Arc<AtomicU64>,
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

impl Storage for Counting {
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }
    fn create(&self, key: &str, options: &CreateOptions) -> Result<Box<dyn Sink>> {
        self.creates.fetch_add(1, Ordering::SeqCst);
        Ok(Box::new(CountingSink {
            inner: self.inner.create(key, options)?,
            written: Arc::clone(&self.written),
        }))
    }
    fn open(&self, key: &str) -> Result<Arc<dyn Source>> {
        self.inner.open(key)
    }
    fn delete(&self, key: &str) -> Result<()> {
        self.inner.delete(key)
    }
    fn list(&self, prefix: &str) -> Result<Vec<Listed>> {
        self.inner.list(prefix)
    }
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
