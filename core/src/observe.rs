//! The observer port: every decision the components make, as structured data.
//!
//! Breakers, limiters, retry loops and retry budgets report each transition, refusal, retry
//! and outcome as an [`Event`] to an injected [`Observer`], and format nothing
//! themselves. The default, [`TracingObserver`], forwards to `tracing`; the
//! simulator builds its traces on the same stream, and a user's metrics can too.

use std::sync::Arc;
use std::time::Duration;

use crate::decide::DecidedBy;
use crate::decide::breaker::{CircuitState, ProbeId};
use crate::decide::budget::{BudgetCommand, MICROS_PER_RETRY};
use crate::decide::concurrency::{CallEnd, whole};
use crate::tenant::{Priority, TenantId};
use crate::time::Timestamp;

/// A provenance (`openai-compatible/qwen3`) as OpenTelemetry's GenAI
/// attributes name its parts: `gen_ai.provider.name` (`openai-compatible`,
/// empty without a `/`) and `gen_ai.request.model` (`qwen3`). The metrics
/// and the spans both read a model through this one function, so their
/// attributes agree.
pub(crate) fn provider_and_model(model: &str) -> (&str, &str) {
    model.split_once('/').unwrap_or(("", model))
}

/// One thing a component decided or saw.
///
/// Names (`breaker`, `limiter`) are the component's key prefix, shared as an
/// `Arc<str>` so that reporting an event never allocates on the success path.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum Event {
    /// A breaker moved between states.
    BreakerTransition {
        /// The breaker's key prefix.
        breaker: Arc<str>,
        /// The state before.
        from: CircuitState,
        /// The state after.
        to: CircuitState,
        /// When, on the clock that decided.
        at: Timestamp,
    },
    /// `allow_request` said yes: a call in a closed circuit, or a probe in a
    /// half-open one.
    BreakerAllowed {
        /// The breaker's key prefix.
        breaker: Arc<str>,
        /// The state after the decision (closed, or half-open for a probe).
        state: CircuitState,
        /// The probe's identity, for a half-open admission.
        probe: Option<ProbeId>,
        /// When, on the clock that decided.
        at: Timestamp,
    },
    /// A success report cleared a closed circuit's failure count.
    BreakerFailuresCleared {
        /// The breaker's key prefix.
        breaker: Arc<str>,
        /// When, on the clock that decided.
        at: Timestamp,
    },
    /// A half-open probe was handed back without reaching the model; its lease
    /// ended at once.
    BreakerProbeReleased {
        /// The breaker's key prefix.
        breaker: Arc<str>,
        /// The probe.
        probe: ProbeId,
        /// When, on the clock that decided.
        at: Timestamp,
    },
    /// Half-open probes that neither reported nor were released within their
    /// lease stopped counting (their callers vanished, or their calls hang).
    BreakerProbesExpired {
        /// The breaker's key prefix.
        breaker: Arc<str>,
        /// How many leases ended.
        expired: u32,
        /// When, on the clock that decided.
        at: Timestamp,
    },
    /// A call's failure was recorded: counted by a closed breaker, or
    /// reopening a half-open one. A report that changes nothing (a late one:
    /// the circuit already open, the probe's lease over) is not an event.
    BreakerFailureRecorded {
        /// The breaker's key prefix.
        breaker: Arc<str>,
        /// When, on the clock that decided.
        at: Timestamp,
    },
    /// `allow_request` said no.
    BreakerRejected {
        /// The breaker's key prefix.
        breaker: Arc<str>,
        /// The state that refused (open, or half-open with its probes live).
        state: CircuitState,
        /// How long until a probe may be admitted (zero when unknown).
        retry_after: Duration,
    },
    /// A quota signal asked for a shared cooldown: every admission is
    /// refused until `until` at least. Reported for every signal, whether it
    /// put the server into a cooldown, extended one, or fell under a longer
    /// one already stored (`extended: false`; that one is kept), so a reader
    /// of the events can check that no cooldown ended before a signal asked.
    BreakerCooldown {
        /// The breaker's key prefix.
        breaker: Arc<str>,
        /// The wait the signal asked for.
        duration: Duration,
        /// When the cooldown this signal asked for ends, on the clock that
        /// decided (the one stored ends no earlier).
        until: Timestamp,
        /// When it was asked, on the clock that decided.
        at: Timestamp,
        /// Whether the step wrote it: `false` when a cooldown ending no
        /// earlier was already stored.
        extended: bool,
    },
    /// `allow_request` said no because a shared cooldown is in force (the
    /// server is up but its quota is spent), not because of the circuit.
    BreakerCooldownRefused {
        /// The breaker's key prefix.
        breaker: Arc<str>,
        /// The circuit's state (any: a cooldown refuses in every state).
        state: CircuitState,
        /// How long until the cooldown ends.
        retry_after: Duration,
        /// When, on the clock that decided.
        at: Timestamp,
    },
    /// A stored breaker state could not be read and was taken as closed.
    BreakerStateUnreadable {
        /// The breaker's key prefix.
        breaker: Arc<str>,
        /// What was stored instead of a state: at most
        /// [`EXCERPT_BYTES`](crate::decide::breaker::EXCERPT_BYTES) of it,
        /// and its full length when cut (see
        /// [`excerpt`](crate::decide::breaker::excerpt)).
        stored: String,
    },
    /// A component could not reach its cache and applied its policy.
    CacheUnavailable {
        /// The component's key prefix.
        component: Arc<str>,
        /// The port operation that failed.
        operation: &'static str,
        /// What the component did instead (`allowed`, `refused`, `local limit`).
        fallback: &'static str,
        /// The cache's error, as text.
        error: String,
    },
    /// The limiter granted a slot.
    RateLimitAdmitted {
        /// The limiter's key prefix.
        limiter: Arc<str>,
        /// The tenant charged.
        tenant: TenantId,
        /// The class the caller asked as.
        priority: Priority,
        /// Slots left in the window after this one.
        remaining: u32,
        /// The instant the hit was stamped with.
        at: Timestamp,
        /// Which limiter admitted it: the store, or a fallback while the
        /// store could not be reached.
        decided_by: DecidedBy,
    },
    /// The limiter refused a slot.
    RateLimitRefused {
        /// The limiter's key prefix.
        limiter: Arc<str>,
        /// The tenant refused.
        tenant: TenantId,
        /// The class the caller asked as.
        priority: Priority,
        /// How long until a slot frees.
        retry_after: Duration,
        /// The instant the decision was made at.
        at: Timestamp,
        /// Which limiter refused it: the store, or the local fallback.
        decided_by: DecidedBy,
    },
    /// The limiter reserved a call's token estimate beside its slot.
    TokensReserved {
        /// The limiter's key prefix.
        limiter: Arc<str>,
        /// The tenant charged.
        tenant: TenantId,
        /// The tokens reserved.
        estimate: u64,
        /// Tokens counted in the window before this reservation.
        used_before: u64,
        /// The instant the reservation was stamped with.
        at: Timestamp,
        /// Which ledger holds it.
        decided_by: DecidedBy,
    },
    /// The limiter refused a call over its tokens per window (alone, or with
    /// its requests per window).
    TokensRefused {
        /// The limiter's key prefix.
        limiter: Arc<str>,
        /// The tenant refused.
        tenant: TenantId,
        /// The class the caller asked as (a low one is refused at the
        /// tokens its class may take).
        priority: Priority,
        /// The tokens asked for.
        estimate: u64,
        /// Tokens counted in the window.
        used: u64,
        /// How long until the estimate would fit.
        retry_after: Duration,
        /// The instant the decision was made at.
        at: Timestamp,
        /// Which ledger refused.
        decided_by: DecidedBy,
    },
    /// A call's token reservation was settled to what the server used.
    TokensSettled {
        /// The limiter's key prefix.
        limiter: Arc<str>,
        /// The tenant charged.
        tenant: TenantId,
        /// The tokens reserved.
        estimate: u64,
        /// The tokens used (zero for a released reservation).
        actual: u64,
        /// Whether the ledger still held the reservation.
        found: bool,
    },
    /// A store refused a caller's clock as the stamp of a limiter decision and
    /// used a clamped one (the caller was ahead of the store, or more than one
    /// window behind it): a sign of clock skew in the fleet.
    StampClamped {
        /// The limiter's key prefix.
        limiter: Arc<str>,
        /// The tenant whose decision it was.
        tenant: TenantId,
        /// The caller's `now`.
        asked: Timestamp,
        /// The stamp the store decided at instead.
        used: Timestamp,
    },
    /// A retryable failure; the loop will sleep and try again.
    RetryScheduled {
        /// The operation being retried.
        operation: Arc<str>,
        /// Calls made so far, including the one that just failed.
        attempt: u32,
        /// How long the loop will sleep before the next call: the larger of
        /// the schedule's jittered delay and `floor`.
        delay: Duration,
        /// The shortest wait the failure itself asked for (a server's
        /// `Retry-After`); zero when it asked for none.
        floor: Duration,
        /// The failure, as text.
        error: String,
    },
    /// A retry budget's step: a call's deposit, or a retry asked for.
    RetryBudgetStep {
        /// The budget's key.
        budget: Arc<str>,
        /// `Deposit` for a call's first attempt, `Withdraw` for a retry.
        command: BudgetCommand,
        /// Whether it was granted (a deposit always is; a denied withdrawal
        /// ends the call with its last error).
        granted: bool,
        /// The bucket's balance after the step, in millionths of a retry.
        balance: u64,
        /// The instant the step was judged at (the store's clock, or the
        /// caller's).
        at: Timestamp,
        /// Which bucket decided: the store's, or the local fallback's.
        decided_by: DecidedBy,
    },
    /// The retry loop gave up.
    RetryExhausted {
        /// The operation that was retried.
        operation: Arc<str>,
        /// Calls made, including the first.
        attempts: u32,
        /// The last failure, as text.
        error: String,
    },
    /// A hardened provider started a call: the one place a call's life
    /// begins, so an observer can count calls in flight.
    CallStarted {
        /// The provider's provenance (`openai-compatible/qwen3`) of the
        /// deployment it would go to first.
        model: Arc<str>,
        /// The tenant the call is made for.
        tenant: TenantId,
    },
    /// A call's outcome as seen by a hardened provider.
    CallFinished {
        /// The provider's provenance (`openai-compatible/qwen3`).
        model: Arc<str>,
        /// The tenant the call was made for.
        tenant: TenantId,
        /// `ok`, the error kind that ended the call, or `cancelled` when
        /// the caller dropped the call before it ended.
        outcome: &'static str,
        /// Calls that reached the model server for this one extraction.
        attempts: u32,
        /// From the call's start to its end on the provider's clock, every
        /// wait and retry included.
        duration: Duration,
        /// The prompt tokens the answer reported, when it succeeded and said.
        input_tokens: Option<u64>,
        /// The tokens generated, likewise.
        output_tokens: Option<u64>,
    },
    /// A hardened provider over several deployments sent a call, or its
    /// retry, to another deployment than the one it chose first.
    Rerouted {
        /// The tenant the call was made for.
        tenant: TenantId,
        /// The breaker key prefix of the deployment it left.
        from: Arc<str>,
        /// The breaker key prefix of the deployment it went to.
        to: Arc<str>,
        /// `refused`: the first one's circuit or cooldown refused it;
        /// `limited`: the first one's own limit refused its first attempt;
        /// `failed`: its attempt there failed and the retry went on.
        reason: &'static str,
    },
    /// A hardened provider over several deployments asks this one last for
    /// a call, after those not known to refuse: its last admission refused
    /// (or its server answered about itself), for a wait that has not
    /// passed. Reported for each call that routes past it, so no call passes
    /// over a deployment unseen.
    DeploymentDeferred {
        /// The tenant the call was made for.
        tenant: TenantId,
        /// The breaker key prefix of the deployment asked last.
        breaker: Arc<str>,
        /// Why: `open` (its circuit), `cooldown` (a quota signal's shared
        /// cooldown), `limited` (its own limit), `unusable` (its server
        /// answered about itself: its quota, its key, its model).
        state: &'static str,
        /// Until when it is known to refuse, on the provider's clock.
        until: Timestamp,
    },
    /// A hardened provider is sleeping off a rate-limit refusal before asking
    /// the limiter again.
    RateLimitWait {
        /// The provider's provenance.
        model: Arc<str>,
        /// The tenant waiting.
        tenant: TenantId,
        /// How long it sleeps: exactly the refusal's `retry_after`.
        wait: Duration,
        /// Waits so far in this call, this one included.
        waits: u32,
    },
    /// A deployment's server said its quota is spent, not merely paced: a
    /// 429 `insufficient_quota`, or a quota signal whose reset is further
    /// away than the provider's `max_server_delay` (a daily or monthly
    /// limit). The deployment cools down fleet-wide until `until` — the
    /// reset, at most `max_quota_cooldown`, or `quota_cooldown` when none
    /// past `max_server_delay` was given — and no retry is sent there (a
    /// retry goes to another deployment). Reported whatever
    /// cooldown was already stored, so a reader can check that nothing was
    /// admitted there before it ended.
    QuotaExhausted {
        /// The deployment's breaker key prefix.
        breaker: Arc<str>,
        /// The tenant whose call heard it.
        tenant: TenantId,
        /// How long the deployment cools down.
        wait: Duration,
        /// When the cooldown ends, on the provider's clock.
        until: Timestamp,
        /// When it was heard, on the provider's clock.
        at: Timestamp,
        /// Whether the server gave the reset (`false`: `insufficient_quota`,
        /// cooled for `quota_cooldown`).
        reset_given: bool,
    },
    /// A hardened provider's attempt succeeded but took longer than its
    /// [`slow_call_threshold`](crate::provider::HardenedProviderBuilder::slow_call_threshold):
    /// the caller has the answer, and the deployment's breaker hears a
    /// failure, so a server that answers ever more slowly is shed before
    /// its answers time out.
    SlowCall {
        /// The deployment's breaker key prefix.
        breaker: Arc<str>,
        /// The tenant whose call it was.
        tenant: TenantId,
        /// How long the attempt took, on the provider's clock.
        duration: Duration,
        /// The threshold it exceeded.
        threshold: Duration,
        /// When it ended, on the provider's clock.
        at: Timestamp,
    },
    /// A hardened provider's attempt at the deployment behind `from` had
    /// not answered after the [`hedge`](crate::provider::HardenedProviderBuilder::hedge)
    /// delay, and another attempt, paid from the retry budget, went to the
    /// deployment behind `to`; the first success wins and the others are
    /// cancelled.
    Hedged {
        /// The tenant whose call it is.
        tenant: TenantId,
        /// The breaker key prefix of the deployment whose attempt is hedged.
        from: Arc<str>,
        /// The breaker key prefix of the deployment the hedge went to.
        to: Arc<str>,
        /// How long the call waited for an answer before hedging.
        after: Duration,
    },
    /// A call admitted by a deployment in its slow start was drawn against
    /// the ramp's share
    /// ([`slow_start`](crate::provider::HardenedProviderBuilder::slow_start)):
    /// it goes there when `draw < share`, and is otherwise offered to the
    /// next deployment that admits it (coming back only when none does).
    SlowStartDraw {
        /// The ramping deployment's breaker key prefix.
        breaker: Arc<str>,
        /// The tenant whose call it was.
        tenant: TenantId,
        /// When its circuit closed: where the ramp began, on the store's clock.
        closed_at: Timestamp,
        /// When the admission was judged, on the store's clock.
        at: Timestamp,
        /// The ramp's share at `at`, in parts per million.
        share: u32,
        /// The draw, in parts per million.
        draw: u32,
    },
    /// A deployment's adaptive concurrency limit admitted an attempt
    /// ([`adaptive_concurrency`](crate::provider::HardenedProviderBuilder::adaptive_concurrency)),
    /// leasing it as `id` until it ends.
    ConcurrencyAdmitted {
        /// The deployment's breaker key prefix.
        breaker: Arc<str>,
        /// The tenant whose call it is.
        tenant: TenantId,
        /// The class the call asked as.
        priority: Priority,
        /// The attempt's lease.
        id: u64,
        /// Calls in flight there, fleet-wide, before this one.
        in_flight: u64,
        /// The limit in force, in whole calls.
        limit: u64,
    },
    /// A deployment's adaptive concurrency limit refused an attempt: as
    /// many calls were in flight as it allows. The attempt goes to the next
    /// deployment that admits it, or ends unsent.
    ConcurrencyRefused {
        /// The deployment's breaker key prefix.
        breaker: Arc<str>,
        /// The tenant whose call it is.
        tenant: TenantId,
        /// The class the call asked as.
        priority: Priority,
        /// Calls in flight there, fleet-wide.
        in_flight: u64,
        /// The limit in force, in whole calls.
        limit: u64,
    },
    /// An attempt admitted under an adaptive concurrency limit ended, and
    /// its end moved the limit (or, too late or neither, did not).
    ConcurrencyEnded {
        /// The deployment's breaker key prefix.
        breaker: Arc<str>,
        /// The tenant whose call it was.
        tenant: TenantId,
        /// The attempt's lease.
        id: u64,
        /// How it ended, for the limit.
        end: CallEnd,
        /// Whether its lease was still live, so its end counted.
        counted: bool,
        /// The limit before, in millionths of a call.
        from: u64,
        /// The limit after, in millionths of a call.
        to: u64,
    },
    /// A hardened provider refused by a shared cooldown sleeps it off before
    /// asking the breaker again.
    CooldownWait {
        /// The provider's provenance.
        model: Arc<str>,
        /// The tenant waiting.
        tenant: TenantId,
        /// How long it sleeps: exactly the refusal's `retry_after`.
        wait: Duration,
        /// Waits so far in this call, this one included.
        waits: u32,
    },
    /// A hardened provider stopped because its deadline could not cover the
    /// next wait.
    DeadlineExceeded {
        /// The provider's provenance.
        model: Arc<str>,
        /// The tenant the call was made for.
        tenant: TenantId,
        /// The wait that did not fit: `rate_limit` or `retry`.
        waiting_for: &'static str,
        /// The wait that was needed.
        needed: Duration,
        /// What was left of the deadline.
        remaining: Duration,
    },
    /// A model server answered with a model other than the one requested
    /// (the response's `model` field). The answer's provenance names the one
    /// that answered; a dated snapshot of the requested id
    /// (`gpt-4o-2024-08-06` for `gpt-4o`) or its `:latest` tag counts as the
    /// same model and is not reported.
    ServedModelDiffers {
        /// The provenance requested (`openai-compatible/no-such-model`).
        requested: Arc<str>,
        /// The provenance of the model that answered (`openai-compatible/tiny`).
        served: Arc<str>,
    },
}

