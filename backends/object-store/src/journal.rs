//! The upload journal: every multipart upload a sink starts is recorded in a small object
//! beside its key, before the upload exists and again once the store has named it, and the
//! record is removed once the upload is completed or aborted. A killed writer leaves its
//! record behind, and [`Storage::clean_pending`](weightbay::Storage::clean_pending) (what
//! `gc` runs) aborts the upload it names and removes its staged object: without the record
//! nothing could, since stores list unfinished uploads only through calls `object_store` does
//! not make, and they are billed until a bucket lifecycle rule removes them.
//!
//! ```text
//! <dir>/model.bpk.<token>.weightbay-upload    {"weightbay_upload": 1, "upload_path": …,
//!                                              "upload_id": …, "writer": {…}, …}
//! ```
//!
//! Whether the writer is gone is read from the writer's identity (boot, PID namespace, process
//! id and start time) where the reader shares its machine and namespace, and otherwise from
//! the record's age: a writer renews its record while it uploads, so a record older than
//! [`ObjectStoreOptions::stale_after`](crate::ObjectStoreOptions::stale_after) is a dead
//! writer's.

use std::future::Future;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use serde::{Deserialize, Serialize};
use tokio::sync::Mutex;
use tokio::task::AbortHandle;

use crate::runtime::Bridge;

/// The end of every journal record's name; keys may not end so.
pub(crate) const JOURNAL_SUFFIX: &str = ".weightbay-upload";

/// The version of the record's schema.
const JOURNAL_VERSION: u32 = 1;

/// One multipart upload, as its journal records it (docs/FORMAT.md).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct UploadRecord {
    /// The schema version.
    pub(crate) weightbay_upload: u32,
    /// The object the write publishes, as a path in the bucket.
    pub(crate) target: String,
    /// Where the upload's parts go: the target itself, or a staging object for create-new.
    pub(crate) upload_path: String,
    /// Whether `upload_path` is a staging object, to be removed once the write ends.
    pub(crate) staged: bool,
    /// The store's id for the upload: `None` until the store has given it (a writer killed in
    /// between leaves an upload only a listing of the store's uploads finds).
    pub(crate) upload_id: Option<String>,
    /// Whether the staged object is being copied to the target: a copy on S3 is itself a
    /// multipart upload (at the target), whose id only S3's listing tells.
    #[serde(default)]
    pub(crate) publishing: bool,
    /// The process that writes it.
    pub(crate) writer: WriterIdentity,
    /// When the upload started, in milliseconds since the Unix epoch.
    pub(crate) started_unix_ms: u64,
}

impl UploadRecord {
    /// A record of an upload about to start at `upload_path` for `target`, by this process.
    pub(crate) fn new(target: String, upload_path: String, staged: bool) -> Self {
        Self {
            weightbay_upload: JOURNAL_VERSION,
            target,
            upload_path,
            staged,
            upload_id: None,
            publishing: false,
            writer: WriterIdentity::current().clone(),
            started_unix_ms: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
        }
    }

    /// The record as stored.
    pub(crate) fn encode(&self) -> Vec<u8> {
        // A struct of strings and numbers always serializes.
        serde_json::to_vec_pretty(self).unwrap_or_default()
    }

    /// A stored record, if `bytes` is one of a version this code reads.
    pub(crate) fn decode(bytes: &[u8]) -> Option<Self> {
        serde_json::from_slice::<Self>(bytes)
            .ok()
            .filter(|record| record.weightbay_upload == JOURNAL_VERSION)
    }
}

/// The journal record of one upload, in the store: written whole on every change and renewed
/// on an interval by a task of its own for as long as the upload runs, so a writer that is
/// waiting (for its parts, its completion, a copy, or a slow producer) never looks dead to a
/// `gc` on another machine. Writes are serialized, so a renewal never puts back an older
/// record over a newer one.
pub(crate) struct Journal {
    pub(crate) path: Path,
    store: Arc<dyn ObjectStore>,
    record: Arc<Mutex<UploadRecord>>,
    renewal: Option<AbortHandle>,
}

impl Journal {
    /// The journal of an upload for `target` (key `key`) at `upload_path`, not yet written.
    pub(crate) fn new(
        store: Arc<dyn ObjectStore>,
        target: &Path,
        key: &str,
        upload_path: &Path,
        staged: bool,
    ) -> Self {
        // Beside the target, named after the key's own last segment (encoded once, by `join`).
        let name = key.rsplit('/').next().unwrap_or(key);
        let parent: Path = {
            let count = target.parts().count();
            target.parts().take(count.saturating_sub(1)).collect()
        };
        let token = weightbay::backend_kit::unique_token();
        Self {
            path: parent.join(format!("{name}.{token}{JOURNAL_SUFFIX}")),
            store,
            record: Arc::new(Mutex::new(UploadRecord::new(
                target.to_string(),
                upload_path.to_string(),
                staged,
            ))),
            renewal: None,
        }
    }

    /// A future that changes the record with `change`, then writes it.
    pub(crate) fn update(
        &self,
        change: impl FnOnce(&mut UploadRecord) + Send + 'static,
    ) -> impl Future<Output = object_store::Result<()>> + Send + 'static {
        let (store, path, record) = (
            Arc::clone(&self.store),
            self.path.clone(),
            Arc::clone(&self.record),
        );
        async move {
            let mut record = record.lock().await;
            change(&mut record);
            store
                .put(&path, PutPayload::from(record.encode()))
                .await
                .map(drop)
        }
    }

    /// Renews the record every `every` on `bridge`'s runtime until the journal is removed or
    /// dropped; a renewal that fails is tried again at the next.
    pub(crate) fn renew_every(&mut self, every: Duration, bridge: &Bridge) {
        let renew = Self {
            path: self.path.clone(),
            store: Arc::clone(&self.store),
            record: Arc::clone(&self.record),
            renewal: None,
        };
        let task = bridge.spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                let _ = renew.update(|_| {}).await;
            }
        });
        self.renewal = Some(task.abort_handle());
    }

    /// A future that stops the renewals and deletes the record.
    pub(crate) fn remove(mut self) -> impl Future<Output = object_store::Result<()>> + Send {
        if let Some(renewal) = self.renewal.take() {
            renewal.abort();
        }
        let (store, path) = (Arc::clone(&self.store), self.path.clone());
        async move { crate::landed::delete(store.as_ref(), &path).await }
    }
}

