//! A toy training loop that checkpoints to object storage in the background and resumes from
//! the newest complete checkpoint after a crash.
//!
//! ```sh
//! train-resume s3://bucket/runs/toy --steps 120 --every 10 [--layer-mib 1] [--incremental]
//! train-resume /local/ckpt/toy --durable s3://bucket/runs/toy   # tiered
//! ```
//!
//! Each step updates the weights deterministically; every `--every` steps a checkpoint of the
//! weights and the step starts saving in the background while training goes on. Started
//! again after being killed at any moment, it loads `Checkpoints::latest()` and continues, so
//! it ends with the same weights as a run that was never interrupted. It prints the CRC32C of
//! the last checkpoint's container (from its commit record, after verifying every byte against
//! it): equal weights, equal bytes.
//!
//! With `--incremental` the model also holds a frozen embedding twice a layer's size that
//! training never changes, and every checkpoint is saved incrementally: only the trained
//! layers are written, the embedding's bytes are referred to in the chain's first checkpoint.
//!
//! With `--durable URL` the checkpoints are tiered: saved at the first URL (a local
//! directory: the fast tier) and promoted in the background to `URL` (the durable tier); a
//! restart resumes from the newest checkpoint either tier holds whole, so a run whose machine
//! (and local directory) is gone resumes from the durable tier. It prints where it resumed
//! from (`resumed from step N`), and at the end requires the last checkpoint to be durable.

use std::process::ExitCode;

use weightbay::{Result, Tensor, Writer};
use weightbay_checkpoints::{
    Checkpoint, Checkpoints, PerTier, Retention, SaveHandle, SaveOptions, Tiered,
};

/// Two layers of `--layer-mib` MiB of f32 each (1 by default: 2 MiB per checkpoint, one
/// object-store PUT; over 4, each checkpoint is a multipart upload).
const LAYERS: [&str; 2] = ["layer0.weight", "layer1.weight"];

struct Args {
    url: String,
    steps: u64,
    every: u64,
    layer_mib: u64,
    incremental: bool,
    durable: Option<String>,
}

/// The frozen tensor of `--incremental` runs.
const FROZEN: &str = "embedding.weight";

fn parse_args() -> std::result::Result<Args, String> {
    let mut args = std::env::args().skip(1);
    let url = args.next().ok_or(
        "usage: train-resume URL [--steps N] [--every K] [--layer-mib M] [--incremental] \
             [--durable URL]",
    )?;
    let (mut steps, mut every, mut layer_mib, mut incremental) = (120, 10, 1, false);
    let mut durable = None;
    while let Some(flag) = args.next() {
        if flag == "--incremental" {
            incremental = true;
            continue;
        }
        if flag == "--durable" {
            durable = Some(args.next().ok_or("--durable needs a URL")?);
            continue;
        }
        let value = args.next().ok_or(format!("{flag} needs a value"))?;
        let value: u64 = value.parse().map_err(|_| format!("{flag}: not a number"))?;
        match flag.as_str() {
            "--steps" => steps = value,
            "--every" => every = value.max(1),
            "--layer-mib" => layer_mib = value.max(1),
            other => return Err(format!("unknown flag {other}")),
        }
    }
    Ok(Args {
        url,
        steps,
        every,
        layer_mib,
        incremental,
        durable,
    })
}

/// One training step: deterministic in the step and the weights, and enough work that a kill
/// can land anywhere.
fn train_step(step: u64, weights: &mut [Vec<f32>]) {
    for (l, layer) in weights.iter_mut().enumerate() {
        let drive = ((step * 31 + l as u64 * 7) % 97) as f32 / 97.0;
        for (i, w) in layer.iter_mut().enumerate() {
            *w = *w * 0.999 + drive * ((i % 13) as f32 - 6.0) * 1e-3;
        }
    }
}

fn as_tensors(weights: &[Vec<f32>], frozen: Option<&Tensor>) -> Vec<Tensor> {
    LAYERS
        .iter()
        .zip(weights)
        .map(|(name, layer)| Tensor::from_slice(*name, [layer.len() as u64], layer))
        .chain(frozen.cloned())
        .collect()
}

/// The checkpoints at `url`: the location's key is the run's prefix in its storage.
fn checkpoints_at(url: &str) -> Result<Checkpoints> {
    let location = weightbay_location::Location::parse(url)?;
    Ok(Checkpoints::over(location.storage, location.key))
}

