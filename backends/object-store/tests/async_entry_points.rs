//! Saving and loading from inside a tokio current-thread runtime, the very runtime the
//! storage's requests run on: a side task on the same thread must keep running throughout.

use std::sync::Arc;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use object_store::local::LocalFileSystem;
use weightbay::{DType, Reader, Tensor, Writer};
use weightbay_object_store::{Bridge, ObjectStorage, ObjectStoreOptions};

const TENSORS: usize = 32;
const TENSOR_LEN: usize = 8 << 20; // 256 MiB in all
/// Far longer than the save and load take, even unoptimised.
const WATCHDOG: Duration = Duration::from_secs(300);

/// What the side task saw: how often it ran, and its longest pause.
#[derive(Debug, Default)]
struct Ticks {
    count: u64,
    last: Option<Instant>,
    longest_pause: Duration,
}

async fn tick(ticks: Arc<Mutex<Ticks>>) {
    loop {
        tokio::time::sleep(Duration::from_millis(1)).await;
        let mut ticks = ticks.lock().unwrap();
        let now = Instant::now();
        if let Some(last) = ticks.last {
            ticks.longest_pause = ticks.longest_pause.max(now - last);
        }
        ticks.last = Some(now);
        ticks.count += 1;
    }
}

#[test]
fn a_current_thread_runtime_keeps_running_during_a_save_and_a_load() {
    // A save that blocked the runtime's thread would deadlock it (the storage's requests run
    // there too): the watchdog turns that into a failure.
    let (done, finished) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        save_and_load_on_a_current_thread_runtime();
        let _ = done.send(());
    });
    match finished.recv_timeout(WATCHDOG) {
        Ok(()) => {}
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
            panic!("the save and load did not finish in {WATCHDOG:?}: the runtime is stalled")
        }
        Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
            panic!("the save and load failed (the panic above says how)")
        }
    }
}

fn save_and_load_on_a_current_thread_runtime() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    // Files rather than memory, whose reads are zero-copy and over before the side task's
    // first tick.
    let dir = tempfile::tempdir().unwrap();
    let storage = Arc::new(
        ObjectStorage::with_bridge(
            Arc::new(LocalFileSystem::new_with_prefix(dir.path()).unwrap()),
            Bridge::borrowed(runtime.handle().clone()),
        )
        .with_options(ObjectStoreOptions::DEFAULT.with_part_size(8 << 20)),
    );
    runtime.block_on(async {
        let ticks = Arc::new(Mutex::new(Ticks::default()));
        let ticker = tokio::spawn(tick(Arc::clone(&ticks)));
        let count = || ticks.lock().unwrap().count;
        let tensors = (0..TENSORS)
            .map(|i| {
                Tensor::deferred(
                    format!("t{i}"),
                    DType::U8,
                    [TENSOR_LEN as u64],
                    TENSOR_LEN as u64,
                    move || Ok(vec![i as u8; TENSOR_LEN].into()),
                )
            })
            .collect();

        let before = count();
        let summary = Writer::new(tensors)
            .write_in_background(Arc::clone(&storage), "big.bpk")
            .unwrap()
            .await
            .unwrap();
        let during_save = count() - before;
        assert!(summary.len > (TENSORS * TENSOR_LEN) as u64);

        let reader = Reader::open_in_background(Arc::clone(&storage), "big.bpk")
            .unwrap()
            .await
            .unwrap();
        let before = count();
        let loaded = reader.load_all_in_background().unwrap().await.unwrap();
        let during_load = count() - before;
        ticker.abort();

        assert_eq!(loaded.len(), TENSORS);
        for (info, bytes) in &loaded {
            let i: u8 = info.name()[1..].parse().unwrap();
            let data = bytes.read(weightbay::AccessPolicy::ZeroCopy).unwrap();
            assert!(data.len() == TENSOR_LEN && data.iter().all(|&b| b == i));
        }
        // A save or load that blocked the runtime's only thread would leave the side task at a
        // standstill (and the storage's own requests with it).
        assert!(
            during_save > 0 && during_load > 0,
            "the side task ran {during_save} times during the save, {during_load} during the load"
        );
        eprintln!(
            "side task: {during_save} ticks during the save, {during_load} during the load, \
             longest pause {:?} (the benchmark reports this figure)",
            ticks.lock().unwrap().longest_pause
        );
    });
}
