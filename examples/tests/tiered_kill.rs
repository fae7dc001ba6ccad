//! The training loop of `train-resume`, saving through tiered checkpoints (a local directory
//! promoted to the durable tier), killed with SIGKILL at random moments (during a local save,
//! during a promotion, between them) and started again: each restart resumes from the newest
//! step complete on either tier, and the run ends with the weights of one never interrupted.
//! With the local directory deleted before the restart (the machine lost), it resumes from the
//! durable tier. On moto when it runs, and always with a second local directory as the
//! durable tier.

use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

mod common;

use common::Moments;
use weightbay_checkpoints::Checkpoints;

const PROGRAM: &str = env!("CARGO_BIN_EXE_train-resume");

fn checkpoints_at(url: &str) -> Checkpoints {
    let location = weightbay_location::Location::parse(url).unwrap();
    Checkpoints::over(location.storage, location.key)
}

/// The newest step complete on the durable tier.
fn newest_durable(durable: &str) -> Option<u64> {
    checkpoints_at(durable).steps().unwrap().last().copied()
}

/// The newest step complete on either tier, as a separate reader finds it: the fast tier's
/// verified against their records.
fn newest_complete(fast: &str, durable: &str) -> Option<u64> {
    let fast = checkpoints_at(fast);
    let on_fast = fast
        .steps()
        .unwrap_or_default()
        .into_iter()
        .rev()
        .find(|&step| fast.open(step).and_then(|c| c.verify()).is_ok());
    on_fast.max(newest_durable(durable))
}

/// The step a run resumed from, from what it said on standard error.
fn resumed_from(said: &str) -> Option<u64> {
    said.lines()
        .find_map(|line| line.strip_prefix("resumed from step "))
        .map(|step| step.trim().parse().unwrap())
}

/// Runs the loop with `args` to its end and returns what it printed and said.
fn run_to_end(args: &[&str]) -> (String, String) {
    let output = Command::new(PROGRAM).args(args).output().unwrap();
    let said = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(output.status.success(), "{said}");
    (String::from_utf8(output.stdout).unwrap(), said)
}

/// Requires a run that said `said` to have resumed from `expected` or newer: a request a
/// killed run sent may still land after `expected` was taken (a commit record on S3), never
/// anything older.
fn check_resumed(said: &str, expected: Option<u64>, context: &str) {
    let resumed = resumed_from(said);
    assert!(
        resumed >= expected,
        "{context}: resumed from {resumed:?}, step {expected:?} was complete: {said}"
    );
}

/// Kills the tiered loop at random moments until it finishes on its own (or `rounds` kills
/// landed); before each start, notes the newest step complete on either tier, and requires the
/// run to resume from it (or newer). Returns how many kills landed.
fn kill_and_check_resumes(fast: &str, durable: &str, rounds: usize, dir: &Path) -> usize {
    let mut moments = Moments::from_env();
    let mut kills = 0;
    for round in 0..rounds {
        let expected = newest_complete(fast, durable);
        let said = dir.join(format!("stderr-{round}"));
        let mut child = Command::new(PROGRAM)
            .args([fast, "--durable", durable])
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&said).unwrap())
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_millis(20 + moments.next(400));
        while Instant::now() < deadline && child.try_wait().unwrap().is_none() {
            std::thread::sleep(Duration::from_millis(2));
        }
        // SAFETY: a signal to a child this test started and has not reaped.
        unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
        let status = child.wait().unwrap();
        let said = std::fs::read_to_string(&said).unwrap();
        // A run killed before it looked says nothing; one that looked names the step.
        if said.contains("resumed from step") {
            check_resumed(&said, expected, &format!("round {round}"));
        }
        if status.signal() == Some(libc::SIGKILL) {
            kills += 1;
        } else {
            assert!(
                status.success(),
                "the loop failed on its own: {status}: {said}"
            );
            break;
        }
    }
    kills
}

/// Both scenarios with the durable tier at `durable` (a URL prefix of its own).
fn tiered_runs_resume_after_kills_and_machine_loss(durable: &str) {
    let dir = tempfile::tempdir().unwrap();
    let local = |name: &str| format!("file://{}/{name}", dir.path().display());
    let (reference, _) = run_to_end(&[
        &local("reference"),
        "--durable",
        &format!("{durable}/reference"),
    ]);

    // Killed at random moments, then run to its end.
    let (fast, remote) = (local("killed"), format!("{durable}/killed"));
    let kills = kill_and_check_resumes(&fast, &remote, 30, dir.path());
    assert!(kills > 0, "no kill landed");
    let expected = newest_complete(&fast, &remote);
    let (resumed, said) = run_to_end(&[&fast, "--durable", &remote]);
    assert_eq!(resumed, reference, "after {kills} kills");
    assert!(expected.is_some(), "no checkpoint after {kills} kills");
    check_resumed(&said, expected, "the last run");

    // Killed, and the machine lost with its local directory: the durable tier serves.
    let (fast, remote) = (local("lost"), format!("{durable}/lost"));
    let mut lost_after = 0;
    for _ in 0..5 {
        lost_after += kill_and_check_resumes(&fast, &remote, 3, dir.path());
        if newest_durable(&remote).is_some() {
            break;
        }
    }
    let on_durable = newest_durable(&remote);
    assert!(on_durable.is_some(), "nothing reached the durable tier");
    std::fs::remove_dir_all(dir.path().join("lost")).unwrap();
    let (resumed, said) = run_to_end(&[&fast, "--durable", &remote]);
    assert_eq!(resumed, reference, "after the machine was lost");
    check_resumed(&said, on_durable, "after the machine was lost");
    eprintln!(
        "{durable}: {kills} kills then {}; lost the machine after {lost_after} kills, \
         resumed from the durable tier's step {}",
        resumed.trim(),
        on_durable.unwrap_or_default()
    );
}

#[test]
fn tiered_runs_resume_from_the_newest_tier_after_kills_and_machine_loss_on_local_disks() {
    let dir = tempfile::tempdir().unwrap();
    tiered_runs_resume_after_kills_and_machine_loss(&format!(
        "file://{}/durable",
        dir.path().display()
    ));
}

#[test]
fn tiered_runs_resume_from_the_newest_tier_after_kills_and_machine_loss_with_s3_durable() {
    let Some(url) = weightbay_conformance::s3_url() else {
        return;
    };
    tiered_runs_resume_after_kills_and_machine_loss(&format!(
        "{url}/tiered-kill-{}",
        std::process::id()
    ));
}
