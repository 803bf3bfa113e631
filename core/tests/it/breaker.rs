//! The circuit breaker's documented behaviours, on a manual clock.

use std::sync::Arc;
use std::time::Duration;

use redstring::cache::KeyValue;
use redstring::{
    CacheError, CircuitBreaker, CircuitOpen, CircuitState, Clock, Env, Event, ManualClock, MemoryCache, OnCacheError,
    Permit, ProbeId, RecordingObserver, Refusal,
};

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

struct Rig {
    clock: Arc<ManualClock>,
    cache: Arc<MemoryCache>,
    observer: Arc<RecordingObserver>,
    breaker: CircuitBreaker,
}

fn rig(threshold: u32, timeout: u64, probes: u32) -> Rig {
    let clock = Arc::new(ManualClock::at_fixed_epoch());
    let cache = Arc::new(MemoryCache::new(clock.clone()));
    let observer = Arc::new(RecordingObserver::new());
    let breaker = CircuitBreaker::builder()
        .failure_threshold(threshold)
        .recovery_timeout(secs(timeout))
        .half_open_max_calls(probes)
        .env(Env::default().with_clock(clock.clone()).with_observer(observer.clone()))
        .cache(cache.clone())
        .build()
        .unwrap();
    Rig {
        clock,
        cache,
        observer,
        breaker,
    }
}

async fn fail(b: &CircuitBreaker, n: u32) {
    for _ in 0..n {
        assert!(b.allow_request().await);
        b.record_failure().await.unwrap();
    }
}

#[test]
fn defaults_are_five_sixty_one_and_kg_circuit() {
    let b = CircuitBreaker::builder().build().unwrap();
    let p = b.params();
    assert_eq!(
        (p.failure_threshold, p.recovery_timeout, p.half_open_max_calls),
        (5, secs(60), 1)
    );
    assert_eq!(b.key_prefix(), "kg:circuit");
}

#[test]
fn non_positive_settings_are_rejected_naming_the_argument() {
    let e = CircuitBreaker::builder().failure_threshold(0).build().unwrap_err();
    assert_eq!(e.to_string(), "failure_threshold must be positive, got 0");
    let e = CircuitBreaker::builder()
        .recovery_timeout(Duration::ZERO)
        .build()
        .unwrap_err();
    assert_eq!(e.to_string(), "recovery_timeout must be positive, got 0");
    let e = CircuitBreaker::builder().half_open_max_calls(0).build().unwrap_err();
    assert_eq!(e.to_string(), "half_open_max_calls must be between 1 and 1000, got 0");
    assert_eq!(
        CircuitBreaker::builder().key_prefix("").build().unwrap_err().field,
        "key_prefix"
    );
}

#[tokio::test]
async fn opens_after_threshold_failures_and_then_refuses() {
    let r = rig(3, 60, 1);
    fail(&r.breaker, 2).await;
    assert_eq!(r.breaker.state().await.unwrap(), CircuitState::Closed);
    fail(&r.breaker, 1).await;
    assert_eq!(r.breaker.state().await.unwrap(), CircuitState::Open);
    assert!(!r.breaker.allow_request().await);
    assert!(r.observer.events().contains(&Event::BreakerTransition {
        breaker: "kg:circuit".into(),
        from: CircuitState::Closed,
        to: CircuitState::Open,
        at: r.clock.now(),
    }));
}

#[tokio::test]
async fn after_the_timeout_one_probe_is_admitted_and_success_closes() {
    let r = rig(1, 60, 1);
    fail(&r.breaker, 1).await;
    r.clock.advance(secs(59));
    assert!(!r.breaker.allow_request().await);
    r.clock.advance(secs(1));
    assert!(r.breaker.allow_request().await, "the transitioning call is the probe");
    assert_eq!(r.breaker.state().await.unwrap(), CircuitState::HalfOpen);
    assert!(
        !r.breaker.allow_request().await,
        "everything else is refused while probing"
    );
    r.breaker.record_success().await.unwrap();
    assert_eq!(r.breaker.state().await.unwrap(), CircuitState::Closed);
    assert!(r.breaker.allow_request().await);
}

#[tokio::test]
async fn half_open_max_calls_two_admits_exactly_two() {
    let r = rig(1, 10, 2);
    fail(&r.breaker, 1).await;
    r.clock.advance(secs(10));
    let admitted = {
        let mut n = 0;
        for _ in 0..5 {
            n += r.breaker.allow_request().await as u32;
        }
        n
    };
    assert_eq!(admitted, 2);
}

