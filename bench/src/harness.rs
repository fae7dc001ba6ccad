//! The measuring harness every case shares: the data sets, timing with paired runs against a
//! peer (alternating which goes first, the machine settled before each), and the rows.

use std::hint::black_box;
use std::path::Path;
use std::time::{Duration, Instant};

use weightbay::{
    AccessPolicy, Bytes, DType, Error, Reader, Result, Tensor, WeightComponentSpec, WeightSource,
};

use crate::report::{Row, Table};

pub(crate) fn io(what: &str) -> impl FnOnce(std::io::Error) -> Error + '_ {
    move |e| Error::io(what.to_string(), e)
}

/// A checkpoint's tensors as plain buffers: `count` tensors totalling about `total` bytes.
pub(crate) struct Data {
    /// Shared buffers, so handing them to a writer (ours or a peer's) copies nothing.
    pub(crate) tensors: Vec<(String, bytes::Bytes)>,
}

impl Data {
    /// 200 tensors of mixed sizes (1 to 13 parts of `total`, cycling), as a model's layers
    /// are.
    pub(crate) fn big(total: u64) -> Self {
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
    pub(crate) fn small() -> Self {
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

    pub(crate) fn bytes(&self) -> u64 {
        self.tensors.iter().map(|(_, d)| d.len() as u64).sum()
    }

    pub(crate) fn ours(&self) -> Vec<Tensor> {
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

pub(crate) fn median(mut times: Vec<Duration>) -> Duration {
    times.sort();
    times[times.len() / 2]
}

/// What each timed run starts from. Either way, what earlier runs left dirty is written back
/// first, outside the timing, so a run never pays for its predecessor's writeback.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Start {
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
pub(crate) fn paired(
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
pub(crate) fn print_runs(ours: &[Duration], peer: &[Duration]) {
    println!(
        "    each run, seconds: weightbay {}; peer {}",
        seconds(ours),
        seconds(peer)
    );
}

/// Durations as seconds, space-separated.
pub(crate) fn seconds(times: &[Duration]) -> String {
    times
        .iter()
        .map(|t| format!("{:.3}", t.as_secs_f64()))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Reads every tensor of `reader` in place, directly or as WeightSource components.
pub(crate) fn touch_all(reader: &Reader, through_components: bool) -> Result<()> {
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

pub(crate) fn timed(f: impl FnOnce() -> Result<()>) -> Result<Duration> {
    let start = Instant::now();
    f()?;
    Ok(start.elapsed())
}

pub(crate) fn touch(data: &[u8]) -> u64 {
    // A read of every 64th byte pulls every page and cache line in without a full sum.
    data.iter().step_by(64).map(|&b| u64::from(b)).sum()
}

pub(crate) fn sync_dir(dir: &Path) -> Result<()> {
    std::fs::File::open(dir)
        .and_then(|f| f.sync_all())
        .map_err(io("syncing the directory"))
}

/// CPU time (user + system) this process has used so far, from `/proc/self/stat` (Linux;
/// clock ticks of 10 ms).
pub(crate) fn cpu_time() -> Duration {
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

/// Timed rows: the harness measures, the report keeps.
impl Table {
    /// Times `ours` against `peer` (see [`paired`]) and records the row.
    pub(crate) fn compare(
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
    pub(crate) fn alone(
        &mut self,
        case: &str,
        mut f: impl FnMut() -> Result<()>,
    ) -> Result<Duration> {
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

/// What a peer written in Python printed, run as `WEIGHTBAY_PYTHON -c script args…` (default
/// `python3`), or why it did not run: its last line on standard error when it failed.
pub(crate) fn python_peer(
    script: &str,
    args: &[&dyn AsRef<std::ffi::OsStr>],
) -> std::result::Result<String, String> {
    let python = std::env::var("WEIGHTBAY_PYTHON").unwrap_or_else(|_| "python3".into());
    let output = std::process::Command::new(&python)
        .args(["-c", script])
        .args(args.iter().map(|arg| arg.as_ref()))
        .output()
        .map_err(|e| format!("{python} did not start: {e}"))?;
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        let last = stderr.lines().last().unwrap_or_default().to_owned();
        return Err(format!("{python} failed: {last}"));
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}
