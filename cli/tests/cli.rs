//! The `weightbay` command as a user runs it: real files, real exit codes, one-line errors.

use std::path::Path;
use std::process::Command;

use weightbay::Format;
use weightbay::{BoolStore, DType, Scalar, Tensor, Writer};

mod common;

use common::{text, weightbay};

/// The golden container of the format docs.
fn golden(path: &Path) {
    let weight: Vec<u8> = (1..=6).flat_map(|v| (v as f32).to_le_bytes()).collect();
    let bytes = Writer::new(vec![
        Tensor::new("layer.weight", DType::F32, [2, 3], weight).with_param_id(42),
        Tensor::new(
            "layer.bias",
            DType::F16,
            [3],
            vec![0, 0x3c, 0, 0x40, 0, 0x42],
        ),
        Tensor::new(
            "mask",
            DType::Bool(BoolStore::Native),
            [4],
            vec![1, 0, 1, 1],
        ),
    ])
    .with_metadata("producer", "cli-test")
    .with_scalar("epoch", 3u64)
    .with_scalar("lr", Scalar::Float(0.001))
    .into_bytes()
    .unwrap();
    std::fs::write(path, bytes).unwrap();
}

#[test]
fn inspect_prints_a_table_and_json() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("model.bpk");
    golden(&path);
    let output = weightbay(&["inspect", path.to_str().unwrap()]);
    assert!(output.status.success());
    insta::assert_snapshot!("inspect_table", text(&output).0);
    let output = weightbay(&["inspect", "--json", path.to_str().unwrap()]);
    assert!(output.status.success());
    insta::assert_snapshot!("inspect_json", text(&output).0);
}

#[test]
fn verify_passes_clean_files_and_names_the_corrupt_tensor() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("model.bpk");
    golden(&path);
    let output = weightbay(&["verify", path.to_str().unwrap()]);
    assert!(output.status.success(), "{:?}", text(&output));
    assert!(text(&output).0.contains("every checksum matches"));

    let mut bytes = std::fs::read(&path).unwrap();
    let bias = weightbay::Reader::from_bytes(bytes.clone())
        .unwrap()
        .tensor("layer.bias")
        .unwrap()
        .range();
    bytes[bias.start as usize + 1] ^= 0x01;
    std::fs::write(&path, bytes).unwrap();
    let output = weightbay(&["verify", path.to_str().unwrap()]);
    assert_eq!(output.status.code(), Some(1));
    let (_, stderr) = text(&output);
    assert!(
        stderr.starts_with("error: ") && stderr.contains("tensor `layer.bias`"),
        "{stderr}"
    );
    assert_eq!(
        stderr.lines().count(),
        1,
        "one line, no backtrace: {stderr}"
    );
}

#[test]
fn cp_converts_between_formats_and_storages() {
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("model.bpk");
    golden(&source);
    let st = dir.path().join("out/model.safetensors");
    let output = weightbay(&["cp", source.to_str().unwrap(), st.to_str().unwrap()]);
    assert!(output.status.success(), "{:?}", text(&output));
    let reader = weightbay::Reader::from_bytes(std::fs::read(&st).unwrap()).unwrap();
    assert_eq!(reader.format(), Format::Safetensors);
    assert_eq!(reader.scalars()["epoch"], Scalar::UInt(3));

    // Back to Burnpack through a file:// URL, with --no-clobber.
    let back = format!("file://{}", dir.path().join("back.bpk").display());
    assert!(
        weightbay(&["cp", st.to_str().unwrap(), &back])
            .status
            .success()
    );
    let output = weightbay(&["cp", "--no-clobber", st.to_str().unwrap(), &back]);
    assert_eq!(output.status.code(), Some(1));
    assert!(
        text(&output).1.contains("already exists"),
        "{:?}",
        text(&output)
    );
    assert!(
        weightbay(&["verify", "--require-checksums", &back])
            .status
            .success()
    );

    // An embedded object store works as a destination within one command.
    let output = weightbay(&["cp", source.to_str().unwrap(), "memory:///bucket/model.bpk"]);
    assert!(output.status.success(), "{:?}", text(&output));
}

