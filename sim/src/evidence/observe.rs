//! The one place the core's [`Event`]s become trace entries.
//!
//! A worker hands its limiter, breaker and hardened provider a
//! [`HostObserver`]; every event they report passes through [`to_trace`],
//! which decides what the trace keeps and in which typed form. When the
//! core's events change — a new event, a field that becomes data instead of
//! text — this function is the edit, and nothing downstream reads a core
//! event directly.

use redstring::DecidedBy;
use redstring::{Event, Interest, Observer};

use crate::evidence::trace::{Decider, HostTrace, Kind};

/// The observer a worker hands its components: redstring's events, into the trace.
#[derive(Clone, Debug)]
pub struct HostObserver {
    trace: HostTrace,
}

impl HostObserver {
    /// An observer recording as the host `trace` writes for.
    pub fn new(trace: HostTrace) -> Self {
        HostObserver { trace }
    }
}

impl Observer for HostObserver {
    fn on_event(&self, event: &Event) {
        if let Some(metrics) = self.trace.trace().metrics() {
            metrics.observe(self.trace.name(), event);
        }
        if let Some(kind) = to_trace(event) {
            self.trace.record(kind);
        }
    }

    fn interest(&self) -> Interest {
        Interest::Always
    }
}

/// The trace's name for the limiter that decided.
fn decider(d: DecidedBy) -> Decider {
    match d {
        DecidedBy::Store => Decider::Cache,
        DecidedBy::Local => Decider::Local,
        DecidedBy::Unlimited => Decider::Unlimited,
    }
}

/// The key prefix of a server's own limit (`hardening.deployment_rpm`),
/// before the server's name: its decisions are traced apart from the
/// tenants' limiter's.
pub const DEPLOYMENT_LIMIT_PREFIX: &str = "kg:deployment:";

/// The core's name for the breaker's atomic step, as its
/// `CacheUnavailable` event reports it.
const BREAKER_STEP: &str = "breaker_step";
/// The core's name of the adaptive concurrency step, in its
/// `CacheUnavailable` events: a call that could not reach it may have left
/// a lease the store ended without the trace hearing of it.
pub const CONCURRENCY_STEP: &str = "concurrency_step";
/// The core's name for a breaker fallback that admitted the call.
const ALLOWED: &str = "allowed";

