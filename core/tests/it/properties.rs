//! Property tests for the invariants the limiter and breaker promise, over
//! random configurations and call sequences on a manual clock — and with tasks
//! racing on one component.
//!
//! Case counts are modest by default; `PROPTEST_CASES=2000 cargo test -p
//! redstring --test it properties::` runs a deeper search.

use std::sync::Arc;
use std::time::Duration;

use crate::support;
use proptest::prelude::*;
use redstring::{
    AcquireError, CircuitBreaker, CircuitState, Clock, Env, ManualClock, RateLimiter, TenantId, Timestamp,
};

const T: TenantId = TenantId::from_u128(7);

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().build().unwrap()
}

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: support::proptest_cases(64),
        ..ProptestConfig::default()
    }
}

/// Gaps between calls: mostly short (bursts), sometimes long (a window or more).
fn gaps() -> impl Strategy<Value = Vec<Duration>> {
    prop::collection::vec(
        prop_oneof![
            4 => (0u64..2_000).prop_map(Duration::from_millis),
            1 => (0u64..200_000).prop_map(Duration::from_millis),
        ],
        1..300,
    )
}

proptest! {
    #![proptest_config(config())]

    /// Invariant 1: never more than `rpm` admissions in any window.
    #[test]
    fn admissions_never_exceed_rpm_in_any_window(rpm in 1u32..12, window_s in 1u64..90, gaps in gaps()) {
        let window = Duration::from_secs(window_s);
        let admitted = runtime().block_on(async {
            let clock = Arc::new(ManualClock::at_fixed_epoch());
            let l = RateLimiter::builder(rpm).window(window).env(Env::default().with_clock(clock.clone())).build().unwrap();
            let mut admitted: Vec<Timestamp> = Vec::new();
            for gap in gaps {
                clock.advance(gap);
                if l.acquire(T).await.is_ok() {
                    admitted.push(redstring::Clock::now(&*clock));
                }
            }
            admitted
        });
        for (i, t) in admitted.iter().enumerate() {
            let since = t.saturating_sub(window);
            let in_window = admitted[..=i].iter().filter(|a| **a >= since).count();
            prop_assert!(in_window <= rpm as usize, "{in_window} admissions in the window ending {t}");
        }
    }

    /// Invariant 2: successive refusals never report a growing wait while no
    /// hit is added, and sleeping exactly the last wait
    /// always succeeds.
    #[test]
    fn retry_after_never_grows_between_admissions(rpm in 1u32..6, window_s in 1u64..90, gaps in gaps()) {
        runtime().block_on(async {
            let clock = Arc::new(ManualClock::at_fixed_epoch());
            let l = RateLimiter::builder(rpm).window(Duration::from_secs(window_s)).env(Env::default().with_clock(clock.clone())).build().unwrap();
            let mut last: Option<Duration> = None;
            for gap in gaps {
                clock.advance(gap);
                match l.acquire(T).await {
                    Ok(_) => last = None,
                    Err(AcquireError::Limited(e)) => {
                        if let Some(prev) = last {
                            prop_assert!(e.retry_after <= prev, "{:?} grew past {:?}", e.retry_after, prev);
                        }
                        prop_assert!(e.retry_after <= Duration::from_secs(window_s) + Duration::from_micros(1));
                        last = Some(e.retry_after);
                    }
                    Err(other) => prop_assert!(false, "{other}"),
                }
            }
            if let Some(wait) = last {
                clock.advance(wait);
                prop_assert!(l.acquire(T).await.is_ok(), "sleeping exactly retry_after frees a slot");
            }
            Ok(())
        })?;
    }
}

#[derive(Clone, Copy, Debug)]
enum Op {
    /// allow_request, then report the outcome if admitted.
    Call {
        succeeds: bool,
    },
    /// allow_request without reporting (a call still in flight).
    Probe,
    Wait(Duration),
}

