//! Peak memory, measured in a fresh process: this program re-run with `--rss-case`.

use std::path::Path;

use weightbay::{Bytes, DType, Error, Format, Result, Tensor, Writer};
use weightbay_local::LocalStorage;

use crate::cases::{burn, candle, remote};
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

/// In a fresh process: save `size_mib` MiB of deferred 16 MiB tensors and print the peak RSS.
pub(crate) fn rss_case(case: &str, size_mib: u64, dir: &Path) -> Result<()> {
    const TENSOR: u64 = 16 << 20;
    let tensors = (0..(size_mib << 20) / TENSOR)
        .map(|i| {
            Tensor::deferred(format!("t{i}"), DType::U8, [TENSOR], TENSOR, move || {
                Ok(Bytes::from(vec![i as u8; TENSOR as usize]))
            })
        })
        .collect();
    if case == "remote-copy" {
        println!("{}", remote::copy_rss(tensors, dir)?);
        return Ok(());
    }
    if case == "candle-s3" {
        println!("{}", candle::s3_load_rss(tensors)?);
        return Ok(());
    }
    if case.starts_with("burn") {
        println!("{}", burn::save_rss(case, dir)?);
        return Ok(());
    }
    let writer = Writer::new(tensors);
    match case {
        "local" => writer
            .write_to(&LocalStorage::new(dir), "rss.bpk")
            .map(|_| ())?,
        "s3" | "s3-safetensors" => {
            let url = std::env::var("WEIGHTBAY_S3_URL")
                .map_err(|_| Error::invalid("WEIGHTBAY_S3_URL is unset"))?;
            let storage = weightbay_object_store::open_url(
                &format!("{url}/bench"),
                std::iter::empty::<(&str, &str)>(),
            )?;
            let format = if case == "s3" {
                Format::Burnpack
            } else {
                Format::Safetensors
            };
            writer
                .with_format(format)
                .write_to(&storage, "rss.bin")
                .map(|_| ())?;
        }
        other => return Err(Error::invalid(format!("unknown rss case {other}"))),
    }
    println!("{}", rss("VmHWM:"));
    Ok(())
}

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
