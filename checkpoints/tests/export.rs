//! Export to the Hugging Face layout: a checkpoint written by four ranks in row and column
//! slices comes out as whole tensors in shards of the asked size, with the index last and
//! every shard's CRC32C in it; filters, renames, ties, dtypes and alignment do what they say.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use weightbay::backend_kit::read_in_order;
use weightbay::{DType, ErrorKind, MemoryStorage, Reader, ShardedWeights, Storage, Tensor, Writer};
use weightbay_checkpoints::{
    Checkpoints, EXPORT_INDEX, ExportOptions, RankSave, Region, SaveOptions, export_tensors,
};

const WORLD: u64 = 4;

/// The model's tensors whole: name, dtype, shape, bytes. The lm_head holds the embedding's
/// bytes (tied), and an optimizer moment rides along.
fn model() -> Vec<(&'static str, DType, Vec<u64>, Vec<u8>)> {
    let numbers = |n: usize, scale: f32| -> Vec<f32> { (0..n).map(|i| i as f32 * scale).collect() };
    let bf16 = |values: Vec<f32>| -> Vec<u8> {
        values
            .into_iter()
            .flat_map(|v| half::bf16::from_f32(v).to_le_bytes())
            .collect()
    };
    let f32s =
        |values: Vec<f32>| -> Vec<u8> { values.into_iter().flat_map(f32::to_le_bytes).collect() };
    let embedding = bf16(numbers(16 * 8, 0.5));
    vec![
        (
            "model.embed_tokens.weight",
            DType::BF16,
            vec![16, 8],
            embedding.clone(),
        ),
        ("lm_head.weight", DType::BF16, vec![16, 8], embedding),
        (
            "model.layers.0.mlp.weight",
            DType::F32,
            vec![8, 12],
            f32s(numbers(96, -0.25)),
        ),
        (
            "model.norm.weight",
            DType::F32,
            vec![8],
            f32s(numbers(8, 1.5)),
        ),
        (
            "optim.state.exp_avg",
            DType::F32,
            vec![8, 8],
            f32s(numbers(64, 0.125)),
        ),
    ]
}

/// The box `region` of a row-major tensor of `shape` and element `size`, row-major.
fn cut(bytes: &[u8], shape: &[u64], size: usize, region: &Region) -> Vec<u8> {
    let (rows, cols) = (
        region.lengths[0] as usize,
        *region.lengths.get(1).unwrap_or(&1) as usize,
    );
    let width = *shape.get(1).unwrap_or(&1) as usize;
    let mut out = Vec::new();
    for r in 0..rows {
        let row = region.offsets[0] as usize + r;
        let col = *region.offsets.get(1).unwrap_or(&0) as usize;
        out.extend_from_slice(
            &bytes[(row * width + col) * size..(row * width + col + cols) * size],
        );
    }
    out
}

/// Saves the model as step 1 from four ranks: matrices split by rows, the MLP by columns,
/// the norm whole on rank 0.
fn four_rank_checkpoint(storage: &Arc<MemoryStorage>) -> Checkpoints {
    let checkpoints = Checkpoints::over(Arc::clone(storage) as Arc<dyn Storage>, "run");
    for rank in 0..WORLD {
        let mut tensors = Vec::new();
        let mut slices = Vec::new();
        for (name, dtype, shape, bytes) in model() {
            let size = dtype.element_size().unwrap() as usize;
            if name == "model.norm.weight" {
                if rank == 0 {
                    tensors.push(Tensor::new(name, dtype, shape, bytes));
                }
                continue;
            }
            let dim = usize::from(name.contains("mlp"));
            let region = Region::split(&shape, dim, WORLD, rank);
            let part = cut(&bytes, &shape, size, &region);
            tensors.push(Tensor::new(name, dtype, region.lengths.clone(), part));
            slices.push((name, shape, region));
        }
        let mut save = RankSave::new(rank as u32, WORLD as u32, Writer::new(tensors));
        for (name, shape, region) in slices {
            save = save.with_slice(name, shape, region);
        }
        checkpoints.save_rank(1, save).unwrap();
    }
    checkpoints
}

fn shard_tensor(storage: &Arc<MemoryStorage>, index: &str, name: &str) -> (DType, Vec<u8>) {
    let weights = ShardedWeights::open(Arc::clone(storage) as Arc<dyn Storage>, index).unwrap();
    for key in weights.shard_keys() {
        let reader = Reader::open_key(storage.as_ref(), &key).unwrap();
        if let Ok(info) = reader.tensor(name) {
            return (info.dtype().clone(), reader.read(name).unwrap());
        }
    }
    panic!("`{name}` is in no shard");
}

