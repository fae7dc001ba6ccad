//! Unfinished writes in a store: the journals of multipart uploads (`journal.rs`), and staged
//! create-new uploads that no journal names; which of them a dead writer left, and removing
//! those. What [`Storage::pending`](weightbay::Storage::pending) and
//! [`Storage::clean_pending`](weightbay::Storage::clean_pending) answer for an
//! [`ObjectStorage`].

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use object_store::path::Path;
use object_store::{ObjectMeta, ObjectStoreExt};
use weightbay::backend_kit::{is_under, is_unique_token, validate_prefix};
use weightbay::{PendingWrite, Result};

use crate::error::convert;
use crate::journal::{JOURNAL_SUFFIX, UploadRecord};
use crate::options::STAGING_DIR;
use crate::storage::ObjectStorage;

/// What the journals found claim: every upload id recorded, and the paths where a live
/// writer is starting an upload whose id it has not recorded yet.
#[derive(Debug, Default)]
struct Claims {
    ids: HashSet<String>,
    starting: HashSet<String>,
}

impl Claims {
    /// The claims of the journals among `found`.
    fn of(found: &[(Unfinished, PendingWrite)]) -> Self {
        let mut claims = Self::default();
        for (unfinished, pending) in found {
            if let Unfinished::Journaled { record, .. } = unfinished {
                match &record.upload_id {
                    Some(id) => {
                        claims.ids.insert(id.clone());
                    }
                    None if !pending.abandoned => {
                        claims.starting.insert(record.upload_path.clone());
                    }
                    None => {}
                }
                if record.publishing && !pending.abandoned {
                    claims.starting.insert(record.target.clone());
                }
            }
        }
        claims
    }
}

/// An unfinished write, as found in the store.
pub(crate) enum Unfinished {
    /// A multipart upload's journal record.
    Journaled { journal: Path, record: UploadRecord },
    /// A journal record this code cannot read (another version, or damaged), or one whose
    /// claims this backend's naming rule does not derive (forged, or another tool's):
    /// reported, and nothing it names is touched.
    Untouchable,
    /// A staged create-new upload that no journal names: written through a store without
    /// upload ids, or left when its journal went first.
    Staged { path: Path },
}

impl ObjectStorage {
    /// Every unfinished write under `prefix`, with what [`Storage::pending`] reports of it.
    ///
    /// [`Storage::pending`]: weightbay::Storage::pending
    pub(crate) fn unfinished(&self, prefix: &str) -> Result<Vec<(Unfinished, PendingWrite)>> {
        validate_prefix(prefix)?;
        let under = if prefix.is_empty() {
            self.prefix.clone()
        } else {
            self.object_path(prefix)
        };
        let mut objects = self.list_objects(&under)?;
        // This storage's own staging directory is under the prefix only when the prefix is
        // empty; its staged objects mirror their key, so those under the prefix are found.
        if !prefix.is_empty() {
            let staging = self.staging_prefix();
            objects.extend(
                self.list_objects(&staging)?
                    .into_iter()
                    .filter(|meta| is_under(&staged_key(self, &meta.location), prefix)),
            );
        }
        let mut found = self.journals_in(&objects)?;
        let named: HashSet<String> = found
            .iter()
            .filter_map(|(unfinished, _)| match unfinished {
                Unfinished::Journaled { record, .. } => Some(record.upload_path.clone()),
                _ => None,
            })
            .collect();
        for meta in &objects {
            let path = meta.location.as_ref();
            let staged = path.split('/').any(|segment| segment == STAGING_DIR)
                && !path.ends_with(JOURNAL_SUFFIX)
                && !named.contains(path);
            if !staged {
                continue;
            }
            // Only `<dir>/.weightbay-staging/<token>/<key>` is a staged upload (of a storage
            // rooted at `<dir>`); anything else with the segment was put there by hand.
            let held_by = format!("staged object {path}");
            let key = staged_key(self, &meta.location);
            if staged_layout(&meta.location).is_none() {
                let why = format!(
                    "it is not laid out as `<dir>/{STAGING_DIR}/<token>/<key>`, as staged \
                     uploads are"
                );
                found.push((
                    Unfinished::Untouchable,
                    PendingWrite::refused(key, held_by, why),
                ));
                continue;
            }
            let pending = PendingWrite::new(key, held_by, age(meta) >= self.options.stale_after);
            let path = meta.location.clone();
            found.push((Unfinished::Staged { path }, pending));
        }
        found.sort_by(|a, b| a.1.cmp(&b.1));
        Ok(found)
    }