/// Receives every [`Event`]. Implementations must be cheap and must not block:
/// they run inline on the caller's task.
pub trait Observer: Send + Sync + 'static {
    /// Called once per event, in the order the events happened on this task.
    fn on_event(&self, event: &Event);

    /// Whether any event would be used now (default `true`). When `false`,
    /// the limiter and the breaker build no event for the decision at hand —
    /// no name cloned, no call made — which is most of what observing costs
    /// on the hot path. Asked once per decision unless the observer's
    /// [`interest`](Self::interest) is fixed, so it may change at run time
    /// (a `tracing` subscriber installed later).
    fn enabled(&self) -> bool {
        true
    }

    /// What [`enabled`](Self::enabled) will answer for as long as this
    /// observer lives, where that is fixed. A limiter or a breaker asks once,
    /// when it is built, and trusts the answer from then on: an observer
    /// whose interest is [`Interest::Never`] or [`Interest::Always`] is not
    /// asked `enabled` again (a virtual call per decision saved). The
    /// default, [`Interest::Sometimes`], asks on every decision.
    fn interest(&self) -> Interest {
        Interest::Sometimes
    }
}

/// An observer's promise about [`Observer::enabled`] for its whole life
/// (see [`Observer::interest`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Interest {
    /// `enabled` is `false` and always will be: a limiter or a breaker
    /// builds no event of a decision for it (the rare reports of a store
    /// that could not answer still reach `on_event`).
    Never,
    /// `enabled` may change while the observer lives: asked per decision.
    Sometimes,
    /// `enabled` is `true` and always will be: every decision's event is
    /// built.
    Always,
}

