//! Multi-rank checkpoints' figures: the commit protocol simulated with 8 to 1,024 ranks over
//! object_store's InMemory behind 20 ms per request (time from the last manifest to a visible
//! commit against the protocol's round trips, and every request counted); 4,096 ranks against
//! the same store answering 503 above S3's per-prefix limits (each rank its own throttle and
//! retries), against the store without limits; and a resharded load from the S3 server (bytes
//! fetched against the bytes the loading rank needs, and time against the same rows of a
//! single-process checkpoint).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use weightbay::{Error, ErrorKind, Result, Storage, Tensor, Writer};
use weightbay_checkpoints::{Checkpoints, RankSave, Region};
use weightbay_object_store::{Bridge, ObjectStorage};

use crate::client::{RankClient, Retries};
use crate::context::Bench;
use crate::harness::{median, print_runs};
use crate::report::Row;
use crate::store::{PAGE, PrefixLimits, SlowStore};

/// The latency of every request in the simulation, as a cloud store's.
const LATENCY: Duration = Duration::from_millis(20);
/// Manifests the committing rank reads at once (the core's `PARALLEL_READS`).
const PARALLEL_READS: u64 = 64;

/// A row `--only` matches by this name.
pub(crate) const RANK_COMMIT: &str = "rank commit";
/// A row `--only` matches by this name.
pub(crate) const THROTTLED_COMMIT: &str = "throttled commit";
/// A row `--only` matches by this name.
pub(crate) const RESHARDED_LOAD: &str = "resharded load";

/// Every name [`ranks_cases`] answers to (`--only`).
pub(crate) const NAMES: &[&str] = &[RANK_COMMIT, THROTTLED_COMMIT, RESHARDED_LOAD];

pub(crate) fn ranks_cases(b: &mut Bench<'_>) -> Result<()> {
    if b.args.wants(THROTTLED_COMMIT) {
        throttled_commit(b)?;
    }
    if b.args.wants(RANK_COMMIT) {
        println!(
            "  rank commit: simulated ranks over InMemory, {LATENCY:?} per request and per listing page of {PAGE}"
        );
        for ranks in [8u32, 64, 256, 1024] {
            simulate(b, ranks)?;
        }
    }
    if b.args.wants(RESHARDED_LOAD) {
        resharded_load(b)?;
    }
    Ok(())
}

/// `ranks` simulated ranks save one step at once (a barrier starts them together, the
/// listing's worst case): each holds 4 rows of a [4 × ranks, 256] f32 tensor.
fn simulate(b: &mut Bench<'_>, ranks: u32) -> Result<()> {
    let mut after_last = Vec::new();
    let mut counted = None;
    for run in 0..b.table.runs {
        let store = SlowStore::new(Arc::new(object_store::memory::InMemory::new()), LATENCY);
        let counts = Arc::clone(store.counts());
        let storage: Arc<dyn Storage> = Arc::new(ObjectStorage::new(Arc::new(store))?);
        let shape = [4 * u64::from(ranks), 256];
        let start = Arc::new(Barrier::new(ranks as usize));
        let threads: Vec<_> = (0..ranks)
            .map(|rank| {
                let (storage, start) = (Arc::clone(&storage), Arc::clone(&start));
                std::thread::spawn(move || {
                    let save = rows_of(rank, ranks, shape);
                    start.wait();
                    Checkpoints::over(storage, "sim").save_rank(1, save)
                })
            })
            .collect();
        for thread in threads {
            thread
                .join()
                .map_err(|_| Error::new(ErrorKind::Io, "a simulated rank panicked"))??;
        }
        let last = counts.last_landed(|key| key.contains("/ranks/rank-"));
        let commit = counts.last_landed(|key| key.ends_with("/commit.json"));
        let (Some(last), Some(commit)) = (last, commit) else {
            return Err(Error::new(
                ErrorKind::Io,
                format!("run {run}: no commit seen"),
            ));
        };
        after_last.push(commit.saturating_duration_since(last));
        counted = Some(counts);
    }
    let counts = counted.ok_or_else(|| Error::invalid("no runs"))?;
    // The committing rank's round trips after the last manifest: the listing's pages, the
    // commit intent (a HEAD that fails fast when it exists, then a create-new PUT), one GET
    // per manifest (an open reads its first 64 KiB), PARALLEL_READS at a time, and the
    // record (HEAD, PUT).
    let pages = u64::from(ranks).div_ceil(PAGE as u64);
    let trips = pages + 2 + u64::from(ranks).div_ceil(PARALLEL_READS) + 2;
    let floor = LATENCY * trips as u32;
    print_runs(&after_last, &[floor]);
    let get = |c: &AtomicU64| c.load(Ordering::SeqCst);
    println!(
        "    {ranks} ranks: {} requests = {:.2} per rank: PUT {}, multipart {}, GET {}, HEAD {}, LIST pages {}, DELETE {}",
        counts.total(),
        counts.total() as f64 / f64::from(ranks),
        get(&counts.puts),
        get(&counts.multipart),
        get(&counts.gets),
        get(&counts.heads),
        get(&counts.list_pages),
        get(&counts.deletes),
    );
    b.table.push(Row {
        case: format!(
            "rank commit, {ranks} ranks: last manifest to visible commit ({} requests in all)",
            counts.total()
        ),
        ours: median(after_last),
        peer: Some((
            format!(
                "the protocol's {trips} round trips of {} ms",
                LATENCY.as_millis()
            ),
            floor,
        )),
        bytes: 0,
    });
    Ok(())
}

