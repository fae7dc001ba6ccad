//! `weightbay export` as a user runs it: a multi-rank checkpoint out as a Hugging Face model
//! directory that `verify` checks byte for byte, and that an export killed at any moment
//! never leaves loadable.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use weightbay::{Tensor, Writer};
use weightbay_checkpoints::{Checkpoints, EXPORT_INDEX, RankSave, Region};

mod common;

use common::{text, weightbay};

/// The command's output, both streams, once it succeeded.
fn ok(args: &[&str]) -> String {
    let output = weightbay(args);
    let (stdout, stderr) = text(&output);
    assert!(output.status.success(), "{args:?}: {stdout}{stderr}");
    stdout + &stderr
}

/// Step 1 of `run` under `dir`, saved by four ranks in row slices: `tensors` tensors of
/// `rows` × 256 f32 each, every element its own index.
fn four_ranks(dir: &Path, tensors: usize, rows: u64) {
    let checkpoints = Checkpoints::new(weightbay_local::LocalStorage::new(dir), "run");
    let shape = [rows, 256];
    for rank in 0..4u32 {
        let region = Region::split(&shape, 0, 4, u64::from(rank));
        let start = region.offsets[0] * 256;
        let values: Vec<f32> = (start..start + region.elements())
            .map(|i| i as f32)
            .collect();
        let names: Vec<String> = (0..tensors).map(|i| format!("layers.{i}.weight")).collect();
        let writer = Writer::new(
            names
                .iter()
                .map(|name| Tensor::from_slice(name.as_str(), region.lengths.clone(), &values))
                .collect(),
        );
        let mut save = RankSave::new(rank, 4, writer);
        for name in &names {
            save = save.with_slice(name.as_str(), shape, region.clone());
        }
        checkpoints.save_rank(1, save).unwrap();
    }
}

#[test]
fn an_export_verifies_byte_for_byte_and_a_changed_byte_is_named() {
    let dir = tempfile::tempdir().unwrap();
    four_ranks(dir.path(), 6, 64);
    let (run, out) = (dir.path().join("run"), dir.path().join("hf"));
    let said = ok(&[
        "export",
        run.to_str().unwrap(),
        out.to_str().unwrap(),
        "--max-shard-size",
        "70kB",
        "--dtype",
        "bf16",
    ]);
    assert!(
        said.contains("exported 6 tensors") && said.contains("in 3 shards"),
        "{said}"
    );
    let index = out.join(EXPORT_INDEX);
    let index = index.to_str().unwrap();
    let verified = ok(&["verify", index, "--require-checksums"]);
    assert_eq!(
        verified.matches("every checksum matches").count(),
        3,
        "{verified}"
    );

    // One byte of tensor data changed: the structure still holds, the CRC32C does not.
    let shard = out.join("model-00002-of-00003.safetensors");
    let mut bytes = std::fs::read(&shard).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 1;
    std::fs::write(&shard, bytes).unwrap();
    let output = weightbay(&["verify", index]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "a changed byte verified");
    assert!(
        stderr.contains("model-00002-of-00003.safetensors") && stderr.contains("CRC32C"),
        "{stderr}"
    );
}

#[test]
fn an_export_killed_at_any_moment_is_never_loadable_and_a_rerun_finishes_it() {
    let dir = tempfile::tempdir().unwrap();
    // 16 tensors of 4 MiB: long enough to be killed part way on this machine.
    four_ranks(dir.path(), 16, 4096);
    let run = dir.path().join("run");
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut killed_part_way = 0;
    for attempt in 0..6 {
        let out = dir.path().join(format!("hf-{attempt}"));
        let args = [
            "export",
            run.to_str().unwrap(),
            out.to_str().unwrap(),
            "--max-shard-size",
            "16MiB",
        ];
        let mut child = Command::new(env!("CARGO_BIN_EXE_weightbay"))
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        std::thread::sleep(Duration::from_millis(20 + seed % 400));
        child.kill().unwrap();
        let finished = child.wait().unwrap().success();
        let index = out.join(EXPORT_INDEX);
        if index.exists() {
            // Only a finished export has an index, and every byte it names is there.
            ok(&["verify", index.to_str().unwrap(), "--require-checksums"]);
        } else {
            assert!(!finished, "a finished export has no index");
            killed_part_way += 1;
            ok(&args);
            ok(&["verify", index.to_str().unwrap(), "--require-checksums"]);
            let scratch: Vec<_> = std::fs::read_dir(&out)
                .unwrap()
                .flatten()
                .map(|entry| entry.file_name().to_string_lossy().into_owned())
                .filter(|name| name.ends_with(".tmp"))
                .collect();
            assert!(
                scratch.is_empty(),
                "the rerun left scratch files: {scratch:?}"
            );
        }
    }
    assert!(killed_part_way > 0, "no kill landed during an export");
}

#[test]
fn a_container_and_a_sharded_set_export_too() {
    let dir = tempfile::tempdir().unwrap();
    let storage = weightbay_local::LocalStorage::new(dir.path());
    let tensors = || {
        (0..4)
            .map(|i| Tensor::from_slice(format!("w{i}"), [256], &[i as f32; 256]))
            .collect::<Vec<_>>()
    };
    Writer::new(tensors())
        .write_to(&storage, "model.bpk")
        .unwrap();
    let sharded = weightbay::ShardedWriter::new(
        Writer::new(tensors()).with_format(weightbay::Format::Safetensors),
    )
    .with_shard_len(2048)
    .write_to(&storage, "set")
    .unwrap();
    for (source, out) in [
        (
            dir.path().join("model.bpk"),
            dir.path().join("from-container"),
        ),
        (dir.path().join(&sharded.index), dir.path().join("from-set")),
    ] {
        let said = ok(&[
            "export",
            source.to_str().unwrap(),
            out.to_str().unwrap(),
            "--max-shard-size",
            "2KiB",
        ]);
        assert!(
            said.contains("exported 4 tensors") && said.contains("in 2 shards"),
            "{said}"
        );
        let index = out.join(EXPORT_INDEX);
        let verified = ok(&["verify", index.to_str().unwrap(), "--require-checksums"]);
        assert_eq!(
            verified.matches("every checksum matches").count(),
            2,
            "{verified}"
        );
    }
}
