//! `CircuitBreaker`: stop calling a model server that has stopped answering.
//!
//! The breaker's subject is the model server, never a tenant: it is down or up
//! for everyone. It does not wrap the call — the caller runs the sequence
//! [`allow_request`](CircuitBreaker::allow_request) → call →
//! [`record_success`](CircuitBreaker::record_success) or
//! [`record_failure`](CircuitBreaker::record_failure), every time.
//!
//! Each of those is one atomic [`BreakerStore::breaker_step`] running the pure
//! [`machine::step`], so a fleet sharing one cache admits exactly
//! `half_open_max_calls` probes per half-open episode. The breaker fails toward
//! calling the model: an unreadable stored state reads as closed, a missing
//! open timestamp means recovery is due, and (by default) an unreachable cache
//! admits the call.

pub mod machine;

use std::sync::Arc;
use std::time::Duration;

pub use machine::CircuitState;
use machine::{BreakerCommand, BreakerKeys, BreakerParams};

use crate::cache::{BreakerStore, MemoryCache, StoreSlot};
use crate::clock::{Clock, SystemClock};
use crate::error::{CacheError, ConfigError};
use crate::observe::{Event, Observer, TracingObserver};

/// The default failure threshold.
pub const DEFAULT_FAILURE_THRESHOLD: u32 = 5;
/// The default recovery timeout.
pub const DEFAULT_RECOVERY_TIMEOUT: Duration = Duration::from_secs(60);
/// The default number of half-open probes.
pub const DEFAULT_HALF_OPEN_MAX_CALLS: u32 = 1;
/// The default key prefix.
pub const DEFAULT_KEY_PREFIX: &str = "kg:circuit";

/// A refusal because the model server is believed to be down.
///
/// The breaker never returns this itself — `allow_request` is a bool — it is
/// what a wrapper reports to its own caller, with
/// [`CircuitBreaker::retry_after`] as the estimate. Unlike a rate-limit
/// refusal, it affects every tenant.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct CircuitOpen {
    /// What is unavailable (`qwen3 is unavailable`).
    pub message: String,
    /// The estimated wait until a probe is admitted; zero means "no idea" or
    /// "probing is due", not "healthy".
    pub retry_after: Duration,
}

impl CircuitOpen {
    /// A refusal with `message` and the wait estimate.
    pub fn new(message: impl Into<String>, retry_after: Duration) -> Self {
        CircuitOpen {
            message: message.into(),
            retry_after,
        }
    }
}

/// What `allow_request` answers when the cache cannot be reached.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnCacheError {
    /// Admit the call (the default): a damaged cache should cost at most a call
    /// to a model that may be down, never refused work.
    #[default]
    Allow,
    /// Refuse the call, as if the circuit were open.
    Refuse,
}

/// A circuit breaker over a [`BreakerStore`]. Breakers sharing a cache and a
/// key prefix are one breaker.
pub struct CircuitBreaker<S = MemoryCache> {
    store: Arc<S>,
    owns_store: bool,
    params: BreakerParams,
    keys: BreakerKeys,
    prefix: Arc<str>,
    on_cache_error: OnCacheError,
    clock: Arc<dyn Clock>,
    observer: Arc<dyn Observer>,
}

impl<S> std::fmt::Debug for CircuitBreaker<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CircuitBreaker")
            .field("params", &self.params)
            .field("key_prefix", &self.prefix)
            .field("on_cache_error", &self.on_cache_error)
            .field("owns_cache", &self.owns_store)
            .finish_non_exhaustive()
    }
}

impl CircuitBreaker<MemoryCache> {
    /// Starts configuring a breaker with the defaults: threshold 5, recovery
    /// 60 s, one probe, prefix `kg:circuit`, its own [`MemoryCache`].
    pub fn builder() -> CircuitBreakerBuilder<MemoryCache> {
        CircuitBreakerBuilder {
            failure_threshold: DEFAULT_FAILURE_THRESHOLD,
            recovery_timeout: DEFAULT_RECOVERY_TIMEOUT,
            half_open_max_calls: DEFAULT_HALF_OPEN_MAX_CALLS,
            prefix: DEFAULT_KEY_PREFIX.to_owned(),
            on_cache_error: OnCacheError::default(),
            store: StoreSlot::Own(MemoryCache::new),
            clock: None,
            observer: None,
        }
    }
}

