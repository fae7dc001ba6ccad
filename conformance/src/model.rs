//! A model of what a storage should hold: a `BTreeMap` from key to container version, which
//! the model-based case and the `storage_ops` fuzz target drive alongside a real backend.

use std::collections::BTreeMap;

use weightbay::backend_kit::is_under;
use weightbay::{CreateOptions, ErrorKind, Listed, Storage, WriteMode};

use crate::Faulty;
use crate::strategies::sample;

/// The keys operations act on: nested directories on purpose.
pub const KEYS: [&str; 3] = ["a.bpk", "dir/b.bpk", "dir/sub/c.bpk"];
/// How many distinct container versions operations write.
pub const VERSIONS: u8 = 4;

/// One storage operation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    /// Write version `version` to `KEYS[key]`, create-new or overwrite; with `fail_at`, the
    /// storage fails its operation number `fail_at` during the write.
    Put {
        /// Index into [`KEYS`].
        key: usize,
        /// Which container version (below [`VERSIONS`]).
        version: u8,
        /// Create-new instead of overwrite.
        create_new: bool,
        /// The storage operation to fail, if any.
        fail_at: Option<u64>,
    },
    /// Start writing `version` to `KEYS[key]`, then drop the sink half way.
    Abort {
        /// Index into [`KEYS`].
        key: usize,
        /// Which container version.
        version: u8,
    },
    /// Delete `KEYS[key]`.
    Delete {
        /// Index into [`KEYS`].
        key: usize,
    },
    /// Open `KEYS[key]`.
    Open {
        /// Index into [`KEYS`].
        key: usize,
    },
    /// Read `len` bytes at `start` of `KEYS[key]`.
    ReadRange {
        /// Index into [`KEYS`].
        key: usize,
        /// First byte.
        start: u64,
        /// How many bytes.
        len: u64,
    },
}

/// The expected contents of each key.
#[derive(Debug, Default, Clone)]
pub struct Model {
    held: BTreeMap<usize, u8>,
}

/// The prefixes the listing is checked under: the whole storage, a directory and a nested
/// one, a string prefix of a key that is no directory, and a key itself (both list nothing).
pub const LIST_PREFIXES: [&str; 5] = ["", "dir", "dir/sub", "di", "a.bpk"];

/// The bytes of container `version`.
pub fn version_bytes(version: u8) -> Vec<u8> {
    sample(&[10 + usize::from(version) * 300, 5], version).bytes()
}

fn key(index: usize) -> Result<&'static str, String> {
    KEYS.get(index)
        .copied()
        .ok_or_else(|| format!("no key number {index}"))
}

