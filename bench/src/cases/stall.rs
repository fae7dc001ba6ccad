//! How long a save and a load awaited inside a tokio `current_thread` runtime keep that
//! runtime's only thread from other tasks: a side task ticks every millisecond and the longest
//! pause between its ticks is reported, against the 10 ms a server's other requests can wait.
//! The store is `object_store`'s local files, and the S3 server when one runs; its
//! requests run either on the storage's own runtime (the default of `open_url`) or on the
//! caller's ([`Bridge::borrowed`]), where the store's own work (request signing, which hashes
//! every uploaded byte for S3, and copying responses) runs between the caller's tasks.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use weightbay::{DType, Reader, Result, Tensor, Writer};
use weightbay_object_store::{Bridge, ObjectStorage};

use crate::context::Bench;
use crate::harness::{io, median, print_runs};
use crate::report::Row;

const TENSORS: u64 = 32;
const TENSOR_LEN: u64 = 8 << 20; // 256 MiB in all
/// The longest pause a runtime shared with other work should see.
const GOAL: Duration = Duration::from_millis(10);

/// The side task's longest pause between ticks.
#[derive(Default)]
struct Pauses {
    last: Option<Instant>,
    longest: Duration,
}

async fn tick(pauses: Arc<Mutex<Pauses>>) {
    loop {
        tokio::time::sleep(Duration::from_millis(1)).await;
        let mut pauses = pauses
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let now = Instant::now();
        if let Some(last) = pauses.last {
            pauses.longest = pauses.longest.max(now - last);
        }
        pauses.last = Some(now);
    }
}

/// One save and one load of 256 MiB awaited on a current-thread runtime: the side task's
/// longest pause. With `borrowed`, the storage runs its requests on that runtime too.
fn longest_pause(url: &str, borrowed: bool) -> Result<Duration> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(io("starting a runtime"))?;
    let owned = weightbay_object_store::open_url(url, std::iter::empty::<(&str, &str)>())?;
    let storage = Arc::new(if borrowed {
        ObjectStorage::with_bridge(
            Arc::clone(owned.store()),
            Bridge::borrowed(runtime.handle().clone()),
        )
        .with_options(*owned.options())
    } else {
        owned
    });
    runtime.block_on(async {
        let pauses = Arc::new(Mutex::new(Pauses::default()));
        let ticker = tokio::spawn(tick(Arc::clone(&pauses)));
        // The ticker's first tick starts the count, so its start-up is not a pause.
        tokio::time::sleep(Duration::from_millis(5)).await;
        let tensors = (0..TENSORS)
            .map(|i| {
                Tensor::deferred(
                    format!("t{i}"),
                    DType::U8,
                    [TENSOR_LEN],
                    TENSOR_LEN,
                    move || Ok(vec![i as u8; TENSOR_LEN as usize].into()),
                )
            })
            .collect();
        Writer::new(tensors)
            .write_in_background(Arc::clone(&storage), "stall.bpk")?
            .await?;
        let reader = Reader::open_in_background(Arc::clone(&storage), "stall.bpk")?.await?;
        let loaded = reader.load_all_in_background()?.await?;
        ticker.abort();
        let longest = pauses
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .longest;
        // Freeing 256 MiB takes the thread that does it tens of milliseconds: the caller's
        // work, after the measured span.
        drop(loaded);
        Ok(longest)
    })
}

pub(crate) fn async_stall(b: &mut Bench<'_>) -> Result<()> {
    let mut stores = vec![(
        format!("file://{}", b.dir.display()),
        "object_store local files",
    )];
    match std::env::var("WEIGHTBAY_S3_URL") {
        Ok(url) => stores.push((format!("{url}/bench-stall"), "S3 server")),
        Err(_) => println!("  async on the S3 server: skipped, no S3 server"),
    }
    for (url, store) in &stores {
        for (borrowed, runtime) in [
            (false, "the storage's own runtime (default)"),
            (true, "the caller's runtime, borrowed"),
        ] {
            let pauses = (0..b.table.runs)
                .map(|_| longest_pause(url, borrowed))
                .collect::<Result<Vec<_>>>()?;
            print_runs(&pauses, &vec![GOAL; pauses.len()]);
            b.table.push(Row {
                case: format!(
                    "async: longest pause of a side task, 256 MiB save + load, {store}, requests on {runtime}"
                ),
                ours: median(pauses),
                peer: Some(("the 10 ms goal (time, not throughput)".to_owned(), GOAL)),
                bytes: 0,
            });
        }
    }
    Ok(())
}
