//! Tiered checkpoints (`weightbay-checkpoints`) with the backend as the durable tier and an
//! in-memory fast tier: promotions, run on demand, queued behind saves and following background
//! saves as they write, and compressed behind saves, failing at every operation of the
//! backend in turn. Whatever fails, the
//! durable tier never shows a complete checkpoint whose bytes differ from the fast tier's, nor
//! a damaged one.

use std::collections::BTreeMap;
use std::sync::Arc;

use weightbay::{DType, MemoryStorage, Result, Storage, Tensor, Writer};
use weightbay_checkpoints::{Checkpoints, Promotion, SaveOptions, StepState, Tiered};

use crate::outcome::{Outcome, fail};
use crate::{Faulty, Harness, is_injected};

/// The prefix the case saves under, on both tiers.
const PREFIX: &str = "tiered";

/// Step `step`'s tensors: few distinct bytes, so a compressed promotion encodes them.
fn model(step: u64) -> Vec<Tensor> {
    let weights: Vec<u8> = (0..20_000u64).map(|i| (i * 7 % 11 + step) as u8).collect();
    vec![
        Tensor::new("w", DType::U8, [20_000], weights),
        Tensor::new("step", DType::U8, [8], step.to_le_bytes().to_vec()),
    ]
}

/// Every tensor of `step` on `checkpoints`, by name.
fn contents(checkpoints: &Checkpoints, step: u64) -> Result<BTreeMap<String, Vec<u8>>> {
    let checkpoint = checkpoints.open(step)?;
    checkpoint.verify()?;
    checkpoint
        .reader()?
        .load_all()?
        .into_iter()
        .map(|(info, bytes)| Ok((info.name().to_owned(), bytes.to_vec()?)))
        .collect()
}

/// Fails unless every step the durable tier lists is uncommitted, or complete with the fast
/// tier's bytes for it.
fn check_durable(fast: &Checkpoints, durable: &Checkpoints, case: &str, context: &str) {
    let statuses = durable
        .list()
        .unwrap_or_else(|e| fail!(case, "{context}: listing the durable tier: {e}"));
    for status in statuses {
        let step = status.step;
        match status.state {
            StepState::Uncommitted => {}
            StepState::Foreign => {
                fail!(
                    case,
                    "{context}: step {step} on the durable tier holds only what no container can \
                     be: {:?}",
                    status.foreign
                )
            }
            StepState::Damaged(why) => {
                fail!(
                    case,
                    "{context}: step {step} is damaged on the durable tier: {why}"
                )
            }
            StepState::Complete => {
                let there = contents(durable, step).unwrap_or_else(|e| {
                    fail!(
                        case,
                        "{context}: reading step {step} on the durable tier: {e}"
                    )
                });
                let here = contents(fast, step).unwrap_or_else(|e| {
                    fail!(case, "{context}: reading step {step} on the fast tier: {e}")
                });
                if there != here {
                    fail!(
                        case,
                        "{context}: step {step} is complete on the durable tier with other \
                         bytes than the fast tier's"
                    );
                }
            }
        }
    }
}

/// A way to promote a step of the tiers: what the case fails at every operation.
type Promote = dyn Fn(&Tiered, u64) -> Result<()>;

/// Promotions failing at every operation of the durable tier in turn, on demand
/// ([`Tiered::promote`]), queued behind a save ([`Tiered::save`], then [`Tiered::flush`]) and
/// following a background save as it writes ([`Tiered::save_in_background`]), and queued
/// behind a save with its pieces stored encoded ([`Tiered::with_compressed_promotion`]): the
/// durable tier shows each step complete with the fast tier's bytes, or not at all; then an
/// unfailing promotion lands (encoded, for the last way).
pub fn tiered_promotions_survive_durable_faults<H: Harness>(harness: &H, case: &str) -> Outcome {
    let storage = harness.fresh();
    if !storage.capabilities().listing {
        return Outcome::NotApplicable("the backend does not list its containers".into());
    }
    let fast = Checkpoints::new(MemoryStorage::new(), PREFIX);
    let durable = Checkpoints::over(Arc::new(harness.reopen(&storage)), PREFIX);
    let mut step = 0;
    let behind_a_save: &Promote = &|tiered, step| {
        tiered.save(step, Writer::new(model(step)))?;
        tiered.flush()
    };
    let ways: [(&str, bool, &Promote); 4] = [
        ("promoting on demand", false, &|tiered, step| {
            tiered.fast().save(step, Writer::new(model(step)))?;
            tiered.promote(step).map(drop)
        }),
        ("promoting behind a save", false, behind_a_save),
        (
            "promoting as a background save writes",
            false,
            &|tiered, step| {
                let writer = Writer::new(model(step));
                tiered
                    .save_in_background(step, writer, SaveOptions::default())?
                    .wait()?;
                tiered.flush()
            },
        ),
        ("promoting compressed behind a save", true, behind_a_save),
    ];
    for (way, compressed, promote) in ways {
        for fail_at in 1.. {
            step += 1;
            let faulty: Arc<dyn Storage> =
                Arc::new(Faulty::failing_at(harness.reopen(&storage), fail_at));
            let mut tiered = Tiered::new(fast.clone(), Checkpoints::over(faulty, PREFIX))
                .with_promotion(Promotion::every_save());
            if compressed {
                tiered = tiered.with_compressed_promotion();
            }
            let context = format!("{way}, step {step}, failing at operation {fail_at}");
            match promote(&tiered, step) {
                Ok(()) => {
                    check_durable(&fast, &durable, case, &context);
                    let Ok(promoted) = durable.open(step) else {
                        fail!(
                            case,
                            "{context}: the promotion succeeded, the step is not there"
                        );
                    };
                    let encoded = promoted.record().is_encoded();
                    if encoded != compressed {
                        fail!(
                            case,
                            "{context}: the promoted step is stored encoded: {encoded}, asked: \
                             {compressed}"
                        );
                    }
                    break;
                }
                Err(e) if !is_injected(&e) => {
                    fail!(case, "{context}: failed with its own error: {e}")
                }
                Err(_) => check_durable(&fast, &durable, case, &context),
            }
            if fail_at > 200 {
                fail!(case, "{way}: still failing after 200 operations");
            }
        }
    }
    Outcome::Checked
}
