//! Peak memory: this process's, from /proc, and a case's, measured in a fresh process (this
//! program re-run with `--rss-case`; the cases it runs there are
//! [`cases::rss_probe`](crate::cases::rss_probe)'s).

use std::path::Path;

use weightbay::{Error, Result};

use crate::harness::io;

/// A memory figure of this process from /proc/self/status (`VmHWM:` for the peak resident
/// set so far, `VmRSS:` for the current one), in bytes (Linux).
pub(crate) fn rss(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|line| line.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kib| kib * 1024)
}

/// The peak RSS of `case` (`--rss-case`, [`cases::rss_probe::run`](crate::cases::rss_probe::run)),
/// run by this program in a fresh process.
pub(crate) fn rss_of(case: &str, size_mib: u64, dir: &Path) -> Result<u64> {
    let output =
        std::process::Command::new(std::env::current_exe().map_err(io("finding this program"))?)
            .args([
                "--rss-case",
                case,
                "--size-mib",
                &size_mib.to_string(),
                "--dir",
                &dir.display().to_string(),
            ])
            .output()
            .map_err(io("running the RSS probe"))?;
    if !output.status.success() {
        return Err(Error::new(
            weightbay::ErrorKind::Io,
            format!(
                "RSS probe failed: {}",
                String::from_utf8_lossy(&output.stderr)
            ),
        ));
    }
    String::from_utf8_lossy(&output.stdout)
        .trim()
        .parse()
        .map_err(|_| Error::invalid("RSS probe printed no number"))
}