/// Simulated rank `rank` of `ranks`: its rows of a `shape` f32 tensor, each element its rank.
fn rows_of(rank: u32, ranks: u32, shape: [u64; 2]) -> RankSave {
    let region = Region::split(&shape, 0, u64::from(ranks), u64::from(rank));
    let values = vec![rank as f32; region.elements() as usize];
    let tensor = Tensor::from_slice("w", region.lengths.clone(), &values);
    RankSave::new(rank, ranks, Writer::new(vec![tensor])).with_slice("w", shape, region)
}

/// S3's documented limits per partitioned prefix.
const S3_LIMITS: PrefixLimits = PrefixLimits {
    writes_per_second: 3_500,
    reads_per_second: 5_500,
    depth: 2,
};

/// One step of `ranks` simulated ranks, started together, each with its own client (its own
/// throttle, object_store's retries) of one store 20 ms away, limited per prefix when
/// `limits` says so. Returns the time from the start to a visible commit record.
fn throttled_step(ranks: u32, limits: Option<PrefixLimits>) -> Result<(Duration, ThrottledRun)> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(crate::harness::io("starting a runtime"))?;
    let bridge = Bridge::borrowed(runtime.handle().clone());
    let slow = SlowStore::new(Arc::new(object_store::memory::InMemory::new()), LATENCY);
    let slow = match limits {
        Some(limits) => slow.with_prefix_limits(limits),
        None => slow,
    };
    let counts = Arc::clone(slow.counts());
    let shared: Arc<dyn object_store::ObjectStore> = Arc::new(slow);
    let retries = Arc::new(Retries::default());
    let shape = [4 * u64::from(ranks), 64];
    let start = Arc::new(Barrier::new(ranks as usize + 1));
    let threads: Vec<_> = (0..ranks)
        .map(|rank| {
            let client = RankClient::new(Arc::clone(&shared), Arc::clone(&retries));
            let storage: Arc<dyn Storage> =
                Arc::new(ObjectStorage::with_bridge(Arc::new(client), bridge.clone()));
            let start = Arc::clone(&start);
            std::thread::Builder::new()
                .stack_size(256 << 10)
                .spawn(move || {
                    let save = rows_of(rank, ranks, shape);
                    start.wait();
                    Checkpoints::over(storage, "sim").save_rank(1, save)
                })
                .map_err(crate::harness::io("starting a simulated rank"))
        })
        .collect::<Result<_>>()?;
    start.wait();
    let started = Instant::now();
    let mut failed = 0;
    for thread in threads {
        let outcome = thread
            .join()
            .map_err(|_| Error::new(ErrorKind::Io, "a simulated rank panicked"))?;
        if outcome.is_err() {
            failed += 1;
        }
    }
    let commit = counts
        .last_landed(|key| key.ends_with("/commit.json"))
        .ok_or_else(|| {
            Error::new(
                ErrorKind::Io,
                format!("{ranks} ranks: no commit ({failed} ranks failed)"),
            )
        })?;
    let run = ThrottledRun {
        requests: counts.total(),
        slow_downs: counts.throttled.load(Ordering::SeqCst),
        retries: retries.0.load(Ordering::SeqCst),
        failed,
        peak_writes: counts.peak_writes.load(Ordering::SeqCst),
        peak_reads: counts.peak_reads.load(Ordering::SeqCst),
    };
    Ok((commit.saturating_duration_since(started), run))
}

