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
/// on the S3 server beside a run: every listing, `ls` and `gc` of the run goes on, and what
/// they hold is left alone.
#[test]
fn keys_no_client_can_address_fail_no_listing() {
    let Some(base) = weightbay_conformance::s3_url() else {
        return;
    };
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
    let planted = [
        "runs/a/step-1/../../ab/step-2/commit.json",
        "runs/a/step-2/./x",
        "runs/a//y",
        "runs/a/step-1/.",
    ];
    for key in planted {
        weightbay_conformance::s3_put_verbatim(&format!("{root}/{key}"), "planted").unwrap();
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
    checkpoints.gc().unwrap();
    assert!(storage.pending("runs").unwrap().is_empty());
    checkpoints.open(2).unwrap().verify().unwrap();
    for key in planted {
        weightbay_conformance::s3_delete_verbatim(&format!("{root}/{key}")).unwrap();
    }
    for step in [1, 2] {
        checkpoints.delete_step(step).unwrap();
    }
    assert!(
        storage.list("").unwrap().is_empty(),
        "the test's objects are removed"
    );
}