fn ops() -> impl Strategy<Value = Vec<Op>> {
    prop::collection::vec(
        prop_oneof![
            4 => any::<bool>().prop_map(|succeeds| Op::Call { succeeds }),
            1 => Just(Op::Probe),
            3 => (0u64..90_000).prop_map(|ms| Op::Wait(Duration::from_millis(ms))),
        ],
        1..200,
    )
}

proptest! {
    #![proptest_config(config())]

    /// Invariant 3: a half-open episode holds at most `half_open_max_calls`
    /// live probes, the transitioning call included — and admits a probe
    /// exactly when fewer are live (a probe stops counting when its lease,
    /// here `recovery_timeout`, ends).
    #[test]
    fn half_open_episodes_admit_exactly_the_probe_limit(
        threshold in 1u32..5, timeout_s in 1u64..60, probes in 1u32..4, ops in ops(),
    ) {
        runtime().block_on(async {
            let clock = Arc::new(ManualClock::at_fixed_epoch());
            let b = CircuitBreaker::builder()
                .failure_threshold(threshold)
                .recovery_timeout(Duration::from_secs(timeout_s))
                .half_open_max_calls(probes)
                .env(Env::default().with_clock(clock.clone()))
                .build()
                .unwrap();
            // When each probe of the current half-open episode still in flight
            // was admitted.
            let lease = Duration::from_secs(timeout_s);
            let mut in_flight: Vec<Timestamp> = Vec::new();
            for op in ops {
                match op {
                    Op::Wait(d) => clock.advance(d),
                    Op::Call { .. } | Op::Probe => {
                        let before = b.state().await.unwrap();
                        let now = redstring::Clock::now(&*clock);
                        in_flight.retain(|t| now.saturating_duration_since(*t) < lease);
                        let allowed = b.allow_request().await;
                        let after = b.state().await.unwrap();
                        if before == CircuitState::HalfOpen {
                            prop_assert_eq!(allowed, in_flight.len() < probes as usize, "{} live probes", in_flight.len());
                        }
                        if after == CircuitState::HalfOpen && allowed {
                            in_flight.push(now);
                            prop_assert!(in_flight.len() <= probes as usize);
                        }
                        if before == CircuitState::Open && after == CircuitState::Open {
                            prop_assert!(!allowed, "invariant 5: an open breaker not yet due admits nothing");
                        }
                        if let (true, Op::Call { succeeds }) = (allowed, op) {
                            if succeeds { b.record_success().await.unwrap() } else { b.record_failure().await.unwrap() }
                        }
                        if b.state().await.unwrap() != CircuitState::HalfOpen {
                            in_flight.clear();
                        }
                    }
                }
            }
            Ok(())
        })?;
    }

    /// Invariant 4: with threshold ≥ 2, failures spaced further apart than
    /// `recovery_timeout` never open the circuit, whatever successes come between.
    #[test]
    fn sparse_failures_never_open(
        threshold in 2u32..6, timeout_s in 1u64..120,
        spacing in prop::collection::vec((1u64..5_000, any::<bool>()), 1..80),
    ) {
        runtime().block_on(async {
            let clock = Arc::new(ManualClock::at_fixed_epoch());
            let timeout = Duration::from_secs(timeout_s);
            let b = CircuitBreaker::builder()
                .failure_threshold(threshold)
                .recovery_timeout(timeout)
                .env(Env::default().with_clock(clock.clone()))
                .build()
                .unwrap();
            for (extra_ms, success_between) in spacing {
                prop_assert!(b.allow_request().await);
                b.record_failure().await.unwrap();
                clock.advance(timeout + Duration::from_millis(extra_ms));
                if success_between {
                    prop_assert!(b.allow_request().await);
                    b.record_success().await.unwrap();
                }
            }
            prop_assert_eq!(b.state().await.unwrap(), CircuitState::Closed);
            Ok(())
        })?;
    }
}