/// What one throttled step cost.
struct ThrottledRun {
    requests: u64,
    slow_downs: u64,
    retries: u64,
    failed: u32,
    /// The most writes and reads one prefix was sent in a second.
    peak_writes: u64,
    peak_reads: u64,
}

impl std::fmt::Display for ThrottledRun {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} requests, {} answered 503, {} retries, {} ranks failed, at most {} writes/s and {} reads/s sent to one prefix",
            self.requests,
            self.slow_downs,
            self.retries,
            self.failed,
            self.peak_writes,
            self.peak_reads
        )
    }
}

/// 4,096 ranks commit one step against a store answering 503 above S3's per-prefix limits,
/// with the step directory one prefix (as a fresh S3 bucket has it) and split by the segment
/// below it (as S3 has it once it has partitioned a busy prefix: the ranks' containers are in
/// save directories of their own, the manifests in `ranks/`), each against the same store
/// without limits.
fn throttled_commit(b: &mut Bench<'_>) -> Result<()> {
    const RANKS: u32 = 4096;
    println!(
        "  throttled commit: {RANKS} simulated ranks over InMemory, {LATENCY:?} per request, each rank its own throttle and object_store's retries; the limited store answers 503 SlowDown above {} writes/s and {} reads/s per prefix",
        S3_LIMITS.writes_per_second, S3_LIMITS.reads_per_second
    );
    let layouts = [
        (S3_LIMITS, "one prefix per step directory"),
        (
            PrefixLimits {
                depth: 3,
                ..S3_LIMITS
            },
            "a prefix per save directory and one for the manifests",
        ),
    ];
    for (limits, layout) in layouts {
        let (mut limited, mut free) = (Vec::new(), Vec::new());
        let mut last = None;
        for _ in 0..b.table.runs {
            let (time, run) = throttled_step(RANKS, Some(limits))?;
            println!(
                "    {layout}: commit after {:.2} s, {run}",
                time.as_secs_f64()
            );
            limited.push(time);
            last = Some(run);
            let (time, run) = throttled_step(RANKS, None)?;
            println!(
                "    without limits: commit after {:.2} s, {} requests",
                time.as_secs_f64(),
                run.requests
            );
            free.push(time);
        }
        print_runs(&limited, &free);
        let run = last.ok_or_else(|| Error::invalid("no runs"))?;
        b.table.push(Row {
            case: format!(
                "throttled commit, {RANKS} ranks, S3's per-prefix limits, {layout}: start to visible commit ({run}; last run)"
            ),
            ours: median(limited),
            peer: Some((
                "the same step on the store without limits".to_owned(),
                median(free),
            )),
            bytes: 0,
        });
    }
    Ok(())
}

