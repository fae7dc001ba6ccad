//! Tiered checkpoints' figures: how long a save holds the training loop, tiered (a local fast
//! tier, the S3 server as the durable one) against a plain durable local save, in the
//! foreground and the background; how long until the checkpoint is durable on the remote tier
//! against a save made there directly, saved in the foreground and in the background (whose
//! promotion follows the save as it writes); and a loop saving every 5 s while promotion to the
//! capped store ([`SlowStore`]: 20 ms, 100 MiB/s a connection) falls behind.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use weightbay::{Durability, Result, Storage, Writer};
use weightbay_checkpoints::{
    Checkpoints, PerTier, Promotion, PromotionState, Retention, SaveOptions, Tiered,
};
use weightbay_local::LocalStorage;
use weightbay_object_store::ObjectStoreOptions;

use crate::cases::remote::{store_with, throttled_storage};
use crate::context::Bench;
use crate::harness::{Start, io, paired, print_runs, seconds, timed};
use crate::report::Row;

/// How often the loop of the capped-store case saves.
const SAVE_EVERY: Duration = Duration::from_secs(5);
/// How many saves that loop makes.
const LOOP_SAVES: u32 = 6;
/// How long that loop trains before it saves, for its step time alone.
const QUIET: Duration = Duration::from_secs(10);

/// Keep one checkpoint on each tier: the runs measure saves, not what piles up.
fn keep_one() -> PerTier<Retention> {
    PerTier {
        fast: Retention::keep_last(1),
        durable: Retention::keep_last(1),
    }
}

/// A row `--only` matches by this name.
pub(crate) const TIERED_SAVE: &str = "tiered save";
/// A row `--only` matches by this name.
pub(crate) const TIERED_LOOP: &str = "tiered loop";

/// Every name [`tiered_cases`] answers to (`--only`).
pub(crate) const NAMES: &[&str] = &[TIERED_SAVE, TIERED_LOOP];

pub(crate) fn tiered_cases(b: &mut Bench<'_>) -> Result<()> {
    let dir = b.dir.join("tiered");
    std::fs::create_dir_all(&dir).map_err(io("creating the tiered directory"))?;
    let local: Arc<dyn Storage> = Arc::new(LocalStorage::new(&dir));
    if b.args.wants(TIERED_SAVE) {
        match std::env::var("WEIGHTBAY_S3_URL") {
            Ok(url) => against_s3(b, &local, &url)?,
            Err(_) => println!(
                "  tiered save: skipped, no S3 server (vars=$(scripts/servers.sh start s3) && eval \"$vars\")"
            ),
        }
    }
    if b.args.wants(TIERED_LOOP) {
        capped_loop(b, &local)?;
    }
    Ok(())
}

