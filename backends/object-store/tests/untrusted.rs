//! Upload journals are claims, checked before they are acted on: a journal found in the store
//! is honoured only when its target is the key it lies beside and its upload path derives
//! from that target by the backend's own naming rule. A planted journal naming anything else
//! (an object outside the prefix, outside the store's root, a sibling run's record) is
//! reported as refused, and nothing it names is touched.

use std::sync::Arc;

use object_store::memory::InMemory;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use weightbay::Storage;
use weightbay::backend_kit::unique_token;
use weightbay_conformance::VerbatimServer;
use weightbay_object_store::ObjectStorage;

/// A writer identity on this machine whose process is gone: this boot and PID namespace, a
/// process id no process has.
fn dead_writer() -> serde_json::Value {
    let boot_id = std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .map(|id| id.trim().to_owned())
        .ok();
    let pid_namespace = std::fs::read_link("/proc/self/ns/pid")
        .ok()
        .map(|link| link.display().to_string());
    serde_json::json!({
        "boot_id": boot_id,
        "pid_namespace": pid_namespace,
        "pid": 4_194_303,
        "start_ticks": 1,
    })
}

fn put(store: &Arc<dyn ObjectStore>, path: &str, body: Vec<u8>) {
    let (store, path) = (Arc::clone(store), Path::from(path));
    futures::executor::block_on(async move { store.put(&path, PutPayload::from(body)).await })
        .unwrap();
}

fn exists(store: &Arc<dyn ObjectStore>, path: &str) -> bool {
    let (store, path) = (Arc::clone(store), Path::from(path));
    futures::executor::block_on(async move { store.head(&path).await }).is_ok()
}

/// A journal record as the backend writes one (docs/FORMAT.md), with the given claims.
fn journal(target: &str, upload_path: &str, staged: bool) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({
        "weightbay_upload": 1,
        "target": target,
        "upload_path": upload_path,
        "staged": staged,
        "upload_id": null,
        "publishing": false,
        "writer": dead_writer(),
        "started_unix_ms": 0,
    }))
    .unwrap()
}

#[test]
fn planted_journals_touch_nothing_outside_their_own_key() {
    if !std::path::Path::new("/proc/self/ns/pid").exists() {
        eprintln!("skipped: no /proc here to tell a dead writer from a live one");
        return;
    }
    let storage = ObjectStorage::journaled(Arc::new(InMemory::new()))
        .unwrap()
        .with_prefix("root")
        .unwrap();
    let store = Arc::clone(storage.store());
    let victims = [
        "other-team/prod/model.bin",
        "root/runs/b/step-1/commit.json",
        "root/runs/a/step-1/model.bpk",
    ];
    for victim in victims {
        put(&store, victim, b"someone else's bytes".to_vec());
    }
    let dir = "root/runs/a/step-2";
    let planted = [
        // Outside the prefix and the store's root.
        (victims[0], victims[0], true),
        // A sibling run's record, inside the root.
        (victims[1], victims[1], false),
        // The right target, parts claimed to go to another key.
        (&format!("{dir}/model.bpk"), victims[2], true),
        (&format!("{dir}/model.bpk"), victims[2], false),
    ];
    for (target, upload_path, staged) in planted {
        let name = format!("{dir}/model.bpk.{}.weightbay-upload", unique_token());
        put(&store, &name, journal(target, upload_path, staged));
    }
    // A journal with another name than `<key>.<token>` and the suffix.
    put(
        &store,
        &format!("{dir}/whatever.weightbay-upload"),
        journal(
            &format!("{dir}/whatever"),
            &format!("{dir}/whatever"),
            false,
        ),
    );
    // An object with the staging segment outside the staging layout.
    put(
        &store,
        "root/runs/a/.weightbay-staging/x/model.bpk",
        vec![1],
    );

    // A dead writer's genuine journal and staged object, which the cleanup must remove.
    let token = unique_token();
    let staged = format!("root/.weightbay-staging/{token}/runs/a/step-3/model.bpk");
    put(&store, &staged, vec![0; 16]);
    let genuine = format!(
        "root/runs/a/step-3/model.bpk.{}.weightbay-upload",
        unique_token()
    );
    put(
        &store,
        &genuine,
        journal("root/runs/a/step-3/model.bpk", &staged, true),
    );

    // And one staged by a storage rooted deeper (`root/runs`): its staging directory is there.
    let deeper = format!(
        "root/runs/.weightbay-staging/{}/a/step-4/model.bpk",
        unique_token()
    );
    put(&store, &deeper, vec![0; 16]);
    let deeper_journal = format!(
        "root/runs/a/step-4/model.bpk.{}.weightbay-upload",
        unique_token()
    );
    put(
        &store,
        &deeper_journal,
        journal("root/runs/a/step-4/model.bpk", &deeper, true),
    );

    let pending = storage.pending("runs/a").unwrap();
    let refused: Vec<_> = pending.iter().filter(|p| p.refused.is_some()).collect();
    assert_eq!(refused.len(), 6, "{pending:#?}");
    assert!(refused.iter().all(|p| !p.abandoned));
    assert_eq!(pending.len(), 8, "{pending:#?}");

    let cleaned = storage.clean_pending("runs/a").unwrap();
    let (refused, removed): (Vec<_>, Vec<_>) =
        cleaned.into_iter().partition(|p| p.refused.is_some());
    assert_eq!(
        refused.len(),
        6,
        "refused records are returned, and left: {refused:#?}"
    );
    let keys: Vec<&str> = removed.iter().map(|p| p.key.as_str()).collect();
    assert_eq!(
        keys,
        ["runs/a/step-3/model.bpk", "runs/a/step-4/model.bpk"],
        "{removed:#?}"
    );
    for gone in [&staged, &genuine, &deeper, &deeper_journal] {
        assert!(!exists(&store, gone), "{gone} was left");
    }
    for victim in victims {
        assert!(
            exists(&store, victim),
            "{victim} was deleted by a planted journal"
        );
    }
    assert!(exists(&store, "root/runs/a/.weightbay-staging/x/model.bpk"));
    // The refused records stay, for a person to look at.
    assert_eq!(storage.pending("runs/a").unwrap().len(), 6);
}