fn micros(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// The trace entry for a core event, or `None` for events the trace does not
/// keep (a call's end is recorded by the worker, which knows its number and
/// latency; waits and give-ups show in the calls' outcomes).
pub fn to_trace(event: &Event) -> Option<Kind> {
    let kind = match event {
        Event::BreakerTransition { breaker, from, to, at } => Kind::Breaker {
            breaker: breaker.clone(),
            from: *from,
            to: *to,
            at_us: at.as_micros(),
        },
        Event::BreakerRejected {
            breaker,
            state,
            retry_after,
            ..
        } => Kind::Rejected {
            breaker: breaker.clone(),
            state: *state,
            retry_after_us: micros(*retry_after),
        },
        Event::BreakerAllowed {
            breaker,
            state,
            probe,
            at,
        } => Kind::Allowed {
            breaker: breaker.clone(),
            state: *state,
            probe: probe.map(|p| p.seq),
            at_us: at.as_micros(),
        },
        Event::BreakerProbeReleased { breaker, probe, .. } => Kind::ProbeReleased {
            breaker: breaker.clone(),
            seq: probe.seq,
        },
        Event::BreakerCooldown {
            breaker,
            until,
            at,
            extended,
            ..
        } => Kind::Cooldown {
            breaker: breaker.clone(),
            until_us: until.as_micros(),
            at_us: at.as_micros(),
            extended: *extended,
        },
        Event::BreakerCooldownRefused {
            breaker,
            state,
            retry_after,
            at,
        } => Kind::CooldownRefused {
            breaker: breaker.clone(),
            state: *state,
            retry_after_us: micros(*retry_after),
            at_us: at.as_micros(),
        },
        Event::BreakerFailureRecorded { breaker, at } => Kind::FailureRecorded {
            breaker: breaker.clone(),
            at_us: at.as_micros(),
        },
        Event::BreakerStateUnreadable { .. } => Kind::Unreadable,
        Event::CacheUnavailable {
            operation, fallback, ..
        } => Kind::CacheUnavailable {
            operation,
            fallback,
            // The core reports a breaker admitting a call without its cache
            // only through this event's words.
            admitted_call: *operation == BREAKER_STEP && *fallback == ALLOWED,
        },
        Event::RateLimitAdmitted {
            limiter,
            priority,
            at,
            decided_by,
            ..
        } if limiter.starts_with(DEPLOYMENT_LIMIT_PREFIX) => Kind::DeploymentAdmitted {
            server: limiter[DEPLOYMENT_LIMIT_PREFIX.len()..].into(),
            priority: *priority,
            at_us: at.as_micros(),
            decided_by: decider(*decided_by),
        },
        Event::RateLimitRefused {
            limiter,
            priority,
            retry_after,
            at,
            decided_by,
            ..
        } if limiter.starts_with(DEPLOYMENT_LIMIT_PREFIX) => Kind::DeploymentLimited {
            server: limiter[DEPLOYMENT_LIMIT_PREFIX.len()..].into(),
            priority: *priority,
            retry_after_us: micros(*retry_after),
            at_us: at.as_micros(),
            decided_by: decider(*decided_by),
        },
        Event::RateLimitAdmitted {
            tenant,
            remaining,
            at,
            decided_by,
            ..
        } => Kind::Admitted {
            tenant: *tenant,
            remaining: *remaining,
            at_us: at.as_micros(),
            decided_by: decider(*decided_by),
        },
        Event::RateLimitRefused {
            tenant,
            retry_after,
            at,
            decided_by,
            ..
        } => Kind::Limited {
            tenant: *tenant,
            retry_after_us: micros(*retry_after),
            at_us: at.as_micros(),
            decided_by: decider(*decided_by),
        },
        Event::BreakerFailuresCleared { breaker, at } => Kind::FailuresCleared {
            breaker: breaker.clone(),
            at_us: at.as_micros(),
        },
        Event::BreakerProbesExpired { breaker, expired, at } => Kind::ProbesExpired {
            breaker: breaker.clone(),
            expired: *expired,
            at_us: at.as_micros(),
        },
        Event::StampClamped {
            tenant, asked, used, ..
        } => Kind::StampClamped {
            tenant: *tenant,
            asked_us: asked.as_micros(),
            used_us: used.as_micros(),
        },
        Event::RetryScheduled {
            attempt, delay, floor, ..
        } => Kind::Retry {
            attempt: *attempt,
            delay_us: micros(*delay),
            floor_us: micros(*floor),
        },
        Event::RetryBudgetStep {
            budget,
            command,
            granted,
            balance,
            at,
            decided_by,
        } => Kind::Budget {
            budget: budget.clone(),
            command: *command,
            granted: *granted,
            balance: *balance,
            at_us: at.as_micros(),
            decided_by: decider(*decided_by),
        },
        Event::TokensReserved {
            tenant,
            estimate,
            at,
            decided_by,
            ..
        } => Kind::Reserved {
            tenant: *tenant,
            estimate: *estimate,
            at_us: at.as_micros(),
            decided_by: decider(*decided_by),
        },
        Event::TokensRefused {
            tenant,
            estimate,
            used,
            retry_after,
            decided_by,
            ..
        } => Kind::TokensRefused {
            tenant: *tenant,
            estimate: *estimate,
            used: *used,
            retry_after_us: micros(*retry_after),
            decided_by: decider(*decided_by),
        },
        Event::TokensSettled {
            tenant,
            estimate,
            actual,
            found,
            ..
        } => Kind::Settled {
            tenant: *tenant,
            estimate: *estimate,
            actual: *actual,
            found: *found,
        },
        Event::RetryExhausted { .. }
        | Event::CallStarted { .. }
        | Event::CallFinished { .. }
        | Event::RateLimitWait { .. }
        | Event::CooldownWait { .. }
        | Event::DeadlineExceeded { .. } => return None,
        // Where a routed call went shows in its requests, each naming its server.
        Event::Rerouted { .. } => return None,
        Event::QuotaExhausted { breaker, until, at, .. } => Kind::QuotaSpent {
            breaker: breaker.clone(),
            until_us: until.as_micros(),
            at_us: at.as_micros(),
        },
        Event::Hedged { from, to, after, .. } => Kind::Hedged {
            from: from.clone(),
            to: to.clone(),
            after_us: micros(*after),
        },
        Event::SlowCall { breaker, duration, .. } => Kind::SlowCall {
            breaker: breaker.clone(),
            took_us: micros(*duration),
        },
        Event::SlowStartDraw {
            breaker,
            closed_at,
            at,
            share,
            draw,
            ..
        } => Kind::SlowStart {
            breaker: breaker.clone(),
            closed_at_us: closed_at.as_micros(),
            at_us: at.as_micros(),
            share: *share,
            draw: *draw,
        },
        Event::ConcurrencyAdmitted {
            breaker,
            priority,
            id,
            in_flight,
            limit,
            ..
        } => Kind::ConcurrencyAdmitted {
            breaker: breaker.clone(),
            priority: *priority,
            id: *id,
            in_flight: *in_flight,
            limit: *limit,
        },
        Event::ConcurrencyRefused {
            breaker,
            priority,
            in_flight,
            limit,
            ..
        } => Kind::ConcurrencyRefused {
            breaker: breaker.clone(),
            priority: *priority,
            in_flight: *in_flight,
            limit: *limit,
        },
        Event::ConcurrencyEnded {
            breaker,
            id,
            end,
            counted,
            from,
            to,
            ..
        } => Kind::ConcurrencyEnded {
            breaker: breaker.clone(),
            id: *id,
            end: *end,
            counted: *counted,
            from: *from,
            to: *to,
        },
        Event::DeploymentDeferred {
            breaker, state, until, ..
        } => Kind::Deferred {
            breaker: breaker.clone(),
            state,
            until_us: until.as_micros(),
        },
        // `Event` is `#[non_exhaustive]`: an event the core adds later is not
        // traced until it is given a case above.
        _ => return None,
    };
    Some(kind)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use redstring::{CircuitBreaker, Env, ManualClock, MemoryCache, OnCacheError};

    use super::*;
    use crate::evidence::trace::Trace;

    /// The trace's reading of a breaker whose cache is gone, by policy.
    async fn admitted_without_cache(policy: OnCacheError) -> Vec<bool> {
        let clock = Arc::new(ManualClock::at_fixed_epoch());
        let cache = Arc::new(MemoryCache::new(clock.clone()));
        let trace = Trace::new();
        let breaker = CircuitBreaker::builder()
            .on_cache_error(policy)
            .env(
                Env::default()
                    .with_clock(clock)
                    .with_observer(Arc::new(HostObserver::new(trace.host("w")))),
            )
            .cache(cache.clone())
            .build()
            .unwrap();
        redstring::Cache::close(&*cache).await.unwrap();
        breaker.allow_request().await;
        trace.events().iter().map(|e| e.kind.admits_call()).collect()
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_cooldown_and_its_refusal_reach_the_trace_with_their_stamps() {
        let clock = Arc::new(ManualClock::at_fixed_epoch());
        let trace = Trace::new();
        let breaker = CircuitBreaker::builder()
            .key_prefix("kg:circuit:api")
            .env(
                Env::default()
                    .with_clock(clock.clone())
                    .with_observer(Arc::new(HostObserver::new(trace.host("w")))),
            )
            .build()
            .unwrap();
        let at = redstring::Clock::now(&*clock).as_micros();
        breaker.cool_down(std::time::Duration::from_secs(3)).await.unwrap();
        clock.advance(std::time::Duration::from_secs(1));
        assert!(!breaker.allow_request().await);
        let kinds: Vec<Kind> = trace.events().into_iter().map(|e| e.kind).collect();
        assert_eq!(
            kinds,
            [
                Kind::Cooldown {
                    breaker: "kg:circuit:api".into(),
                    until_us: at + 3_000_000,
                    at_us: at,
                    extended: true,
                },
                Kind::CooldownRefused {
                    breaker: "kg:circuit:api".into(),
                    state: redstring::CircuitState::Closed,
                    retry_after_us: 2_000_000,
                    at_us: at + 1_000_000,
                },
            ]
        );
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_breaker_admitting_without_its_cache_is_an_admitted_call() {
        assert_eq!(admitted_without_cache(OnCacheError::Allow).await, [true]);
        assert_eq!(admitted_without_cache(OnCacheError::Refuse).await, [false]);
    }
}