    /// The journals among `objects`, read, each with whether its writer is gone. A journal
    /// that went between the listing and the read (its upload ended) is left out.
    fn journals_in(&self, objects: &[ObjectMeta]) -> Result<Vec<(Unfinished, PendingWrite)>> {
        let mut found = Vec::new();
        for meta in objects
            .iter()
            .filter(|meta| meta.location.as_ref().ends_with(JOURNAL_SUFFIX))
        {
            let journal = meta.location.clone();
            let record = match self.read_journal(&journal)? {
                Read::Gone => continue,
                Read::Unreadable => {
                    let pending = PendingWrite::new(
                        self.relative(&journal),
                        format!("journal {journal}, which this version cannot read"),
                        false,
                    );
                    found.push((Unfinished::Untouchable, pending));
                    continue;
                }
                Read::Record(record) => record,
            };
            if let Err(why) = self.check_claim(&journal, &record) {
                let pending = PendingWrite::refused(
                    self.relative(&journal),
                    format!("journal {journal}"),
                    why,
                );
                found.push((Unfinished::Untouchable, pending));
                continue;
            }
            let abandoned = match record.writer.running() {
                Some(running) => !running,
                // Another machine's writer renews its journal while it uploads.
                None => age(meta) >= self.options.stale_after,
            };
            let upload = match &record.upload_id {
                Some(id) => format!("multipart upload {id} at {}", record.upload_path),
                None => format!(
                    "a multipart upload at {} that may have started, its id never recorded",
                    record.upload_path
                ),
            };
            let copy = if record.publishing {
                ", copying its staged object to the key"
            } else {
                ""
            };
            let pending = PendingWrite::new(
                self.relative(&stored_path(&record.target)),
                format!(
                    "{upload}{copy}, journal {journal}, process {}",
                    record.writer.pid
                ),
                abandoned,
            );
            found.push((Unfinished::Journaled { journal, record }, pending));
        }
        Ok(found)
    }

    /// Whether `record`, found at `journal`, claims only what a journal of this backend
    /// would: its target is the key the journal lies beside (`<target>.<token>` and the
    /// journal suffix), and its parts go to that target or, staged, to
    /// `<dir>/.weightbay-staging/<token>/<rest>` where `<dir>/<rest>` is the target (the
    /// writer's storage may be rooted at any directory above it). A journal is listed under
    /// the prefix being cleaned, so its sibling target is too. Why not, when it does not.
    fn check_claim(
        &self,
        journal: &Path,
        record: &UploadRecord,
    ) -> std::result::Result<(), String> {
        let beside = journal
            .as_ref()
            .strip_suffix(JOURNAL_SUFFIX)
            .and_then(|stem| stem.rsplit_once('.'))
            .filter(|(_, token)| is_unique_token(token))
            .map(|(target, _)| target);
        let Some(beside) = beside else {
            return Err("its name is not `<key>.<token>` and the journal suffix".to_owned());
        };
        if record.target != beside {
            return Err(format!(
                "it names `{}` as its target, not `{beside}`, the key it lies beside",
                record.target
            ));
        }
        let target = stored_path(&record.target);
        if target.prefix_match(&self.prefix).is_none() {
            return Err(format!(
                "its target `{target}` is outside this storage's root"
            ));
        }
        let upload = stored_path(&record.upload_path);
        let derived = if record.staged {
            // The writer's storage may be rooted anywhere above the target: its staging
            // directory sits at that root, and the rest of the path is the target's.
            staged_layout(&upload).is_some_and(|(root, rest)| {
                let joined: Path = root.parts().chain(rest.parts()).collect();
                joined == target
            })
        } else {
            upload == target
        };
        if !derived {
            return Err(format!(
                "its upload path `{upload}` is not {} of its target `{target}`",
                if record.staged {
                    "the staged path"
                } else {
                    "the path"
                }
            ));
        }
        Ok(())
    }

