//! `weightbay-bench`: throughput on this machine, as ratios against its raw limits and against
//! burn-pack, the safetensors crate and raw object_store on the same data in the same run.
//! docs/BENCHMARKS.md lists the cases and the figures. Not part of any installed program: the
//! peers are this crate's dependencies only.

mod burn;
mod candle;
mod lifecycle;
mod ranks;
mod remote;
mod stall;
mod throttled;

use std::hint::black_box;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use weightbay::Format;
use weightbay::{
    AccessPolicy, Bytes, DType, Error, Reader, Result, Storage, Tensor, WeightComponentSpec,
    WeightSource, Writer,
};
use weightbay_local::LocalStorage;
use weightbay_mmap::MmapStorage;
use weightbay_object_store::{ObjectStorage, ObjectStoreOptions};

#[derive(clap::Parser)]
#[command(name = "weightbay-bench", about)]
struct Args {
    /// Size of the large checkpoint, in MiB (docs/BENCHMARKS.md uses 2048).
    #[arg(long, default_value_t = 2048)]
    size_mib: u64,
    /// Paired runs per case; the median is reported.
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Scratch directory for the files (default: a temporary directory under /tmp).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Only the cases whose name contains one of these (comma-separated).
    #[arg(long)]
    only: Option<String>,
    /// Also write the rows as CSV here.
    #[arg(long)]
    csv: Option<PathBuf>,
    /// Replace the generated table in this Markdown document (docs/BENCHMARKS.md) with this
    /// run's.
    #[arg(long)]
    update_doc: Option<PathBuf>,
    /// Which generated section of that document to replace (its markers are
    /// `<!-- weightbay-bench SECTION: start -->` and `… end -->`).
    #[arg(long, default_value = "table")]
    section: String,
    /// Internal: measure the peak RSS of one save in a fresh process.
    #[arg(long, hide = true)]
    rss_case: Option<String>,
}

impl Args {
    /// Whether `--only` selects the case `name`.
    fn wants(&self, name: &str) -> bool {
        self.only
            .as_deref()
            .is_none_or(|only| only.split(',').any(|part| name.contains(part.trim())))
    }
}

fn io(what: &str) -> impl FnOnce(std::io::Error) -> Error + '_ {
    move |e| Error::io(what.to_string(), e)
}

/// A checkpoint's tensors as plain buffers: `count` tensors totalling about `total` bytes.
struct Data {
    /// Shared buffers, so handing them to a writer (ours or a peer's) copies nothing.
    tensors: Vec<(String, bytes::Bytes)>,
}

impl Data {
    /// 200 tensors of mixed sizes (1 to 13 parts of `total`, cycling), as a model's layers
    /// are.
    fn big(total: u64) -> Self {
        let count = 200u64;
        let weights: Vec<u64> = (0..count).map(|i| 1 + (i * 7919) % 13).collect();
        let sum: u64 = weights.iter().sum();
        let tensors = weights
            .iter()
            .enumerate()
            .map(|(i, w)| {
                let len = (total * w / sum / 4 * 4) as usize;
                (
                    format!("layers.{}.t{}", i / 8, i % 8),
                    bytes::Bytes::from(vec![(i % 251) as u8; len]),
                )
            })
            .collect();
        Self { tensors }
    }

    /// 20,000 tensors of 1 to 64 KiB, log-uniform, like the baseline's "small" case.
    fn small() -> Self {
        let mut state = 0x9E37_79B9_7F4A_7C15u64;
        let tensors = (0..20_000)
            .map(|i| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                let exponent = (state % 1000) as f64 / 1000.0 * 6.0; // 2^0 .. 2^6 KiB
                let len = ((1024.0 * exponent.exp2()) as usize) / 4 * 4;
                (
                    format!("p{i:05}"),
                    bytes::Bytes::from(vec![(i % 251) as u8; len]),
                )
            })
            .collect();
        Self { tensors }
    }

    fn bytes(&self) -> u64 {
        self.tensors.iter().map(|(_, d)| d.len() as u64).sum()
    }

    fn ours(&self) -> Vec<Tensor> {
        self.tensors
            .iter()
            .map(|(name, data)| {
                let shared = data.clone();
                Tensor::new(
                    name,
                    DType::F32,
                    [data.len() as u64 / 4],
                    Bytes::from_shared(shared, weightbay::AllocationProperty::Native),
                )
            })
            .collect()
    }
}

/// One result row.
struct Row {
    case: String,
    ours: Duration,
    peer: Option<(String, Duration)>,
    bytes: u64,
}

/// The results so far, and how many paired runs each case gets.
struct Table {
    rows: Vec<Row>,
    runs: usize,
}

impl Table {
    /// Records a row and prints it at once, so a long run shows its results as it goes.
    fn push(&mut self, row: Row) {
        println!("  {}", row_text(&row));
        self.rows.push(row);
    }

