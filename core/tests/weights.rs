//! WeightSource: components by name, validated, zero-copy where the backing allows, from one
//! container or a sharded checkpoint.

use std::sync::Arc;

use weightbay::Format;
use weightbay::ShardedWriter;
use weightbay::{
    AccessPolicy, DType, ErrorKind, MemoryStorage, Reader, Storage, Tensor, WeightComponentSpec,
    WeightSource, Writer,
};
use weightbay::{ShardedWeights, WeightEncoding};

fn reader() -> Reader {
    Reader::from_bytes(
        Writer::new(vec![
            Tensor::new("mlp.gate", DType::F16, [2, 4], vec![1u8; 16]),
            Tensor::new("mlp.up", DType::F16, [2, 4], vec![2u8; 16]),
            Tensor::new("q4", DType::U8, [3, 2], vec![9u8; 6]),
            Tensor::new("norm", DType::F32, [4], vec![3u8; 16]),
        ])
        .into_bytes()
        .unwrap(),
    )
    .unwrap()
}

#[test]
fn a_dense_component_is_zero_copy_and_retainable() {
    let reader = reader();
    let spec = WeightComponentSpec::dense("norm", [4], DType::F32);
    let payload = reader.component(&spec).unwrap().unwrap();
    let memory = payload.bytes.read(AccessPolicy::ZeroCopy).unwrap();
    let retained = payload.retained().expect("in-memory bytes can be retained");
    assert_eq!(
        retained.as_ptr(),
        memory.as_ptr(),
        "pointer-identical to the validated bytes"
    );
    assert_eq!(retained.len(), 16);
    drop(reader);
    assert_eq!(retained.as_slice(), &[3u8; 16], "outlives the reader");
    assert!(retained.region(4, 17).is_err());
    assert_eq!(
        retained.region(4, 8).unwrap().as_ptr(),
        retained.as_ptr().wrapping_add(4)
    );
}

#[test]
fn a_packed_component_comes_back_as_ordered_segments() {
    let reader = reader();
    let spec = WeightComponentSpec::dense("mlp.gate_up", [4, 4], DType::F16)
        .packed_from(["mlp.gate", "mlp.up"]);
    let segments = reader.component_segments(&spec).unwrap().unwrap();
    assert_eq!(
        segments
            .iter()
            .map(|s| s.tensor.as_str())
            .collect::<Vec<_>>(),
        ["mlp.gate", "mlp.up"]
    );
    let whole = reader.component(&spec).unwrap().unwrap();
    assert_eq!(
        whole.bytes.to_vec().unwrap(),
        [vec![1u8; 16], vec![2u8; 16]].concat()
    );
}

#[test]
fn block_quantized_lengths_follow_the_block_grid() {
    // 3 rows of 5 values, blocks of 4 values in 1 byte: 2 blocks per row, 6 bytes.
    let spec = WeightComponentSpec {
        id: "q4".into(),
        tensors: vec!["q4".into()],
        dimensions: vec![3, 5],
        encoding: WeightEncoding::BlockQuantized {
            values_per_block: 4,
            bytes_per_block: 1,
        },
        required: true,
    };
    assert_eq!(spec.byte_len().unwrap(), 6);
    assert_eq!(reader().component(&spec).unwrap().unwrap().bytes.len(), 6);
    let wider = WeightComponentSpec {
        dimensions: vec![3, 9],
        ..spec
    };
    let err = reader().component(&wider).unwrap_err();
    assert_eq!((err.kind(), err.tensor()), (ErrorKind::Corrupt, Some("q4")));
}

