//! What the checkpoint tests share: a checkpoint's tensors as read back, and the tensors a
//! save was given, both by name.

use std::collections::BTreeMap;

use weightbay::Tensor;
use weightbay_checkpoints::Checkpoints;

/// Every tensor's bytes, by name, read through the checkpoint's reader.
pub(crate) fn contents(checkpoints: &Checkpoints, step: u64) -> BTreeMap<String, Vec<u8>> {
    let checkpoint = checkpoints.open(step).unwrap();
    let reader = checkpoint.reader().unwrap();
    reader
        .load_all()
        .unwrap()
        .into_iter()
        .map(|(info, bytes)| (info.name().to_owned(), bytes.to_vec().unwrap()))
        .collect()
}

/// Every tensor's bytes, by name, as given to a save.
pub(crate) fn expected(tensors: &[Tensor]) -> BTreeMap<String, Vec<u8>> {
    tensors
        .iter()
        .map(|t| (t.name().to_owned(), t.bytes().unwrap().to_vec().unwrap()))
        .collect()
}
