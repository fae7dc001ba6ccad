//! The object store as it behaves at scale, through the fault-injecting proxy
//! (`scripts/fault_proxy.py`) in front of the S3 server: the big checkpoint saved and loaded
//! (in shards) through each of [`FAULT_SETS`] (throttling and resets, held answers, bodies that
//! stop or trickle), against the same through a proxy that injects nothing, and through a
//! uniformly slow link with stall detection on and off; and a stalled part against the
//! per-request deadline, retries that run out, and a whole-save timeout.

use std::cell::RefCell;
use std::hint::black_box;
use std::time::{Duration, Instant};

use object_store::{BackoffConfig, RetryConfig};
use weightbay::{
    DType, Error, ErrorKind, Reader, Result, ShardedSummary, ShardedWriter, Storage, Tensor, Writer,
};
use weightbay_conformance::FaultProxy;
use weightbay_object_store::{ObjectStorage, open_url_with_retry};

use crate::context::Bench;
use crate::harness::{Start, median, print_runs, timed};
use crate::report::Row;

/// What the big checkpoint is saved and loaded through, each set paired with a proxy that does
/// the same minus the faults.
pub(crate) struct FaultSet {
    /// The case's name, which `--only` matches and its rows start with.
    pub(crate) case: &'static str,
    /// The proxy's faults (scripts/fault_proxy.py).
    faults: &'static str,
    /// The peer's proxy: `{}`, or the part of the faults that is not a fault (a link's speed).
    peer_faults: &'static str,
    /// Whether the peer's storage runs with stall detection off.
    peer_without_stall_detection: bool,
    /// The proxy's counts the run prints.
    counts: &'static [&'static str],
}

pub(crate) const FAULT_SETS: &[FaultSet] = &[
    // S3's throttling answer to a tenth of the requests, and one in a hundred responses cut
    // halfway.
    FaultSet {
        case: "faulty store (10% 503 SlowDown, 1% resets)",
        faults: r#"{"status_share": 0.1, "status": 503, "reset_share": 0.01, "seed": 11}"#,
        peer_faults: "{}",
        peer_without_stall_detection: false,
        counts: &["status", "reset"],
    },
    // The server takes the request and sends nothing: the defaults' stall detection against
    // the clean proxy.
    FaultSet {
        case: "faulty store (8% held answers)",
        faults: r#"{"hold_share": 0.08, "seed": 12}"#,
        peer_faults: "{}",
        peer_without_stall_detection: false,
        counts: &["held"],
    },
    FaultSet {
        case: "faulty store (5% bodies stopping half way, 5% trickling)",
        faults: r#"{"half_body_stall_share": 0.05, "drip_share": 0.05, "seed": 13}"#,
        peer_faults: "{}",
        peer_without_stall_detection: false,
        counts: &["half_body_stalled", "dripped"],
    },
    // A uniformly slow link, which stall detection must not cut: on against off.
    FaultSet {
        case: "faulty store (every connection at 20 MiB/s)",
        faults: r#"{"bandwidth_bytes_per_s": 20971520}"#,
        peer_faults: r#"{"bandwidth_bytes_per_s": 20971520}"#,
        peer_without_stall_detection: true,
        counts: &["forwarded"],
    },
];

/// A row `--only` matches by this name.
pub(crate) const STALLED_PART: &str = "stalled part";

/// Every name [`fault_cases`] answers to (`--only`).
pub(crate) const NAMES: &[&str] = &[
    FAULT_SETS[0].case,
    FAULT_SETS[1].case,
    FAULT_SETS[2].case,
    FAULT_SETS[3].case,
    STALLED_PART,
];

pub(crate) fn fault_cases(b: &mut Bench<'_>) -> Result<()> {
    let (Ok(base), Ok(endpoint)) = (
        std::env::var("WEIGHTBAY_S3_URL"),
        std::env::var("AWS_ENDPOINT"),
    ) else {
        println!(
            "  faulty store, stalled part: skipped, no S3 server (vars=$(scripts/servers.sh start s3) && eval \"$vars\")"
        );
        return Ok(());
    };
    if std::env::var("WEIGHTBAY_FAULT_PROXY").is_err() {
        println!(
            "  faulty store, stalled part: skipped, no fault proxy (vars=$(scripts/servers.sh start proxy) && eval \"$vars\")"
        );
        return Ok(());
    }
    let server = Server { base, endpoint };
    for set in FAULT_SETS {
        if b.args.wants(set.case) {
            faulty_store(b, &server, set)?;
        }
    }
    if b.args.wants(STALLED_PART) {
        stalled_part(b, &server)?;
    }
    Ok(())
}

/// The S3 server the proxies stand in front of.
struct Server {
    base: String,
    endpoint: String,
}

