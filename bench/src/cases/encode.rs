//! Encoding and indexing in memory: a container into bytes, planning, opening an index.

use std::hint::black_box;

use weightbay::{Bytes, DType, Reader, Result, Tensor, Writer};

use crate::context::Bench;
use crate::harness::Start;

pub(crate) fn into_bytes(b: &mut Bench<'_>) -> Result<()> {
    let big = &b.big;
    b.table.compare(
        Start::Cached,
        "into_bytes (trailer on)",
        big.bytes(),
        "memcpy into fresh memory",
        || {
            Writer::new(big.ours())
                .into_bytes()
                .map(|b| drop(black_box(b)))
        },
        || {
            let mut out = vec![0u8; big.bytes() as usize];
            let mut at = 0;
            for (_, data) in &big.tensors {
                out[at..at + data.len()].copy_from_slice(data);
                at += data.len();
            }
            black_box(out);
            Ok(())
        },
    )
}

pub(crate) fn plan(b: &mut Bench<'_>) -> Result<()> {
    let tensors: Vec<Tensor> = (0..100_000)
        .map(|i| {
            Tensor::deferred(
                format!("blocks.{i}.weight"),
                DType::F32,
                [256],
                1024,
                || Ok(Bytes::from(vec![])),
            )
        })
        .collect();
    let writer = Writer::new(tensors);
    b.table
        .alone("plan 100k tensors", || {
            writer.size().map(|s| {
                black_box(s);
            })
        })
        .map(drop)
}

pub(crate) fn open_index(b: &mut Bench<'_>) -> Result<()> {
    let tensors: Vec<Tensor> = (0..20_000)
        .map(|i| Tensor::new(format!("blocks.{i}.weight"), DType::U8, [4], vec![1u8; 4]))
        .collect();
    let bytes = bytes::Bytes::from(Writer::new(tensors).into_bytes()?);
    let time = b.table.alone("open 20k-tensor index", || {
        Reader::from_bytes(bytes.clone()).map(|r| drop(black_box(r)))
    })?;
    println!(
        "  open a 20,000-tensor container (index only): {:.3} µs per tensor",
        time.as_secs_f64() * 1e6 / 20_000.0
    );
    Ok(())
}