#[test]
fn bad_input_gets_one_clear_line() {
    let dir = tempfile::tempdir().unwrap();
    let junk = dir.path().join("junk.bpk");
    std::fs::write(&junk, b"this is not a checkpoint at all").unwrap();
    let missing = dir.path().join("missing.bpk");
    let cases: Vec<(Vec<String>, &str)> = vec![
        (
            vec!["inspect".into(), missing.display().to_string()],
            "missing.bpk",
        ),
        (vec!["inspect".into(), "ftp://host/x.bpk".into()], "ftp://"),
        (
            vec!["verify".into(), junk.display().to_string()],
            "corrupt container",
        ),
        (vec!["inspect".into(), "s3://".into()], "names no object"),
        (
            vec!["inspect".into(), "memory:///nothing/here.bpk".into()],
            "here.bpk",
        ),
    ];
    for (args, expected) in cases {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let output = weightbay(&args);
        let (_, stderr) = text(&output);
        assert_eq!(output.status.code(), Some(1), "{args:?}: {stderr}");
        assert!(
            stderr.starts_with("error: ") && stderr.contains(expected),
            "{args:?}: {stderr}"
        );
        assert_eq!(stderr.lines().count(), 1, "{args:?}: {stderr}");
    }
    // An unreachable endpoint: a closed local port, with retries kept short.
    let output = Command::new(env!("CARGO_BIN_EXE_weightbay"))
        .args(["inspect", "s3://bucket/model.bpk"])
        .env("AWS_ENDPOINT", "http://127.0.0.1:9")
        .env("AWS_ALLOW_HTTP", "true")
        .env("AWS_ACCESS_KEY_ID", "test")
        .env("AWS_SECRET_ACCESS_KEY", "secret-that-must-not-print")
        .env("AWS_DEFAULT_REGION", "us-east-1")
        .env("WEIGHTBAY_MAX_RETRIES", "0")
        .output()
        .unwrap();
    let (_, stderr) = text(&output);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(stderr.starts_with("error: "), "{stderr}");
    assert!(!stderr.contains("secret-that-must-not-print"), "{stderr}");
}

#[test]
fn demo_runs_with_nothing_else_started() {
    let output = weightbay(&["demo", "--size-mib", "32"]);
    assert!(output.status.success(), "{:?}", text(&output));
    let (stdout, _) = text(&output);
    assert!(stdout.contains("done: both copies verify"), "{stdout}");
}