impl<O: Observer + ?Sized> Observer for Arc<O> {
    fn on_event(&self, event: &Event) {
        (**self).on_event(event)
    }

    fn enabled(&self) -> bool {
        (**self).enabled()
    }

    fn interest(&self) -> Interest {
        (**self).interest()
    }
}

/// An observer with its [`Interest`] asked once: what a limiter and a breaker
/// hold, so that a decision asks [`Observer::enabled`] only of an observer
/// whose answer may change.
#[derive(Clone)]
pub(crate) struct Listener {
    observer: Arc<dyn Observer>,
    interest: Interest,
}

impl Listener {
    /// `observer`, its interest asked now.
    pub(crate) fn new(observer: Arc<dyn Observer>) -> Self {
        let interest = observer.interest();
        Listener { observer, interest }
    }

    /// Whether the observer wants the events of the decision at hand.
    #[inline]
    pub(crate) fn enabled(&self) -> bool {
        match self.interest {
            Interest::Never => false,
            Interest::Always => true,
            Interest::Sometimes => self.observer.enabled(),
        }
    }

    /// Tells the observer `event`.
    #[inline]
    pub(crate) fn on_event(&self, event: &Event) {
        self.observer.on_event(event)
    }
}

/// The default observer: forwards each event to `tracing` — warnings for
/// damage and exhaustion, `info` for breaker transitions, `debug` for the rest.
#[derive(Clone, Copy, Debug, Default)]
pub struct TracingObserver;