/// Configures a [`CircuitBreaker`]; [`build`](CircuitBreakerBuilder::build) validates.
pub struct CircuitBreakerBuilder<S> {
    failure_threshold: u32,
    recovery_timeout: Duration,
    half_open_max_calls: u32,
    prefix: String,
    on_cache_error: OnCacheError,
    store: StoreSlot<S>,
    clock: Option<Arc<dyn Clock>>,
    observer: Option<Arc<dyn Observer>>,
}

impl<S: BreakerStore> CircuitBreakerBuilder<S> {
    /// Failures that open the circuit (default 5). Counted per reported call,
    /// not per attempt, within one `recovery_timeout` of the first.
    pub fn failure_threshold(mut self, n: u32) -> Self {
        self.failure_threshold = n;
        self
    }

    /// How long the circuit stays open before probing, and the failure count's
    /// lifetime (default 60 s): two settings with one name.
    pub fn recovery_timeout(mut self, d: Duration) -> Self {
        self.recovery_timeout = d;
        self
    }

    /// Probes per half-open episode, the transitioning call included (default 1).
    pub fn half_open_max_calls(mut self, n: u32) -> Self {
        self.half_open_max_calls = n;
        self
    }

    /// The key prefix (default `kg:circuit`). Two model servers need two prefixes.
    pub fn key_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// What `allow_request` answers when the cache is unreachable (default: admit).
    pub fn on_cache_error(mut self, policy: OnCacheError) -> Self {
        self.on_cache_error = policy;
        self
    }

    /// A shared cache. The breaker does not own it: [`CircuitBreaker::close`]
    /// leaves it open.
    pub fn cache<T: BreakerStore>(self, cache: Arc<T>) -> CircuitBreakerBuilder<T> {
        CircuitBreakerBuilder {
            failure_threshold: self.failure_threshold,
            recovery_timeout: self.recovery_timeout,
            half_open_max_calls: self.half_open_max_calls,
            prefix: self.prefix,
            on_cache_error: self.on_cache_error,
            store: StoreSlot::Shared(cache),
            clock: self.clock,
            observer: self.observer,
        }
    }

    /// The clock (default [`SystemClock`]).
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = Some(clock);
        self
    }

    /// Where events go (default [`TracingObserver`]).
    pub fn observer(mut self, observer: Arc<dyn Observer>) -> Self {
        self.observer = Some(observer);
        self
    }

    /// Validates and builds. All three numbers must be positive; the prefix
    /// non-empty.
    pub fn build(self) -> Result<CircuitBreaker<S>, ConfigError> {
        if self.failure_threshold == 0 {
            return Err(ConfigError::new(
                "failure_threshold",
                "positive",
                self.failure_threshold,
            ));
        }
        if self.recovery_timeout.is_zero() {
            return Err(ConfigError::new(
                "recovery_timeout",
                "positive",
                crate::time::secs(self.recovery_timeout),
            ));
        }
        if self.half_open_max_calls == 0 {
            return Err(ConfigError::new(
                "half_open_max_calls",
                "positive",
                self.half_open_max_calls,
            ));
        }
        if self.prefix.is_empty() {
            return Err(ConfigError::new("key_prefix", "non-empty", "\"\""));
        }
        let clock = self.clock.unwrap_or_else(|| Arc::new(SystemClock));
        let (store, owns_store) = self.store.resolve(&clock);
        Ok(CircuitBreaker {
            store,
            owns_store,
            params: BreakerParams {
                failure_threshold: self.failure_threshold,
                recovery_timeout: self.recovery_timeout,
                half_open_max_calls: self.half_open_max_calls,
            },
            keys: BreakerKeys::new(&self.prefix),
            prefix: Arc::from(self.prefix),
            on_cache_error: self.on_cache_error,
            clock,
            observer: self.observer.unwrap_or_else(|| Arc::new(TracingObserver)),
        })
    }
}

impl<S: BreakerStore> CircuitBreaker<S> {
    /// The validated numbers.
    pub fn params(&self) -> BreakerParams {
        self.params
    }

    /// The key prefix.
    pub fn key_prefix(&self) -> &str {
        &self.prefix
    }

    /// The keys the state lives under.
    pub fn keys(&self) -> &BreakerKeys {
        &self.keys
    }

    /// The cache the breaker keeps its state in.
    pub fn cache(&self) -> &Arc<S> {
        &self.store
    }