/// 1 GiB written to the S3 server by 4 ranks as row slices (16 tensors of 4096 × 4096 f32),
/// loaded by each of 3 ranks as its third of the rows.
fn resharded_load(b: &mut Bench<'_>) -> Result<()> {
    let Ok(url) = std::env::var("WEIGHTBAY_S3_URL") else {
        println!(
            "  resharded load: skipped, no S3 server (vars=$(scripts/servers.sh start s3) && eval \"$vars\")"
        );
        return Ok(());
    };
    let s3 = weightbay_object_store::open_url(&url, std::iter::empty::<(&str, &str)>())?;
    let counted = SlowStore::new(Arc::clone(s3.store()), Duration::ZERO);
    let counts = Arc::clone(counted.counts());
    let storage: Arc<dyn Storage> = Arc::new(
        ObjectStorage::new(Arc::new(counted))?
            .with_prefix(s3.prefix().as_ref())?
            .with_options(*s3.options()),
    );
    let (tensors, rows, columns) = (16usize, 4096u64, 4096u64);
    let shape = [rows, columns];
    let names: Vec<String> = (0..tensors).map(|t| format!("layers.{t}.w")).collect();
    let value = |t: usize, row: u64| (t as u64 * rows + row) as f32;
    let prefix = format!("bench-ranks-{}", std::process::id());
    let multi = Checkpoints::over(Arc::clone(&storage), format!("{prefix}/multi"));
    let single = Checkpoints::over(Arc::clone(&storage), format!("{prefix}/single"));
    for rank in 0..4u32 {
        let region = Region::split(&shape, 0, 4, u64::from(rank));
        let save = names.iter().enumerate().fold(
            RankSave::new(
                rank,
                4,
                Writer::new(
                    names
                        .iter()
                        .enumerate()
                        .map(|(t, name)| {
                            let first = region.offsets[0];
                            let values: Vec<f32> = (0..region.elements())
                                .map(|i| value(t, first + i / columns))
                                .collect();
                            Tensor::from_slice(name, region.lengths.clone(), &values)
                        })
                        .collect(),
                ),
            ),
            |save, (_, name)| save.with_slice(name, shape, region.clone()),
        );
        multi.save_rank(1, save)?;
    }
    let whole: Vec<Tensor> = names
        .iter()
        .enumerate()
        .map(|(t, name)| {
            let values: Vec<f32> = (0..rows * columns).map(|i| value(t, i / columns)).collect();
            Tensor::from_slice(name, shape, &values)
        })
        .collect();
    single.save(1, Writer::new(whole))?;
    let assembled = multi.open(1)?.assembled()?;
    let reader = single.open(1)?.reader()?;
    let total: u64 = rows * columns * 4 * tensors as u64;
    // Every loading rank's third of the rows, read once to open the containers first.
    for name in &names {
        assembled.read_region(name, &Region::new([0, 0], [1, 1]))?;
        assembled.read_region(name, &Region::new([rows - 1, 0], [1, 1]))?;
    }
    let (mut ours, mut peer, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
    let mut needed_all = 0;
    for run in 0..b.table.runs {
        let k = (run % 3) as u64;
        let region = Region::split(&shape, 0, 3, k);
        let wanted: Vec<(&str, Region)> =
            names.iter().map(|n| (n.as_str(), region.clone())).collect();
        counts.bytes_got.store(0, Ordering::SeqCst);
        let started = Instant::now();
        let loaded = assembled.read_regions(&wanted)?;
        ours.push(started.elapsed());
        let fetched = counts.bytes_got.load(Ordering::SeqCst);
        let needed: u64 = loaded.iter().map(|b| b.len() as u64).sum();
        needed_all = needed;
        for (t, bytes) in loaded.iter().enumerate() {
            let data = bytes.read(weightbay::AccessPolicy::AllowCopy)?;
            let first = f32::from_le_bytes([data[0], data[1], data[2], data[3]]);
            if first != value(t, region.offsets[0]) {
                return Err(Error::new(
                    ErrorKind::Corrupt,
                    "a resharded load read wrong rows",
                ));
            }
        }
        ratios.push(fetched as f64 / needed as f64);
        // The peer: the same rows of the single-process container, one range per tensor.
        let ranges: Vec<_> = reader
            .tensors()
            .iter()
            .map(|info| {
                let row = columns * 4;
                let start = info.range().start + region.offsets[0] * row;
                start..start + region.lengths[0] * row
            })
            .collect();
        let started = Instant::now();
        drop(std::hint::black_box(reader.source().fetch(&ranges)?));
        peer.push(started.elapsed());
    }
    print_runs(&ours, &peer);
    println!(
        "    bytes fetched / bytes needed, each run: {}",
        ratios
            .iter()
            .map(|r| format!("{r:.4}"))
            .collect::<Vec<_>>()
            .join(" ")
    );
    let worst = ratios.iter().copied().fold(0.0, f64::max);
    b.table.push(Row {
        case: format!(
            "resharded load from the S3 server: 4 row-slice writers, 3 row readers, 1/3 of {} MiB each (fetched {worst:.3}× the bytes needed, goal ≤ 1.1×)",
            total >> 20
        ),
        ours: median(ours),
        peer: Some((
            "the same rows of a single-process checkpoint, one range per tensor".to_owned(),
            median(peer),
        )),
        bytes: needed_all,
    });
    for step in [&multi, &single] {
        step.delete_step(1)?;
    }
    Ok(())
}
