//! Incremental checkpoints (`weightbay-checkpoints`) on the backend: a chain of saves that
//! refer to each other's bytes, with a save and a retention-and-gc pass failing at every
//! storage operation in turn. Whatever fails, every complete checkpoint reads exactly what was
//! saved and verifies, and nothing a kept checkpoint refers to is ever deleted.

use std::collections::BTreeMap;
use std::sync::Arc;

use weightbay::{DType, Result, Storage, Tensor, Writer};
use weightbay_checkpoints::{Checkpoints, Retention, SaveOptions, StepState};

use crate::outcome::{Outcome, fail};
use crate::{Faulty, Harness, is_injected};

/// The prefix the case saves under.
pub(crate) const PREFIX: &str = "chain";

/// Step `step`'s tensors: `frozen` never changes, `adapter` changes every step, `sparse`
/// changes in one chunk every other step.
pub(crate) fn model(step: u64) -> Vec<Tensor> {
    let frozen: Vec<u8> = (0..24_000u32).map(|i| (i % 251) as u8).collect();
    let adapter = vec![step as u8; 3000];
    let mut sparse: Vec<u8> = (0..16_000u32).map(|i| (i % 13) as u8).collect();
    sparse[5000] = (step / 2) as u8;
    vec![
        Tensor::new("frozen", DType::U8, [24_000], frozen),
        Tensor::new("adapter", DType::U8, [3000], adapter),
        Tensor::new("sparse", DType::U8, [16_000], sparse),
    ]
}

fn incremental() -> SaveOptions {
    SaveOptions::incremental().with_chunk_len(4096)
}

pub(crate) fn compressed() -> SaveOptions {
    incremental().with_compression()
}

/// Every tensor's bytes of `step`'s tensors, by name.
fn expected(step: u64) -> BTreeMap<String, Vec<u8>> {
    model(step)
        .iter()
        .map(|t| {
            let bytes = t.bytes().and_then(|b| b.to_vec()).unwrap_or_default();
            (t.name().to_owned(), bytes)
        })
        .collect()
}

/// Fails unless every complete checkpoint reads what its step saved and verifies, and
/// `newest` is among them.
pub(crate) fn check_all(checkpoints: &Checkpoints, newest: u64, case: &str, context: &str) {
    let statuses = checkpoints
        .list()
        .unwrap_or_else(|e| fail!(case, "{context}: listing: {e}"));
    if let Some(damaged) = statuses
        .iter()
        .find(|s| matches!(s.state, StepState::Damaged(_)))
    {
        fail!(
            case,
            "{context}: step {} is {:?}",
            damaged.step,
            damaged.state
        );
    }
    let complete: Vec<u64> = statuses
        .iter()
        .filter(|s| s.state == StepState::Complete)
        .map(|s| s.step)
        .collect();
    if !complete.contains(&newest) {
        fail!(
            case,
            "{context}: step {newest} is not complete: {complete:?}"
        );
    }
    for step in complete {
        let checkpoint = checkpoints
            .open(step)
            .unwrap_or_else(|e| fail!(case, "{context}: opening step {step}: {e}"));
        if let Err(e) = checkpoint.verify() {
            fail!(case, "{context}: step {step} does not verify: {e}");
        }
        let reader = checkpoint
            .reader()
            .unwrap_or_else(|e| fail!(case, "{context}: reading step {step}: {e}"));
        let read: BTreeMap<String, Vec<u8>> = reader
            .load_all()
            .unwrap_or_else(|e| fail!(case, "{context}: loading step {step}: {e}"))
            .into_iter()
            .map(|(info, bytes)| (info.name().to_owned(), bytes.to_vec().unwrap_or_default()))
            .collect();
        if read != expected(step) {
            fail!(
                case,
                "{context}: step {step} reads other bytes than it saved"
            );
        }
    }
}

