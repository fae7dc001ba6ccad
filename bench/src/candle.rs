//! candle loading through weightbay-candle against candle's own loader: a safetensors file of
//! about the big checkpoint's size, every tensor turned into a candle CPU tensor.

use std::hint::black_box;

use candle_core::{DType as CandleDType, Device};
use candle_nn::VarBuilder;
use weightbay::format::Format;
use weightbay::{Reader, Result, Writer};
use weightbay_candle::WeightbayBackend;
use weightbay_mmap::MmapStorage;

use crate::{Bench, Start};

fn candle_error(e: candle_core::Error) -> weightbay::Error {
    weightbay::Error::new(weightbay::ErrorKind::Io, e.to_string())
}

pub fn candle_cases(b: &mut Bench<'_>) -> Result<()> {
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
    )
}
