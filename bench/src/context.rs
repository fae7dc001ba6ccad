//! What every case gets: the command line it was run with, and the table, data and scratch
//! directory of the run.

use std::path::PathBuf;

use weightbay::{Result, Writer};
use weightbay_local::LocalStorage;

use crate::harness::Data;
use crate::report::Table;

#[derive(clap::Parser)]
#[command(name = "weightbay-bench", about)]
pub(crate) struct Args {
    /// Size of the large checkpoint, in MiB (docs/BENCHMARKS.md uses 2048).
    #[arg(long, default_value_t = 2048)]
    pub(crate) size_mib: u64,
    /// Paired runs per case; the median is reported.
    #[arg(long, default_value_t = 3)]
    pub(crate) runs: usize,
    /// Scratch directory for the files (default: a temporary directory under /tmp).
    #[arg(long)]
    pub(crate) dir: Option<PathBuf>,
    /// Only the cases whose name contains one of these (comma-separated).
    #[arg(long)]
    pub(crate) only: Option<String>,
    /// Also write the rows as CSV here.
    #[arg(long)]
    pub(crate) csv: Option<PathBuf>,
    /// Replace the generated table in this Markdown document (docs/BENCHMARKS.md) with this
    /// run's.
    #[arg(long)]
    pub(crate) update_doc: Option<PathBuf>,
    /// Which generated section of that document to replace (its markers are
    /// `<!-- weightbay-bench SECTION: start -->` and `… end -->`).
    #[arg(long, default_value = "table")]
    pub(crate) section: String,
    /// Internal: measure the peak RSS of one save in a fresh process.
    #[arg(long, hide = true)]
    pub(crate) rss_case: Option<String>,
    /// Internal, for `python/bench/load_vs_safetensors.py`: time `--runs` loads of this
    /// container file from Rust, as `weightbay.load` makes them, one line of seconds each.
    #[arg(long, hide = true)]
    pub(crate) load_file: Option<PathBuf>,
    /// With `--load-file`: map the file, as `weightbay.load` does by default (else each
    /// tensor lands in memory of its own, as with `mmap=False`).
    #[arg(long, hide = true, requires = "load_file")]
    pub(crate) mapped: bool,
}

impl Args {
    /// Whether `--only` selects the case `name`.
    pub(crate) fn wants(&self, name: &str) -> bool {
        self.only
            .as_deref()
            .is_none_or(|only| only.split(',').any(|part| name.contains(part.trim())))
    }
}

/// What every case gets: the table to add rows to, the data, the scratch directory and the
/// local storage over it.
pub(crate) struct Bench<'a> {
    pub(crate) args: &'a Args,
    pub(crate) table: Table,
    pub(crate) big: Data,
    pub(crate) dir: PathBuf,
    pub(crate) local: LocalStorage,
}

/// Saves the large checkpoint to `big.bpk` in the scratch directory.
pub(crate) fn save_big(local: &LocalStorage, big: &Data) -> Result<()> {
    Writer::new(big.ours()).write_to(local, "big.bpk").map(drop)
}
