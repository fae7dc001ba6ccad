//! candle models saved and loaded through weightbay, against candle's own safetensors loader.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use candle_core::{DType, Device, Module, Tensor};
use candle_nn::{Linear, VarBuilder, VarMap};
use weightbay::Format;
use weightbay::{PrefetchPlan, Prefetched, Reader, Source, Storage};
use weightbay_candle::{WeightbayBackend, save_tensors, save_var_map, var_map_writer};
use weightbay_local::LocalStorage;
use weightbay_mmap::MmapStorage;
use weightbay_object_store::ObjectStoreOptions;

/// A small MLP: 64 → 256 → 32.
struct Mlp {
    up: Linear,
    down: Linear,
}

impl Mlp {
    fn new(vb: VarBuilder) -> candle_core::Result<Self> {
        Ok(Self {
            up: candle_nn::linear(64, 256, vb.pp("up"))?,
            down: candle_nn::linear(256, 32, vb.pp("down"))?,
        })
    }

    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        self.down.forward(&self.up.forward(x)?.relu()?)
    }
}

fn input() -> Tensor {
    Tensor::arange(0f32, 128.0, &Device::Cpu)
        .unwrap()
        .reshape((2, 64))
        .unwrap()
        .affine(0.01, -0.5)
        .unwrap()
}

fn outputs(model: &Mlp) -> Vec<Vec<f32>> {
    model.forward(&input()).unwrap().to_vec2::<f32>().unwrap()
}

/// A freshly initialised model and its variables.
fn trained() -> (VarMap, Mlp) {
    let varmap = VarMap::new();
    let model = Mlp::new(VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu)).unwrap();
    (varmap, model)
}

fn through_weightbay(reader: Reader) -> Mlp {
    let backend = WeightbayBackend::new(reader);
    Mlp::new(VarBuilder::from_backend(
        Box::new(backend),
        DType::F32,
        Device::Cpu,
    ))
    .unwrap()
}

#[test]
fn saved_by_weightbay_loads_in_candle_and_through_weightbay_over_mmap_alike() {
    let dir = tempfile::tempdir().unwrap();
    let (varmap, model) = trained();
    save_var_map(
        &varmap,
        Format::Safetensors,
        &LocalStorage::new(dir.path()),
        "mlp.safetensors",
    )
    .unwrap();
    let path = dir.path().join("mlp.safetensors");
    // SAFETY: the file is not modified while mapped.
    let candles_own =
        unsafe { VarBuilder::from_mmaped_safetensors(&[&path], DType::F32, &Device::Cpu).unwrap() };
    let by_candle = Mlp::new(candles_own).unwrap();
    let mapped = MmapStorage::new(dir.path());
    let by_weightbay = through_weightbay(Reader::open_key(&mapped, "mlp.safetensors").unwrap());
    assert_eq!(outputs(&by_candle), outputs(&model));
    assert_eq!(outputs(&by_weightbay), outputs(&model));
}

#[test]
fn saved_by_candle_loads_through_weightbay_and_burnpack_works_too() {
    let dir = tempfile::tempdir().unwrap();
    let (varmap, model) = trained();
    let tensors: HashMap<String, Tensor> = varmap
        .data()
        .lock()
        .unwrap()
        .iter()
        .map(|(k, v)| (k.clone(), v.as_tensor().clone()))
        .collect();
    candle_core::safetensors::save(&tensors, dir.path().join("candle.safetensors")).unwrap();
    let local = LocalStorage::new(dir.path());
    let loaded = through_weightbay(Reader::open_key(&local, "candle.safetensors").unwrap());
    assert_eq!(outputs(&loaded), outputs(&model));

    save_tensors(
        tensors.into_iter().collect(),
        Format::Burnpack,
        &local,
        "mlp.bpk",
    )
    .unwrap();
    let reader = Reader::open_key(&local, "mlp.bpk").unwrap();
    reader.verify().unwrap();
    assert_eq!(outputs(&through_weightbay(reader)), outputs(&model));
}

#[test]
fn a_missing_or_misshapen_tensor_is_candles_usual_error() {
    let storage = weightbay::MemoryStorage::new();
    let (varmap, _) = trained();
    save_var_map(&varmap, Format::Burnpack, &storage, "m.bpk").unwrap();
    let vb = VarBuilder::from_backend(
        Box::new(WeightbayBackend::new(
            Reader::open_key(&storage, "m.bpk").unwrap(),
        )),
        DType::F32,
        Device::Cpu,
    );
    assert!(vb.contains_tensor("up.weight") && !vb.contains_tensor("nope"));
    let missing = candle_nn::linear(64, 256, vb.pp("nope")).err().unwrap();
    assert!(missing.to_string().contains("nope.weight"), "{missing}");
    let misshapen = candle_nn::linear(64, 128, vb.pp("up")).err().unwrap();
    assert!(
        misshapen
            .to_string()
            .contains("shape mismatch for up.weight"),
        "{misshapen}"
    );
}

/// A storage whose sources count the bytes read through them.
#[derive(Debug, Default)]
struct Counting {
    inner: weightbay::MemoryStorage,
    read: Arc<AtomicU64>,
}

