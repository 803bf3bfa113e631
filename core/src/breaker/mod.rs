//! `CircuitBreaker`: stop calling a model server that has stopped answering.
//!
//! The breaker's subject is the model server, never a tenant: it is down or up
//! for everyone. It does not wrap the call — the caller runs the sequence
//! [`allow_request`](CircuitBreaker::allow_request) → call →
//! [`record_success`](CircuitBreaker::record_success) or
//! [`record_failure`](CircuitBreaker::record_failure), every time.
//!
//! Each of those is one atomic [`BreakerStore::breaker_step`] running the pure
//! [`machine::step`], so a fleet sharing one cache never holds more than
//! `half_open_max_calls` live probes in a half-open episode.
//!
//! [`admit`](CircuitBreaker::admit) is the same step answering with data: a
//! [`Permit`] that is a normal call, an identified probe, or a refusal with its
//! `retry_after` — nothing to re-read. A caller holding a permit reports
//! exactly it ([`record_success_for`](CircuitBreaker::record_success_for),
//! [`record_failure_for`](CircuitBreaker::record_failure_for)) or hands it
//! back unused ([`release`](CircuitBreaker::release)). Probes are leases: one
//! that neither reports nor is released within
//! [`probe_lease`](CircuitBreakerBuilder::probe_lease) stops counting, and the
//! next caller gets a fresh probe — so a dropped future, a killed worker or a
//! forgotten permit can never wedge the circuit half-open.
//!
//! [`cool_down`](CircuitBreaker::cool_down) records a server's quota signal
//! as a shared cooldown in the same store, with one atomic step: until it
//! ends, every admission — by any worker sharing the cache — is refused with
//! [`Refusal::Cooldown`] and the wait, with no polling and no extra round
//! trip. A cooldown is not a failure: it opens nothing. The breaker fails toward
//! calling the model: an unreadable stored state reads as closed, a missing
//! open timestamp means recovery is due, and (by default) an unreachable cache
//! admits the call.

use crate::decide::breaker as machine;

use std::sync::Arc;
use std::time::Duration;

use crate::decide::breaker::{BreakerCommand, BreakerKeys, BreakerParams, MAX_HALF_OPEN_CALLS};
pub use crate::decide::breaker::{CircuitState, Origin, Permit, ProbeId, Refusal};

use crate::cache::{BreakerStore, MemoryCache, StoreSlot};
use crate::clock::Clock;
use crate::env::Env;
use crate::error::{CacheError, ConfigError};
use crate::observe::{Event, Listener};
use crate::time::{MAX_STORED, Timestamp};

/// The default failure threshold.
pub const DEFAULT_FAILURE_THRESHOLD: u32 = 5;
/// The default recovery timeout.
pub const DEFAULT_RECOVERY_TIMEOUT: Duration = Duration::from_secs(60);
/// The default number of half-open probes.
pub const DEFAULT_HALF_OPEN_MAX_CALLS: u32 = 1;
/// The default key prefix.
pub const DEFAULT_KEY_PREFIX: &str = "kg:circuit";

/// A refusal because the model server is believed to be down, or is cooling
/// down after a quota signal ([`reason`](CircuitOpen::reason) says which).
///
/// The breaker never returns this itself — `allow_request` is a bool — it is
/// what a wrapper reports to its own caller, with
/// [`CircuitBreaker::retry_after`] as the estimate. Unlike a rate-limit
/// refusal, it affects every tenant.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct CircuitOpen {
    /// What is unavailable, and when the next probe is due
    /// (`qwen3 is unavailable; the next probe is due in 12.50s`).
    pub message: String,
    /// The estimated wait until a probe is admitted; zero means "no idea" or
    /// "probing is due", not "healthy".
    pub retry_after: Duration,
    /// Why the call was refused: the circuit, or a shared cooldown.
    pub reason: Refusal,
}

impl CircuitOpen {
    /// A refusal by the circuit with `message` and the wait estimate.
    pub fn new(message: impl Into<String>, retry_after: Duration) -> Self {
        CircuitOpen {
            message: message.into(),
            retry_after,
            reason: Refusal::Circuit,
        }
    }

