//! `candle-from-store` as a user runs it: on object_store's local files always, and on the S3
//! server (moto) when one runs.

use std::process::Command;

fn run(url: &str) {
    let output = Command::new(env!("CARGO_BIN_EXE_candle-from-store"))
        .arg(url)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success() && stdout.contains("outputs equal"),
        "{stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
}

#[test]
fn a_candle_model_loads_alike_from_local_files() {
    let dir = tempfile::tempdir().unwrap();
    run(&format!("file://{}/mlp.safetensors", dir.path().display()));
}

#[test]
fn a_candle_model_loads_alike_from_the_s3_server() {
    let Some(url) = weightbay_conformance::s3_url() else {
        return;
    };
    run(&format!(
        "{url}/candle-example-{}/mlp.safetensors",
        std::process::id()
    ));
}
