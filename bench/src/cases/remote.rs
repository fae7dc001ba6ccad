//! Loads from a store that behaves like a cloud store ([`SlowStore`]: 20 ms to first byte,
//! 100 MiB/s per connection), to choose the object-store backend's default request size and
//! parallelism and to show how close a load and a copy come to what the connections carry.
//!
//! The limit each row is set against is computed, not run: the bytes over (connections ×
//! 100 MiB/s), where the connections are the most requests the run had open at once. A copy
//! into a file system is also set against the lower of that and a save of the same bytes from
//! memory to that file system, run in turn with it.

use std::sync::Arc;
use std::time::Duration;

use object_store::ObjectStore;
use object_store::memory::InMemory;
use weightbay::{Format, Reader, Result, Writer};
use weightbay_local::LocalStorage;
use weightbay_object_store::{ObjectStorage, ObjectStoreOptions};

use crate::cases::object_store::cp;
use crate::context::Bench;
use crate::harness::{median, print_runs, seconds, timed};
use crate::report::Row;
use crate::store::SlowStore;

/// A cloud store's shape: time to first byte.
pub(crate) const LATENCY: Duration = Duration::from_millis(20);
/// A cloud store's shape: what one connection carries.
pub(crate) const CONNECTION_BYTES_PER_SECOND: f64 = 100.0 * (1 << 20) as f64;
/// A cloud store's shape: the GETs a client has open at once; more wait for a connection.
pub(crate) const CONNECTIONS: u64 = 16;
/// How much of the checkpoint each point of the curve loads.
const CURVE_BYTES: u64 = 512 << 20;

/// How long `bytes` take over `connections` capped connections, latency aside.
fn limit(bytes: u64, connections: u64) -> Duration {
    Duration::from_secs_f64(bytes as f64 / (connections as f64 * CONNECTION_BYTES_PER_SECOND))
}

/// A storage that reads `inner` through the slow store, and the slow store.
pub(crate) fn throttled_storage(
    inner: &Arc<dyn ObjectStore>,
    options: ObjectStoreOptions,
) -> Result<(ObjectStorage, Arc<SlowStore>)> {
    let throttled = Arc::new(
        SlowStore::new(Arc::clone(inner), LATENCY)
            .with_bandwidth(CONNECTION_BYTES_PER_SECOND)
            .with_connections(CONNECTIONS as usize),
    );
    let storage =
        ObjectStorage::new(Arc::clone(&throttled) as Arc<dyn ObjectStore>)?.with_options(options);
    Ok((storage, throttled))
}

/// The object the cases read: the big checkpoint, written once through the backend.
pub(crate) fn store_with(tensors: Vec<weightbay::Tensor>) -> Result<Arc<dyn ObjectStore>> {
    store_with_format(tensors, Format::Burnpack)
}

/// As [`store_with`], in `format`, at `big.safetensors` for safetensors, else `big.bpk`.
pub(crate) fn store_with_format(
    tensors: Vec<weightbay::Tensor>,
    format: Format,
) -> Result<Arc<dyn ObjectStore>> {
    let inner: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let key = if format == Format::Safetensors {
        "big.safetensors"
    } else {
        "big.bpk"
    };
    Writer::new(tensors)
        .with_format(format)
        .write_to(&ObjectStorage::new(Arc::clone(&inner))?, key)?;
    Ok(inner)
}

/// Times `f` over the bench's runs through `storage`, and records it against what the
/// connections it opened at once could carry.
fn against_limit(
    b: &mut Bench<'_>,
    case: String,
    bytes: u64,
    throttled: &SlowStore,
    f: impl FnMut() -> Result<()>,
) -> Result<()> {
    against_limit_after(b, case, bytes, throttled, || Ok(()), f)
}

/// [`against_limit`], with `before` run ahead of each run, untimed.
fn against_limit_after(
    b: &mut Bench<'_>,
    case: String,
    bytes: u64,
    throttled: &SlowStore,
    mut before: impl FnMut() -> Result<()>,
    mut f: impl FnMut() -> Result<()>,
) -> Result<()> {
    let runs = runs_against_limit(b.table.runs, bytes, throttled, &mut before, &mut f, None)?;
    print_runs(&runs.times, &runs.limits);
    b.table.push(runs.row(case, bytes));
    Ok(())
}

