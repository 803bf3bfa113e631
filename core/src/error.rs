//! The error vocabulary shared by every component.
//!
//! The distinctions are the ones callers act on: a configuration rejected at
//! construction ([`ConfigError`], naming the argument and the value), a cache
//! that could not answer ([`CacheError`]), "not now" refusals that say when to
//! come back ([`RateLimitExceeded`](crate::limiter::RateLimitExceeded),
//! [`CircuitOpen`](crate::breaker::CircuitOpen)), and retry exhaustion
//! ([`RetryExhausted`](crate::retry::RetryExhausted)), which carries its last
//! failure as `source()`.

use std::fmt;

/// A configuration value rejected at construction, before anything is stored.
///
/// The message names the argument and the value:
/// `rpm must be positive, got 0`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{field} must be {expected}, got {value}")]
pub struct ConfigError {
    /// The argument, by the name the constructor gives it (`rpm`, `window_seconds`).
    pub field: &'static str,
    /// What a valid value looks like (`positive`, `at least initial_delay`).
    pub expected: &'static str,
    /// The rejected value, as the caller would write it.
    pub value: String,
}

impl ConfigError {
    /// A rejection of `field`'s `value`, which should have been `expected`.
    pub fn new(field: &'static str, expected: &'static str, value: impl fmt::Display) -> Self {
        ConfigError {
            field,
            expected,
            value: value.to_string(),
        }
    }
}

/// A cache operation that did not complete.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CacheError {
    /// The cache could not be reached, did not answer in time, or had no
    /// room for what it was asked to keep (an in-process hit series at the
    /// most hits one can hold). Transient: the same call may succeed once
    /// the cache is back, or has pruned.
    #[error("cache unavailable during {operation}: {reason}")]
    Unavailable {
        /// The port operation that failed (`acquire_slot`, `get`).
        operation: &'static str,
        /// What went wrong, with any credentials removed.
        reason: String,
    },
    /// `increment` on a key whose value is not a decimal integer.
    #[error("cannot increment {key}: its value is not an integer")]
    NotAnInteger {
        /// The key holding the non-numeric value.
        key: String,
    },
    /// The cache refused the credentials: a wrong or missing password (or a
    /// password sent to a server that has none). A misconfiguration, not a
    /// transient fault: it is never routed to a component's
    /// cache-unavailable policy, and every operation reports it until the
    /// configuration is fixed.
    #[error("authentication failed during {operation}: wrong or missing password for {target}")]
    Authentication {
        /// The port operation that was refused.
        operation: &'static str,
        /// The server, as safe to print (any password replaced by `***`).
        target: String,
    },
    /// The cache has been closed.
    #[error("cache is closed")]
    Closed,
    /// The cache answered with something the adapter cannot interpret — a bug
    /// or a foreign writer, not a transient fault.
    #[error("cache answered {operation} with an unexpected reply: {detail}")]
    Protocol {
        /// The port operation whose reply was wrong.
        operation: &'static str,
        /// What was wrong with it.
        detail: String,
    },
}

impl CacheError {
    /// Whether retrying the same operation later may succeed.
    pub fn is_transient(&self) -> bool {
        matches!(self, CacheError::Unavailable { .. })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_error_names_field_and_value() {
        let e = ConfigError::new("rpm", "positive", 0);
        assert_eq!(e.to_string(), "rpm must be positive, got 0");
    }
}