/// Objects whose keys `object_store` cannot represent (`..`, `.` and empty segments), planted
/// on the S3 server and the GCS fixture beside a run: every listing, `ls` and `gc` of the run
/// goes on, the listing's foreign entries name each, and what they hold is left alone.
#[test]
fn keys_no_client_can_address_fail_no_listing() {
    let servers = [
        (VerbatimServer::S3, weightbay_conformance::s3_url()),
        (VerbatimServer::Gcs, std::env::var("WEIGHTBAY_GCS_URL").ok()),
    ];
    for (server, base) in servers {
        let Some(base) = base else {
            eprintln!("skipped on {server:?}: no server (scripts/servers.sh start s3|gcs)");
            continue;
        };
        let planted = [
            "runs/a/step-1/../../ab/step-2/commit.json",
            "runs/a/step-2/./x",
            "runs/a//y",
            "runs/a/step-1/.",
        ];
        planted_keys_fail_no_listing(
            &base,
            &planted,
            |key| server.put(key, "planted").unwrap(),
            |key| server.delete(key).unwrap(),
        );
    }
}

/// As [`keys_no_client_can_address_fail_no_listing`], on Azurite, with keys of empty segments
/// (a signed request's URL keeps those as they are, where it folds `.` and `..` away).
#[test]
fn blobs_no_client_can_address_fail_no_listing() {
    let Some(base) = weightbay_conformance::azure_url() else {
        return;
    };
    let service = format!(
        "{}/devstoreaccount1/{}",
        std::env::var("AZURITE_BLOB_STORAGE_URL").unwrap(),
        base.trim_start_matches("az://").split('/').next().unwrap()
    );
    let request = |method: http::Method, key: &str| {
        let runtime = tokio::runtime::Runtime::new().unwrap();
        let service = service.clone();
        let key = key.to_owned();
        runtime.block_on(async move {
            use object_store::azure::{AzureAccessKey, AzureAuthorizer, AzureCredential};
            use object_store::client::{HttpConnector, HttpRequestBody, ReqwestConnector};
            let body = if method == http::Method::PUT { "planted" } else { "" };
            let mut request = http::Request::builder()
                .method(method)
                .uri(format!("{service}/{key}"))
                .header("x-ms-blob-type", "BlockBlob")
                .header("content-length", body.len())
                .body(HttpRequestBody::from(body.as_bytes().to_vec()))
                .unwrap();
            // Azurite's well-known account key, which every emulator user has.
            let key = AzureAccessKey::try_new(
                "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==",
            )
            .unwrap();
            AzureAuthorizer::new(&AzureCredential::AccessKey(key), "devstoreaccount1")
                .try_authorize(&mut request)
                .unwrap();
            let options = object_store::ClientOptions::new().with_allow_http(true);
            let client = ReqwestConnector::default().connect(&options).unwrap();
            let answer = client.execute(request).await.unwrap();
            assert!(answer.status().is_success(), "Azurite answered {}", answer.status());
        });
    };
    planted_keys_fail_no_listing(
        &base,
        &["runs/a//y", "runs/a/step-2//x"],
        |key| request(http::Method::PUT, key),
        |key| request(http::Method::DELETE, key),
    );
}

