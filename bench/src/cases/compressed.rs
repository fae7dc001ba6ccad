//! Compressed saves and cold loads through the capped store (the remote cases' `SlowStore`:
//! 20 ms to first byte, 100 MiB/s a connection, 16 connections), each paired with the same
//! save or load uncompressed, and set against what the link carries of the raw bytes.

use std::sync::Arc;
use std::time::Duration;

use object_store::ObjectStore;
use object_store::memory::InMemory;
use weightbay::{AllocationProperty, Bytes, DType, Result, Storage, Tensor, Writer};
use weightbay_checkpoints::{Checkpoints, SaveOptions};
use weightbay_object_store::ObjectStoreOptions;

use super::codec::weights;
use super::remote::{CONNECTION_BYTES_PER_SECOND, CONNECTIONS, throttled_storage};
use crate::context::Bench;
use crate::harness::{Start, paired, timed};
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
            let at = (i * TENSOR_LEN) % drawn.len();
            let shared = drawn.slice(at..(at + TENSOR_LEN).min(drawn.len()));
            let elements = shared.len() as u64 / 2;
            Tensor::new(
                format!("layers.{i}.weight"),
                DType::BF16,
                [elements],
                Bytes::from_shared(shared, AllocationProperty::Native),
            )
        })
        .collect()
}

/// A run's checkpoints over a fresh in-memory store behind the capped one.
fn capped() -> Result<(Checkpoints, Arc<dyn ObjectStore>)> {
    let inner: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let (storage, _) = throttled_storage(&inner, ObjectStoreOptions::DEFAULT)?;
    let storage: Arc<dyn Storage> = Arc::new(storage);
    Ok((Checkpoints::over(storage, "run"), inner))
}

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
        case: "compressed save through the capped store".to_owned(),
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
    let load = |checkpoints: &Checkpoints| -> Result<Duration> {
        timed(|| {
            let reader = checkpoints.open(1)?.reader()?;
            drop(reader.load_all()?);
            Ok(())
        })
    };
    let (compressed, plain) = paired(
        runs,
        Start::Cached,
        || load(&compressed_store),
        || load(&plain_store),
    )?;
    b.table.push(Row {
        case: "compressed cold load through the capped store".to_owned(),
        ours: compressed,
        peer: Some(("the same load uncompressed".to_owned(), plain)),
        bytes,
    });
    println!(
        "    the link's raw limit for these bytes: {:.2} s; the compressed load took {:.2}x it",
        link.as_secs_f64(),
        compressed.as_secs_f64() / link.as_secs_f64()
    );
    Ok(())
}
