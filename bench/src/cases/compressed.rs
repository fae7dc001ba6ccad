//! Compressed saves and cold loads through the capped store (the remote cases' `SlowStore`:
//! 20 ms to first byte, 100 MiB/s a connection, 16 connections), each paired with the same
//! save or load uncompressed, and set against what the link carries of the raw bytes; and the
//! storage a chain of 100 compressed incremental saves holds, against the same uncompressed.

use std::sync::Arc;
use std::time::Duration;

use object_store::ObjectStore;
use object_store::memory::InMemory;
use weightbay::{AllocationProperty, Bytes, DType, MemoryStorage, Result, Storage, Tensor, Writer};
use weightbay_checkpoints::{Checkpoints, Retention, SaveOptions};
use weightbay_object_store::ObjectStoreOptions;

use super::codec::weights;
use super::remote::{CONNECTION_BYTES_PER_SECOND, CONNECTIONS, throttled_storage};
use crate::context::Bench;
use crate::harness::{Start, cpu_time, paired, timed};
use crate::report::Row;

/// Each tensor's bytes.
const TENSOR_LEN: usize = 32 << 20;

/// Bytes drawn like trained weights, repeated to the checkpoint's size: each piece is encoded
/// on its own, so repeating changes no figure and spares drawing gigabytes.
const DRAWN_LEN: usize = 256 << 20;

/// bf16 tensors of [`TENSOR_LEN`], `len` bytes in all.
fn model(len: usize) -> Vec<Tensor> {
    let drawn = bytes::Bytes::from(weights(&DType::BF16, DRAWN_LEN.min(len)));
    (0..len / TENSOR_LEN)
        .map(|i| {
            bf16(
                format!("layers.{i}.weight"),
                &drawn,
                i * TENSOR_LEN,
                TENSOR_LEN,
            )
        })
        .collect()
}

/// A bf16 tensor of the `len` bytes of `drawn` from `at` (wrapping round).
fn bf16(name: String, drawn: &bytes::Bytes, at: usize, len: usize) -> Tensor {
    let at = at % (drawn.len() - len + 1);
    let shared = drawn.slice(at..at + len);
    Tensor::new(
        name,
        DType::BF16,
        [len as u64 / 2],
        Bytes::from_shared(shared, AllocationProperty::Native),
    )
}

/// Adapter tensors a fine-tuning chain changes every step.
const ADAPTERS: usize = 8;

/// The bytes a chain of 100 saves holds in the end, each save followed by keep-last-5 and gc,
/// the fine-tuning shape in weights drawn like trained ones: the model frozen, and
/// [`ADAPTERS`] tensors of 1/400 of it each drawn anew every step.
fn chain_storage(frozen: &[Tensor], drawn: &bytes::Bytes, options: SaveOptions) -> Result<u64> {
    let storage = Arc::new(MemoryStorage::new());
    let checkpoints = Checkpoints::over(Arc::clone(&storage) as Arc<dyn Storage>, "hundred");
    let total: usize = frozen.iter().map(|t| t.byte_len() as usize).sum();
    let adapter_len = total / 400 / 2 * 2;
    for step in 1..=100usize {
        let mut tensors = frozen.to_vec();
        tensors.extend((0..ADAPTERS).map(|i| {
            let at = (step * ADAPTERS + i) * (adapter_len + 4098);
            bf16(format!("adapter.{i}"), drawn, at, adapter_len)
        }));
        checkpoints.save_with(step as u64, Writer::new(tensors), options.clone())?;
        checkpoints.retain(&Retention::keep_last(5))?;
        checkpoints.gc()?;
    }
    Ok(storage.list("hundred")?.iter().map(|l| l.len).sum())
}

/// A run's checkpoints over a fresh in-memory store behind the capped one.
fn capped() -> Result<(Checkpoints, Arc<dyn ObjectStore>)> {
    let inner: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let (storage, _) = throttled_storage(&inner, ObjectStoreOptions::DEFAULT)?;
    let storage: Arc<dyn Storage> = Arc::new(storage);
    Ok((Checkpoints::over(storage, "run"), inner))
}

/// A row `--only` matches by this name.
pub(crate) const COMPRESSED_SAVE: &str = "compressed save through the capped store";
/// A row `--only` matches by this name.
pub(crate) const COMPRESSED_COLD_LOAD: &str = "compressed cold load through the capped store";

/// The same cold loads, each tensor landed in fresh memory of its own
/// (`Reader::read_many_into`), as a load into a framework's tensors lands it: `load_all` of
/// raw pieces may hand out views of bytes the store already holds (object_store's in-memory
/// store slices its own), where decoding writes every byte.
pub(crate) const COMPRESSED_LANDED_LOAD: &str =
    "compressed cold load through the capped store, landed in fresh memory";

/// Every name [`compressed_cases`] answers to (`--only`).
pub(crate) const COMPRESSED_CASES_NAMES: &[&str] = &[
    COMPRESSED_SAVE,
    COMPRESSED_COLD_LOAD,
    COMPRESSED_LANDED_LOAD,
];

