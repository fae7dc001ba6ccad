//! Cold start from a store shaped like a cloud store (the remote cases' [`SlowStore`]: 20 ms
//! to first byte, 100 MiB/s per connection, 16 connections): a Llama-shaped safetensors model
//! built by candle-transformers' own `Llama::load` through weightbay-candle, once one tensor at
//! a time (the path model code takes on its own) and once prefetched (with the `llama`
//! feature: candle-transformers is too heavy a build for the test command); and the same bytes
//! streamed into a reused staging pool, the shape a GPU upload takes.
//!
//! The limit each row is set against is computed, not run: what 16 connections carry and, for
//! the model (whose tensors candle copies into fresh memory), the machine's fresh-memory fill
//! rate, measured here, whichever is lower.

use std::hint::black_box;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

#[cfg(feature = "llama")]
use candle_core::{DType as CandleDType, Device};
#[cfg(feature = "llama")]
use candle_nn::VarBuilder;
#[cfg(feature = "llama")]
use candle_transformers::models::llama::{Config, Llama};
use weightbay::{Bytes, DType, Format, Reader, Result, StagingPool, Tensor};
#[cfg(feature = "llama")]
use weightbay::{PrefetchPlan, Prefetched};
#[cfg(feature = "llama")]
use weightbay_candle::WeightbayBackend;
#[cfg(feature = "llama")]
use weightbay_object_store::ObjectStorage;
use weightbay_object_store::ObjectStoreOptions;

use crate::cases::remote::{CONNECTION_BYTES_PER_SECOND, CONNECTIONS, throttled_storage};
use crate::context::Bench;
use crate::harness::{cpu_time, median, print_runs, touch};
use crate::report::Row;
use crate::rss::rss;
use crate::store::SlowStore;

/// Staging buffer lengths tried: one request each, one buffer per connection. Each request
/// pays the 20 ms to first byte once, so longer ones lose less of the connection to it.
const STAGING_BUFFERS: [usize; 2] = [16 << 20, 32 << 20];
/// Layers of the model at 2 GiB; fewer for a smaller `--size-mib`.
const LAYERS_AT_2_GIB: u64 = 22;

/// A Llama-7B-shaped model scaled down to about `size_mib` MiB of F32 weights: 22 layers of
/// hidden size 1280 (9 tensors each) and a 32,000-token vocabulary, 201 tensors at 2 GiB.
#[derive(Debug, Clone, Copy)]
struct LlamaShape {
    hidden: usize,
    intermediate: usize,
    vocab: usize,
    layers: usize,
}

impl LlamaShape {
    fn scaled_to(size_mib: u64) -> Self {
        Self {
            hidden: 1280,
            intermediate: 3456,
            vocab: 32_000,
            layers: (LAYERS_AT_2_GIB * size_mib / 2048).max(1) as usize,
        }
    }

    /// candle-transformers' configuration of this shape: 10 attention heads of 128.
    #[cfg(feature = "llama")]
    fn config(self) -> Config {
        Config {
            hidden_size: self.hidden,
            intermediate_size: self.intermediate,
            vocab_size: self.vocab,
            num_hidden_layers: self.layers,
            num_attention_heads: 10,
            num_key_value_heads: 10,
            use_flash_attn: false,
            rms_norm_eps: 1e-6,
            rope_theta: 10_000.0,
            bos_token_id: None,
            eos_token_id: None,
            rope_scaling: None,
            max_position_embeddings: 256,
            tie_word_embeddings: false,
        }
    }

    /// The model's tensors as a Hugging Face Llama checkpoint names and lays them out (sorted
    /// by name, as safetensors' `save_file` writes them), F32, each filled with one byte value
    /// and made when the writer reaches it.
    fn tensors(self) -> Vec<Tensor> {
        let (h, i, v) = (
            self.hidden as u64,
            self.intermediate as u64,
            self.vocab as u64,
        );
        let mut shapes: Vec<(String, Vec<u64>)> = vec![
            ("model.embed_tokens.weight".into(), vec![v, h]),
            ("lm_head.weight".into(), vec![v, h]),
            ("model.norm.weight".into(), vec![h]),
        ];
        for layer in 0..self.layers {
            let at = |name: &str| format!("model.layers.{layer}.{name}.weight");
            for projection in ["q_proj", "k_proj", "v_proj", "o_proj"] {
                shapes.push((at(&format!("self_attn.{projection}")), vec![h, h]));
            }
            shapes.push((at("mlp.gate_proj"), vec![i, h]));
            shapes.push((at("mlp.up_proj"), vec![i, h]));
            shapes.push((at("mlp.down_proj"), vec![h, i]));
            shapes.push((at("input_layernorm"), vec![h]));
            shapes.push((at("post_attention_layernorm"), vec![h]));
        }
        shapes.sort_by(|a, b| a.0.cmp(&b.0));
        shapes
            .into_iter()
            .enumerate()
            .map(|(index, (name, shape))| {
                let len = shape.iter().product::<u64>() * 4;
                Tensor::deferred(name, DType::F32, shape, len, move || {
                    // Small values: bytes 0x01..0x3f repeated make finite floats.
                    Ok(Bytes::from(vec![(index % 63 + 1) as u8; len as usize]))
                })
            })
            .collect()
    }
}

