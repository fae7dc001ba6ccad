//! burn modules through weightbay-burn against burn's own `BurnpackStore` file store: a module
//! of 16 linear layers of 4096 × 4096 (1 GiB of f32), saved durably to a local file and loaded
//! into a fresh module of the same shape.

use std::sync::Arc;

use burn_core as burn;
use burn_core::module::Module;
use burn_core::tensor::Device;
use burn_nn::{Linear, LinearConfig};
use burn_store::{BurnpackStore, ModuleSnapshot};
use weightbay::{Error, ErrorKind, Result, Storage};
use weightbay_burn::WeightbayStore;
use weightbay_local::LocalStorage;

use crate::context::Bench;
use crate::harness::Start;

#[derive(Module, Debug)]
struct Layers {
    layers: Vec<Linear>,
}

fn layers(device: &Device) -> Layers {
    Layers {
        layers: (0..16)
            .map(|_| LinearConfig::new(4096, 4096).with_bias(false).init(device))
            .collect(),
    }
}

/// Reads every parameter's values out of the module, one byte per page: burn's own store
/// loads lazily from the file, so a load is only over once the values are in memory.
fn touch(model: &Layers) {
    let mut sum = 0u8;
    for layer in &model.layers {
        let data = layer.weight.val().into_data();
        sum ^= data.as_bytes().iter().step_by(4096).fold(0, |a, &b| a ^ b);
    }
    std::hint::black_box(sum);
}

fn burn_error(e: impl std::fmt::Display) -> Error {
    Error::new(ErrorKind::Io, e.to_string())
}

/// In a fresh process (`--rss-case burn` or `burn-peer`): the peak RSS a durable save of the
/// 1 GiB module adds above the module itself, through weightbay-burn or burn's file store.
pub(crate) fn save_rss(case: &str, dir: &std::path::Path) -> Result<u64> {
    let model = layers(&Default::default());
    // Parameters initialise lazily: make them resident first, so the save is measured alone.
    touch(&model);
    // Resets the peak to the current resident set (Linux): the model is counted out.
    std::fs::write("/proc/self/clear_refs", "5")
        .map_err(|e| Error::io("resetting the peak RSS", e))?;
    let before = crate::rss::rss("VmRSS:");
    if case == BURN {
        let local: Arc<dyn Storage> = Arc::new(LocalStorage::new(dir));
        model.save_into(&mut WeightbayStore::new(local, "rss.bpk").overwrite(true))?;
    } else {
        let mut theirs = BurnpackStore::from_file(dir.join("rss-burn.bpk")).overwrite(true);
        model.save_into(&mut theirs).map_err(burn_error)?;
    }
    Ok(crate::rss::rss("VmHWM:").saturating_sub(before))
}

/// A row `--only` matches by this name.
pub(crate) const BURN: &str = "burn";

/// Every name [`burn_cases`] answers to (`--only`).
pub(crate) const NAMES: &[&str] = &[BURN];

pub(crate) fn burn_cases(b: &mut Bench<'_>) -> Result<()> {
    let device = Default::default();
    let model = layers(&device);
    let bytes = 16 * 4096 * 4096 * 4;
    let dir = b.dir.join("burn");
    std::fs::create_dir_all(&dir).map_err(crate::harness::io("creating the burn directory"))?;
    let local: Arc<dyn Storage> = Arc::new(LocalStorage::new(&dir));
    let ours = || WeightbayStore::new(Arc::clone(&local), "ours.bpk").overwrite(true);
    let theirs = || BurnpackStore::from_file(dir.join("burn.bpk")).overwrite(true);
    b.table.compare(
        Start::Emptied,
        "burn module save via weightbay-burn (durable)",
        bytes,
        "BurnpackStore file save (fsync, rename)",
        || model.save_into(&mut ours()),
        || model.save_into(&mut theirs()).map_err(burn_error),
    )?;
    let (ours_rss, theirs_rss) = (
        crate::rss::rss_of(BURN, 0, &dir)?,
        crate::rss::rss_of("burn-peer", 0, &dir)?,
    );
    println!(
        "  peak RSS a durable save of the 1 GiB module adds above the module: weightbay-burn {} MiB, BurnpackStore {} MiB (bound: largest tensor 64 MiB + 16 MiB)",
        ours_rss >> 20,
        theirs_rss >> 20
    );
    // Both load into modules made beforehand, so neither times the random initialisation.
    let mut into_ours = layers(&device);
    let into_theirs = std::cell::RefCell::new(layers(&device));
    b.table.compare(
        Start::Cached,
        "burn module load via weightbay-burn, every value read (page cache)",
        bytes,
        "BurnpackStore file load, every value read",
        || {
            let result = into_ours.load_from(&mut ours())?;
            assert_eq!(result.applied.len(), 16, "{result:?}");
            touch(&into_ours);
            Ok(())
        },
        || {
            let mut into = into_theirs.borrow_mut();
            let result = into.load_from(&mut theirs()).map_err(burn_error)?;
            assert_eq!(result.applied.len(), 16, "{result:?}");
            touch(&into);
            Ok(())
        },
    )
}