/// Ctrl-C during `cp` stops the copy at its next write: exit status 130, one line saying so,
/// and the destination exactly as it was, with no scratch file beside it.
#[test]
fn ctrl_c_during_cp_leaves_the_destination_as_it_was() {
    const TENSOR: u64 = 16 << 20;
    let dir = tempfile::tempdir().unwrap();
    let storage = weightbay_local::LocalStorage::new(dir.path());
    let destination = dir.path().join("out.bpk");
    golden(&destination);
    let old = std::fs::read(&destination).unwrap();
    let scratch_exists = || {
        std::fs::read_dir(dir.path())
            .unwrap()
            .flatten()
            .any(|entry| entry.file_name().to_string_lossy().ends_with(".tmp"))
    };
    // The signal goes once the copy has started writing; should the copy outrun it anyway,
    // try again with a larger source.
    for tensors in [16, 64] {
        Writer::new(
            (0..tensors)
                .map(|i| {
                    Tensor::deferred(format!("t{i}"), DType::U8, [TENSOR], TENSOR, || {
                        Ok(vec![7u8; TENSOR as usize].into())
                    })
                })
                .collect(),
        )
        .write_to(&storage, "source.bpk")
        .unwrap();
        let mut child = Command::new(env!("CARGO_BIN_EXE_weightbay"))
            .args([
                "cp",
                dir.path().join("source.bpk").to_str().unwrap(),
                destination.to_str().unwrap(),
            ])
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while !scratch_exists() && child.try_wait().unwrap().is_none() {
            assert!(
                std::time::Instant::now() < deadline,
                "cp never started writing"
            );
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        let signalled = Command::new("kill")
            .args(["-INT", &child.id().to_string()])
            .status()
            .unwrap();
        let output = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        if output.status.success() || !signalled.success() {
            // The copy finished first (or ignored the signal): try a larger one.
            continue;
        }
        assert_eq!(output.status.code(), Some(130), "{stderr}");
        assert!(
            stderr.contains("interrupted: the destination was left as it was"),
            "{stderr}"
        );
        assert_eq!(std::fs::read(&destination).unwrap(), old);
        assert!(!scratch_exists(), "a scratch file was left behind");
        return;
    }
    panic!("every copy finished despite Ctrl-C: ignored, or it came after the last write");
}

/// Four tensors written under `dir/hf/` as a sharded safetensors set, two to a shard; the
/// path of its index.
fn sharded_set(dir: &Path) -> std::path::PathBuf {
    let storage = weightbay_local::LocalStorage::new(dir);
    let tensors = (0..4)
        .map(|i| Tensor::new(format!("w{i}"), DType::U8, [1000], vec![i as u8; 1000]))
        .collect();
    let summary =
        weightbay::ShardedWriter::new(Writer::new(tensors).with_format(Format::Safetensors))
            .with_shard_len(2000)
            .write_to(&storage, "hf")
            .unwrap();
    dir.join(&summary.index)
}

/// A sharded safetensors set, as Hugging Face tools write one: its index works wherever a
/// container does, and an unrecognised JSON file says what was tried.
#[test]
fn index_files_work_wherever_a_container_does() {
    let dir = tempfile::tempdir().unwrap();
    let index = sharded_set(dir.path());
    let index = index.to_str().unwrap();

    let output = weightbay(&["inspect", index]);
    let (stdout, stderr) = text(&output);
    assert!(output.status.success(), "{stderr}");
    assert!(stdout.contains("w0") && stdout.contains("w3"), "{stdout}");
    let output = weightbay(&["verify", index]);
    let (stdout, stderr) = text(&output);
    assert!(output.status.success(), "{stderr}");
    assert_eq!(
        stdout.lines().filter(|l| l.starts_with("ok: ")).count(),
        2,
        "{stdout}"
    );

    let merged = dir.path().join("merged.bpk");
    let output = weightbay(&["cp", index, merged.to_str().unwrap()]);
    assert!(output.status.success(), "{:?}", text(&output));
    let reader = weightbay::Reader::from_bytes(std::fs::read(&merged).unwrap()).unwrap();
    assert_eq!(reader.tensors().len(), 4);
    assert_eq!(reader.read("w2").unwrap(), vec![2; 1000]);

    // A JSON file that is no index, under a container's name.
    let other = dir.path().join("config.bpk");
    std::fs::write(&other, br#"{"hidden_size": 4096}"#).unwrap();
    let output = weightbay(&["inspect", other.to_str().unwrap()]);
    let (_, stderr) = text(&output);
    assert_eq!(output.status.code(), Some(1));
    assert!(
        stderr.contains("tried Burnpack") && stderr.contains("index.json"),
        "{stderr}"
    );
}

/// A training run's checkpoints: listed, verified (a flipped bit in a safetensors shard is
/// caught), thinned out (a dry run first), and copied to another storage.
#[test]
fn checkpoint_prefixes_list_verify_gc_and_copy() {
    use weightbay_checkpoints::{Checkpoints, SaveOptions};
    let dir = tempfile::tempdir().unwrap();
    let checkpoints = Checkpoints::new(weightbay_local::LocalStorage::new(dir.path()), "run");
    for step in [100, 200, 300] {
        let tensors = (0..3)
            .map(|i| Tensor::new(format!("w{i}"), DType::U8, [1000], vec![step as u8; 1000]))
            .collect();
        let writer = Writer::new(tensors).with_format(Format::Safetensors);
        checkpoints
            .save_with(step, writer, SaveOptions::sharded(1500))
            .unwrap();
    }
    let run = dir.path().join("run");
    let run = run.to_str().unwrap();
    let output = weightbay(&["ls", run]);
    let (stdout, stderr) = text(&output);
    assert!(output.status.success(), "{stderr}");
    assert_eq!(stdout.matches("complete").count(), 3, "{stdout}");
    assert!(stdout.contains("safetensors"), "{stdout}");

    // One flipped bit in a shard of step 200.
    let record = checkpoints.open(200).unwrap().record().clone();
    let shard = record
        .containers
        .iter()
        .find(|c| c.key.ends_with(".safetensors"))
        .unwrap();
    let path = dir.path().join("run/step-200").join(&shard.key);
    let mut bytes = std::fs::read(&path).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0x01;
    std::fs::write(&path, bytes).unwrap();
    let output = weightbay(&["verify", run]);
    assert!(
        output.status.success(),
        "the latest is intact: {:?}",
        text(&output)
    );
    let output = weightbay(&["verify", run, "--all"]);
    let (stdout, _) = text(&output);
    assert_eq!(output.status.code(), Some(1), "{stdout}");
    assert!(
        stdout.contains("FAILED: step 200") && stdout.contains("CRC32C"),
        "{stdout}"
    );
    assert_eq!(stdout.matches("ok: step").count(), 2, "{stdout}");

    let output = weightbay(&["gc", run, "--keep-last", "1", "--dry-run"]);
    let (stdout, _) = text(&output);
    assert!(
        stdout.contains("would delete checkpoint step 100"),
        "{stdout}"
    );
    // Lengths are intact, so step 200 still lists as complete: only verify reads the bytes.
    assert_eq!(checkpoints.steps().unwrap(), [100, 200, 300]);
    let output = weightbay(&["gc", run, "--keep-last", "1"]);
    assert!(output.status.success(), "{:?}", text(&output));
    assert_eq!(checkpoints.steps().unwrap(), [300]);
    assert!(checkpoints.list().unwrap().iter().all(|s| s.step == 300));

    let copy = dir.path().join("elsewhere/run");
    let output = weightbay(&["cp", run, copy.to_str().unwrap()]);
    assert!(output.status.success(), "{:?}", text(&output));
    let output = weightbay(&["verify", copy.to_str().unwrap()]);
    let (stdout, stderr) = text(&output);
    assert!(output.status.success(), "{stderr}");
    assert!(stdout.contains("ok: step 300"), "{stdout}");
}

/// A checkpoint written by four ranks as row slices: `ls` shows its ranks, and the step whose
/// last rank has not written yet names that rank; `verify` reads every rank's container and
/// catches a flipped bit in one; `cp` copies it so it loads whole elsewhere.
#[test]
fn multi_rank_checkpoints_list_verify_and_copy() {
    use weightbay_checkpoints::{Checkpoints, RankSave, Region};
    let dir = tempfile::tempdir().unwrap();
    let checkpoints = Checkpoints::new(weightbay_local::LocalStorage::new(dir.path()), "run");
    let rows: Vec<f32> = (0..64).map(|i| i as f32).collect();
    let save = |step: u64, rank: u32| {
        let region = Region::split(&[16, 4], 0, 4, u64::from(rank));
        let start = region.offsets[0] as usize * 4;
        let slice = &rows[start..start + region.elements() as usize];
        let writer = Writer::new(vec![Tensor::from_slice("w", [4, 4], slice)]);
        checkpoints
            .save_rank(
                step,
                RankSave::new(rank, 4, writer).with_slice("w", [16, 4], region),
            )
            .unwrap();
    };
    for rank in 0..4 {
        save(100, rank);
    }
    for rank in [0, 1, 3] {
        save(200, rank);
    }
    let run = dir.path().join("run");
    let run = run.to_str().unwrap();
    let output = weightbay(&["ls", run]);
    let (stdout, stderr) = text(&output);
    assert!(output.status.success(), "{stderr}");
    let line = |step: &str| line_of(&stdout, step);
    assert!(
        line("100").contains("complete") && line("100").contains("  4  "),
        "{stdout}"
    );
    assert!(
        line("200").contains("3/4") && line("200").contains("waiting for rank(s) 2"),
        "{stdout}"
    );
    // A rank whose save fails says so, with its reason, for a launcher deciding whether to
    // wait.
    let failing = RankSave::new(
        1,
        4,
        Writer::new(vec![Tensor::deferred("w", DType::F32, [4, 4], 64, || {
            Err(weightbay::Error::new(
                weightbay::ErrorKind::Io,
                "the device read back nothing",
            ))
        })]),
    )
    .with_slice("w", [16, 4], Region::split(&[16, 4], 0, 4, 1));
    let error = checkpoints.save_rank(300, failing).unwrap_err();
    assert!(
        error.to_string().contains("rank 1 of 4, step 300"),
        "{error}"
    );
    save(300, 0);
    let output = weightbay(&["ls", run]);
    let (stdout, _) = text(&output);
    assert!(
        line_of(&stdout, "300").contains("rank(s) 1 FAILED; waiting for rank(s) 2, 3"),
        "{stdout}"
    );
    assert!(
        stdout.contains("rank 1: ") && stdout.contains("the device read back nothing"),
        "{stdout}"
    );

    let output = weightbay(&["verify", run]);
    let (stdout, stderr) = text(&output);
    assert!(output.status.success(), "{stderr}");
    assert!(stdout.contains("ok: step 100: 4 containers"), "{stdout}");
    let copy = dir.path().join("elsewhere/run");
    let output = weightbay(&["cp", run, copy.to_str().unwrap()]);
    assert!(output.status.success(), "{:?}", text(&output));
    let copied = Checkpoints::new(
        weightbay_local::LocalStorage::new(dir.path()),
        "elsewhere/run",
    );
    let weights = copied.open(100).unwrap().assembled().unwrap();
    assert_eq!(weights.read_as::<f32>("w").unwrap(), rows);

    let record = checkpoints.open(100).unwrap().record().clone();
    let path = dir
        .path()
        .join("run/step-100")
        .join(&record.containers[2].key);
    let mut bytes = std::fs::read(&path).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0x01;
    std::fs::write(&path, bytes).unwrap();
    let output = weightbay(&["verify", run]);
    let (stdout, _) = text(&output);
    assert_eq!(output.status.code(), Some(1), "{stdout}");
    assert!(
        stdout.contains("rank-00002") && stdout.contains("CRC32C"),
        "{stdout}"
    );
}

/// The line of `ls` output for `step`.
fn line_of(stdout: &str, step: &str) -> String {
    stdout
        .lines()
        .find(|l| l.trim_start().starts_with(step))
        .unwrap_or_else(|| panic!("no step {step} in {stdout}"))
        .to_owned()
}

/// `cp` into the S3 server killed mid-upload, again and again: `gc --dry-run` on the prefix
/// (no checkpoint prefix) lists every unfinished write it would remove, `gc` removes them, and
/// the server holds no open multipart upload under the prefix afterwards.
#[test]
fn gc_removes_what_killed_copies_left_on_any_prefix() {
    let Some(base) = weightbay_conformance::s3_url() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    // 48 MiB: six 8 MiB parts, staged (create-new) then copied to the key.
    let storage = weightbay_local::LocalStorage::new(dir.path());
    Writer::new(
        (0..6)
            .map(|i| {
                Tensor::new(
                    format!("t{i}"),
                    DType::U8,
                    [8 << 20],
                    vec![i as u8; 8 << 20],
                )
            })
            .collect(),
    )
    .write_to(&storage, "big.bpk")
    .unwrap();
    let source = dir.path().join("big.bpk");
    let prefix = format!("cli-gc-{}", std::process::id());
    let uploads = || weightbay_conformance::s3_open_uploads(&prefix).unwrap();
    let mut killed = 0;
    for round in 0..6u64 {
        let before = uploads().len();
        let mut child = Command::new(env!("CARGO_BIN_EXE_weightbay"))
            .args([
                "cp",
                "--no-clobber",
                source.to_str().unwrap(),
                &format!("{base}/{prefix}/copy-{round}.bpk"),
            ])
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        // Kill once this copy's upload is open, at a moment further into it each round.
        while uploads().len() == before && child.try_wait().unwrap().is_none() {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        std::thread::sleep(std::time::Duration::from_millis(40 * round));
        let _ = Command::new("kill")
            .args(["-KILL", &child.id().to_string()])
            .status();
        if !child.wait().unwrap().success() {
            killed += 1;
        }
    }
    assert!(killed > 0, "every copy finished before its kill");
    // Requests a killed process sent may still be landing.
    std::thread::sleep(std::time::Duration::from_secs(1));
    let open = weightbay_conformance::s3_open_uploads(&prefix).unwrap();
    let url = format!("{base}/{prefix}");
    let output = weightbay(&["gc", "--dry-run", &url]);
    let (stdout, stderr) = text(&output);
    assert!(output.status.success(), "{stderr}");
    let listed = stdout.matches("would delete unfinished write of").count();
    assert!(listed > 0, "{killed} kills, nothing listed: {stdout}");
    assert!(
        stderr.contains(&format!("{listed} unfinished writes")),
        "{stderr}"
    );
    // A dry run removes nothing.
    assert_eq!(
        weightbay_conformance::s3_open_uploads(&prefix).unwrap(),
        open
    );
    let output = weightbay(&["gc", &url]);
    let (stdout, stderr) = text(&output);
    assert!(output.status.success(), "{stderr}");
    assert_eq!(
        stdout.matches("deleted unfinished write of").count(),
        listed,
        "{stdout}"
    );
    assert_eq!(
        weightbay_conformance::s3_open_uploads(&prefix).unwrap(),
        Vec::<String>::new(),
        "{killed} kills left {open:?}; gc printed {stdout}"
    );
    // Nothing is left to clean: the prefix is gone, or holds only finished copies.
    let (_, said) = text(&weightbay(&["gc", "--dry-run", &url]));
    assert!(
        said.contains("0 unfinished writes") || said.contains("nothing is stored under"),
        "{said}"
    );
}

/// The first two errors a new user meets: a prefix that does not exist, and a cloud URL with
/// no credentials in the environment (the metadata endpoint pointed at a closed loopback port,
/// so nothing leaves the machine).
#[test]
fn a_missing_prefix_and_missing_credentials_say_so() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("no/such/run");
    let output = weightbay(&["ls", missing.to_str().unwrap()]);
    let (_, stderr) = text(&output);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("does not exist"), "{stderr}");

    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let endpoint = format!("http://{}", closed.local_addr().unwrap());
    drop(closed);
    let mut command = Command::new(env!("CARGO_BIN_EXE_weightbay"));
    for (name, _) in std::env::vars() {
        if name.starts_with("AWS_") {
            command.env_remove(name);
        }
    }
    let output = command
        .args(["ls", "s3://bucket/run"])
        .env("AWS_METADATA_ENDPOINT", &endpoint)
        .env("AWS_DEFAULT_REGION", "us-east-1")
        .env("HOME", dir.path())
        .output()
        .unwrap();
    let (_, stderr) = text(&output);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("no S3 credentials found"), "{stderr}");
    assert!(stderr.contains("AWS_ACCESS_KEY_ID"), "{stderr}");
}