pub(crate) fn compressed_cases(b: &mut Bench<'_>) -> Result<()> {
    let len = ((b.args.size_mib as usize) << 20) / TENSOR_LEN * TENSOR_LEN;
    let tensors = model(len);
    let bytes = len as u64;
    let link =
        Duration::from_secs_f64(bytes as f64 / (CONNECTIONS as f64 * CONNECTION_BYTES_PER_SECOND));
    let runs = b.table.runs;
    let save = |options: SaveOptions| -> Result<Duration> {
        let (checkpoints, _inner) = capped()?;
        timed(|| {
            checkpoints
                .save_with(1, Writer::new(tensors.clone()), options)
                .map(drop)
        })
    };
    println!(
        "  {} MiB of bf16 weights in {} MiB tensors; the link carries their raw bytes in {:.2} s \
         ({CONNECTIONS} connections of {} MiB/s)",
        len >> 20,
        TENSOR_LEN >> 20,
        link.as_secs_f64(),
        CONNECTION_BYTES_PER_SECOND as u64 >> 20
    );
    let (compressed, plain) = paired(
        runs,
        Start::Cached,
        || save(SaveOptions::compressed()),
        || save(SaveOptions::incremental()),
    )?;
    b.table.push(Row {
        case: COMPRESSED_SAVE.to_owned(),
        ours: compressed,
        peer: Some(("the same save uncompressed".to_owned(), plain)),
        bytes,
    });
    println!(
        "    the link's raw limit for these bytes: {:.2} s; the compressed save took {:.2}x it",
        link.as_secs_f64(),
        compressed.as_secs_f64() / link.as_secs_f64()
    );
    // One checkpoint of each, loaded cold (a fresh reader, nothing cached) run after run.
    let (compressed_store, _a) = capped()?;
    let record =
        compressed_store.save_with(1, Writer::new(tensors.clone()), SaveOptions::compressed())?;
    let stored: u64 = record.containers.iter().map(|c| c.len).sum();
    let (plain_store, _b) = capped()?;
    plain_store.save_with(1, Writer::new(tensors.clone()), SaveOptions::incremental())?;
    println!(
        "    stored: {stored} bytes compressed, {bytes} raw ({:.4}x smaller)",
        bytes as f64 / stored as f64
    );
    // Each run's process CPU time beside its wall time: this process holds the store, the
    // cap's copies and the load, so CPU seconds near the cores times the wall time say the
    // machine, not the link, is the limit.
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    let cpu = std::cell::RefCell::new((Vec::new(), Vec::new()));
    let load = |checkpoints: &Checkpoints, compressed: bool| -> Result<Duration> {
        let before = cpu_time();
        let wall = timed(|| {
            let reader = checkpoints.open(1)?.reader()?;
            drop(reader.load_all()?);
            Ok(())
        })?;
        let used = (cpu_time() - before).as_secs_f64();
        let busy = format!("{used:.2} s CPU / {:.2} s wall", wall.as_secs_f64());
        let mut cpu = cpu.borrow_mut();
        if compressed { &mut cpu.0 } else { &mut cpu.1 }.push(busy);
        Ok(wall)
    };
    let (compressed, plain) = paired(
        runs,
        Start::Cached,
        || load(&compressed_store, true),
        || load(&plain_store, false),
    )?;
    let (compressed_cpu, plain_cpu) = cpu.into_inner();
    println!(
        "    each load's process CPU (the machine offers {cores} cores x wall): compressed \
         {}; uncompressed {}",
        compressed_cpu.join(", "),
        plain_cpu.join(", ")
    );
    b.table.push(Row {
        case: COMPRESSED_COLD_LOAD.to_owned(),
        ours: compressed,
        peer: Some(("the same load uncompressed".to_owned(), plain)),
        bytes,
    });
    println!(
        "    the link's raw limit for these bytes: {:.2} s; the compressed load took {:.2}x it",
        link.as_secs_f64(),
        compressed.as_secs_f64() / link.as_secs_f64()
    );
    let landed = |checkpoints: &Checkpoints| -> Result<Duration> {
        timed(|| {
            let reader = checkpoints.open(1)?.reader()?;
            let names: Vec<&str> = reader.tensors().iter().map(|t| t.name()).collect();
            let mut buffers = reader
                .tensors()
                .iter()
                .map(|t| Bytes::zeroed(t.byte_len() as usize, 64))
                .collect::<Result<Vec<_>>>()?;
            let mut targets = names
                .iter()
                .zip(buffers.iter_mut())
                .map(|(name, buffer)| Ok((*name, buffer.make_mut()?)))
                .collect::<Result<Vec<_>>>()?;
            reader.read_many_into(&mut targets)
        })
    };
    let (compressed, plain) = paired(
        runs,
        Start::Cached,
        || landed(&compressed_store),
        || landed(&plain_store),
    )?;
    b.table.push(Row {
        case: COMPRESSED_LANDED_LOAD.to_owned(),
        ours: compressed,
        peer: Some(("the same load uncompressed".to_owned(), plain)),
        bytes,
    });
    Ok(())
}

pub(crate) fn chain_cases(b: &mut Bench<'_>) -> Result<()> {
    let len = ((b.args.size_mib as usize).min(256) << 20) / TENSOR_LEN * TENSOR_LEN;
    let drawn = bytes::Bytes::from(weights(&DType::BF16, DRAWN_LEN));
    let frozen: Vec<Tensor> = (0..len / TENSOR_LEN)
        .map(|i| {
            bf16(
                format!("layers.{i}.weight"),
                &drawn,
                i * TENSOR_LEN,
                TENSOR_LEN,
            )
        })
        .collect();
    let compressed = chain_storage(&frozen, &drawn, SaveOptions::compressed())?;
    let plain = chain_storage(&frozen, &drawn, SaveOptions::incremental())?;
    println!(
        "  compressed chain storage: 100 saves of a {} MiB bf16 model, {ADAPTERS} adapters \
         of 1/400 of it changing each step, keep-last-5 and gc after each: {compressed} \
         bytes stored compressed, {plain} uncompressed = {:.3}x",
        len >> 20,
        compressed as f64 / plain as f64
    );
    Ok(())
}
