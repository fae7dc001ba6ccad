//! The one error type of weightbay: a kind to match on, the operation that failed, the
//! context a person needs (key, tensor, offset) and the underlying cause.

use std::fmt;

/// Result alias used across weightbay.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What went wrong, coarse enough to match on. New kinds may be added.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// The key, tensor or file does not exist.
    NotFound,
    /// Create-new found something already at the key.
    AlreadyExists,
    /// Bytes do not form a valid container (bad magic, broken CBOR, checksum mismatch, ...).
    Corrupt,
    /// A declared size or count is over one of the named hardening limits.
    LimitExceeded,
    /// The caller's input is invalid (duplicate tensor name, wrong byte length, bad key, ...).
    InvalidInput,
    /// The backend does not offer this operation or option.
    Unsupported,
    /// A range falls outside the available bytes.
    OutOfRange,
    /// Access would need a copy and the caller's `AccessPolicy` refused one.
    WouldCopy,
    /// What a source was reading changed after it was opened (an object replaced or deleted
    /// under a version-pinned read): nothing mixed was returned; open it again to read the new
    /// version.
    Changed,
    /// The underlying I/O (disk, network, object store) failed.
    Io,
    /// A tensor provider (user code) failed or panicked.
    Provider,
    /// The caller cancelled the operation (`Writer::with_cancel`, Ctrl-C in the CLI).
    Interrupted,
    /// The operation did not finish by the caller's deadline (`Writer::with_deadline`,
    /// [`CreateOptions::deadline`](crate::CreateOptions::deadline)) and was given up.
    TimedOut,
}

impl ErrorKind {
    fn as_str(self) -> &'static str {
        match self {
            Self::NotFound => "not found",
            Self::AlreadyExists => "already exists",
            Self::Corrupt => "corrupt container",
            Self::LimitExceeded => "limit exceeded",
            Self::InvalidInput => "invalid input",
            Self::Unsupported => "unsupported",
            Self::OutOfRange => "out of range",
            Self::WouldCopy => "would copy",
            Self::Changed => "changed since opened",
            Self::Io => "I/O error",
            Self::Provider => "tensor provider failed",
            Self::Interrupted => "interrupted",
            Self::TimedOut => "timed out",
        }
    }
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The cause an [`Error`] wraps, when there is one.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// The weightbay error: a [`kind`](Error::kind), a message, the operation that failed and
/// whatever context applies (key, tensor name, byte offset), plus the underlying cause.
///
/// ```
/// use weightbay::{Error, ErrorKind};
/// let err = Error::new(ErrorKind::Corrupt, "tensor ends past the end of the container")
///     .with_operation("open")
///     .with_tensor("layer.weight")
///     .with_offset(4096);
/// assert_eq!(err.kind(), ErrorKind::Corrupt);
/// assert_eq!(
///     err.to_string(),
///     "open: corrupt container: tensor ends past the end of the container \
///      (tensor `layer.weight`, offset 4096)"
/// );
/// ```
#[derive(Debug, thiserror::Error)]
#[error(transparent)]
pub struct Error(Box<Inner>);

/// Boxed so that `Result<T, Error>` stays one pointer wide on the happy path.
#[derive(Debug, thiserror::Error)]
#[error("{}", self.render())]
struct Inner {
    kind: ErrorKind,
    message: String,
    operation: Option<&'static str>,
    key: Option<String>,
    tensor: Option<String>,
    offset: Option<u64>,
    #[source]
    source: Option<BoxError>,
}

