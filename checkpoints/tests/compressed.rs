//! Compressed saves over MemoryStorage: the stored pieces are encoded where that saves, every
//! checkpoint of a chain reads bit for bit like a full save, and what is stored is untrusted:
//! a flipped stored bit is caught by the stored CRC32C before it is decoded, an unknown codec
//! is `Unsupported` by name, and a piece claiming a huge length allocates nothing.

use std::sync::Arc;

use weightbay::{
    CreateOptions, DType, Durability, ErrorKind, MemoryStorage, Storage, Tensor, WriteMode, Writer,
};
mod common;

use common::{contents, expected};
use weightbay_checkpoints::{Checkpoints, SaveOptions};

/// bf16 and f32 tensors spread like trained weights (a triangle around zero, a scale per
/// tensor), element `i` of tensor `t` drawn from `seed`.
fn model(seed: u32, elements: usize) -> Vec<Tensor> {
    let value = |t: u32, i: u32| {
        let s = (i ^ t << 24 ^ seed << 16).wrapping_mul(2_654_435_761);
        let u = |x: u32| (x % 10_007) as f32 / 10_007.0 - 0.5;
        (u(s) + u(s.rotate_left(13))) * 0.02 * (t + 1) as f32
    };
    (0..4u32)
        .map(|t| {
            let values = (0..elements as u32).map(|i| value(t, i));
            if t % 2 == 0 {
                let bytes: Vec<u8> = values
                    .flat_map(|v| ((v.to_bits() >> 16) as u16).to_le_bytes())
                    .collect();
                Tensor::new(format!("bf16.{t}"), DType::BF16, [elements as u64], bytes)
            } else {
                let values: Vec<f32> = values.collect();
                Tensor::from_slice(format!("f32.{t}"), [elements as u64], &values)
            }
        })
        .collect()
}

fn replace(storage: &MemoryStorage, key: &str, body: &[u8]) {
    let options = CreateOptions::default()
        .with_mode(WriteMode::Overwrite)
        .with_durability(Durability::Flushed);
    let mut sink = storage.create(key, &options).unwrap();
    sink.write(body).unwrap();
    sink.commit().unwrap();
}

fn read(storage: &MemoryStorage, key: &str) -> Vec<u8> {
    let source = storage.open(key).unwrap();
    let mut body = vec![0; source.len() as usize];
    source.read_at(0, &mut body).unwrap();
    body
}

fn key_ending(storage: &MemoryStorage, end: &str) -> String {
    storage
        .keys()
        .into_iter()
        .find(|k| k.ends_with(end))
        .unwrap_or_else(|| panic!("no key ends with {end}: {:?}", storage.keys()))
}

#[test]
fn a_compressed_chain_stores_less_and_reads_bit_for_bit_like_a_full_save() {
    let storage = Arc::new(MemoryStorage::new());
    let checkpoints = Checkpoints::over(storage, "run");
    let options = SaveOptions::compressed().with_chunk_len(16 << 10);
    let first = model(1, 40_000);
    let record = checkpoints
        .save_with(1, Writer::new(first.clone()), options.clone())
        .unwrap();
    assert_eq!(record.weightbay_checkpoint, 3);
    let pieces = record.pieces.as_ref().unwrap();
    assert!(pieces.list.iter().any(|p| p.encoding.is_some()));
    let stored: u64 = record.containers.iter().map(|c| c.len).sum();
    assert!(
        stored * 10 < pieces.len * 9,
        "stored {stored} of {} bytes",
        pieces.len
    );
    assert!(record.containers[0].key.ends_with("/pieces.bin"));

    // One tensor changes: an increment stores its pieces, encoded, and refers to the rest.
    let mut second = first.clone();
    second[1] = model(2, 40_000).remove(1);
    let record = checkpoints
        .save_with(2, Writer::new(second.clone()), options)
        .unwrap();
    assert!(record.containers[0].key.ends_with("/delta.bin"));
    for (step, tensors) in [(1, &first), (2, &second)] {
        assert_eq!(
            contents(&checkpoints, step),
            expected(tensors),
            "step {step}"
        );
        let checkpoint = checkpoints.open(step).unwrap();
        checkpoint.verify().unwrap();
        // Byte for byte the container a full save writes, read whole, in ranges that start
        // and end inside encoded pieces, and streamed.
        let whole = Writer::new(tensors.clone()).into_bytes().unwrap();
        let reader = checkpoint.reader().unwrap();
        let source = reader.source();
        let mut read = vec![0; source.len() as usize];
        source.read_at(0, &mut read).unwrap();
        assert!(read == whole, "step {step} reads as a full save");
        let ranges = [7..70_001u64, 100_000..100_003, 0..whole.len() as u64];
        for (range, bytes) in ranges.iter().zip(source.fetch(&ranges).unwrap()) {
            let bytes = bytes.to_vec().unwrap();
            assert!(bytes == whole[range.start as usize..range.end as usize]);
        }
        let mut streamed = Vec::new();
        source
            .read_in_pieces(5000..150_000, &mut |offset, piece| {
                assert_eq!(offset, 5000 + streamed.len() as u64);
                streamed.extend_from_slice(piece);
                Ok(())
            })
            .unwrap();
        assert!(streamed == whole[5000..150_000]);
    }
}