    /// Times `ours` against `peer` (see [`paired`]) and records the row.
    fn compare(
        &mut self,
        start: Start,
        case: &str,
        bytes: u64,
        peer_name: &str,
        mut ours: impl FnMut() -> Result<()>,
        mut peer: impl FnMut() -> Result<()>,
    ) -> Result<()> {
        let (ours, peer) = paired(self.runs, start, || timed(&mut ours), || timed(&mut peer))?;
        self.push(Row {
            case: case.to_owned(),
            ours,
            peer: Some((peer_name.to_owned(), peer)),
            bytes,
        });
        Ok(())
    }

    /// Times `f` alone, records the median, and returns it.
    fn alone(&mut self, case: &str, mut f: impl FnMut() -> Result<()>) -> Result<Duration> {
        let time = median(
            (0..self.runs)
                .map(|_| timed(&mut f))
                .collect::<Result<_>>()?,
        );
        self.push(Row {
            case: case.to_owned(),
            ours: time,
            peer: None,
            bytes: 0,
        });
        Ok(time)
    }
}

fn row_text(row: &Row) -> String {
    let cells = Cells::of(row);
    match &row.peer {
        Some(_) => format!(
            "{}: {} vs {} {} = {}",
            row.case, cells.ours, cells.peer_name, cells.peer, cells.ratio
        ),
        None => format!("{}: {}", row.case, cells.ours),
    }
}

fn median(mut times: Vec<Duration>) -> Duration {
    times.sort();
    times[times.len() / 2]
}

fn gib_per_s(bytes: u64, time: Duration) -> f64 {
    bytes as f64 / (1u64 << 30) as f64 / time.as_secs_f64().max(1e-12)
}

/// What each timed run starts from. Either way, what earlier runs left dirty is written back
/// first, outside the timing, so a run never pays for its predecessor's writeback.
#[derive(Debug, Clone, Copy)]
enum Start {
    /// Files stay cached, so reads measure the code rather than the disk.
    Cached,
    /// The clean page cache is dropped too (where allowed: root), so every run that writes
    /// starts with the same free memory instead of paying to reclaim what earlier runs cached.
    /// On the machine of docs/BENCHMARKS.md that was the largest source of noise in fsync'd
    /// writes.
    Emptied,
}

/// Runs `ours` and `peer` `runs` times each, alternating which goes first and settling the
/// machine (see [`Start`]) before each, so that neither inherits the other's leftovers, and
/// keeps the medians.
fn paired(
    runs: usize,
    start: Start,
    mut ours: impl FnMut() -> Result<Duration>,
    mut peer: impl FnMut() -> Result<Duration>,
) -> Result<(Duration, Duration)> {
    let settle = || {
        let _ = std::process::Command::new("sync").status();
        if matches!(start, Start::Emptied) {
            let _ = std::fs::write("/proc/sys/vm/drop_caches", "1");
        }
    };
    let (mut a, mut b) = (Vec::new(), Vec::new());
    for run in 0..runs {
        if run % 2 == 0 {
            settle();
            a.push(ours()?);
            settle();
            b.push(peer()?);
        } else {
            settle();
            b.push(peer()?);
            settle();
            a.push(ours()?);
        }
    }
    print_runs(&a, &b);
    Ok((median(a), median(b)))
}

/// Prints every run's figure, so a reader can see the spread behind a median.
fn print_runs(ours: &[Duration], peer: &[Duration]) {
    let seconds = |times: &[Duration]| {
        times
            .iter()
            .map(|t| format!("{:.3}", t.as_secs_f64()))
            .collect::<Vec<_>>()
            .join(" ")
    };
    println!(
        "    each run, seconds: weightbay {}; peer {}",
        seconds(ours),
        seconds(peer)
    );
}

/// Reads every tensor of `reader` in place, directly or as WeightSource components.
fn touch_all(reader: &Reader, through_components: bool) -> Result<()> {
    let mut sum = 0;
    for info in reader.tensors() {
        let bytes = if through_components {
            let spec = WeightComponentSpec::dense(
                info.name(),
                info.shape().to_vec(),
                info.dtype().clone(),
            );
            reader
                .component(&spec)?
                .ok_or_else(|| Error::invalid("a listed tensor is missing"))?
                .bytes
        } else {
            reader.bytes(info.name())?
        };
        sum += touch(bytes.read(AccessPolicy::ZeroCopy)?);
    }
    black_box(sum);
    Ok(())
}

/// The peer for uploads: raw object_store `WriteMultipart` with our part size and parts in
/// flight.
struct RawUpload<'a> {
    runtime: &'a tokio::runtime::Runtime,
    part: usize,
    in_flight: usize,
}

impl RawUpload<'_> {
    fn upload(
        &self,
        store: &Arc<dyn object_store::ObjectStore>,
        location: &object_store::path::Path,
        bytes: &[u8],
    ) -> Result<()> {
        self.runtime
            .block_on(async {
                use object_store::ObjectStoreExt;
                let upload = store.put_multipart(location).await?;
                let mut write =
                    object_store::WriteMultipart::new_with_chunk_size(upload, self.part);
                for chunk in bytes.chunks(8 << 20) {
                    write.wait_for_capacity(self.in_flight).await?;
                    write.write(chunk);
                }
                write.finish().await.map(drop)
            })
            .map_err(|e| Error::new(weightbay::ErrorKind::Io, e.to_string()))
    }
}