impl Model {
    /// Performs `op` on `storage`, checks its result against the model, and updates the model.
    ///
    /// # Errors
    /// A description of the first difference.
    pub fn apply<S: Storage>(&mut self, storage: &S, op: &Op) -> Result<(), String> {
        match *op {
            Op::Put {
                key: index,
                version,
                create_new,
                fail_at,
            } => {
                let mode = if create_new {
                    WriteMode::CreateNew
                } else {
                    WriteMode::Overwrite
                };
                let writer = sample(&[10 + usize::from(version) * 300, 5], version)
                    .writer()
                    .with_mode(mode);
                let result = match fail_at {
                    Some(n) => writer.write_to(&Faulty::failing_at(storage, n), key(index)?),
                    None => writer.write_to(storage, key(index)?),
                };
                let expected = match (
                    create_new,
                    storage.capabilities().atomic_create_new,
                    self.held.contains_key(&index),
                ) {
                    (true, false, _) => Err(ErrorKind::Unsupported),
                    (true, true, true) => Err(ErrorKind::AlreadyExists),
                    _ => Ok(()),
                };
                match (&result, expected) {
                    (Err(e), _) if fail_at.is_some() && crate::is_injected(e) => {}
                    (Ok(_), Ok(())) => {
                        self.held.insert(index, version);
                    }
                    (Err(e), Err(kind)) if e.kind() == kind => {}
                    _ => {
                        return Err(format!(
                            "expected {expected:?}, got {:?}",
                            result.map(|_| ()).map_err(|e| e.to_string())
                        ));
                    }
                }
            }
            Op::Abort {
                key: index,
                version,
            } => {
                let mut sink = storage
                    .create(key(index)?, &CreateOptions::default())
                    .map_err(|e| format!("create: {e}"))?;
                let bytes = version_bytes(version);
                sink.write(&bytes[..bytes.len() / 2])
                    .map_err(|e| format!("write: {e}"))?;
                drop(sink);
            }
            Op::Delete { key: index } => {
                let result = storage.delete(key(index)?).map_err(|e| e.kind());
                let expected = if self.held.remove(&index).is_some() {
                    Ok(())
                } else {
                    Err(ErrorKind::NotFound)
                };
                if result != expected {
                    return Err(format!("delete: expected {expected:?}, got {result:?}"));
                }
            }
            Op::Open { key: index } => {
                let result = storage.open(key(index)?).map(|_| ()).map_err(|e| e.kind());
                let expected = if self.held.contains_key(&index) {
                    Ok(())
                } else {
                    Err(ErrorKind::NotFound)
                };
                if result != expected {
                    return Err(format!("open: expected {expected:?}, got {result:?}"));
                }
            }
            Op::ReadRange {
                key: index,
                start,
                len,
            } => {
                let Some(&version) = self.held.get(&index) else {
                    return Ok(());
                };
                let source = storage
                    .open(key(index)?)
                    .map_err(|e| format!("open: {e}"))?;
                let bytes = version_bytes(version);
                let mut buf = vec![0; usize::try_from(len).map_err(|e| e.to_string())?];
                let result = source.read_at(start, &mut buf);
                let end = start.saturating_add(len);
                match result {
                    Ok(()) if end <= bytes.len() as u64 => {
                        // In range of a small in-memory container.
                        if buf != bytes[start as usize..end as usize] {
                            return Err(format!("read_at({start}, {len}) returned other bytes"));
                        }
                    }
                    Err(e) if end > bytes.len() as u64 && e.kind() == ErrorKind::OutOfRange => {}
                    other => {
                        return Err(format!(
                            "read_at({start}, {len}) of {} bytes: {:?}",
                            bytes.len(),
                            other.map_err(|e| e.to_string())
                        ));
                    }
                }
            }
        }
        Ok(())
    }

    /// Compares [`Storage::list`] under each of [`LIST_PREFIXES`] with the model's keys and
    /// lengths.
    ///
    /// # Errors
    /// A description of the first difference.
    pub fn check_listing<S: Storage>(&self, storage: &S) -> Result<(), String> {
        for prefix in LIST_PREFIXES {
            let listed = storage
                .list(prefix)
                .map_err(|e| format!("list({prefix:?}): {e}"))?;
            let expected: Vec<Listed> = self
                .held
                .iter()
                .map(|(&index, &version)| Listed {
                    key: KEYS[index].to_owned(),
                    len: version_bytes(version).len() as u64,
                })
                .filter(|listed| is_under(&listed.key, prefix))
                .collect::<std::collections::BTreeSet<_>>()
                .into_iter()
                .collect();
            if listed != expected {
                return Err(format!(
                    "list({prefix:?}) returned {listed:?}, but the committed containers are {expected:?}"
                ));
            }
        }
        Ok(())
    }

    /// Compares every key of `storage` with the model (and its listing, where declared), and
    /// checks nothing is pending.
    ///
    /// # Errors
    /// A description of the first difference.
    pub fn check<S: Storage>(&self, storage: &S) -> Result<(), String> {
        for (index, key) in KEYS.iter().enumerate() {
            let actual = crate::holdings::stored(storage, key);
            match (self.held.get(&index), actual) {
                (Some(&version), Ok(bytes)) if bytes == version_bytes(version) => {}
                (None, Err(e)) if e.kind() == ErrorKind::NotFound => {}
                (expected, actual) => {
                    return Err(format!(
                        "`{key}` should hold {}, but {}",
                        expected.map_or("nothing".to_string(), |v| format!("version {v}")),
                        match actual {
                            Ok(bytes) => format!("it holds {} other bytes", bytes.len()),
                            Err(e) => format!("reading it failed: {e}"),
                        }
                    ));
                }
            }
        }
        if storage.capabilities().listing {
            self.check_listing(storage)?;
        }
        if storage.capabilities().pending_listing {
            let pending = storage.pending("").map_err(|e| format!("pending: {e}"))?;
            if !pending.is_empty() {
                return Err(format!("unfinished writes left behind: {pending:?}"));
            }
        }
        Ok(())
    }
}