/// `cp`, `inspect`, `verify` and `ls` against the local S3 server and Azurite, as against files.
#[test]
fn commands_work_on_the_s3_and_azure_servers() {
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("model.bpk");
    golden(&source);
    let source = source.to_str().unwrap();
    for base in [
        weightbay_conformance::s3_url(),
        weightbay_conformance::azure_url(),
    ]
    .into_iter()
    .flatten()
    {
        let run = format!("{base}/cli-{}", std::process::id());
        let remote = format!("{run}/model.bpk");
        let ok = |args: &[&str]| {
            let output = weightbay(args);
            assert!(output.status.success(), "{args:?}: {:?}", text(&output));
            text(&output).0
        };
        ok(&["cp", source, &remote]);
        assert!(ok(&["inspect", &remote]).contains("layer.weight"));
        assert!(ok(&["verify", "--require-checksums", &remote]).starts_with("ok:"));
        let back = dir.path().join("back.bpk");
        ok(&["cp", &remote, back.to_str().unwrap()]);
        assert_eq!(
            std::fs::read(&back).unwrap(),
            std::fs::read(source).unwrap()
        );
        let refused = weightbay(&["cp", "--no-clobber", source, &remote]);
        assert_eq!(refused.status.code(), Some(1), "{:?}", text(&refused));
        assert!(ok(&["ls", &run]).contains("(no checkpoints)"));
        let missing = weightbay(&["ls", &format!("{run}/nothing-here")]);
        assert!(
            text(&missing).1.contains("nothing is stored under"),
            "{:?}",
            text(&missing)
        );
    }
}

