//! A small burn model trained a few steps, checkpointed through `weightbay-burn` to any
//! weightbay location every few steps, then reloaded into a fresh model that must give the
//! trained model's outputs.
//!
//! ```sh
//! burn-train s3://bucket/runs/burn
//! ```

use burn_core as burn;

use std::process::ExitCode;

use burn_core::module::Module;
use burn_core::tensor::{Device, Distribution, Shape, Tensor};
use burn_nn::{Linear, LinearConfig};
use burn_optim::{GradientsParams, SgdConfig};
use burn_store::ModuleSnapshot;
use weightbay_burn::WeightbayStore;
use weightbay_location::Location;

const STEPS: usize = 12;
const EVERY: usize = 4;

#[derive(Module, Debug)]
struct Mlp {
    up: Linear,
    down: Linear,
}

impl Mlp {
    fn new(device: &Device) -> Self {
        Self {
            up: LinearConfig::new(16, 32).init(device),
            down: LinearConfig::new(32, 4).init(device),
        }
    }

    fn forward(&self, x: Tensor<2>) -> Tensor<2> {
        self.down
            .forward(burn_core::tensor::activation::relu(self.up.forward(x)))
    }
}

fn run(url: &str) -> Result<bool, Box<dyn std::error::Error>> {
    // The run's prefix: the location's last segment, in the storage of the rest.
    let location = Location::parse(url)?;
    let key = |step: usize| format!("{}/step-{step}.bpk", location.key);
    let device = Device::default().autodiff();
    let mut model = Mlp::new(&device);
    let mut optim = SgdConfig::new().init();
    let x = Tensor::<2>::random(Shape::new([8, 16]), Distribution::Default, &device);
    let target = Tensor::<2>::random(Shape::new([8, 4]), Distribution::Default, &device);
    for step in 1..=STEPS {
        let loss = (model.forward(x.clone()) - target.clone())
            .powf_scalar(2.0)
            .mean();
        let grads = GradientsParams::from_grads(loss.backward(), &model);
        model = optim.step(0.05, model, grads);
        if step % EVERY == 0 {
            model.save_into(&mut WeightbayStore::new(
                location.storage.clone(),
                key(step),
            ))?;
            eprintln!("checkpointed step {step} to {url}/step-{step}.bpk");
        }
    }
    let mut fresh = Mlp::new(&device);
    let result = fresh.load_from(&mut WeightbayStore::new(
        location.storage.clone(),
        key(STEPS),
    ))?;
    if !result.is_success() {
        return Err(format!("the checkpoint did not load whole: {result:?}").into());
    }
    let trained = model.forward(x.clone()).into_data();
    let reloaded = fresh.forward(x).into_data();
    Ok(trained == reloaded)
}

fn main() -> ExitCode {
    let Some(url) = std::env::args().nth(1) else {
        eprintln!("usage: burn-train URL");
        return ExitCode::FAILURE;
    };
    match run(&url) {
        Ok(true) => {
            println!("outputs equal: the model reloaded from {url} and the trained one");
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