#[tokio::test]
async fn a_failed_probe_reopens_at_once_with_a_fresh_timeout() {
    let r = rig(5, 60, 1);
    fail(&r.breaker, 5).await;
    r.clock.advance(secs(60));
    assert!(r.breaker.allow_request().await);
    r.breaker.record_failure().await.unwrap();
    assert_eq!(
        r.breaker.state().await.unwrap(),
        CircuitState::Open,
        "one failure, not five"
    );
    assert_eq!(
        r.breaker.retry_after().await.unwrap(),
        secs(60),
        "opened_at was rewritten"
    );
}

#[test]
fn escalation_is_off_by_default_and_a_cap_below_the_timeout_or_past_2_53_us_is_refused() {
    let b = CircuitBreaker::builder().recovery_timeout(secs(30)).build().unwrap();
    assert_eq!(b.params().max_recovery_timeout, secs(30), "no escalation unless asked");
    let low = CircuitBreaker::builder()
        .recovery_timeout(secs(30))
        .max_recovery_timeout(secs(10))
        .build()
        .unwrap_err();
    assert_eq!(low.field, "max_recovery_timeout");
    assert_eq!(
        low.to_string(),
        "max_recovery_timeout must be at least recovery_timeout, got 10 (recovery_timeout 30)"
    );
    let huge = CircuitBreaker::builder()
        .max_recovery_timeout(Duration::from_micros((1 << 53) + 1))
        .build()
        .unwrap_err();
    assert_eq!(huge.field, "max_recovery_timeout");
}

#[tokio::test]
async fn a_probe_that_keeps_failing_reopens_for_longer_each_time_up_to_the_cap() {
    let clock = Arc::new(ManualClock::at_fixed_epoch());
    let b = CircuitBreaker::builder()
        .failure_threshold(1)
        .recovery_timeout(secs(30))
        .max_recovery_timeout(secs(100))
        .env(Env::default().with_clock(clock.clone()))
        .build()
        .unwrap();
    fail(&b, 1).await;
    for period in [30, 60, 100, 100] {
        assert_eq!(b.retry_after().await.unwrap(), secs(period));
        clock.advance(secs(period - 1));
        assert!(!b.allow_request().await, "still open a second before {period} s");
        clock.advance(secs(1));
        assert!(b.allow_request().await, "a probe after {period} s");
        b.record_failure().await.unwrap();
    }
    // A probe that succeeds closes the circuit; the next opening is 30 s again.
    clock.advance(secs(100));
    assert!(b.allow_request().await);
    b.record_success().await.unwrap();
    fail(&b, 1).await;
    assert_eq!(b.retry_after().await.unwrap(), secs(30));
}

#[tokio::test]
async fn success_from_half_open_clears_failures_timestamp_and_probes() {
    let r = rig(2, 30, 1);
    fail(&r.breaker, 2).await;
    r.clock.advance(secs(30));
    assert!(r.breaker.allow_request().await);
    r.breaker.record_success().await.unwrap();
    let keys = r.breaker.keys();
    for key in [&keys.failures, &keys.opened_at, &keys.probes] {
        assert_eq!(r.cache.get(key).await.unwrap(), None, "{key}");
    }
    assert_eq!(r.breaker.retry_after().await.unwrap(), Duration::ZERO);
    // A fresh count: one failure does not reopen a threshold-2 breaker.
    fail(&r.breaker, 1).await;
    assert_eq!(r.breaker.state().await.unwrap(), CircuitState::Closed);
}

#[tokio::test]
async fn success_from_closed_clears_the_failure_count() {
    let r = rig(5, 60, 1);
    fail(&r.breaker, 4).await;
    r.breaker.record_success().await.unwrap();
    fail(&r.breaker, 4).await;
    assert_eq!(r.breaker.state().await.unwrap(), CircuitState::Closed);
    fail(&r.breaker, 1).await;
    assert_eq!(r.breaker.state().await.unwrap(), CircuitState::Open);
}

#[tokio::test]
async fn failures_decay_recovery_timeout_after_the_first_and_are_not_refreshed() {
    let r = rig(3, 60, 1);
    fail(&r.breaker, 1).await;
    r.clock.advance(secs(40));
    fail(&r.breaker, 1).await; // would keep the count alive if it refreshed the TTL
    r.clock.advance(secs(20)); // 60 s after the first: the count is gone
    fail(&r.breaker, 1).await;
    assert_eq!(r.breaker.state().await.unwrap(), CircuitState::Closed);
    assert_eq!(
        r.cache.get(&r.breaker.keys().failures).await.unwrap().as_deref(),
        Some("1")
    );
}