/// The three paired figures against the S3 server as the durable tier.
fn against_s3(b: &mut Bench<'_>, local: &Arc<dyn Storage>, url: &str) -> Result<()> {
    let s3: Arc<dyn Storage> = Arc::new(weightbay_object_store::open_url(
        &format!("{url}/bench-tiered-{}", std::process::id()),
        std::iter::empty::<(&str, &str)>(),
    )?);
    let bytes = b.big.bytes();
    let big = &b.big;
    let writer = || Writer::new(big.ours()).with_durability(Durability::Durable);
    let tiered = Tiered::new(
        Checkpoints::over(Arc::clone(local), "fast"),
        Checkpoints::over(Arc::clone(&s3), "durable"),
    );
    let plain = Checkpoints::over(Arc::clone(local), "plain");
    let direct = Checkpoints::over(s3, "direct");
    let step = std::cell::Cell::new(0u64);
    let next = || {
        step.set(step.get() + 1);
        step.get()
    };
    // A plain save, and the tiered save's promotion after its timing, keep one checkpoint.
    let plain_save = || {
        let time = timed(|| plain.save(next(), writer()).map(drop))?;
        plain.retain(&Retention::keep_last(1))?;
        Ok(time)
    };
    let promoted = || -> Result<()> {
        tiered.flush()?;
        tiered.retain(&keep_one()).map(drop)
    };

    let (foreground, local_save) = paired(
        b.table.runs,
        Start::Emptied,
        || {
            let time = timed(|| tiered.save(next(), writer()).map(drop))?;
            promoted()?;
            Ok(time)
        },
        plain_save,
    )?;
    b.table.push(Row {
        case: "tiered save, foreground: time the loop is blocked (local fast tier, S3 durable)"
            .to_owned(),
        ours: foreground,
        peer: Some((
            "a plain durable local save (time, not throughput)".to_owned(),
            local_save,
        )),
        bytes: 0,
    });

    let (background, local_save) = paired(
        b.table.runs,
        Start::Emptied,
        || {
            let start = Instant::now();
            let handle = tiered.save_in_background(next(), writer(), SaveOptions::default())?;
            let blocked = start.elapsed();
            handle.wait()?;
            promoted()?;
            Ok(blocked)
        },
        plain_save,
    )?;
    b.table.push(Row {
        case: "tiered save, background: time the loop is blocked".to_owned(),
        ours: background,
        peer: Some((
            "a plain durable local save (time, not throughput)".to_owned(),
            local_save,
        )),
        bytes: 0,
    });

    // Where each run's time goes: the local save, then the promotion waited for. A
    // foreground save's promotion starts once it commits; a background save's follows it as
    // it writes.
    let direct_save = || {
        let time = timed(|| direct.save(next(), writer()).map(drop))?;
        direct.retain(&Retention::keep_last(1))?;
        Ok(time)
    };
    let ways: [(&str, &dyn Fn() -> Result<()>); 2] = [
        ("start to durable on the remote tier", &|| {
            tiered.save(next(), writer()).map(drop)
        }),
        (
            "in the background, start to durable (the promotion follows the save as it writes)",
            &|| {
                let saving = tiered.save_in_background(next(), writer(), SaveOptions::default());
                saving?.wait().map(drop)
            },
        ),
    ];
    for (way, save) in ways {
        let parts = std::cell::RefCell::new(Vec::new());
        let (durable, direct) = paired(
            b.table.runs,
            Start::Emptied,
            || {
                let mut saved = Duration::ZERO;
                let time = timed(|| {
                    saved = timed(save)?;
                    tiered.flush()
                })?;
                parts.borrow_mut().push((saved, time - saved));
                tiered.retain(&keep_one())?;
                Ok(time)
            },
            direct_save,
        )?;
        let (saves, promotions): (Vec<Duration>, Vec<Duration>) =
            parts.into_inner().into_iter().unzip();
        println!(
            "    each tiered run, seconds: local save {}; promotion ending after it {}",
            seconds(&saves),
            seconds(&promotions)
        );
        b.table.push(Row {
            case: format!("tiered save, {way}"),
            ours: durable,
            peer: Some(("a save straight to the S3 server".to_owned(), direct)),
            bytes,
        });
    }
    Ok(())
}

/// A training step: a fixed amount of arithmetic on one core.
fn train_step(state: &mut u64) {
    for _ in 0..20_000_000 {
        *state ^= *state << 13;
        *state ^= *state >> 7;
        *state ^= *state << 17;
    }
}