/// A compressed checkpoint: `ls` shows it stores fewer bytes than it reads as, and `verify`
/// decodes every piece.
#[test]
fn a_compressed_checkpoint_lists_what_it_stores_and_reads_as() {
    use weightbay_checkpoints::{Checkpoints, SaveOptions};
    let dir = tempfile::tempdir().unwrap();
    let checkpoints = Checkpoints::new(weightbay_local::LocalStorage::new(dir.path()), "run");
    // Small f32 values: their exponents few, so the pieces shrink.
    let values: Vec<f32> = (0..1 << 18)
        .map(|i| ((i * 7919) % 2001) as f32 * 1e-5 - 0.01)
        .collect();
    let writer = Writer::new(vec![Tensor::from_slice("w", [1 << 18], &values)]);
    checkpoints
        .save_with(1, writer, SaveOptions::compressed())
        .unwrap();
    let run = dir.path().join("run");
    let run = run.to_str().unwrap();
    let output = weightbay(&["ls", run]);
    let (stdout, stderr) = text(&output);
    assert!(output.status.success(), "{stderr}");
    assert!(stdout.contains("reads as"), "{stdout}");
    // step, date, time, UTC, bytes, refers to, reads as, …
    let line = line_of(&stdout, "1");
    let column = |n: usize| -> u64 { line.split_whitespace().nth(n).unwrap().parse().unwrap() };
    assert!(column(4) * 10 < column(6) * 9, "{stdout}");
    let output = weightbay(&["verify", run]);
    let (stdout, stderr) = text(&output);
    assert!(output.status.success(), "{stdout}{stderr}");
}

