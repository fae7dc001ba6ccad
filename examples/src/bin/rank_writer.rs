//! One rank of a data-parallel job saving its part of a sharded model: every tensor is split
//! by rows among the ranks, and each rank writes only its rows, straight to the storage. The
//! rank that finds every rank's manifest written commits the checkpoint; no coordinator runs.
//!
//! ```sh
//! for rank in 0 1 2 3; do rank-writer s3://bucket/runs/big 100 $rank 4 & done; wait
//! rank-writer s3://bucket/runs/big 100 --load 3     # any rank count loads it back
//! ```
//!
//! `URL STEP --single` saves the same model from one process, for comparison.
//! `URL STEP RANK WORLD_SIZE` saves rank `RANK` of `WORLD_SIZE` for step `STEP` and prints how
//! it ended (`committed`, `committed by another rank`, or the ranks still missing). Run again
//! after being killed, it writes the same bytes and the step commits. `URL STEP --load N`
//! loads the checkpoint as `N` ranks would, each its own rows, and prints a hash of each
//! tensor: a checkpoint saved by any number of ranks prints the same.
//! A URL without a scheme is a directory on the local file system (`weightbay-local`).

use std::process::ExitCode;
use std::sync::Arc;

use weightbay::{Error, Result, Storage, Tensor, Writer};
use weightbay_checkpoints::{Checkpoints, RankOutcome, RankSave, Region};

/// The model: tensors of `ROWS` rows of `COLUMNS` f32, 4 MiB each.
const TENSORS: [&str; 4] = ["embed", "layer0.w", "layer1.w", "head"];
const ROWS: u64 = 1024;
const COLUMNS: u64 = 1024;

/// Rows `region` of tensor `t` of step `step`: deterministic, so a rerun writes the same bytes.
fn rows_of(step: u64, t: usize, region: &Region) -> Vec<f32> {
    let first = region.offsets[0] * COLUMNS;
    (first..first + region.elements())
        .map(|i| ((i * 2_654_435_761 + step * 97 + t as u64 * 13) % 10_007) as f32 / 10_007.0)
        .collect()
}

/// The checkpoints at `url`: a local directory (no scheme) or any object store URL.
fn checkpoints_at(url: &str) -> Result<Checkpoints> {
    if url.contains("://") {
        let location = weightbay_location::Location::parse(url)?;
        return Ok(Checkpoints::over(location.storage, location.key));
    }
    let storage: Arc<dyn Storage> = Arc::new(weightbay_local::LocalStorage::new(url));
    Ok(Checkpoints::over(storage, ""))
}

fn save(checkpoints: &Checkpoints, step: u64, rank: u32, world_size: u32) -> Result<String> {
    let shape = [ROWS, COLUMNS];
    let region = Region::split(&shape, 0, u64::from(world_size), u64::from(rank));
    let tensors = TENSORS
        .iter()
        .enumerate()
        .map(|(t, name)| {
            Tensor::from_slice(*name, region.lengths.clone(), &rows_of(step, t, &region))
        })
        .collect();
    let save = TENSORS.iter().fold(
        RankSave::new(rank, world_size, Writer::new(tensors)),
        |save, name| save.with_slice(*name, shape, region.clone()),
    );
    Ok(match checkpoints.save_rank(step, save)? {
        RankOutcome::Committed(_) => "committed".to_owned(),
        RankOutcome::CommittedByAnother(_) => "committed by another rank".to_owned(),
        RankOutcome::Written { missing } => format!("written; missing ranks {missing:?}"),
        RankOutcome::Committing => "written; another rank is committing".to_owned(),
    })
}

/// Saves the whole model from this one process, as a job without ranks would.
fn save_whole(checkpoints: &Checkpoints, step: u64) -> Result<String> {
    let whole = Region::whole(&[ROWS, COLUMNS]);
    let tensors = TENSORS
        .iter()
        .enumerate()
        .map(|(t, name)| Tensor::from_slice(*name, [ROWS, COLUMNS], &rows_of(step, t, &whole)))
        .collect();
    checkpoints.save(step, Writer::new(tensors))?;
    Ok("committed by this one process".to_owned())
}

/// Loads step `step` as `ranks` ranks would and prints a hash of each tensor.
fn load(checkpoints: &Checkpoints, step: u64, ranks: u64) -> Result<String> {
    let weights = checkpoints.open(step)?.assembled()?;
    let mut out = String::new();
    for name in TENSORS {
        let parts = (0..ranks)
            .map(|k| weights.read_region(name, &Region::split(&[ROWS, COLUMNS], 0, ranks, k)))
            .collect::<Result<Vec<_>>>()?;
        // FNV-1a over the rows in order: equal for equal bytes, however they were split.
        let mut hash = 0xcbf2_9ce4_8422_2325u64;
        for part in parts {
            for byte in part.to_vec()? {
                hash = (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3);
            }
        }
        out += &format!("{name} {hash:016x}\n");
    }
    Ok(out)
}

fn run(args: &[String]) -> Result<String> {
    let usage = || {
        Error::invalid(
            "usage: rank-writer URL STEP RANK WORLD_SIZE | URL STEP --load N | URL STEP --single",
        )
    };
    let number =
        |i: usize| -> Result<u64> { args.get(i).and_then(|a| a.parse().ok()).ok_or_else(usage) };
    let checkpoints = checkpoints_at(args.first().ok_or_else(usage)?)?;
    let step = number(1)?;
    match args.get(2).map(String::as_str) {
        Some("--load") => return load(&checkpoints, step, number(3)?.max(1)),
        Some("--single") => return save_whole(&checkpoints, step),
        _ => {}
    }
    let rank = u32::try_from(number(2)?).map_err(|_| usage())?;
    let world_size = u32::try_from(number(3)?).map_err(|_| usage())?;
    save(&checkpoints, step, rank, world_size)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match run(&args) {
        Ok(said) => {
            println!("{said}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("rank-writer: {e}");
            ExitCode::FAILURE
        }
    }
}