fn timed(f: impl FnOnce() -> Result<()>) -> Result<Duration> {
    let start = Instant::now();
    f()?;
    Ok(start.elapsed())
}

fn touch(data: &[u8]) -> u64 {
    // A read of every 64th byte pulls every page and cache line in without a full sum.
    data.iter().step_by(64).map(|&b| u64::from(b)).sum()
}

fn sync_dir(dir: &Path) -> Result<()> {
    std::fs::File::open(dir)
        .and_then(|f| f.sync_all())
        .map_err(io("syncing the directory"))
}

/// CPU time (user + system) this process has used so far, from `/proc/self/stat` (Linux;
/// clock ticks of 10 ms).
fn cpu_time() -> Duration {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the command name (which may hold spaces) start after the last ')'.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map_or("", |(_, rest)| rest)
        .split_whitespace()
        .collect();
    let ticks: u64 = [11, 12]
        .iter()
        .filter_map(|&i| fields.get(i)?.parse::<u64>().ok())
        .sum();
    Duration::from_millis(ticks * 10)
}

/// A memory figure of this process from /proc/self/status (`VmHWM:` for the peak resident
/// set so far, `VmRSS:` for the current one), in bytes (Linux).
fn rss(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|line| line.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kib| kib * 1024)
}

/// In a fresh process: save `size_mib` MiB of deferred 16 MiB tensors and print the peak RSS.
fn rss_case(case: &str, size_mib: u64, dir: &Path) -> Result<()> {
    const TENSOR: u64 = 16 << 20;
    let tensors = (0..(size_mib << 20) / TENSOR)
        .map(|i| {
            Tensor::deferred(format!("t{i}"), DType::U8, [TENSOR], TENSOR, move || {
                Ok(Bytes::from(vec![i as u8; TENSOR as usize]))
            })
        })
        .collect();
    if case == "remote-copy" {
        println!("{}", remote::copy_rss(tensors, dir)?);
        return Ok(());
    }
    if case == "candle-s3" {
        println!("{}", candle::s3_load_rss(tensors)?);
        return Ok(());
    }
    if case.starts_with("burn") {
        println!("{}", burn::save_rss(case, dir)?);
        return Ok(());
    }
    let writer = Writer::new(tensors);
    match case {
        "local" => writer
            .write_to(&LocalStorage::new(dir), "rss.bpk")
            .map(|_| ())?,
        "s3" | "s3-safetensors" => {
            let url = std::env::var("WEIGHTBAY_S3_URL")
                .map_err(|_| Error::invalid("WEIGHTBAY_S3_URL is unset"))?;
            let storage = weightbay_object_store::open_url(
                &format!("{url}/bench"),
                std::iter::empty::<(&str, &str)>(),
            )?;
            let format = if case == "s3" {
                Format::Burnpack
            } else {
                Format::Safetensors
            };
            writer
                .with_format(format)
                .write_to(&storage, "rss.bin")
                .map(|_| ())?;
        }
        other => return Err(Error::invalid(format!("unknown rss case {other}"))),
    }
    println!("{}", rss("VmHWM:"));
    Ok(())
}

fn rss_of(case: &str, size_mib: u64, dir: &Path) -> Result<u64> {
    let output =
        std::process::Command::new(std::env::current_exe().map_err(io("finding this program"))?)
            .args([
                "--rss-case",
                case,
                "--size-mib",
                &size_mib.to_string(),
                "--dir",
                &dir.display().to_string(),
            ])
            .output()
            .map_err(io("running the RSS probe"))?;
    if !output.status.success() {
        return Err(Error::new(
            weightbay::ErrorKind::Io,
            format!(
                "RSS probe failed: {}",
                String::from_utf8_lossy(&output.stderr)
            ),
        ));
    }
    String::from_utf8_lossy(&output.stdout)
        .trim()
        .parse()
        .map_err(|_| Error::invalid("RSS probe printed no number"))
}

fn main() -> std::process::ExitCode {
    let args = <Args as clap::Parser>::parse();
    match run(&args) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// What every case gets: the table to add rows to, the data, the scratch directory and the
/// local storage over it.
struct Bench<'a> {
    args: &'a Args,
    table: Table,
    big: Data,
    dir: PathBuf,
    local: LocalStorage,
}

/// Saves the large checkpoint to `big.bpk` in the scratch directory.
fn save_big(local: &LocalStorage, big: &Data) -> Result<()> {
    Writer::new(big.ours()).write_to(local, "big.bpk").map(drop)
}