impl Server {
    /// A proxy injecting `faults`, and a storage through it under `prefix` whose requests are
    /// cut after `timeout` and retried as `retry` says.
    fn through(
        &self,
        faults: &str,
        prefix: &str,
        timeout: &str,
        retry: RetryConfig,
    ) -> Result<(FaultProxy, ObjectStorage)> {
        let proxy = FaultProxy::start(&self.endpoint, faults)
            .ok_or_else(|| Error::new(ErrorKind::Io, "no fault proxy"))?;
        let url = format!("{}/bench-faults-{}/{prefix}", self.base, std::process::id());
        let storage = open_url_with_retry(
            &url,
            [
                ("aws_endpoint", proxy.url()),
                ("timeout", timeout.to_owned()),
            ],
            retry,
        )?;
        // Requests the size a remote store is read in (a store on this machine would be read
        // in one request per run of tensors, which a reset would send back to the start).
        let options = storage.options().with_fetch_request_len(Some(16 << 20));
        Ok((proxy, storage.with_options(options)))
    }
}

/// Shards of the big checkpoint, so that each object is 128 MiB: moto copies the whole object
/// for every ranged GET (2.5 s for 16 MiB of a 2 GiB object, measured), which would make the
/// load of one 2 GiB object the emulator's benchmark rather than ours.
const SHARD_LEN: u64 = 128 << 20;

/// The big checkpoint saved as shards, then loaded and compared byte for byte, through a
/// proxy injecting `set`'s faults and through its peer's proxy, paired, with the defaults a
/// user gets.
fn faulty_store(b: &mut Bench<'_>, server: &Server, set: &FaultSet) -> Result<()> {
    let (storm, faulty) = server.through(set.faults, "faulty", "30s", RetryConfig::default())?;
    let (_peer_proxy, clean) =
        server.through(set.peer_faults, "peer", "30s", RetryConfig::default())?;
    let clean = if set.peer_without_stall_detection {
        let off = clean.options().with_stall_detection(None);
        clean.with_options(off)
    } else {
        clean
    };
    let case = set.case;
    let peer = if set.peer_without_stall_detection {
        "the same with stall detection off"
    } else {
        "the same through a clean proxy"
    };
    println!(
        "  faulty store: {} MiB in shards of {} MiB through a proxy injecting {}, against {peer}",
        b.big.bytes() >> 20,
        SHARD_LEN >> 20,
        set.faults
    );
    let big = &b.big;
    // Each storage's saves, each under a name of its own: the loads read the last, and all
    // are removed after the runs, untimed (a delete held by the proxy is not the save's cost).
    let saved: [RefCell<Vec<ShardedSummary>>; 2] = Default::default();
    let save = |storage: &ObjectStorage, all: &RefCell<Vec<ShardedSummary>>| {
        let name = format!("big-{}", all.borrow().len());
        let summary = ShardedWriter::new(Writer::new(big.ours()))
            .with_shard_len(SHARD_LEN)
            .write_to(storage, &name)?;
        all.borrow_mut().push(summary);
        Ok(())
    };
    b.table.compare(
        Start::Cached,
        &format!("{case}: save to the S3 server"),
        big.bytes(),
        peer,
        || save(&faulty, &saved[0]),
        || save(&clean, &saved[1]),
    )?;
    let load = |storage: &ObjectStorage, all: &RefCell<Vec<ShardedSummary>>| -> Result<()> {
        let shards = all
            .borrow()
            .last()
            .map(|summary| summary.shards.clone())
            .unwrap_or_default();
        let mut tensors = 0;
        for shard in &shards {
            let reader = Reader::open_key(storage, shard)?;
            for (info, bytes) in reader.load_all()? {
                let expected = big
                    .tensors
                    .iter()
                    .find(|(name, _)| name == info.name())
                    .map(|(_, data)| data);
                let loaded = bytes.read(weightbay::AccessPolicy::AllowCopy)?;
                if expected.map(|data| &data[..]) != Some(loaded) {
                    return Err(Error::corrupt(format!(
                        "{} came back different",
                        info.name()
                    )));
                }
                tensors += 1;
                black_box(loaded);
            }
        }
        if tensors != big.tensors.len() {
            return Err(Error::corrupt(format!(
                "{tensors} tensors loaded of {}",
                big.tensors.len()
            )));
        }
        Ok(())
    };
    b.table.compare(
        Start::Cached,
        &format!("{case}: load, byte for byte"),
        big.bytes(),
        peer,
        || load(&faulty, &saved[0]),
        || load(&clean, &saved[1]),
    )?;
    if let Some(summary) = saved[0].borrow().last() {
        for shard in &summary.shards {
            Reader::open_key(&faulty, shard)?.verify()?;
        }
    }
    let injected: Vec<String> = set
        .counts
        .iter()
        .map(|what| format!("{what} {}", storm.count(what)))
        .collect();
    println!(
        "    of {} requests the proxy injected: {}; every shard verifies; the client's pace: {:?}; stall detection cut: {:?} (the peer: {:?})",
        storm.count("requests"),
        injected.join(", "),
        faulty.throttle().map(|t| t.counts()),
        faulty.stall_watch().map(|w| w.counts()),
        clean.stall_watch().map(|w| w.counts())
    );
    for (storage, all) in [(&faulty, &saved[0]), (&clean, &saved[1])] {
        for summary in all.take() {
            remove(storage, &summary)?;
        }
    }
    Ok(())
}

