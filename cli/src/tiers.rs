//! `weightbay ls FAST --durable DURABLE`: the steps of tiered checkpoints, each tier's state
//! side by side.

use weightbay_checkpoints::{StepState, StepStatus, TieredStatus};

/// The table: a line per step on either tier, with its state and bytes on each and whether
/// it survives the loss of the machine (complete on the durable tier).
pub(crate) fn ls_table(statuses: &[TieredStatus]) -> String {
    let mut out = format!(
        "{:>12}  {:<28}  {:<28}  promotion\n",
        "step", "fast tier", "durable tier"
    );
    for status in statuses {
        // This process promotes nothing: what the tiers hold says where each step stands.
        let promotion = if status.is_durable() {
            "durable"
        } else if is_complete(status.fast.as_ref()) {
            "on the fast tier only (not promoted)"
        } else {
            "-"
        };
        out += &format!(
            "{:>12}  {:<28}  {:<28}  {promotion}\n",
            status.step,
            cell(status.fast.as_ref()),
            cell(status.durable.as_ref())
        );
    }
    if statuses.is_empty() {
        out += "(no checkpoints on either tier)\n";
    }
    out
}

fn is_complete(status: Option<&StepStatus>) -> bool {
    status.is_some_and(|s| s.state == StepState::Complete)
}

/// One tier's state of a step, with the bytes stored there.
fn cell(status: Option<&StepStatus>) -> String {
    match status {
        None => "-".to_owned(),
        Some(status) => match &status.state {
            StepState::Complete => format!("complete, {} bytes", status.stored_bytes),
            StepState::Uncommitted => "uncommitted".to_owned(),
            StepState::Foreign => "FOREIGN".to_owned(),
            StepState::Damaged(why) => format!("DAMAGED: {}", crate::escape::escaped(why)),
        },
    }
}