/// Where the loop saves: one prefix, or two tiers.
enum Saving {
    Plain(Checkpoints),
    Tiered(Tiered),
}

impl Saving {
    fn latest(&self) -> Result<Option<Checkpoint>> {
        match self {
            Self::Plain(checkpoints) => checkpoints.latest(),
            Self::Tiered(tiered) => tiered.latest(),
        }
    }

    fn save(&self, step: u64, writer: Writer, options: SaveOptions) -> Result<SaveHandle> {
        match self {
            Self::Plain(checkpoints) => checkpoints.save_in_background(step, writer, options),
            Self::Tiered(tiered) => tiered.save_in_background(step, writer, options),
        }
    }

    /// Applies the plain run's retention policy; a tiered run's is applied after each
    /// promotion, off the loop's thread ([`Tiered::with_retention`]).
    fn retain(&self) -> Result<()> {
        match self {
            Self::Plain(checkpoints) => checkpoints.retain(&Retention::keep_last(3)).map(drop),
            Self::Tiered(_) => Ok(()),
        }
    }

    /// Waits for every save (and promotion), cleans up, and returns the newest checkpoint,
    /// which a tiered run requires to be durable.
    fn finish(&self) -> Result<Option<Checkpoint>> {
        match self {
            Self::Plain(checkpoints) => {
                checkpoints.flush()?;
                checkpoints.gc()?;
                checkpoints.latest()
            }
            Self::Tiered(tiered) => {
                tiered.flush()?;
                tiered.gc()?;
                let durable = tiered.durable().latest()?;
                let latest = tiered.latest()?;
                if durable.as_ref().map(Checkpoint::step) != latest.as_ref().map(Checkpoint::step) {
                    return Err(weightbay::Error::invalid(
                        "the newest checkpoint is not on the durable tier after flush",
                    ));
                }
                Ok(durable)
            }
        }
    }
}

fn run(args: &Args) -> Result<u32> {
    let saving = match &args.durable {
        None => Saving::Plain(checkpoints_at(&args.url)?),
        Some(durable) => Saving::Tiered(
            Tiered::new(checkpoints_at(&args.url)?, checkpoints_at(durable)?).with_retention(
                PerTier {
                    fast: Retention::keep_last(2),
                    durable: Retention::keep_last(3),
                },
            ),
        ),
    };
    // Resume from the newest complete checkpoint, if any.
    let (mut step, mut weights) = match saving.latest()? {
        Some(checkpoint) => {
            let reader = checkpoint.reader()?;
            let weights = LAYERS
                .iter()
                .map(|name| reader.read_as::<f32>(name))
                .collect::<Result<Vec<_>>>()?;
            eprintln!("resumed from step {}", checkpoint.step());
            (checkpoint.step(), weights)
        }
        None => {
            let layer_len = usize::try_from(args.layer_mib << 18).unwrap_or(1 << 18);
            (0, vec![vec![0.0f32; layer_len]; LAYERS.len()])
        }
    };
    let frozen = args.incremental.then(|| {
        let len = weights[0].len() * 2;
        let values: Vec<f32> = (0..len).map(|i| (i % 101) as f32 * 0.01).collect();
        Tensor::from_slice(FROZEN, [len as u64], &values)
    });
    let options = if args.incremental {
        SaveOptions::incremental()
    } else {
        SaveOptions::default()
    };
    let mut in_flight: Option<SaveHandle> = None;
    while step < args.steps {
        step += 1;
        train_step(step, &mut weights);
        if step % args.every == 0 || step == args.steps {
            // The previous save's outcome first: a failed checkpoint must not go unnoticed.
            if let Some(handle) = in_flight.take() {
                handle.wait()?;
            }
            let writer =
                Writer::new(as_tensors(&weights, frozen.as_ref())).with_scalar("step", step);
            in_flight = Some(saving.save(step, writer, options.clone())?);
            saving.retain()?;
        }
    }
    if let Some(handle) = in_flight {
        handle.wait()?;
    }
    let latest = saving
        .finish()?
        .ok_or_else(|| weightbay::Error::invalid("no checkpoint after training"))?;
    latest.verify()?;
    let record = latest.record();
    // An incremental checkpoint's container is its pieces: their CRC32C is the whole one's.
    Ok(record
        .pieces
        .as_ref()
        .map_or(record.containers[0].crc32c, |pieces| pieces.crc32c))
}

fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(args) => args,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    match run(&args) {
        Ok(crc) => {
            println!("final weights {crc:08x} after step {}", args.steps);
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