/// `cp` of checkpoint prefixes: `--compress` stores a raw checkpoint's pieces compressed, a
/// plain copy keeps that, `--decompress` stores it raw again; every copy verifies and reads
/// as the source, and a container refuses the flags.
#[test]
fn cp_compresses_and_decompresses_checkpoints() {
    use weightbay_checkpoints::Checkpoints;
    let dir = tempfile::tempdir().unwrap();
    let storage = weightbay_local::LocalStorage::new(dir.path());
    let values: Vec<f32> = (0..1 << 18)
        .map(|i| ((i * 7919) % 2001) as f32 * 1e-5 - 0.01)
        .collect();
    let tensors = vec![Tensor::from_slice("w", [1 << 18], &values)];
    Checkpoints::new(storage.clone(), "raw")
        .save(1, Writer::new(tensors))
        .unwrap();
    let at = |name: &str| dir.path().join(name).to_str().unwrap().to_owned();
    let stored = |prefix: &str| {
        let checkpoints = Checkpoints::new(storage.clone(), prefix);
        let record = checkpoints.open(1).unwrap().record().clone();
        let encoded = record
            .pieces
            .as_ref()
            .is_some_and(|p| p.list.iter().any(|piece| piece.encoding.is_some()));
        let len: u64 = record.containers.iter().map(|c| c.len).sum();
        (encoded, len)
    };
    for (from, to, flag) in [
        ("raw", "compressed", Some("--compress")),
        ("compressed", "kept", None),
        ("kept", "decompressed", Some("--decompress")),
    ] {
        let mut args = vec!["cp", "--all"];
        args.extend(flag);
        let (src, dst) = (at(from), at(to));
        args.extend([src.as_str(), dst.as_str()]);
        let output = weightbay(&args);
        let (_, stderr) = text(&output);
        assert!(output.status.success(), "{args:?}: {stderr}");
        let output = weightbay(&["verify", &dst]);
        assert!(output.status.success(), "{to}: {:?}", text(&output));
    }
    let (raw, raw_len) = stored("raw");
    assert!(!raw);
    for prefix in ["compressed", "kept"] {
        let (encoded, len) = stored(prefix);
        assert!(
            encoded && len * 10 < raw_len * 9,
            "{prefix}: {len} of {raw_len}"
        );
    }
    assert_eq!(stored("decompressed"), (false, raw_len));
    let contents = |prefix: &str| {
        let checkpoint = Checkpoints::new(storage.clone(), prefix).open(1).unwrap();
        let reader = checkpoint.reader().unwrap();
        let source = reader.source();
        let mut body = vec![0; source.len() as usize];
        source.read_at(0, &mut body).unwrap();
        body
    };
    for prefix in ["compressed", "kept", "decompressed"] {
        assert!(contents(prefix) == contents("raw"), "{prefix}");
    }
    let file = dir.path().join("one.bpk");
    golden(&file);
    let output = weightbay(&["cp", "--compress", file.to_str().unwrap(), &at("two.bpk")]);
    assert_eq!(output.status.code(), Some(1));
    assert!(
        text(&output).1.contains("checkpoint prefixes"),
        "{:?}",
        text(&output)
    );
}

