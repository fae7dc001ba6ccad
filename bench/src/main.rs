//! `weightbay-bench`: throughput on this machine, as ratios against its raw limits and against
//! burn-pack, the safetensors crate and raw object_store on the same data in the same run.
//! docs/BENCHMARKS.md lists the cases and the figures. Not part of any installed program: the
//! peers are this crate's dependencies only.

mod cases;
mod client;
mod context;
mod cuda;
mod harness;
mod peers;
mod report;
mod rss;
mod store;

use weightbay::Result;
use weightbay_local::LocalStorage;

use crate::context::{Args, Bench};
use crate::harness::{Data, io};
use crate::report::{Table, csv, print_table, update_doc};

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

/// A case: the names `--only` matches (one function may measure several), and what it runs.
pub(crate) type Case = (&'static [&'static str], fn(&mut Bench<'_>) -> Result<()>);

/// Every case, in the order they run.
pub(crate) const CASES: &[Case] = &[
    (&["cases::encode::into_bytes"], cases::encode::into_bytes),
    (&["cases::encode::plan"], cases::encode::plan),
    (&["open"], cases::encode::open_index),
    (cases::save::DURABLE_SAVE_NAMES, cases::save::durable_save),
    (&["small tensors"], cases::save::small_tensors),
    (&["mmap load"], cases::load::mmap_load),
    (&["pread"], cases::load::pread),
    (&["cold load"], cases::load::cold_load),
    (&["into caller memory"], cases::load::into_caller_memory),
    (
        cases::object_store::NAMES,
        cases::object_store::object_store_cases,
    ),
    (cases::remote::NAMES, cases::remote::remote_cases),
    (&["async"], cases::stall::async_stall),
    (cases::lifecycle::NAMES, cases::lifecycle::lifecycle_cases),
    (
        cases::incremental::NAMES,
        cases::incremental::incremental_cases,
    ),
    (&["candle"], cases::candle::candle_cases),
    (
        cases::cold_start::NAMES,
        cases::cold_start::cold_start_cases,
    ),
    (cases::burn::NAMES, cases::burn::burn_cases),
    (cases::ranks::NAMES, cases::ranks::ranks_cases),
    (cases::faults::NAMES, cases::faults::fault_cases),
    (cases::tiered::NAMES, cases::tiered::tiered_cases),
    (&["gc among planted objects"], cases::gc::gc_cases),
    (cases::export::NAMES, cases::export::export_cases),
    (&["staging into device memory"], cases::device::device_cases),
    (&["codec"], cases::codec::codec_cases),
    (
        cases::compressed::COMPRESSED_CASES_NAMES,
        cases::compressed::compressed_cases,
    ),
    (
        &["compressed chain storage"],
        cases::compressed::chain_cases,
    ),
];

fn run(args: &Args) -> Result<()> {
    let temporary = tempfile::tempdir().map_err(io("creating a temporary directory"))?;
    let dir = args
        .dir
        .clone()
        .unwrap_or_else(|| temporary.path().to_path_buf());
    std::fs::create_dir_all(&dir).map_err(io("creating the scratch directory"))?;
    if let Some(case) = &args.rss_case {
        return cases::rss_probe::run(case, args.size_mib, &dir);
    }
    if let Some(path) = &args.load_file {
        return cases::python_pair::run(path, args.mapped, args.runs.max(1));
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
        let data = format!(
            "{} MiB in {} tensors",
            bench.big.bytes() >> 20,
            bench.big.tensors.len()
        );
        update_doc(path, &args.section, &data, &bench.table)?;
    }
    Ok(())
}