/// How fast this machine fills memory fresh from the allocator (every page faulted in and
/// cleared by the kernel, then written), on one thread: the median of three 512 MiB fills.
fn fresh_fill_rate() -> f64 {
    const LEN: usize = 512 << 20;
    let times: Vec<Duration> = (0..3)
        .map(|_| {
            let start = Instant::now();
            let filled = vec![1u8; LEN];
            let elapsed = start.elapsed();
            black_box(touch(&filled));
            elapsed
        })
        .collect();
    LEN as f64 / median(times).as_secs_f64()
}

/// Times `f` over the bench's runs, with the GETs each run made and the most memory it added,
/// and records it against `limit`. What `f` returns (the built model) is dropped after the
/// time is taken: freeing 2 GiB (about 0.1 s) is not part of a cold start.
fn against<T>(
    b: &mut Bench<'_>,
    case: &str,
    bytes: u64,
    throttled: &SlowStore,
    (limit_name, limit): (&str, Duration),
    mut f: impl FnMut() -> Result<T>,
) -> Result<()> {
    let (mut times, mut gets, mut peaks, mut open) = (Vec::new(), Vec::new(), Vec::new(), 0);
    let mut cpu = Vec::new();
    for _ in 0..b.table.runs {
        let before_gets = throttled.counts().gets.load(Ordering::Relaxed);
        throttled.counts().take_most_open();
        // Resets the peak to the current resident set (Linux), so the peak after is the run's.
        let _ = std::fs::write("/proc/self/clear_refs", "5");
        let before = rss("VmRSS:");
        let cpu_before = cpu_time();
        let start = Instant::now();
        let built = f()?;
        times.push(start.elapsed());
        drop(built);
        cpu.push(format!("{:.2}", (cpu_time() - cpu_before).as_secs_f64()));
        peaks.push(rss("VmHWM:").saturating_sub(before) >> 20);
        gets.push(throttled.counts().gets.load(Ordering::Relaxed) - before_gets);
        open = open.max(throttled.counts().take_most_open());
    }
    print_runs(&times, &vec![limit; times.len()]);
    println!(
        "    GET requests each run: {gets:?}; peak RSS added, MiB: {peaks:?}; most connections open at once: {open}; CPU seconds (all threads): {}",
        cpu.join(" ")
    );
    b.table.push(Row {
        case: case.to_owned(),
        ours: median(times),
        peer: Some((limit_name.to_owned(), limit)),
        bytes,
    });
    Ok(())
}

/// A row `--only` matches by this name.
pub(crate) const LLAMA_ONE_AT_A_TIME: &str =
    "cold start: llama one tensor at a time via weightbay-candle";
/// A row `--only` matches by this name.
pub(crate) const LLAMA_PREFETCHED_THEN_COPIED: &str =
    "cold start: llama prefetched into the fetch's buffers, then copied by candle";
/// A row `--only` matches by this name.
pub(crate) const LLAMA_PREFETCHED_INTO_PLACE: &str =
    "cold start: llama prefetched via weightbay-candle (landing in candle's memory)";
/// A row `--only` matches by this name.
pub(crate) const STAGING_POOL: &str = "cold start: into a reused staging pool";

/// Every name [`cold_start_cases`] answers to (`--only`).
pub(crate) const NAMES: &[&str] = &[
    LLAMA_ONE_AT_A_TIME,
    LLAMA_PREFETCHED_THEN_COPIED,
    LLAMA_PREFETCHED_INTO_PLACE,
    STAGING_POOL,
];

/// The rows this build leaves out: they need the `llama` feature.
#[cfg(not(feature = "llama"))]
const LLAMA_ROWS: &[&str] = &[
    LLAMA_ONE_AT_A_TIME,
    LLAMA_PREFETCHED_THEN_COPIED,
    LLAMA_PREFETCHED_INTO_PLACE,
];

