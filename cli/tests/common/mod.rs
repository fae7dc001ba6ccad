//! What the command's test files share: running the built `weightbay` as a user would.

use std::process::{Command, Output};

/// Runs `weightbay` with `args`, without a backtrace in its errors.
pub(crate) fn weightbay(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_weightbay"))
        .args(args)
        .env_remove("RUST_BACKTRACE")
        .output()
        .unwrap()
}

/// Its standard output and error, as text.
pub(crate) fn text(output: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}