impl Drop for Journal {
    fn drop(&mut self) {
        // The record stays in the store, for `gc`; only the renewals stop.
        if let Some(renewal) = self.renewal.take() {
            renewal.abort();
        }
    }
}

/// Which process writes an upload, in terms another process can check: the machine's boot, the
/// PID namespace, the process id and the process's start time (so a reused process id is not
/// taken for the writer).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct WriterIdentity {
    /// `/proc/sys/kernel/random/boot_id`, different on every machine and every boot.
    pub(crate) boot_id: Option<String>,
    /// The PID namespace (`/proc/self/ns/pid`), different in every container.
    pub(crate) pid_namespace: Option<String>,
    /// The process id, in that namespace.
    pub(crate) pid: u32,
    /// When the process started, in clock ticks since boot (`/proc/<pid>/stat`, field 22).
    pub(crate) start_ticks: Option<u64>,
}

impl WriterIdentity {
    /// This process.
    pub(crate) fn current() -> &'static Self {
        static CURRENT: OnceLock<WriterIdentity> = OnceLock::new();
        CURRENT.get_or_init(|| Self {
            boot_id: read_trimmed("/proc/sys/kernel/random/boot_id"),
            pid_namespace: std::fs::read_link("/proc/self/ns/pid")
                .ok()
                .map(|link| link.display().to_string()),
            pid: std::process::id(),
            start_ticks: start_ticks("self"),
        })
    }

    /// Whether the writer is still running: `Some` when this process can tell (same boot and
    /// PID namespace, and both start times known), `None` when it cannot (another machine or
    /// container, or no `/proc` to read).
    pub(crate) fn running(&self) -> Option<bool> {
        let here = Self::current();
        let comparable = here.boot_id.is_some()
            && here.pid_namespace.is_some()
            && here.start_ticks.is_some()
            && self.start_ticks.is_some()
            && self.boot_id == here.boot_id
            && self.pid_namespace == here.pid_namespace;
        if !comparable {
            return None;
        }
        if self.pid == here.pid {
            return Some(self.start_ticks == here.start_ticks);
        }
        // A process whose `/proc` entry cannot be read (hidden from other users with
        // `hidepid`) is not proven gone: only a missing one, or one started at another time, is.
        match std::fs::read_to_string(format!("/proc/{}/stat", self.pid)) {
            Ok(stat) => Some(parse_start_ticks(&stat) == self.start_ticks),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Some(false),
            Err(_) => None,
        }
    }
}

fn read_trimmed(path: &str) -> Option<String> {
    std::fs::read_to_string(path)
        .ok()
        .map(|text| text.trim().to_owned())
        .filter(|text| !text.is_empty())
}

/// The start time of process `pid` (a number, or `self`) in clock ticks since boot, if it
/// runs.
fn start_ticks(pid: &str) -> Option<u64> {
    parse_start_ticks(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// Field 22 of a `/proc/<pid>/stat` line: the process's start time.
fn parse_start_ticks(stat: &str) -> Option<u64> {
    // The command name (field 2) is in parentheses and may hold spaces or parentheses itself:
    // the fields that follow start after its last `)`, at field 3.
    let (_, after_name) = stat.rsplit_once(')')?;
    after_name.split_whitespace().nth(22 - 3)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_is_running_and_a_finished_one_is_not() -> std::io::Result<()> {
        let here = WriterIdentity::current();
        if here.boot_id.is_none() || here.start_ticks.is_none() {
            eprintln!("skipped: no /proc here to tell processes apart");
            return Ok(());
        }
        assert_eq!(here.running(), Some(true));
        let mut child = std::process::Command::new("sleep").arg("0.2").spawn()?;
        let pid = child.id();
        let ticks = start_ticks(&pid.to_string());
        assert!(ticks.is_some(), "a running child has a start time");
        child.wait()?;
        let finished = WriterIdentity {
            pid,
            start_ticks: ticks,
            ..here.clone()
        };
        assert_eq!(finished.running(), Some(false));
        // The same pid with another start time is another process.
        let reused = WriterIdentity {
            start_ticks: here.start_ticks.map(|t| t + 1),
            ..here.clone()
        };
        assert_eq!(reused.running(), Some(false));
        let elsewhere = WriterIdentity {
            boot_id: Some("another machine".into()),
            ..here.clone()
        };
        assert_eq!(elsewhere.running(), None);
        Ok(())
    }

    #[test]
    fn records_read_back_and_other_objects_do_not() {
        let mut record = UploadRecord::new("run/m.bpk".into(), "run/m.bpk".into(), false);
        record.upload_id = Some("2~abc".into());
        assert_eq!(UploadRecord::decode(&record.encode()), Some(record.clone()));
        let future = String::from_utf8_lossy(&record.encode())
            .replace("\"weightbay_upload\": 1", "\"weightbay_upload\": 2");
        assert_eq!(UploadRecord::decode(future.as_bytes()), None);
        assert_eq!(UploadRecord::decode(b"not json"), None);
    }
}
