//! Durable saves to local files, against burn-pack and the safetensors crate.

use weightbay::{Result, Writer};

use crate::context::{Bench, save_big};
use crate::harness::{Data, Start, io};
use crate::peers;
use crate::peers::dd;
use crate::rss::rss_of;

/// A row `--only` matches by this name.
pub(crate) const DURABLE_SAVE: &str = "durable save";

/// Every name [`durable_save`] answers to (`--only`).
pub(crate) const DURABLE_SAVE_NAMES: &[&str] = &[DURABLE_SAVE];

pub(crate) fn durable_save(b: &mut Bench<'_>) -> Result<()> {
    let Bench {
        args,
        table,
        big,
        dir,
        local,
    } = b;
    let count = (big.bytes() >> 23).max(1);
    // dd writes a new file every run: truncating the last one would add the cost of freeing
    // it to dd's time.
    let mut dd_runs = 0;
    let dd_file = |run: usize| dir.join(format!("dd-{run}.bin"));
    table.compare(
        Start::Emptied,
        DURABLE_SAVE,
        big.bytes(),
        "dd bs=8M conv=fsync, new file",
        || save_big(local, big),
        || {
            dd_runs += 1;
            dd(&[
                "if=/dev/zero",
                &format!("of={}", dd_file(dd_runs).display()),
                "bs=8M",
                &format!("count={count}"),
                "conv=fsync",
            ])
        },
    )?;
    for run in 1..=dd_runs {
        std::fs::remove_file(dd_file(run)).map_err(io("removing dd's file"))?;
    }
    table.compare(
        Start::Emptied,
        DURABLE_SAVE,
        big.bytes(),
        "burn-pack write_to_file",
        || save_big(local, big),
        || peers::burn_pack_save(big, &dir.join("burn.bpk")),
    )?;
    let rss = rss_of("local", args.size_mib, dir)?;
    println!(
        "  peak RSS saving {} MiB of deferred 16 MiB tensors durably: {} MiB (bound: largest tensor + 16 MiB = 32 MiB above the process's base)",
        args.size_mib,
        rss >> 20
    );
    Ok(())
}

pub(crate) fn small_tensors(b: &mut Bench<'_>) -> Result<()> {
    let small = Data::small();
    let (local, dir) = (&b.local, &b.dir);
    let save_small = || {
        Writer::new(small.ours())
            .write_to(local, "small.bpk")
            .map(drop)
    };
    b.table.compare(
        Start::Emptied,
        "20k small tensors, durable",
        small.bytes(),
        "burn-pack write_to_file",
        save_small,
        || peers::burn_pack_save(&small, &dir.join("small-burn.bpk")),
    )?;
    b.table.compare(
        Start::Emptied,
        "20k small tensors, durable",
        small.bytes(),
        "safetensors serialize_to_file + fsync",
        save_small,
        || peers::safetensors_save(&small, &dir.join("small.safetensors")),
    )
}
