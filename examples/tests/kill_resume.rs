//! The training loop of `train-resume`, killed with SIGKILL at random moments and started
//! again, ends with the same weights as a run never interrupted: on object_store's local files
//! always, and on the S3 server (moto) when one runs; saving incrementally too, with a gc loop
//! and a reader checking every newest checkpoint running beside it.

use std::os::unix::process::ExitStatusExt;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

mod common;

use common::Moments;
use weightbay_checkpoints::Checkpoints;

const PROGRAM: &str = env!("CARGO_BIN_EXE_train-resume");

/// Runs the loop to its end at `url` and returns what it printed, and what it said on
/// standard error.
fn run_to_end(url: &str, args: &[&str]) -> (String, String) {
    let output = Command::new(PROGRAM).arg(url).args(args).output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(output.status.success(), "{stderr}");
    (String::from_utf8(output.stdout).unwrap(), stderr)
}

/// The uninterrupted run's result, and the window to kill the loop within: at most
/// [`KILL_WITHIN_MS`], and ending by three quarters of what that run took (kills come 20 ms
/// after the start at the earliest), so a kill lands while the loop still runs even where it
/// ends sooner than the window: on local files it takes about a third of a second here, and
/// a window past its end let it finish before the first kill.
fn reference(base: &str, args: &[&str]) -> (String, u64) {
    let started = Instant::now();
    let (reference, _) = run_to_end(&format!("{base}/reference"), args);
    let took = started.elapsed().as_millis() as u64;
    let within = (took * 3 / 4).saturating_sub(20).clamp(10, KILL_WITHIN_MS);
    (reference, within)
}