#[test]
fn a_four_rank_checkpoint_exports_whole_tensors_in_shards_with_every_crc_in_the_index() {
    let storage = Arc::new(MemoryStorage::new());
    let checkpoint = four_rank_checkpoint(&storage).open(1).unwrap();
    let options = ExportOptions::default()
        .with_max_shard_size(300)
        .excluding("optim.*")
        .tying_lm_head();
    let summary = checkpoint
        .export(Arc::clone(&storage) as Arc<dyn Storage>, "hf", &options)
        .unwrap();

    assert_eq!(summary.index, format!("hf/{EXPORT_INDEX}"));
    assert_eq!(
        summary.tied,
        [(
            "lm_head.weight".to_owned(),
            "model.embed_tokens.weight".to_owned()
        )]
    );
    assert_eq!(summary.tensors, 3);
    let count = summary.shards.len();
    assert!(count > 1, "{summary:?}");
    let weights =
        ShardedWeights::open(Arc::clone(&storage) as Arc<dyn Storage>, &summary.index).unwrap();
    weights.check_map().unwrap();
    let mut names: Vec<&str> = weights.names().collect();
    names.sort_unstable();
    assert_eq!(
        names,
        [
            "model.embed_tokens.weight",
            "model.layers.0.mlp.weight",
            "model.norm.weight"
        ]
    );
    for (number, key) in summary.shards.iter().enumerate() {
        assert_eq!(
            key,
            &format!("hf/model-{:05}-of-{count:05}.safetensors", number + 1)
        );
        let reader = Reader::open_key(storage.as_ref(), key).unwrap();
        let data: u64 = reader.tensors().iter().map(|t| t.byte_len()).sum();
        assert!(
            data <= 300 || reader.tensors().len() == 1,
            "{key}: {data} bytes"
        );
        assert_eq!(
            reader.metadata().get("format").map(String::as_str),
            Some("pt")
        );
        let source = storage.open(key).unwrap();
        let crc = read_in_order(source.as_ref(), 0..source.len(), |_| Ok(())).unwrap();
        let recorded = weights
            .recorded_checksum(key)
            .expect("every shard's CRC is recorded");
        assert_eq!(
            (recorded.len, recorded.crc32c),
            (source.len(), crc),
            "{key}"
        );
    }
    for (name, dtype, _, bytes) in model().into_iter().filter(|(n, ..)| names.contains(n)) {
        assert_eq!(
            shard_tensor(&storage, &summary.index, name),
            (dtype, bytes),
            "{name}"
        );
    }
}

#[test]
fn renames_dtypes_and_alignment_apply_on_the_way() {
    let storage = Arc::new(MemoryStorage::new());
    let checkpoint = four_rank_checkpoint(&storage).open(1).unwrap();
    let options = ExportOptions::default()
        .including("model.*")
        .renaming("model.", "")
        .with_dtype(DType::BF16)
        .with_alignment(64);
    let summary = checkpoint
        .export(Arc::clone(&storage) as Arc<dyn Storage>, "out", &options)
        .unwrap();
    // The norm (8 × 2 bytes) is the one tensor whose length is not a multiple of 64: last.
    assert_eq!((summary.tensors, summary.aligned), (3, 3));
    let reader = Reader::open_key(storage.as_ref(), &summary.shards[0]).unwrap();
    let order: Vec<&str> = {
        let mut by_start: Vec<_> = reader.tensors().iter().collect();
        by_start.sort_by_key(|t| t.range().start);
        by_start.iter().map(|t| t.name()).collect()
    };
    assert_eq!(order.last(), Some(&"norm.weight"), "{order:?}");
    for info in reader.tensors() {
        assert_eq!(info.dtype(), &DType::BF16, "{}", info.name());
        if info.byte_len() % 64 == 0 {
            assert_eq!(info.range().start % 64, 0, "{} is not aligned", info.name());
        }
    }
    let (_, mlp) = shard_tensor(&storage, &summary.index, "layers.0.mlp.weight");
    let expected: Vec<u8> = (0..96)
        .flat_map(|i| half::bf16::from_f32(i as f32 * -0.25).to_le_bytes())
        .collect();
    assert_eq!(mlp, expected);
}

