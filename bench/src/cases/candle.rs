//! candle loading through weightbay-candle against candle's own loader: a safetensors file of
//! about the big checkpoint's size, every tensor turned into a candle CPU tensor.

use std::hint::black_box;

use candle_core::{DType as CandleDType, Device};
use candle_nn::VarBuilder;
use weightbay::Format;
use weightbay::{Reader, Result, Writer};
use weightbay_candle::WeightbayBackend;
use weightbay_mmap::MmapStorage;

use crate::context::Bench;
use crate::harness::Start;

fn candle_error(e: candle_core::Error) -> weightbay::Error {
    weightbay::Error::new(weightbay::ErrorKind::Io, e.to_string())
}

/// In a fresh process (`--rss-case candle-s3`): `tensors` saved to the S3 server as
/// safetensors, then every one loaded into a candle tensor through weightbay-candle from
/// `s3://` and dropped; returns the peak RSS the load added.
pub(crate) fn s3_load_rss(tensors: Vec<weightbay::Tensor>) -> Result<u64> {
    let url = std::env::var("WEIGHTBAY_S3_URL")
        .map_err(|_| weightbay::Error::invalid("WEIGHTBAY_S3_URL is unset"))?;
    let storage = weightbay_object_store::open_url(
        &format!("{url}/bench-candle"),
        std::iter::empty::<(&str, &str)>(),
    )?;
    let names: Vec<String> = tensors.iter().map(|t| t.name().to_owned()).collect();
    Writer::new(tensors)
        .with_format(Format::Safetensors)
        .write_to(&storage, "rss.safetensors")?;
    std::fs::write("/proc/self/clear_refs", "5")
        .map_err(|e| weightbay::Error::io("resetting the peak RSS", e))?;
    let before = crate::rss::rss("VmRSS:");
    let reader = Reader::open_key(&storage, "rss.safetensors")?;
    let vb = VarBuilder::from_backend(
        Box::new(WeightbayBackend::new(reader)),
        CandleDType::U8,
        Device::Cpu,
    );
    for name in &names {
        black_box(vb.get_unchecked(name).map_err(candle_error)?);
    }
    Ok(crate::rss::rss("VmHWM:").saturating_sub(before))
}

pub(crate) fn candle_cases(b: &mut Bench<'_>) -> Result<()> {
    let file = "candle.safetensors";
    Writer::new(b.big.ours())
        .with_format(Format::Safetensors)
        .write_to(&b.local, file)?;
    let path = b.dir.join(file);
    let names: Vec<String> = b.big.tensors.iter().map(|(name, _)| name.clone()).collect();
    let mapped = MmapStorage::new(&b.dir);
    let device = Device::Cpu;
    b.table.compare(
        Start::Cached,
        "candle: every tensor via weightbay-candle over mmap",
        b.big.bytes(),
        "VarBuilder::from_mmaped_safetensors",
        || {
            let reader = Reader::open_key(&mapped, file)?;
            let vb = VarBuilder::from_backend(
                Box::new(WeightbayBackend::new(reader)),
                CandleDType::F32,
                device.clone(),
            );
            for name in &names {
                black_box(vb.get_unchecked(name).map_err(candle_error)?);
            }
            Ok(())
        },
        || {
            // SAFETY: the file is not modified while mapped.
            let vb =
                unsafe { VarBuilder::from_mmaped_safetensors(&[&path], CandleDType::F32, &device) }
                    .map_err(candle_error)?;
            for name in &names {
                black_box(vb.get_unchecked(name).map_err(candle_error)?);
            }
            Ok(())
        },
    )?;
    if std::env::var("WEIGHTBAY_S3_URL").is_ok() {
        let rss = crate::rss::rss_of("candle-s3", b.args.size_mib, &b.dir)?;
        println!(
            "  peak RSS loading {} MiB of 16 MiB tensors into candle from s3:// (moto): {} MiB (bound: largest tensor 16 MiB + fetch budget 256 MiB)",
            b.args.size_mib,
            rss >> 20
        );
    }
    Ok(())
}
