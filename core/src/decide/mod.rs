//! The pure decisions: what the limiter, the breaker, the retry budget and
//! the router decide, each a function of the stored state, a command and
//! `now` that returns data and does no I/O.
//!
//! They live apart from the components that use them because a store runs
//! them too: every [`cache`](crate::cache) adapter decides inside its own
//! atomic step (a critical section in memory, a script on Redis), so the
//! port needs these types and functions, and if they lived in the components
//! the port would depend on its consumers. Here they depend only on the
//! leaf modules (time, tenant, error, clock, random, mutants); the cache port
//! and the observer depend on them, and the components on both. The property
//! tests and the simulator's checkers reason about the same functions.
//!
//! - [`window`]: a sliding window's admission ([`window::decide`]), the clamp
//!   on a caller's stamp and the bound under clock skew;
//! - [`tokens`]: a token reservation on a tenant's ledger, and its
//!   combination with the request slot;
//! - [`breaker`]: the circuit breaker's state machine as one
//!   [`step`](breaker::step), with [`CircuitState`](breaker::CircuitState)
//!   and [`ProbeId`](breaker::ProbeId);
//! - [`budget`]: one step of a retry budget's bucket;
//! - [`pick`]: the least-loaded pick over deployments, and the draw by
//!   weight;
//! - [`ramp`]: a slow start's share of calls after a circuit closed;
//! - [`concurrency`]: an adaptive limit on a deployment's calls in flight
//!   (AIMD), its admission and its change as a call ends.

pub mod breaker;
pub mod budget;
pub mod concurrency;
pub mod pick;
pub mod ramp;
pub mod tokens;
pub mod window;

/// Which limiter made a decision an event reports: the configured store, or
/// the fallback [`OnCacheUnavailable`](crate::limiter::OnCacheUnavailable)
/// took while that store could not be reached.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DecidedBy {
    /// The configured store (the default path).
    Store,
    /// The process's private local limiter
    /// ([`OnCacheUnavailable::LocalLimit`](crate::limiter::OnCacheUnavailable::LocalLimit)).
    Local,
    /// Nobody: admitted without a limit
    /// ([`OnCacheUnavailable::Admit`](crate::limiter::OnCacheUnavailable::Admit)).
    Unlimited,
}
