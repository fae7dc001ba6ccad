//! Multi-rank checkpoints' figures: the commit protocol simulated with 8, 64 and 256 ranks
//! over object_store's InMemory behind 20 ms per request (time from the last manifest to a
//! visible commit against the protocol's round trips, and every request counted), and a
//! resharded load from the S3 server (bytes fetched against the bytes the loading rank
//! needs, and time against the same rows of a single-process checkpoint).

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Barrier, Mutex, PoisonError};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use futures::StreamExt;
use futures::stream::BoxStream;
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore,
    PutMultipartOptions, PutOptions, PutPayload, PutResult, UploadPart,
};
use weightbay::{Error, ErrorKind, Result, Storage, Tensor, Writer};
use weightbay_checkpoints::{Checkpoints, RankSave, Region};
use weightbay_object_store::ObjectStorage;

use crate::{Bench, Row, median, print_runs};

/// The latency of every request in the simulation, as a cloud store's.
const LATENCY: Duration = Duration::from_millis(20);
/// Keys per listing page, as S3, GCS and Azure return them.
const PAGE: usize = 1000;
/// Manifests the committing rank reads at once (the core's `PARALLEL_READS`).
const PARALLEL_READS: u64 = 64;

/// Requests by kind, and when manifests and the commit record landed.
#[derive(Debug, Default)]
struct Counts {
    puts: AtomicU64,
    multipart: AtomicU64,
    gets: AtomicU64,
    heads: AtomicU64,
    list_pages: AtomicU64,
    deletes: AtomicU64,
    bytes_got: AtomicU64,
    last_manifest: Mutex<Option<Instant>>,
    commit: Mutex<Option<Instant>>,
}

impl Counts {
    fn total(&self) -> u64 {
        [
            &self.puts,
            &self.multipart,
            &self.gets,
            &self.heads,
            &self.list_pages,
            &self.deletes,
        ]
        .iter()
        .map(|c| c.load(Ordering::SeqCst))
        .sum()
    }

    fn landed(&self, location: &Path) {
        let now = Some(Instant::now());
        let key = location.as_ref();
        let lock = |m: &Mutex<Option<Instant>>| {
            *m.lock().unwrap_or_else(PoisonError::into_inner) = now;
        };
        if key.ends_with("/commit.json") {
            lock(&self.commit);
        } else if key.contains("/ranks/rank-") {
            lock(&self.last_manifest);
        }
    }
}

/// `inner` behind `latency` per request (per page of a listing), every request counted.
#[derive(Debug)]
struct Counted {
    inner: Arc<dyn ObjectStore>,
    latency: Duration,
    counts: Arc<Counts>,
}

impl fmt::Display for Counted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Counted({}, {:?} per request)", self.inner, self.latency)
    }
}

#[async_trait]
impl ObjectStore for Counted {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        self.counts.puts.fetch_add(1, Ordering::SeqCst);
        tokio::time::sleep(self.latency).await;
        let put = self.inner.put_opts(location, payload, opts).await?;
        self.counts.landed(location);
        Ok(put)
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        self.counts.multipart.fetch_add(1, Ordering::SeqCst);
        tokio::time::sleep(self.latency).await;
        Ok(Box::new(CountedUpload {
            inner: self.inner.put_multipart_opts(location, opts).await?,
            latency: self.latency,
            counts: Arc::clone(&self.counts),
            location: location.clone(),
        }))
    }

    async fn get_opts(
        &self,
        location: &Path,
        options: GetOptions,
    ) -> object_store::Result<GetResult> {
        let counter = if options.head {
            &self.counts.heads
        } else {
            &self.counts.gets
        };
        counter.fetch_add(1, Ordering::SeqCst);
        tokio::time::sleep(self.latency).await;
        let result = self.inner.get_opts(location, options).await?;
        self.counts
            .bytes_got
            .fetch_add(result.range.end - result.range.start, Ordering::SeqCst);
        Ok(result)
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, object_store::Result<Path>>,
    ) -> BoxStream<'static, object_store::Result<Path>> {
        let (counts, latency) = (Arc::clone(&self.counts), self.latency);
        let counted = locations
            .then(move |location| {
                counts.deletes.fetch_add(1, Ordering::SeqCst);
                async move {
                    tokio::time::sleep(latency).await;
                    location
                }
            })
            .boxed();
        self.inner.delete_stream(counted)
    }

    /// One request per page of [`PAGE`] keys, one after another as continuation tokens make
    /// them.
    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        let (counts, latency) = (Arc::clone(&self.counts), self.latency);
        let listing = self.inner.list(prefix);
        futures::stream::once(async move {
            let all: Vec<_> = listing.collect().await;
            for _ in 0..all.len().div_ceil(PAGE).max(1) {
                counts.list_pages.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(latency).await;
            }
            futures::stream::iter(all)
        })
        .flatten()
        .boxed()
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> object_store::Result<ListResult> {
        self.counts.list_pages.fetch_add(1, Ordering::SeqCst);
        tokio::time::sleep(self.latency).await;
        self.inner.list_with_delimiter(prefix).await
    }

    async fn copy_opts(
        &self,
        from: &Path,
        to: &Path,
        options: CopyOptions,
    ) -> object_store::Result<()> {
        self.counts.puts.fetch_add(1, Ordering::SeqCst);
        tokio::time::sleep(self.latency).await;
        self.inner.copy_opts(from, to, options).await
    }
}