#[test]
fn bad_specs_and_mismatches_name_component_and_tensor() {
    let reader = reader();
    let missing = WeightComponentSpec::dense("absent", [4], DType::F32);
    let err = reader.component(&missing).unwrap_err();
    assert_eq!(
        (err.kind(), err.tensor()),
        (ErrorKind::NotFound, Some("absent"))
    );
    assert!(err.to_string().contains("component `absent`"), "{err}");
    let optional = WeightComponentSpec {
        required: false,
        ..missing
    };
    assert!(reader.component(&optional).unwrap().is_none());

    let wrong_dtype = WeightComponentSpec::dense("norm", [4], DType::F16);
    let err = reader.component(&wrong_dtype).unwrap_err();
    assert_eq!(
        (err.kind(), err.tensor()),
        (ErrorKind::Corrupt, Some("norm"))
    );
    let wrong_shape = WeightComponentSpec::dense("norm", [2, 2], DType::F32);
    assert_eq!(
        reader.component(&wrong_shape).unwrap_err().kind(),
        ErrorKind::Corrupt
    );
    let empty = WeightComponentSpec {
        tensors: vec![],
        ..WeightComponentSpec::dense("x", [1], DType::U8)
    };
    assert_eq!(
        reader.component(&empty).unwrap_err().kind(),
        ErrorKind::InvalidInput
    );
    let overflow = WeightComponentSpec::dense("norm", [u64::MAX, 4], DType::F32);
    assert_eq!(
        reader.component(&overflow).unwrap_err().kind(),
        ErrorKind::InvalidInput
    );
}

#[test]
fn sharded_checkpoints_resolve_names_across_shards() {
    for format in [Format::Safetensors, Format::Burnpack] {
        let storage = Arc::new(MemoryStorage::new());
        let tensors = (0..5)
            .map(|i| Tensor::new(format!("layer{i}"), DType::U8, [1000], vec![i as u8; 1000]))
            .collect();
        let summary = ShardedWriter::new(Writer::new(tensors).with_format(format))
            .with_shard_len(2500)
            .write_to(storage.as_ref(), "run/7")
            .unwrap();
        assert_eq!(summary.shards.len(), 3, "{format}");
        assert_eq!(summary.total_size, 5000);
        let weights = ShardedWeights::open(storage.clone(), &summary.index).unwrap();
        for i in 0..5u8 {
            let spec = WeightComponentSpec::dense(format!("layer{i}"), [1000], DType::U8);
            assert_eq!(
                weights
                    .component(&spec)
                    .unwrap()
                    .unwrap()
                    .bytes
                    .to_vec()
                    .unwrap(),
                vec![i; 1000]
            );
        }
        // A second writer cannot claim the same checkpoint.
        let again = ShardedWriter::new(Writer::new(vec![]).with_format(format))
            .write_to(storage.as_ref(), "run/7")
            .unwrap_err();
        assert_eq!(again.kind(), ErrorKind::AlreadyExists);
    }
}

#[test]
fn hostile_indexes_are_refused() {
    let storage = Arc::new(MemoryStorage::new());
    let put = |key: &str, body: &str| {
        let mut sink = storage.create(key, &Default::default()).unwrap();
        sink.write(body.as_bytes()).unwrap();
        sink.commit().unwrap();
    };
    for (body, what) in [
        (r#"{"weight_map": {"w": "../escape.safetensors"}}"#, ".."),
        (r#"{"weight_map": {"w": "/abs.safetensors"}}"#, "absolute"),
        (r#"{"weight_map": {"w": "a\\b.safetensors"}}"#, "backslash"),
        (r#"{"weight_map": {"w": ""}}"#, "empty"),
        (r#"{"nothing": 1}"#, "no weight_map"),
        ("not json", "not JSON"),
    ] {
        put("ckpt/model.safetensors.index.json", body);
        let err =
            ShardedWeights::open(storage.clone(), "ckpt/model.safetensors.index.json").unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Corrupt, "{what}: {err}");
    }
    put(
        "ckpt/model.safetensors.index.json",
        r#"{"weight_map": {"w": "missing.safetensors"}}"#,
    );
    let weights =
        ShardedWeights::open(storage.clone(), "ckpt/model.safetensors.index.json").unwrap();
    let err = weights
        .component(&WeightComponentSpec::dense("w", [1], DType::U8))
        .unwrap_err();
    assert_eq!((err.kind(), err.tensor()), (ErrorKind::NotFound, Some("w")));
}