/// A case: the names `--only` matches (one function may measure several), and what it runs.
type Case = (&'static [&'static str], fn(&mut Bench<'_>) -> Result<()>);

/// Every case, in the order they run.
const CASES: &[Case] = &[
    (&["into_bytes"], into_bytes),
    (&["plan"], plan),
    (&["open"], open_index),
    (&["durable save"], durable_save),
    (&["small tensors"], small_tensors),
    (&["mmap load"], mmap_load),
    (&["pread"], pread),
    (&["cold load"], cold_load),
    (&["into caller memory"], into_caller_memory),
    (
        &[
            "object store save",
            "object store load",
            "object store copy",
            "object store cpu",
            "object store rss",
        ],
        object_store_cases,
    ),
    (
        &["remote curve", "remote load", "remote copy", "remote rss"],
        remote::remote_cases,
    ),
    (&["async"], stall::async_stall),
    (
        &["background save", "latest", "checkpoint verify"],
        lifecycle::lifecycle_cases,
    ),
    (&["candle"], candle::candle_cases),
    (&["burn"], burn::burn_cases),
    (&["rank commit", "resharded load"], ranks::ranks_cases),
];

fn run(args: &Args) -> Result<()> {
    let temporary = tempfile::tempdir().map_err(io("creating a temporary directory"))?;
    let dir = args
        .dir
        .clone()
        .unwrap_or_else(|| temporary.path().to_path_buf());
    std::fs::create_dir_all(&dir).map_err(io("creating the scratch directory"))?;
    if let Some(case) = &args.rss_case {
        return rss_case(case, args.size_mib, &dir);
    }
    let runs = args.runs.max(1);
    let mut bench = Bench {
        args,
        table: Table {
            rows: Vec::new(),
            runs,
        },
        big: Data::big(args.size_mib << 20),
        local: LocalStorage::new(&dir),
        dir,
    };
    println!(
        "weightbay-bench: {} MiB in {} tensors, {runs} paired runs per case, files in {}",
        bench.big.bytes() >> 20,
        bench.big.tensors.len(),
        bench.dir.display()
    );
    let can_drop_caches = std::fs::OpenOptions::new()
        .write(true)
        .open("/proc/sys/vm/drop_caches")
        .is_ok();
    println!(
        "  page cache dropped before each run of a write case: {}",
        if can_drop_caches {
            "yes"
        } else {
            "no (needs root), so those figures are noisier"
        }
    );
    let wanted = |name: &str| args.wants(name);
    for &(names, case) in CASES {
        if names.iter().any(|name| wanted(name)) {
            case(&mut bench)?;
        }
    }
    print_table(&bench.table);
    if let Some(path) = &args.csv {
        std::fs::write(path, csv(&bench.table)).map_err(io("writing the CSV"))?;
    }
    if let Some(path) = &args.update_doc {
        update_doc(path, &bench)?;
    }
    Ok(())
}

fn into_bytes(b: &mut Bench<'_>) -> Result<()> {
    let big = &b.big;
    b.table.compare(
        Start::Cached,
        "into_bytes (trailer on)",
        big.bytes(),
        "memcpy into fresh memory",
        || {
            Writer::new(big.ours())
                .into_bytes()
                .map(|b| drop(black_box(b)))
        },
        || {
            let mut out = vec![0u8; big.bytes() as usize];
            let mut at = 0;
            for (_, data) in &big.tensors {
                out[at..at + data.len()].copy_from_slice(data);
                at += data.len();
            }
            black_box(out);
            Ok(())
        },
    )
}

fn plan(b: &mut Bench<'_>) -> Result<()> {
    let tensors: Vec<Tensor> = (0..100_000)
        .map(|i| {
            Tensor::deferred(
                format!("blocks.{i}.weight"),
                DType::F32,
                [256],
                1024,
                || Ok(Bytes::from(vec![])),
            )
        })
        .collect();
    let writer = Writer::new(tensors);
    b.table
        .alone("plan 100k tensors", || {
            writer.size().map(|s| {
                black_box(s);
            })
        })
        .map(drop)
}

fn open_index(b: &mut Bench<'_>) -> Result<()> {
    let tensors: Vec<Tensor> = (0..20_000)
        .map(|i| Tensor::new(format!("blocks.{i}.weight"), DType::U8, [4], vec![1u8; 4]))
        .collect();
    let bytes = bytes::Bytes::from(Writer::new(tensors).into_bytes()?);
    let time = b.table.alone("open 20k-tensor index", || {
        Reader::from_bytes(bytes.clone()).map(|r| drop(black_box(r)))
    })?;
    println!(
        "  open a 20,000-tensor container (index only): {:.3} µs per tensor",
        time.as_secs_f64() * 1e6 / 20_000.0
    );
    Ok(())
}

fn durable_save(b: &mut Bench<'_>) -> Result<()> {
    let Bench {
        args,
        table,
        big,
        dir,
        local,
    } = b;
    let count = (big.bytes() >> 23).max(1);
    // dd writes a new file every run: truncating the last one would add the cost of freeing
    // it to dd's time.
    let mut dd_runs = 0;
    let dd_file = |run: usize| dir.join(format!("dd-{run}.bin"));
    table.compare(
        Start::Emptied,
        "durable save",
        big.bytes(),
        "dd bs=8M conv=fsync, new file",
        || save_big(local, big),
        || {
            dd_runs += 1;
            dd(&[
                "if=/dev/zero",
                &format!("of={}", dd_file(dd_runs).display()),
                "bs=8M",
                &format!("count={count}"),
                "conv=fsync",
            ])
        },
    )?;
    for run in 1..=dd_runs {
        std::fs::remove_file(dd_file(run)).map_err(io("removing dd's file"))?;
    }
    table.compare(
        Start::Emptied,
        "durable save",
        big.bytes(),
        "burn-pack write_to_file",
        || save_big(local, big),
        || peers::burn_pack_save(big, &dir.join("burn.bpk")),
    )?;
    let rss = rss_of("local", args.size_mib, dir)?;
    println!(
        "  peak RSS saving {} MiB of deferred 16 MiB tensors durably: {} MiB (bound: largest tensor + 16 MiB = 32 MiB above the process's base)",
        args.size_mib,
        rss >> 20
    );
    Ok(())
}

fn small_tensors(b: &mut Bench<'_>) -> Result<()> {
    let small = Data::small();
    let (local, dir) = (&b.local, &b.dir);
    let save_small = || {
        Writer::new(small.ours())
            .write_to(local, "small.bpk")
            .map(drop)
    };
    b.table.compare(
        Start::Emptied,
        "20k small tensors, durable",
        small.bytes(),
        "burn-pack write_to_file",
        save_small,
        || peers::burn_pack_save(&small, &dir.join("small-burn.bpk")),
    )?;
    b.table.compare(
        Start::Emptied,
        "20k small tensors, durable",
        small.bytes(),
        "safetensors serialize_to_file + fsync",
        save_small,
        || peers::safetensors_save(&small, &dir.join("small.safetensors")),
    )
}

/// The large checkpoint as `big.bpk` and `big.safetensors`, for the load cases.
fn save_load_files(b: &Bench<'_>) -> Result<()> {
    save_big(&b.local, &b.big)?;
    Writer::new(b.big.ours())
        .with_format(Format::Safetensors)
        .write_to(&b.local, "big.safetensors")
        .map(drop)
}

fn mmap_load(b: &mut Bench<'_>) -> Result<()> {
    save_load_files(b)?;
    let dir = b.dir.clone();
    let mmap = MmapStorage::new(&dir);
    let safetensors_peer = || peers::safetensors_mmap_touch(&dir.join("big.safetensors"));
    b.table.compare(
        Start::Cached,
        "mmap open + touch every byte",
        b.big.bytes(),
        "safetensors crate over memmap2",
        || touch_all(&Reader::open(mmap.open("big.bpk")?)?, false),
        safetensors_peer,
    )?;
    b.table.compare(
        Start::Cached,
        "WeightSource components over mmap (safetensors)",
        b.big.bytes(),
        "safetensors crate over memmap2",
        || touch_all(&Reader::open(mmap.open("big.safetensors")?)?, true),
        safetensors_peer,
    )
}

fn pread(b: &mut Bench<'_>) -> Result<()> {
    save_load_files(b)?;
    let (local, dir) = (&b.local, &b.dir);
    b.table.compare(
        Start::Cached,
        "pread every tensor into fresh buffers",
        b.big.bytes(),
        "sequential read into fresh buffers",
        || {
            let reader = Reader::open(local.open("big.bpk")?)?;
            for info in reader.tensors() {
                black_box(reader.read(info.name())?);
            }
            Ok(())
        },
        || {
            let reader = Reader::open(local.open("big.bpk")?)?;
            let mut file = std::fs::File::open(dir.join("big.bpk")).map_err(io("opening"))?;
            let mut position = 0u64;
            let mut in_file_order: Vec<_> = reader.tensors().iter().collect();
            in_file_order.sort_by_key(|info| info.range().start);
            for info in in_file_order {
                let range = info.range();
                let mut skip = vec![0u8; (range.start.saturating_sub(position)) as usize];
                file.read_exact(&mut skip).map_err(io("reading"))?;
                let mut buf = vec![0u8; info.byte_len() as usize];
                file.read_exact(&mut buf).map_err(io("reading"))?;
                black_box(buf);
                position = range.end;
            }
            Ok(())
        },
    )
}

/// Every tensor of the 2 GiB file from a cold page cache through the public API (`load_all`,
/// parallel `pread`s into fresh buffers), against `dd` reading the file with `O_DIRECT`.
fn cold_load(b: &mut Bench<'_>) -> Result<()> {
    save_load_files(b)?;
    let (local, dir) = (&b.local, &b.dir);
    b.table.compare(
        Start::Emptied,
        "cold load: Reader::load_all from a local file",
        b.big.bytes(),
        "dd bs=64M iflag=direct",
        || {
            Reader::open_key(local, "big.bpk")?
                .load_all()
                .map(|all| drop(black_box(all)))
        },
        || {
            dd(&[
                &format!("if={}", dir.join("big.bpk").display()),
                "of=/dev/null",
                "bs=64M",
                "iflag=direct",
            ])
        },
    )
}

/// Runs `dd` with `operands` (and `status=none`), the machine's own limit for a case.
fn dd(operands: &[&str]) -> Result<()> {
    let status = std::process::Command::new("dd")
        .args(operands)
        .arg("status=none")
        .status()
        .map_err(io("running dd"))?;
    if status.success() {
        Ok(())
    } else {
        Err(Error::invalid(format!("dd {} failed", operands.join(" "))))
    }
}

/// Every tensor of the page-cached file read into buffers the caller already owns and has
/// touched (`Reader::read_many_into`, which spreads the reads over up to 4 threads), against
/// memcpy of the same bytes into the same buffers (one thread).
fn into_caller_memory(b: &mut Bench<'_>) -> Result<()> {
    save_load_files(b)?;
    let reader = Reader::open_key(&b.local, "big.bpk")?;
    let names: Vec<&str> = reader.tensors().iter().map(|t| t.name()).collect();
    let resident: Vec<Vec<u8>> = names
        .iter()
        .map(|name| reader.read(name))
        .collect::<Result<_>>()?;
    // Touched once here, so neither side pays to fault them in.
    let buffers = std::cell::RefCell::new(
        resident
            .iter()
            .map(|data| vec![1u8; data.len()])
            .collect::<Vec<_>>(),
    );
    b.table.compare(
        Start::Cached,
        "Reader::read_many_into caller buffers (page cache)",
        b.big.bytes(),
        "memcpy into the same buffers",
        || {
            let mut buffers = buffers.borrow_mut();
            let mut targets: Vec<(&str, &mut [u8])> = names
                .iter()
                .zip(buffers.iter_mut())
                .map(|(name, buf)| (*name, buf.as_mut_slice()))
                .collect();
            reader.read_many_into(&mut targets)
        },
        || {
            for (data, buf) in resident.iter().zip(buffers.borrow_mut().iter_mut()) {
                buf.copy_from_slice(data);
            }
            black_box(&buffers);
            Ok(())
        },
    )
}

/// The rows as a fixed-width table on standard output.
fn print_table(table: &Table) {
    println!(
        "\n{:<48} {:>12} {:<40} {:>12} {:>7}",
        "case", "weightbay", "peer", "peer", "ratio"
    );
    for row in &table.rows {
        let cells = Cells::of(row);
        println!(
            "{:<48} {:>12} {:<40} {:>12} {:>7}",
            row.case, cells.ours, cells.peer_name, cells.peer, cells.ratio
        );
    }
    println!("(ratio = peer time / weightbay time: above 1 means weightbay is faster)");
}

/// One row's figures as text.
struct Cells<'a> {
    ours: String,
    peer_name: &'a str,
    peer: String,
    ratio: String,
    ratio_value: Option<f64>,
}