/// A loop that trains for [`QUIET`] without saving, then saves in the background every
/// [`SAVE_EVERY`] ([`LOOP_SAVES`] times) through tiers whose durable one is the capped store,
/// promoting the newest only. Reports its mean step time against the quiet part's, how far
/// the durable tier fell behind, and what was skipped.
fn capped_loop(b: &mut Bench<'_>, local: &Arc<dyn Storage>) -> Result<()> {
    let inner = store_with(Vec::new())?;
    let (remote, _) = throttled_storage(&inner, ObjectStoreOptions::DEFAULT)?;
    let tiered = Tiered::new(
        Checkpoints::over(Arc::clone(local), "loop"),
        Checkpoints::over(Arc::new(remote), "loop"),
    )
    .with_promotion(Promotion::newest_only())
    // Applied on the promotion's thread after each promotion, not on the loop's.
    .with_retention(PerTier {
        fast: Retention::keep_last(2),
        durable: Retention::keep_last(2),
    });
    let big = &b.big;
    // One promotion alone: what "within one promotion time" is measured against.
    tiered.fast().save(1, Writer::new(big.ours()))?;
    let promotion = timed(|| tiered.promote(1).map(drop))?;
    println!(
        "  one promotion of {} MiB to the capped store: {:.2} s",
        big.bytes() >> 20,
        promotion.as_secs_f64()
    );

    // When each step became the durable tier's newest, seen by a watcher every 50 ms.
    let durable_at: Mutex<Vec<(u64, Instant)>> = Mutex::default();
    let done = AtomicBool::new(false);
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let (quiet, saving, saved_at) = std::thread::scope(|scope| -> Result<_> {
        scope.spawn(|| {
            let mut newest = 1;
            while !done.load(Ordering::SeqCst) {
                if let Ok(Some(latest)) = tiered.durable().latest()
                    && latest.step() > newest
                {
                    newest = latest.step();
                    durable_at.lock().unwrap().push((newest, Instant::now()));
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        });
        let (mut quiet, mut saving, mut saved_at) = (Vec::new(), Vec::new(), Vec::new());
        let start = Instant::now();
        while start.elapsed() < QUIET {
            quiet.push(timed(|| {
                train_step(&mut state);
                Ok(())
            })?);
        }
        let mut step = 1;
        let mut next_save = Instant::now();
        let mut handle = None;
        while saved_at.len() < LOOP_SAVES as usize || Instant::now() < next_save {
            saving.push(timed(|| {
                train_step(&mut state);
                if Instant::now() >= next_save && saved_at.len() < LOOP_SAVES as usize {
                    step += 1;
                    let t0 = Instant::now();
                    if let Some(previous) = handle.take() {
                        weightbay_checkpoints::SaveHandle::wait(previous)?;
                    }
                    let t1 = Instant::now();
                    saved_at.push((step, Instant::now()));
                    let writer = Writer::new(big.ours()).with_durability(Durability::Durable);
                    handle =
                        Some(tiered.save_in_background(step, writer, SaveOptions::default())?);
                    // Where a saving step's time goes: the previous local save still running,
                    // and the call.
                    println!(
                        "    save of step {step}: waited {:.2} s for the previous save, the call \
                         took {:.1} ms",
                        (t1 - t0).as_secs_f64(),
                        t1.elapsed().as_secs_f64() * 1e3,
                    );
                    next_save += SAVE_EVERY;
                }
                Ok(())
            })?);
        }
        if let Some(handle) = handle {
            handle.wait()?;
        }
        tiered.flush()?;
        done.store(true, Ordering::SeqCst);
        Ok((quiet, saving, saved_at))
    })?;
    let mean = |times: &[Duration]| times.iter().sum::<Duration>() / times.len().max(1) as u32;
    print_runs(&saving, &quiet);
    b.table.push(Row {
        case: format!(
            "tiered loop, saving {} MiB every {} s to the capped store: mean step time",
            big.bytes() >> 20,
            SAVE_EVERY.as_secs()
        ),
        ours: mean(&saving),
        peer: Some((
            "the same loop's steps before it saved (time, not throughput)".to_owned(),
            mean(&quiet),
        )),
        bytes: 0,
    });
    // For every save, how long until it or a newer step was durable.
    let durable_at = durable_at.into_inner().unwrap_or_default();
    let lags: Vec<Duration> = saved_at
        .iter()
        .filter_map(|&(step, at)| {
            let (_, when) = durable_at.iter().find(|&&(durable, _)| durable >= step)?;
            Some(when.saturating_duration_since(at))
        })
        .collect();
    let statuses = tiered.list()?;
    let skipped: Vec<u64> = statuses
        .iter()
        .filter(|s| matches!(s.promotion, Some(PromotionState::Superseded { .. })))
        .map(|s| s.step)
        .collect();
    println!(
        "  saves {:?}; promoted {:?}; skipped (superseded) {skipped:?}; each save durable (it or a newer step) after {:?} s",
        saved_at.iter().map(|(s, _)| *s).collect::<Vec<_>>(),
        durable_at.iter().map(|(s, _)| *s).collect::<Vec<_>>(),
        lags.iter()
            .map(|l| format!("{:.1}", l.as_secs_f64()))
            .collect::<Vec<_>>()
    );
    if !lags.is_empty() {
        b.table.push(Row {
            case: "tiered loop: save to durable (it or a newer step), the longest".to_owned(),
            ours: lags.iter().copied().max().unwrap_or_default(),
            peer: Some((
                "one promotion alone plus the save interval (time, not throughput)".to_owned(),
                promotion + SAVE_EVERY,
            )),
            bytes: 0,
        });
    }
    Ok(())
}
