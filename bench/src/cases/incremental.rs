//! Incremental checkpoints: XXH3-128 hashing against the 5 GiB/s-per-core goal; a fine-tuning
//! shape (a model of which about 1% changes per step, in a few small tensors) saved
//! incrementally against a full save, locally (durable) and to the S3 server; a sparse
//! embedding table; loading the tenth increment of a chain against the same weights saved in
//! full; and the storage 100 steps hold with keep-last-5 retention.

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use weightbay::{Bytes, DType, Durability, Result, Storage, Tensor, Writer};
use weightbay_checkpoints::{Checkpoints, DEFAULT_CHUNK_LEN, Retention, SaveOptions};
use weightbay_conformance::strategies::noise;
use weightbay_local::LocalStorage;

use crate::context::Bench;
use crate::harness::{Data, Start, io, median, paired, print_runs, timed};
use crate::report::Row;

/// The tensors that change every step: four of 1/400 of the model each, 1% in all.
const CHANGING: usize = 4;

/// The fine-tuning shape of `total` bytes: the bench's 200-tensor model as the frozen part,
/// and [`CHANGING`] adapter tensors of 1/400 of it each, filled from `step`.
struct FineTuning {
    frozen: Vec<Tensor>,
    adapter_len: usize,
}

impl FineTuning {
    fn new(total: u64) -> Self {
        let adapter_len = (total / 400 / 4 * 4) as usize;
        let frozen = Data::big(total - (adapter_len * CHANGING) as u64).ours();
        Self {
            frozen,
            adapter_len,
        }
    }

    fn frozen_names(&self) -> Vec<String> {
        self.frozen.iter().map(|t| t.name().to_owned()).collect()
    }

    fn changed_bytes(&self) -> u64 {
        (self.adapter_len * CHANGING) as u64
    }

    fn writer(&self, step: u64, durability: Durability) -> Writer {
        let mut tensors = self.frozen.clone();
        for i in 0..CHANGING {
            tensors.push(Tensor::new(
                format!("adapter.{i}"),
                DType::F32,
                [self.adapter_len as u64 / 4],
                noise(step << 8 | i as u64, self.adapter_len),
            ));
        }
        Writer::new(tensors).with_durability(durability)
    }
}

/// A row `--only` matches by this name.
pub(crate) const INCREMENTAL_HASHING: &str = "incremental hashing";
/// A row `--only` matches by this name.
pub(crate) const INCREMENTAL_SAVE: &str = "incremental save";
/// A row `--only` matches by this name.
pub(crate) const INCREMENTAL_SPARSE: &str = "incremental sparse";
/// A row `--only` matches by this name.
pub(crate) const INCREMENTAL_LOAD: &str = "incremental load";
/// A row `--only` matches by this name.
pub(crate) const INCREMENTAL_STORAGE: &str = "incremental storage";

/// Every name [`incremental_cases`] answers to (`--only`).
pub(crate) const NAMES: &[&str] = &[
    INCREMENTAL_HASHING,
    INCREMENTAL_SAVE,
    INCREMENTAL_SPARSE,
    INCREMENTAL_LOAD,
    INCREMENTAL_STORAGE,
];

pub(crate) fn incremental_cases(b: &mut Bench<'_>) -> Result<()> {
    // Fresh each run: a chain left by an earlier run would be this run's base.
    let dir = b.dir.join("incremental");
    if dir.exists() {
        std::fs::remove_dir_all(&dir).map_err(io("clearing the incremental directory"))?;
    }
    std::fs::create_dir_all(&dir).map_err(io("creating the incremental directory"))?;
    let local: Arc<dyn Storage> = Arc::new(LocalStorage::new(&dir));
    if b.args.wants(INCREMENTAL_HASHING) {
        hashing(b)?;
    }
    let model = FineTuning::new(b.big.bytes());
    if b.args.wants(INCREMENTAL_SAVE) {
        save_rows(b, &model, &local, "local, durable", Durability::Durable)?;
        if let Some(s3) = s3("bench-incremental")? {
            save_rows(b, &model, &s3, "S3 server", Durability::Default)?;
        }
    }
    if b.args.wants(INCREMENTAL_SPARSE) {
        sparse(b, &local)?;
    }
    if b.args.wants(INCREMENTAL_LOAD) {
        load_rows(b, &model, &local, "local files")?;
        if let Some(s3) = s3("bench-incremental-load")? {
            load_rows(b, &model, &s3, "S3 server")?;
        }
    }
    if b.args.wants(INCREMENTAL_STORAGE) {
        storage_held(&model, &local)?;
    }
    Ok(())
}

/// The S3 server's storage under `prefix` (made this run's own: the server outlives runs),
/// when one is running.
fn s3(prefix: &str) -> Result<Option<Arc<dyn Storage>>> {
    match std::env::var("WEIGHTBAY_S3_URL") {
        Ok(url) => Ok(Some(Arc::new(weightbay_object_store::open_url(
            &format!("{url}/{prefix}-{}", std::process::id()),
            std::iter::empty::<(&str, &str)>(),
        )?))),
        Err(_) => {
            println!(
                "  incremental rows on S3: skipped, no S3 server (scripts/servers.sh start s3)"
            );
            Ok(None)
        }
    }
}