impl<'a> Cells<'a> {
    fn of(row: &'a Row) -> Self {
        // Rows without bytes are times, peers included.
        let figure = |time: Duration| {
            if row.bytes > 0 {
                format!("{:.2} GiB/s", gib_per_s(row.bytes, time))
            } else {
                format!("{:.1} ms", time.as_secs_f64() * 1e3)
            }
        };
        let ours = figure(row.ours);
        let (peer_name, peer, ratio_value) = match &row.peer {
            Some((name, time)) => (
                name.as_str(),
                figure(*time),
                Some(time.as_secs_f64() / row.ours.as_secs_f64().max(1e-12)),
            ),
            None => ("", String::new(), None),
        };
        Self {
            ours,
            peer_name,
            peer,
            ratio: ratio_value.map_or(String::new(), |r| format!("{r:.2}×")),
            ratio_value,
        }
    }
}

/// The rows as CSV; case and peer names hold commas, so they are quoted.
fn csv(table: &Table) -> String {
    let mut csv = String::from("case,bytes,ours_s,peer,peer_s,ratio\n");
    for row in &table.rows {
        let cells = Cells::of(row);
        csv += &format!(
            "\"{}\",{},{:.6},\"{}\",{},{}\n",
            row.case,
            row.bytes,
            row.ours.as_secs_f64(),
            cells.peer_name,
            row.peer
                .as_ref()
                .map_or(String::new(), |(_, t)| format!("{:.6}", t.as_secs_f64())),
            cells
                .ratio_value
                .map_or(String::new(), |r| format!("{r:.4}"))
        );
    }
    csv
}

