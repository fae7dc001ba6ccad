//! `weightbay export`: any checkpoint, sharded set or container written as a Hugging Face
//! model directory (safetensors shards and `model.safetensors.index.json`, the index last).

use std::process::ExitCode;
use std::sync::Arc;

use clap::{Args, ValueEnum};
use weightbay::{DType, Durability, Error, Result, Tensor};
use weightbay_checkpoints::{EXPORT_INDEX, ExportOptions, ExportSummary, export_tensors};

use crate::escape::escaped;
use crate::reach::{INTERRUPTED, locate, report_stalls};
use crate::target::{self, Target, resolve};

/// What `weightbay export` takes.
#[derive(Args)]
pub(crate) struct ExportArgs {
    /// Source path or URL: a checkpoint prefix (the latest, or `--step`), a sharded set's
    /// `*.index.json`, or one container.
    src: String,
    /// Destination directory or prefix, on any storage.
    dst: String,
    /// Of a checkpoint prefix, this step instead of the latest.
    #[arg(long)]
    step: Option<u64>,
    /// The most tensor bytes per shard: bytes, or with a unit (5GB, 500MB, 2GiB); a larger
    /// tensor gets a shard of its own.
    #[arg(long, default_value = "5GB", value_parser = parse_size)]
    max_shard_size: u64,
    /// Convert floating-point tensors to this dtype on the way (rounding to nearest even).
    #[arg(long, value_enum)]
    dtype: Option<DtypeArg>,
    /// Export only tensors whose stored name matches this glob (`*` any characters, `?`
    /// one); may be given several times.
    #[arg(long)]
    include: Vec<String>,
    /// Leave out tensors whose stored name matches this glob (optimizer state, say); may be
    /// given several times.
    #[arg(long)]
    exclude: Vec<String>,
    /// `FROM=TO`: a stored name starting with FROM is exported with TO in its place (the
    /// first that matches); may be given several times.
    #[arg(long, value_parser = parse_pair)]
    rename: Vec<(String, String)>,
    /// `DROPPED=KEPT`: DROPPED is written once, as KEPT, after their bytes are checked to be
    /// equal (exported names). With a config.json saying `tie_word_embeddings`, lm_head.weight
    /// is tied to the tensor holding its bytes without this.
    #[arg(long, value_parser = parse_pair)]
    tie: Vec<(String, String)>,
    /// Start each shard's data on a multiple of N, and each tensor whose byte length is a
    /// multiple of N on one (safetensors allows no gap between tensors: see FORMAT.md).
    #[arg(long)]
    align: Option<u64>,
    /// A local file to copy beside the shards (config.json, tokenizer files); may be given
    /// several times.
    #[arg(long = "with")]
    with_files: Vec<std::path::PathBuf>,
    /// Replace an export already at the destination (its index is deleted first).
    #[arg(long)]
    overwrite: bool,
}

#[derive(Clone, Copy, ValueEnum)]
enum DtypeArg {
    Bf16,
    Fp16,
    Fp32,
}

/// `5GB`, `500MB`, `2GiB`, `1024`: bytes, with decimal (kB, MB, GB) or binary (KiB, MiB, GiB)
/// units, as transformers' `max_shard_size` reads them.
fn parse_size(text: &str) -> std::result::Result<u64, String> {
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let number: u64 = number
        .parse()
        .map_err(|_| format!("`{text}` is not a size such as 5GB or 500MiB"))?;
    let scale: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        "kib" => 1 << 10,
        "mib" => 1 << 20,
        "gib" => 1 << 30,
        _ => {
            return Err(format!(
                "`{text}`: the unit is one of B, kB, MB, GB, KiB, MiB, GiB"
            ));
        }
    };
    number
        .checked_mul(scale)
        .filter(|&size| size > 0)
        .ok_or_else(|| format!("`{text}` is not a size above 0 that fits in 64 bits"))
}