pub(crate) fn cold_start_cases(b: &mut Bench<'_>) -> Result<()> {
    let shape = LlamaShape::scaled_to(b.args.size_mib);
    let tensors = shape.tensors();
    let count = tensors.len();
    let inner = crate::cases::remote::store_with_format(tensors, Format::Safetensors)?;
    let (storage, throttled) = throttled_storage(&inner, ObjectStoreOptions::DEFAULT)?;
    let storage = Arc::new(storage);
    let key = "big.safetensors";
    let bytes: u64 = Reader::open_key(storage.as_ref(), key)?
        .tensors()
        .iter()
        .map(|info| info.byte_len())
        .sum();
    let connections = CONNECTIONS as f64 * CONNECTION_BYTES_PER_SECOND;
    let fill = fresh_fill_rate();
    println!(
        "  cold start: a {}-layer Llama, {count} tensors, {} MiB; {CONNECTIONS} connections carry {:.0} MiB/s, this machine fills fresh memory at {:.0} MiB/s on one thread",
        shape.layers,
        bytes >> 20,
        connections / f64::from(1 << 20),
        fill / f64::from(1 << 20)
    );
    let connection_limit = Duration::from_secs_f64(bytes as f64 / connections);
    let model_limit = Duration::from_secs_f64(bytes as f64 / connections.min(fill));
    let model_limit_name = if fill < connections {
        "fresh-memory fill rate"
    } else {
        "16 × 100 MiB/s connections"
    };
    // Each row checks `--only` itself.
    #[cfg(feature = "llama")]
    llama_rows(
        b,
        shape,
        (storage.as_ref(), key, bytes),
        &throttled,
        (model_limit_name, model_limit),
    )?;
    #[cfg(not(feature = "llama"))]
    if LLAMA_ROWS.iter().any(|row| b.args.wants(row)) {
        let _ = (model_limit_name, model_limit);
        println!(
            "  cold start: llama rows skipped: built without the `llama` feature (cargo run --release -p weightbay-bench --features llama -- --only \"cold start\")"
        );
    }
    if b.args.wants(STAGING_POOL) {
        for buffer in STAGING_BUFFERS {
            let pool = StagingPool::new(CONNECTIONS as usize, buffer)?;
            let reader = Reader::open_key(storage.as_ref(), key)?;
            let names: Vec<&str> = reader.tensors().iter().map(|t| t.name()).collect();
            against(
                b,
                &format!(
                    "cold start: into a reused staging pool ({CONNECTIONS} × {} MiB)",
                    buffer >> 20
                ),
                bytes,
                &throttled,
                ("16 × 100 MiB/s connections", connection_limit),
                || {
                    let mut sum = 0;
                    reader.stage(&names, &pool, |staged| {
                        // A runtime would start the copy to the device here.
                        sum += touch(staged.bytes());
                        Ok(())
                    })?;
                    black_box(sum);
                    Ok(())
                },
            )?;
        }
    }
    Ok(())
}

/// How the Llama rows hand weights to candle.
#[cfg(feature = "llama")]
#[derive(Debug, Clone, Copy)]
enum Build {
    /// `WeightbayBackend::new(reader)`: each tensor read as the constructor asks.
    OneAtATime,
    /// `WeightbayBackend::new(Prefetched::new(reader, All))`: fetched ahead into buffers of
    /// the fetch's own, which candle copies into its tensors.
    PrefetchedCopied,
    /// `WeightbayBackend::prefetching(reader, All)`: fetched ahead into the `Vec`s that become
    /// candle's tensors.
    PrefetchedLanded,
}

/// The model built by candle-transformers' `Llama::load` through weightbay-candle, one tensor
/// at a time and prefetched.
#[cfg(feature = "llama")]
fn llama_rows(
    b: &mut Bench<'_>,
    shape: LlamaShape,
    (storage, key, bytes): (&ObjectStorage, &str, u64),
    throttled: &SlowStore,
    limit: (&str, Duration),
) -> Result<()> {
    let config = shape.config();
    let build = |how: Build| -> Result<Llama> {
        let reader = Reader::open_key(storage, key)?;
        let backend: Box<dyn candle_nn::var_builder::SimpleBackend> = match how {
            Build::OneAtATime => Box::new(WeightbayBackend::new(reader)),
            Build::PrefetchedCopied => Box::new(WeightbayBackend::new(Prefetched::new(
                reader,
                PrefetchPlan::All,
            )?)),
            Build::PrefetchedLanded => {
                Box::new(WeightbayBackend::prefetching(reader, PrefetchPlan::All)?)
            }
        };
        let vb = VarBuilder::from_backend(backend, CandleDType::F32, Device::Cpu);
        Llama::load(vb, &config)
            .map_err(|e| weightbay::Error::new(weightbay::ErrorKind::Io, e.to_string()))
    };
    let rows = [
        (LLAMA_ONE_AT_A_TIME, Build::OneAtATime),
        (LLAMA_PREFETCHED_THEN_COPIED, Build::PrefetchedCopied),
        (LLAMA_PREFETCHED_INTO_PLACE, Build::PrefetchedLanded),
    ];
    for (row, how) in rows {
        if b.args.wants(row) {
            against(b, row, bytes, throttled, limit, || build(how))?;
        }
    }
    Ok(())
}
