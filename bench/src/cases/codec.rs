//! The chunk codec on weights drawn like trained ones: how much smaller, and how fast on one
//! core, beside ZipNN (`pip install zipnn`, in the Python `WEIGHTBAY_PYTHON` names) on the
//! same bytes, in the same run.
//!
//! The weights: each tensor's values drawn from a normal distribution around zero with a
//! standard deviation of its own (0.006 to 0.05, the range of trained transformer layers),
//! one value in 32 from one four times as wide (the heavier tails trained weights have), by a
//! fixed-seed generator; bf16 is the f32 rounded to nearest even.

use std::hint::black_box;
use std::time::Duration;

use weightbay::codec::{Codec, Elements, encode_planes};
use weightbay::{DType, Error, ErrorKind, Result};

use crate::context::Bench;
use crate::harness::{io, median, python_peer, seconds, timed};
use crate::report::{Row, gib_per_s};

/// The pieces a compressed save cuts tensors into.
const PIECE_LEN: usize = 1 << 20;

/// ZipNN on one file of one dtype: compressed size and every run's compress and decompress
/// time, one thread, as JSON on stdout. ZipNN rewrites its input buffer in place, so each run
/// compresses a fresh copy; the copy is outside the timing.
const ZIPNN_PEER: &str = r#"
import json, sys, time
import zipnn
path, dtype, runs = sys.argv[1], sys.argv[2], int(sys.argv[3])
data = open(path, "rb").read()
z = zipnn.ZipNN(input_format="byte", bytearray_dtype=dtype, threads=1)
compress, decompress, size = [], [], 0
for _ in range(runs):
    fresh = bytes(bytearray(data))
    start = time.perf_counter(); packed = z.compress(fresh); compress.append(time.perf_counter() - start)
    start = time.perf_counter(); back = z.decompress(packed); decompress.append(time.perf_counter() - start)
    assert bytes(back) == data, "zipnn gave other bytes back"
    size = len(packed)
print(json.dumps({"size": size, "compress": compress, "decompress": decompress}))
"#;

