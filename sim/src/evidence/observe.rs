//! The one place the core's [`Event`]s become trace entries.
//!
//! A worker hands its limiter, breaker and hardened provider a
//! [`HostObserver`]; every event they report passes through [`to_trace`],
//! which decides what the trace keeps and in which typed form. When the
//! core's events change — a new event, a field that becomes data instead of
//! text — this function is the edit, and nothing downstream reads a core
//! event directly.
//!
//! One fact spans two events: the core reports a limiter's fallback
//! (`CacheUnavailable` from `acquire_slot`) and then, synchronously, the
//! decision the fallback made. The observer carries the fallback over to that
//! decision, so the trace says which limiter decided ([`Decider`]).

use std::sync::Mutex;

use redstring::{Event, Observer};

use crate::evidence::trace::{Decider, Kind, Trace};

/// The observer a worker hands its components: redstring's events, into the trace.
#[derive(Debug)]
pub struct HostObserver {
    host: String,
    trace: Trace,
    /// The limiter fallback just reported, for the decision that follows it.
    fallback: Mutex<Decider>,
}

impl HostObserver {
    /// An observer recording as `host`.
    pub fn new(host: &str, trace: Trace) -> Self {
        HostObserver {
            host: host.to_owned(),
            trace,
            fallback: Mutex::new(Decider::Cache),
        }
    }
}

impl Observer for HostObserver {
    fn on_event(&self, event: &Event) {
        let mut fallback = self.fallback.lock().unwrap_or_else(|p| p.into_inner());
        let decider = std::mem::take(&mut *fallback);
        if let Some(kind) = to_trace(event, decider) {
            if let Kind::CacheUnavailable {
                operation: ACQUIRE_SLOT,
                fallback: taken,
                ..
            } = &kind
            {
                *fallback = match *taken {
                    LOCAL_LIMIT => Decider::Local,
                    ALLOWED => Decider::Unlimited,
                    _ => Decider::Cache,
                };
            }
            self.trace.record(&self.host, kind);
        }
    }
}

/// The core's name for the limiter's atomic step, as its `CacheUnavailable`
/// event reports it.
const ACQUIRE_SLOT: &str = "acquire_slot";
/// The core's name for the limiter's local-limit fallback.
const LOCAL_LIMIT: &str = "local limit";

/// The core's name for the breaker's atomic step, as its
/// `CacheUnavailable` event reports it.
const BREAKER_STEP: &str = "breaker_step";
/// The core's name for a breaker fallback that admitted the call.
const ALLOWED: &str = "allowed";

fn micros(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// The trace entry for a core event, or `None` for events the trace does not
/// keep (a call's end is recorded by the worker, which knows its number and
/// latency; waits and give-ups show in the calls' outcomes). `decider` is who
/// made a limiter decision this event reports: the fallback the event just
/// before it announced, if any.
pub fn to_trace(event: &Event, decider: Decider) -> Option<Kind> {
    let kind = match event {
        Event::BreakerTransition { breaker, from, to, at } => Kind::Breaker {
            breaker: breaker.to_string(),
            from: *from,
            to: *to,
            at_us: at.as_micros(),
        },
        Event::BreakerRejected { breaker, state, .. } => Kind::Rejected {
            breaker: breaker.to_string(),
            state: *state,
        },
        Event::BreakerAllowed {
            breaker,
            state,
            probe,
            at,
        } => Kind::Allowed {
            breaker: breaker.to_string(),
            state: *state,
            probe: probe.map(|p| p.seq),
            at_us: at.as_micros(),
        },
        Event::BreakerProbeReleased { breaker, probe, .. } => Kind::ProbeReleased {
            breaker: breaker.to_string(),
            seq: probe.seq,
        },
        Event::BreakerFailureRecorded { breaker, at } => Kind::FailureRecorded {
            breaker: breaker.to_string(),
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
            tenant, remaining, at, ..
        } => Kind::Admitted {
            tenant: *tenant,
            remaining: *remaining,
            at_us: at.as_micros(),
            decided_by: decider,
        },
        Event::RateLimitRefused {
            tenant,
            retry_after,
            at,
            ..
        } => Kind::Limited {
            tenant: *tenant,
            retry_after_us: micros(*retry_after),
            at_us: at.as_micros(),
            decided_by: decider,
        },
        Event::BreakerFailuresCleared { breaker, at } => Kind::FailuresCleared {
            breaker: breaker.to_string(),
            at_us: at.as_micros(),
        },
        Event::BreakerProbesExpired { breaker, expired, at } => Kind::ProbesExpired {
            breaker: breaker.to_string(),
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
        Event::RetryScheduled { attempt, delay, .. } => Kind::Retry {
            attempt: *attempt,
            delay_us: micros(*delay),
        },
        Event::RetryExhausted { .. }
        | Event::CallFinished { .. }
        | Event::RateLimitWait { .. }
        | Event::DeadlineExceeded { .. } => return None,
        // `Event` is `#[non_exhaustive]`: an event the core adds later is not
        // traced until it is given a case above.
        _ => return None,
    };
    Some(kind)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use redstring::{CircuitBreaker, ManualClock, MemoryCache, OnCacheError};

    use super::*;

    /// The trace's reading of a breaker whose cache is gone, by policy.
    async fn admitted_without_cache(policy: OnCacheError) -> Vec<bool> {
        let clock = Arc::new(ManualClock::at_fixed_epoch());
        let cache = Arc::new(MemoryCache::new(clock.clone()));
        let trace = Trace::new();
        let breaker = CircuitBreaker::builder()
            .on_cache_error(policy)
            .clock(clock)
            .cache(cache.clone())
            .observer(Arc::new(HostObserver::new("w", trace.clone())))
            .build()
            .unwrap();
        redstring::Cache::close(&*cache).await.unwrap();
        breaker.allow_request().await;
        trace.events().iter().map(|e| e.kind.admits_call()).collect()
    }

    /// What the trace records as deciders when the core reports `events`:
    /// each limiter decision, and the fallback (if any) announced before it.
    fn deciders(fallbacks: &[Option<&'static str>]) -> Vec<Decider> {
        use redstring::{TenantId, Timestamp};
        let trace = Trace::new();
        let observer = HostObserver::new("w", trace.clone());
        for fallback in fallbacks {
            if let Some(fallback) = fallback {
                observer.on_event(&Event::CacheUnavailable {
                    component: "limiter".into(),
                    operation: "acquire_slot",
                    fallback,
                    error: "unreachable".into(),
                });
            }
            observer.on_event(&Event::RateLimitAdmitted {
                limiter: "limiter".into(),
                tenant: TenantId::from_u128(1),
                remaining: 0,
                at: Timestamp::from_secs(1),
            });
        }
        trace
            .events()
            .iter()
            .filter_map(|e| match e.kind {
                Kind::Admitted { decided_by, .. } => Some(decided_by),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn a_limiter_fallback_names_who_decided_the_next_decision_only() {
        assert_eq!(
            deciders(&[None, Some("local limit"), None, Some("allowed"), None]),
            [
                Decider::Cache,
                Decider::Local,
                Decider::Cache,
                Decider::Unlimited,
                Decider::Cache
            ]
        );
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_breaker_admitting_without_its_cache_is_an_admitted_call() {
        assert_eq!(admitted_without_cache(OnCacheError::Allow).await, [true]);
        assert_eq!(admitted_without_cache(OnCacheError::Refuse).await, [false]);
    }
}