fn parse_pair(text: &str) -> std::result::Result<(String, String), String> {
    text.split_once('=')
        .map(|(a, b)| (a.to_owned(), b.to_owned()))
        .ok_or_else(|| format!("`{text}` is not of the form A=B"))
}

/// Runs `weightbay export`.
pub(crate) fn run(args: ExportArgs) -> Result<ExitCode> {
    let (from, to) = (locate(&args.src)?, locate(&args.dst)?);
    let options = options(&args, to.storage.capabilities().durable_commit)?;
    let storage = Arc::clone(&to.storage);
    let summary = match resolve(&from)? {
        Target::Checkpoints(checkpoints) => {
            let step = target::chosen(&checkpoints, args.step, false)?[0];
            checkpoints.open(step)?.export(storage, &to.key, &options)?
        }
        Target::Sharded(shards) => export_tensors(tensors_of(&shards), storage, &to.key, &options)?,
        Target::Container(reader) => export_tensors(
            reader.to_writer().tensors().to_vec(),
            storage,
            &to.key,
            &options,
        )?,
    };
    report(&summary, &args);
    report_stalls(&[&from, &to]);
    Ok(ExitCode::SUCCESS)
}

fn tensors_of(shards: &[(String, weightbay::Reader)]) -> Vec<Tensor> {
    shards
        .iter()
        .flat_map(|(_, reader)| reader.to_writer().tensors().to_vec())
        .collect()
}

/// The library's options from the command line, the `--with` files read.
fn options(args: &ExportArgs, durable: bool) -> Result<ExportOptions> {
    let mut options = ExportOptions::default()
        .with_max_shard_size(args.max_shard_size)
        .with_cancel(Arc::clone(&INTERRUPTED));
    if durable {
        options = options.with_durability(Durability::Durable);
    }
    if let Some(dtype) = args.dtype {
        options = options.with_dtype(match dtype {
            DtypeArg::Bf16 => DType::BF16,
            DtypeArg::Fp16 => DType::F16,
            DtypeArg::Fp32 => DType::F32,
        });
    }
    for pattern in &args.include {
        options = options.including(pattern);
    }
    for pattern in &args.exclude {
        options = options.excluding(pattern);
    }
    for (from, to) in &args.rename {
        options = options.renaming(from, to);
    }
    for (dropped, kept) in &args.tie {
        options = options.tying(dropped, kept);
    }
    if let Some(alignment) = args.align {
        options = options.with_alignment(alignment);
    }
    if args.overwrite {
        options = options.overwriting();
    }
    for path in &args.with_files {
        let bytes = std::fs::read(path)
            .map_err(|e| Error::from(e).context(format_args!("--with {}", path.display())))?;
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .ok_or_else(|| Error::invalid(format!("--with {}: no file name", path.display())))?;
        if name == "config.json" && ties_word_embeddings(&bytes) {
            options = options.tying_lm_head();
        }
        options = options.with_file(name, bytes);
    }
    Ok(options)
}

/// Whether a transformers config says its output embedding is the input one.
fn ties_word_embeddings(config: &[u8]) -> bool {
    serde_json::from_slice::<serde_json::Value>(config)
        .ok()
        .and_then(|config| config.get("tie_word_embeddings")?.as_bool())
        .unwrap_or(false)
}

fn report(summary: &ExportSummary, args: &ExportArgs) {
    for (dropped, kept) in &summary.tied {
        eprintln!(
            "tied: {} is written once, as {}",
            escaped(dropped),
            escaped(kept)
        );
    }
    if summary.cleaned > 0 {
        eprintln!(
            "removed {} unfinished write(s) that killed exports left in the directory",
            summary.cleaned
        );
    }
    if let Some(alignment) = args.align {
        eprintln!(
            "{} of {} tensors start on a multiple of {alignment} bytes",
            summary.aligned, summary.tensors
        );
    }
    eprintln!(
        "exported {} tensors, {} bytes, in {} shards, to {} (its index, {EXPORT_INDEX}, \
         written last)",
        summary.tensors,
        summary.total_size,
        summary.shards.len(),
        escaped(&args.dst)
    );
}
