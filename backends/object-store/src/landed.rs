//! Whether a write whose answer was lost (a connection reset mid-response, a request cut at a
//! deadline) landed all the same: the sink looks before it reports a failure, so a write that
//! happened is never reported as one that did not. And deletes, which object_store does not
//! try again once their answer is lost, tried again.

use std::sync::Arc;

use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt};

/// Which object a path holds: its ETag and modification time.
pub(crate) type Version = (Option<String>, i64);

/// The version the object at `path` has; `None` when there is none.
pub(crate) async fn version(
    store: Arc<dyn ObjectStore>,
    path: Path,
) -> object_store::Result<Option<Version>> {
    match store.head(&path).await {
        Ok(meta) => Ok(Some((meta.e_tag, meta.last_modified.timestamp_micros()))),
        Err(object_store::Error::NotFound { .. }) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Whether `path` now holds an object of `len` bytes that is not the one it held `before`.
pub(crate) async fn completed(
    store: Arc<dyn ObjectStore>,
    path: Path,
    before: Option<Version>,
    len: u64,
) -> bool {
    let Ok(meta) = store.head(&path).await else {
        return false;
    };
    let now = (meta.e_tag, meta.last_modified.timestamp_micros());
    meta.size == len && before != Some(now)
}

/// Whether the object at `path` holds exactly `data`.
pub(crate) async fn holds(store: Arc<dyn ObjectStore>, path: Path, data: bytes::Bytes) -> bool {
    let found = async { store.get(&path).await?.bytes().await }.await;
    matches!(found, Ok(bytes) if bytes == data)
}

/// Whether two objects have the same bytes, compared in bounded windows.
pub(crate) async fn same_objects(store: Arc<dyn ObjectStore>, a: Path, b: Path) -> bool {
    let compared = async {
        let (meta_a, meta_b) = (store.head(&a).await?, store.head(&b).await?);
        if meta_a.size != meta_b.size {
            return Ok::<bool, object_store::Error>(false);
        }
        const WINDOW: u64 = 8 << 20;
        let mut offset = 0;
        while offset < meta_a.size {
            let end = (offset + WINDOW).min(meta_a.size);
            if store.get_range(&a, offset..end).await? != store.get_range(&b, offset..end).await? {
                return Ok(false);
            }
            offset = end;
        }
        Ok(true)
    };
    matches!(compared.await, Ok(true))
}

/// How many times a delete whose answer is lost is sent.
const DELETE_ATTEMPTS: u32 = 3;

/// Deletes the object at `path`, sending the delete again when its answer is lost (a reset, a
/// timeout, a stall cut), which object_store does not do for deletes. A try after a lost
/// answer that finds nothing there is done: the lost try deleted it.
pub(crate) async fn delete(store: &dyn ObjectStore, path: &Path) -> object_store::Result<()> {
    let mut attempt = 1;
    loop {
        match store.delete(path).await {
            Err(e) if crate::error::answer_lost(&e) && attempt < DELETE_ATTEMPTS => {
                tokio::time::sleep(std::time::Duration::from_millis(100 << attempt)).await;
                attempt += 1;
            }
            Err(object_store::Error::NotFound { .. }) if attempt > 1 => return Ok(()),
            done => return done,
        }
    }
}
