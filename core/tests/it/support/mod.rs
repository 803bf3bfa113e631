//! What several test modules share, compiled once for the whole binary.

pub mod cooldown;
pub mod lease;
#[cfg(feature = "redis")]
pub mod redis;
pub mod skew;

/// How many cases a property test runs: `PROPTEST_CASES` when it is set to a
/// number (for a deeper search), else `default`.
pub fn proptest_cases(default: u32) -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}
