//! Scratch files, the files a save writes before it publishes them: their names
//! (`<name>.<pid>-<n>.tmp`) and what a listing reads back from one.

use std::sync::atomic::AtomicU64;

/// The suffix of scratch files; the full name is `<name>.<pid>-<n>.tmp`.
pub(crate) const SCRATCH_SUFFIX: &str = ".tmp";

/// Scratch files made by this process get distinct numbers.
pub(crate) static NEXT_SCRATCH: AtomicU64 = AtomicU64::new(0);

/// The key a scratch file at `relative` (`dir/<name>.<pid>-<n>.tmp`) would have published.
pub(crate) fn scratch_target(relative: &str) -> Option<String> {
    let stem = relative.strip_suffix(SCRATCH_SUFFIX)?;
    let (rest, _counter) = stem.rsplit_once('-')?;
    let (target, _pid) = rest.rsplit_once('.')?;
    Some(target.to_owned())
}

/// The writer pid in a scratch name `<name>.<pid>-<n>.tmp`.
pub(crate) fn scratch_pid(name: &str) -> Option<u32> {
    let stem = name.strip_suffix(SCRATCH_SUFFIX)?;
    let (rest, counter) = stem.rsplit_once('-')?;
    counter.parse::<u64>().ok()?;
    let (_, pid) = rest.rsplit_once('.')?;
    pid.parse().ok()
}