#[tokio::test]
async fn failures_spaced_wider_than_the_timeout_never_open() {
    let r = rig(2, 60, 1);
    for _ in 0..50 {
        fail(&r.breaker, 1).await;
        r.clock.advance(secs(61));
    }
    assert_eq!(r.breaker.state().await.unwrap(), CircuitState::Closed);
}

#[tokio::test]
async fn failures_while_open_do_not_push_recovery_out() {
    let r = rig(1, 60, 1);
    fail(&r.breaker, 1).await;
    r.clock.advance(secs(30));
    for _ in 0..10 {
        r.breaker.record_failure().await.unwrap();
    }
    assert_eq!(r.breaker.retry_after().await.unwrap(), secs(30));
    r.clock.advance(secs(30));
    assert!(r.breaker.allow_request().await);
}

#[tokio::test]
async fn state_and_retry_after_are_pure_reads() {
    let r = rig(1, 60, 1);
    fail(&r.breaker, 1).await;
    r.clock.advance(secs(20));
    assert_eq!(r.breaker.retry_after().await.unwrap(), secs(40));
    r.clock.advance(secs(100));
    for _ in 0..5 {
        assert_eq!(
            r.breaker.state().await.unwrap(),
            CircuitState::Open,
            "no transition on read"
        );
        assert_eq!(r.breaker.retry_after().await.unwrap(), Duration::ZERO);
    }
    assert!(r.breaker.allow_request().await, "reads spent no probe");
    assert_eq!(
        r.breaker.retry_after().await.unwrap(),
        Duration::ZERO,
        "opened_at survives into half-open, so probing reads as due"
    );
}

#[tokio::test]
async fn retry_after_is_zero_for_a_breaker_that_never_opened() {
    let r = rig(5, 60, 1);
    assert_eq!(r.breaker.retry_after().await.unwrap(), Duration::ZERO);
    assert_eq!(r.breaker.state().await.unwrap(), CircuitState::Closed);
}

#[tokio::test]
async fn an_unreadable_state_reads_as_closed_with_a_warning_event() {
    let r = rig(5, 60, 1);
    r.cache.set(&r.breaker.keys().state, "HALF-OPEN??", None).await.unwrap();
    assert_eq!(r.breaker.state().await.unwrap(), CircuitState::Closed);
    assert!(r.breaker.allow_request().await);
    let warnings = r
        .observer
        .events()
        .into_iter()
        .filter(|e| matches!(e, Event::BreakerStateUnreadable { stored, .. } if stored == "HALF-OPEN??"))
        .count();
    assert_eq!(warnings, 2, "each read of the damaged state reports it");
}

#[tokio::test]
async fn an_open_state_without_opened_at_means_recovery_is_due() {
    let r = rig(5, 60, 1);
    r.cache.set(&r.breaker.keys().state, "open", None).await.unwrap();
    assert_eq!(r.breaker.retry_after().await.unwrap(), Duration::ZERO);
    assert!(
        r.breaker.allow_request().await,
        "probes rather than staying open forever"
    );
    assert_eq!(r.breaker.state().await.unwrap(), CircuitState::HalfOpen);
}

#[tokio::test]
async fn reset_forces_closed_and_clears_everything() {
    let r = rig(1, 60, 1);
    fail(&r.breaker, 1).await;
    r.breaker.reset().await.unwrap();
    assert_eq!(r.breaker.state().await.unwrap(), CircuitState::Closed);
    assert_eq!(r.breaker.retry_after().await.unwrap(), Duration::ZERO);
    assert!(r.breaker.allow_request().await);
}

#[tokio::test]
async fn breakers_sharing_a_cache_and_prefix_are_one_breaker() {
    let r = rig(2, 60, 1);
    let twin = CircuitBreaker::builder()
        .failure_threshold(2)
        .env(Env::default().with_clock(r.clock.clone()))
        .cache(r.cache.clone())
        .build()
        .unwrap();
    let other = CircuitBreaker::builder()
        .failure_threshold(2)
        .key_prefix("kg:embed")
        .env(Env::default().with_clock(r.clock.clone()))
        .cache(r.cache.clone())
        .build()
        .unwrap();
    fail(&r.breaker, 1).await;
    fail(&twin, 1).await;
    assert!(!r.breaker.allow_request().await, "two workers' failures add up");
    assert!(!twin.allow_request().await);
    assert!(
        other.allow_request().await,
        "a different prefix guards a different server"
    );
}

