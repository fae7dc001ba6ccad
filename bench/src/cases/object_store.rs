//! The object-store cases: saving through object_store's InMemory store against raw
//! `WriteMultipart`, and, with an S3 server, loading, client CPU and peak memory.

use std::hint::black_box;
use std::sync::Arc;
use std::time::Duration;

use weightbay::{CreateOptions, Error, Reader, Result, Storage, StorageExt, WriteMode, Writer};
use weightbay_local::LocalStorage;
use weightbay_object_store::{ObjectStorage, ObjectStoreOptions};

use crate::context::Bench;
use crate::harness::{Start, cpu_time, io, median, paired, print_runs, timed};
use crate::peers::{RawUpload, boto3_transfer};
use crate::report::Row;
use crate::rss::rss_of;

/// A row `--only` matches by this name.
pub(crate) const OBJECT_STORE_SAVE: &str = "object store save";
/// A row `--only` matches by this name.
pub(crate) const OBJECT_STORE_LOAD: &str = "object store load";
/// A row `--only` matches by this name.
pub(crate) const OBJECT_STORE_COPY: &str = "object store copy";
/// A row `--only` matches by this name.
pub(crate) const OBJECT_STORE_CPU: &str = "object store cpu";
/// A row `--only` matches by this name.
pub(crate) const OBJECT_STORE_RSS: &str = "object store rss";

/// Every name [`object_store_cases`] answers to (`--only`).
pub(crate) const NAMES: &[&str] = &[
    OBJECT_STORE_SAVE,
    OBJECT_STORE_LOAD,
    OBJECT_STORE_COPY,
    OBJECT_STORE_CPU,
    OBJECT_STORE_RSS,
];

/// The object-store cases: saving through object_store's InMemory store against raw
/// `WriteMultipart`, and, with an S3 server, loading, client CPU and peak memory.
pub(crate) fn object_store_cases(b: &mut Bench<'_>) -> Result<()> {
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
    if wanted(OBJECT_STORE_SAVE) {
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
    if wanted(OBJECT_STORE_LOAD) {
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
    if wanted(OBJECT_STORE_COPY) {
        // What `weightbay cp s3://…/ours.bpk local.bpk` does: the container copied byte for
        // byte, read ahead in parallel (StorageExt::copy_in), into a local file.
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
            || cp(&load_storage, "ours.bpk", &local, "copied.bpk"),
            || raw_get_ranges(&ranges),
        )?;
        let key = format!("{}/ours.bpk", load_storage.prefix());
        let download = dir.join("boto3-download.bpk");
        match boto3_transfer(false, &key, &download)? {
            None => println!(
                "  cp against boto3: skipped, no Python with boto3 (WEIGHTBAY_PYTHON, or the venv scripts/servers.sh start s3 makes)"
            ),
            Some(_) => {
                let (ours, peer) = paired(
                    table.runs,
                    Start::Emptied,
                    || timed(|| cp(&load_storage, "ours.bpk", &local, "copied.bpk")),
                    || boto3_needed(boto3_transfer(false, &key, &download)),
                )?;
                table.push(Row {
                    case: format!("weightbay cp s3:// to a local file ({label})"),
                    ours,
                    peer: Some((
                        "boto3 download_file (AWS CLI transfer manager)".into(),
                        peer,
                    )),
                    bytes: big.bytes(),
                });
                let uploaded = format!("{}/boto3-upload.bpk", load_storage.prefix());
                let (ours, peer) = paired(
                    table.runs,
                    Start::Cached,
                    || timed(|| cp(&local, "copied.bpk", &load_storage, "cp-upload.bpk")),
                    || boto3_needed(boto3_transfer(true, &uploaded, &dir.join("copied.bpk"))),
                )?;
                table.push(Row {
                    case: format!("weightbay cp a local file to s3:// ({label})"),
                    ours,
                    peer: Some(("boto3 upload_file (AWS CLI transfer manager)".into(), peer)),
                    bytes: big.bytes(),
                });
            }
        }
    }
    if wanted(OBJECT_STORE_CPU) {
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
    if wanted(OBJECT_STORE_RSS) {
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

/// What `weightbay cp` does with a container it does not re-encode: `from_key` of `from`
/// copied byte for byte to `to_key` of `to` ([`StorageExt::copy_in`]).
pub(crate) fn cp(from: &dyn Storage, from_key: &str, to: &dyn Storage, to_key: &str) -> Result<()> {
    let source = from.open(from_key)?;
    to.copy_in(
        to_key,
        source.as_ref(),
        CreateOptions::default().with_mode(WriteMode::Overwrite),
    )
    .map(drop)
}

/// A boto3 run's time; an error when boto3 went away between runs.
fn boto3_needed(run: Result<Option<Duration>>) -> Result<Duration> {
    run?.ok_or_else(|| Error::invalid("boto3 is no longer available"))
}
