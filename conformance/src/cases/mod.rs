//! The conformance cases, one module per concern, each case a public function generic over a
//! [`Harness`] that takes the harness and the name of the running test. The list of cases is
//! [`Case`]'s, in `case.rs`.

pub mod checkpoints;
pub mod compressed_crash;
pub mod crash;
pub mod create_new;
pub mod faults;
pub mod incremental;
pub mod memory;
pub mod positioned;
pub mod ranks;
pub mod read_back;
pub mod reads;
pub mod scope;
pub mod tiered;
pub mod writes;

use crate::case::{Case, with_cases};
use crate::harness::Harness;
use crate::outcome::Outcome;

/// Defines [`Case::run`] from the list.
macro_rules! define_run {
    ($($module:ident :: $function:ident => $variant:ident,)*) => {
        impl Case {
            /// Runs the case on `harness`. `test` names the running test in failure messages,
            /// and must be the libtest name of the running test for a case that re-runs it in
            /// a child process ([`crash::process_crash_at_every_step`]).
            pub fn run<H: Harness>(self, harness: &H, test: &str) -> Outcome {
                match self {
                    $(Case::$variant => $module::$function(harness, test),)*
                }
            }
        }
    };
}

with_cases!(define_run);
