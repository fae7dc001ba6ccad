//! Copies that store their pieces encoded (`Checkpoints::copy_compressed_from`, and so a
//! `Tiered` value's compressed promotions), over MemoryStorage: the copy reads as the source
//! byte for byte and stores less, damaged source bytes commit nothing, and the fast tier of a
//! compressed promotion stays raw.

use std::sync::Arc;

use weightbay::{
    CreateOptions, DType, Durability, Error, ErrorKind, MemoryStorage, Sink, Storage, Tensor,
    WriteMode, Writer, forward_sink, forward_storage,
};
mod common;

use common::{contents, expected};
use weightbay_checkpoints::{Checkpoints, SaveOptions, Tiered};

/// bf16 tensors spread like trained weights (a triangle around zero, a scale per tensor),
/// element `i` of tensor `t` drawn from `seed`.
fn model(seed: u32, elements: usize) -> Vec<Tensor> {
    (0..3u32)
        .map(|t| {
            let bytes: Vec<u8> = (0..elements as u32)
                .flat_map(|i| {
                    let s = (i ^ t << 24 ^ seed << 16).wrapping_mul(2_654_435_761);
                    let u = |x: u32| (x % 10_007) as f32 / 10_007.0 - 0.5;
                    let v = (u(s) + u(s.rotate_left(13))) * 0.02 * (t + 1) as f32;
                    ((v.to_bits() >> 16) as u16).to_le_bytes()
                })
                .collect();
            Tensor::new(format!("layer.{t}"), DType::BF16, [elements as u64], bytes)
        })
        .collect()
}

/// The whole container `checkpoint` reads as.
fn container(checkpoints: &Checkpoints, step: u64) -> Vec<u8> {
    let reader = checkpoints.open(step).unwrap().reader().unwrap();
    let source = reader.source();
    let mut body = vec![0; source.len() as usize];
    source.read_at(0, &mut body).unwrap();
    body
}

fn stored(record: &weightbay_checkpoints::CommitRecord) -> u64 {
    record.containers.iter().map(|c| c.len).sum()
}

#[test]
fn a_compressed_copy_stores_less_and_reads_as_its_source_byte_for_byte() {
    let tensors = model(1, 200_000);
    let source = Checkpoints::over(Arc::new(MemoryStorage::new()), "run");
    source.save(1, Writer::new(tensors.clone())).unwrap();
    source
        .save_with(2, Writer::new(tensors.clone()), SaveOptions::compressed())
        .unwrap();
    let copies = Checkpoints::over(Arc::new(MemoryStorage::new()), "copies");
    for step in [1, 2] {
        let from = source.open(step).unwrap();
        let record = copies
            .copy_compressed_from(&from, Durability::Flushed)
            .unwrap();
        assert_eq!(record.weightbay_checkpoint, 3, "step {step}");
        let pieces = record.pieces.as_ref().unwrap();
        assert!(pieces.list.iter().any(|p| p.encoding.is_some()));
        assert_eq!(pieces.name, "model.bpk");
        assert!(
            stored(&record) * 10 < pieces.len * 9,
            "step {step}: stored {} of {} bytes",
            stored(&record),
            pieces.len
        );
        assert!(
            container(&copies, step) == container(&source, step),
            "step {step}"
        );
        assert_eq!(contents(&copies, step), expected(&tensors), "step {step}");
        copies.open(step).unwrap().verify().unwrap();
    }
    // A step the copy holds is not copied again.
    let again = copies.copy_compressed_from(&source.open(1).unwrap(), Durability::Flushed);
    assert_eq!(again.unwrap_err().kind(), ErrorKind::AlreadyExists);
}

#[test]
fn a_compressed_copy_of_bytes_that_differ_from_their_record_commits_nothing() {
    let storage = Arc::new(MemoryStorage::new());
    let source = Checkpoints::over(Arc::clone(&storage) as Arc<dyn Storage>, "run");
    source.save(1, Writer::new(model(2, 50_000))).unwrap();
    let key = storage
        .keys()
        .into_iter()
        .find(|k| k.ends_with("model.bpk"))
        .unwrap();
    let from = storage.open(&key).unwrap();
    let mut body = vec![0; from.len() as usize];
    from.read_at(0, &mut body).unwrap();
    // A bit of the last tensor's data, past the header the reader checks when it opens.
    let at = body.len() - 1000;
    body[at] ^= 0x10;
    let options = CreateOptions::default()
        .with_mode(WriteMode::Overwrite)
        .with_durability(Durability::Flushed);
    let mut sink = storage.create(&key, &options).unwrap();
    sink.write(&body).unwrap();
    sink.commit().unwrap();

    let target = Arc::new(MemoryStorage::new());
    let copies = Checkpoints::over(Arc::clone(&target) as Arc<dyn Storage>, "copies");
    let err = copies
        .copy_compressed_from(&source.open(1).unwrap(), Durability::Flushed)
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Corrupt, "{err}");
    assert!(err.to_string().contains(&key), "{err}");
    assert_eq!(target.keys(), Vec::<String>::new());
}