#[test]
fn an_export_stopped_part_way_is_not_loadable_and_a_rerun_finishes_it() {
    let storage = Arc::new(MemoryStorage::new());
    let checkpoint = four_rank_checkpoint(&storage).open(1).unwrap();
    let dyn_storage = Arc::clone(&storage) as Arc<dyn Storage>;
    let base = ExportOptions::default().with_max_shard_size(300);
    // What a killed export leaves: a first shard from an earlier try, cut short.
    weightbay::StorageExt::write_new(
        storage.as_ref(),
        "hf/model-00001-of-00003.safetensors",
        b"cut short",
        weightbay::Durability::Default,
    )
    .unwrap();
    let stopped = base.clone().with_cancel(Arc::new(AtomicBool::new(true)));
    let error = checkpoint
        .export(Arc::clone(&dyn_storage), "hf", &stopped)
        .unwrap_err();
    assert_eq!(error.kind(), ErrorKind::Interrupted, "{error}");
    assert_eq!(
        storage
            .open(&format!("hf/{EXPORT_INDEX}"))
            .unwrap_err()
            .kind(),
        ErrorKind::NotFound,
        "a stopped export wrote its index"
    );

    let summary = checkpoint
        .export(Arc::clone(&dyn_storage), "hf", &base)
        .unwrap();
    ShardedWeights::open(Arc::clone(&dyn_storage), &summary.index)
        .unwrap()
        .check_map()
        .unwrap();
    // A second export over a complete one is refused unless it overwrites.
    let again = checkpoint
        .export(Arc::clone(&dyn_storage), "hf", &base)
        .unwrap_err();
    assert_eq!(again.kind(), ErrorKind::AlreadyExists, "{again}");
    checkpoint
        .export(dyn_storage, "hf", &base.overwriting())
        .unwrap();
}

#[test]
fn ties_are_checked_and_options_that_contradict_the_tensors_are_refused() {
    let storage: Arc<dyn Storage> = Arc::new(MemoryStorage::new());
    let tensors = || {
        vec![
            Tensor::from_slice("a", [2], &[1.0f32, 2.0]),
            Tensor::from_slice("b", [2], &[1.0f32, 3.0]),
            Tensor::from_slice("x.a", [2], &[1.0f32, 2.0]),
        ]
    };
    let refused = |options: ExportOptions| {
        let error = export_tensors(tensors(), Arc::clone(&storage), "d", &options).unwrap_err();
        assert_eq!(error.kind(), ErrorKind::InvalidInput, "{error}");
        error.to_string()
    };
    assert!(refused(ExportOptions::default().tying("b", "a")).contains("not tied"));
    assert!(refused(ExportOptions::default().tying("c", "a")).contains("both must be"));
    assert!(refused(ExportOptions::default().renaming("x.", "")).contains("`a`"));
    assert!(refused(ExportOptions::default().including("zzz*")).contains("no tensor"));
    assert!(refused(ExportOptions::default().with_dtype(DType::I32)).contains("not I32"));
    let summary = export_tensors(
        tensors(),
        Arc::clone(&storage),
        "d",
        &ExportOptions::default().tying("x.a", "a"),
    )
    .unwrap();
    assert_eq!(summary.tensors, 2);
    assert!(storage.open("d/model-00001-of-00001.safetensors").is_ok());
}

#[test]
fn aligned_shards_put_tensors_of_whole_multiples_first() {
    let storage: Arc<dyn Storage> = Arc::new(MemoryStorage::new());
    // In the order given, the 6-byte tensor would push both others off the alignment.
    let tensors = vec![
        Tensor::new("small", DType::U8, [6], vec![1; 6]),
        Tensor::new("big", DType::U8, [128], vec![2; 128]),
        Tensor::new("bigger", DType::U8, [192], vec![3; 192]),
    ];
    let options = ExportOptions::default().with_alignment(64);
    let summary = export_tensors(tensors, Arc::clone(&storage), "d", &options).unwrap();
    assert_eq!(summary.aligned, 3);
    let reader = Reader::open_key(storage.as_ref(), &summary.shards[0]).unwrap();
    for (name, start) in [("big", 0), ("bigger", 128), ("small", 320)] {
        let info = reader.tensor(name).unwrap();
        assert_eq!(info.range().start % 64, 0, "{name}");
        assert_eq!(
            info.range().start - reader.tensor("big").unwrap().range().start,
            start
        );
        assert_eq!(reader.read(name).unwrap().len() as u64, info.byte_len());
    }
}

