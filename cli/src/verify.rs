//! `weightbay verify`: structure and every checksum of a container, a sharded set (its index
//! against its shards) or checkpoints (every container against its commit record).

use std::process::ExitCode;
use std::sync::Arc;

use clap::Args;
use weightbay::backend_kit::read_in_order;
use weightbay::{ErrorKind, Reader, Result, ShardChecksum, ShardedWeights};
use weightbay_checkpoints::Checkpoints;

use crate::escape::escaped;
use crate::reach::{locate, restarting};
use crate::target::{self, Target, resolve};

/// The arguments of `weightbay verify`.
#[derive(Args)]
pub(crate) struct VerifyArgs {
    /// Path or URL.
    pub(crate) url: String,
    /// Fail when a container carries no checksums (no integrity trailer and no commit
    /// record).
    #[arg(long)]
    pub(crate) require_checksums: bool,
    /// Of a checkpoint prefix, this step instead of the latest.
    #[arg(long, conflicts_with = "all")]
    pub(crate) step: Option<u64>,
    /// Of a checkpoint prefix, every committed checkpoint.
    #[arg(long)]
    pub(crate) all: bool,
}

/// Runs `weightbay verify`.
pub(crate) fn run(args: VerifyArgs) -> Result<ExitCode> {
    let VerifyArgs {
        url,
        require_checksums,
        step,
        all,
    } = args;
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