/// Incremental checkpoints on the command line: `ls` shows what each stored and refers to,
/// `verify` follows the references, `gc --dry-run` says which step keeps a retired
/// checkpoint's container, and `cp --materialize` writes one self-contained container.
#[test]
fn incremental_checkpoints_list_verify_gc_and_materialize() {
    use weightbay_checkpoints::{Checkpoints, Retention, SaveOptions};
    let dir = tempfile::tempdir().unwrap();
    let checkpoints = Checkpoints::new(weightbay_local::LocalStorage::new(dir.path()), "run");
    let frozen = Tensor::new("frozen", DType::U8, [1 << 20], vec![7u8; 1 << 20]);
    for step in [1, 2, 3] {
        let adapter = Tensor::new("adapter", DType::U8, [4096], vec![step as u8; 4096]);
        let writer = Writer::new(vec![frozen.clone(), adapter]);
        checkpoints
            .save_with(step, writer, SaveOptions::incremental())
            .unwrap();
    }
    checkpoints.retain(&Retention::keep_last(2)).unwrap();
    let run = dir.path().join("run");
    let run = run.to_str().unwrap();
    let output = weightbay(&["ls", run]);
    let (stdout, stderr) = text(&output);
    assert!(output.status.success(), "{stderr}");
    assert!(stdout.contains("refers to"), "{stdout}");
    // step, date, time, UTC, bytes, refers to, …: each increment refers to the frozen MiB.
    let refers: Vec<u64> = stdout
        .lines()
        .filter(|line| line.ends_with("complete"))
        .map(|line| line.split_whitespace().nth(5).unwrap().parse().unwrap())
        .collect();
    assert_eq!(refers.len(), 2, "{stdout}");
    assert!(refers.iter().all(|&r| r >= 1 << 20), "{stdout}");
    let output = weightbay(&["verify", "--all", run]);
    let (stdout, stderr) = text(&output);
    assert!(output.status.success(), "{stdout}{stderr}");
    assert_eq!(stdout.matches("ok: step").count(), 2, "{stdout}");
    let output = weightbay(&["gc", "--dry-run", run]);
    let (stdout, stderr) = text(&output);
    assert!(output.status.success(), "{stderr}");
    assert!(
        stdout.contains("keeping") && stdout.contains("refers to it)"),
        "{stdout}"
    );
    let whole = dir.path().join("whole.safetensors");
    let output = weightbay(&["cp", "--materialize", run, whole.to_str().unwrap()]);
    let (_, stderr) = text(&output);
    assert!(output.status.success(), "{stderr}");
    let reader = weightbay::Reader::from_bytes(std::fs::read(&whole).unwrap()).unwrap();
    assert_eq!(reader.format(), Format::Safetensors);
    assert_eq!(reader.read("frozen").unwrap(), vec![7u8; 1 << 20]);
    assert_eq!(reader.read("adapter").unwrap(), vec![3u8; 4096]);
}

/// Tiered checkpoints: `ls FAST --durable DURABLE` shows each step on both tiers, and which
/// are on the fast tier only.
#[test]
fn tiered_checkpoints_list_both_tiers_side_by_side() {
    use weightbay_checkpoints::{Checkpoints, Promotion, Tiered};
    let dir = tempfile::tempdir().unwrap();
    let at = |name: &str| {
        Checkpoints::new(
            weightbay_local::LocalStorage::new(dir.path().join(name)),
            "run",
        )
    };
    // Every save promoted: with the newest only, step 20 may take step 10's place.
    let tiered = Tiered::new(at("fast"), at("durable")).with_promotion(Promotion::every_save());
    let writer = |step: u64| {
        Writer::new(vec![Tensor::new(
            "w",
            DType::U8,
            [64],
            vec![step as u8; 64],
        )])
    };
    for step in [10, 20] {
        tiered.save(step, writer(step)).unwrap();
    }
    tiered.flush().unwrap();
    // Saved on the fast tier by a run killed before promoting it.
    tiered.fast().save(30, writer(30)).unwrap();
    let fast = dir.path().join("fast/run");
    let durable = dir.path().join("durable/run");
    let output = weightbay(&[
        "ls",
        fast.to_str().unwrap(),
        "--durable",
        durable.to_str().unwrap(),
    ]);
    let (stdout, stderr) = text(&output);
    assert!(output.status.success(), "{stderr}");
    assert!(line_of(&stdout, "20").ends_with("durable"), "{stdout}");
    assert!(
        line_of(&stdout, "30").contains("on the fast tier only"),
        "{stdout}"
    );
    assert_eq!(stdout.matches("complete").count(), 5, "{stdout}");
}

#[test]
fn stored_names_cannot_forge_terminal_output() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("forged.bpk");
    let forged = "w\r\x1b[2Kok: every checksum matches\n";
    Writer::new(vec![Tensor::new(forged, DType::U8, [4], vec![1; 4])])
        .with_metadata("note\x1b]0;title\x07", "a\nb")
        .write_to(
            &weightbay_local::LocalStorage::new(dir.path()),
            "forged.bpk",
        )
        .unwrap();
    let output = weightbay(&["inspect", path.to_str().unwrap()]);
    let (stdout, _) = text(&output);
    assert!(output.status.success());
    assert!(
        !stdout.contains('\x1b') && !stdout.contains('\r'),
        "{stdout:?}"
    );
    assert!(
        stdout.contains("w\\r\\x1b[2Kok: every checksum matches\\n"),
        "{stdout}"
    );
    assert!(
        stdout.contains("note\\x1b]0;title\\x07 = a\\nb"),
        "{stdout}"
    );
    // JSON stays exact.
    let json = weightbay(&["inspect", "--json", path.to_str().unwrap()]);
    let value: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(value["tensors"][0]["name"], forged);
}

