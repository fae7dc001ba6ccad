//! The training loop of `train-resume`, killed with SIGKILL at random moments and started
//! again, ends with the same weights as a run never interrupted: on object_store's local files
//! always, and on the S3 server (moto) when one runs.

use std::os::unix::process::ExitStatusExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

mod common;

use common::Moments;

const PROGRAM: &str = env!("CARGO_BIN_EXE_train-resume");

/// Runs the loop to its end at `url` and returns what it printed, and what it said on
/// standard error.
fn run_to_end(url: &str) -> (String, String) {
    let output = Command::new(PROGRAM).arg(url).output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(output.status.success(), "{stderr}");
    (String::from_utf8(output.stdout).unwrap(), stderr)
}

/// Kills the loop at random moments until it finishes on its own (or 40 kills landed), then
/// runs it to its end and checks its result against an uninterrupted run's.
fn killed_and_resumed(base: &str) {
    let (reference, _) = run_to_end(&format!("{base}/reference"));
    let mut moments = Moments::from_env();
    let url = format!("{base}/killed");
    let mut kills = 0;
    for _ in 0..40 {
        let mut child = Command::new(PROGRAM)
            .arg(&url)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_millis(20 + moments.next(300));
        while Instant::now() < deadline && child.try_wait().unwrap().is_none() {
            std::thread::sleep(Duration::from_millis(2));
        }
        // SAFETY: a signal to a child this test started and has not reaped.
        unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
        let status = child.wait().unwrap();
        if status.signal() == Some(libc::SIGKILL) {
            kills += 1;
        } else {
            assert!(status.success(), "the loop failed on its own: {status}");
            break;
        }
    }
    assert!(
        kills > 0,
        "no kill landed: the loop ends before the first moment"
    );
    let (resumed, said) = run_to_end(&url);
    assert_eq!(resumed, reference, "after {kills} kills");
    // It went on from a checkpoint the killed runs left, not from the start.
    assert!(said.contains("resumed from step"), "{said}");
    eprintln!("{base}: {kills} kills, then {resumed}");
}

#[test]
fn killed_at_random_moments_it_resumes_to_the_same_weights_on_local_files() {
    let dir = tempfile::tempdir().unwrap();
    killed_and_resumed(&format!("file://{}", dir.path().display()));
}

#[test]
fn killed_at_random_moments_it_resumes_to_the_same_weights_on_the_s3_server() {
    let Some(url) = weightbay_conformance::s3_url() else {
        return;
    };
    let run = format!("{url}/kill-resume-{}", std::process::id());
    killed_and_resumed(&run);
}

#[test]
fn killed_at_random_moments_it_resumes_to_the_same_weights_on_azurite() {
    let Some(url) = weightbay_conformance::azure_url() else {
        return;
    };
    let run = format!("{url}/kill-resume-{}", std::process::id());
    killed_and_resumed(&run);
}
