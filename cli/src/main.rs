//! `weightbay`: inspect, verify and copy checkpoints on any storage.

mod demo;
mod escape;
mod export;
mod progress;
mod reach;
mod target;
mod tiers;

use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use clap::{Parser, Subcommand, ValueEnum};
use escape::escaped;
use reach::{INTERRUPTED, locate, report_stalls};
use target::{Target, resolve};
use weightbay::Format;
use weightbay::backend_kit::read_in_order;
use weightbay::{Durability, ErrorKind, Reader, Result, Scalar, StorageExt, WriteMode, Writer};
use weightbay::{ShardChecksum, ShardedWeights};
use weightbay_checkpoints::{Checkpoints, Retention, StepState, StepStatus, Tiered};
use weightbay_object_store::Location;

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
    Inspect {
        /// Path or URL.
        url: String,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
        /// Of a checkpoint prefix, this step instead of the latest.
        #[arg(long)]
        step: Option<u64>,
    },
    /// Check structure and every checksum; exit 0 only if all verify. Checkpoints are checked
    /// against the CRC32C of every container in their commit record.
    Verify {
        /// Path or URL.
        url: String,
        /// Fail when a container carries no checksums (no integrity trailer and no commit
        /// record).
        #[arg(long)]
        require_checksums: bool,
        /// Of a checkpoint prefix, this step instead of the latest.
        #[arg(long, conflicts_with = "all")]
        step: Option<u64>,
        /// Of a checkpoint prefix, every committed checkpoint.
        #[arg(long)]
        all: bool,
    },
    /// Copy between any two storages: a container or sharded set into one container
    /// (converting its format if asked), or a checkpoint into another checkpoint prefix
    /// (byte for byte, its commit record last).
    Cp {
        /// Source path or URL.
        src: String,
        /// Destination path or URL; its extension (.bpk, .safetensors) picks the format.
        dst: String,
        /// The destination format, overriding the extension.
        #[arg(long, value_enum)]
        format: Option<FormatArg>,
        /// Fail if the destination exists (race-free where the storage allows).
        #[arg(long)]
        no_clobber: bool,
        /// Of a checkpoint prefix, this step instead of the latest.
        #[arg(long, conflicts_with = "all")]
        step: Option<u64>,
        /// Of a checkpoint prefix, every complete checkpoint not yet at the destination.
        #[arg(long)]
        all: bool,
        /// Of a checkpoint prefix, write the checkpoint (the latest, or `--step`) as one
        /// self-contained container at the destination, in its extension's format, that any
        /// tool reads: an incremental checkpoint's pieces gathered from every checkpoint they
        /// lie in.
        #[arg(long, conflicts_with = "all")]
        materialize: bool,
    },
    /// List the checkpoints under a prefix: step, time, bytes stored, bytes of earlier
    /// checkpoints referred to (incremental saves), format, and whether complete. With
    /// `--durable`, the prefix is the fast tier of tiered checkpoints and both tiers are shown
    /// side by side.
    Ls {
        /// Path or URL of the checkpoint prefix (of the fast tier, with `--durable`).
        url: String,
        /// Path or URL of the durable tier's checkpoint prefix, for tiered checkpoints.
        #[arg(long)]
        durable: Option<String>,
    },
    /// Delete old checkpoints (with `--keep-last`/`--keep-every`) and what dead saves left.
    /// The newest complete checkpoint is never deleted.
    Gc {
        /// Path or URL of the checkpoint prefix.
        url: String,
        /// Keep the newest N complete checkpoints.
        #[arg(long)]
        keep_last: Option<usize>,
        /// Also keep every checkpoint whose step is a multiple of K.
        #[arg(long)]
        keep_every: Option<u64>,
        /// Say what would be deleted, and delete nothing.
        #[arg(long)]
        dry_run: bool,
    },
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