#[tokio::test]
async fn close_releases_only_a_cache_the_breaker_built() {
    let r = rig(1, 60, 1);
    r.breaker.close().await.unwrap();
    assert!(r.cache.get("k").await.is_ok(), "a cache passed in stays open");

    let owned = CircuitBreaker::builder().build().unwrap();
    owned.close().await.unwrap();
    owned.close().await.unwrap();
    assert!(matches!(owned.state().await, Err(CacheError::Closed)));
}

#[tokio::test]
async fn an_unreachable_cache_admits_by_default_and_refuses_when_configured() {
    let clock = Arc::new(ManualClock::at_fixed_epoch());
    for (policy, expected) in [(OnCacheError::Allow, true), (OnCacheError::Refuse, false)] {
        let cache = Arc::new(MemoryCache::new(clock.clone()));
        let observer = Arc::new(RecordingObserver::new());
        let b = CircuitBreaker::builder()
            .on_cache_error(policy)
            .env(Env::default().with_clock(clock.clone()).with_observer(observer.clone()))
            .cache(cache.clone())
            .build()
            .unwrap();
        redstring::Cache::close(&*cache).await.unwrap();
        assert_eq!(b.allow_request().await, expected, "{policy:?}");
        assert!(
            matches!(
                &observer.events()[..],
                [Event::CacheUnavailable {
                    operation: "breaker_step",
                    ..
                }]
            ),
            "{:?}",
            observer.events()
        );
        assert!(b.record_failure().await.is_err(), "reporting surfaces the cache error");
    }
}

#[test]
fn circuit_open_carries_message_and_wait() {
    let e = CircuitOpen::new("qwen3 is unavailable", secs(12));
    assert_eq!(e.to_string(), "qwen3 is unavailable");
    assert_eq!(e.message, "qwen3 is unavailable");
    assert_eq!(e.retry_after, secs(12));
}

#[tokio::test]
async fn admissions_probes_and_failures_are_reported_as_events() {
    let r = rig(1, 10, 1);
    assert!(r.breaker.allow_request().await);
    r.breaker.record_failure().await.unwrap();
    r.clock.advance(secs(10));
    assert!(r.breaker.allow_request().await);
    let t0 = r.clock.now().saturating_sub(secs(10));
    let events = r.observer.events();
    assert!(events.contains(&Event::BreakerAllowed {
        breaker: "kg:circuit".into(),
        state: CircuitState::Closed,
        probe: None,
        at: t0,
    }));
    assert!(events.contains(&Event::BreakerFailureRecorded {
        breaker: "kg:circuit".into(),
        at: t0,
    }));
    assert_eq!(
        events.last(),
        Some(&Event::BreakerAllowed {
            breaker: "kg:circuit".into(),
            state: CircuitState::HalfOpen,
            probe: Some(ProbeId {
                episode: r.clock.now(),
                seq: 1
            }),
            at: r.clock.now(),
        }),
        "the probe is reported after the transition"
    );
}

#[test]
fn probe_numbers_that_mean_nothing_are_rejected_at_construction() {
    let err = CircuitBreaker::builder().half_open_max_calls(1001).build().unwrap_err();
    assert_eq!(err.field, "half_open_max_calls");
    let err = CircuitBreaker::builder()
        .probe_lease(Duration::ZERO)
        .build()
        .unwrap_err();
    assert_eq!(err.field, "probe_lease");
}

#[tokio::test]
async fn admission_is_data_and_a_refusal_carries_its_wait_from_the_same_step() {
    let r = rig(1, 60, 1);
    assert_eq!(r.breaker.admit().await, Permit::Call);
    r.breaker.record_failure().await.unwrap();
    r.clock.advance(secs(20));
    assert_eq!(
        r.breaker.admit().await,
        Permit::Refused {
            state: CircuitState::Open,
            retry_after: secs(40),
            reason: Refusal::Circuit,
        }
    );
    assert_eq!(
        r.observer.events().last(),
        Some(&Event::BreakerRejected {
            breaker: "kg:circuit".into(),
            state: CircuitState::Open,
            retry_after: secs(40),
        }),
        "the refusal's event carries the same wait"
    );
    r.clock.advance(secs(40));
    let Permit::Probe(id) = r.breaker.admit().await else {
        panic!("the transitioning call is a probe")
    };
    assert_eq!((id.episode, id.seq), (r.clock.now(), 1));
    assert_eq!(
        r.breaker.admit().await,
        Permit::Refused {
            state: CircuitState::HalfOpen,
            retry_after: secs(60),
            reason: Refusal::Circuit,
        },
        "refused until the live probe's lease ends"
    );
}