/// XXH3-128 of the model's bytes in 1 MiB chunks, on one core and on every core, against the
/// goal of 5 GiB/s per core.
fn hashing(b: &mut Bench<'_>) -> Result<()> {
    let data: Vec<bytes::Bytes> = b.big.tensors.iter().map(|(_, d)| d.clone()).collect();
    let total = b.big.bytes();
    let chunks: Vec<&[u8]> = data
        .iter()
        .flat_map(|d| d.chunks(DEFAULT_CHUNK_LEN as usize))
        .collect();
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    let goal = |threads: usize| {
        Duration::from_secs_f64(total as f64 / (5.0 * (1u64 << 30) as f64 * threads as f64))
    };
    for threads in [1, cores] {
        let hash = || {
            std::thread::scope(|scope| {
                for first in 0..threads {
                    let chunks = &chunks;
                    scope.spawn(move || {
                        for chunk in chunks.iter().skip(first).step_by(threads) {
                            black_box(xxhash_rust::xxh3::xxh3_128(chunk));
                        }
                    });
                }
            });
            Ok(())
        };
        let times = (0..b.table.runs)
            .map(|_| timed(hash))
            .collect::<Result<Vec<_>>>()?;
        print_runs(&times, &vec![goal(threads); times.len()]);
        b.table.push(Row {
            case: format!("incremental hashing: XXH3-128 of 1 MiB chunks, {threads} core(s)"),
            ours: median(times),
            peer: Some((format!("5 GiB/s per core x {threads}"), goal(threads))),
            bytes: total,
        });
    }
    Ok(())
}

/// An incremental save of the fine-tuning shape (hashing everything; then told which tensors
/// are frozen) against a full save of the same weights, paired, on `storage`.
fn save_rows(
    b: &mut Bench<'_>,
    model: &FineTuning,
    storage: &Arc<dyn Storage>,
    label: &str,
    durability: Durability,
) -> Result<()> {
    let full = Checkpoints::over(Arc::clone(storage), "full");
    let incremental = Checkpoints::over(Arc::clone(storage), "incremental");
    let step = std::cell::Cell::new(0u64);
    let next = || {
        step.set(step.get() + 1);
        step.get()
    };
    // The chain's full save, outside the timing.
    incremental.save_with(
        next(),
        model.writer(0, durability),
        SaveOptions::incremental(),
    )?;
    let written = std::cell::RefCell::new(Vec::new());
    let mut rows = Vec::new();
    for (what, options) in [
        ("content hashing", SaveOptions::incremental()),
        (
            "frozen tensors declared unchanged",
            SaveOptions::incremental().with_unchanged(model.frozen_names()),
        ),
    ] {
        let (ours, peer) = paired(
            b.table.runs,
            Start::Emptied,
            || {
                let step = next();
                let writer = model.writer(step, durability);
                let time = timed(|| {
                    let record = incremental.save_with(step, writer, options.clone())?;
                    written
                        .borrow_mut()
                        .push(record.containers.iter().map(|c| c.len).sum::<u64>());
                    Ok(())
                })?;
                incremental.retain(&Retention::keep_last(2))?;
                incremental.gc()?;
                Ok(time)
            },
            || {
                let step = next();
                let writer = model.writer(step, durability);
                let time = timed(|| full.save(step, writer).map(drop))?;
                full.retain(&Retention::keep_last(1))?;
                Ok(time)
            },
        )?;
        let written = std::mem::take(&mut *written.borrow_mut());
        println!(
            "  bytes written per incremental save ({what}): {:?}; changed: {} ({:.3}x the changed bytes)",
            written,
            model.changed_bytes(),
            median_u64(&written) as f64 / model.changed_bytes() as f64
        );
        rows.push(Row {
            case: format!("incremental save, fine-tuning shape (1% changes), {label}: {what}"),
            ours,
            peer: Some(("a full save (time, not throughput)".to_owned(), peer)),
            bytes: 0,
        });
    }
    for row in rows {
        b.table.push(row);
    }
    Ok(())
}

fn median_u64(values: &[u64]) -> u64 {
    let mut sorted = values.to_vec();
    sorted.sort_unstable();
    sorted.get(sorted.len() / 2).copied().unwrap_or(0)
}

