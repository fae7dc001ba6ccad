//! Hand-crafted containers for the reader tests.
#![allow(dead_code)] // each test binary uses its own subset

use ciborium::Value;

pub(crate) fn text(s: &str) -> Value {
    Value::Text(s.into())
}

pub(crate) fn uint(v: u64) -> Value {
    Value::Integer(v.into())
}

/// A descriptor map `{dtype, shape, data_offsets}`.
pub(crate) fn descriptor(dtype: &str, shape: &[u64], start: u64, end: u64) -> Value {
    Value::Map(vec![
        (text("dtype"), text(dtype)),
        (
            text("shape"),
            Value::Array(shape.iter().map(|&d| uint(d)).collect()),
        ),
        (
            text("data_offsets"),
            Value::Array(vec![uint(start), uint(end)]),
        ),
    ])
}

/// `{"tensors": {name: descriptor, ...}}`
pub(crate) fn tensors(entries: Vec<(&str, Value)>) -> Value {
    Value::Map(vec![(
        text("tensors"),
        Value::Map(
            entries
                .into_iter()
                .map(|(name, d)| (text(name), d))
                .collect(),
        ),
    )])
}

pub(crate) fn cbor(value: &Value) -> Vec<u8> {
    let mut out = Vec::new();
    ciborium::ser::into_writer(value, &mut out).unwrap();
    out
}

/// Header + raw metadata bytes + padding to 256 + `data`.
pub(crate) fn container_raw(metadata: &[u8], data: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(&0x4255_524Eu32.to_le_bytes());
    out.extend_from_slice(&1u16.to_le_bytes());
    out.extend_from_slice(&(metadata.len() as u32).to_le_bytes());
    out.extend_from_slice(metadata);
    out.resize(out.len().div_ceil(256) * 256, 0);
    out.extend_from_slice(data);
    out
}

pub(crate) fn container(metadata: &Value, data: &[u8]) -> Vec<u8> {
    container_raw(&cbor(metadata), data)
}