    /// Whether a call should be made now. Never fails.
    ///
    /// Not a pure read: when the circuit is open and `recovery_timeout` has
    /// passed, this call moves it to half-open and is itself the first probe;
    /// while half-open, each `true` spends one of `half_open_max_calls`. Use
    /// [`state`](Self::state) to look without touching.
    pub async fn allow_request(&self) -> bool {
        match self.run(BreakerCommand::Allow).await {
            Ok(allowed) => allowed,
            Err(error) => {
                let allowed = self.on_cache_error == OnCacheError::Allow;
                self.observer.on_event(&Event::CacheUnavailable {
                    component: self.prefix.clone(),
                    operation: "breaker_step",
                    fallback: if allowed { "allowed" } else { "refused" },
                    error: error.to_string(),
                });
                allowed
            }
        }
    }

    /// Reports that the call succeeded: closes a half-open circuit (clearing
    /// everything) and clears a closed circuit's failure count.
    pub async fn record_success(&self) -> Result<(), CacheError> {
        self.run(BreakerCommand::RecordSuccess).await.map(drop)
    }

    /// Reports that the call failed: counts it when closed (opening at the
    /// threshold), reopens a half-open circuit at once, and does nothing when
    /// already open.
    pub async fn record_failure(&self) -> Result<(), CacheError> {
        self.run(BreakerCommand::RecordFailure).await.map(drop)
    }

    /// Forces the circuit closed and clears the failure count, the open
    /// timestamp and the probe count.
    pub async fn reset(&self) -> Result<(), CacheError> {
        self.run(BreakerCommand::Reset).await.map(drop)
    }

    /// The current state, as stored. A pure read: drives no transition (an open
    /// circuit past its timeout still reads open until `allow_request`).
    pub async fn state(&self) -> Result<CircuitState, CacheError> {
        let (snapshot, _) = self.store.breaker_read(&self.keys, self.clock.now()).await?;
        self.report_unreadable(&snapshot.state);
        Ok(snapshot.effective_state())
    }

    /// Seconds until an `allow_request` will admit a probe:
    /// `max(0, recovery_timeout − (now − opened_at))`, zero when nothing is
    /// stored. A pure read and an estimate — treat it like `Retry-After`.
    pub async fn retry_after(&self) -> Result<Duration, CacheError> {
        let (snapshot, now) = self.store.breaker_read(&self.keys, self.clock.now()).await?;
        Ok(machine::retry_after(&snapshot, &self.params, now))
    }

    /// Releases the cache if the breaker built it; a cache passed in stays open.
    pub async fn close(&self) -> Result<(), CacheError> {
        if self.owns_store {
            self.store.close().await
        } else {
            Ok(())
        }
    }

    async fn run(&self, command: BreakerCommand) -> Result<bool, CacheError> {
        let step = self
            .store
            .breaker_step(&self.keys, command, self.params, self.clock.now())
            .await?;
        // A failure is reported before the transition it may cause, an
        // admission after the transition it may have driven (the probe).
        if command == BreakerCommand::RecordFailure {
            self.observer.on_event(&Event::BreakerFailureRecorded {
                breaker: self.prefix.clone(),
                at: step.at,
            });
        }
        if let Some(stored) = step.unreadable {
            self.observer.on_event(&Event::BreakerStateUnreadable {
                breaker: self.prefix.clone(),
                stored,
            });
        }
        if step.before != step.after {
            self.observer.on_event(&Event::BreakerTransition {
                breaker: self.prefix.clone(),
                from: step.before,
                to: step.after,
                at: step.at,
            });
        }
        match command {
            BreakerCommand::Allow if step.allowed => self.observer.on_event(&Event::BreakerAllowed {
                breaker: self.prefix.clone(),
                state: step.after,
                at: step.at,
            }),
            BreakerCommand::Allow => self.observer.on_event(&Event::BreakerRejected {
                breaker: self.prefix.clone(),
                state: step.after,
            }),
            BreakerCommand::RecordFailure | BreakerCommand::RecordSuccess | BreakerCommand::Reset => {}
        }
        Ok(step.allowed)
    }

    fn report_unreadable(&self, state: &machine::StoredState) {
        if let machine::StoredState::Unreadable(stored) = state {
            self.observer.on_event(&Event::BreakerStateUnreadable {
                breaker: self.prefix.clone(),
                stored: stored.clone(),
            });
        }
    }
}