/// Saves steps 1 and 2 under `runs/a` of a fresh prefix of `base`, plants `planted` (keys
/// below that prefix) with `plant`, and checks that nothing fails or touches them.
fn planted_keys_fail_no_listing(
    base: &str,
    planted: &[&str],
    plant: impl Fn(&str),
    remove: impl Fn(&str),
) {
    let storage = weightbay_object_store::open_url(
        &format!("{base}/verbatim-{}", unique_token()),
        std::iter::empty::<(&str, &str)>(),
    )
    .unwrap();
    let checkpoints = weightbay_checkpoints::Checkpoints::new(storage.clone(), "runs/a");
    let writer = || {
        weightbay::Writer::new(vec![weightbay::Tensor::new(
            "w",
            weightbay::DType::U8,
            [4],
            vec![1; 4],
        )])
    };
    checkpoints.save(1, writer()).unwrap();
    checkpoints.save(2, writer()).unwrap();
    let root = storage.prefix().to_string();
    for key in planted {
        plant(&format!("{root}/{key}"));
    }
    let listed = storage.list("runs/a").unwrap();
    assert_eq!(listed.len(), 4, "{listed:?}");
    assert!(
        listed
            .iter()
            .all(|l| !l.key.contains("/./") && !l.key.contains("//"))
    );
    assert_eq!(checkpoints.steps().unwrap(), [1, 2]);
    assert_eq!(storage.list("runs").unwrap().len(), 4);
    let foreign = |prefix| -> Vec<String> {
        let entries = storage.list_foreign(prefix).unwrap();
        entries.into_iter().map(|entry| entry.name).collect()
    };
    let mut expected: Vec<String> = planted.iter().map(|key| (*key).to_owned()).collect();
    expected.sort();
    assert_eq!(foreign("runs/a"), expected);
    assert_eq!(foreign("runs"), expected);
    // `ls`: each step stays complete, with what its directory holds that no container can be.
    for status in checkpoints.list().unwrap() {
        let dir = format!("runs/a/step-{}/", status.step);
        let names: Vec<&str> = status.foreign.iter().map(|e| e.name.as_str()).collect();
        let wanted: Vec<&str> = expected
            .iter()
            .filter(|key| key.starts_with(&dir))
            .map(String::as_str)
            .collect();
        assert_eq!(names, wanted, "step {}", status.step);
        assert_eq!(status.state, weightbay_checkpoints::StepState::Complete);
    }
    checkpoints.gc().unwrap();
    assert!(storage.pending("runs").unwrap().is_empty());
    checkpoints.open(2).unwrap().verify().unwrap();
    assert_eq!(
        foreign("runs/a"),
        expected,
        "gc leaves what it cannot address"
    );
    for key in planted {
        remove(&format!("{root}/{key}"));
    }
    for step in [1, 2] {
        checkpoints.delete_step(step).unwrap();
    }
    let left = (storage.list("").unwrap(), foreign(""));
    assert!(
        left.0.is_empty() && left.1.is_empty(),
        "the test's objects are removed: {left:?}"
    );
}
