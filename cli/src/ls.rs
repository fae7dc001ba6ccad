//! `weightbay ls`: the checkpoints under a prefix, a line each, or both tiers of tiered
//! checkpoints side by side.

use std::process::ExitCode;

use clap::Args;
use weightbay::Result;
use weightbay_checkpoints::{StepState, StepStatus, Tiered};

use crate::escape::escaped;
use crate::reach::{locate, report_stalls_always};
use crate::target::{self, checkpoints_located};
use crate::tiers;

/// The arguments of `weightbay ls`.
#[derive(Args)]
pub(crate) struct LsArgs {
    /// Path or URL of the checkpoint prefix (of the fast tier, with `--durable`).
    pub(crate) url: String,
    /// Path or URL of the durable tier's checkpoint prefix, for tiered checkpoints.
    #[arg(long)]
    pub(crate) durable: Option<String>,
    /// Also say, on stderr, how many of the listing's requests stall detection cut and
    /// retried, and how many reads it hedged.
    #[arg(short, long)]
    pub(crate) verbose: bool,
}

/// Runs `weightbay ls`.
pub(crate) fn run(args: LsArgs) -> Result<ExitCode> {
    let location = locate(&args.url)?;
    let mut watched = vec![location.clone()];
    let checkpoints = checkpoints_located(location, &args.url)?;
    match args.durable {
        None => print!("{}", ls_table(&checkpoints.list()?)),
        Some(durable) => {
            let located = locate(&durable)?;
            watched.push(located.clone());
            let tiered = Tiered::new(checkpoints, checkpoints_located(located, &durable)?);
            print!("{}", tiers::ls_table(&tiered.list()?));
        }
    }
    if args.verbose {
        report_stalls_always(&watched.iter().collect::<Vec<_>>());
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
            (StepState::Foreign, _) => {
                "FOREIGN: no checkpoint, only what no container can be (below)".to_owned()
            }
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
        let mut state = state;
        for entry in status.foreign.iter().take(4) {
            state += &format!(
                "\n{:>14}foreign {}: {}",
                "",
                escaped(&entry.name),
                escaped(&entry.what)
            );
        }
        if status.foreign.len() > 4 {
            state += &format!("\n{:>14}and {} more foreign", "", status.foreign.len() - 4);
        }
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