fn multi_thread() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .build()
        .unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: config().cases.min(24), ..ProptestConfig::default() })]

    /// Many tasks racing on one limiter (one shared in-process cache) never
    /// get more than `rpm` slots between them.
    #[test]
    fn racing_tasks_never_exceed_rpm(rpm in 1u32..30, tasks in 2usize..64) {
        let admitted = multi_thread().block_on(async {
            let clock = Arc::new(ManualClock::at_fixed_epoch());
            let l = Arc::new(RateLimiter::builder(rpm).env(Env::default().with_clock(clock)).build().unwrap());
            let handles: Vec<_> = (0..tasks)
                .map(|_| {
                    let l = l.clone();
                    tokio::spawn(async move { l.acquire(T).await.is_ok() })
                })
                .collect();
            let mut admitted = 0u32;
            for h in handles {
                admitted += h.await.unwrap() as u32;
            }
            admitted
        });
        prop_assert_eq!(admitted, rpm.min(tasks as u32));
    }

    /// Many tasks racing `allow_request` on one half-open breaker get exactly
    /// `half_open_max_calls` probes between them.
    #[test]
    fn racing_tasks_never_exceed_the_probe_limit(probes in 1u32..8, tasks in 2usize..64) {
        let admitted = multi_thread().block_on(async {
            let clock = Arc::new(ManualClock::at_fixed_epoch());
            let b = Arc::new(
                CircuitBreaker::builder()
                    .failure_threshold(1)
                    .recovery_timeout(Duration::from_secs(10))
                    .half_open_max_calls(probes)
                    .env(Env::default().with_clock(clock.clone()))
                    .build()
                    .unwrap(),
            );
            b.record_failure().await.unwrap();
            clock.advance(Duration::from_secs(10));
            let handles: Vec<_> = (0..tasks)
                .map(|_| {
                    let b = b.clone();
                    tokio::spawn(async move { b.allow_request().await })
                })
                .collect();
            let mut admitted = 0u32;
            for h in handles {
                admitted += h.await.unwrap() as u32;
            }
            admitted
        });
        prop_assert_eq!(admitted, probes.min(tasks as u32));
    }
}

proptest! {
    #![proptest_config(config())]

    /// Issue: a fast clock lifted a shared limit for everyone. On a
    /// caller-stamped `MemoryCache`, callers with random skews keep the limit
    /// exact in stamp time and within `skew_bound` in true time.
    #[test]
    fn skewed_callers_stay_within_the_skew_bound(case in support::skew::cases(Duration::from_secs(10), 120)) {
        let window = Duration::from_secs(10);
        let max_ahead = Duration::from_secs(1);
        let admitted = runtime().block_on(async {
            let clock = Arc::new(ManualClock::at_fixed_epoch());
            let store = redstring::MemoryCache::with_time_source(clock.clone(), redstring::TimeSource::Caller);
            support::skew::run(&store, "k", &case, window, max_ahead, async |gap| {
                clock.advance(gap);
                redstring::Clock::now(&*clock)
            })
            .await
        });
        support::skew::check(&case, &admitted, window, max_ahead, Duration::ZERO);
    }
}

proptest! {
    #![proptest_config(config())]

    /// Probes are leases: on `MemoryCache`, any interleaving of admissions,
    /// reports, releases, vanished callers and clock steps holds at most
    /// `half_open_max_calls` live probes, never refuses in half-open for longer
    /// than one lease, and lets only a live probe decide an episode.
    #[test]
    fn probe_leases_hold_on_memory(
        threshold in 1u32..3,
        probes in 1u32..4,
        lease_s in 1u64..15,
        actions in support::lease::actions(120),
    ) {
        runtime().block_on(async {
            let clock = Arc::new(ManualClock::at_fixed_epoch());
            let store = redstring::MemoryCache::with_time_source(clock.clone(), redstring::TimeSource::Caller);
            let keys = redstring::decide::breaker::BreakerKeys::new("prop");
            let start = redstring::Clock::now(&*clock);
            support::lease::run(&store, &keys, support::lease::params(threshold, probes, lease_s), start, &actions).await;
        });
    }
}

