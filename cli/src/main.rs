//! `weightbay`: inspect, verify and copy checkpoints on any storage.

mod cp;
mod demo;
mod escape;
mod export;
mod gc;
mod inspect;
mod ls;
mod progress;
mod reach;
mod target;
mod tiers;
mod verify;

use std::process::ExitCode;
use std::sync::atomic::Ordering;

use clap::{Parser, Subcommand};
use escape::escaped;
use reach::INTERRUPTED;
use weightbay::{ErrorKind, Result};

/// Checkpoints on local disk, in memory maps, and in object storage.
#[derive(Parser)]
#[command(name = "weightbay", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

/// Every command takes a path or URL (file://, s3://, gs://, az://, memory://) naming one
/// container, a sharded set's `*.index.json`, or a training run's checkpoint prefix (the
/// directory its `step-N/` directories are in).
#[derive(Subcommand)]
enum Command {
    /// List the tensors, metadata and scalars of a container, a sharded set, or a checkpoint
    /// (the latest, or `--step N`).
    Inspect(inspect::InspectArgs),
    /// Check structure and every checksum; exit 0 only if all verify. Checkpoints are checked
    /// against the CRC32C of every container in their commit record.
    Verify(verify::VerifyArgs),
    /// Copy between any two storages: a container or sharded set into one container
    /// (converting its format if asked), or a checkpoint into another checkpoint prefix
    /// (reading as its source byte for byte, stored raw or compressed, its commit record
    /// last).
    Cp(cp::CpArgs),
    /// List the checkpoints under a prefix: step, time, bytes stored, bytes of earlier
    /// checkpoints referred to (incremental saves), format, and whether complete. With
    /// `--durable`, the prefix is the fast tier of tiered checkpoints and both tiers are shown
    /// side by side.
    Ls(ls::LsArgs),
    /// Delete old checkpoints (with `--keep-last`/`--keep-every`) and what dead saves left.
    /// The newest complete checkpoint is never deleted.
    Gc(gc::GcArgs),
    /// Write a checkpoint (any rank layout, incremental or tiered), sharded set or container
    /// as a Hugging Face model directory: `model-0000k-of-0000N.safetensors` shards and
    /// `model.safetensors.index.json`, written last, with every shard's CRC32C for `verify`.
    Export(export::ExportArgs),
    /// Write a synthetic ~1 GiB checkpoint to a local file and an embedded object store, read
    /// it back, verify it, and report speeds. Needs nothing else running.
    Demo {
        /// Total size in MiB.
        #[arg(long, default_value_t = 1024)]
        size_mib: u64,
        /// Where to put the local file (default: a temporary directory).
        #[arg(long)]
        dir: Option<std::path::PathBuf>,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let _ = ctrlc::set_handler(|| INTERRUPTED.store(true, Ordering::SeqCst));
    match run(cli.command) {
        Ok(code) => code,
        Err(e) if e.kind() == ErrorKind::Interrupted => {
            eprintln!("interrupted: the destination was left as it was");
            ExitCode::from(130)
        }
        Err(e) => {
            eprintln!("error: {}", escaped(&e.to_string()));
            ExitCode::FAILURE
        }
    }
}

/// Runs one command, each in its module.
fn run(command: Command) -> Result<ExitCode> {
    match command {
        Command::Inspect(args) => inspect::run(args),
        Command::Verify(args) => verify::run(args),
        Command::Cp(args) => cp::run(args),
        Command::Ls(args) => ls::run(args),
        Command::Gc(args) => gc::run(args),
        Command::Export(args) => export::run(args),
        Command::Demo { size_mib, dir } => demo::run(size_mib, dir).map(|()| ExitCode::SUCCESS),
    }
}