/// Deletes a sharded set's shards and index.
fn remove(storage: &ObjectStorage, summary: &ShardedSummary) -> Result<()> {
    for key in summary.shards.iter().chain([&summary.index]) {
        storage.delete(key)?;
    }
    Ok(())
}

/// Retries whose backoff is short next to the deadlines measured.
fn quick(max_retries: usize) -> RetryConfig {
    RetryConfig {
        backoff: BackoffConfig {
            init_backoff: Duration::from_millis(10),
            max_backoff: Duration::from_millis(100),
            base: 2.0,
        },
        max_retries,
        retry_timeout: Duration::from_secs(120),
    }
}

/// A 64 MiB save whose second part stalls, with a 5 s per-request deadline: once (retried)
/// against the clean save plus the deadline; for ever with one retry against the deadlines
/// it may take; and for ever with an 8 s timeout on the whole save against that timeout.
fn stalled_part(b: &mut Bench<'_>, server: &Server) -> Result<()> {
    const REQUEST_DEADLINE: Duration = Duration::from_secs(5);
    let container = || {
        Writer::new(
            (0..8u8)
                .map(|i| Tensor::new(format!("t{i}"), DType::U8, [8 << 20], vec![i; 8 << 20]))
                .collect(),
        )
    };
    let bytes = container().size()?;
    println!(
        "  stalled part: {} MiB in 8 MiB parts, part 2's request never answered, requests cut after {REQUEST_DEADLINE:?}",
        bytes >> 20
    );
    let (mut stalled, mut clean) = (Vec::new(), Vec::new());
    for run in 0..b.table.runs {
        let (_clean_proxy, storage) = server.through("{}", "clean", "5s", quick(3))?;
        clean.push(timed(|| container().write_to(&storage, "m.bpk").map(drop))?);
        let (proxy, storage) = server.through(
            r#"{"stall": {"match": "partNumber=2", "times": 1}}"#,
            &format!("stalled-{run}"),
            "5s",
            quick(3),
        )?;
        stalled.push(timed(|| container().write_to(&storage, "m.bpk").map(drop))?);
        if proxy.count("stalled") != 1 {
            return Err(Error::new(ErrorKind::Io, "the part did not stall"));
        }
    }
    let bound: Vec<Duration> = clean.iter().map(|t| *t + REQUEST_DEADLINE).collect();
    print_runs(&stalled, &bound);
    b.table.push(Row {
        case: "stalled part, cut at the 5 s request deadline and retried: whole save".to_owned(),
        ours: median(stalled),
        peer: Some((
            "the clean save + the 5 s deadline".to_owned(),
            median(bound),
        )),
        bytes: 0,
    });
    // Retries that run out: two tries of 5 s, 10 ms backoff between them.
    let (_proxy, storage) = server.through(
        r#"{"stall": {"match": "partNumber=2", "times": -1}}"#,
        "exhausted",
        "5s",
        quick(1),
    )?;
    let (took, error) = failing(|| container().write_to(&storage, "m.bpk").map(drop))?;
    println!("    retries exhausted after {took:?}: {error}");
    b.table.push(Row {
        case: format!(
            "stalled part, 1 retry: the error, naming key and part, arrives after ({})",
            named(&error, &["m.bpk", "part 2"])
        ),
        ours: took,
        peer: Some(("two 5 s request deadlines".to_owned(), REQUEST_DEADLINE * 2)),
        bytes: 0,
    });
    // A whole-save timeout shorter than the retries.
    let timeout = Duration::from_secs(8);
    let (_proxy, storage) = server.through(
        r#"{"stall": {"match": "partNumber=2", "times": -1}}"#,
        "timeout",
        "5s",
        quick(3),
    )?;
    let options = storage.options().with_save_timeout(Some(timeout));
    let storage = storage.with_options(options);
    let (took, error) = failing(|| container().write_to(&storage, "m.bpk").map(drop))?;
    println!("    save timeout: failed after {took:?}: {error}");
    b.table.push(Row {
        case: format!(
            "stalled part, an 8 s save timeout: the error arrives after ({})",
            named(&error, &["m.bpk", "part 2", "deadline"])
        ),
        ours: took,
        peer: Some(("the 8 s timeout".to_owned(), timeout)),
        bytes: 0,
    });
    Ok(())
}

/// How long `f` took to fail, and its error.
fn failing(f: impl FnOnce() -> Result<()>) -> Result<(Duration, Error)> {
    let started = Instant::now();
    match f() {
        Ok(()) => Err(Error::new(ErrorKind::Io, "a save meant to fail succeeded")),
        Err(e) => Ok((started.elapsed(), e)),
    }
}

/// Which of `words` the error's text holds, for the row.
fn named(error: &Error, words: &[&str]) -> String {
    let text = format!("{error:#}");
    words
        .iter()
        .map(|word| {
            let mark = if text.contains(word) {
                "names"
            } else {
                "MISSES"
            };
            format!("{mark} `{word}`")
        })
        .collect::<Vec<_>>()
        .join(", ")
}
