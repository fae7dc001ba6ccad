//! The object-store backend against the S3 server (moto) behind a proxy that misbehaves as
//! stores do at scale: throttling (503 SlowDown, 429), connections reset mid-body, requests
//! that never answer, per-prefix rate limits, refusals. Saves and loads either come through
//! byte for byte or fail with an error that names the key, the part and the store's answer.

mod support;

use std::time::Duration;

use object_store::{BackoffConfig, RetryConfig};
use support::SMALL_PARTS;
use weightbay::{DType, ErrorKind, Reader, Storage, Tensor, WriteMode, Writer};
use weightbay_checkpoints::{Checkpoints, RankOutcome, RankSave, Region, SaveOptions};
use weightbay_conformance::FaultProxy;
use weightbay_object_store::{
    MIN_PART_SIZE, ObjectStorage, ObjectStoreOptions, StallDetection, open_url_with_retry,
};

/// Retries as object_store makes them, with short backoffs so a test takes seconds.
fn quick_retries(max_retries: usize) -> RetryConfig {
    RetryConfig {
        backoff: BackoffConfig {
            init_backoff: Duration::from_millis(10),
            max_backoff: Duration::from_millis(200),
            base: 2.0,
        },
        max_retries,
        retry_timeout: Duration::from_secs(120),
    }
}

/// The server a proxy stands in front of.
#[derive(Debug, Clone, Copy)]
enum Server {
    /// moto.
    S3,
    /// The GCS fixture.
    Gcs,
    /// Azurite.
    Azure,
}

/// Azurite's well-known account key, which every emulator user has.
const AZURITE_KEY: &str =
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==";

/// A proxy in front of the S3 server injecting `faults`, and a storage under a fresh prefix
/// that talks through it with a per-request `timeout`; `None` when the servers are not running.
fn through_proxy(
    faults: &str,
    timeout: &str,
    retry: RetryConfig,
) -> Option<(FaultProxy, ObjectStorage)> {
    through_proxy_at(&unique(), faults, timeout, retry)
}

/// [`through_proxy`] under a prefix of the caller's choice.
fn through_proxy_at(
    prefix: &str,
    faults: &str,
    timeout: &str,
    retry: RetryConfig,
) -> Option<(FaultProxy, ObjectStorage)> {
    proxied(Server::S3, prefix, faults, timeout, retry)
}

/// A proxy in front of `server` injecting `faults`, and a storage under `prefix` through it.
fn proxied(
    server: Server,
    prefix: &str,
    faults: &str,
    timeout: &str,
    retry: RetryConfig,
) -> Option<(FaultProxy, ObjectStorage)> {
    let (base, endpoint_variable, endpoint_option) = match server {
        Server::S3 => (
            weightbay_conformance::s3_url()?,
            "AWS_ENDPOINT",
            "aws_endpoint",
        ),
        Server::Azure => (
            weightbay_conformance::azure_url()?,
            "AZURITE_BLOB_STORAGE_URL",
            "azure_storage_endpoint",
        ),
        Server::Gcs => match std::env::var("WEIGHTBAY_GCS_URL") {
            Ok(url) => (url, "GCS_ENDPOINT", "google_base_url"),
            Err(_) if std::env::var("WEIGHTBAY_REQUIRE_SERVERS").is_ok_and(|v| v == "1") => {
                panic!("WEIGHTBAY_REQUIRE_SERVERS=1 but WEIGHTBAY_GCS_URL is unset")
            }
            Err(_) => {
                eprintln!(
                    "skipped: no GCS server (vars=$(scripts/servers.sh start gcs) && eval \"$vars\")"
                );
                return None;
            }
        },
    };
    let endpoint = std::env::var(endpoint_variable).ok()?;
    let proxy = FaultProxy::start(&endpoint, faults)?;
    let url = format!("{base}/store-faults/{prefix}");
    let mut options = vec![
        (endpoint_option, proxy.url()),
        ("timeout", timeout.to_owned()),
    ];
    if let Server::Azure = server {
        // The emulator's own settings send every request to AZURITE_BLOB_STORAGE_URL: an
        // account at an endpoint of its own sends them through the proxy, in the paths
        // Azurite takes (the account first), signed with the emulator's key.
        options = vec![
            (endpoint_option, format!("{}/devstoreaccount1", proxy.url())),
            ("timeout", timeout.to_owned()),
            ("azure_storage_use_emulator", "false".to_owned()),
            ("azure_storage_account_name", "devstoreaccount1".to_owned()),
            ("azure_storage_account_key", AZURITE_KEY.to_owned()),
            ("allow_http", "true".to_owned()),
        ];
    }
    let storage =
        open_url_with_retry(&url, options, retry).unwrap_or_else(|e| panic!("opening {url}: {e}"));
    let parts = ObjectStoreOptions::DEFAULT
        .with_part_size(MIN_PART_SIZE)
        .with_parts_in_flight(3)
        .with_stale_after(SMALL_PARTS.stale_after);
    Some((proxy, storage.with_options(parts)))
}