proptest! {
    #![proptest_config(config())]

    /// Over any run of steps, the retries a budget granted are at most
    /// `max_balance + ratio × deposits + floor × elapsed` (`BudgetParams::bound`),
    /// whatever the order of deposits and withdrawals and the gaps between them.
    #[test]
    fn a_retry_budget_never_grants_more_than_its_bound(
        ratio in 0.0f64..2.0,
        floor in 0u32..5,
        cap in 1u32..20,
        steps in prop::collection::vec((any::<bool>(), 0u64..3_000_000), 1..200),
    ) {
        use redstring::cache::BudgetStore;
        use redstring::decide::budget::BudgetCommand;
        let clock = Arc::new(ManualClock::at_fixed_epoch());
        let budget = redstring::RetryBudget::builder()
            .ratio(ratio)
            .min_retries_per_sec(floor)
            .max_balance(cap)
            .env(Env::default().with_clock(clock.clone()))
            .build()
            .unwrap();
        let params = *budget.params();
        let rt = runtime();
        // (instant, deposit?, granted?) per step.
        let mut log = Vec::new();
        for (deposit, gap_us) in steps {
            clock.advance(Duration::from_micros(gap_us));
            let command = if deposit { BudgetCommand::Deposit } else { BudgetCommand::Withdraw };
            let step = rt
                .block_on(budget.cache().budget_step(budget.key(), command, params, clock.now()))
                .unwrap();
            log.push((clock.now(), deposit, !deposit && step.granted));
        }
        for i in 0..log.len() {
            let (mut deposits, mut granted) = (0u64, 0u64);
            for &(at, deposit, grant) in &log[i..] {
                deposits += u64::from(deposit);
                granted += u64::from(grant);
                let bound = params.bound(deposits, at.saturating_duration_since(log[i].0));
                prop_assert!(granted <= bound, "from step {}: {} granted, bound {}", i, granted, bound);
            }
        }
    }
}

proptest! {
    #![proptest_config(config())]

    /// Token budgets: in any window the tokens of the calls admitted (as they
    /// were finally settled, or their estimates) are at most the limit plus
    /// the estimation errors of the calls in it that settled above their
    /// estimate — whatever the order of reservations, refunds and charges.
    #[test]
    fn admitted_tokens_never_exceed_the_limit_plus_the_estimation_errors(
        limit in 100u64..2000,
        ops in prop::collection::vec(
            prop_oneof![
                3 => (0u64..5_000, 1u64..600).prop_map(|(gap, est)| (true, gap, est, 0usize)),
                2 => (0u64..5_000, 0u64..900, 0usize..8).prop_map(|(gap, actual, back)| (false, gap, actual, back)),
            ],
            1..150,
        ),
    ) {
        let clock = Arc::new(ManualClock::at_fixed_epoch());
        let limiter = RateLimiter::builder(10_000).tokens_per_window(limit).env(Env::default().with_clock(clock.clone())).build().unwrap();
        let window = limiter.window();
        let rt = runtime();
        // (at, estimate, settled actual, reservation) per admitted call.
        let mut admitted: Vec<(Timestamp, u64, Option<u64>, redstring::limiter::Reservation)> = Vec::new();
        for (acquire, gap_ms, amount, back) in ops {
            clock.advance(Duration::from_millis(gap_ms));
            if acquire {
                if let Ok(a) = rt.block_on(limiter.acquire_tokens(T, amount)) {
                    admitted.push((clock.now(), amount, None, a.reservation.unwrap()));
                }
            } else if let Some(i) = admitted.len().checked_sub(1 + back) {
                let (_, _, settled, r) = &mut admitted[i];
                if settled.is_none() && rt.block_on(limiter.settle(T, r, amount)).unwrap() {
                    *settled = Some(amount);
                }
            }
        }
        for (i, &(end, ..)) in admitted.iter().enumerate() {
            let start = end.saturating_sub(window);
            let (mut total, mut errors) = (0u64, 0u64);
            for &(at, estimate, settled, _) in &admitted[..=i] {
                if at >= start {
                    let used = settled.unwrap_or(estimate);
                    total += used;
                    errors += used.saturating_sub(estimate);
                }
            }
            prop_assert!(total <= limit + errors, "window ending {}: {} tokens, limit {} + errors {}", end, total, limit, errors);
        }
    }
}
