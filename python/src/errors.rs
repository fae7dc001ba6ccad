//! weightbay errors as Python exceptions: the class `weightbay.errors` gives the error's kind
//! (a `NotFoundError` is also a `FileNotFoundError`, a `CorruptError` also a `ValueError`),
//! the key, tensor and offset the error names as attributes, and each cause as `__cause__`.

use pyo3::exceptions::{PyOSError, PyRuntimeError};
use pyo3::prelude::*;
use weightbay::{Error, ErrorKind};

/// The exception class of `weightbay.errors` for a kind.
fn class_name(kind: ErrorKind) -> &'static str {
    match kind {
        ErrorKind::NotFound => "NotFoundError",
        ErrorKind::AlreadyExists => "AlreadyExistsError",
        ErrorKind::Corrupt | ErrorKind::OutOfRange => "CorruptError",
        ErrorKind::LimitExceeded => "LimitExceededError",
        ErrorKind::InvalidInput => "InvalidInputError",
        ErrorKind::Unsupported => "UnsupportedError",
        ErrorKind::Changed => "ChangedError",
        ErrorKind::Io => "StorageError",
        ErrorKind::Interrupted => "InterruptedError",
        ErrorKind::TimedOut => "TimedOutError",
        _ => "Error",
    }
}

/// `error` as the exception of its kind, its causes chained under it.
pub(crate) fn to_py(error: Error) -> PyErr {
    Python::attach(|py| {
        exception(py, &error).unwrap_or_else(|failed| {
            // The errors module could not be imported: the message still reaches the caller.
            PyRuntimeError::new_err(format!("{error} (and raising it failed: {failed})"))
        })
    })
}

fn exception(py: Python<'_>, error: &Error) -> PyResult<PyErr> {
    let errors = py.import("weightbay.errors")?;
    let raised = errors
        .getattr(class_name(error.kind()))?
        .call1((error.to_string(),))?;
    raised.setattr("kind", error.kind().to_string())?;
    raised.setattr("key", error.key())?;
    raised.setattr("tensor", error.tensor())?;
    raised.setattr("offset", error.offset())?;
    let raised = PyErr::from_value(raised);
    // The chain, innermost last: an I/O cause is an OSError with its errno.
    let mut causes = Vec::new();
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        causes.push(match cause.downcast_ref::<std::io::Error>() {
            Some(io) => match io.raw_os_error() {
                Some(errno) => PyOSError::new_err((errno, io.to_string())),
                None => PyOSError::new_err(io.to_string()),
            },
            None => errors
                .getattr("Error")?
                .call1((cause.to_string(),))
                .map(PyErr::from_value)?,
        });
        source = cause.source();
    }
    let mut chained: Option<PyErr> = None;
    for cause in causes.into_iter().rev() {
        cause.set_cause(py, chained.take());
        chained = Some(cause);
    }
    raised.set_cause(py, chained);
    Ok(raised)
}