fn unique() -> String {
    use std::hash::BuildHasher;
    let random = std::collections::hash_map::RandomState::new().hash_one(0u8);
    format!("{}-{random:x}", std::process::id())
}

/// A container of `parts` multipart parts and a bit, tensors of 1 MiB.
fn container(parts: usize, fill: u8) -> Writer {
    Writer::new(
        (0..parts * 5 + 1)
            .map(|i| {
                let data = vec![fill.wrapping_add(i as u8); 1 << 20];
                Tensor::new(format!("t{i}"), DType::U8, [1 << 20], data)
            })
            .collect(),
    )
}

/// Reads the key back through single and batched reads and checks it against `expected`.
fn assert_stored(storage: &ObjectStorage, key: &str, expected: &[u8]) {
    let source = storage
        .open(key)
        .unwrap_or_else(|e| panic!("open {key}: {e}"));
    let mut bytes = vec![0; expected.len()];
    source
        .read_at(0, &mut bytes)
        .unwrap_or_else(|e| panic!("read {key}: {e}"));
    assert!(
        bytes == expected,
        "{key} came back different through read_at"
    );
    let reader = Reader::open(source).unwrap_or_else(|e| panic!("Reader::open {key}: {e}"));
    reader
        .verify()
        .unwrap_or_else(|e| panic!("verify {key}: {e}"));
    let expected = Reader::from_bytes(expected.to_vec()).expect("the expected container opens");
    for (info, tensor) in reader
        .load_all()
        .unwrap_or_else(|e| panic!("load_all {key}: {e}"))
    {
        assert!(
            tensor.to_vec().ok() == expected.read(info.name()).ok(),
            "{key}: {} came back different through load_all",
            info.name()
        );
    }
}

/// Saves, create-new, listing and loads of a container of several parts, each through the
/// proxy's `faults`: all come through, byte for byte. Returns how often the proxy did `what`.
fn survives(faults: &str, what: &str) -> Option<u64> {
    survives_on(Server::S3, faults, what)
}

/// [`survives`] through a proxy in front of `server`.
fn survives_on(server: Server, faults: &str, what: &str) -> Option<u64> {
    let (proxy, storage) = proxied(server, &unique(), faults, "30s", quick_retries(10))?;
    let expected = container(2, 1).into_bytes().expect("a container");
    for (key, mode) in [
        ("a.bpk", WriteMode::Overwrite),
        ("b.bpk", WriteMode::CreateNew),
    ] {
        container(2, 1)
            .with_mode(mode)
            .write_to(&storage, key)
            .unwrap_or_else(|e| panic!("{mode:?} save of {key} through {faults}: {e}"));
        assert_stored(&storage, key, &expected);
    }
    let listed = storage.list("").unwrap_or_else(|e| panic!("list: {e}"));
    let keys: Vec<&str> = listed.iter().map(|l| l.key.as_str()).collect();
    assert_eq!(keys, ["a.bpk", "b.bpk"], "listing through {faults}");
    let refused = container(0, 1)
        .with_mode(WriteMode::CreateNew)
        .write_to(&storage, "b.bpk")
        .expect_err("b.bpk exists");
    assert_eq!(refused.kind(), ErrorKind::AlreadyExists, "{refused}");
    Some(proxy.count(what))
}

#[test]
fn a_slowdown_storm_is_survived() {
    let Some(injected) = survives(
        r#"{"status_share": 0.2, "status": 503, "seed": 1}"#,
        "status",
    ) else {
        return;
    };
    assert!(injected > 0, "the proxy answered no request with 503");
}