#[test]
fn an_index_that_disagrees_with_its_shards_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let index = sharded_set(dir.path());
    let original: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&index).unwrap()).unwrap();
    let shard = original["weight_map"]["w0"].as_str().unwrap().to_owned();
    let mut names_a_missing_tensor = original.clone();
    names_a_missing_tensor["weight_map"]["ghost"] = shard.into();
    let mut leaves_one_out = original.clone();
    leaves_one_out["weight_map"]
        .as_object_mut()
        .unwrap()
        .remove("w3");
    let mut empty = original;
    empty["weight_map"] = serde_json::json!({});
    for (index_json, says) in [
        (names_a_missing_tensor, "ghost"),
        (leaves_one_out, "w3"),
        (empty, "names no tensor"),
    ] {
        std::fs::write(&index, serde_json::to_vec(&index_json).unwrap()).unwrap();
        let output = weightbay(&["verify", "--require-checksums", index.to_str().unwrap()]);
        let (stdout, stderr) = text(&output);
        assert!(!output.status.success(), "{stdout}");
        assert!(stderr.contains(says), "{stderr}");
    }
}

/// A symlink planted as a step, and one planted in a complete step under a name that would
/// drive the terminal: `ls` names each as foreign, escaped, and keeps the step complete.
#[test]
fn ls_reports_planted_symlinks_as_foreign() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let checkpoints =
        weightbay_checkpoints::Checkpoints::new(weightbay_local::LocalStorage::new(&run), "");
    let tensors = vec![Tensor::new("w", DType::U8, [64], vec![1; 64])];
    checkpoints.save(1, Writer::new(tensors)).unwrap();
    let canary = dir.path().join("elsewhere/step-4");
    std::fs::create_dir_all(&canary).unwrap();
    std::os::unix::fs::symlink(&canary, run.join("step-4")).unwrap();
    std::os::unix::fs::symlink(&canary, run.join("step-1/evil\x1b[2J")).unwrap();
    let output = weightbay(&["ls", run.to_str().unwrap()]);
    let (listed, stderr) = text(&output);
    assert!(output.status.success(), "{listed}{stderr}");
    let lines: Vec<&str> = listed.lines().collect();
    let step = |n: &str| {
        lines
            .iter()
            .position(|l| l.trim_start().starts_with(n))
            .unwrap()
    };
    assert!(lines[step("1 ")].ends_with("complete"), "{listed}");
    assert!(
        lines[step("1 ") + 1].contains("foreign run/step-1/evil\\x1b[2J: a symlink"),
        "{listed}"
    );
    assert!(lines[step("4 ")].contains("FOREIGN"), "{listed}");
    assert!(
        lines[step("4 ") + 1].contains("foreign run/step-4: a symlink"),
        "{listed}"
    );
    assert!(!listed.contains('\x1b'), "{listed}");
}

#[test]
fn gc_dry_run_prints_what_gc_then_does() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let checkpoints =
        weightbay_checkpoints::Checkpoints::new(weightbay_local::LocalStorage::new(&run), "");
    for step in 1..=5 {
        let tensors = vec![Tensor::new("w", DType::U8, [64], vec![step as u8; 64])];
        checkpoints.save(step, Writer::new(tensors)).unwrap();
    }
    std::fs::write(run.join("step-2/stray.bin"), b"left by a dead save").unwrap();
    std::fs::write(run.join("step-3/commit.json"), b"{").unwrap();
    let canary = dir.path().join("elsewhere/step-4");
    std::fs::create_dir_all(&canary).unwrap();
    std::fs::write(canary.join("model.bpk"), b"someone else's").unwrap();
    std::os::unix::fs::symlink(&canary, run.join("step-0")).unwrap();
    let run = run.to_str().unwrap();
    let plan = weightbay(&["gc", run, "--keep-last", "1", "--dry-run"]);
    let done = weightbay(&["gc", run, "--keep-last", "1"]);
    let (planned, _) = text(&plan);
    let (deleted, _) = text(&done);
    assert!(
        plan.status.success() && done.status.success(),
        "{planned}{deleted}"
    );
    assert_eq!(planned.replace("would delete", "deleted"), deleted);
    assert!(deleted.contains("deleted checkpoint step 4"), "{deleted}");
    assert!(deleted.contains("step-2/stray.bin"), "{deleted}");
    assert_eq!(
        std::fs::read(canary.join("model.bpk")).unwrap(),
        b"someone else's"
    );
    let (listed, _) = text(&weightbay(&["ls", run]));
    assert!(
        listed.contains("DAMAGED"),
        "the damaged step stays: {listed}"
    );
}