/// Replaces the table between `<!-- weightbay-bench SECTION: start -->` and its end marker in
/// the document at `path` with this run's rows and the command that produced them.
fn update_doc(path: &Path, bench: &Bench<'_>) -> Result<()> {
    let section = &bench.args.section;
    let doc_start = format!("<!-- weightbay-bench {section}: start -->");
    let doc_end = format!("<!-- weightbay-bench {section}: end -->");
    let text = std::fs::read_to_string(path).map_err(io("reading the document"))?;
    let (Some(start), Some(end)) = (text.find(&doc_start), text.find(&doc_end)) else {
        return Err(Error::invalid(format!(
            "{} has no `{doc_start}` … `{doc_end}` section",
            path.display()
        )));
    };
    let command: Vec<String> = std::env::args().skip(1).collect();
    let mut table = format!(
        "{doc_start}\nGenerated by `cargo run --release -p weightbay-bench -- {}`: {} MiB in {} \
         tensors, medians of {} paired runs.\n\n| case | weightbay | peer | peer | ratio |\n| --- | ---: | --- | ---: | ---: |\n",
        command.join(" "),
        bench.big.bytes() >> 20,
        bench.big.tensors.len(),
        bench.table.runs
    );
    for row in &bench.table.rows {
        let cells = Cells::of(row);
        table += &format!(
            "| {} | {} | {} | {} | {} |\n",
            row.case, cells.ours, cells.peer_name, cells.peer, cells.ratio
        );
    }
    let updated = format!("{}{table}{}", &text[..start], &text[end..]);
    std::fs::write(path, updated).map_err(io("writing the document"))
}