#[derive(Debug)]
struct CountingSource {
    inner: Arc<dyn Source>,
    read: Arc<AtomicU64>,
}

impl Source for CountingSource {
    fn len(&self) -> u64 {
        self.inner.len()
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> weightbay::Result<()> {
        self.read.fetch_add(buf.len() as u64, Ordering::SeqCst);
        self.inner.read_at(offset, buf)
    }
    fn fetch(&self, ranges: &[Range<u64>]) -> weightbay::Result<Vec<weightbay::Bytes>> {
        let total: u64 = ranges.iter().map(|r| r.end - r.start).sum();
        self.read.fetch_add(total, Ordering::SeqCst);
        self.inner.fetch(ranges)
    }
}

#[deny(clippy::missing_trait_methods)]
impl Storage for Counting {
    fn capabilities(&self) -> weightbay::Capabilities {
        weightbay::Capabilities::NONE
    }
    fn open(&self, key: &str) -> weightbay::Result<Arc<dyn Source>> {
        Ok(Arc::new(CountingSource {
            inner: self.inner.open(key)?,
            read: Arc::clone(&self.read),
        }))
    }
    // It declares no capability: these answer as the contract says, on purpose.
    fn pending(&self, _prefix: &str) -> weightbay::Result<Vec<weightbay::PendingWrite>> {
        Err(weightbay::Error::unsupported(
            "this counting storage declares no capability",
        ))
    }
    fn clean_pending(&self, _prefix: &str) -> weightbay::Result<Vec<weightbay::PendingWrite>> {
        Err(weightbay::Error::unsupported(
            "this counting storage declares no capability",
        ))
    }
    fn list(&self, _prefix: &str) -> weightbay::Result<Vec<weightbay::Listed>> {
        Err(weightbay::Error::unsupported(
            "this counting storage declares no capability",
        ))
    }
    weightbay::forward_storage!(inner => create, delete, list_foreign);
}

/// A model built from part of a checkpoint reads only that part.
#[test]
fn only_the_tensors_the_model_asks_for_are_read() {
    let storage = Counting::default();
    let (varmap, _) = trained();
    save_var_map(&varmap, Format::Safetensors, &storage, "m.safetensors").unwrap();
    let reader = Reader::open_key(&storage, "m.safetensors").unwrap();
    let total = reader.len();
    storage.read.store(0, Ordering::SeqCst);
    let vb = VarBuilder::from_backend(
        Box::new(WeightbayBackend::new(reader)),
        DType::F32,
        Device::Cpu,
    );
    let down = candle_nn::linear(256, 32, vb.pp("down")).unwrap();
    let read = storage.read.load(Ordering::SeqCst);
    let down_bytes = (256 * 32 + 32) * 4;
    assert_eq!(read, down_bytes, "of {total} bytes");
    drop(down);
}

/// Through the S3 server (moto) when one runs: saved there and loaded lazily from `s3://`.
#[test]
fn a_model_round_trips_through_s3() {
    let Some(url) = weightbay_conformance::s3_url() else {
        return;
    };
    let storage = weightbay_object_store::open_url(
        &format!("{url}/candle-{}", std::process::id()),
        std::iter::empty::<(&str, &str)>(),
    )
    .unwrap();
    let (varmap, model) = trained();
    save_var_map(&varmap, Format::Safetensors, &storage, "mlp.safetensors").unwrap();
    let loaded = through_weightbay(Reader::open_key(&storage, "mlp.safetensors").unwrap());
    assert_eq!(outputs(&loaded), outputs(&model));
}

/// A stack of `layers` 256 → 256 linear layers (256 KiB each, beyond what opening a
/// container reads), so a load asks for many tensors in sequence.
struct Deep {
    layers: Vec<Linear>,
}

impl Deep {
    fn new(vb: VarBuilder, layers: usize) -> candle_core::Result<Self> {
        let layers = (0..layers)
            .map(|i| candle_nn::linear(256, 256, vb.pp(format!("layers.{i}"))))
            .collect::<candle_core::Result<_>>()?;
        Ok(Self { layers })
    }