impl Error {
    /// An error of `kind` with a message a person can act on.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Self(Box::new(Inner {
            kind,
            message: message.into(),
            operation: None,
            key: None,
            tensor: None,
            offset: None,
            source: None,
        }))
    }

    /// An [`ErrorKind::Io`] error (or NotFound / AlreadyExists when the I/O error says so)
    /// wrapping `source`.
    pub fn io(message: impl Into<String>, source: std::io::Error) -> Self {
        let kind = match source.kind() {
            std::io::ErrorKind::NotFound => ErrorKind::NotFound,
            std::io::ErrorKind::AlreadyExists => ErrorKind::AlreadyExists,
            std::io::ErrorKind::Unsupported => ErrorKind::Unsupported,
            std::io::ErrorKind::UnexpectedEof => ErrorKind::OutOfRange,
            std::io::ErrorKind::TimedOut => ErrorKind::TimedOut,
            _ => ErrorKind::Io,
        };
        Self::new(kind, message).with_source(source)
    }

    /// Shorthand for a [`ErrorKind::Corrupt`] error.
    pub fn corrupt(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Corrupt, message)
    }

    /// Shorthand for an [`ErrorKind::InvalidInput`] error.
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::InvalidInput, message)
    }

    /// Shorthand for an [`ErrorKind::Unsupported`] error.
    pub fn unsupported(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Unsupported, message)
    }

    /// Names the operation that failed (`"create"`, `"open"`, `"commit"`, ...), unless an
    /// inner layer already named a more precise one.
    #[must_use]
    pub fn with_operation(mut self, operation: &'static str) -> Self {
        self.0.operation.get_or_insert(operation);
        self
    }

    /// Names the storage key involved, unless already named.
    #[must_use]
    pub fn with_key(mut self, key: impl Into<String>) -> Self {
        if self.0.key.is_none() {
            self.0.key = Some(key.into());
        }
        self
    }

    /// Names the tensor involved, unless already named.
    #[must_use]
    pub fn with_tensor(mut self, tensor: impl Into<String>) -> Self {
        if self.0.tensor.is_none() {
            self.0.tensor = Some(tensor.into());
        }
        self
    }

    /// Records the byte offset involved, unless already recorded.
    #[must_use]
    pub fn with_offset(mut self, offset: u64) -> Self {
        self.0.offset.get_or_insert(offset);
        self
    }

    /// Attaches the underlying cause, unless one is attached already: an outer layer adds
    /// what it knows with [`context`](Self::context) and never replaces the original cause.
    #[must_use]
    pub fn with_source(mut self, source: impl Into<BoxError>) -> Self {
        if self.0.source.is_none() {
            self.0.source = Some(source.into());
        }
        self
    }

    /// Says what was being done when the error happened, in front of the message
    /// (`"{context}: {message}"`), keeping the kind, operation, key, tensor, offset and the
    /// source chain.
    ///
    /// ```
    /// use std::error::Error as _;
    /// use weightbay::{Error, ErrorKind};
    /// let io = std::io::Error::new(std::io::ErrorKind::NotFound, "no such file");
    /// let err = Error::io("opening", io).with_key("m.bpk").context("loading the model");
    /// assert_eq!(err.kind(), ErrorKind::NotFound);
    /// assert_eq!(err.message(), "loading the model: opening");
    /// assert!(err.source().is_some_and(|s| s.is::<std::io::Error>()));
    /// ```
    #[must_use]
    pub fn context(mut self, context: impl fmt::Display) -> Self {
        self.0.message = format!("{context}: {}", self.0.message);
        self
    }

    /// What went wrong, to match on.
    pub fn kind(&self) -> ErrorKind {
        self.0.kind
    }

    /// The message without context.
    pub fn message(&self) -> &str {
        &self.0.message
    }

    /// The operation that failed, if named.
    pub fn operation(&self) -> Option<&'static str> {
        self.0.operation
    }

    /// The storage key involved, if any.
    pub fn key(&self) -> Option<&str> {
        self.0.key.as_deref()
    }

    /// The tensor involved, if any.
    pub fn tensor(&self) -> Option<&str> {
        self.0.tensor.as_deref()
    }

    /// The byte offset involved, if any.
    pub fn offset(&self) -> Option<u64> {
        self.0.offset
    }
}

impl Inner {
    fn render(&self) -> String {
        use fmt::Write as _;
        let mut out = String::new();
        if let Some(operation) = self.operation {
            let _ = write!(out, "{operation}: ");
        }
        let _ = write!(out, "{}: {}", self.kind, self.message);
        let mut context = Vec::new();
        if let Some(key) = &self.key {
            context.push(format!("key `{key}`"));
        }
        if let Some(tensor) = &self.tensor {
            context.push(format!("tensor `{tensor}`"));
        }
        if let Some(offset) = self.offset {
            context.push(format!("offset {offset}"));
        }
        if !context.is_empty() {
            let _ = write!(out, " ({})", context.join(", "));
        }
        if let Some(source) = &self.source {
            let _ = write!(out, ": {source}");
        }
        out
    }
}

/// An I/O error of the matching kind wrapping the weightbay error, for code that speaks
/// `std::io` (as `object_store` converts its errors); [`From<std::io::Error>`] unwraps it again.
impl From<Error> for std::io::Error {
    fn from(error: Error) -> Self {
        use std::io::ErrorKind as Io;
        let kind = match error.kind() {
            ErrorKind::NotFound => Io::NotFound,
            ErrorKind::AlreadyExists => Io::AlreadyExists,
            ErrorKind::Corrupt => Io::InvalidData,
            ErrorKind::InvalidInput | ErrorKind::LimitExceeded => Io::InvalidInput,
            ErrorKind::Unsupported => Io::Unsupported,
            ErrorKind::OutOfRange => Io::UnexpectedEof,
            ErrorKind::Interrupted => Io::Interrupted,
            ErrorKind::TimedOut => Io::TimedOut,
            ErrorKind::WouldCopy | ErrorKind::Changed | ErrorKind::Io | ErrorKind::Provider => {
                Io::Other
            }
        };
        Self::new(kind, error)
    }
}

/// The weightbay error an I/O error carries (see [`From<Error> for std::io::Error`]), or an
/// error of the matching kind with the I/O error as its source.
impl From<std::io::Error> for Error {
    fn from(error: std::io::Error) -> Self {
        if !error.get_ref().is_some_and(|inner| inner.is::<Error>()) {
            return Self::io("I/O failed", error);
        }
        match error.into_inner().map(|inner| inner.downcast::<Error>()) {
            Some(Ok(ours)) => *ours,
            // Not reached: the inner error was checked to be ours just above.
            _ => Self::new(ErrorKind::Io, "an I/O error lost its cause"),
        }
    }
}