#[test]
fn a_flipped_stored_bit_is_caught_by_the_stored_crc_before_it_is_decoded() {
    let storage = Arc::new(MemoryStorage::new());
    let checkpoints = Checkpoints::over(storage.clone(), "run");
    let tensors = model(3, 20_000);
    checkpoints
        .save_with(1, Writer::new(tensors), SaveOptions::compressed())
        .unwrap();
    let key = key_ending(&storage, "/pieces.bin");
    let mut body = read(&storage, &key);
    let middle = body.len() / 2;
    body[middle] ^= 0x10;
    replace(&storage, &key, &body);
    let checkpoint = checkpoints.open(1).unwrap();
    // Caught when the reader opens, if the piece lies where it reads first, or on the load.
    let err = checkpoint
        .reader()
        .and_then(|reader| reader.load_all().map(drop))
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Corrupt, "{err}");
    let text = err.to_string();
    assert!(
        text.contains("encoded piece") && text.contains("CRC32C") && text.contains(&key),
        "{text}"
    );
    assert_eq!(checkpoint.verify().unwrap_err().kind(), ErrorKind::Corrupt);
}

/// Rewrites step 1's commit record through `edit` on its JSON.
fn edit_record(storage: &MemoryStorage, edit: impl FnOnce(&mut serde_json::Value)) {
    let key = key_ending(storage, "step-1/commit.json");
    let mut record: serde_json::Value = serde_json::from_slice(&read(storage, &key)).unwrap();
    edit(&mut record);
    replace(storage, &key, &serde_json::to_vec(&record).unwrap());
}

fn first_encoded(record: &mut serde_json::Value) -> &mut serde_json::Value {
    record["pieces"]["list"]
        .as_array_mut()
        .unwrap()
        .iter_mut()
        .find(|p| p.get("encoding").is_some())
        .unwrap()
}

#[test]
fn an_unknown_codec_is_unsupported_by_name() {
    let storage = Arc::new(MemoryStorage::new());
    let checkpoints = Checkpoints::over(storage.clone(), "run");
    checkpoints
        .save_with(1, Writer::new(model(4, 20_000)), SaveOptions::compressed())
        .unwrap();
    edit_record(&storage, |record| {
        first_encoded(record)["encoding"]["codec"] = "zstd-19".into();
    });
    let err = checkpoints.open(1).unwrap().reader().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unsupported, "{err}");
    assert!(err.to_string().contains("`zstd-19`"), "{err}");
}

#[test]
fn a_piece_claiming_a_huge_length_is_refused_before_anything_is_allocated() {
    let storage = Arc::new(MemoryStorage::new());
    let checkpoints = Checkpoints::over(storage.clone(), "run");
    checkpoints
        .save_with(1, Writer::new(model(5, 20_000)), SaveOptions::compressed())
        .unwrap();
    edit_record(&storage, |record| {
        let piece = first_encoded(record);
        let claimed = 1u64 << 40;
        let old = piece["len"].as_u64().unwrap();
        piece["len"] = claimed.into();
        let total = record["pieces"]["len"].as_u64().unwrap() - old + claimed;
        record["pieces"]["len"] = total.into();
    });
    let err = checkpoints.open(1).unwrap().reader().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Corrupt, "{err}");
    assert!(err.to_string().contains("over the limit"), "{err}");
}

#[test]
fn a_copy_of_a_compressed_checkpoint_is_the_container_itself() {
    let storage = Arc::new(MemoryStorage::new());
    let checkpoints = Checkpoints::over(storage, "run");
    let tensors = model(6, 20_000);
    checkpoints
        .save_with(1, Writer::new(tensors.clone()), SaveOptions::compressed())
        .unwrap();
    let elsewhere = Checkpoints::over(Arc::new(MemoryStorage::new()), "copy");
    let record = elsewhere
        .copy_from(&checkpoints.open(1).unwrap(), Durability::Flushed)
        .unwrap();
    assert_eq!(record.weightbay_checkpoint, 2);
    assert!(
        record
            .pieces
            .as_ref()
            .unwrap()
            .list
            .iter()
            .all(|p| p.encoding.is_none())
    );
    assert_eq!(contents(&elsewhere, 1), expected(&tensors));
    elsewhere.open(1).unwrap().verify().unwrap();
}

#[test]
fn stored_lengths_a_planted_record_claims_overflow_nothing() {
    let storage = Arc::new(MemoryStorage::new());
    let checkpoints = Checkpoints::over(storage.clone(), "run");
    checkpoints
        .save_with(1, Writer::new(model(7, 20_000)), SaveOptions::compressed())
        .unwrap();
    // Every encoded piece moved into another step's container, each claiming nearly 2^64
    // stored bytes: their sum does not fit.
    edit_record(&storage, |record| {
        for piece in record["pieces"]["list"].as_array_mut().unwrap() {
            if piece.get("encoding").is_some() {
                piece["key"] = "step-0/planted/pieces.bin".into();
                piece["encoding"]["len"] = (u64::MAX - 1).into();
            }
        }
    });
    // Opening refuses it (its containers are missing); the listing reports it damaged, and
    // what its record says it refers to sums without overflowing.
    let listed = checkpoints.list().unwrap();
    assert!(
        matches!(
            listed[0].state,
            weightbay_checkpoints::StepState::Damaged(_)
        ),
        "{listed:?}"
    );
    let record = listed[0].record.as_ref().unwrap();
    let referenced: u64 = record.references().into_values().sum();
    assert_eq!(referenced, u64::MAX);
}
