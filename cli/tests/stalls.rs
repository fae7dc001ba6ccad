//! What `weightbay ls -v` says about stall detection: nothing to watch on local files, and
//! through a proxy holding answers from moto, how many requests were cut and retried.

use std::process::Command;

use weightbay::{DType, Tensor, Writer};
use weightbay_checkpoints::Checkpoints;
use weightbay_conformance::FaultProxy;

mod common;

use common::{text, weightbay};

fn model() -> Writer {
    Writer::new(vec![Tensor::new("w", DType::U8, [4096], vec![7; 4096])])
}

#[test]
fn ls_v_on_local_files_says_no_stall_detection_is_used() {
    let dir = tempfile::tempdir().unwrap();
    Checkpoints::new(weightbay_local::LocalStorage::new(dir.path()), "run")
        .save(1, model())
        .unwrap();
    let run = dir.path().join("run");
    let output = weightbay(&["ls", "-v", run.to_str().unwrap()]);
    let (stdout, stderr) = text(&output);
    assert!(output.status.success(), "{stderr}");
    assert!(stdout.contains("complete"), "{stdout}");
    assert!(stderr.contains("stall detection: not used"), "{stderr}");
}

#[test]
fn ls_v_counts_the_requests_stall_detection_cut() {
    let Some(base) = weightbay_conformance::s3_url() else {
        return;
    };
    let endpoint = std::env::var("AWS_ENDPOINT").expect("the S3 server's AWS_ENDPOINT");
    let prefix = format!("cli-stalls-{}", std::process::id());
    let url = format!("{base}/{prefix}");
    let storage = weightbay_object_store::open_url(&url, Vec::<(String, String)>::new()).unwrap();
    for step in [1, 2, 3] {
        Checkpoints::new(storage.clone(), "")
            .save(step, model())
            .unwrap();
    }
    // Every other GET held (the server accepts it, then nothing comes): `ls` reads a commit
    // record per step, and lists.
    let Some(proxy) = FaultProxy::start(
        &endpoint,
        r#"{"hold_share": 0.5, "share_methods": ["GET"], "seed": 11}"#,
    ) else {
        return;
    };
    let output = Command::new(env!("CARGO_BIN_EXE_weightbay"))
        .args(["ls", "-v", &url])
        .env("AWS_ENDPOINT", proxy.url())
        .env_remove("RUST_BACKTRACE")
        .output()
        .unwrap();
    let (stdout, stderr) = text(&output);
    assert!(output.status.success(), "{stderr}");
    assert_eq!(stdout.matches("complete").count(), 3, "{stdout}");
    let held = proxy.count("held");
    assert!(held > 0, "the proxy held no request");
    // "stall detection: C requests cut and retried; H of R ranged reads hedged"
    let counts: Vec<u64> = stderr
        .split("stall detection: ")
        .nth(1)
        .unwrap_or_else(|| panic!("no stall counts in: {stderr}"))
        .split_whitespace()
        .filter_map(|word| word.trim_end_matches(';').parse().ok())
        .collect();
    let [cut, hedged, _ranged] = counts[..] else {
        panic!("stall counts as {counts:?} in: {stderr}");
    };
    // Every held request was cut or hedged, the first one too (before the store had answered
    // anything), none left to the 30 s request timeout.
    assert!(
        cut + hedged >= held,
        "{held} held, {cut} cut, {hedged} hedged: {stderr}"
    );
}
