//! From `object_store` errors to weightbay's, keeping the store's message.

use weightbay::{Error, ErrorKind};

/// Converts an `object_store` error, naming what was being done.
pub(crate) fn convert(what: impl Into<String>, error: object_store::Error) -> Error {
    let kind =
        match &error {
            object_store::Error::NotFound { .. } => ErrorKind::NotFound,
            object_store::Error::AlreadyExists { .. }
            | object_store::Error::Precondition { .. } => ErrorKind::AlreadyExists,
            object_store::Error::NotSupported { .. }
            | object_store::Error::NotImplemented { .. } => ErrorKind::Unsupported,
            object_store::Error::InvalidPath { .. }
            | object_store::Error::UnknownConfigurationKey { .. } => ErrorKind::InvalidInput,
            _ => ErrorKind::Io,
        };
    Error::new(kind, what).with_source(error)
}