/// Starts the loop at `url` with `args` and kills it at a random moment up to `within` ms
/// after it starts, `rounds` times or until it finishes on its own; returns how many kills
/// landed.
fn kill_repeatedly(
    url: &str,
    args: &[&str],
    rounds: usize,
    within: u64,
    moments: &mut Moments,
) -> usize {
    let mut kills = 0;
    for _ in 0..rounds {
        let mut child = Command::new(PROGRAM)
            .arg(url)
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_millis(20 + moments.next(within));
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
    kills
}

/// How late after its start the loop may be killed, in milliseconds: long enough for its first
/// save to commit on the S3 server, so the killed runs make progress and the last resumes from
/// a checkpoint they left. On this machine the debug build's first commit there came 0.4-0.6 s
/// after the start (measured with the code before and after the check a save makes before its
/// commit alike), past the 320 ms this window was.
const KILL_WITHIN_MS: u64 = 900;

/// Kills the loop (run with `args`) at random moments until it finishes on its own (or 40
/// kills landed), then runs it to its end and checks its result against an uninterrupted
/// run's.
fn killed_and_resumed(base: &str, args: &[&str]) {
    let (reference, within) = reference(base, args);
    let mut moments = Moments::from_env();
    let url = format!("{base}/killed");
    let kills = kill_repeatedly(&url, args, 40, within, &mut moments);
    assert!(
        kills > 0,
        "no kill landed: the loop ends before the first moment"
    );
    let (resumed, said) = run_to_end(&url, args);
    assert_eq!(resumed, reference, "after {kills} kills");
    // It went on from a checkpoint the killed runs left, not from the start.
    assert!(said.contains("resumed from step"), "{said}");
    eprintln!("{base}: {kills} kills, then {resumed}");
}

/// As [`killed_and_resumed`], saving incrementally, while this process runs gc over the
/// same prefix again and again and checks every newest checkpoint it finds: complete means
/// every byte it refers to is there and matches its record.
fn killed_and_resumed_incrementally_beside_gc(base: &str) {
    let args = ["--incremental"];
    let (reference, within) = reference(base, &args);
    let url = format!("{base}/killed");
    let location = weightbay_location::Location::parse(&url).unwrap();
    let checkpoints = Checkpoints::over(Arc::clone(&location.storage), location.key.clone());
    let done = std::sync::atomic::AtomicBool::new(false);
    let (kills, checked) = std::thread::scope(|scope| {
        let watcher = scope.spawn(|| {
            let mut checked = 0;
            while !done.load(std::sync::atomic::Ordering::SeqCst) {
                checkpoints.gc().unwrap();
                if let Some(latest) = checkpoints.latest().unwrap() {
                    // Gone meanwhile (retention) is fine; wrong or missing bytes are not.
                    match latest.verify() {
                        Ok(_) => checked += 1,
                        Err(e) => {
                            let gone = matches!(
                                checkpoints.open(latest.step()),
                                Err(e) if e.kind() == weightbay::ErrorKind::NotFound
                            );
                            assert!(gone, "step {} is complete but: {e}", latest.step());
                        }
                    }
                }
            }
            checked
        });
        let mut moments = Moments::from_env();
        let kills = kill_repeatedly(&url, &args, 40, within, &mut moments);
        done.store(true, std::sync::atomic::Ordering::SeqCst);
        (kills, watcher.join().unwrap())
    });
    assert!(kills > 0, "no kill landed");
    let (resumed, said) = run_to_end(&url, &args);
    assert_eq!(resumed, reference, "after {kills} kills");
    assert!(said.contains("resumed from step"), "{said}");
    let latest = checkpoints.latest().unwrap().unwrap();
    assert!(
        latest.referenced_bytes() > 0,
        "the last save refers to nothing"
    );
    eprintln!(
        "{base}: {kills} kills, {checked} newest checkpoints verified beside gc, then {resumed}"
    );
}

#[test]
fn killed_at_random_moments_it_resumes_to_the_same_weights_on_local_files() {
    let dir = tempfile::tempdir().unwrap();
    killed_and_resumed(&format!("file://{}", dir.path().display()), &[]);
}

#[test]
fn killed_at_random_moments_it_resumes_to_the_same_weights_on_the_s3_server() {
    let Some(url) = weightbay_conformance::s3_url() else {
        return;
    };
    let run = format!("{url}/kill-resume-{}", std::process::id());
    killed_and_resumed(&run, &[]);
}

#[test]
fn saving_incrementally_beside_a_gc_loop_and_killed_it_resumes_to_the_same_weights_on_local_files()
{
    let dir = tempfile::tempdir().unwrap();
    killed_and_resumed_incrementally_beside_gc(&format!("file://{}", dir.path().display()));
}

#[test]
fn saving_incrementally_beside_a_gc_loop_and_killed_it_resumes_to_the_same_weights_on_the_s3_server()
 {
    let Some(url) = weightbay_conformance::s3_url() else {
        return;
    };
    let run = format!("{url}/kill-resume-incremental-{}", std::process::id());
    killed_and_resumed_incrementally_beside_gc(&run);
}

#[test]
fn killed_at_random_moments_it_resumes_to_the_same_weights_on_azurite() {
    let Some(url) = weightbay_conformance::azure_url() else {
        return;
    };
    let run = format!("{url}/kill-resume-{}", std::process::id());
    killed_and_resumed(&run, &[]);
}

#[test]
fn killed_savers_leave_no_upload_after_one_gc_on_the_s3_server() {
    let Some(base) = weightbay_conformance::s3_url() else {
        return;
    };
    let prefix = format!("kill-gc-{}", std::process::id());
    let url = format!("{base}/{prefix}");
    let mut moments = Moments::from_env();
    // 24 MiB checkpoints, each a multipart upload of three 8 MiB parts, so kills land in them.
    let args = ["--layer-mib", "12", "--every", "4", "--steps", "400"];
    let kills = kill_repeatedly(&url, &args, 20, 1500, &mut moments);
    assert!(kills > 0, "no kill landed");
    // Requests a killed process sent may still be landing.
    std::thread::sleep(Duration::from_secs(1));
    let location = weightbay_location::Location::parse(&url).unwrap();
    let open_before = weightbay_conformance::s3_open_uploads(&prefix).unwrap();
    let pending_before = location.storage.pending(&location.key).unwrap();
    let report = Checkpoints::over(Arc::clone(&location.storage), location.key.clone())
        .gc()
        .unwrap();
    eprintln!(
        "{kills} kills left {} open uploads and {} unfinished writes; one gc removed {} of them and {} stray containers",
        open_before.len(),
        pending_before.len(),
        report.pending.len(),
        report.orphans.len()
    );
    assert_eq!(
        weightbay_conformance::s3_open_uploads(&prefix).unwrap(),
        Vec::<String>::new(),
        "multipart uploads left open after gc"
    );
    assert_eq!(
        location.storage.pending(&location.key).unwrap(),
        [],
        "journals or staged objects left after gc"
    );
}
