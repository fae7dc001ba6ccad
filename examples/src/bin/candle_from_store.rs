//! A candle model saved to any weightbay location and loaded back from it through
//! `weightbay-candle`, checked against candle's own safetensors loader on the same bytes.
//!
//! ```sh
//! candle-from-store s3://bucket/models/mlp.safetensors
//! ```
//!
//! Builds a small MLP (64 → 256 → 32), saves its `VarMap` to the location, loads it through
//! `VarBuilder::from_backend(WeightbayBackend)` over a `Prefetched` reader (tensors fetched
//! ahead of the model constructor, in batches, where the store gains from it),
//! downloads the same object to a local file for `VarBuilder::from_mmaped_safetensors`, and
//! prints whether the two models' outputs are equal.

use std::process::ExitCode;

use candle_core::{DType, Device, Module, Tensor};
use candle_nn::{Linear, VarBuilder, VarMap};
use weightbay::Format;
use weightbay::{PrefetchPlan, Prefetched, Reader, Storage};
use weightbay_candle::{WeightbayBackend, save_var_map};
use weightbay_location::Location;

struct Mlp {
    up: Linear,
    down: Linear,
}

impl Mlp {
    fn new(vb: VarBuilder) -> candle_core::Result<Self> {
        Ok(Self {
            up: candle_nn::linear(64, 256, vb.pp("up"))?,
            down: candle_nn::linear(256, 32, vb.pp("down"))?,
        })
    }

    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        self.down.forward(&self.up.forward(x)?.relu()?)
    }
}

fn run(url: &str) -> Result<bool, Box<dyn std::error::Error>> {
    let location = Location::parse(url)?;
    let device = Device::Cpu;
    let varmap = VarMap::new();
    let trained = Mlp::new(VarBuilder::from_varmap(&varmap, DType::F32, &device))?;
    save_var_map(
        &varmap,
        Format::Safetensors,
        location.storage.as_ref(),
        &location.key,
    )?;

    let reader = Reader::open_key(location.storage.as_ref(), &location.key)?;
    let prefetched = Prefetched::new(reader, PrefetchPlan::All)?;
    let through_weightbay = Mlp::new(VarBuilder::from_backend(
        Box::new(WeightbayBackend::new(prefetched)),
        DType::F32,
        device.clone(),
    ))?;

    // The same object, downloaded whole, for candle's own loader.
    let source = location.storage.open(&location.key)?;
    let mut bytes = vec![0; usize::try_from(source.len())?];
    source.read_at(0, &mut bytes)?;
    let local = tempfile::NamedTempFile::new()?;
    std::fs::write(local.path(), &bytes)?;
    // SAFETY: the temporary file is not modified while mapped.
    let candles_own =
        unsafe { VarBuilder::from_mmaped_safetensors(&[local.path()], DType::F32, &device)? };
    let through_candle = Mlp::new(candles_own)?;

    let x = Tensor::arange(0f32, 128.0, &device)?
        .reshape((2, 64))?
        .affine(0.01, -0.5)?;
    let ours = through_weightbay.forward(&x)?.to_vec2::<f32>()?;
    let theirs = through_candle.forward(&x)?.to_vec2::<f32>()?;
    let original = trained.forward(&x)?.to_vec2::<f32>()?;
    Ok(ours == theirs && ours == original)
}

fn main() -> ExitCode {
    let Some(url) = std::env::args().nth(1) else {
        eprintln!("usage: candle-from-store URL");
        return ExitCode::FAILURE;
    };
    match run(&url) {
        Ok(true) => {
            println!("outputs equal: weightbay-candle from {url} and candle's own loader");
            ExitCode::SUCCESS
        }
        Ok(false) => {
            println!("outputs differ");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
