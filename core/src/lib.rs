//! Hardening for calls to LLM servers that fall over.
//!
//! Three layers, each usable alone and composed in one order:
//!
//! - [`CircuitBreaker`] (outermost): should we call the model at all? Stops
//!   hammering a server that has stopped answering, probes it carefully when it
//!   may be back.
//! - [`RateLimiter`]: are we allowed to right now? A per-tenant sliding window
//!   that never lets a burst through and says exactly when a slot frees.
//! - [`Retry`] (innermost): did the wire drop? Exponential backoff with jitter
//!   for failures the server may answer differently next time.
//!
//! The limiter and the breaker keep their state behind the small [`cache`]
//! port — [`MemoryCache`] in process by default, a shared store for a fleet —
//! whose atomic operations keep a fleet exact. Every read of the time goes
//! through an injected [`Clock`] and every random draw through an injected
//! [`RandomSource`]; nothing in this crate reads the OS clock or entropy except
//! [`SystemClock`] and [`SeededRandom::from_os_entropy`], so a test or a
//! simulation is a pure function of its inputs. Every decision is reported to
//! an [`Observer`]. The three travel together as an [`Env`], which every
//! builder takes.
//!
//! ```
//! # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
//! use std::sync::Arc;
//! use std::time::Duration;
//! use redstring::{CircuitBreaker, CircuitState, Env, ManualClock};
//!
//! let clock = Arc::new(ManualClock::at_fixed_epoch());
//! let breaker = CircuitBreaker::builder()
//!     .failure_threshold(2)
//!     .recovery_timeout(Duration::from_secs(30))
//!     .env(Env::default().with_clock(clock.clone()))
//!     .build()
//!     .unwrap();
//! for _ in 0..2 {
//!     assert!(breaker.allow_request().await);
//!     breaker.record_failure().await.unwrap();
//! }
//! assert_eq!(breaker.state().await.unwrap(), CircuitState::Open);
//! assert!(!breaker.allow_request().await);
//!
//! clock.advance(Duration::from_secs(30));
//! assert!(breaker.allow_request().await); // the probe
//! breaker.record_success().await.unwrap();
//! assert_eq!(breaker.state().await.unwrap(), CircuitState::Closed);
//! # });
//! ```

pub mod breaker;
pub mod cache;
mod clock;
pub mod decide;
mod env;
mod error;
#[cfg(test)]
mod import_rules;
pub mod limiter;
#[cfg(feature = "metrics")]
pub mod metrics;
#[cfg(feature = "mutants")]
pub mod mutants;
#[cfg(not(feature = "mutants"))]
mod mutants;
mod observe;
pub mod provider;
mod random;
pub mod retry;
mod tenant;
#[cfg(feature = "testing")]
pub mod testing;
mod time;
#[cfg(feature = "tower")]
pub mod tower;

pub use breaker::{
    CircuitBreaker, CircuitBreakerBuilder, CircuitOpen, CircuitState, OnCacheError, Origin, Permit, ProbeId, Refusal,
};
pub use cache::{Cache, MemoryCache, TimeSource};
pub use clock::{Clock, ManualClock, SYSTEM_CLOCK_ANCHOR, Sleep, SystemClock};
pub use decide::DecidedBy;
pub use env::Env;
pub use error::{CacheError, ConfigError};
pub use limiter::{
    AcquireError, Admission, OnCacheUnavailable, Priority, RateLimitExceeded, RateLimiter, RateLimiterBuilder,
};
pub use observe::{Event, Interest, NoopObserver, Observer, RecordingObserver, TracingObserver};
pub use provider::{ExtractError, HardenedProvider, LlmProvider, LlmProviderExt, ProviderError};
pub use random::{RandomSource, SeededRandom};
pub use retry::{Retry, RetryBudget, RetryDenied, RetryError, RetryExhausted, RetryPolicy, Retryable};
pub use tenant::TenantId;
pub use time::Timestamp;