/// Weights of `dtype` (`BF16` or `F32`) spread like trained ones, `len` bytes.
pub(crate) fn weights(dtype: &DType, len: usize) -> Vec<u8> {
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut uniform = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        ((state >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    };
    let width = if *dtype == DType::BF16 { 2 } else { 4 };
    let sigmas = [0.006, 0.012, 0.02, 0.035, 0.05];
    let per_tensor = (4 << 20) / width;
    let mut out = Vec::with_capacity(len);
    let mut i = 0usize;
    while out.len() < len {
        let sigma = sigmas[(i / per_tensor) % sigmas.len()];
        // Box–Muller; one value in 32 from the wider normal.
        let normal = (-2.0 * uniform().ln()).sqrt() * (std::f64::consts::TAU * uniform()).cos();
        let scale = if i.is_multiple_of(32) {
            4.0 * sigma
        } else {
            sigma
        };
        let value = (normal * scale) as f32;
        if width == 2 {
            let bits = value.to_bits();
            // Round to nearest even, as torch's conversion does.
            let rounded = bits.wrapping_add(0x7fff + ((bits >> 16) & 1)) >> 16;
            out.extend_from_slice(&(rounded as u16).to_le_bytes());
        } else {
            out.extend_from_slice(&value.to_le_bytes());
        }
        i += 1;
    }
    out.truncate(len);
    out
}

/// ZipNN's size and times for `path`, or why it cannot run.
fn zipnn(
    path: &std::path::Path,
    dtype: &str,
    runs: usize,
) -> std::result::Result<(u64, Vec<Duration>, Vec<Duration>), String> {
    let runs = runs.to_string();
    let printed = python_peer(ZIPNN_PEER, &[&path, &dtype, &runs])?;
    let report: serde_json::Value =
        serde_json::from_str(&printed).map_err(|e| format!("no report: {e}"))?;
    let times = |name: &str| -> Vec<Duration> {
        report[name]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(serde_json::Value::as_f64)
            .map(Duration::from_secs_f64)
            .collect()
    };
    let size = report["size"].as_u64().ok_or("no size")?;
    Ok((size, times("compress"), times("decompress")))
}

pub(crate) fn codec_cases(b: &mut Bench<'_>) -> Result<()> {
    let len = (b.args.size_mib.min(256) as usize) << 20;
    let runs = b.table.runs;
    for (dtype, name) in [(DType::BF16, "bfloat16"), (DType::F32, "float32")] {
        let data = weights(&dtype, len);
        let elements = Elements::of(&dtype);
        // Each piece's frame, in a buffer kept from run to run as a save keeps one, and
        // whether it shrank.
        let mut frames: Vec<(Vec<u8>, bool)> = vec![(Vec::new(), false); len.div_ceil(PIECE_LEN)];
        let mut encode_times = Vec::new();
        for _ in 0..runs {
            encode_times.push(timed(|| {
                for (piece, (frame, shrank)) in data.chunks(PIECE_LEN).zip(frames.iter_mut()) {
                    *shrank = encode_planes(piece, elements, frame);
                }
                Ok(())
            })?);
        }
        let stored: usize = frames
            .iter()
            .zip(data.chunks(PIECE_LEN))
            .map(|((frame, shrank), piece)| if *shrank { frame.len() } else { piece.len() })
            .sum();
        let mut back = vec![0u8; len];
        let mut decode_times = Vec::new();
        for _ in 0..runs {
            decode_times.push(timed(|| {
                for ((frame, piece), out) in frames
                    .iter()
                    .zip(data.chunks(PIECE_LEN))
                    .zip(back.chunks_mut(PIECE_LEN))
                {
                    match frame {
                        (frame, true) => Codec::Planes.decode(frame, out)?,
                        (_, false) => out.copy_from_slice(piece),
                    }
                }
                black_box(&back);
                Ok(())
            })?);
        }
        if back != data {
            return Err(Error::new(
                ErrorKind::Corrupt,
                format!("{name}: the codec gave other bytes back"),
            ));
        }
        let path = b.dir.join(format!("codec.{name}"));
        std::fs::write(&path, &data).map_err(io("writing the codec's weights"))?;
        let peer = zipnn(&path, name, runs);
        let _ = std::fs::remove_file(&path);
        println!(
            "  codec {name}, {} MiB in {} MiB pieces: weightbay {:.4}x smaller ({stored} bytes)",
            len >> 20,
            PIECE_LEN >> 20,
            len as f64 / stored as f64
        );
        println!(
            "    each run, seconds: encode {}; decode {}",
            seconds(&encode_times),
            seconds(&decode_times)
        );
        let (encode, decode) = (median(encode_times), median(decode_times));
        println!(
            "    one core: encode {:.2} GiB/s, decode {:.2} GiB/s",
            gib_per_s(len as u64, encode),
            gib_per_s(len as u64, decode)
        );
        let (zip_compress, zip_decompress) = match peer {
            Ok((size, compress, decompress)) => {
                println!(
                    "    ZipNN {:.4}x smaller ({size} bytes); weightbay's pieces are {:.4}x its size",
                    len as f64 / size as f64,
                    stored as f64 / size as f64
                );
                println!(
                    "    ZipNN each run, seconds: compress {}; decompress {}",
                    seconds(&compress),
                    seconds(&decompress)
                );
                (Some(median(compress)), Some(median(decompress)))
            }
            Err(why) => {
                println!("    ZipNN skipped: {why}");
                (None, None)
            }
        };
        for (what, ours, peer, peer_name) in [
            ("encode", encode, zip_compress, "ZipNN compress, 1 thread"),
            (
                "decode",
                decode,
                zip_decompress,
                "ZipNN decompress, 1 thread",
            ),
        ] {
            b.table.push(Row {
                case: format!("codec {what} {name}, one core"),
                ours,
                peer: peer.map(|peer| (peer_name.to_owned(), peer)),
                bytes: len as u64,
            });
        }
    }
    Ok(())
}
