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
    let Ok(url) = std::env::var("WEIGHTBAY_S3_URL") else {
        assert!(
            std::env::var("WEIGHTBAY_REQUIRE_SERVERS").as_deref() != Ok("1"),
            "WEIGHTBAY_REQUIRE_SERVERS=1 but WEIGHTBAY_S3_URL is unset"
        );
        eprintln!("skipped: no S3 server (vars=$(scripts/servers.sh start s3) && eval \"$vars\")");
        return;
    };
    run(&format!(
        "{url}/candle-example-{}/mlp.safetensors",
        std::process::id()
    ));
}