/// Issue: a probe whose caller vanished (a dropped future) left the circuit
/// half-open with its probes spent, refusing every call for good.
#[tokio::test]
async fn a_probe_that_never_reports_stops_counting_after_its_lease() {
    let r = rig(1, 60, 1);
    r.breaker.record_failure().await.unwrap();
    r.clock.advance(secs(60));
    let lost = r.breaker.admit().await;
    assert!(matches!(lost, Permit::Probe(_)));
    r.clock.advance(secs(59));
    assert!(!r.breaker.allow_request().await, "still live");
    r.clock.advance(secs(1));
    let fresh = r.breaker.admit().await;
    assert!(matches!(fresh, Permit::Probe(ProbeId { seq: 2, .. })), "{fresh:?}");
    assert!(
        r.observer
            .events()
            .iter()
            .any(|e| matches!(e, Event::BreakerProbesExpired { expired: 1, .. }))
    );
    // The lost probe's late verdict changes nothing, and is not reported as a
    // recorded failure; the live one decides.
    let recorded = |events: &[Event]| {
        events
            .iter()
            .filter(|e| matches!(e, Event::BreakerFailureRecorded { .. }))
            .count()
    };
    let before = recorded(&r.observer.events());
    r.breaker.record_failure_for(&lost).await.unwrap();
    assert_eq!(r.breaker.state().await.unwrap(), CircuitState::HalfOpen);
    assert_eq!(recorded(&r.observer.events()), before);
    r.breaker.record_success_for(&fresh).await.unwrap();
    assert_eq!(r.breaker.state().await.unwrap(), CircuitState::Closed);
}

/// Issue: handing back an unused admission read the state and then recorded a
/// failure, so a call admitted while closed could take another worker's
/// half-open probe for its own and reopen the circuit.
#[tokio::test]
async fn releasing_a_permit_touches_exactly_that_permit() {
    let r = rig(1, 60, 1);
    let closed_call = r.breaker.admit().await;
    r.breaker.record_failure().await.unwrap();
    r.clock.advance(secs(60));
    let probe = r.breaker.admit().await;
    assert!(matches!(probe, Permit::Probe(_)));
    r.breaker.release(&closed_call).await.unwrap();
    let recorded = |events: &[Event]| {
        events
            .iter()
            .filter(|e| matches!(e, Event::BreakerFailureRecorded { .. }))
            .count()
    };
    let before = recorded(&r.observer.events());
    r.breaker.record_failure_for(&closed_call).await.unwrap();
    assert_eq!(
        recorded(&r.observer.events()),
        before,
        "a failure that changes nothing is not reported as recorded"
    );
    assert_eq!(
        r.breaker.state().await.unwrap(),
        CircuitState::HalfOpen,
        "a closed call's hand-back or late failure leaves the probe episode alone"
    );
    assert!(
        !r.breaker.allow_request().await,
        "the other worker's probe is still live"
    );
    let released = |events: &[Event]| -> Vec<ProbeId> {
        events
            .iter()
            .filter_map(|e| match e {
                Event::BreakerProbeReleased { probe, .. } => Some(*probe),
                _ => None,
            })
            .collect()
    };
    assert!(
        released(&r.observer.events()).is_empty(),
        "a call permit's hand-back releases nothing"
    );
    r.breaker.release(&probe).await.unwrap();
    let Permit::Probe(id) = probe else { unreachable!() };
    assert_eq!(released(&r.observer.events()), [id]);
    assert!(
        r.breaker.allow_request().await,
        "a released probe frees its slot at once"
    );
}

