//! `weightbay gc`: old checkpoints retired by a policy, and what dead saves left, deleted in
//! one pass whose dry run names every deletion.

use std::process::ExitCode;

use clap::Args;
use weightbay::Result;
use weightbay_checkpoints::Retention;

use crate::escape::escaped;
use crate::target::checkpoints_at;

/// The arguments of `weightbay gc`.
#[derive(Args)]
pub(crate) struct GcArgs {
    /// Path or URL of the checkpoint prefix.
    pub(crate) url: String,
    /// Keep the newest N complete checkpoints.
    #[arg(long)]
    pub(crate) keep_last: Option<usize>,
    /// Also keep every checkpoint whose step is a multiple of K.
    #[arg(long)]
    pub(crate) keep_every: Option<u64>,
    /// Say what would be deleted, and delete nothing.
    #[arg(long)]
    pub(crate) dry_run: bool,
}

/// Runs `weightbay gc`.
pub(crate) fn run(args: GcArgs) -> Result<ExitCode> {
    let GcArgs {
        url,
        keep_last,
        keep_every,
        dry_run,
    } = args;
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