    /// Removes every unfinished write under `prefix` whose writer is gone, and returns them
    /// with the records refused ([`PendingWrite::refused`]), which it leaves.
    pub(crate) fn remove_abandoned(&self, prefix: &str) -> Result<Vec<PendingWrite>> {
        let found = self.unfinished(prefix)?;
        let claims = Claims::of(&found);
        let mut removed = Vec::new();
        for (unfinished, pending) in found {
            if pending.refused.is_some() {
                removed.push(pending);
            } else if pending.abandoned
                && let Some(gone) = self.remove_unfinished(unfinished, pending, &claims)?
            {
                removed.push(gone);
            }
        }
        Ok(removed)
    }

    /// Removes an unfinished write whose writer is gone, and returns it: aborts the upload a
    /// journal names (found by listing the key's uploads where its id was never recorded and
    /// the store lists them), removes its staged object, then the journal; or removes a staged
    /// object. `None` when it is left for a later cleanup: nothing here can abort its upload,
    /// the store's listing failed, or a live writer is starting one at the same key.
    fn remove_unfinished(
        &self,
        unfinished: Unfinished,
        pending: PendingWrite,
        claims: &Claims,
    ) -> Result<Option<PendingWrite>> {
        let (journal, record) = match unfinished {
            Unfinished::Untouchable => return Ok(None),
            Unfinished::Staged { path } => {
                self.delete_object(&path, "removing a staged upload")?;
                return Ok(Some(pending));
            }
            Unfinished::Journaled { journal, record } => (journal, record),
        };
        let upload_path = stored_path(&record.upload_path);
        let Some(multipart) = self.multipart.clone() else {
            // Nothing here can abort it: leave the journal for a storage that can.
            return Ok(None);
        };
        // Uploads at a path whose id was never recorded: the upload's own, before the id was
        // written, and the copy publishing a staged object (on S3 an upload at the target).
        let mut unnamed = Vec::new();
        if record.upload_id.is_none() {
            unnamed.push((record.upload_path.as_str(), record.staged));
        }
        if record.publishing {
            unnamed.push((record.target.as_str(), false));
        }
        let mut ids: Vec<(Path, String)> = record
            .upload_id
            .iter()
            .map(|id| (upload_path.clone(), id.clone()))
            .collect();
        if let Some(lister) = self.raw_lister.as_ref().filter(|l| l.lists_uploads()) {
            for (path, unique) in unnamed {
                let (lister, at) = (Arc::clone(lister), stored_path(path));
                let Ok(listed) = self.bridge.run(async move { lister.open_at(&at).await })? else {
                    // Try again at the next cleanup rather than lose the record.
                    return Ok(None);
                };
                // Another writer may have started an upload at a shared key (an overwrite's
                // target) since the journals were read; it wrote its journal before it did,
                // so journals read now claim every upload the listing above saw. A staging
                // path is this writer's alone.
                let fresh;
                let claims = if unique {
                    claims
                } else {
                    fresh = self.claims_beside(&stored_path(path))?;
                    &fresh
                };
                if claims.starting.contains(path) {
                    return Ok(None);
                }
                ids.extend(
                    listed
                        .into_iter()
                        .filter(|id| !claims.ids.contains(id))
                        .map(|id| (stored_path(path), id)),
                );
            }
        }
        // Without a listing, what the dead writer may have started unnamed is beyond reach,
        // as `held_by` says; its journal goes.
        for (path, id) in ids {
            let multipart = Arc::clone(&multipart);
            let aborted = self
                .bridge
                .run(async move { multipart.abort_multipart(&path, &id).await })?;
            match aborted {
                Ok(()) => {}
                // Completed or aborted already.
                Err(e) if upload_is_gone(&e) => {}
                Err(e) => {
                    return Err(
                        convert("aborting a dead writer's upload", e).with_key(&pending.key)
                    );
                }
            }
        }
        if record.staged {
            self.delete_object(&upload_path, "removing a dead writer's staged upload")?;
        }
        self.delete_object(&journal, "removing a dead writer's upload journal")?;
        Ok(Some(pending))
    }

