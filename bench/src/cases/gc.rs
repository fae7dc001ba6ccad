//! `gc` over a long run on shared ground: a pass over 10,000 checkpoints with 1,000 objects
//! planted among them (foreign files, symlinks to another team's run, damaged records), against
//! the same pass over the same run without them. What others put beside a run must not make
//! cleaning it slow: each planted object costs a listing entry, and nothing more.

use std::sync::Arc;

use weightbay::{DType, Durability, Result, Tensor, Writer};
use weightbay_checkpoints::Checkpoints;
use weightbay_local::LocalStorage;

use crate::context::Bench;
use crate::harness::{Start, io, paired, timed};
use crate::report::Row;

/// Checkpoints in the run.
const STEPS: u64 = 10_000;
/// Objects planted among them: a third foreign files, a third links, a third damaged records.
const PLANTED: u64 = 1_000;
/// The goal: the pass with the planted objects within this many times the clean one.
const GOAL: f64 = 1.2;

pub(crate) fn gc_cases(b: &mut Bench<'_>) -> Result<()> {
    let dir = b.dir.join("gc");
    let clean = dir.join("clean");
    let planted = dir.join("planted");
    if !clean.join(format!("step-{STEPS}")).exists() {
        let started = std::time::Instant::now();
        let run = Checkpoints::new(LocalStorage::new(&clean), "");
        for step in 1..=STEPS {
            let tensor = Tensor::new("w", DType::U8, [16], vec![step as u8; 16]);
            run.save(
                step,
                Writer::new(vec![tensor]).with_durability(Durability::Flushed),
            )?;
        }
        let _ = std::fs::remove_dir_all(&planted);
        let copied = std::process::Command::new("cp")
            .arg("-a")
            .arg(&clean)
            .arg(&planted)
            .status()
            .map_err(io("copying the run"))?;
        if !copied.success() {
            return Err(weightbay::Error::new(
                weightbay::ErrorKind::Io,
                "cp -a failed",
            ));
        }
        plant(&dir, &planted)?;
        println!(
            "  saved {STEPS} checkpoints and planted {PLANTED} objects in {:.1} s",
            started.elapsed().as_secs_f64()
        );
    }
    let gc = |root: &std::path::Path| {
        let run = Checkpoints::over(Arc::new(LocalStorage::new(root)), "");
        timed(|| run.gc().map(drop))
    };
    let (with, without) = paired(
        b.table.runs.max(5),
        Start::Cached,
        || gc(&planted),
        || gc(&clean),
    )?;
    let ratio = with.as_secs_f64() / without.as_secs_f64();
    println!(
        "  gc with {PLANTED} planted objects: {ratio:.2}x the time without (goal at most {GOAL}x: {})",
        if ratio <= GOAL { "met" } else { "MISSED" }
    );
    b.table.push(Row {
        case: format!(
            "gc of {STEPS} checkpoints with {PLANTED} planted objects, local (time, not throughput)"
        ),
        ours: with,
        peer: Some(("gc of the same run without them".to_owned(), without)),
        bytes: 0,
    });
    Ok(())
}

/// Plants [`PLANTED`] objects in the run at `run`: foreign files beside the steps, links to
/// another run's steps (under names of steps newer than the run's), and damaged records of
/// steps with no containers. None is gc's to delete, so every pass meets them all.
fn plant(dir: &std::path::Path, run: &std::path::Path) -> Result<()> {
    let other = dir.join("other-team");
    let third = PLANTED / 3;
    let foreign = run.join("notes");
    std::fs::create_dir_all(&foreign).map_err(io("creating the foreign directory"))?;
    for n in 0..PLANTED - 2 * third {
        std::fs::write(foreign.join(format!("note-{n}.txt")), b"not a checkpoint")
            .map_err(io("planting a foreign file"))?;
    }
    for n in 0..third {
        let target = other.join(format!("step-{n}"));
        std::fs::create_dir_all(&target).map_err(io("creating the other run"))?;
        std::fs::write(target.join("commit.json"), b"{}").map_err(io("planting"))?;
        std::os::unix::fs::symlink(&target, run.join(format!("step-{}", STEPS + 1 + n)))
            .map_err(io("planting a link"))?;
    }
    for n in 0..third {
        let step = run.join(format!("step-{}", STEPS + third + 1 + n));
        std::fs::create_dir_all(&step).map_err(io("creating a damaged step"))?;
        std::fs::write(step.join("commit.json"), b"{").map_err(io("planting a damaged record"))?;
    }
    Ok(())
}