/// A copy into a file system, against the connections' limit as [`against_limit_after`] and
/// against the lower of that and what the file system takes in: each run also times `save`,
/// the same bytes saved from memory to the same file system as the copy writes them (after
/// `before` again, in turn first and second), and a second row sets each run of the copy
/// against the longer of the two.
fn copy_against_limits(
    b: &mut Bench<'_>,
    case: String,
    bytes: u64,
    throttled: &SlowStore,
    mut before: impl FnMut() -> Result<()>,
    mut copy: impl FnMut() -> Result<()>,
    mut save: impl FnMut() -> Result<()>,
) -> Result<()> {
    let runs = runs_against_limit(
        b.table.runs,
        bytes,
        throttled,
        &mut before,
        &mut copy,
        Some(&mut save),
    )?;
    print_runs(&runs.times, &runs.limits);
    println!(
        "    each save of the same bytes from memory to the same file system, seconds: {}",
        seconds(&runs.saves)
    );
    let slower: Vec<Duration> = runs
        .limits
        .iter()
        .zip(&runs.saves)
        .map(|(limit, save)| *limit.max(save))
        .collect();
    b.table.push(runs.row(case.clone(), bytes));
    b.table.push(Row {
        case: format!("{case}: against the lower limit"),
        ours: median(runs.times),
        peer: Some((
            "the connections or a save from memory to the same file system, the slower".to_owned(),
            median(slower),
        )),
        bytes,
    });
    Ok(())
}

/// Each run's time, its connections' limit, and (when asked) the paired save's time.
struct LimitRuns {
    times: Vec<Duration>,
    limits: Vec<Duration>,
    saves: Vec<Duration>,
    most_open: u64,
}

impl LimitRuns {
    /// The row setting the runs against what their connections carry.
    fn row(&self, case: String, bytes: u64) -> Row {
        Row {
            case,
            ours: median(self.times.clone()),
            peer: Some((
                format!(
                    "{} × {:.0} MiB/s connections",
                    self.most_open,
                    CONNECTION_BYTES_PER_SECOND / f64::from(1 << 20)
                ),
                median(self.limits.clone()),
            )),
            bytes,
        }
    }
}

/// Runs `f` `runs` times after `before`, each against what the connections it opened at once
/// carry of `bytes`; with `save`, also times it after `before` in each run, first in odd runs
/// and second in even ones.
fn runs_against_limit(
    runs: usize,
    bytes: u64,
    throttled: &SlowStore,
    before: &mut dyn FnMut() -> Result<()>,
    f: &mut dyn FnMut() -> Result<()>,
    mut save: Option<&mut dyn FnMut() -> Result<()>>,
) -> Result<LimitRuns> {
    let mut out = LimitRuns {
        times: Vec::new(),
        limits: Vec::new(),
        saves: Vec::new(),
        most_open: 0,
    };
    let mut saved =
        |before: &mut dyn FnMut() -> Result<()>, saves: &mut Vec<Duration>| -> Result<()> {
            if let Some(save) = save.as_mut() {
                before()?;
                saves.push(timed(&mut **save)?);
            }
            Ok(())
        };
    for run in 0..runs {
        if run % 2 == 1 {
            saved(before, &mut out.saves)?;
        }
        before()?;
        throttled.counts().take_most_open();
        out.times.push(timed(&mut *f)?);
        let connections = throttled.counts().take_most_open().max(1);
        out.most_open = out.most_open.max(connections);
        out.limits.push(limit(bytes, connections));
        if run % 2 == 0 {
            saved(before, &mut out.saves)?;
        }
    }
    Ok(out)
}

/// A row `--only` matches by this name.
pub(crate) const REMOTE_CURVE: &str = "remote curve";
/// A row `--only` matches by this name.
pub(crate) const REMOTE_LOAD: &str = "remote load";
/// A row `--only` matches by this name.
pub(crate) const REMOTE_COPY: &str = "remote copy";
/// A row `--only` matches by this name.
pub(crate) const REMOTE_RSS: &str = "remote rss";

/// Every name [`remote_cases`] answers to (`--only`).
pub(crate) const NAMES: &[&str] = &[REMOTE_CURVE, REMOTE_LOAD, REMOTE_COPY, REMOTE_RSS];

