//! What a storage holds, written and checked: the bytes at a key, the containers a case
//! writes (a pattern, several parts, many parts), and the assertions every case makes on what
//! a key, a listing and the pending writes show after it.

use std::sync::Arc;

use weightbay::{ErrorKind, Reader, Source, Storage, WriteMode};

use crate::Harness;
use crate::outcome::fail;
use crate::strategies::{ContainerSpec, sample};

/// Bytes of a recognisable pattern, different for each `seed`.
pub(crate) fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

/// Every byte stored at `key`, or the error of opening or reading it.
pub(crate) fn stored(storage: &dyn Storage, key: &str) -> weightbay::Result<Vec<u8>> {
    let source = storage.open(key)?;
    let len = usize::try_from(source.len()).map_err(|_| weightbay::Error::invalid("too large"))?;
    let mut out = vec![0; len];
    source.read_at(0, &mut out)?;
    Ok(out)
}

/// Every byte of `source`, through one batched read of its two halves asked in reverse order.
pub(crate) fn fetched_whole(source: &dyn Source) -> weightbay::Result<Vec<u8>> {
    let len = source.len();
    let half = len / 2;
    let views = source.fetch(&[half..len, 0..half])?;
    let [second, first] = views.as_slice() else {
        return Err(weightbay::Error::invalid(format!(
            "a fetch of two ranges gave {} results",
            views.len()
        )));
    };
    let mut bytes = first.to_vec()?;
    bytes.extend_from_slice(&second.to_vec()?);
    Ok(bytes)
}

/// Asserts `key` holds exactly one of `allowed` (or is absent when `None` is allowed), and that
/// a stored container opens and verifies.
pub(crate) fn assert_holds_one_of(
    case: &str,
    context: &str,
    storage: &dyn Storage,
    key: &str,
    allowed: &[Option<&[u8]>],
) {
    let held = stored(storage, key);
    assert_listing_agrees(
        case,
        context,
        storage,
        key,
        held.as_ref().ok().map(Vec::len),
    );
    match held {
        Ok(bytes) => {
            if !allowed.iter().flatten().any(|a| *a == bytes.as_slice()) {
                fail!(
                    case,
                    "{context}: `{key}` holds {} bytes that are neither the old nor the new container",
                    bytes.len()
                );
            }
            let reader = Reader::from_bytes(bytes.clone())
                .unwrap_or_else(|e| fail!(case, "{context}: stored container does not open: {e}"));
            if let Err(e) = reader.verify() {
                fail!(case, "{context}: stored container does not verify: {e}");
            }
            assert_batched_reads_agree(case, context, storage, key, &bytes, &reader);
        }
        Err(e) if e.kind() == ErrorKind::NotFound => {
            if !allowed.contains(&None) {
                fail!(
                    case,
                    "{context}: `{key}` is missing but should hold a container"
                );
            }
        }
        Err(e) => fail!(case, "{context}: reading `{key}` failed: {e}"),
    }
}

/// The batched entry points read what `read_at` read: a fetch of the whole container and the
/// reader's `load_all`.
fn assert_batched_reads_agree(
    case: &str,
    context: &str,
    storage: &dyn Storage,
    key: &str,
    bytes: &[u8],
    expected: &Reader,
) {
    let source = storage
        .open(key)
        .unwrap_or_else(|e| fail!(case, "{context}: opening `{key}` again failed: {e}"));
    match fetched_whole(&*source) {
        Ok(fetched) if fetched == bytes => {}
        Ok(_) => fail!(
            case,
            "{context}: a batched read of `{key}` gives other bytes than read_at"
        ),
        Err(e) => fail!(case, "{context}: a batched read of `{key}` failed: {e}"),
    }
    let reader = Reader::open(source)
        .unwrap_or_else(|e| fail!(case, "{context}: Reader::open of `{key}` failed: {e}"));
    let loaded = reader
        .load_all()
        .unwrap_or_else(|e| fail!(case, "{context}: Reader::load_all of `{key}` failed: {e}"));
    for (info, tensor) in loaded {
        if tensor.to_vec().ok() != expected.read(info.name()).ok() {
            fail!(
                case,
                "{context}: Reader::load_all of `{key}` gives other bytes for {}",
                info.name()
            );
        }
    }
}

