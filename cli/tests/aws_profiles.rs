//! `weightbay` against the local S3 server with no `AWS_*` credentials, region or endpoint in
//! its environment: what the AWS CLI and boto3 find in `~/.aws/credentials` and
//! `~/.aws/config` (a temporary home) is what it uses. Anything that falls through to the
//! instance metadata endpoint meets a closed port on this machine.

use std::path::Path;
use std::process::{Command, Output};

use weightbay::{DType, Tensor, Writer};

/// The local S3 server's endpoint and bucket, or `None` (the test skips) without one.
fn server() -> Option<(String, String)> {
    let url = weightbay_conformance::s3_url()?;
    let endpoint = std::env::var("AWS_ENDPOINT").expect("the S3 server's AWS_ENDPOINT");
    let bucket = url.trim_start_matches("s3://").to_owned();
    Some((endpoint, bucket))
}

/// `weightbay ARGS` with every `AWS_*` variable removed, `HOME` at `home` and `vars` set.
fn weightbay(home: &Path, vars: &[(&str, &str)], args: &[&str]) -> Output {
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let metadata = format!("http://{}", closed.local_addr().unwrap());
    drop(closed);
    let mut command = Command::new(env!("CARGO_BIN_EXE_weightbay"));
    for (name, _) in std::env::vars() {
        if name.starts_with("AWS_") {
            command.env_remove(name);
        }
    }
    command
        .env("HOME", home)
        .env("AWS_METADATA_ENDPOINT", metadata)
        .envs(vars.iter().copied())
        .args(args)
        .output()
        .unwrap()
}

/// A small container at `path`.
fn container(path: &Path) {
    let tensor: Vec<u8> = (0..64).collect();
    let bytes = Writer::new(vec![Tensor::new("w", DType::U8, [64], tensor)])
        .into_bytes()
        .unwrap();
    std::fs::write(path, bytes).unwrap();
}

fn write_aws_file(home: &Path, name: &str, text: &str) {
    std::fs::create_dir_all(home.join(".aws")).unwrap();
    std::fs::write(home.join(".aws").join(name), text).unwrap();
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

#[test]
fn keys_region_and_endpoint_come_from_the_profile_aws_profile_names() {
    let Some((endpoint, bucket)) = server() else {
        return;
    };
    let home = tempfile::tempdir().unwrap();
    let source = home.path().join("model.bpk");
    container(&source);
    let remote = format!("s3://{bucket}/profiles-{}/model.bpk", std::process::id());
    let args = ["cp", source.to_str().unwrap(), remote.as_str()];

    // Nothing to go on: the error names the files it read.
    let output = weightbay(home.path(), &[], &args);
    assert_eq!(output.status.code(), Some(1), "{}", stderr(&output));
    assert!(
        stderr(&output).contains("~/.aws/credentials"),
        "{}",
        stderr(&output)
    );

    write_aws_file(
        home.path(),
        "credentials",
        "[default]\naws_access_key_id = nobody\naws_secret_access_key = nothing\n\n\
         [moto]\naws_access_key_id = test\naws_secret_access_key = test\n",
    );
    write_aws_file(
        home.path(),
        "config",
        &format!("[profile moto]\nregion = us-east-1\nendpoint_url = {endpoint}\n"),
    );
    let output = weightbay(home.path(), &[("AWS_PROFILE", "moto")], &args);
    assert!(output.status.success(), "{}", stderr(&output));
    let output = weightbay(
        home.path(),
        &[("AWS_PROFILE", "moto")],
        &["verify", &remote],
    );
    assert!(output.status.success(), "{}", stderr(&output));

    // A profile that is nowhere is named in the error.
    let output = weightbay(
        home.path(),
        &[("AWS_PROFILE", "absent")],
        &["verify", &remote],
    );
    assert_eq!(output.status.code(), Some(1));
    assert!(stderr(&output).contains("`absent`"), "{}", stderr(&output));
}

#[test]
fn a_profile_s_credential_process_is_run() {
    let Some((endpoint, bucket)) = server() else {
        return;
    };
    let home = tempfile::tempdir().unwrap();
    let ran = home.path().join("ran");
    let script = home.path().join("credentials.sh");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\necho ran >> '{}'\n\
             echo '{{\"Version\": 1, \"AccessKeyId\": \"test\", \"SecretAccessKey\": \"test\"}}'\n",
            ran.display()
        ),
    )
    .unwrap();
    write_aws_file(
        home.path(),
        "config",
        &format!(
            "[default]\nregion = us-east-1\nendpoint_url = {endpoint}\n\
             credential_process = sh '{}'\n",
            script.display()
        ),
    );
    let source = home.path().join("model.bpk");
    container(&source);
    let remote = format!("s3://{bucket}/process-{}/model.bpk", std::process::id());
    let output = weightbay(home.path(), &[], &["cp", source.to_str().unwrap(), &remote]);
    assert!(output.status.success(), "{}", stderr(&output));
    assert!(ran.exists(), "the credential process did not run");
}
