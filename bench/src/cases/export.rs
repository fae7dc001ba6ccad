//! `weightbay export`'s figures: a four-rank checkpoint (every tensor in row slices) written
//! out in the Hugging Face layout, from local disk against a durable save of the same tensors,
//! and from the S3 server against a byte-for-byte copy of the same checkpoint to local disk
//! (what `weightbay cp` does); and the export's peak RSS in a fresh process against its largest
//! tensor.

use std::path::Path;
use std::sync::Arc;

use weightbay::{Bytes, DType, Durability, Format, Result, Storage, Tensor, Writer};
use weightbay_checkpoints::{Checkpoints, ExportOptions, RankSave, Region};
use weightbay_local::LocalStorage;

use crate::context::Bench;
use crate::harness::Start;
use crate::rss::rss_of;

/// Each tensor: 2048 × 4096 f32, 32 MiB.
const SHAPE: [u64; 2] = [2048, 4096];
const TENSOR_LEN: u64 = SHAPE[0] * SHAPE[1] * 4;
const RANKS: u32 = 4;

/// A row `--only` matches by this name.
pub(crate) const EXPORT_LOCAL: &str = "export local";
/// A row `--only` matches by this name.
pub(crate) const EXPORT_RSS: &str = "export rss";
/// A row `--only` matches by this name.
pub(crate) const EXPORT_FROM_S3: &str = "export from s3";

/// Every name [`export_cases`] answers to (`--only`).
pub(crate) const NAMES: &[&str] = &[EXPORT_LOCAL, EXPORT_RSS, EXPORT_FROM_S3];

pub(crate) fn export_cases(b: &mut Bench<'_>) -> Result<()> {
    let tensors = ((b.args.size_mib << 20) / TENSOR_LEN).max(1);
    let bytes = tensors * TENSOR_LEN;
    let source = b.dir.join("export-source");
    if !source.join("run").exists() {
        save_by_ranks(Arc::new(LocalStorage::new(&source)), tensors)?;
    }
    let out = b.dir.join("export-out");
    let local: Arc<dyn Storage> = Arc::new(LocalStorage::new(&out));
    let durable = ExportOptions::default()
        .with_durability(Durability::Durable)
        .with_max_shard_size(1 << 30)
        .overwriting();
    if b.args.wants(EXPORT_LOCAL) {
        let checkpoint = Checkpoints::new(LocalStorage::new(&source), "run").open(1)?;
        println!(
            "  export local: {tensors} tensors of 32 MiB, {RANKS} ranks' row slices each, into 1 GiB shards"
        );
        b.table.compare(
            Start::Cached,
            "export local: four-rank checkpoint to the Hugging Face layout",
            bytes,
            "durable save of the same tensors",
            || {
                checkpoint
                    .export(Arc::clone(&local), "hf", &durable)
                    .map(drop)
            },
            || {
                Writer::new(whole(tensors))
                    .with_format(Format::Safetensors)
                    .with_durability(Durability::Durable)
                    .write_to(local.as_ref(), "saved.safetensors")
                    .map(drop)
            },
        )?;
    }
    if b.args.wants(EXPORT_RSS) {
        let peak = rss_of("export", b.args.size_mib, &b.dir)?;
        println!(
            "  export rss: peak {} MiB against the largest tensor, 32 MiB (goal: at most 32 + 64 MiB)",
            peak >> 20
        );
    }
    if b.args.wants(EXPORT_FROM_S3) {
        let Ok(url) = std::env::var("WEIGHTBAY_S3_URL") else {
            println!(
                "  export from s3: skipped, no S3 server (vars=$(scripts/servers.sh start s3) && eval \"$vars\")"
            );
            return Ok(());
        };
        let s3: Arc<dyn Storage> = Arc::new(weightbay_object_store::open_url(
            &format!("{url}/bench-export-{}", std::process::id()),
            std::iter::empty::<(&str, &str)>(),
        )?);
        save_by_ranks(Arc::clone(&s3), tensors)?;
        let checkpoint = Checkpoints::over(Arc::clone(&s3), "run").open(1)?;
        let mut copies = 0;
        b.table.compare(
            Start::Cached,
            "export from s3: four-rank checkpoint to local disk",
            bytes,
            "weightbay cp of the checkpoint",
            || {
                checkpoint
                    .export(Arc::clone(&local), "hf-from-s3", &durable)
                    .map(drop)
            },
            || {
                // Each copy to a prefix of its own: a step that is there already is refused.
                copies += 1;
                let copy = Checkpoints::over(Arc::clone(&local), format!("copies/{copies}"));
                copy.copy_from(&checkpoint, Durability::Durable).map(drop)
            },
        )?;
        let _ = std::fs::remove_dir_all(out.join("copies"));
    }
    Ok(())
}

/// The `count` tensors whole, each made when the writer reaches it.
fn whole(count: u64) -> Vec<Tensor> {
    (0..count)
        .map(|t| {
            Tensor::deferred(
                format!("layers.{t}.weight"),
                DType::F32,
                SHAPE,
                TENSOR_LEN,
                move || Ok(Bytes::from(vec![t as u8; TENSOR_LEN as usize])),
            )
        })
        .collect()
}

/// Step 1 of `run` from four ranks, each holding a quarter of every tensor's rows.
fn save_by_ranks(storage: Arc<dyn Storage>, count: u64) -> Result<()> {
    let checkpoints = Checkpoints::over(storage, "run");
    for rank in 0..RANKS {
        let region = Region::split(&SHAPE, 0, u64::from(RANKS), u64::from(rank));
        let len = TENSOR_LEN / u64::from(RANKS);
        let names: Vec<String> = (0..count).map(|t| format!("layers.{t}.weight")).collect();
        let tensors = names
            .iter()
            .enumerate()
            .map(|(t, name)| {
                Tensor::deferred(name, DType::F32, region.lengths.clone(), len, move || {
                    Ok(Bytes::from(vec![t as u8; len as usize]))
                })
            })
            .collect();
        let save = names.iter().fold(
            RankSave::new(rank, RANKS, Writer::new(tensors)),
            |save, name| save.with_slice(name, SHAPE, region.clone()),
        );
        checkpoints.save_rank(1, save)?;
    }
    Ok(())
}

/// In the `--rss-case` child: exports the local source the parent saved, and returns the peak
/// RSS.
pub(crate) fn export_rss(dir: &Path) -> Result<u64> {
    let checkpoint =
        Checkpoints::new(LocalStorage::new(dir.join("export-source")), "run").open(1)?;
    let out: Arc<dyn Storage> = Arc::new(LocalStorage::new(dir.join("export-out")));
    checkpoint.export(
        out,
        "hf-rss",
        &ExportOptions::default()
            .with_max_shard_size(1 << 30)
            .overwriting(),
    )?;
    Ok(crate::rss::rss("VmHWM:"))
}
