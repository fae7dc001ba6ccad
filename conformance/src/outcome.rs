//! What a case reports: [`Outcome`] when it did not fail, a panic naming it when it did
//! ([`fail!`]), and why a case cannot run on a backend.

/// Fails the running case with a message naming it.
macro_rules! fail {
    ($case:expr, $($arg:tt)*) => {
        panic!("conformance case `{}` failed: {}", $case, format!($($arg)*))
    };
}
pub(crate) use fail;

/// What a case found, when it did not fail.
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use]
pub enum Outcome {
    /// Everything the case covers was checked and held.
    Checked,
    /// The case cannot run on this backend, for the reason given (no simulated file system,
    /// nothing that outlives the process). [`verdict`](crate::verdict) fails it unless the
    /// harness declares it in [`Harness::not_applicable`](crate::Harness::not_applicable).
    NotApplicable(String),
}

/// Why the file-system cases cannot run on a backend.
pub(crate) const NO_FILE_SYSTEM: &str =
    "the backend does not do its I/O through weightbay::backend_kit::FileSystem";