    fn outputs(&self) -> Vec<Vec<f32>> {
        let mut x = input().reshape((1, 128)).unwrap().repeat((2, 2)).unwrap();
        for layer in &self.layers {
            x = layer.forward(&x).unwrap().tanh().unwrap();
        }
        x.to_vec2::<f32>().unwrap()
    }
}

/// Built from `s3://` through a proxy that adds 20 ms before each request, as a cloud store
/// would: prefetched (into buffers of the fetch's, or into candle's own memory), the model
/// constructor's 24 asks become a few batched requests; without, one request each. Counted
/// by the proxy, so the prefetch is real, not a timing claim. With a fetch budget of 1 MiB
/// (batches of 64 KiB), each 256 KiB weight lands in candle's memory in four ranged reads.
#[test]
fn a_prefetched_model_from_s3_asks_in_a_few_requests_not_one_per_tensor() {
    const LAYERS: usize = 12;
    let Some((url, proxy)) =
        weightbay_conformance::FaultProxy::in_front_of_s3(r#"{"latency_ms": 20}"#)
    else {
        return;
    };
    let storage = weightbay_object_store::open_url(
        &format!("{url}/candle-prefetch-{}", std::process::id()),
        [("aws_endpoint", proxy.url())],
    )
    .unwrap();
    let varmap = VarMap::new();
    let saved = Deep::new(
        VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu),
        LAYERS,
    )
    .unwrap();
    save_var_map(&varmap, Format::Safetensors, &storage, "deep.safetensors").unwrap();
    let tensors = 2 * LAYERS as u64;

    let small_budget = storage
        .clone()
        .with_options(ObjectStoreOptions::DEFAULT.with_fetch_budget(1 << 20));

    // 0: one tensor at a time; 1: prefetched into the fetch's buffers; 2: prefetched into
    // candle's own memory; 3: the same with the small budget.
    let load = |how: u8| {
        let before = proxy.count("requests");
        let from = if how == 3 { &small_budget } else { &storage };
        let reader = Reader::open_key(from, "deep.safetensors").unwrap();
        let backend: Box<dyn candle_nn::var_builder::SimpleBackend> = match how {
            0 => Box::new(WeightbayBackend::new(reader)),
            1 => Box::new(WeightbayBackend::new(
                Prefetched::new(reader, PrefetchPlan::All).unwrap(),
            )),
            _ => Box::new(WeightbayBackend::prefetching(reader, PrefetchPlan::All).unwrap()),
        };
        let vb = VarBuilder::from_backend(backend, DType::F32, Device::Cpu);
        let model = Deep::new(vb, LAYERS).unwrap();
        (model, proxy.count("requests") - before)
    };
    let (sequential, one_by_one) = load(0);
    let (prefetched, batched) = load(1);
    let (landed, batched_landing) = load(2);
    let (in_parts, parts) = load(3);
    assert_eq!(sequential.outputs(), saved.outputs());
    assert_eq!(prefetched.outputs(), saved.outputs());
    assert_eq!(landed.outputs(), saved.outputs());
    assert_eq!(in_parts.outputs(), saved.outputs());
    // Four parts per weight, at most one batch per bias, and the open.
    let layers = LAYERS as u64;
    assert!(
        (4 * layers..=5 * layers + 1).contains(&parts),
        "{parts} requests for {layers} weights read in four parts each"
    );
    assert!(
        batched_landing <= 3,
        "{batched_landing} requests prefetched into candle's memory, {one_by_one} one by one"
    );
    // The open's own request (header, metadata and the first 64 KiB) comes first in both.
    assert!(
        one_by_one >= tensors,
        "{one_by_one} requests for {tensors} tensors one by one"
    );
    assert!(
        batched <= 3,
        "{batched} requests prefetched, {one_by_one} one by one"
    );
}

/// A model saved incrementally (only the changed layer written, the rest referred to in the
/// first checkpoint) builds from the checkpoint exactly as from a full save.
#[test]
fn a_model_builds_from_an_incremental_checkpoint_as_from_a_full_one() {
    use weightbay_checkpoints::{Checkpoints, SaveOptions};
    let (varmap, model) = trained();
    let checkpoints = Checkpoints::new(weightbay::MemoryStorage::new(), "run");
    let save = |step| {
        let writer = var_map_writer(&varmap, Format::Burnpack).unwrap();
        checkpoints
            .save_with(step, writer, SaveOptions::incremental())
            .unwrap()
    };
    save(1);
    // Fine-tuning the head: one bias changes; `model` shares the variable, so it sees it.
    let bias = Tensor::ones(32, DType::F32, &Device::Cpu).unwrap();
    varmap.data().lock().unwrap()["down.bias"]
        .set(&bias)
        .unwrap();
    let record = save(2);
    let referred: u64 = record.references().values().sum();
    assert!(
        referred >= 64 * 256 * 4,
        "the increment refers to {referred} bytes"
    );
    let loaded = through_weightbay(checkpoints.open(2).unwrap().reader().unwrap());
    assert_eq!(outputs(&loaded), outputs(&model));
}

/// A model saves as a compressed checkpoint straight from its `VarMap` and builds from it
/// exactly as saved.
#[test]
fn a_model_saved_compressed_builds_as_saved() {
    use weightbay_checkpoints::{Checkpoints, SaveOptions};
    let (varmap, model) = trained();
    let checkpoints = Checkpoints::new(weightbay::MemoryStorage::new(), "run");
    let writer = var_map_writer(&varmap, Format::Burnpack).unwrap();
    let record = checkpoints
        .save_with(1, writer, SaveOptions::compressed())
        .unwrap();
    let pieces = record.pieces.as_ref().unwrap();
    assert!(pieces.list.iter().any(|p| p.encoding.is_some()));
    let stored: u64 = record.containers.iter().map(|c| c.len).sum();
    assert!(
        stored < pieces.len,
        "stored {stored} of {} bytes",
        pieces.len
    );
    let loaded = through_weightbay(checkpoints.open(1).unwrap().reader().unwrap());
    assert_eq!(outputs(&loaded), outputs(&model));
}