#[derive(Clone, Copy, ValueEnum)]
enum FormatArg {
    Burnpack,
    Safetensors,
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

/// Runs a one-shot read of `what` again from the start, up to three times in all, when the
/// object was replaced while it was read, saying so: the copy or verify then covers one whole
/// version, the newest.
fn restarting<T>(what: &str, attempt: impl FnMut() -> Result<T>) -> Result<T> {
    weightbay::retry_on_change(3, attempt, |e, attempt| {
        eprintln!(
            "{} changed while it was read ({}); starting over on its new version (attempt {attempt} of 3)",
            escaped(what),
            escaped(&e.to_string())
        );
    })
}

fn run(command: Command) -> Result<ExitCode> {
    match command {
        Command::Inspect { url, json, step } => {
            let readers = match resolve(&locate(&url)?)? {
                Target::Container(reader) => vec![(url, reader)],
                Target::Sharded(shards) => shards,
                Target::Checkpoints(checkpoints) => {
                    let step = target::chosen(&checkpoints, step, false)?[0];
                    target::containers(&checkpoints.open(step)?)?
                }
            };
            if json {
                // One container prints as before; several (shards) as a list naming each.
                let value = match readers.as_slice() {
                    [(_, reader)] => inspect_json(reader),
                    several => serde_json::Value::Array(
                        several
                            .iter()
                            .map(|(key, reader)| {
                                let mut value = inspect_json(reader);
                                value["key"] = key.as_str().into();
                                value
                            })
                            .collect(),
                    ),
                };
                println!(
                    "{}",
                    serde_json::to_string_pretty(&value).unwrap_or_default()
                );
            } else {
                let several = readers.len() > 1;
                for (key, reader) in &readers {
                    if several {
                        println!("== {}", escaped(key));
                    }
                    print!("{}", inspect_table(reader));
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Verify {
            url,
            require_checksums,
            step,
            all,
        } => {
            let location = locate(&url)?;
            match restarting(&url, || resolve(&location))? {
                Target::Container(_) => {
                    let unrecorded = |_: &str| None;
                    verify_containers(&url, require_checksums, unrecorded, || {
                        match resolve(&location)? {
                            Target::Container(reader) => Ok(vec![(url.clone(), reader)]),
                            _ => Err(weightbay::Error::new(
                                ErrorKind::Changed,
                                "no longer a container",
                            )),
                        }
                    })
                }
                Target::Sharded(_) => {
                    // An export's index records every shard's length and CRC32C.
                    let index = ShardedWeights::open(Arc::clone(&location.storage), &location.key)?;
                    let recorded = |key: &str| index.recorded_checksum(key);
                    verify_containers(&url, require_checksums, recorded, || {
                        match resolve(&location)? {
                            Target::Sharded(shards) => Ok(shards),
                            _ => Err(weightbay::Error::new(
                                ErrorKind::Changed,
                                "no longer an index",
                            )),
                        }
                    })
                }
                Target::Checkpoints(checkpoints) => {
                    verify_checkpoints(&checkpoints, target::chosen(&checkpoints, step, all)?)
                }
            }
        }
        Command::Cp {
            src,
            dst,
            format,
            no_clobber,
            step,
            all,
            materialize,
        } => {
            let (from, to) = (locate(&src)?, locate(&dst)?);
            // The copy's own returns end this closure, so the stalls are reported either way.
            let copied = (|| -> Result<ExitCode> {
                let mode = if no_clobber {
                    WriteMode::CreateNew
                } else {
                    WriteMode::Overwrite
                };
                if let Target::Checkpoints(source) = resolve(&from)? {
                    let steps = target::chosen(&source, step, all)?;
                    if materialize {
                        let format = format.map(|f| match f {
                            FormatArg::Burnpack => Format::Burnpack,
                            FormatArg::Safetensors => Format::Safetensors,
                        });
                        return materialize_checkpoint(&source, steps[0], &to, format, mode, &dst);
                    }
                    return copy_checkpoints(&source, &to, &steps, &dst);
                }
                let ((tensors, len), format) = restarting(&src, || {
                    let became_prefix = || {
                        weightbay::Error::new(
                            ErrorKind::Changed,
                            "the source became a checkpoint prefix",
                        )
                    };
                    let resolved = resolve(&from)?;
                    let source_format = match &resolved {
                        Target::Container(reader) => reader.format(),
                        Target::Sharded(shards) => {
                            shards.first().map_or(Format::Burnpack, |(_, r)| r.format())
                        }
                        Target::Checkpoints(_) => return Err(became_prefix()),
                    };
                    let format = match format {
                        Some(FormatArg::Burnpack) => Format::Burnpack,
                        Some(FormatArg::Safetensors) => Format::Safetensors,
                        None => Format::from_file_name(to.file_name()).unwrap_or(source_format),
                    };
                    let tensors = match resolved {
                        Target::Container(reader) if format == source_format => {
                            let len = copy_bytes(reader.source().as_ref(), &to, mode)?;
                            return Ok(((reader.tensors().len(), len), format));
                        }
                        Target::Container(reader) => reader.to_writer(),
                        Target::Sharded(shards) => Writer::new(target::merged_tensors(&shards)?),
                        Target::Checkpoints(_) => return Err(became_prefix()),
                    };
                    let writer = tensors
                        .with_format(format)
                        .with_mode(mode)
                        .with_cancel(Arc::clone(&INTERRUPTED));
                    let storage = progress::Counting::new(Arc::clone(&to.storage), writer.size()?);
                    let summary = writer.write_to(&storage, &to.key)?;
                    storage.finish();
                    Ok(((summary.tensors, summary.len), format))
                })?;
                eprintln!(
                    "copied {tensors} tensors, {len} bytes, as {format}, to {}",
                    escaped(&dst)
                );
                Ok(ExitCode::SUCCESS)
            })();
            report_stalls(&[&from, &to]);
            copied
        }
        Command::Ls { url, durable: None } => {
            let checkpoints = checkpoints_at(&url)?;
            print!("{}", ls_table(&checkpoints.list()?));
            Ok(ExitCode::SUCCESS)
        }
        Command::Ls {
            url,
            durable: Some(durable),
        } => {
            let tiered = Tiered::new(checkpoints_at(&url)?, checkpoints_at(&durable)?);
            print!("{}", tiers::ls_table(&tiered.list()?));
            Ok(ExitCode::SUCCESS)
        }
        Command::Gc {
            url,
            keep_last,
            keep_every,
            dry_run,
        } => {
            let checkpoints = checkpoints_at(&url)?;
            let policy = keep_last
                .map_or_else(Retention::default, Retention::keep_last)
                .and_every(keep_every.unwrap_or(0));
            let retire = keep_last.is_some() || keep_every.is_some();
            let verb = if dry_run { "would delete" } else { "deleted" };
            // One pass, planned or carried out: a dry run prints exactly what the same gc
            // deletes, the retired checkpoints' containers included.
            let report = match (retire, dry_run) {
                (false, false) => checkpoints.gc()?,
                (false, true) => checkpoints.gc_plan()?,
                (true, false) => checkpoints.gc_retaining(&policy)?,
                (true, true) => checkpoints.gc_plan_retaining(&policy)?,
            };
            print!("{}", gc_lines(&report, verb));
            eprintln!(
                "{verb} {} checkpoints, {} stray containers and {} unfinished writes",
                report.checkpoints.len(),
                report.orphans.len(),
                report.pending.len()
            );
            Ok(ExitCode::SUCCESS)
        }
        Command::Export(args) => export::run(args),
        Command::Demo { size_mib, dir } => demo::run(size_mib, dir).map(|()| ExitCode::SUCCESS),
    }
}

/// What a gc pass deleted (or would delete, with `verb` saying which) and kept, a line each,
/// stored names escaped.
fn gc_lines(report: &weightbay_checkpoints::GcReport, verb: &str) -> String {
    let mut out = String::new();
    for step in &report.checkpoints {
        out += &format!("{verb} checkpoint step {step}\n");
    }
    for pending in &report.pending {
        out += &format!(
            "{verb} unfinished write of {}\n",
            escaped(&pending.to_string())
        );
    }
    for orphan in &report.orphans {
        out += &format!("{verb} {} (no commit record names it)\n", escaped(orphan));
    }
    for spent in &report.spent {
        out += &format!(
            "{verb} {} (an announcement whose save committed, or expired)\n",
            escaped(spent)
        );
    }
    for (key, why) in &report.kept {
        out += &format!("keeping {} ({})\n", escaped(key), escaped(why));
    }
    for refused in &report.refused {
        out += &format!("left untouched: {}\n", escaped(&refused.to_string()));
    }
    out
}

/// The checkpoints under `url`, which must be able to list.
fn checkpoints_at(url: &str) -> Result<Checkpoints> {
    let location = locate(url)?;
    if !location.storage.capabilities().listing {
        return Err(weightbay::Error::unsupported(format!(
            "{} cannot list, so it holds no checkpoints this command can find",
            location.store
        )));
    }
    // A prefix that does not exist would list as one without checkpoints: say which it is.
    let local = match url.split_once("://") {
        None => Some(url),
        Some(("file", path)) => Some(path),
        Some(_) => None,
    };
    // Unfinished writes count: a prefix whose only upload was killed is one `gc` cleans.
    let missing = match local {
        Some(path) => !std::path::Path::new(path).exists(),
        None => {
            location.storage.list(&location.key)?.is_empty()
                && (!location.storage.capabilities().pending_listing
                    || location.storage.pending(&location.key)?.is_empty())
        }
    };
    if missing {
        let why = if local.is_some() {
            format!("`{url}` does not exist")
        } else {
            format!(
                "nothing is stored under `{url}` (an object-store prefix exists only while \
                 objects are under it)"
            )
        };
        return Err(weightbay::Error::new(weightbay::ErrorKind::NotFound, why));
    }
    Ok(Checkpoints::over(location.storage, location.key))
}

/// Verifies every container `open` returns (again from the start if one is replaced
/// meanwhile), one line each, and every byte of those whose length and CRC32C `recorded`
/// knows against them.
fn verify_containers(
    url: &str,
    require_checksums: bool,
    recorded: impl Fn(&str) -> Option<ShardChecksum>,
    mut open: impl FnMut() -> Result<Vec<(String, Reader)>>,
) -> Result<ExitCode> {
    let reports = restarting(url, || {
        open()?
            .into_iter()
            .map(|(key, reader)| {
                let mut report = reader.verify().map_err(|e| e.with_key(&key))?;
                if let Some(expected) = recorded(&key) {
                    let source = reader.source();
                    let crc = read_in_order(source.as_ref(), 0..source.len(), |_| Ok(()))
                        .map_err(|e| e.with_key(&key))?;
                    if (source.len(), crc) != (expected.len, expected.crc32c) {
                        return Err(weightbay::Error::corrupt(format!(
                            "{} bytes with CRC32C {crc:08x}; the index records {} bytes with \
                             {:08x}",
                            source.len(),
                            expected.len,
                            expected.crc32c
                        ))
                        .with_key(&key));
                    }
                    report.checksummed = true;
                }
                Ok((key, report))
            })
            .collect::<Result<Vec<_>>>()
    })?;
    let several = reports.len() > 1;
    let mut unchecked = false;
    for (key, report) in &reports {
        let name = if several {
            format!("{}: ", escaped(key))
        } else {
            String::new()
        };
        if report.checksummed {
            println!(
                "ok: {name}{} tensors, {} bytes, every checksum matches",
                report.tensors, report.bytes
            );
        } else {
            unchecked = true;
            println!(
                "ok: {name}{} tensors, {} bytes, structure and padding verified; no checksums to compare",
                report.tensors, report.bytes
            );
        }
    }
    if unchecked && require_checksums {
        eprintln!("error: a container carries no integrity trailer (--require-checksums)");
        return Ok(ExitCode::FAILURE);
    }
    Ok(ExitCode::SUCCESS)
}

/// Verifies each checkpoint of `steps`: every container's bytes against its commit record,
/// and its structure. Reports every one, and fails if any fails.
fn verify_checkpoints(checkpoints: &Checkpoints, steps: Vec<u64>) -> Result<ExitCode> {
    let mut failed = 0;
    for step in &steps {
        let checked = checkpoints.open(*step).and_then(|checkpoint| {
            let report = checkpoint.verify()?;
            for (key, reader) in target::containers(&checkpoint)? {
                reader.verify().map_err(|e| e.with_key(&key))?;
            }
            Ok(report)
        });
        match checked {
            Ok(report) => println!(
                "ok: step {step}: {} containers, {} bytes, every CRC32C matches the commit record",
                report.containers, report.bytes
            ),
            Err(e) => {
                failed += 1;
                println!("FAILED: step {step}: {}", escaped(&e.to_string()));
            }
        }
    }
    if failed > 0 {
        eprintln!(
            "error: {failed} of {} checkpoints failed to verify",
            steps.len()
        );
        return Ok(ExitCode::FAILURE);
    }
    Ok(ExitCode::SUCCESS)
}

/// A container copied byte for byte to `to` (the same format: nothing to re-encode), read
/// in parallel from a store that gains from it (written by position where `to` takes that, in
/// order otherwise), committed last
/// ([`StorageExt::copy_in`](weightbay::StorageExt::copy_in)); Ctrl-C aborts it, leaving `to` as
/// it was. Returns the bytes copied.
fn copy_bytes(source: &dyn weightbay::Source, to: &Location, mode: WriteMode) -> Result<u64> {
    let storage = progress::Counting::new(Arc::clone(&to.storage), source.len())
        .with_cancel(Arc::clone(&INTERRUPTED));
    storage.copy_in(
        &to.key,
        source,
        weightbay::CreateOptions::default().with_mode(mode),
    )?;
    storage.finish();
    Ok(source.len())
}

/// Writes the one container of `step` under `source` to `to`, whole: byte for byte when the
/// format stays, converted otherwise.
fn materialize_checkpoint(
    source: &Checkpoints,
    step: u64,
    to: &Location,
    format: Option<Format>,
    mode: WriteMode,
    dst: &str,
) -> Result<ExitCode> {
    let reader = source.open(step)?.reader()?;
    let format = format
        .or_else(|| Format::from_file_name(to.file_name()))
        .unwrap_or(reader.format());
    let len = if format == reader.format() {
        copy_bytes(reader.source().as_ref(), to, mode)?
    } else {
        let writer = reader.to_writer().with_format(format).with_mode(mode);
        let storage = progress::Counting::new(Arc::clone(&to.storage), writer.size()?);
        let summary = writer.write_to(&storage, &to.key)?;
        storage.finish();
        summary.len
    };
    eprintln!("wrote checkpoint step {step} whole, {len} bytes, as {format}, to {dst}");
    Ok(ExitCode::SUCCESS)
}

/// Copies the checkpoints of `steps` from `source` to the prefix `to` (durably where the
/// destination can), skipping steps already committed there.
fn copy_checkpoints(
    source: &Checkpoints,
    to: &Location,
    steps: &[u64],
    dst: &str,
) -> Result<ExitCode> {
    let durability = if to.storage.capabilities().durable_commit {
        Durability::Durable
    } else {
        Durability::default()
    };
    for &step in steps {
        let checkpoint = source.open(step)?;
        let record = checkpoint.record();
        // An incremental checkpoint arrives whole: its pieces' bytes.
        let total = record
            .pieces
            .as_ref()
            .map_or_else(|| record.containers.iter().map(|c| c.len).sum(), |p| p.len);
        let counting = Arc::new(progress::Counting::new(Arc::clone(&to.storage), total));
        let destination = Checkpoints::over(
            Arc::clone(&counting) as Arc<dyn weightbay::Storage>,
            to.key.clone(),
        );
        let copied = destination.copy_from(&checkpoint, durability);
        counting.finish();
        match copied {
            Ok(record) => eprintln!(
                "copied checkpoint step {step}: {} containers, {total} bytes, to {dst}",
                record.containers.len()
            ),
            Err(e) if e.kind() == ErrorKind::AlreadyExists && steps.len() > 1 => {
                eprintln!("step {step} is at {dst} already; skipped");
            }
            Err(e) => return Err(e),
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// The `ls` table: each step's bytes stored under its directory, the bytes of earlier steps
/// it refers to, and the bytes it reads as (more than it stores when its pieces are
/// compressed). A checkpoint written by several ranks shows their number; a step whose ranks
/// are still writing (or died) shows which ranks' manifests are missing.
fn ls_table(statuses: &[StepStatus]) -> String {
    // Steps without a record whose containers a recorded step's pieces lie in: retired by
    // retention, kept for those that refer to them.
    let mut referrers: std::collections::BTreeMap<u64, Vec<u64>> = Default::default();
    for status in statuses {
        for referred in status.referenced_steps() {
            referrers.entry(referred).or_default().push(status.step);
        }
    }
    let mut out = format!(
        "{:>12}  {:<23}  {:>14}  {:>14}  {:>14}  {:<11}  {:>10}  {:>5}  state\n",
        "step", "time", "bytes", "refers to", "reads as", "format", "containers", "ranks"
    );
    for status in statuses {
        let (time, format, containers, refers, reads_as) = match &status.record {
            Some(record) => (
                target::utc(record.time_unix_ms),
                escaped(&record.format).into_owned(),
                record.containers.len().to_string(),
                record.references().values().sum::<u64>().to_string(),
                record
                    .pieces
                    .as_ref()
                    .map_or_else(|| record.containers.iter().map(|c| c.len).sum(), |p| p.len)
                    .to_string(),
            ),
            None => (
                "-".to_owned(),
                "-".to_owned(),
                "-".to_owned(),
                "-".to_owned(),
                "-".to_owned(),
            ),
        };
        let ranks = match (&status.record, &status.ranks) {
            (Some(record), _) => record.world_size.map(|w| w.to_string()),
            (None, Some(progress)) => Some(format!(
                "{}/{}",
                progress.written.len(),
                progress.world_size
            )),
            (None, None) => None,
        };
        let state = match (&status.state, &status.ranks) {
            (StepState::Complete, _) => "complete".to_owned(),
            (StepState::Damaged(why), _) => format!("DAMAGED: {}", escaped(why)),
            (StepState::Uncommitted, Some(progress)) if !progress.failed.is_empty() => {
                let failed: Vec<u32> = progress.failed.iter().map(|f| f.rank).collect();
                let silent: Vec<u32> = progress
                    .missing()
                    .into_iter()
                    .filter(|rank| !failed.contains(rank))
                    .collect();
                let mut state = format!("uncommitted: rank(s) {} FAILED", rank_list(&failed));
                if !silent.is_empty() {
                    state += &format!("; waiting for rank(s) {}", rank_list(&silent));
                }
                for failure in progress.failed.iter().take(4) {
                    state += &format!(
                        "\n{:>14}rank {}: {}",
                        "",
                        failure.rank,
                        escaped(&failure.error)
                    );
                }
                if progress.failed.len() > 4 {
                    state += &format!("\n{:>14}and {} more", "", progress.failed.len() - 4);
                }
                state
            }
            (StepState::Uncommitted, Some(progress)) if !progress.missing().is_empty() => {
                format!(
                    "uncommitted: waiting for rank(s) {} (still writing, or died)",
                    rank_list(&progress.missing())
                )
            }
            (StepState::Uncommitted, Some(_)) => {
                "uncommitted: every rank wrote its manifest, none committed (a rank's \
                 rerun, or Checkpoints::commit_ranks, commits it)"
                    .to_owned()
            }
            (StepState::Uncommitted, None) => match referrers.get(&status.step) {
                Some(steps) => format!(
                    "retired: no commit record, but step(s) {} refer to its containers, which \
                     stay until none does",
                    steps_list(steps)
                ),
                None => "uncommitted (saving, or a save that died)".to_owned(),
            },
        };
        out += &format!(
            "{:>12}  {time:<23}  {:>14}  {refers:>14}  {reads_as:>14}  {format:<11}  {containers:>10}  {:>5}  {state}\n",
            status.step,
            status.stored_bytes,
            ranks.as_deref().unwrap_or("-")
        );
    }
    if statuses.is_empty() {
        out += "(no checkpoints)\n";
    }
    out
}

/// Steps as `3, 4, 9`: at most 8 of them, then how many more.
fn steps_list(steps: &[u64]) -> String {
    let shown: Vec<String> = steps.iter().take(8).map(u64::to_string).collect();
    match steps.len() {
        n if n > 8 => format!("{} and {} more", shown.join(", "), n - 8),
        _ => shown.join(", "),
    }
}

/// Ranks as `0, 3, 5` — at most 16 of them, then how many more.
fn rank_list(ranks: &[u32]) -> String {
    let shown: Vec<String> = ranks.iter().take(16).map(u32::to_string).collect();
    match ranks.len() {
        n if n > 16 => format!("{} and {} more", shown.join(", "), n - 16),
        _ => shown.join(", "),
    }
}

fn inspect_table(reader: &Reader) -> String {
    let mut out = format!(
        "format: {}\nbytes: {}\ntensors: {}\nintegrity trailer: {}\n",
        reader.format(),
        reader.len(),
        reader.tensors().len(),
        if reader.has_trailer() { "yes" } else { "no" }
    );
    let rows: Vec<[String; 5]> = reader
        .tensors()
        .iter()
        .map(|t| {
            [
                escaped(t.name()).into_owned(),
                t.dtype().to_string(),
                format!("{:?}", t.shape()),
                t.byte_len().to_string(),
                t.range().start.to_string(),
            ]
        })
        .collect();
    let header = ["name", "dtype", "shape", "bytes", "offset"];
    let mut widths = header.map(str::len);
    for row in &rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let line = |cells: [&str; 5]| {
        let mut text = String::new();
        for (i, (cell, width)) in cells.iter().zip(widths).enumerate() {
            // Numbers right-aligned, text left-aligned.
            if i >= 3 {
                text += &format!("{cell:>width$}  ");
            } else {
                text += &format!("{cell:<width$}  ");
            }
        }
        text.trim_end().to_owned() + "\n"
    };
    out += "\n";
    out += &line(header);
    for row in &rows {
        out += &line([&row[0], &row[1], &row[2], &row[3], &row[4]]);
    }
    if !reader.metadata().is_empty() {
        out += "\nmetadata:\n";
        for (k, v) in reader.metadata() {
            out += &format!("  {} = {}\n", escaped(k), escaped(v));
        }
    }
    if !reader.scalars().is_empty() {
        out += "\nscalars:\n";
        for (k, v) in reader.scalars() {
            out += &format!("  {} = {v}\n", escaped(k));
        }
    }
    out
}

fn inspect_json(reader: &Reader) -> serde_json::Value {
    let tensors: Vec<serde_json::Value> = reader
        .tensors()
        .iter()
        .map(|t| {
            serde_json::json!({
                "name": t.name(),
                "dtype": t.dtype().to_string(),
                "shape": t.shape(),
                "bytes": t.byte_len(),
                "offset": t.range().start,
                "param_id": t.param_id(),
            })
        })
        .collect();
    let scalars: serde_json::Map<String, serde_json::Value> = reader
        .scalars()
        .iter()
        .map(|(k, v)| {
            let value = match *v {
                Scalar::Int(x) => serde_json::json!({ "int": x }),
                Scalar::UInt(x) => serde_json::json!({ "uint": x }),
                Scalar::Float(x) => serde_json::json!({ "float": x }),
                Scalar::Bool(x) => serde_json::json!({ "bool": x }),
            };
            (k.clone(), value)
        })
        .collect();
    serde_json::json!({
        "format": reader.format().to_string(),
        "bytes": reader.len(),
        "trailer": reader.has_trailer(),
        "tensors": tensors,
        "metadata": reader.metadata(),
        "scalars": scalars,
    })
}
