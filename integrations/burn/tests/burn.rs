//! burn modules through weightbay, against burn's own BurnpackStore: byte identity both ways,
//! cross-loading, other storages and formats, partial loads.

use burn_core as burn;

use std::sync::Arc;

use burn_core::module::Module;
use burn_core::tensor::Device;
use burn_nn::{Linear, LinearConfig};
use burn_store::{BurnpackStore, ModuleSnapshot, ModuleStore};
use weightbay::Format;
use weightbay::{MemoryStorage, Storage};
use weightbay_burn::WeightbayStore;

#[derive(Module, Debug)]
struct Mlp {
    up: Linear,
    down: Linear,
}

impl Mlp {
    fn new(device: &Device) -> Self {
        Self {
            up: LinearConfig::new(64, 256).init(device),
            down: LinearConfig::new(256, 32).init(device),
        }
    }
}

/// Every parameter's data, to compare two modules.
fn parameters(model: &Mlp) -> Vec<burn_core::tensor::TensorData> {
    [&model.up, &model.down]
        .into_iter()
        .flat_map(|layer| {
            let mut data = vec![layer.weight.val().into_data()];
            data.extend(layer.bias.as_ref().map(|b| b.val().into_data()));
            data
        })
        .collect()
}

fn stored(storage: &dyn Storage, key: &str) -> Vec<u8> {
    let source = storage.open(key).unwrap();
    let mut bytes = vec![0; source.len() as usize];
    source.read_at(0, &mut bytes).unwrap();
    bytes
}

/// What burn's own store writes for `model`.
fn burns_bytes(model: &Mlp) -> Vec<u8> {
    let mut store = BurnpackStore::from_bytes(None);
    model.save_into(&mut store).unwrap();
    store.get_bytes().unwrap().to_vec()
}

#[test]
fn the_burnpack_weightbay_writes_is_the_one_burn_writes() {
    let model = Mlp::new(&Default::default());
    let storage = Arc::new(MemoryStorage::new());
    model
        .save_into(&mut WeightbayStore::new(storage.clone(), "mlp.bpk"))
        .unwrap();
    let ours = stored(storage.as_ref(), "mlp.bpk");
    assert!(ours == burns_bytes(&model), "the containers differ");
}

#[test]
fn each_loads_what_the_other_wrote() {
    let device = Default::default();
    let model = Mlp::new(&device);

    // burn's bytes, loaded through weightbay.
    let storage = Arc::new(MemoryStorage::new());
    let mut sink = storage
        .create("burn.bpk", &weightbay::CreateOptions::default())
        .unwrap();
    sink.write(&burns_bytes(&model)).unwrap();
    sink.commit().unwrap();
    let mut fresh = Mlp::new(&device);
    let result = fresh
        .load_from(&mut WeightbayStore::new(storage.clone(), "burn.bpk"))
        .unwrap();
    assert!(result.is_success(), "{result:?}");
    assert_eq!(parameters(&fresh), parameters(&model));

    // weightbay's bytes (with the trailer, which burn's reader skips), loaded by burn.
    model
        .save_into(&mut WeightbayStore::new(storage.clone(), "ours.bpk").with_trailer(true))
        .unwrap();
    let bytes = burn_std::Bytes::from_bytes_vec(stored(storage.as_ref(), "ours.bpk"));
    let mut by_burn = Mlp::new(&device);
    by_burn
        .load_from(&mut BurnpackStore::from_bytes(Some(bytes)))
        .unwrap();
    assert_eq!(parameters(&by_burn), parameters(&model));
}

#[test]
fn local_files_and_safetensors_round_trip() {
    let device = Default::default();
    let dir = tempfile::tempdir().unwrap();
    let local: Arc<dyn Storage> = Arc::new(weightbay_local::LocalStorage::new(dir.path()));
    let model = Mlp::new(&device);
    for (key, format) in [
        ("mlp.bpk", Format::Burnpack),
        ("mlp.safetensors", Format::Safetensors),
    ] {
        model
            .save_into(&mut WeightbayStore::new(local.clone(), key).format(format))
            .unwrap();
        let mut fresh = Mlp::new(&device);
        fresh
            .load_from(&mut WeightbayStore::new(local.clone(), key))
            .unwrap();
        assert_eq!(parameters(&fresh), parameters(&model), "{key}");
    }
    // No overwrite unless asked, as burn's store.
    let again = model.save_into(&mut WeightbayStore::new(local.clone(), "mlp.bpk"));
    assert_eq!(
        again.unwrap_err().kind(),
        weightbay::ErrorKind::AlreadyExists
    );
    model
        .save_into(&mut WeightbayStore::new(local, "mlp.bpk").overwrite(true))
        .unwrap();
}

