//! How the command reaches storage: the locations a user names, opened with its retry policy,
//! what stall detection did in them, the Ctrl-C that stops a write, and a read started over
//! when its object is replaced meanwhile.

use std::sync::atomic::AtomicBool;
use std::sync::{Arc, LazyLock};

use weightbay::Result;
use weightbay_location::Location;

use crate::escape::escaped;

/// Set by Ctrl-C; a copy in progress stops at its next write and leaves the destination as
/// it was.
pub(crate) static INTERRUPTED: LazyLock<Arc<AtomicBool>> = LazyLock::new(Arc::default);

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

/// Says how many requests stall detection cut (and object_store retried), and how many reads
/// it hedged, in the stores of `locations`, when it did any.
pub(crate) fn report_stalls(locations: &[&Location]) {
    let (cut, hedged, _) = stall_counts(locations);
    if cut + hedged > 0 {
        eprintln!(
            "stall detection cut and retried {cut} request{}, and hedged {hedged} read{} \
             (WEIGHTBAY_STALL_DETECTION=off turns it off)",
            plural(cut),
            plural(hedged)
        );
    }
}

/// What `-v` prints: the stall counts of `locations`, zeros included, or that none of them
/// watches for stalls (local files).
pub(crate) fn report_stalls_always(locations: &[&Location]) {
    if locations.iter().all(|l| l.stall_watch.is_none()) {
        eprintln!("stall detection: not used (no object store)");
        return;
    }
    let (cut, hedged, ranged) = stall_counts(locations);
    eprintln!(
        "stall detection: {cut} request{} cut and retried; {hedged} of {ranged} ranged read{} \
         hedged",
        plural(cut),
        plural(ranged)
    );
}

/// Requests cut, reads hedged and ranged reads sent, over `locations`.
fn stall_counts(locations: &[&Location]) -> (u64, u64, u64) {
    locations
        .iter()
        .filter_map(|location| location.stall_watch.as_ref())
        .map(|watch| watch.counts())
        .fold((0, 0, 0), |(cut, hedged, ranged), counts| {
            (
                cut + counts.cut(),
                hedged + counts.hedged,
                ranged + counts.ranged_reads,
            )
        })
}

fn plural(n: u64) -> &'static str {
    if n == 1 { "" } else { "s" }
}

/// Resolves a path or URL the user gave.
pub(crate) fn locate(input: &str) -> Result<Location> {
    Location::parse_with_retry(input, retry())
}

/// Runs a one-shot read of `what` again from the start, up to three times in all, when the
/// object was replaced while it was read, saying so: the copy or verify then covers one whole
/// version, the newest.
pub(crate) fn restarting<T>(what: &str, attempt: impl FnMut() -> Result<T>) -> Result<T> {
    weightbay::retry_on_change(3, attempt, |e, attempt| {
        eprintln!(
            "{} changed while it was read ({}); starting over on its new version (attempt {attempt} of 3)",
            escaped(what),
            escaped(&e.to_string())
        );
    })
}