/// Where the backend lists: `key` is listed exactly when it holds a container (of `held`
/// bytes), and everything listed opens with the listed length: a scratch file, staged upload
/// or half-written container never shows.
pub(crate) fn assert_listing_agrees(
    case: &str,
    context: &str,
    storage: &dyn Storage,
    key: &str,
    held: Option<usize>,
) {
    if !storage.capabilities().listing {
        return;
    }
    let listed = storage
        .list("")
        .unwrap_or_else(|e| fail!(case, "{context}: list failed: {e}"));
    let listed_len = listed.iter().find(|l| l.key == key).map(|l| l.len);
    if listed_len != held.map(|len| len as u64) {
        fail!(
            case,
            "{context}: `{key}` holds {held:?} bytes but the listing says {listed_len:?}: {listed:?}"
        );
    }
    for entry in &listed {
        match storage.open(&entry.key) {
            Ok(source) if source.len() == entry.len => {}
            Ok(source) => fail!(
                case,
                "{context}: `{}` is listed with {} bytes but opens with {}",
                entry.key,
                entry.len,
                source.len()
            ),
            Err(e) => fail!(
                case,
                "{context}: `{}` is listed but does not open: {e}",
                entry.key
            ),
        }
    }
}

pub(crate) fn assert_nothing_pending(case: &str, context: &str, storage: &dyn Storage) {
    if storage.capabilities().pending_listing {
        match storage.pending("") {
            Ok(pending) if pending.is_empty() => {}
            Ok(pending) => fail!(
                case,
                "{context}: unfinished writes left behind: {pending:?}"
            ),
            Err(e) => fail!(case, "{context}: pending() failed: {e}"),
        }
    }
}

/// The key most cases write.
pub(crate) const KEY: &str = "checkpoints/model.bpk";

/// The key an interrupted-write case writes in `mode`: [`KEY`], which holds the old container,
/// to overwrite; a free key to create new.
pub(crate) fn key_for(mode: WriteMode) -> &'static str {
    if mode == WriteMode::CreateNew {
        "fresh.bpk"
    } else {
        KEY
    }
}

/// After a write in `mode` of `new` over `old` was interrupted: the key holds the new container
/// when the write reported success (`succeeded` names when), else the old one (nothing, for
/// create-new) or the new one; complete and verifying either way.
pub(crate) fn assert_old_or_new(
    case: &str,
    context: &str,
    storage: &dyn Storage,
    mode: WriteMode,
    old: &ContainerSpec,
    new: &ContainerSpec,
    succeeded: Option<&str>,
) {
    let new = new.bytes();
    if let Some(when) = succeeded {
        let context = format!("{context}, {when}");
        assert_holds_one_of(case, &context, storage, key_for(mode), &[Some(&new)]);
        return;
    }
    let old = (mode != WriteMode::CreateNew).then(|| old.bytes());
    assert_holds_one_of(
        case,
        context,
        storage,
        key_for(mode),
        &[old.as_deref(), Some(&new)],
    );
}

/// A container the backend writes as several pieces ([`Harness::several_parts_len`]), its
/// bytes set by `fill`.
pub(crate) fn several_parts<H: Harness>(harness: &H, fill: u8) -> ContainerSpec {
    let half = harness.several_parts_len() / 2 + 1;
    sample(&[half, 5, half], fill)
}

/// A container of eleven parts and more of the backend's (4.5 × `several_parts_len`, which
/// is two and a half parts): an upload whose part numbers pass 9, so one that orders parts
/// as strings ("10" before "2") or drops the tenth is caught on every harness, real servers
/// included.
pub(crate) fn many_parts<H: Harness>(harness: &H, fill: u8) -> ContainerSpec {
    let each = harness.several_parts_len() * 9 / 10 + 1;
    sample(&[each; 5], fill)
}

/// `spec` written to [`KEY`] of `storage`, and opened again.
pub(crate) fn written_and_opened(
    storage: &dyn Storage,
    spec: &ContainerSpec,
    case: &str,
) -> Arc<dyn Source> {
    spec.writer()
        .write_to(storage, KEY)
        .unwrap_or_else(|e| fail!(case, "write: {e}"));
    storage
        .open(KEY)
        .unwrap_or_else(|e| fail!(case, "open: {e}"))
}