/// A 1 GiB embedding table of 4 KiB rows, 0.5% of them (at random) changed per step: bytes
/// written against the bytes of the chunks those rows touch, and time against a full save.
fn sparse(b: &mut Bench<'_>, storage: &Arc<dyn Storage>) -> Result<()> {
    const ROW: usize = 4096;
    let len = (b.big.bytes() / 2) as usize / ROW * ROW;
    let rows = len / ROW;
    let mut table = Bytes::from(noise(7, len));
    let incremental = Checkpoints::over(Arc::clone(storage), "sparse");
    let full = Checkpoints::over(Arc::clone(storage), "sparse-full");
    let writer = |table: &Bytes| {
        let shared = table.clone();
        Writer::new(vec![Tensor::new(
            "embedding",
            DType::F32,
            [rows as u64, ROW as u64 / 4],
            shared,
        )])
        .with_durability(Durability::Durable)
    };
    incremental.save_with(1, writer(&table), SaveOptions::incremental())?;
    let mut state = 0x2545_F491_4F6C_DD1Du64;
    let (mut ours, mut peer, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
    for run in 0..b.table.runs {
        let step = run as u64 + 2;
        let mut touched = std::collections::BTreeSet::new();
        {
            let memory = table.make_mut()?;
            for _ in 0..rows / 200 {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                let row = (state % rows as u64) as usize;
                memory[row * ROW] = memory[row * ROW].wrapping_add(1);
                touched.insert(row * ROW / DEFAULT_CHUNK_LEN as usize);
            }
        }
        let _ = std::process::Command::new("sync").status();
        let start = Instant::now();
        let record = incremental.save_with(step, writer(&table), SaveOptions::incremental())?;
        ours.push(start.elapsed());
        let written: u64 = record.containers.iter().map(|c| c.len).sum();
        let changed = touched.len() as u64 * DEFAULT_CHUNK_LEN;
        ratios.push(written as f64 / changed as f64);
        incremental.retain(&Retention::keep_last(2))?;
        incremental.gc()?;
        let _ = std::process::Command::new("sync").status();
        peer.push(timed(|| full.save(step, writer(&table)).map(drop))?);
        full.retain(&Retention::keep_last(1))?;
        println!(
            "  sparse step {step}: {} rows changed, {} chunks touched, {written} bytes written = {:.3}x the touched chunks' bytes",
            rows / 200,
            touched.len(),
            written as f64 / changed as f64
        );
    }
    print_runs(&ours, &peer);
    b.table.push(Row {
        case: format!(
            "incremental save, {} MiB embedding table, 0.5% of rows changed, local, durable",
            len >> 20
        ),
        ours: median(ours),
        peer: Some((
            "a full save (time, not throughput)".to_owned(),
            median(peer),
        )),
        bytes: 0,
    });
    Ok(())
}

/// Loading (every tensor, through `Checkpoint::reader` and `load_all`) the tenth increment of
/// a chain against the same weights saved in full.
fn load_rows(
    b: &mut Bench<'_>,
    model: &FineTuning,
    storage: &Arc<dyn Storage>,
    label: &str,
) -> Result<()> {
    let chain = Checkpoints::over(Arc::clone(storage), "chain");
    let full = Checkpoints::over(Arc::clone(storage), "chain-full");
    for step in 0..=10 {
        let writer = model.writer(step, Durability::Flushed);
        chain.save_with(step, writer, SaveOptions::incremental())?;
    }
    full.save(10, model.writer(10, Durability::Flushed))?;
    let tenth = chain.open(10)?;
    let whole = full.open(10)?;
    println!(
        "  the tenth increment stores {} bytes and refers to {} in {} earlier containers",
        tenth.written_bytes(),
        tenth.referenced_bytes(),
        tenth.record().references().len()
    );
    let load = |checkpoint: &weightbay_checkpoints::Checkpoint| {
        let reader = checkpoint.reader()?;
        black_box(reader.load_all()?);
        Ok(())
    };
    b.table.compare(
        Start::Cached,
        &format!("incremental load: the tenth increment of a chain, {label}"),
        b.big.bytes(),
        "the same weights saved in full",
        || load(&tenth),
        || load(&whole),
    )?;
    Ok(())
}

/// 100 incremental saves of the fine-tuning shape with keep-last-5 retention and gc after
/// each: the bytes stored at the end against one full checkpoint plus the five kept
/// increments' own bytes.
fn storage_held(model: &FineTuning, storage: &Arc<dyn Storage>) -> Result<()> {
    let checkpoints = Checkpoints::over(Arc::clone(storage), "hundred");
    let started = Instant::now();
    for step in 1..=100 {
        checkpoints.save_with(
            step,
            model.writer(step, Durability::Flushed),
            SaveOptions::incremental(),
        )?;
        checkpoints.retain(&Retention::keep_last(5))?;
        checkpoints.gc()?;
    }
    let elapsed = started.elapsed();
    let stored: u64 = storage.list("hundred")?.iter().map(|l| l.len).sum();
    let kept: u64 = checkpoints
        .steps()?
        .iter()
        .map(|&step| checkpoints.open(step).map(|c| c.written_bytes()))
        .sum::<Result<u64>>()?;
    let full = model.writer(0, Durability::Flushed).size()?;
    let bound = full + kept;
    println!(
        "  100 incremental saves with keep-last-5 in {:.1} s: {stored} bytes stored = {:.3}x (one full checkpoint {full} + the kept increments' own {kept})",
        elapsed.as_secs_f64(),
        stored as f64 / bound as f64
    );
    Ok(())
}