pub(crate) fn remote_cases(b: &mut Bench<'_>) -> Result<()> {
    let inner = store_with(b.big.ours())?;
    if b.args.wants(REMOTE_CURVE) {
        let (storage, _) = throttled_storage(&inner, ObjectStoreOptions::DEFAULT)?;
        let reader = Reader::open_key(&storage, "big.bpk")?;
        let mut in_data_order: Vec<_> = reader.tensors().iter().collect();
        in_data_order.sort_by_key(|info| info.range().start);
        let (mut names, mut bytes) = (Vec::new(), 0);
        for info in in_data_order {
            if bytes >= CURVE_BYTES {
                break;
            }
            names.push(info.name().to_owned());
            bytes += info.byte_len();
        }
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        for request_mib in [8u64, 16, 32, 64] {
            for in_flight in [1u64, 4, 16] {
                let options = ObjectStoreOptions::DEFAULT
                    .with_fetch_request_len(Some(request_mib << 20))
                    .with_fetch_budget((request_mib * in_flight) as usize * (1 << 20));
                let (storage, throttled) = throttled_storage(&inner, options)?;
                let reader = Reader::open_key(&storage, "big.bpk")?;
                against_limit(
                    b,
                    format!("remote curve: {request_mib} MiB requests, budget {in_flight}×"),
                    bytes,
                    &throttled,
                    || reader.load(&names).map(drop),
                )?;
            }
        }
    }
    if b.args.wants(REMOTE_RSS) {
        let rss = crate::rss::rss_of("remote-copy", b.args.size_mib, &b.dir)?;
        println!(
            "  peak RSS a remote copy of {} MiB of 16 MiB tensors adds: {} MiB (bound: a {} MiB piece per thread, regions streamed and written by position)",
            b.args.size_mib,
            rss >> 20,
            weightbay::backend_kit::PIECE_LEN >> 20
        );
    }
    let options = ObjectStoreOptions::DEFAULT;
    let (storage, throttled) = throttled_storage(&inner, options)?;
    let bytes = b.big.bytes();
    let setting = format!(
        "{} MiB requests, {} MiB budget",
        options.fetch_request_len.unwrap_or(0) >> 20,
        options.fetch_budget >> 20
    );
    if b.args.wants(REMOTE_LOAD) {
        let reader = Reader::open_key(&storage, "big.bpk")?;
        against_limit(
            b,
            format!("remote load: Reader::load_all, defaults ({setting})"),
            bytes,
            &throttled,
            || reader.load_all().map(drop),
        )?;
    }
    if b.args.wants(REMOTE_COPY) {
        // Each run copies to a new file: the previous copy is removed first, untimed, since
        // replacing it would time the kernel freeing its 2 GiB (0.3-0.5 s on tmpfs here). It is
        // removed here, not through `LocalStorage::delete`, which leaves a large file to be
        // freed on a thread of its own: that freeing would run beside the timed copy.
        fn fresh(dir: &std::path::Path) -> Result<()> {
            match std::fs::remove_file(dir.join("copied.bpk")) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    Err(weightbay::Error::io("removing the previous copy", e))
                }
                _ => Ok(()),
            }
        }
        // What the file system takes in: the same checkpoint saved from memory, with the
        // copy's durability (the default: fsync on a local disk).
        let tensors = b.big.ours();
        let save = |to: &LocalStorage| {
            Writer::new(tensors.clone())
                .write_to(to, "copied.bpk")
                .map(drop)
        };
        let (local, dir) = (LocalStorage::new(&b.dir), b.dir.clone());
        copy_against_limits(
            b,
            format!("remote copy to a local file, as weightbay cp ({setting})"),
            bytes,
            &throttled,
            || fresh(&dir),
            || cp(&storage, "big.bpk", &local, "copied.bpk"),
            || save(&local),
        )?;
        // The same copy to a file in memory (tmpfs), where the disk's writeback cannot be what
        // the copy waits for: the network's side of it.
        if let Ok(shm) = tempfile::tempdir_in("/dev/shm") {
            let in_memory = LocalStorage::new(shm.path());
            copy_against_limits(
                b,
                format!("remote copy to a file on tmpfs, as weightbay cp ({setting})"),
                bytes,
                &throttled,
                || fresh(shm.path()),
                || cp(&storage, "big.bpk", &in_memory, "copied.bpk"),
                || save(&in_memory),
            )?;
        }
    }
    Ok(())
}

/// In a fresh process (`--rss-case remote-copy`): the copy above, from a store filled first,
/// printing the peak RSS the copy added above the filled store.
pub(crate) fn copy_rss(tensors: Vec<weightbay::Tensor>, dir: &std::path::Path) -> Result<u64> {
    let inner = store_with(tensors)?;
    let (storage, _) = throttled_storage(&inner, ObjectStoreOptions::DEFAULT)?;
    // Resets the peak to the current resident set (Linux), so the peak read after the copy is
    // the copy's own.
    std::fs::write("/proc/self/clear_refs", "5")
        .map_err(|e| weightbay::Error::io("resetting the peak RSS", e))?;
    let before = crate::rss::rss("VmRSS:");
    cp(&storage, "big.bpk", &LocalStorage::new(dir), "copied.bpk")?;
    Ok(crate::rss::rss("VmHWM:").saturating_sub(before))
}
