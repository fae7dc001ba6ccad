//! `weightbay cp`: a container or sharded set into one container (converting its format if
//! asked), or checkpoints into another prefix, each reading as its source byte for byte
//! (stored raw or with its pieces compressed), each commit record last.

use std::process::ExitCode;
use std::sync::Arc;

use clap::{Args, ValueEnum};
use weightbay::{Durability, ErrorKind, Format, Result, StorageExt, WriteMode, Writer};
use weightbay_checkpoints::Checkpoints;
use weightbay_location::Location;

use crate::escape::escaped;
use crate::progress;
use crate::reach::{INTERRUPTED, locate, report_stalls, restarting};
use crate::target::{self, Target, resolve};

/// The arguments of `weightbay cp`.
#[derive(Args)]
pub(crate) struct CpArgs {
    /// Source path or URL.
    pub(crate) src: String,
    /// Destination path or URL; its extension (.bpk, .safetensors) picks the format.
    pub(crate) dst: String,
    /// The destination format, overriding the extension.
    #[arg(long, value_enum)]
    pub(crate) format: Option<FormatArg>,
    /// Fail if the destination exists (race-free where the storage allows).
    #[arg(long)]
    pub(crate) no_clobber: bool,
    /// Of a checkpoint prefix, this step instead of the latest.
    #[arg(long, conflicts_with = "all")]
    pub(crate) step: Option<u64>,
    /// Of a checkpoint prefix, every complete checkpoint not yet at the destination.
    #[arg(long)]
    pub(crate) all: bool,
    /// Of a checkpoint prefix, write the checkpoint (the latest, or `--step`) as one
    /// self-contained container at the destination, in its extension's format, that any
    /// tool reads: an incremental checkpoint's pieces gathered from every checkpoint they
    /// lie in.
    #[arg(long, conflicts_with = "all")]
    pub(crate) materialize: bool,
    /// Of a checkpoint prefix, store each copy's pieces compressed, as a compressed save
    /// stores them: fewer bytes to a slower destination, read back bit for bit. A sharded
    /// set or a checkpoint written by several ranks is copied raw. Without `--compress` or
    /// `--decompress` a copy keeps its source's: a compressed checkpoint is copied compressed.
    #[arg(long, conflicts_with_all = ["materialize", "decompress"])]
    pub(crate) compress: bool,
    /// Of a checkpoint prefix, store each copy raw: a compressed checkpoint's pieces decoded
    /// into one container that any tool can map or read.
    #[arg(long, conflicts_with = "materialize")]
    pub(crate) decompress: bool,
}

/// How a copy of a checkpoint stores its pieces.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Encoding {
    /// As its source stores them: compressed when any is encoded.
    AsSource,
    Compressed,
    Raw,
}

/// Runs `weightbay cp`.
pub(crate) fn run(args: CpArgs) -> Result<ExitCode> {
    let CpArgs {
        src,
        dst,
        format,
        no_clobber,
        step,
        all,
        materialize,
        compress,
        decompress,
    } = args;
    let encoding = match (compress, decompress) {
        (true, _) => Encoding::Compressed,
        (_, true) => Encoding::Raw,
        _ => Encoding::AsSource,
    };
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
                let format = format.map(FormatArg::format);
                return materialize_checkpoint(&source, steps[0], &to, format, mode, &dst);
            }
            return copy_checkpoints(&source, &to, &steps, (encoding, &dst));
        }
        if encoding != Encoding::AsSource {
            return Err(weightbay::Error::invalid(
                "--compress and --decompress apply to checkpoint prefixes: a container is \
                 copied as it is stored",
            ));
        }
        let ((tensors, len), format) = restarting(&src, || {
            let became_prefix = || {
                weightbay::Error::new(ErrorKind::Changed, "the source became a checkpoint prefix")
            };
            let resolved = resolve(&from)?;
            let source_format = match &resolved {
                Target::Container(reader) => reader.format(),
                Target::Sharded(shards) => {
                    shards.first().map_or(Format::Burnpack, |(_, r)| r.format())
                }
                Target::Checkpoints(_) => return Err(became_prefix()),
            };
            let format = format.map_or_else(
                || Format::from_file_name(to.file_name()).unwrap_or(source_format),
                FormatArg::format,
            );
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
/// destination can), their pieces stored by `encoding`, skipping steps already committed
/// there.
fn copy_checkpoints(
    source: &Checkpoints,
    to: &Location,
    steps: &[u64],
    (encoding, dst): (Encoding, &str),
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
        let one_container = record.is_one_container();
        let compress = one_container
            && match encoding {
                Encoding::AsSource => record.is_encoded(),
                Encoding::Compressed => true,
                Encoding::Raw => false,
            };
        if encoding == Encoding::Compressed && !one_container {
            eprintln!("step {step} has several containers (shards or ranks): copied raw");
        }
        let copied = if compress {
            destination.copy_compressed_from(&checkpoint, durability)
        } else {
            destination.copy_from(&checkpoint, durability)
        };
        counting.finish();
        match copied {
            Ok(record) => {
                let stored: u64 = record.containers.iter().map(|c| c.len).sum();
                let how = if compress { "compressed" } else { "raw" };
                eprintln!(
                    "copied checkpoint step {step}: {} containers, {total} bytes, stored {how} \
                     in {stored} bytes, to {dst}",
                    record.containers.len()
                );
            }
            Err(e) if e.kind() == ErrorKind::AlreadyExists && steps.len() > 1 => {
                eprintln!("step {step} is at {dst} already; skipped");
            }
            Err(e) => return Err(e),
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// A format asked for by name.
#[derive(Clone, Copy, ValueEnum)]
pub(crate) enum FormatArg {
    Burnpack,
    Safetensors,
}

impl FormatArg {
    fn format(self) -> Format {
        match self {
            Self::Burnpack => Format::Burnpack,
            Self::Safetensors => Format::Safetensors,
        }
    }
}