/// The object-store cases: saving through object_store's InMemory store against raw
/// `WriteMultipart`, and, with an S3 server, loading, client CPU and peak memory.
fn object_store_cases(b: &mut Bench<'_>) -> Result<()> {
    let wanted = |name: &str| b.args.wants(name);
    let (table, big, args, dir) = (&mut b.table, &b.big, b.args, b.dir.as_path());
    let options = ObjectStoreOptions::default();
    let part = options.part_size_for(Some(big.bytes()));
    let store: Arc<dyn object_store::ObjectStore> = Arc::new(object_store::memory::InMemory::new());
    let storage = ObjectStorage::new(Arc::clone(&store))?.with_options(options);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(io("runtime"))?;
    let raw = RawUpload {
        runtime: &runtime,
        part,
        in_flight: options.parts_in_flight,
    };
    let container = Writer::new(big.ours()).into_bytes()?;
    if wanted("object store save") {
        table.compare(
            Start::Cached,
            "object store save (InMemory)",
            big.bytes(),
            "raw object_store WriteMultipart",
            || {
                Writer::new(big.ours())
                    .write_to(&storage, "ours.bpk")
                    .map(drop)
            },
            || {
                raw.upload(
                    &store,
                    &object_store::path::Path::from("raw.bpk"),
                    &container,
                )
            },
        )?;
    }
    // Loading, client CPU and peak memory are measured against the S3 server (moto) when
    // one is running: an in-memory store hands out slices of its own buffer, which
    // measures nothing.
    let s3 = match std::env::var("WEIGHTBAY_S3_URL") {
        Ok(url) => Some(weightbay_object_store::open_url(
            &format!("{url}/bench"),
            std::iter::empty::<(&str, &str)>(),
        )?),
        Err(_) => {
            println!(
                "  object store load, cpu and rss: skipped, no S3 server (vars=$(scripts/servers.sh start s3) && eval \"$vars\")"
            );
            None
        }
    };
    let Some(load_storage) = s3 else {
        return Ok(());
    };
    let label = "S3 server";
    Writer::new(big.ours()).write_to(&load_storage, "ours.bpk")?;
    let load_store = Arc::clone(load_storage.store());
    let location = load_storage.prefix().clone().join("ours.bpk");
    // The peer of the load and copy cases: object_store's own `get_ranges` of every tensor.
    let raw_get_ranges = |ranges: &[std::ops::Range<u64>]| -> Result<()> {
        runtime
            .block_on(load_store.get_ranges(&location, ranges))
            .map(|b| drop(black_box(b)))
            .map_err(|e| Error::new(weightbay::ErrorKind::Io, e.to_string()))
    };
    if wanted("object store load") {
        // Stores on this machine load with one request per run of adjacent tensors; request
        // sizes for remote stores are the remote cases' business.
        let setting = load_storage
            .options()
            .fetch_request_len
            .map_or("one request per run".to_owned(), |len| {
                format!("{} MiB requests", len >> 20)
            });
        // Opening (one GET for header and metadata) is left out of both sides' timing. Ours
        // goes through the public API: a Reader over `dyn Source`, `load_all`.
        let reader = Reader::open_key(&load_storage, "ours.bpk")?;
        let ranges: Vec<_> = reader.tensors().iter().map(|t| t.range()).collect();
        table.compare(
            Start::Cached,
            &format!("object store load every tensor via Reader::load_all ({label}, {setting})"),
            big.bytes(),
            "raw object_store get_ranges",
            || reader.load_all().map(|b| drop(black_box(b))),
            || raw_get_ranges(&ranges),
        )?;
    }
    if wanted("object store copy") {
        // What `weightbay cp s3://…/ours.bpk local.bpk` does: a Reader's to_writer (which reads
        // ahead in batches of the fetch budget) streamed into a local file.
        let local = LocalStorage::new(dir);
        let ranges: Vec<_> = Reader::open_key(&load_storage, "ours.bpk")?
            .tensors()
            .iter()
            .map(|t| t.range())
            .collect();
        table.compare(
            Start::Cached,
            &format!("object store copy to a local file, as weightbay cp ({label})"),
            big.bytes(),
            "raw object_store get_ranges (load only)",
            || {
                Reader::open_key(&load_storage, "ours.bpk")?
                    .to_writer()
                    .write_to(&local, "copied.bpk")
                    .map(drop)
            },
            || raw_get_ranges(&ranges),
        )?;
    }
    if wanted("object store cpu") {
        // Client CPU (user + system) per GiB written to the S3 server, against raw
        // object_store's WriteMultipart with the same part size and parts in flight;
        // alternating which goes first, medians of the runs.
        let cpu_of = |upload: &dyn Fn() -> Result<()>| -> Result<Duration> {
            let before = cpu_time();
            upload()?;
            Ok(cpu_time() - before)
        };
        let ours = || {
            Writer::new(big.ours())
                .write_to(&load_storage, "cpu.bpk")
                .map(drop)
        };
        let theirs = || {
            raw.upload(
                &load_store,
                &load_storage.prefix().clone().join("raw-cpu.bpk"),
                &container,
            )
        };
        let (mut ours_runs, mut raw_runs) = (Vec::new(), Vec::new());
        for run in 0..table.runs {
            if run % 2 == 0 {
                ours_runs.push(cpu_of(&ours)?);
                raw_runs.push(cpu_of(&theirs)?);
            } else {
                raw_runs.push(cpu_of(&theirs)?);
                ours_runs.push(cpu_of(&ours)?);
            }
        }
        print_runs(&ours_runs, &raw_runs);
        let (ours_cpu, raw_cpu) = (median(ours_runs), median(raw_runs));
        let gib = big.bytes() as f64 / (1u64 << 30) as f64;
        println!(
            "  client CPU per GiB to the S3 server: {:.2} s, raw object_store {:.2} s = {:.2}x raw's",
            ours_cpu.as_secs_f64() / gib,
            raw_cpu.as_secs_f64() / gib,
            ours_cpu.as_secs_f64() / raw_cpu.as_secs_f64().max(1e-9)
        );
    }
    if wanted("object store rss") {
        for (case, size) in [
            ("s3", 256),
            ("s3", args.size_mib),
            ("s3-safetensors", args.size_mib),
        ] {
            let rss = rss_of(case, size, dir)?;
            println!(
                "  peak RSS streaming {size} MiB of deferred 16 MiB tensors to the S3 server ({case}): {} MiB (bound: {} MiB parts x 9 + 32 MiB)",
                rss >> 20,
                part >> 20
            );
        }
    }
    Ok(())
}