/// A chain of incremental saves; then a save, and a retention-and-gc pass, failing at every
/// storage operation in turn: every complete checkpoint reads exactly what was saved, the
/// chain never loses a byte a kept checkpoint refers to, and gc leaves only what the kept
/// checkpoints name or refer to.
pub fn incremental_chains_survive_faults_and_gc<H: Harness>(harness: &H, case: &str) -> Outcome {
    chain_survives_faults_and_gc(harness, case, incremental)
}

/// The same with every piece a save writes encoded where that saves: what is stored differs,
/// what every checkpoint reads does not.
pub fn compressed_chains_survive_faults_and_gc<H: Harness>(harness: &H, case: &str) -> Outcome {
    chain_survives_faults_and_gc(harness, case, compressed)
}

fn chain_survives_faults_and_gc<H: Harness>(
    harness: &H,
    case: &str,
    options: fn() -> SaveOptions,
) -> Outcome {
    let storage = harness.fresh();
    if !storage.capabilities().listing {
        return Outcome::NotApplicable("the backend does not list its containers".into());
    }
    let shared: Arc<dyn Storage> = Arc::new(harness.reopen(&storage));
    let checkpoints = Checkpoints::over(Arc::clone(&shared), PREFIX);
    for step in 1..=3 {
        let record = checkpoints
            .save_with(step, Writer::new(model(step)), options())
            .unwrap_or_else(|e| fail!(case, "saving step {step}: {e}"));
        if step > 1 && record.references().is_empty() {
            fail!(
                case,
                "the increment of step {step} refers to nothing earlier"
            );
        }
        let encoded = record.is_encoded();
        if encoded != options().incremental.is_some_and(|i| i.compress) {
            fail!(
                case,
                "step {step} has encoded pieces: {encoded}, asked for: {}",
                !encoded
            );
        }
    }
    check_all(&checkpoints, 3, case, "after three saves");
    let failing_at_each_operation =
        |what: &str, newest: u64, run: &dyn Fn(Checkpoints) -> Result<()>| {
            for fail_at in 1.. {
                let faulty: Arc<dyn Storage> =
                    Arc::new(Faulty::failing_at(harness.reopen(&storage), fail_at));
                let context = format!("{what} failing at operation {fail_at}");
                match run(Checkpoints::over(faulty, PREFIX)) {
                    Ok(()) => break,
                    Err(e) if !is_injected(&e) => {
                        fail!(case, "{context} failed with its own error: {e}")
                    }
                    Err(_) => check_all(&checkpoints, newest, case, &context),
                }
            }
        };
    failing_at_each_operation("a save", 3, &|faulty| {
        faulty
            .save_with(4, Writer::new(model(4)), options())
            .map(drop)
    });
    check_all(&checkpoints, 4, case, "after step 4 saved");
    failing_at_each_operation("retention and gc", 4, &|faulty| {
        faulty.retain(&Retention::keep_last(1))?;
        faulty.gc().map(drop)
    });
    check_all(&checkpoints, 4, case, "after retention and gc");
    // Only step 4 is kept: every key left is its own, one it refers to, or an announcement.
    let kept = checkpoints
        .open(4)
        .unwrap_or_else(|e| fail!(case, "opening step 4: {e}"));
    let referred: Vec<String> = kept
        .record()
        .references()
        .into_keys()
        .map(|key| format!("{PREFIX}/{key}"))
        .collect();
    let listed = shared
        .list(PREFIX)
        .unwrap_or_else(|e| fail!(case, "listing {PREFIX}: {e}"));
    if let Some(stray) = listed.iter().find(|l| {
        !l.key.starts_with(&format!("{PREFIX}/step-4/"))
            && !l.key.starts_with(&format!("{PREFIX}/refs/"))
            && !referred.contains(&l.key)
    }) {
        let keys: Vec<&str> = listed.iter().map(|l| l.key.as_str()).collect();
        fail!(
            case,
            "after gc, `{}` is left that step 4 does not need (it refers to {referred:?}; the \
             prefix holds {keys:?})",
            stray.key
        );
    }
    Outcome::Checked
}