/// A multipart upload whose part and completion requests are counted and delayed.
#[derive(Debug)]
struct CountedUpload {
    inner: Box<dyn MultipartUpload>,
    latency: Duration,
    counts: Arc<Counts>,
    location: Path,
}

#[async_trait]
impl MultipartUpload for CountedUpload {
    fn put_part(&mut self, data: PutPayload) -> UploadPart {
        self.counts.multipart.fetch_add(1, Ordering::SeqCst);
        let (part, latency) = (self.inner.put_part(data), self.latency);
        Box::pin(async move {
            tokio::time::sleep(latency).await;
            part.await
        })
    }

    async fn complete(&mut self) -> object_store::Result<PutResult> {
        self.counts.multipart.fetch_add(1, Ordering::SeqCst);
        tokio::time::sleep(self.latency).await;
        let put = self.inner.complete().await?;
        self.counts.landed(&self.location);
        Ok(put)
    }

    async fn abort(&mut self) -> object_store::Result<()> {
        self.inner.abort().await
    }
}

pub(crate) fn ranks_cases(b: &mut Bench<'_>) -> Result<()> {
    if b.args.wants("rank commit") {
        println!(
            "  rank commit: simulated ranks over InMemory, {LATENCY:?} per request and per listing page of {PAGE}"
        );
        for ranks in [8u32, 64, 256, 1024] {
            simulate(b, ranks)?;
        }
    }
    if b.args.wants("resharded load") {
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
        let counts = Arc::new(Counts::default());
        let store = Counted {
            inner: Arc::new(object_store::memory::InMemory::new()),
            latency: LATENCY,
            counts: Arc::clone(&counts),
        };
        let storage: Arc<dyn Storage> = Arc::new(ObjectStorage::new(Arc::new(store))?);
        let shape = [4 * u64::from(ranks), 256];
        let start = Arc::new(Barrier::new(ranks as usize));
        let threads: Vec<_> = (0..ranks)
            .map(|rank| {
                let (storage, start) = (Arc::clone(&storage), Arc::clone(&start));
                std::thread::spawn(move || {
                    let region = Region::split(&shape, 0, u64::from(ranks), u64::from(rank));
                    let values = vec![rank as f32; region.elements() as usize];
                    let tensor = Tensor::from_slice("w", region.lengths.clone(), &values);
                    let save = RankSave::new(rank, ranks, Writer::new(vec![tensor]))
                        .with_slice("w", shape, region);
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
        let at = |m: &Mutex<Option<Instant>>| *m.lock().unwrap_or_else(PoisonError::into_inner);
        let (Some(last), Some(commit)) = (at(&counts.last_manifest), at(&counts.commit)) else {
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
    let counts = Arc::new(Counts::default());
    let counted = Counted {
        inner: Arc::clone(s3.store()),
        latency: Duration::ZERO,
        counts: Arc::clone(&counts),
    };
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
