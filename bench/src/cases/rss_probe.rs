//! What `--rss-case` runs in the fresh process whose peak memory
//! [`rss_of`](crate::rss::rss_of) reports: each case prints one number, bytes.

use std::path::Path;

use weightbay::{Bytes, DType, Error, Format, Result, Tensor, Writer};
use weightbay_local::LocalStorage;

use crate::cases::{burn, candle, export, remote};
use crate::rss::rss;

/// In a fresh process: save `size_mib` MiB of deferred 16 MiB tensors and print the peak RSS.
pub(crate) fn run(case: &str, size_mib: u64, dir: &Path) -> Result<()> {
    const TENSOR: u64 = 16 << 20;
    if case == "export" {
        println!("{}", export::export_rss(dir)?);
        return Ok(());
    }
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