#[test]
fn too_many_requests_are_survived() {
    let Some(injected) = survives(
        r#"{"status_share": 0.2, "status": 429, "seed": 2}"#,
        "status",
    ) else {
        return;
    };
    assert!(injected > 0, "the proxy answered no request with 429");
}

#[test]
fn responses_reset_mid_body_are_survived() {
    let Some(injected) = survives(r#"{"reset_share": 0.1, "seed": 3}"#, "reset") else {
        return;
    };
    assert!(injected > 0, "the proxy reset no response");
}

#[test]
fn requests_reset_mid_body_are_survived() {
    let Some(injected) = survives(
        r#"{"request_reset_share": 0.1, "seed": 4}"#,
        "request_reset",
    ) else {
        return;
    };
    assert!(injected > 0, "the proxy reset no request");
}

#[test]
fn the_gcs_and_azure_servers_through_the_proxy_survive_throttling_and_resets() {
    for server in [Server::Gcs, Server::Azure] {
        survives_throttling_and_resets(server);
    }
}

/// [`survives_on`] `server` through 503s, 429s, and responses and requests reset mid-body.
fn survives_throttling_and_resets(server: Server) {
    for (faults, what) in [
        (
            r#"{"status_share": 0.2, "status": 503, "seed": 5}"#,
            "status",
        ),
        (
            r#"{"status_share": 0.2, "status": 429, "seed": 6}"#,
            "status",
        ),
        (r#"{"reset_share": 0.1, "seed": 7}"#, "reset"),
        (
            r#"{"request_reset_share": 0.1, "seed": 8}"#,
            "request_reset",
        ),
    ] {
        let Some(injected) = survives_on(server, faults, what) else {
            return;
        };
        assert!(
            injected > 0,
            "{server:?}: the proxy injected no {what} with {faults}"
        );
    }
}

/// A container of three parts and a bit saved through `storage` and read back every way.
fn round_trip(storage: &ObjectStorage, key: &str) {
    let expected = container(3, 2).into_bytes().expect("a container");
    container(3, 2)
        .write_to(storage, key)
        .unwrap_or_else(|e| panic!("save of {key}: {e:#}"));
    assert_stored(storage, key, &expected);
}

#[test]
fn stalled_answers_are_cut_and_retried_and_every_byte_comes_through() {
    // Seeds whose first two draws inject nothing: a store that has not answered yet gives
    // stall detection nothing to go by, and such a request waits for the request timeout.
    // Each fault, and whether every one it injects must be cut (or hedged):
    // a trickle that ends within the floor (the rest of a short body) is not, and neither is
    // a held DELETE, which object_store does not repeat, so the proxy holds no DELETE; and
    // only the bodies of objects read and of multipart starts and completions are watched
    // (not listings'), so only those stop or trickle.
    let faults = [
        (
            r#"{"hold_share": 0.1, "share_methods": ["GET", "HEAD", "PUT", "POST"], "seed": 45}"#,
            "held",
            true,
        ),
        (
            r#"{"slow_first_byte_share": 0.15, "slow_first_byte_s": 8,
                "share_methods": ["GET", "HEAD", "PUT", "POST"], "seed": 45}"#,
            "slow_first_byte",
            true,
        ),
        (
            r#"{"half_body_stall_share": 0.15, "share_methods": ["GET"], "seed": 45}"#,
            "half_body_stalled",
            true,
        ),
        (
            r#"{"drip_share": 0.15, "share_methods": ["GET"], "seed": 44}"#,
            "dripped",
            false,
        ),
        // Starting and completing the upload: the sink starts again, or finds it landed.
        (
            r#"{"half_body_stall_share": 0.5, "share_methods": ["POST"], "seed": 3}"#,
            "half_body_stalled",
            true,
        ),
    ];
    for server in [Server::S3, Server::Gcs, Server::Azure] {
        for (faults, what, every_one) in faults {
            // Azure uploads blocks and commits their list with PUTs: no POST to stall.
            if let (Server::Azure, true) = (server, faults.contains(r#"["POST"]"#)) {
                continue;
            }
            // A request timeout of 15 s bounds what a stall that is not detected costs, and
            // leaves stall detection room on a loaded machine, where what it expects grows.
            let Some((proxy, storage)) =
                proxied(server, &unique(), faults, "15s", quick_retries(10))
            else {
                return;
            };
            // A lower floor than the default's 2 s, so the test spends less time on each cut.
            let quick = StallDetection::DEFAULT.with_floor(Duration::from_millis(500));
            let options = storage.options().with_stall_detection(Some(quick));
            let storage = storage.with_options(options);
            let started = std::time::Instant::now();
            round_trip(&storage, "stalls.bpk");
            let injected = proxy.count(what);
            let counts = storage.stall_watch().expect("a stall watch").counts();
            eprintln!(
                "{server:?} through {faults}: {injected} {what} of {} requests, {counts:?}, {:.1} s",
                proxy.count("requests"),
                started.elapsed().as_secs_f64()
            );
            assert!(injected > 0, "{server:?}: the proxy injected no {what}");
            // A hedge's second copy draws its own fault: one held while the first answered is
            // dropped, neither cut nor won, so every hedge counts as handling one.
            let cut = counts.cut() + counts.hedged;
            assert!(
                if every_one { cut >= injected } else { cut > 0 },
                "{server:?}: {injected} {what} and {cut} cut or hedged: {counts:?}"
            );
        }
    }
}

/// Reads `key` through `storage` in requests of 1 MiB (many ranged GETs), checking every byte.
fn read_in_ranges(storage: ObjectStorage, key: &str, expected: &[u8]) -> ObjectStorage {
    let options = storage.options().with_fetch_request_len(Some(1 << 20));
    let storage = storage.with_options(options);
    assert_stored(&storage, key, expected);
    storage
}

#[test]
fn a_read_whose_answer_is_late_is_hedged_and_the_first_answer_is_read() {
    let prefix = unique();
    let Some((_clean, writer)) = through_proxy_at(&prefix, "{}", "30s", quick_retries(3)) else {
        return;
    };
    let expected = container(3, 16).into_bytes().expect("a container");
    container(3, 16)
        .write_to(&writer, "late.bpk")
        .expect("the save");
    // One answer in 25 begins 8 s late: with this seed the proxy's 23rd answer, once a score of
    // quick answers has set the 95th percentile the hedge waits for. (At a tenth, the 3rd,
    // 5th and 6th were late too: answers before any percentile, or whose late samples had
    // already raised it to 8 s, so whether a hedge won hung on timing, and under load none
    // did.) The stall floor is above 8 s, so only hedging makes that read quick; half the
    // reads may be hedged.
    let faults = r#"{"slow_first_byte_share": 0.04, "slow_first_byte_s": 8, "seed": 41}"#;
    let Some((proxy, storage)) = through_proxy_at(&prefix, faults, "30s", quick_retries(3)) else {
        return;
    };
    let hedging = StallDetection::DEFAULT
        .with_floor(Duration::from_secs(20))
        .with_hedged_reads_percent(50);
    let options = storage.options().with_stall_detection(Some(hedging));
    let storage = storage.with_options(options);
    let storage = read_in_ranges(storage, "late.bpk", &expected);
    let counts = storage.stall_watch().expect("a stall watch").counts();
    assert!(proxy.count("slow_first_byte") > 0, "no answer was late");
    assert!(counts.hedges_won > 0, "no hedge answered first: {counts:?}");
    assert_eq!(counts.cut(), 0, "{counts:?}");
}

#[test]
fn a_store_that_answers_every_read_late_is_slow_not_stalled() {
    // moto reads a whole object for every ranged GET of it, so a GET of a large object answers
    // seconds late, every time, while its other answers come at once. Here every GET answers
    // 1.5 s late, past the 1 s floor the store's quick answers leave as the allowance: each
    // try of a read used to be cut at the same allowance, and the read failed.
    let faults =
        r#"{"slow_first_byte_share": 1.0, "slow_first_byte_s": 1.5, "share_methods": ["GET"]}"#;
    let Some((proxy, storage)) = through_proxy(faults, "30s", quick_retries(3)) else {
        return;
    };
    let floor = StallDetection::DEFAULT
        .with_floor(Duration::from_secs(1))
        .with_hedged_reads_percent(50);
    let options = storage.options().with_stall_detection(Some(floor));
    let storage = storage.with_options(options);
    // The save's answers (PUTs and POSTs) come at once: the store's figures expect quick ones.
    let expected = container(1, 40).into_bytes().expect("a container");
    container(1, 40)
        .write_to(&storage, "slow-reads.bpk")
        .expect("the save");
    assert_stored(&storage, "slow-reads.bpk", &expected);
    let counts = storage.stall_watch().expect("a stall watch").counts();
    assert!(proxy.count("slow_first_byte") > 0, "no answer was late");
    assert!(
        counts.cut_waiting > 0,
        "nothing was cut, so the case tested nothing: {counts:?}"
    );
}

#[test]
fn hedged_reads_stay_within_their_budget() {
    let Some((_proxy, storage)) = through_proxy("{}", "30s", quick_retries(3)) else {
        return;
    };
    let expected = container(3, 17).into_bytes().expect("a container");
    container(3, 17)
        .write_to(&storage, "budget.bpk")
        .expect("the save");
    let storage = read_in_ranges(storage, "budget.bpk", &expected);
    let counts = storage.stall_watch().expect("a stall watch").counts();
    assert!(counts.ranged_reads > 16, "{counts:?}");
    // The default budget: 5 in a hundred ranged GETs.
    assert!(counts.hedged * 100 <= counts.ranged_reads * 5, "{counts:?}");
}

#[test]
fn a_delete_that_never_answers_is_cut_and_sent_again() {
    // S3's delete is a batch POST `?delete`; GCS sends DELETE.
    for (server, request) in [(Server::S3, "?delete"), (Server::Gcs, "DELETE ")] {
        let faults = format!(r#"{{"stall": {{"match": "{request}", "times": 1}}}}"#);
        let Some((proxy, storage)) = proxied(server, &unique(), &faults, "30s", quick_retries(3))
        else {
            return;
        };
        container(0, 18)
            .write_to(&storage, "doomed.bpk")
            .expect("the save");
        storage
            .delete("doomed.bpk")
            .unwrap_or_else(|e| panic!("{server:?}: delete: {e:#}"));
        assert_eq!(proxy.count("stalled"), 1, "{server:?}");
        let counts = storage.stall_watch().expect("a stall watch").counts();
        assert!(counts.cut_waiting >= 1, "{server:?}: {counts:?}");
        assert!(
            storage.list("").expect("list").is_empty(),
            "{server:?}: the object is still there"
        );
    }
}

#[test]
fn a_uniformly_slow_link_is_not_taken_for_a_stall() {
    // 4 MiB/s for every request and answer: a 5 MiB part takes over a second to send, a read
    // of the whole container four.
    let faults = r#"{"bandwidth_bytes_per_s": 4194304}"#;
    for server in [Server::S3, Server::Gcs] {
        let Some((proxy, storage)) = proxied(server, &unique(), faults, "30s", quick_retries(3))
        else {
            return;
        };
        round_trip(&storage, "slow.bpk");
        assert!(proxy.count("forwarded") > 0);
        let counts = storage.stall_watch().expect("a stall watch").counts();
        assert_eq!(counts.cut(), 0, "{server:?}: requests cut on a slow link");
    }
}

#[test]
fn a_part_that_stalls_every_try_fails_naming_key_part_and_the_stall() {
    let faults = r#"{"stall": {"match": "partNumber=3", "times": -1}}"#;
    let Some((_proxy, storage)) = through_proxy(faults, "30s", quick_retries(2)) else {
        return;
    };
    let error = container(3, 15)
        .write_to(&storage, "stalls-always.bpk")
        .expect_err("part 3 never answers");
    let message = format!("{error:#}");
    for named in [
        "stalls-always.bpk",
        "part 3",
        "no bytes for",
        "stall detection",
    ] {
        assert!(message.contains(named), "`{named}` is not in: {message}");
    }
    let counts = storage.stall_watch().expect("a stall watch").counts();
    // Each of the three tries (two retries) was cut.
    assert!(counts.cut_waiting >= 3, "{counts:?}");
    assert!(storage.list("").expect("list").is_empty());
}

#[test]
fn stall_detection_turned_off_waits_for_the_request_timeout() {
    let faults = r#"{"stall": {"match": "partNumber=3", "times": 1}}"#;
    let Some((proxy, storage)) = through_proxy(faults, "3s", quick_retries(2)) else {
        return;
    };
    let off = storage.options().with_stall_detection(None);
    let storage = storage.with_options(off);
    round_trip(&storage, "off.bpk");
    assert_eq!(proxy.count("stalled"), 1);
    // The request timeout cut it: the watch, turned off, cut nothing.
    assert_eq!(
        storage.stall_watch().expect("a stall watch").counts().cut(),
        0
    );
}

#[test]
fn a_rate_limited_prefix_takes_every_write() {
    let faults = r#"{"rate_limit": {"per_second": 15, "depth": 3}}"#;
    // Quick retries, so the prefix is hammered and the throttle must act, and enough of them
    // to span several of the limiter's one-second windows (ten quick ones can all land in
    // one refusing second on a loaded machine).
    let Some((proxy, storage)) = through_proxy(faults, "30s", quick_retries(40)) else {
        return;
    };
    let small = |i: usize| Writer::new(vec![Tensor::new("w", DType::U8, [4], vec![i as u8; 4])]);
    std::thread::scope(|scope| {
        for thread in 0..4 {
            let storage = &storage;
            scope.spawn(move || {
                for i in 0..10 {
                    let key = format!("rank-{thread}/{i}.bpk");
                    small(i)
                        .write_to(storage, &key)
                        .unwrap_or_else(|e| panic!("save of {key}: {e}"));
                }
            });
        }
    });
    assert_eq!(storage.list("").expect("list").len(), 40);
    assert!(
        proxy.count("rate_limited") > 0,
        "the proxy limited no request"
    );
    let counts = storage.throttle().expect("a throttle").counts();
    assert!(counts.cuts > 0, "the pace was never cut: {counts:?}");
}

#[test]
fn a_slow_store_is_waited_for_and_one_slower_than_the_deadline_is_cut() {
    // 100 ms before every answer, under the 30 s deadline: everything comes through.
    let Some(injected) = survives(r#"{"latency_ms": 100}"#, "forwarded") else {
        return;
    };
    assert!(injected > 0);
    // 3 s before every answer, over a 1 s deadline: each try is cut (waited for, they would
    // succeed), and the save fails naming the key and the deadline.
    let Some((_proxy, storage)) = through_proxy(r#"{"latency_ms": 3000}"#, "1s", quick_retries(1))
    else {
        return;
    };
    let error = container(0, 14)
        .write_to(&storage, "slow.bpk")
        .expect_err("every request is slower than its deadline");
    let message = format!("{error:#}");
    assert!(message.contains("slow.bpk"), "{message}");
    assert!(
        message.contains("did not answer within the request timeout"),
        "{message}"
    );
}

#[test]
fn a_stalled_part_is_cut_at_the_deadline_and_retried() {
    let faults = r#"{"stall": {"match": "partNumber=2", "times": 1}}"#;
    let Some((proxy, storage)) = through_proxy(faults, "2s", quick_retries(3)) else {
        return;
    };
    let expected = container(2, 5).into_bytes().expect("a container");
    container(2, 5)
        .write_to(&storage, "stalled.bpk")
        .unwrap_or_else(|e| panic!("save with one stalled part: {e}"));
    assert_eq!(proxy.count("stalled"), 1);
    assert_stored(&storage, "stalled.bpk", &expected);
}

#[test]
fn a_part_that_never_answers_fails_naming_key_part_and_deadline() {
    let faults = r#"{"stall": {"match": "partNumber=2", "times": -1}}"#;
    let Some((_proxy, storage)) = through_proxy(faults, "1s", quick_retries(1)) else {
        return;
    };
    let error = container(2, 6)
        .write_to(&storage, "never.bpk")
        .expect_err("part 2 never answers");
    let message = format!("{error:#}");
    assert!(message.contains("never.bpk"), "{message}");
    assert!(message.contains("part 2"), "{message}");
    assert!(
        message.contains("did not answer within the request timeout"),
        "{message}"
    );
    assert!(storage.list("").expect("list").is_empty());
}

#[test]
fn a_refusal_names_the_status_and_the_store_code() {
    let faults =
        r#"{"fail": {"match": "PUT ", "times": -1, "status": 403, "code": "AccessDenied"}}"#;
    let Some((_proxy, storage)) = through_proxy(faults, "30s", quick_retries(3)) else {
        return;
    };
    let error = container(0, 7)
        .write_to(&storage, "refused.bpk")
        .expect_err("every PUT is refused");
    let message = format!("{error:#}");
    assert!(message.contains("refused.bpk"), "{message}");
    assert!(message.contains("403"), "{message}");
    assert!(message.contains("AccessDenied"), "{message}");
}

#[test]
fn a_completion_whose_answer_is_lost_still_saves() {
    // The server completes the upload; its answer is cut mid-body. An overwrite of a key that
    // holds a container of the same length must not mistake the old one for the new.
    for (mode, cuts) in [(WriteMode::Overwrite, 2), (WriteMode::CreateNew, 1)] {
        let faults = format!(r#"{{"cut": {{"match": "?uploadId=", "times": {cuts}}}}}"#);
        let Some((proxy, storage)) = through_proxy(&faults, "30s", quick_retries(3)) else {
            return;
        };
        if mode == WriteMode::Overwrite {
            container(2, 8)
                .write_to(&storage, "lost.bpk")
                .expect("the first save (its completion answer is cut)");
        }
        let expected = container(2, 9).into_bytes().expect("a container");
        container(2, 9)
            .with_mode(mode)
            .write_to(&storage, "lost.bpk")
            .unwrap_or_else(|e| panic!("{mode:?} save: {e}"));
        assert_eq!(proxy.count("reset"), cuts, "{mode:?}");
        assert_stored(&storage, "lost.bpk", &expected);
    }
}

#[test]
fn a_completion_that_takes_long_is_waited_for_not_cut() {
    // The store answers a completion 4 s after it is sent (it joins the parts first), past
    // the 2 s floor the parts' quick answers set every other request's allowance to. A cut
    // completion can lose the save (s3s-fs forgets the upload, stops joining when the
    // connection closes and refuses the retry), so it waits for the request timeout.
    let faults = r#"{"slow": {"match": "?uploadId=", "times": -1, "seconds": 4}}"#;
    let Some((proxy, storage)) = through_proxy(faults, "30s", quick_retries(3)) else {
        return;
    };
    let expected = container(3, 21).into_bytes().expect("a container");
    container(3, 21)
        .write_to(&storage, "joined.bpk")
        .unwrap_or_else(|e| panic!("save: {e:#}"));
    let counts = storage.stall_watch().expect("a stall watch").counts();
    assert_eq!(counts.cut(), 0, "{counts:?}");
    assert_eq!(
        proxy.count("slow"),
        1,
        "the completion was sent more than once"
    );
    assert_stored(&storage, "joined.bpk", &expected);
}

#[test]
fn a_refused_completion_fails_even_over_a_container_of_the_same_length() {
    let prefix = unique();
    let Some((_clean, storage)) = through_proxy_at(&prefix, "{}", "30s", quick_retries(3)) else {
        return;
    };
    let old = container(2, 10).into_bytes().expect("a container");
    container(2, 10)
        .write_to(&storage, "refused.bpk")
        .expect("the first save");
    let faults =
        r#"{"fail": {"match": "?uploadId=", "times": -1, "status": 400, "code": "InvalidPart"}}"#;
    let Some((_proxy, refusing)) = through_proxy_at(&prefix, faults, "30s", quick_retries(3))
    else {
        return;
    };
    let error = container(2, 11)
        .write_to(&refusing, "refused.bpk")
        .expect_err("the completion is refused");
    let message = format!("{error:#}");
    assert!(message.contains("InvalidPart"), "{message}");
    assert_stored(&storage, "refused.bpk", &old);
}

#[test]
fn a_save_past_its_timeout_fails_on_time_naming_key_and_part() {
    let faults = r#"{"stall": {"match": "partNumber=2", "times": -1}}"#;
    // Requests wait longer than the save may take: the save's own bound must cut them.
    let Some((_proxy, storage)) = through_proxy(faults, "60s", quick_retries(3)) else {
        return;
    };
    let timed = storage
        .options()
        .with_save_timeout(Some(Duration::from_secs(3)));
    let storage = storage.with_options(timed);
    let error = container(2, 12)
        .write_to(&storage, "late.bpk")
        .expect_err("part 2 never answers");
    // TimedOut, not the Io error four cut tries of a minute each would end in: the save's own
    // bound ended it (how close to the bound is a benchmark's figure, docs/BENCHMARKS.md).
    assert_eq!(error.kind(), ErrorKind::TimedOut, "{error}");
    let message = format!("{error:#}");
    for named in ["late.bpk", "part 2", "deadline"] {
        assert!(message.contains(named), "`{named}` is not in: {message}");
    }
    assert!(storage.list("").expect("list").is_empty());
    // The upload was aborted and its journal removed within the grace the bound allows.
    assert_eq!(storage.pending("").expect("pending"), []);
}

#[test]
fn a_checkpoint_save_past_its_timeout_commits_nothing() {
    let faults = r#"{"stall": {"match": "partNumber=2", "times": -1}}"#;
    let Some((_proxy, storage)) = through_proxy(faults, "60s", quick_retries(3)) else {
        return;
    };
    let checkpoints = Checkpoints::new(storage, "run");
    let options = SaveOptions::default().with_timeout(Duration::from_secs(2));
    let error = checkpoints
        .save_with(1, container(2, 13), options)
        .expect_err("part 2 never answers");
    assert_eq!(error.kind(), ErrorKind::TimedOut, "{error}");
    assert!(format!("{error:#}").contains("part 2"), "{error:#}");
    assert_eq!(checkpoints.steps().expect("steps"), Vec::<u64>::new());
}

#[test]
fn a_rank_that_fails_says_so_in_the_listing() {
    let prefix = unique();
    let Some((_clean, healthy)) = through_proxy_at(&prefix, "{}", "30s", quick_retries(3)) else {
        return;
    };
    let faults = r#"{"stall": {"match": "partNumber=2", "times": -1}}"#;
    let Some((_proxy, stalling)) = through_proxy_at(&prefix, faults, "60s", quick_retries(3))
    else {
        return;
    };
    let save = |rank: u32| {
        let region = Region::split(&[2, 1 << 20], 0, 2, u64::from(rank));
        let slice = vec![rank as u8; 1 << 20];
        let mut tensors = vec![Tensor::new("w", DType::U8, region.lengths.clone(), slice)];
        if rank == 1 {
            // Over one part, so the stalled second part is in it.
            tensors.push(Tensor::new("big", DType::U8, [6 << 20], vec![9u8; 6 << 20]));
        }
        RankSave::new(rank, 2, Writer::new(tensors))
            .with_slice("w", [2, 1 << 20], region)
            .with_timeout(Duration::from_secs(2))
    };
    let outcome = Checkpoints::new(healthy.clone(), "run")
        .save_rank(7, save(0))
        .expect("rank 0 saves");
    assert!(
        matches!(outcome, RankOutcome::Written { .. }),
        "{outcome:?}"
    );
    let error = Checkpoints::new(stalling, "run")
        .save_rank(7, save(1))
        .expect_err("rank 1's second part never answers");
    let message = format!("{error:#}");
    assert!(message.contains("rank 1 of 2, step 7"), "{message}");
    let listed = Checkpoints::new(healthy, "run").list().expect("list");
    let progress = listed[0].ranks.as_ref().expect("a multi-rank step");
    assert_eq!(progress.written, [0]);
    assert_eq!(progress.failed.len(), 1, "{progress:?}");
    assert_eq!(progress.failed[0].rank, 1);
    assert!(progress.failed[0].error.contains("part 2"), "{progress:?}");
}

/// A listing that meets a key no client can address is made again by the backend's own
/// requests (the raw lister): those go through the store's connector and are tried again
/// when the store is busy, so listing around a planted key survives 503s as any listing does.
#[test]
fn a_listing_around_a_planted_key_survives_a_slowdown_storm() {
    let prefix = unique();
    let Some((proxy, storage)) = proxied(
        Server::S3,
        &prefix,
        r#"{"status_share": 0.3, "status": 503, "seed": 21}"#,
        "30s",
        quick_retries(10),
    ) else {
        return;
    };
    container(0, 1)
        .write_to(&storage, "a.bpk")
        .unwrap_or_else(|e| panic!("save: {e}"));
    let planted = format!("store-faults/{prefix}/b//planted");
    weightbay_conformance::VerbatimServer::S3
        .put(&planted, "planted")
        .expect("the S3 server");
    for round in 0..10 {
        let listed = storage
            .list("")
            .unwrap_or_else(|e| panic!("listing {round}: {e}"));
        let keys: Vec<&str> = listed.iter().map(|l| l.key.as_str()).collect();
        assert_eq!(keys, ["a.bpk"], "listing {round}");
    }
    assert!(
        proxy.count("status") > 0,
        "the proxy answered no request with 503"
    );
    weightbay_conformance::VerbatimServer::S3.delete(&planted);
}