    /// What the journals beside `path` (in its directory) claim now.
    fn claims_beside(&self, path: &Path) -> Result<Claims> {
        let count = path.parts().count();
        let dir: Path = path.parts().take(count.saturating_sub(1)).collect();
        let objects = self.list_objects(&dir)?;
        Ok(Claims::of(&self.journals_in(&objects)?))
    }

    /// Every object under `path`, staged uploads and journals included.
    fn list_objects(&self, path: &Path) -> Result<Vec<ObjectMeta>> {
        self.objects_under(path, "listing unfinished writes")
    }

    /// The journal record at `path`.
    fn read_journal(&self, path: &Path) -> Result<Read> {
        let store = Arc::clone(&self.store);
        let at = path.clone();
        let read = self
            .bridge
            .run(async move { store.get(&at).await?.bytes().await })?;
        match read {
            Ok(bytes) => Ok(UploadRecord::decode(&bytes).map_or(Read::Unreadable, Read::Record)),
            Err(object_store::Error::NotFound { .. }) => Ok(Read::Gone),
            Err(e) => Err(convert(format!("reading the upload journal {path}"), e)),
        }
    }

    /// Deletes the object at `path`; one already gone is fine.
    fn delete_object(&self, path: &Path, what: &str) -> Result<()> {
        let store = Arc::clone(&self.store);
        let at = path.clone();
        match self
            .bridge
            .run(async move { crate::landed::delete(store.as_ref(), &at).await })?
        {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(convert(format!("{what} {path}"), e)),
        }
    }
}

/// A journal record, as read.
enum Read {
    Record(UploadRecord),
    /// Not a record this code reads (another version, or damaged).
    Unreadable,
    /// Removed since it was listed: its upload ended.
    Gone,
}

/// A staged upload's path, `<root>/.weightbay-staging/<token>/<rest>`, split into the root of
/// the storage that staged it and the rest (the target's path below that root): `None` for a
/// path not laid out so (no token, nothing after it, or the segment twice).
fn staged_layout(path: &Path) -> Option<(Path, Path)> {
    let parts: Vec<_> = path.parts().collect();
    let at = parts.iter().position(|part| part.as_ref() == STAGING_DIR)?;
    let token = parts.get(at + 1)?;
    let rest = &parts[at + 2..];
    let again = rest.iter().any(|part| part.as_ref() == STAGING_DIR);
    if !is_unique_token(token.as_ref()) || rest.is_empty() || again {
        return None;
    }
    Some((
        parts[..at].iter().cloned().collect(),
        rest.iter().cloned().collect(),
    ))
}

/// How long ago `meta`'s object was last written.
fn age(meta: &ObjectMeta) -> Duration {
    SystemTime::now()
        .duration_since(SystemTime::from(meta.last_modified))
        .unwrap_or(Duration::ZERO)
}

/// The key a staged object at `path` (`…/.weightbay-staging/<token>/<key>`) publishes, as a
/// key of `storage`.
fn staged_key(storage: &ObjectStorage, path: &Path) -> String {
    let text = path.as_ref();
    let marker = format!("{STAGING_DIR}/");
    let Some(at) = text.find(&marker) else {
        return storage.relative(path);
    };
    let (before, after) = text.split_at(at);
    let key = after[marker.len()..]
        .split_once('/')
        .map_or("", |(_, key)| key);
    storage.relative(&stored_path(&format!("{before}{key}")))
}

/// A path as a journal stores it (its `Display` form, already encoded).
fn stored_path(text: &str) -> Path {
    Path::parse(text).unwrap_or_else(|_| Path::from(text))
}

/// Whether an abort failed because the upload no longer exists: S3 and GCS answer 404
/// (`NoSuchUpload`); object_store's InMemory has no NotFound for uploads and says so in words.
fn upload_is_gone(error: &object_store::Error) -> bool {
    matches!(error, object_store::Error::NotFound { .. })
        || error.to_string().contains("MultipartUpload not found")
}
