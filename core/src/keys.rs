//! Keys: the one spelling every backend accepts, listing prefixes, and names no other write
//! uses at the same time.

use crate::{Error, Result};

/// The longest key accepted, in bytes.
pub const MAX_KEY_LEN: usize = 1024;

/// Checks that `key` is a relative `/`-separated path: non-empty, at most [`MAX_KEY_LEN`]
/// bytes, no empty, `.` or `..` segment, no leading `/`, no backslash or NUL. Every backend
/// applies the same rule so a key means the same thing everywhere.
///
/// # Errors
/// [`ErrorKind::InvalidInput`](crate::ErrorKind::InvalidInput) naming the key.
pub fn validate_key(key: &str) -> Result<()> {
    let problem = if key.is_empty() {
        Some("is empty")
    } else if key.len() > MAX_KEY_LEN {
        Some("is longer than 1024 bytes")
    } else if key.contains(['\\', '\0']) {
        Some("contains a backslash or NUL")
    } else if key
        .split('/')
        .any(|segment| matches!(segment, "" | "." | ".."))
    {
        Some("has an empty, `.` or `..` segment (or a leading or trailing `/`)")
    } else {
        None
    };
    match problem {
        Some(problem) => Err(Error::invalid(format!("key {problem}")).with_key(key)),
        None => Ok(()),
    }
}

/// Checks a listing prefix: empty, or a valid key.
///
/// # Errors
/// [`ErrorKind::InvalidInput`](crate::ErrorKind::InvalidInput) as [`validate_key`] says.
pub fn validate_prefix(prefix: &str) -> Result<()> {
    if prefix.is_empty() {
        Ok(())
    } else {
        validate_key(prefix)
    }
}

/// Whether `key` lies under the listing prefix `prefix` (see
/// [`Storage::list`](crate::Storage::list)).
pub fn is_under(key: &str, prefix: &str) -> bool {
    prefix.is_empty()
        || key
            .strip_prefix(prefix)
            .is_some_and(|rest| rest.starts_with('/'))
}

/// A token no other write uses at the same time, in any process on any machine: this
/// process's id, a per-process counter and a random number (`4242-7-9f0c…`). Writers and
/// backends build the names of staged uploads and shards from it.
pub fn unique_token() -> String {
    use std::hash::BuildHasher;
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let pid = std::process::id();
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    // A fresh random key per call (the standard library seeds each RandomState anew).
    let random = std::collections::hash_map::RandomState::new().hash_one((
        pid,
        n,
        std::time::SystemTime::now(),
    ));
    format!("{pid}-{n}-{random:016x}")
}

/// Whether `text` has the shape [`unique_token`] gives (`4242-7-9f0c…`): how a backend checks
/// that a name it finds in storage is one of its own before it acts on it.
pub fn is_unique_token(text: &str) -> bool {
    let mut parts = text.split('-');
    let digits = |part: Option<&str>| {
        part.is_some_and(|p| {
            !p.is_empty() && p.len() <= 20 && p.bytes().all(|b| b.is_ascii_digit())
        })
    };
    let hex = |part: Option<&str>| {
        part.is_some_and(|p| {
            p.len() == 16 && p.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
        })
    };
    digits(parts.next()) && digits(parts.next()) && hex(parts.next()) && parts.next().is_none()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorKind;

    #[test]
    fn tokens_are_recognized_and_other_names_are_not() {
        assert!(is_unique_token(&unique_token()));
        for other in [
            "",
            "1-2",
            "1-2-3",
            "a-2-0123456789abcdef",
            "1-2-0123456789ABCDEF",
            "1-2-0123456789abcdef-x",
            "../../x",
        ] {
            assert!(!is_unique_token(other), "{other}");
        }
    }

    #[test]
    fn keys_are_relative_paths() {
        for good in ["model.bpk", "runs/7/step-100.bpk", "ünïcode/名前"] {
            validate_key(good).unwrap();
        }
        for bad in [
            "",
            "/abs",
            "a//b",
            "a/./b",
            "../up",
            "trail/",
            "back\\slash",
            "nul\0",
        ] {
            assert_eq!(
                validate_key(bad).unwrap_err().kind(),
                ErrorKind::InvalidInput,
                "{bad:?}"
            );
        }
        assert!(validate_key(&"k".repeat(MAX_KEY_LEN + 1)).is_err());
        validate_key(&"k".repeat(MAX_KEY_LEN)).unwrap();
    }
}