#[test]
fn a_sharded_set_is_not_copied_compressed() {
    let source = Checkpoints::over(Arc::new(MemoryStorage::new()), "run");
    source
        .save_with(
            1,
            Writer::new(model(3, 20_000)),
            SaveOptions::sharded(50_000),
        )
        .unwrap();
    let copies = Checkpoints::over(Arc::new(MemoryStorage::new()), "copies");
    let err = copies
        .copy_compressed_from(&source.open(1).unwrap(), Durability::Flushed)
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidInput, "{err}");
    assert!(err.to_string().contains("copy_from"), "{err}");
}

#[test]
fn compressed_promotions_keep_the_fast_tier_raw_and_the_durable_one_small() {
    let fast_storage = Arc::new(MemoryStorage::new());
    let fast = Checkpoints::over(Arc::clone(&fast_storage) as Arc<dyn Storage>, "run");
    let durable = Checkpoints::over(Arc::new(MemoryStorage::new()), "run");
    let tiered = Tiered::new(fast, durable).with_compressed_promotion();
    let tensors = model(4, 100_000);
    tiered.save(1, Writer::new(tensors.clone())).unwrap();
    // Promoted before step 2 is saved, so the newest-only policy cannot supersede it.
    tiered.flush().unwrap();
    let handle = tiered
        .save_in_background(2, Writer::new(tensors.clone()), SaveOptions::default())
        .unwrap();
    handle.wait().unwrap();
    tiered.flush().unwrap();
    for step in [1, 2] {
        let on_fast = tiered.fast().open(step).unwrap().record().clone();
        assert!(on_fast.pieces.is_none(), "step {step} on the fast tier");
        let on_durable = tiered.durable().open(step).unwrap().record().clone();
        let pieces = on_durable.pieces.as_ref().unwrap();
        assert!(
            pieces.list.iter().any(|p| p.encoding.is_some()),
            "step {step}"
        );
        assert!(stored(&on_durable) < stored(&on_fast), "step {step}");
    }
    // Promoting again finds the step there with the fast tier's bytes.
    tiered.promote(2).unwrap();
    // The machine is replaced: the durable tier serves, bit for bit.
    for key in fast_storage.keys() {
        fast_storage.delete(&key).unwrap();
    }
    let latest = tiered.latest().unwrap().unwrap();
    assert_eq!(latest.step(), 2);
    assert_eq!(contents(tiered.durable(), 2), expected(&tensors));
}

/// A storage whose commit records land and then report their answer lost, as a request whose
/// answer a reset connection took would.
#[derive(Debug)]
struct AnswerLost {
    inner: Arc<dyn Storage>,
}

#[deny(clippy::missing_trait_methods)]
impl Storage for AnswerLost {
    fn create(&self, key: &str, options: &CreateOptions) -> weightbay::Result<Box<dyn Sink>> {
        let sink = self.inner.create(key, options)?;
        if key.ends_with("commit.json") {
            return Ok(Box::new(LostAnswer { inner: sink }));
        }
        Ok(sink)
    }
    forward_storage!(inner => capabilities, open, delete, pending, clean_pending, list, list_foreign);
}

/// A sink that commits, then says it failed.
struct LostAnswer {
    inner: Box<dyn Sink>,
}

#[deny(clippy::missing_trait_methods)]
impl Sink for LostAnswer {
    fn commit(self: Box<Self>) -> weightbay::Result<()> {
        self.inner.commit()?;
        Err(Error::new(ErrorKind::Io, "the answer was lost"))
    }
    forward_sink!(inner => write, pad, read_back, positioned);
}

/// A copy whose commit record may have landed although its write failed keeps what the
/// record would name: the step then reads whole, where removing its containers left a record
/// naming nothing.
#[test]
fn a_copy_whose_record_answer_is_lost_keeps_its_containers() {
    let tensors = model(5, 50_000);
    let source = Checkpoints::over(Arc::new(MemoryStorage::new()), "run");
    source.save(1, Writer::new(tensors.clone())).unwrap();
    for compressed in [false, true] {
        let target: Arc<dyn Storage> = Arc::new(MemoryStorage::new());
        let lossy = Arc::new(AnswerLost {
            inner: Arc::clone(&target),
        });
        let copies = Checkpoints::over(lossy, "copies");
        let from = source.open(1).unwrap();
        let err = if compressed {
            copies.copy_compressed_from(&from, Durability::Flushed)
        } else {
            copies.copy_from(&from, Durability::Flushed)
        }
        .unwrap_err();
        assert!(err.to_string().contains("the answer was lost"), "{err}");
        let landed = Checkpoints::over(target, "copies");
        assert_eq!(
            contents(&landed, 1),
            expected(&tensors),
            "compressed: {compressed}"
        );
        landed.open(1).unwrap().verify().unwrap();
    }
}