mod peers {
    use std::path::Path;

    use super::{Data, io, sync_dir, touch};
    use weightbay::{Error, Result};

    /// burn-pack's atomic, durable save of the same data (buffers copied in before timing
    /// would be fairer, but burn's `Bytes` takes ownership; the copy is a memcpy).
    pub(crate) fn burn_pack_save(data: &Data, path: &Path) -> Result<()> {
        let tensors = data
            .tensors
            .iter()
            .map(|(name, bytes)| {
                burn_pack::Tensor::new(
                    name.clone(),
                    burn_pack::DType::F32,
                    vec![bytes.len() / 4],
                    None,
                    burn_pack::Bytes::from_shared(
                        bytes.clone(),
                        burn_std::AllocationProperty::Native,
                    ),
                )
            })
            .collect();
        burn_pack::Writer::new(tensors)
            .write_to_file(path)
            .map_err(|e| Error::invalid(e.to_string()))
    }

    /// safetensors' `serialize_to_file`, then the fsyncs it leaves to its caller.
    pub(crate) fn safetensors_save(data: &Data, path: &Path) -> Result<()> {
        let views: Vec<(String, safetensors::tensor::TensorView<'_>)> = data
            .tensors
            .iter()
            .map(|(name, bytes)| {
                let view = safetensors::tensor::TensorView::new(
                    safetensors::Dtype::F32,
                    vec![bytes.len() / 4],
                    bytes,
                )
                .map_err(|e| Error::invalid(e.to_string()))?;
                Ok((name.clone(), view))
            })
            .collect::<Result<_>>()?;
        safetensors::serialize_to_file(views, None, path)
            .map_err(|e| Error::invalid(e.to_string()))?;
        std::fs::File::open(path)
            .and_then(|f| f.sync_all())
            .map_err(io("syncing"))?;
        sync_dir(path.parent().unwrap_or(Path::new(".")))
    }

    /// memmap2 + `SafeTensors::deserialize` + touch every tensor.
    pub(crate) fn safetensors_mmap_touch(path: &Path) -> Result<()> {
        let file = std::fs::File::open(path).map_err(io("opening"))?;
        // SAFETY: the benchmark's own file, not modified while mapped.
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(io("mapping"))?;
        let tensors = safetensors::SafeTensors::deserialize(&map)
            .map_err(|e| Error::invalid(e.to_string()))?;
        let mut sum = 0;
        for (_, view) in tensors.tensors() {
            sum += touch(view.data());
        }
        std::hint::black_box(sum);
        Ok(())
    }
}
