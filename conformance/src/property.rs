//! The seeded property runner: every property case runs [`property_cases`] inputs from a seed
//! printed on failure and taken back from `WEIGHTBAY_SEED`.

use proptest::prelude::*;
use proptest::test_runner::{Config, RngAlgorithm, TestCaseError, TestError, TestRng, TestRunner};

use crate::outcome::fail;

/// Property cases per run: `WEIGHTBAY_CASES`, default 32.
pub fn property_cases() -> u32 {
    std::env::var("WEIGHTBAY_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(32)
}

/// Runs a property with a reproducible seed: `WEIGHTBAY_SEED` (hex) when set, else a fresh
/// one, printed on failure.
pub(crate) fn run_property<S: Strategy>(
    case: &str,
    strategy: S,
    test: impl Fn(S::Value) -> Result<(), TestCaseError>,
) where
    S::Value: std::fmt::Debug,
{
    let seed: [u8; 32] = match std::env::var("WEIGHTBAY_SEED") {
        Ok(hex) => {
            parse_seed(&hex).unwrap_or_else(|| fail!(case, "WEIGHTBAY_SEED must be 64 hex digits"))
        }
        Err(_) => {
            // A fresh seed from the standard library's per-process random hasher keys.
            let mut seed = [0u8; 32];
            for chunk in seed.chunks_mut(8) {
                let random = std::hash::BuildHasher::hash_one(
                    &std::collections::hash_map::RandomState::new(),
                    0u8,
                );
                chunk.copy_from_slice(&random.to_le_bytes());
            }
            seed
        }
    };
    let config = Config {
        cases: property_cases(),
        failure_persistence: None,
        ..Config::default()
    };
    let mut runner =
        TestRunner::new_with_rng(config, TestRng::from_seed(RngAlgorithm::ChaCha, &seed));
    if let Err(error) = runner.run(&strategy, test) {
        let hex: String = seed.iter().map(|b| format!("{b:02x}")).collect();
        match error {
            TestError::Fail(reason, input) => {
                fail!(
                    case,
                    "{reason}\nminimal input: {input:#?}\nreplay with WEIGHTBAY_SEED={hex}"
                )
            }
            TestError::Abort(reason) => fail!(case, "aborted: {reason} (WEIGHTBAY_SEED={hex})"),
        }
    }
}

pub(crate) fn parse_seed(hex: &str) -> Option<[u8; 32]> {
    let mut seed = [0u8; 32];
    if hex.len() != 64 {
        return None;
    }
    for (i, byte) in seed.iter_mut().enumerate() {
        *byte = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(seed)
}