    /// The refusal for `model` after a [`Permit::Refused`] for `reason`:
    /// [`for_model`](Self::for_model) for the circuit,
    /// [`cooling_down`](Self::cooling_down) for a cooldown.
    pub fn refused(model: &str, retry_after: Duration, reason: Refusal) -> Self {
        match reason {
            Refusal::Circuit => Self::for_model(model, retry_after),
            Refusal::Cooldown => Self::cooling_down(model, retry_after),
        }
    }

    /// The refusal for `model` while a shared cooldown is in force:
    /// `"{model} is cooling down after a quota signal; calls resume in {s:.2}s"`.
    pub fn cooling_down(model: &str, retry_after: Duration) -> Self {
        CircuitOpen {
            message: format!(
                "{model} is cooling down after a quota signal; calls resume in {:.2}s",
                retry_after.as_secs_f64()
            ),
            retry_after,
            reason: Refusal::Cooldown,
        }
    }

    /// The refusal for `model` after a [`Permit::Refused`] with `retry_after`:
    /// `"{model} is unavailable; the next probe is due in {s:.2}s"`, or
    /// `"{model} is unavailable"` when the wait is unknown (zero).
    pub fn for_model(model: &str, retry_after: Duration) -> Self {
        let message = if retry_after.is_zero() {
            format!("{model} is unavailable")
        } else {
            format!(
                "{model} is unavailable; the next probe is due in {:.2}s",
                retry_after.as_secs_f64()
            )
        };
        CircuitOpen {
            message,
            retry_after,
            reason: Refusal::Circuit,
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
    observer: Listener,
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
            max_recovery_timeout: None,
            half_open_max_calls: DEFAULT_HALF_OPEN_MAX_CALLS,
            probe_lease: None,
            prefix: DEFAULT_KEY_PREFIX.to_owned(),
            on_cache_error: OnCacheError::default(),
            store: StoreSlot::Own(MemoryCache::new),
            env: None,
        }
    }
}

/// Configures a [`CircuitBreaker`]; [`build`](CircuitBreakerBuilder::build) validates.
pub struct CircuitBreakerBuilder<S> {
    failure_threshold: u32,
    recovery_timeout: Duration,
    max_recovery_timeout: Option<Duration>,
    half_open_max_calls: u32,
    probe_lease: Option<Duration>,
    prefix: String,
    on_cache_error: OnCacheError,
    store: StoreSlot<S>,
    env: Option<Env>,
}

impl<S: BreakerStore> CircuitBreakerBuilder<S> {
    /// Failures that open the circuit (default 5). Counted per reported call,
    /// not per attempt, within one `recovery_timeout` of the first.
    pub fn failure_threshold(mut self, n: u32) -> Self {
        self.failure_threshold = n;
        self
    }

    /// How long the circuit stays open before probing (its first opening
    /// since it last closed; see
    /// [`max_recovery_timeout`](Self::max_recovery_timeout)), and the
    /// failure count's lifetime (default 60 s): two settings with one name.
    pub fn recovery_timeout(mut self, d: Duration) -> Self {
        self.recovery_timeout = d;
        self
    }

    /// Escalation: the longest the circuit stays open (default:
    /// `recovery_timeout`, no escalation). A probe that fails re-opens the
    /// circuit for twice as long as the opening before, up to this; the
    /// first opening after the circuit closed lasts `recovery_timeout`
    /// again. A server that stays down is then probed less and less often,
    /// and calls refused while open are told the longer wait. The count of
    /// openings is stored with the circuit, so a fleet on one cache
    /// escalates together. At least `recovery_timeout`, at most 2^53 µs
    /// (about 285 years).
    pub fn max_recovery_timeout(mut self, d: Duration) -> Self {
        self.max_recovery_timeout = Some(d);
        self
    }

    /// Probes live at once in a half-open episode, the transitioning call
    /// included (default 1, at most [`MAX_HALF_OPEN_CALLS`]).
    pub fn half_open_max_calls(mut self, n: u32) -> Self {
        self.half_open_max_calls = n;
        self
    }

