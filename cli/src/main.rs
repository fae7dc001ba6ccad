//! `weightbay`: inspect, verify and copy checkpoints on any storage.

mod demo;
mod progress;

use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, LazyLock};

use clap::{Parser, Subcommand, ValueEnum};
use weightbay::format::Format;
use weightbay::{ErrorKind, Reader, Result, Scalar, WriteMode};
use weightbay_object_store::Location;

/// Checkpoints on local disk, in memory maps, and in object storage.
#[derive(Parser)]
#[command(name = "weightbay", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// List a checkpoint's tensors, metadata and scalars.
    Inspect {
        /// Path or URL (file://, s3://, gs://, az://, memory://).
        url: String,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Check a checkpoint's structure and every checksum; exit 0 only if all verify.
    Verify {
        /// Path or URL.
        url: String,
        /// Fail when the checkpoint carries no checksums (no integrity trailer).
        #[arg(long)]
        require_checksums: bool,
    },
    /// Copy a checkpoint between any two storages, converting its format if asked.
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
    },
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

/// Set by Ctrl-C; a copy in progress stops at its next write and leaves the destination as
/// it was.
static INTERRUPTED: LazyLock<Arc<AtomicBool>> = LazyLock::new(Arc::default);

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
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// object_store's retry policy, with `WEIGHTBAY_MAX_RETRIES` capping the retries of each
/// request (0: fail at the first error).
fn retry() -> object_store::RetryConfig {
    let mut retry = object_store::RetryConfig::default();
    if let Some(max) = std::env::var("WEIGHTBAY_MAX_RETRIES")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        retry.max_retries = max;
        retry.retry_timeout = std::time::Duration::from_secs(if max == 0 { 0 } else { 30 });
    }
    retry
}

/// Runs a one-shot read of `what` again from the start, up to three times in all, when the
/// object was replaced while it was read, saying so: the copy or verify then covers one whole
/// version, the newest.
fn restarting<T>(what: &str, attempt: impl FnMut() -> Result<T>) -> Result<T> {
    weightbay::reader::retry_on_change(3, attempt, |e, attempt| {
        eprintln!(
            "{what} changed while it was read ({e}); starting over on its new version (attempt {attempt} of 3)"
        );
    })
}

/// Resolves a path or URL the user gave.
fn locate(input: &str) -> Result<Location> {
    Location::parse_with_retry(input, retry())
}

fn open(location: &Location) -> Result<Reader> {
    let source = location.storage.open(&location.key).map_err(|e| {
        e.context(format_args!(
            "cannot open `{}` in {}",
            location.key, location.store
        ))
    })?;
    Reader::open(source).map_err(|e| e.with_key(&location.key))
}

fn run(command: Command) -> Result<ExitCode> {
    match command {
        Command::Inspect { url, json } => {
            let reader = open(&locate(&url)?)?;
            if json {
                println!(
                    "{}",
                    serde_json::to_string_pretty(&inspect_json(&reader)).unwrap_or_default()
                );
            } else {
                print!("{}", inspect_table(&reader));
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Verify {
            url,
            require_checksums,
        } => {
            let location = locate(&url)?;
            let report = restarting(&url, || open(&location)?.verify())?;
            if report.checksummed {
                println!(
                    "ok: {} tensors, {} bytes, every checksum matches",
                    report.tensors, report.bytes
                );
            } else {
                println!(
                    "ok: {} tensors, {} bytes, structure and padding verified; no checksums to compare",
                    report.tensors, report.bytes
                );
                if require_checksums {
                    eprintln!(
                        "error: the checkpoint carries no integrity trailer (--require-checksums)"
                    );
                    return Ok(ExitCode::FAILURE);
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Cp {
            src,
            dst,
            format,
            no_clobber,
        } => {
            let (from, to) = (locate(&src)?, locate(&dst)?);
            let mode = if no_clobber {
                WriteMode::CreateNew
            } else {
                WriteMode::Overwrite
            };
            let (summary, format) = restarting(&src, || {
                let reader = open(&from)?;
                let format = match format {
                    Some(FormatArg::Burnpack) => Format::Burnpack,
                    Some(FormatArg::Safetensors) => Format::Safetensors,
                    None => Format::from_file_name(to.file_name()).unwrap_or(reader.format()),
                };
                let writer = reader
                    .to_writer()
                    .with_format(format)
                    .with_mode(mode)
                    .with_cancel(Arc::clone(&INTERRUPTED));
                let storage = progress::Counting::new(Arc::clone(&to.storage), writer.size()?);
                let summary = writer.write_to(&storage, &to.key)?;
                storage.finish();
                Ok((summary, format))
            })?;
            eprintln!(
                "copied {} tensors, {} bytes, as {format}, to {dst}",
                summary.tensors, summary.len
            );
            Ok(ExitCode::SUCCESS)
        }
        Command::Demo { size_mib, dir } => demo::run(size_mib, dir).map(|()| ExitCode::SUCCESS),
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
                t.name().to_owned(),
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
            out += &format!("  {k} = {v}\n");
        }
    }
    if !reader.scalars().is_empty() {
        out += "\nscalars:\n";
        for (k, v) in reader.scalars() {
            out += &format!("  {k} = {}\n", v);
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
