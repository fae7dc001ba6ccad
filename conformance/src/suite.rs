//! The runner: every case as a libtest-mimic trial per backend, judged against what the
//! harness declares.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;

use libtest_mimic::{Arguments, Completion, Failed, Trial};

use crate::case::Case;
use crate::harness::Harness;
use crate::outcome::Outcome;
use crate::servers::servers_required;

/// Judges a case's outcome against the harness's declarations: `Ok(None)` when it was checked,
/// `Ok(Some(reason))` when it was not applicable and declared so.
///
/// # Errors
/// A message when the case was not applicable but the harness did not declare it, or was
/// declared not applicable but ran.
pub fn verdict<H: Harness>(
    harness: &H,
    case: Case,
    outcome: Outcome,
) -> Result<Option<String>, String> {
    let declared = harness.not_applicable().contains(&case);
    let case = case.name();
    match (outcome, declared) {
        (Outcome::Checked, false) => Ok(None),
        (Outcome::NotApplicable(reason), true) => Ok(Some(reason)),
        (Outcome::NotApplicable(reason), false) => Err(format!(
            "conformance case `{case}` could not run ({reason}) and the harness does not list it \
             in `Harness::not_applicable`: an unexpected skip is a failure"
        )),
        (Outcome::Checked, true) => Err(format!(
            "conformance case `{case}` ran, but the harness lists it in \
             `Harness::not_applicable`: remove it from the list"
        )),
    }
}

/// The conformance cases as tests, for one or more backends, run by libtest-mimic.
///
/// [`suite!`](crate::suite) is this for one backend. A test binary with several harnesses names
/// each:
///
/// ```no_run
/// # use weightbay::MemoryStorage;
/// # struct Memory;
/// # impl weightbay_conformance::Harness for Memory {
/// #     type Storage = MemoryStorage;
/// #     fn fresh(&self) -> MemoryStorage { MemoryStorage::new() }
/// #     fn reopen(&self, s: &MemoryStorage) -> MemoryStorage { s.clone() }
/// # }
/// fn main() {
///     weightbay_conformance::Suite::new()
///         .backend("first", Memory)
///         .backend("second", Memory)
///         .run();
/// }
/// ```
#[derive(Debug, Default)]
pub struct Suite {
    trials: Vec<Trial>,
}

impl Suite {
    /// An empty suite.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds every case for `harness`, named `name::case` (or `case` when `name` is empty).
    #[must_use]
    pub fn backend<H: Harness>(mut self, name: &str, harness: H) -> Self {
        let harness = Arc::new(harness);
        let unavailable = harness.unavailable();
        if let Some(why) = &unavailable
            && !servers_required()
        {
            eprintln!(
                "{name}: every case ignored: {why} (run scripts/test.sh, or set \
                 WEIGHTBAY_REQUIRE_SERVERS=1 to fail instead)"
            );
        }
        // The peak-memory case needs the counting allocator: memory_bound! runs it, in a test
        // binary of its own.
        for &case in Case::ALL
            .iter()
            .filter(|&&case| case != Case::PeakMemoryIsBounded)
        {
            let test = if name.is_empty() {
                case.name().to_owned()
            } else {
                format!("{name}::{}", case.name())
            };
            let harness = Arc::clone(&harness);
            let unavailable = unavailable.clone();
            let name = test.clone();
            self.trials.push(Trial::ignorable_test(test, move || {
                if let Some(why) = unavailable {
                    return if servers_required() {
                        Err(Failed::from(format!(
                            "{why} (WEIGHTBAY_REQUIRE_SERVERS=1, so this is a failure)"
                        )))
                    } else {
                        Ok(Completion::ignored_with(why))
                    };
                }
                if let Some((_, limitation)) = harness
                    .server_limitations()
                    .iter()
                    .find(|(limited, _)| *limited == case)
                {
                    return Ok(Completion::ignored_with(format!(
                        "not applicable on this server: {limitation}"
                    )));
                }
                let outcome = catch_unwind(AssertUnwindSafe(|| case.run(&*harness, &name)))
                    .map_err(|panic| Failed::from(panic_message(&*panic)))?;
                match verdict(&*harness, case, outcome)? {
                    None => Ok(Completion::Completed),
                    Some(reason) => Ok(Completion::ignored_with(format!(
                        "not applicable: {reason}"
                    ))),
                }
            }));
        }
        self
    }

    /// Runs the cases as the test binary's arguments select, then exits with libtest's status.
    pub fn run(self) -> ! {
        libtest_mimic::run(&Arguments::from_args(), self.trials).exit()
    }
}

/// Runs `case` on `harness`, which must fail it, and returns the failure message (which names
/// the case): how a test shows that a deliberately broken backend cannot pass. For a case that
/// re-runs its test in a child process, use [`failure_of_in`].
///
/// # Panics
/// When the case does not fail.
pub fn failure_of<H: Harness>(harness: &H, case: Case) -> String {
    failure_of_in(harness, case, case.name())
}

/// [`failure_of`] run by the test named `test` (as in [`Case::run`]): the libtest name a case
/// that re-runs its test in a child process ([`Case::ProcessCrashAtEveryStep`]) must be given,
/// and the name the failure message then uses.
///
/// # Panics
/// When the case does not fail.
pub fn failure_of_in<H: Harness>(harness: &H, case: Case, test: &str) -> String {
    match catch_unwind(AssertUnwindSafe(|| case.run(harness, test))) {
        Ok(outcome) => panic!("the broken backend passed `{test}`: {outcome:?}"),
        Err(panic) => panic_message(&*panic),
    }
}

/// The text of a panic payload.
fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| panic.downcast_ref::<&str>().map(ToString::to_string))
        .unwrap_or_else(|| "the case panicked".to_owned())
}