#[test]
fn a_planted_shape_fails_the_export_before_anything_is_written_or_allocated() {
    let storage = Arc::new(MemoryStorage::new());
    let checkpoints = four_rank_checkpoint(&storage);
    // The record claims the norm is 2^40 elements: a target of 4 TiB, were it trusted.
    let key = "run/step-1/commit.json";
    let source = storage.open(key).unwrap();
    let mut record = vec![0; source.len() as usize];
    source.read_at(0, &mut record).unwrap();
    let record = String::from_utf8(record).unwrap();
    let norm = record.find("\"model.norm.weight\"").unwrap();
    let shape = norm + record[norm..].find("\"shape\"").unwrap();
    let edited = format!(
        "{}\"shape\": [1099511627776]{}",
        &record[..shape],
        &record[shape + record[shape..].find(']').unwrap() + 1..]
    );
    storage.delete(key).unwrap();
    weightbay::StorageExt::write_new(
        storage.as_ref(),
        key,
        edited.as_bytes(),
        weightbay::Durability::Default,
    )
    .unwrap();
    let error = checkpoints
        .open(1)
        .unwrap()
        .export(
            Arc::clone(&storage) as Arc<dyn Storage>,
            "hf",
            &ExportOptions::default(),
        )
        .unwrap_err();
    assert_eq!(error.kind(), ErrorKind::Corrupt, "{error}");
    assert!(error.to_string().contains("model.norm.weight"), "{error}");
    assert!(
        storage.list("hf").unwrap().is_empty(),
        "the export wrote before it failed"
    );
}

#[test]
fn incremental_and_sharded_checkpoints_export_like_any_other() {
    let storage = Arc::new(MemoryStorage::new());
    let dyn_storage = Arc::clone(&storage) as Arc<dyn Storage>;
    let checkpoints = Checkpoints::over(Arc::clone(&dyn_storage), "run");
    let model = |step: f32| {
        vec![
            Tensor::from_slice("frozen", [4096], &[1.5f32; 4096]),
            Tensor::from_slice("trained", [8], &[step; 8]),
        ]
    };
    // Step 2 stores only what changed and refers to step 1's container for the rest.
    checkpoints
        .save_with(1, Writer::new(model(1.0)), SaveOptions::incremental())
        .unwrap();
    checkpoints
        .save_with(2, Writer::new(model(2.0)), SaveOptions::incremental())
        .unwrap();
    checkpoints
        .save_with(3, Writer::new(model(3.0)), SaveOptions::sharded(1024))
        .unwrap();
    for step in [2, 3] {
        let checkpoint = checkpoints.open(step).unwrap();
        let dir = format!("hf-{step}");
        let summary = checkpoint
            .export(Arc::clone(&dyn_storage), &dir, &ExportOptions::default())
            .unwrap();
        assert_eq!(summary.tensors, 2);
        for tensor in model(step as f32) {
            let (dtype, bytes) = shard_tensor(&storage, &summary.index, tensor.name());
            assert_eq!(dtype, DType::F32);
            assert_eq!(
                bytes,
                tensor.bytes().unwrap().to_vec().unwrap(),
                "step {step}"
            );
        }
    }
    assert!(
        checkpoints.open(2).unwrap().referenced_bytes() > 0,
        "step 2 was not incremental"
    );
}

#[test]
fn tensors_larger_than_a_piece_stream_from_every_rank_intact_and_converted() {
    // 6 MiB of bf16, split by columns: every 4 MiB piece the export reads spans all four
    // ranks' containers, and the last cuts rows apart.
    let shape = vec![1536u64, 2048];
    // Whole numbers of at most 7 bits: bf16 holds each exactly, so widening gives them back.
    let values: Vec<f32> = (0..1536 * 2048).map(|i| (i % 255) as f32 - 127.0).collect();
    let bytes: Vec<u8> = values
        .iter()
        .flat_map(|&v| half::bf16::from_f32(v).to_le_bytes())
        .collect();
    let storage = Arc::new(MemoryStorage::new());
    let checkpoints = Checkpoints::over(Arc::clone(&storage) as Arc<dyn Storage>, "run");
    for rank in 0..WORLD {
        let region = Region::split(&shape, 1, WORLD, rank);
        let part = cut(&bytes, &shape, 2, &region);
        let tensor = Tensor::new("big", DType::BF16, region.lengths.clone(), part);
        let save = RankSave::new(rank as u32, WORLD as u32, Writer::new(vec![tensor])).with_slice(
            "big",
            shape.clone(),
            region,
        );
        checkpoints.save_rank(1, save).unwrap();
    }
    let checkpoint = checkpoints.open(1).unwrap();
    let store = || Arc::clone(&storage) as Arc<dyn Storage>;

    let kept = checkpoint
        .export(store(), "kept", &ExportOptions::default())
        .unwrap();
    let (dtype, exported) = shard_tensor(&storage, &kept.index, "big");
    assert!(
        dtype == DType::BF16 && exported == bytes,
        "the bf16 export differs"
    );

    let widened = checkpoint
        .export(
            store(),
            "f32",
            &ExportOptions::default().with_dtype(DType::F32),
        )
        .unwrap();
    let f32s: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    let (dtype, exported) = shard_tensor(&storage, &widened.index, "big");
    assert!(
        dtype == DType::F32 && exported == f32s,
        "the f32 export differs"
    );
}
