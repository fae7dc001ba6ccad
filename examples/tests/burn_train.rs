//! `burn-train` as a user runs it: on object_store's local files always, and on the S3 server
//! (moto) when one runs.

use std::process::Command;

fn run(url: &str) {
    let output = Command::new(env!("CARGO_BIN_EXE_burn-train"))
        .arg(url)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success() && stdout.contains("outputs equal"),
        "{stdout}{stderr}"
    );
    assert_eq!(stderr.matches("checkpointed step").count(), 3, "{stderr}");
}

#[test]
fn a_trained_burn_model_reloads_alike_from_local_files() {
    let dir = tempfile::tempdir().unwrap();
    run(&format!("file://{}/run", dir.path().display()));
}

#[test]
fn a_trained_burn_model_reloads_alike_from_the_s3_server() {
    let Some(url) = weightbay_conformance::s3_url() else {
        return;
    };
    run(&format!("{url}/burn-train-{}/run", std::process::id()));
}