#[tokio::test]
async fn a_success_that_clears_the_failure_count_is_reported_by_the_breaker() {
    let r = rig(3, 60, 1);
    let permit = r.breaker.admit().await;
    r.breaker.record_failure_for(&permit).await.unwrap();
    r.breaker.record_success_for(&permit).await.unwrap();
    let cleared = |events: &[Event]| {
        events
            .iter()
            .filter(|e| matches!(e, Event::BreakerFailuresCleared { .. }))
            .count()
    };
    assert_eq!(cleared(&r.observer.events()), 1);
    r.breaker.record_success().await.unwrap();
    assert_eq!(cleared(&r.observer.events()), 1, "nothing to clear, nothing reported");
    r.breaker.record_failure().await.unwrap();
    r.breaker.reset().await.unwrap();
    assert_eq!(
        cleared(&r.observer.events()),
        1,
        "a reset clears the count too, but it is no success"
    );
}

#[test]
fn a_circuit_open_message_says_when_the_next_probe_is_due() {
    assert_eq!(
        CircuitOpen::for_model("qwen3", Duration::from_millis(12_500)).to_string(),
        "qwen3 is unavailable; the next probe is due in 12.50s"
    );
    assert_eq!(
        CircuitOpen::for_model("qwen3", Duration::ZERO).to_string(),
        "qwen3 is unavailable"
    );
}

/// Every quota signal is reported with the end it asked for: one under a
/// longer cooldown as not written (the longer one is kept, never
/// shortened), and a longer one as extending it.
#[tokio::test]
async fn every_cooldown_signal_is_reported_and_only_a_longer_one_extends() {
    let r = rig(2, 60, 1);
    let at = r.clock.now();
    r.breaker.cool_down(secs(30)).await.unwrap();
    r.clock.advance(secs(1));
    assert_eq!(
        r.breaker.cool_down(secs(5)).await.unwrap(),
        None,
        "a shorter signal writes nothing"
    );
    assert_eq!(
        r.observer.events().last(),
        Some(&Event::BreakerCooldown {
            breaker: "kg:circuit".into(),
            duration: secs(5),
            until: at.saturating_add(secs(6)),
            at: at.saturating_add(secs(1)),
            extended: false,
        })
    );
    r.clock.advance(secs(10));
    assert_eq!(
        r.breaker.admit().await,
        Permit::Refused {
            state: CircuitState::Closed,
            retry_after: secs(19),
            reason: Refusal::Cooldown,
        },
        "the first, longer cooldown still refuses"
    );
    let later = r.clock.now();
    assert_eq!(
        r.breaker.cool_down(secs(40)).await.unwrap(),
        Some(later.saturating_add(secs(40)))
    );
    assert!(matches!(
        r.observer.events().last(),
        Some(Event::BreakerCooldown { extended: true, until, .. }) if *until == later.saturating_add(secs(40))
    ));
}

#[tokio::test]
async fn a_cooldown_refuses_as_data_and_reports_itself_apart_from_the_circuit() {
    let r = rig(2, 60, 1);
    let at = r.clock.now();
    assert_eq!(
        r.breaker.cool_down(secs(30)).await.unwrap(),
        Some(at.saturating_add(secs(30)))
    );
    assert_eq!(
        r.observer.events().last(),
        Some(&Event::BreakerCooldown {
            breaker: "kg:circuit".into(),
            duration: secs(30),
            until: at.saturating_add(secs(30)),
            at,
            extended: true,
        })
    );
    r.clock.advance(secs(10));
    assert_eq!(
        r.breaker.admit().await,
        Permit::Refused {
            state: CircuitState::Closed,
            retry_after: secs(20),
            reason: Refusal::Cooldown,
        }
    );
    assert_eq!(
        r.observer.events().last(),
        Some(&Event::BreakerCooldownRefused {
            breaker: "kg:circuit".into(),
            state: CircuitState::Closed,
            retry_after: secs(20),
            at: r.clock.now(),
        }),
        "a cooldown's refusal, not the circuit's"
    );
    assert_eq!(r.breaker.cool_down(secs(5)).await.unwrap(), None, "never shortened");
    assert_eq!(r.breaker.state().await.unwrap(), CircuitState::Closed);
    r.clock.advance(secs(20));
    assert_eq!(r.breaker.admit().await, Permit::Call);
    let open = CircuitOpen::refused("qwen3", secs(20), Refusal::Cooldown);
    assert_eq!(
        open.to_string(),
        "qwen3 is cooling down after a quota signal; calls resume in 20.00s"
    );
    assert_eq!(
        CircuitOpen::refused("qwen3", secs(2), Refusal::Circuit).reason,
        Refusal::Circuit
    );
}