impl Observer for TracingObserver {
    /// Whether a `tracing` subscriber takes any event of this module (the
    /// least severe level it listens at is at least `ERROR`); without one,
    /// nothing is built.
    fn enabled(&self) -> bool {
        tracing::enabled!(tracing::Level::ERROR)
    }

    fn on_event(&self, event: &Event) {
        match event {
            Event::BreakerTransition { breaker, from, to, at } => {
                tracing::info!(%breaker, ?from, ?to, %at, "circuit breaker transition")
            }
            Event::BreakerAllowed { breaker, state, .. } => {
                tracing::trace!(%breaker, ?state, "circuit breaker admitted a call")
            }
            Event::BreakerFailureRecorded { breaker, at } => {
                tracing::debug!(%breaker, %at, "circuit breaker recorded a failure")
            }
            Event::BreakerRejected {
                breaker,
                state,
                retry_after,
            } => {
                tracing::debug!(%breaker, ?state, retry_after = retry_after.as_secs_f64(), "circuit breaker rejected a call")
            }
            Event::BreakerCooldown {
                breaker,
                duration,
                until,
                at,
                extended,
            } => {
                tracing::info!(%breaker, duration = duration.as_secs_f64(), %until, %at, extended, "shared cooldown after a quota signal")
            }
            Event::BreakerCooldownRefused {
                breaker,
                state,
                retry_after,
                ..
            } => {
                tracing::debug!(%breaker, ?state, retry_after = retry_after.as_secs_f64(), "call refused by a shared cooldown")
            }
            Event::BreakerFailuresCleared { breaker, at } => {
                tracing::debug!(%breaker, %at, "circuit breaker failure count cleared by a success")
            }
            Event::BreakerProbeReleased { breaker, probe, at } => {
                tracing::debug!(%breaker, %probe, %at, "half-open probe handed back unused")
            }
            Event::BreakerProbesExpired { breaker, expired, at } => {
                tracing::warn!(%breaker, expired, %at, "half-open probes never reported within their lease")
            }
            Event::BreakerStateUnreadable { breaker, stored } => {
                tracing::warn!(%breaker, %stored, "unreadable circuit state; treating it as closed")
            }
            Event::CacheUnavailable {
                component,
                operation,
                fallback,
                error,
            } => {
                tracing::warn!(%component, operation, fallback, %error, "cache unavailable")
            }
            Event::RateLimitAdmitted {
                limiter,
                tenant,
                priority,
                remaining,
                decided_by,
                ..
            } => {
                tracing::debug!(%limiter, %tenant, priority = priority.as_str(), remaining, ?decided_by, "rate limit slot granted")
            }
            Event::RateLimitRefused {
                limiter,
                tenant,
                priority,
                retry_after,
                decided_by,
                ..
            } => {
                tracing::debug!(%limiter, %tenant, priority = priority.as_str(), retry_after = retry_after.as_secs_f64(), ?decided_by, "rate limit refused")
            }
            Event::TokensReserved {
                limiter,
                tenant,
                estimate,
                used_before,
                ..
            } => {
                tracing::debug!(%limiter, %tenant, estimate, used_before, "tokens reserved")
            }
            Event::TokensRefused {
                limiter,
                tenant,
                priority,
                estimate,
                used,
                retry_after,
                ..
            } => {
                tracing::debug!(%limiter, %tenant, priority = priority.as_str(), estimate, used, retry_after = retry_after.as_secs_f64(), "token limit refused")
            }
            Event::TokensSettled {
                limiter,
                tenant,
                estimate,
                actual,
                found,
            } => {
                tracing::debug!(%limiter, %tenant, estimate, actual, found, "tokens settled")
            }
            Event::StampClamped {
                limiter,
                tenant,
                asked,
                used,
            } => {
                tracing::warn!(%limiter, %tenant, %asked, %used, "caller clock outside the store's tolerance; stamp clamped")
            }
            Event::RetryScheduled {
                operation,
                attempt,
                delay,
                floor,
                error,
            } => {
                tracing::debug!(%operation, attempt, delay = delay.as_secs_f64(), floor = floor.as_secs_f64(), %error, "retrying")
            }
            Event::RetryBudgetStep {
                budget,
                command,
                granted,
                balance,
                decided_by,
                ..
            } => {
                let retries = *balance as f64 / MICROS_PER_RETRY as f64;
                if *granted {
                    tracing::debug!(%budget, command = command.as_str(), balance = retries, ?decided_by, "retry budget step")
                } else {
                    tracing::warn!(%budget, balance = retries, ?decided_by, "retry budget denied a retry")
                }
            }
            Event::RetryExhausted {
                operation,
                attempts,
                error,
            } => {
                tracing::warn!(%operation, attempts, %error, "retries exhausted")
            }
            Event::Rerouted {
                tenant,
                from,
                to,
                reason,
            } => {
                tracing::debug!(%tenant, %from, %to, reason, "call sent to another deployment")
            }
            Event::DeploymentDeferred {
                tenant,
                breaker,
                state,
                until,
            } => {
                tracing::debug!(%tenant, %breaker, state, %until, "deployment asked last: known to refuse")
            }
            Event::CallStarted { model, tenant } => tracing::trace!(%model, %tenant, "model call started"),
            Event::CallFinished {
                model,
                tenant,
                outcome,
                attempts,
                duration,
                ..
            } => {
                tracing::debug!(%model, %tenant, outcome, attempts, duration = duration.as_secs_f64(), "model call finished")
            }
            Event::RateLimitWait {
                model,
                tenant,
                wait,
                waits,
            } => {
                tracing::debug!(%model, %tenant, wait = wait.as_secs_f64(), waits, "waiting for a rate limit slot")
            }
            Event::CooldownWait {
                model,
                tenant,
                wait,
                waits,
            } => {
                tracing::debug!(%model, %tenant, wait = wait.as_secs_f64(), waits, "waiting out a shared cooldown")
            }
            Event::Hedged {
                tenant,
                from,
                to,
                after,
            } => {
                tracing::debug!(%tenant, %from, %to, after = after.as_secs_f64(), "hedged an unanswered attempt")
            }
            Event::SlowCall {
                breaker,
                tenant,
                duration,
                threshold,
                at,
            } => {
                tracing::debug!(%breaker, %tenant, duration = duration.as_secs_f64(), threshold = threshold.as_secs_f64(), %at, "slow answer counted as a breaker failure")
            }
            Event::ConcurrencyAdmitted {
                breaker,
                tenant,
                priority,
                id,
                in_flight,
                limit,
            } => {
                tracing::trace!(%breaker, %tenant, priority = priority.as_str(), id, in_flight, limit, "adaptive concurrency: admitted")
            }
            Event::ConcurrencyRefused {
                breaker,
                tenant,
                priority,
                in_flight,
                limit,
            } => {
                tracing::debug!(%breaker, %tenant, priority = priority.as_str(), in_flight, limit, "adaptive concurrency: at the limit, refused")
            }
            Event::ConcurrencyEnded {
                breaker,
                tenant,
                id,
                end,
                counted,
                from,
                to,
            } => {
                if whole(*from) != whole(*to) {
                    tracing::debug!(%breaker, %tenant, id, end = end.as_str(), counted, from = whole(*from), to = whole(*to), "adaptive concurrency: the limit moved")
                }
            }
            Event::SlowStartDraw {
                breaker,
                tenant,
                closed_at,
                at,
                share,
                draw,
            } => {
                tracing::debug!(%breaker, %tenant, %closed_at, %at, share, draw, took = draw < share, "slow start: a ramping deployment's share drawn")
            }
            Event::QuotaExhausted {
                breaker,
                tenant,
                wait,
                until,
                reset_given,
                ..
            } => {
                tracing::warn!(%breaker, %tenant, wait = wait.as_secs_f64(), %until, reset_given, "quota spent: the deployment cools down until its reset")
            }
            Event::DeadlineExceeded {
                model,
                tenant,
                waiting_for,
                needed,
                remaining,
            } => {
                tracing::warn!(%model, %tenant, waiting_for, needed = needed.as_secs_f64(), remaining = remaining.as_secs_f64(), "call deadline cannot cover the next wait")
            }
            Event::ServedModelDiffers { requested, served } => {
                tracing::warn!(%requested, %served, "a different model answered than the one requested")
            }
        }
    }
}

/// An observer that discards everything.
#[derive(Clone, Copy, Debug, Default)]
pub struct NoopObserver;

impl Observer for NoopObserver {
    fn on_event(&self, _: &Event) {}

    fn enabled(&self) -> bool {
        false
    }

    fn interest(&self) -> Interest {
        Interest::Never
    }
}

/// An observer that keeps every event, for tests and for the simulator's trace.
#[derive(Debug, Default)]
pub struct RecordingObserver {
    events: std::sync::Mutex<Vec<Event>>,
}

impl RecordingObserver {
    /// An empty recorder.
    pub fn new() -> Self {
        Self::default()
    }

    /// Every event so far, in arrival order.
    pub fn events(&self) -> Vec<Event> {
        self.events.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Removes and returns every event so far.
    pub fn take(&self) -> Vec<Event> {
        std::mem::take(&mut *self.events.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

impl Observer for RecordingObserver {
    fn on_event(&self, event: &Event) {
        self.events
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(event.clone());
    }

    fn interest(&self) -> Interest {
        Interest::Always
    }
}