    /// How long a half-open probe counts without reporting or being released
    /// (default: `recovery_timeout`). After it, the probe is presumed lost —
    /// its caller vanished, or its call hangs — and the next `allow_request`
    /// gets a fresh probe; a report it sends later changes nothing. Set it
    /// above the longest a probing call can take (its retries, backoff and
    /// request timeouts included), or a slow probe's verdict is lost.
    pub fn probe_lease(mut self, d: Duration) -> Self {
        self.probe_lease = Some(d);
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
            max_recovery_timeout: self.max_recovery_timeout,
            half_open_max_calls: self.half_open_max_calls,
            probe_lease: self.probe_lease,
            prefix: self.prefix,
            on_cache_error: self.on_cache_error,
            store: StoreSlot::Shared(cache),
            env: self.env,
        }
    }

    /// The clock the breaker reads and the observer its events go to
    /// (default [`Env::system`]).
    pub fn env(mut self, env: Env) -> Self {
        self.env = Some(env);
        self
    }

    /// Validates and builds. All the numbers must be positive,
    /// `half_open_max_calls` at most [`MAX_HALF_OPEN_CALLS`],
    /// `recovery_timeout` and `max_recovery_timeout` at most 2^53 µs (what a
    /// store holds exactly) and `max_recovery_timeout` at least
    /// `recovery_timeout`; the prefix non-empty.
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
        if self.recovery_timeout.as_micros() > u128::from(MAX_STORED) {
            return Err(ConfigError::new(
                "recovery_timeout",
                "at most 2^53 µs (about 285 years)",
                crate::time::secs(self.recovery_timeout),
            ));
        }
        if self.half_open_max_calls == 0 || self.half_open_max_calls > MAX_HALF_OPEN_CALLS {
            return Err(ConfigError::new(
                "half_open_max_calls",
                "between 1 and 1000",
                self.half_open_max_calls,
            ));
        }
        let max_recovery_timeout = self.max_recovery_timeout.unwrap_or(self.recovery_timeout);
        if max_recovery_timeout < self.recovery_timeout {
            return Err(ConfigError::new(
                "max_recovery_timeout",
                "at least recovery_timeout",
                format!(
                    "{} (recovery_timeout {})",
                    crate::time::secs(max_recovery_timeout),
                    crate::time::secs(self.recovery_timeout)
                ),
            ));
        }
        if max_recovery_timeout.as_micros() > u128::from(MAX_STORED) {
            return Err(ConfigError::new(
                "max_recovery_timeout",
                "at most 2^53 µs (about 285 years)",
                crate::time::secs(max_recovery_timeout),
            ));
        }
        let probe_lease = self.probe_lease.unwrap_or(self.recovery_timeout);
        if probe_lease.is_zero() {
            return Err(ConfigError::new(
                "probe_lease",
                "positive",
                crate::time::secs(probe_lease),
            ));
        }
        if self.prefix.is_empty() {
            return Err(ConfigError::new("key_prefix", "non-empty", "\"\""));
        }
        let env = self.env.unwrap_or_default();
        let clock = env.clock().clone();
        let (store, owns_store) = self.store.resolve(&clock);
        let params = BreakerParams {
            failure_threshold: self.failure_threshold,
            recovery_timeout: self.recovery_timeout,
            max_recovery_timeout,
            half_open_max_calls: self.half_open_max_calls,
            probe_lease,
        };
        let keys = BreakerKeys::new(&self.prefix);
        Ok(CircuitBreaker {
            store,
            owns_store,
            params,
            keys,
            prefix: Arc::from(self.prefix),
            on_cache_error: self.on_cache_error,
            clock,
            observer: Listener::new(env.observer().clone()),
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

    /// Whether a call should be made now, as data: a [`Permit::Call`] through
    /// a closed circuit, an identified [`Permit::Probe`] in a half-open one, or
    /// [`Permit::Refused`] with how long until a probe may be admitted — all
    /// from the one atomic step. Never fails: an unreachable cache answers per
    /// [`OnCacheError`] (a [`Permit::Call`], or a refusal with no estimate).
    ///
    /// Not a pure read: when the circuit is open and its open period (the
    /// `recovery_timeout`, escalated by
    /// [`max_recovery_timeout`](CircuitBreakerBuilder::max_recovery_timeout))
    /// has passed, this call moves it to half-open and is itself the first probe.
    /// Report the call with [`record_success_for`](Self::record_success_for) /
    /// [`record_failure_for`](Self::record_failure_for), or hand it back with
    /// [`release`](Self::release) if it never reached the model.
    pub async fn admit(&self) -> Permit {
        self.admit_since().await.permit
    }

    /// [`admit`](Self::admit), with what a slow start ramps by, from the
    /// same step: the instant the admission was judged at, and — for a call
    /// through a closed circuit — when a half-open circuit last closed here
    /// (both on the store's clock, so every caller sharing the store reads
    /// the same ramp). An unreachable cache's admission has no close.
    pub async fn admit_since(&self) -> BreakerAdmission {
        match self.run(BreakerCommand::Allow).await {
            Ok(step) => BreakerAdmission {
                permit: step.permit.unwrap_or(Permit::Call),
                at: step.at,
                closed_at: step.closed_at,
            },
            stepped @ Err(_) => BreakerAdmission {
                permit: self.admission(stepped),
                at: self.clock.now(),
                closed_at: None,
            },
        }
    }

    /// The permit an admission's step gives, or — when the store could not
    /// take the step — the one [`OnCacheError`] gives, reported.
    fn admission(&self, stepped: Result<machine::BreakerStep, CacheError>) -> Permit {
        match stepped {
            Ok(step) => step.permit.unwrap_or(Permit::Call),
            Err(error) => {
                let allowed = self.on_cache_error == OnCacheError::Allow;
                self.observer.on_event(&Event::CacheUnavailable {
                    component: self.prefix.clone(),
                    operation: "breaker_step",
                    fallback: if allowed { "allowed" } else { "refused" },
                    error: error.to_string(),
                });
                if allowed {
                    Permit::Call
                } else {
                    Permit::Refused {
                        state: CircuitState::Open,
                        retry_after: Duration::ZERO,
                        reason: Refusal::Circuit,
                    }
                }
            }
        }
    }

    /// Whether a call should be made now — the spec's form of
    /// [`admit`](Self::admit). Never fails.
    ///
    /// When the circuit is open and its open period has passed, this call
    /// moves it to half-open and is itself the first probe; while half-open,
    /// each `true` holds one of `half_open_max_calls` probe leases until the
    /// call is reported or the lease ends. Use [`state`](Self::state) to look
    /// without touching.
    pub async fn allow_request(&self) -> bool {
        self.admit().await.is_admitted()
    }

    /// Reports that a call succeeded, whoever made it: closes a half-open
    /// circuit (clearing everything) and clears a closed circuit's failure
    /// count. The spec's form; a caller holding a [`Permit`] should use
    /// [`record_success_for`](Self::record_success_for).
    pub async fn record_success(&self) -> Result<(), CacheError> {
        self.run(BreakerCommand::RecordSuccess(Origin::Untracked))
            .await
            .map(drop)
    }

    /// Reports that a call failed, whoever made it: counts it when closed
    /// (opening at the threshold), reopens a half-open circuit at once, and
    /// does nothing when already open. The spec's form; a caller holding a
    /// [`Permit`] should use [`record_failure_for`](Self::record_failure_for).
    pub async fn record_failure(&self) -> Result<(), CacheError> {
        self.run(BreakerCommand::RecordFailure(Origin::Untracked))
            .await
            .map(drop)
    }

    /// Reports that the call `permit` admitted succeeded. A probe whose lease
    /// is live closes the circuit; a late probe changes nothing; a closed
    /// circuit's call clears the failure count while the circuit is closed. A
    /// refusal has nothing to report.
    pub async fn record_success_for(&self, permit: &Permit) -> Result<(), CacheError> {
        self.run_for(permit.origin().map(BreakerCommand::RecordSuccess)).await
    }

    /// Reports that the call `permit` admitted failed. A probe whose lease is
    /// live reopens the circuit; a late probe changes nothing; a closed
    /// circuit's call is counted while the circuit is closed.
    pub async fn record_failure_for(&self, permit: &Permit) -> Result<(), CacheError> {
        self.run_for(permit.origin().map(BreakerCommand::RecordFailure)).await
    }

    /// Hands back a permit whose call never reached the model (the limiter
    /// refused it, the caller gave up): a probe's lease ends at once, so the
    /// next caller probes instead. Exactly this probe — never another
    /// caller's. A call permit or a refusal needs nothing.
    pub async fn release(&self, permit: &Permit) -> Result<(), CacheError> {
        self.run_for(release_command(permit)).await
    }

    /// Records a quota signal: refuses every admission, for every caller
    /// sharing this breaker's store, until `duration` from the store's
    /// instant (the caller's under [`TimeSource::Caller`](crate::TimeSource::Caller)).
    /// One atomic step that stores `max(stored, now + duration)` — a
    /// cooldown is never shortened — and leaves the state, the failure count
    /// and the probes alone: a cooldown is no failure. Returns the cooldown's
    /// end when this call extended it, `None` when a longer one was already
    /// in force (or `duration` is zero). The caller bounds `duration`
    /// ([`HardenedProvider`](crate::provider::HardenedProvider) at its
    /// `max_server_delay`, a spent quota's at its `max_quota_cooldown`).
    pub async fn cool_down(&self, duration: Duration) -> Result<Option<Timestamp>, CacheError> {
        let step = self.run(BreakerCommand::CoolDown { duration }).await?;
        Ok(match step.writes.cooldown_until {
            machine::Write::Set(until) => Some(until),
            machine::Write::Keep | machine::Write::Delete => None,
        })
    }

    /// Forces the circuit closed and clears the failure count, the open
    /// timestamp, the probe leases and any cooldown.
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

    /// Seconds until an open circuit will admit a probe:
    /// `max(0, open period − (now − opened_at))` (the open period is
    /// `recovery_timeout`, or its escalation), zero when nothing is
    /// stored. A pure read and an estimate — treat it like `Retry-After`. A
    /// refusal from [`admit`](Self::admit) already carries its wait (for a
    /// half-open circuit, until the earliest live lease ends), with no second
    /// read.
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

    /// The `now` a step is asked at: a store that stamps with its own clock
    /// ignores ours, so the read is skipped.
    #[inline]
    fn step_instant(&self) -> Timestamp {
        if self.store.stamps_with_own_clock() {
            Timestamp::EPOCH
        } else {
            self.clock.now()
        }
    }

    /// A report's step, when the permit has one to report (see
    /// [`Permit::origin`] and [`release_command`]).
    async fn run_for(&self, command: Option<BreakerCommand>) -> Result<(), CacheError> {
        match command {
            Some(command) => self.run(command).await.map(drop),
            None => Ok(()),
        }
    }

    async fn run(&self, command: BreakerCommand) -> Result<machine::BreakerStep, CacheError> {
        let now = self.step_instant();
        #[cfg(feature = "mutants")]
        let step = if command == BreakerCommand::Allow
            && crate::mutants::active(crate::mutants::Mutant::ReadThenWriteBreaker)
        {
            // Read, decide here, then write: the write is the store's own
            // step, whose refusal this breaker ignores for the admission it
            // decided on the read. A probe the store did issue keeps the
            // store's identity, so its report still counts: only the race
            // is injected.
            let (snapshot, at) = self.store.breaker_read(&self.keys, now).await?;
            let mut local = machine::step(&snapshot, command, &self.params, at);
            if !local.writes.is_empty() {
                let stored = self.store.breaker_step(&self.keys, command, self.params, now).await?;
                if let (Some(Permit::Probe(_)), Some(Permit::Probe(id))) = (local.permit, stored.permit) {
                    local.permit = Some(Permit::Probe(id));
                }
            }
            local
        } else {
            self.store.breaker_step(&self.keys, command, self.params, now).await?
        };
        #[cfg(not(feature = "mutants"))]
        let step = self.store.breaker_step(&self.keys, command, self.params, now).await?;
        if self.observer.enabled() {
            self.report(command, &step);
        }
        Ok(step)
    }

    /// Tells the observer what one step did. A failure is reported before
    /// the transition it may cause, an admission after the transition it
    /// may have driven (the probe). A failure that changes nothing (a late
    /// report) is not recorded.
    fn report(&self, command: BreakerCommand, step: &machine::BreakerStep) {
        if matches!(command, BreakerCommand::RecordFailure(_)) && !step.writes.is_empty() {
            self.observer.on_event(&Event::BreakerFailureRecorded {
                breaker: self.prefix.clone(),
                at: step.at,
            });
        }
        if let Some(stored) = &step.unreadable {
            self.observer.on_event(&Event::BreakerStateUnreadable {
                breaker: self.prefix.clone(),
                stored: stored.clone(),
            });
        }
        if step.expired_probes > 0 {
            self.observer.on_event(&Event::BreakerProbesExpired {
                breaker: self.prefix.clone(),
                expired: step.expired_probes,
                at: step.at,
            });
        }
        if let BreakerCommand::Release(probe) = command
            && !step.writes.is_empty()
        {
            self.observer.on_event(&Event::BreakerProbeReleased {
                breaker: self.prefix.clone(),
                probe,
                at: step.at,
            });
        }
        if let BreakerCommand::CoolDown { duration } = command {
            // Every signal is reported with the end it asked for, written or
            // not, so a longer cooldown left unwritten is visible.
            let until = machine::cooldown_end(step.at, duration);
            if until > step.at {
                self.observer.on_event(&Event::BreakerCooldown {
                    breaker: self.prefix.clone(),
                    duration,
                    until,
                    at: step.at,
                    extended: matches!(step.writes.cooldown_until, machine::Write::Set(_)),
                });
            }
        }
        if step.before != step.after {
            self.observer.on_event(&Event::BreakerTransition {
                breaker: self.prefix.clone(),
                from: step.before,
                to: step.after,
                at: step.at,
            });
        }
        // A success in a closed circuit that had failures to clear (a reset
        // clears them too, and is no success).
        if matches!(command, BreakerCommand::RecordSuccess(_))
            && step.before == CircuitState::Closed
            && step.writes.failures == machine::FailuresWrite::Delete
        {
            self.observer.on_event(&Event::BreakerFailuresCleared {
                breaker: self.prefix.clone(),
                at: step.at,
            });
        }
        match step.permit {
            Some(Permit::Call) => self.observer.on_event(&Event::BreakerAllowed {
                breaker: self.prefix.clone(),
                state: step.after,
                probe: None,
                at: step.at,
            }),
            Some(Permit::Probe(id)) => self.observer.on_event(&Event::BreakerAllowed {
                breaker: self.prefix.clone(),
                state: step.after,
                probe: Some(id),
                at: step.at,
            }),
            Some(Permit::Refused {
                state,
                retry_after,
                reason: Refusal::Circuit,
            }) => self.observer.on_event(&Event::BreakerRejected {
                breaker: self.prefix.clone(),
                state,
                retry_after,
            }),
            Some(Permit::Refused {
                state,
                retry_after,
                reason: Refusal::Cooldown,
            }) => self.observer.on_event(&Event::BreakerCooldownRefused {
                breaker: self.prefix.clone(),
                state,
                retry_after,
                at: step.at,
            }),
            None => {}
        }
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

/// An admission, and when the circuit that gave it last closed
/// ([`CircuitBreaker::admit_since`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BreakerAdmission {
    /// The answer.
    pub permit: Permit,
    /// When it was judged, on the store's clock (the caller's when the
    /// store was unreachable).
    pub at: Timestamp,
    /// For a [`Permit::Call`], when a half-open circuit last closed (the
    /// stored `closed_at`); `None` when it never did, and for probes and
    /// refusals.
    pub closed_at: Option<Timestamp>,
}

/// The step that hands `permit` back: a probe's lease ends; a call permit
/// or a refusal holds nothing.
fn release_command(permit: &Permit) -> Option<BreakerCommand> {
    match *permit {
        Permit::Probe(id) => Some(BreakerCommand::Release(id)),
        Permit::Call | Permit::Refused { .. } => None,
    }
}