#[test]
fn partial_loads_report_what_is_missing() {
    let device = Default::default();
    let storage = Arc::new(MemoryStorage::new());
    let up_only = burn_store::PathFilter::new().with_regex(r"^up\.");
    Mlp::new(&device)
        .save_into(&mut WeightbayStore::new(storage.clone(), "up.bpk").with_filter(up_only))
        .unwrap();
    let mut fresh = Mlp::new(&device);
    let error = fresh
        .load_from(&mut WeightbayStore::new(storage.clone(), "up.bpk"))
        .unwrap_err();
    assert_eq!(error.kind(), weightbay::ErrorKind::NotFound, "{error}");
    assert!(error.to_string().contains("down.weight"), "{error}");
    let result = fresh
        .load_from(&mut WeightbayStore::new(storage.clone(), "up.bpk").allow_partial(true))
        .unwrap();
    assert!(
        result.applied.iter().any(|name| name == "up.weight"),
        "{result:?}"
    );
    assert!(
        result.missing.iter().any(|(name, _)| name == "down.weight"),
        "{result:?}"
    );
    let mut store = WeightbayStore::new(storage, "up.bpk");
    assert_eq!(store.keys().unwrap(), ["up.bias", "up.weight"]);
}

#[derive(Module, Debug)]
struct Deep {
    layers: Vec<Linear>,
}

/// Built from `s3://` through a proxy that adds 20 ms before each request, as a cloud store
/// would: burn asks for the 24 tensors one at a time, and the store's prefetch answers them
/// from a few batched requests, counted by the proxy.
#[test]
fn a_module_from_s3_loads_in_a_few_requests_not_one_per_tensor() {
    const LAYERS: usize = 12;
    let Some((url, proxy)) =
        weightbay_conformance::FaultProxy::in_front_of_s3(r#"{"latency_ms": 20}"#)
    else {
        return;
    };
    let storage: Arc<dyn Storage> = Arc::new(
        weightbay_object_store::open_url(
            &format!("{url}/burn-prefetch-{}", std::process::id()),
            [("aws_endpoint", proxy.url())],
        )
        .unwrap(),
    );
    let device = Default::default();
    let deep = |device: &Device| Deep {
        layers: (0..LAYERS)
            .map(|_| LinearConfig::new(256, 256).init(device))
            .collect(),
    };
    let model = deep(&device);
    model
        .save_into(&mut WeightbayStore::new(Arc::clone(&storage), "deep.bpk"))
        .unwrap();
    let before = proxy.count("requests");
    let mut loaded = deep(&device);
    let result = loaded
        .load_from(&mut WeightbayStore::new(Arc::clone(&storage), "deep.bpk"))
        .unwrap();
    let requests = proxy.count("requests") - before;
    assert!(result.is_success(), "{result:?}");
    let data = |m: &Deep| -> Vec<_> {
        m.layers
            .iter()
            .map(|l| l.weight.val().into_data())
            .collect()
    };
    assert_eq!(data(&loaded), data(&model));
    assert!(
        requests <= 3,
        "{requests} requests for {} tensors",
        2 * LAYERS
    );
}

/// A module loads from an incremental checkpoint (its container pieces of two checkpoints'
/// files) through a store over the checkpoint's reader, exactly as saved; such a store does
/// not save.
#[test]
fn a_module_loads_from_an_incremental_checkpoint() {
    use weightbay_checkpoints::{Checkpoints, SaveOptions};
    let device = Default::default();
    let checkpoints = Checkpoints::new(MemoryStorage::new(), "run");
    let save = |step, model: &Mlp| {
        let writer = WeightbayStore::writer_of(model).unwrap();
        checkpoints
            .save_with(step, writer, SaveOptions::incremental())
            .unwrap()
    };
    let first = Mlp::new(&device);
    save(1, &first);
    // Fine-tuning the head: `down` is new, `up` is the first checkpoint's.
    let second = Mlp {
        up: first.up,
        down: LinearConfig::new(256, 32).init(&device),
    };
    let record = save(2, &second);
    let referred: u64 = record.references().values().sum();
    assert!(
        referred >= 64 * 256 * 4,
        "the increment refers to {referred} bytes"
    );
    let reader = checkpoints.open(2).unwrap().reader().unwrap();
    let mut store = WeightbayStore::from_reader(reader);
    let mut loaded = Mlp::new(&device);
    let result = loaded.load_from(&mut store).unwrap();
    assert!(result.is_success(), "{result:?}");
    assert_eq!(parameters(&loaded), parameters(&second));
    let error = second.save_into(&mut store).unwrap_err();
    assert!(error.to_string().contains("only loads"), "{error}");
}

/// A module saves as a compressed checkpoint (`WeightbayStore::writer_of`) and loads from it
/// exactly as saved.
#[test]
fn a_module_saved_compressed_loads_as_saved() {
    use weightbay_checkpoints::{Checkpoints, SaveOptions};
    let device = Default::default();
    let checkpoints = Checkpoints::new(MemoryStorage::new(), "run");
    let model = Mlp::new(&device);
    let writer = WeightbayStore::writer_of(&model).unwrap();
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
    let reader = checkpoints.open(1).unwrap().reader().unwrap();
    let mut loaded = Mlp::new(&device);
    let result = loaded
        .load_from(&mut WeightbayStore::from_reader(reader))
        .unwrap();
    assert!(result.is_success(), "{result:?}");
    assert_eq!(parameters(&loaded), parameters(&model));
}
