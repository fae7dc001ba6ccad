//! Four `rank-writer` processes save each step of a sharded model, one of them SIGKILLed at a
//! random moment in every round, on the local backend and on the S3 server (moto): a reader
//! polling all the while never sees a step complete unless all four rank manifests are
//! written, and once the killed rank reruns, the step commits and loads byte for byte as a
//! single-process save of the same tensors.

use std::os::unix::process::ExitStatusExt;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use weightbay::Storage;
use weightbay_checkpoints::{Checkpoints, StepState};

mod common;

use common::Moments;

const PROGRAM: &str = env!("CARGO_BIN_EXE_rank-writer");
const WORLD: u32 = 4;
const ROUNDS: u64 = 10;

fn rank_writer(args: &[String]) -> Command {
    let mut command = Command::new(PROGRAM);
    command
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    command
}

fn run_to_end(args: &[String]) -> String {
    let output = rank_writer(args).output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "rank-writer {args:?}: {stderr}");
    String::from_utf8(output.stdout).unwrap()
}

/// Fails if a step lists as complete without all four rank manifests.
fn check_complete_means_all_manifests(checkpoints: &Checkpoints, context: &str) {
    for status in checkpoints.list().unwrap() {
        if status.state == StepState::Complete {
            let written = status.ranks.as_ref().map_or(0, |p| p.written.len());
            assert_eq!(
                written, WORLD as usize,
                "{context}: step {} is complete with {written} manifests",
                status.step
            );
        }
    }
}

fn killed_ranks_commit_once_rerun(url: &str, checkpoints: &Checkpoints, reference_url: &str) {
    let args = |step: u64, rank: u32| -> Vec<String> {
        vec![
            url.to_owned(),
            step.to_string(),
            rank.to_string(),
            WORLD.to_string(),
        ]
    };
    let mut moments = Moments::from_env();
    // Round 0 runs unkilled, and says how long a round takes here.
    let started = Instant::now();
    let children: Vec<Child> = (0..WORLD)
        .map(|r| rank_writer(&args(0, r)).spawn().unwrap())
        .collect();
    for child in children {
        assert!(child.wait_with_output().unwrap().status.success());
    }
    let round_ms = started.elapsed().as_millis() as u64;
    assert_eq!(checkpoints.steps().unwrap(), [0]);
    let mut landed = Vec::new();
    for step in 1..=ROUNDS {
        let victim = moments.next(u64::from(WORLD)) as u32;
        let moment = Duration::from_millis(moments.next(round_ms));
        let started = Instant::now();
        let mut children: Vec<Option<Child>> = (0..WORLD)
            .map(|r| Some(rank_writer(&args(step, r)).spawn().unwrap()))
            .collect();
        let mut killed = false;
        while children.iter().any(Option::is_some) {
            check_complete_means_all_manifests(checkpoints, &format!("round {step}"));
            if !killed && started.elapsed() >= moment {
                if let Some(child) = &children[victim as usize] {
                    // SAFETY: a signal to a child this test started and has not reaped.
                    unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
                }
                killed = true;
            }
            for (rank, slot) in children.iter_mut().enumerate() {
                if let Some(child) = slot
                    && let Some(status) = child.try_wait().unwrap()
                {
                    let output = slot.take().unwrap().wait_with_output().unwrap();
                    let killed_here = status.signal() == Some(libc::SIGKILL);
                    assert!(
                        status.success() || (killed_here && rank == victim as usize),
                        "round {step}, rank {rank}: {status}: {}",
                        String::from_utf8_lossy(&output.stderr)
                    );
                    if killed_here {
                        landed.push((step, victim, moment.as_millis()));
                    }
                }
            }
            std::thread::sleep(Duration::from_millis(3));
        }
        check_complete_means_all_manifests(checkpoints, &format!("after round {step}"));
        let said = run_to_end(&args(step, victim));
        assert!(
            said.contains("committed"),
            "round {step}: the rerun of rank {victim} said {said}"
        );
        let checkpoint = checkpoints.open(step).unwrap();
        checkpoint.verify().unwrap();
        run_to_end(&[
            reference_url.to_owned(),
            step.to_string(),
            "--single".to_owned(),
        ]);
        let reference = checkpoints_at(reference_url)
            .open(step)
            .unwrap()
            .reader()
            .unwrap();
        let weights = checkpoint.assembled().unwrap();
        for info in reference.tensors() {
            assert_eq!(
                weights.read(info.name()).unwrap().to_vec().unwrap(),
                reference.read(info.name()).unwrap(),
                "round {step}: tensor {} differs from a single-process save",
                info.name()
            );
        }
        // Any rank count loads the same bytes.
        let loaded: Vec<String> = [1, 3]
            .map(|n| {
                run_to_end(&[
                    url.to_owned(),
                    step.to_string(),
                    "--load".into(),
                    n.to_string(),
                ])
            })
            .into();
        assert_eq!(loaded[0], loaded[1]);
    }
    eprintln!(
        "{url}: a round takes {round_ms} ms; kills landed (step, rank, ms) {landed:?} of {ROUNDS} rounds"
    );
    assert!(!landed.is_empty(), "no kill landed in {ROUNDS} rounds");
}

fn checkpoints_at(url: &str) -> Checkpoints {
    if url.contains("://") {
        let location = weightbay_location::Location::parse(url).unwrap();
        return Checkpoints::over(location.storage, location.key);
    }
    let storage: Arc<dyn Storage> = Arc::new(weightbay_local::LocalStorage::new(url));
    Checkpoints::over(storage, "")
}

#[test]
fn four_rank_processes_killed_at_random_commit_once_on_the_local_backend() {
    let dir = tempfile::tempdir().unwrap();
    let url = dir.path().join("run").display().to_string();
    let reference = dir.path().join("single").display().to_string();
    killed_ranks_commit_once_rerun(&url, &checkpoints_at(&url), &reference);
}

#[test]
fn four_rank_processes_killed_at_random_commit_once_on_the_s3_server() {
    let Some(base) = weightbay_conformance::s3_url() else {
        return;
    };
    let url = format!("{base}/ranks-{}", std::process::id());
    let reference = format!("{base}/single-{}", std::process::id());
    killed_ranks_commit_once_rerun(&url, &checkpoints_at(&url), &reference);
}
