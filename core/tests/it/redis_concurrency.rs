//! Fleet exactness on one real Redis: many connections racing one tenant, and
//! several breakers racing for half-open probes.

use std::sync::Arc;
use std::time::Duration;

use crate::support;
use crate::support::redis::{LiveRedis, probe_fleet, race_for_probes};
use redstring::cache::redis::RedisCache;
use redstring::{CircuitState, Clock, ManualClock, Priority, SystemClock, TenantId};
use testkit::redis::RedisServer;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fifty_tasks_over_five_connections_admit_exactly_rpm() {
    let Some(server) = RedisServer::start() else { return };
    let (admitted, limited, limiters) = support::redis::race_one_tenant(|| server.cache(), 5, 50, 10).await;
    let tenant = TenantId::from_u128(42);
    assert_eq!((admitted, limited), (10, 40));
    assert_eq!(limiters[0].remaining(tenant).await.unwrap(), 0);
    // Another tenant is untouched.
    assert_eq!(limiters[3].remaining(TenantId::from_u128(43)).await.unwrap(), 10);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_fleets_low_priority_callers_never_take_the_reserve_over_five_connections() {
    let Some(server) = RedisServer::start() else { return };
    // 10 per window, 3 kept for the high class; sixty callers over five
    // workers' connections, every other one of the low class.
    let limiters: Vec<_> = (0..5)
        .map(|_| {
            Arc::new(
                redstring::RateLimiter::builder(10)
                    .reserve(0.3)
                    .key_prefix("deployment:gpu")
                    .cache(Arc::new(server.cache()))
                    .build()
                    .unwrap(),
            )
        })
        .collect();
    let tenant = TenantId::from_u128(7);
    let handles: Vec<_> = (0..60)
        .map(|i| {
            let limiter = limiters[i % limiters.len()].clone();
            let class = if i % 2 == 0 { Priority::Low } else { Priority::High };
            tokio::spawn(async move { (class, limiter.acquire_as(tenant, class).await.is_ok()) })
        })
        .collect();
    let (mut low, mut high) = (0, 0);
    for handle in handles {
        match handle.await.unwrap() {
            (Priority::Low, true) => low += 1,
            (Priority::High, true) => high += 1,
            _ => {}
        }
    }
    assert_eq!(low + high, 10, "{low} low, {high} high");
    assert!(low <= 7 && high >= 3, "{low} low, {high} high");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_fleet_of_breakers_admits_exactly_the_probe_limit_per_episode() {
    let Some(server) = RedisServer::start() else { return };
    let clock = Arc::new(ManualClock::new(SystemClock.now()));
    let breakers = probe_fleet(|| server.cache(), &clock);
    // Two workers each see one failure: together they open the shared circuit.
    breakers[0].record_failure().await.unwrap();
    breakers[1].record_failure().await.unwrap();
    for b in &breakers {
        assert_eq!(b.state().await.unwrap(), CircuitState::Open);
        assert!(!b.allow_request().await);
    }
    for episode in 0..2 {
        clock.advance(Duration::from_secs(30));
        assert_eq!(race_for_probes(&breakers).await, 3, "episode {episode}");
        // A failed probe reopens the circuit for everyone.
        breakers[3].record_failure().await.unwrap();
        assert_eq!(breakers[0].state().await.unwrap(), CircuitState::Open);
    }
    clock.advance(Duration::from_secs(30));
    assert!(breakers[2].allow_request().await);
    breakers[2].record_success().await.unwrap();
    for b in &breakers {
        assert_eq!(b.state().await.unwrap(), CircuitState::Closed);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn racing_increments_from_many_connections_all_count() {
    use redstring::cache::KeyValue;
    let Some(server) = RedisServer::start() else { return };
    let caches: Vec<Arc<RedisCache>> = (0..4).map(|_| Arc::new(server.cache())).collect();
    let tasks: Vec<_> = (0..100)
        .map(|i| {
            let c = caches[i % caches.len()].clone();
            tokio::spawn(async move { c.increment("n", Some(Duration::from_secs(60))).await.unwrap() })
        })
        .collect();
    let mut seen = Vec::new();
    for task in tasks {
        seen.push(task.await.unwrap());
    }
    seen.sort_unstable();
    assert_eq!(
        seen,
        (1..=100).collect::<Vec<i64>>(),
        "every increment returns a distinct count"
    );
    let pttl = server.command(&["PTTL", "n"]).unwrap();
    let ms: i64 = pttl.trim_start_matches(':').trim().parse().unwrap();
    assert!(ms > 0 && ms <= 60_000, "the counter got its TTL at creation: {pttl}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_fleets_retry_budget_grants_exactly_what_its_first_attempts_earned() {
    let Some(server) = RedisServer::start() else { return };
    // Five workers, each with its own connection and its own handle on one
    // budget; the store's clock stamps, and there is no floor.
    let budgets: Vec<Arc<redstring::RetryBudget<RedisCache>>> = (0..5)
        .map(|_| {
            Arc::new(
                redstring::RetryBudget::builder()
                    .ratio(0.25)
                    .min_retries_per_sec(0)
                    .max_balance(100)
                    .key("race:budget")
                    .cache(Arc::new(server.cache()))
                    .build()
                    .unwrap(),
            )
        })
        .collect();
    // Forty first attempts spread over the fleet earn ten retries.
    let deposits: Vec<_> = (0..40)
        .map(|i| {
            let b = budgets[i % 5].clone();
            tokio::spawn(async move { b.deposit().await })
        })
        .collect();
    for d in deposits {
        d.await.unwrap();
    }
    let withdrawals: Vec<_> = (0..50)
        .map(|i| {
            let b = budgets[i % 5].clone();
            tokio::spawn(async move { b.try_withdraw().await })
        })
        .collect();
    let mut granted = 0;
    for w in withdrawals {
        granted += usize::from(w.await.unwrap());
    }
    assert_eq!(granted, 10, "exactly ratio × first attempts, fleet-wide");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fifty_tasks_over_five_connections_reserve_exactly_the_tokens_per_window() {
    let Some(server) = RedisServer::start() else { return };
    let tenant = TenantId::from_u128(77);
    let limiters: Vec<Arc<redstring::RateLimiter<RedisCache>>> = (0..5)
        .map(|_| {
            Arc::new(
                redstring::RateLimiter::builder(1000)
                    .tokens_per_window(1000)
                    .cache(Arc::new(server.cache()))
                    .build()
                    .unwrap(),
            )
        })
        .collect();
    let tasks: Vec<_> = (0..50)
        .map(|i| {
            let l = limiters[i % 5].clone();
            tokio::spawn(async move { l.acquire_tokens(tenant, 100).await })
        })
        .collect();
    let mut reservations = Vec::new();
    for t in tasks {
        if let Ok(a) = t.await.unwrap() {
            reservations.push(a.reservation.expect("a token limit reserves"));
        }
    }
    assert_eq!(reservations.len(), 10, "1000 tokens hold exactly ten estimates of 100");
    // Settling every call at 50 frees room for exactly ten more.
    for r in &reservations {
        assert!(limiters[0].settle(tenant, r, 50).await.unwrap());
    }
    let more: Vec<_> = (0..50)
        .map(|i| {
            let l = limiters[i % 5].clone();
            tokio::spawn(async move { l.acquire_tokens(tenant, 50).await.is_ok() })
        })
        .collect();
    let mut admitted = 0;
    for t in more {
        admitted += usize::from(t.await.unwrap());
    }
    assert_eq!(admitted, 10);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_fleets_least_loaded_picks_over_five_connections_never_herd() {
    use redstring::cache::InFlightStore;
    use redstring::decide::pick::PickRequest;
    let Some(server) = RedisServer::start() else { return };
    let caches: Vec<Arc<RedisCache>> = (0..5).map(|_| Arc::new(server.cache())).collect();
    const KEYS: [&str; 2] = ["{router}:gpu-a", "{router}:gpu-b"];
    let request = |id| PickRequest {
        now: SystemClock.now(),
        id,
        lease: Duration::from_secs(60),
        max_ahead: Duration::from_secs(1),
    };
    let tasks: Vec<_> = (0..50u64)
        .map(|id| {
            let c = caches[usize::try_from(id).unwrap() % 5].clone();
            tokio::spawn(async move { c.pick_least_loaded(&KEYS, &[1, 1], request(id)).await.unwrap().index })
        })
        .collect();
    let mut on_a = 0;
    for t in tasks {
        on_a += usize::from(t.await.unwrap() == 0);
    }
    assert_eq!(on_a, 25, "every pick saw the fleet's calls in flight");
    let last = caches[0].pick_least_loaded(&KEYS, &[1, 1], request(99)).await.unwrap();
    assert_eq!(last.counts, [25, 25]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_fleets_adaptive_admissions_over_five_connections_take_exactly_the_limit() {
    use redstring::cache::InFlightStore;
    use redstring::decide::concurrency::{AdaptiveConcurrency, CallEnd, ConcurrencyCommand, UNIT};
    use redstring::decide::pick::PickRequest;
    let Some(server) = RedisServer::start() else { return };
    let caches: Vec<Arc<RedisCache>> = (0..5).map(|_| Arc::new(server.cache())).collect();
    let params = AdaptiveConcurrency::new(7, 1, 20)
        .unwrap()
        .params(redstring::Priority::High);
    let request = |id| PickRequest {
        now: SystemClock.now(),
        id,
        lease: Duration::from_secs(60),
        max_ahead: Duration::from_secs(1),
    };
    let step = |id: u64, command| {
        let c = caches[usize::try_from(id).unwrap() % 5].clone();
        tokio::spawn(async move {
            c.concurrency_step("{fleet}:gpu", command, params, request(id))
                .await
                .unwrap()
        })
    };
    let admissions: Vec<_> = (0..50u64).map(|id| step(id, ConcurrencyCommand::Admit)).collect();
    let mut admitted = Vec::new();
    for (id, t) in admissions.into_iter().enumerate() {
        if t.await.unwrap().admitted {
            admitted.push(id as u64);
        }
    }
    assert_eq!(admitted.len(), 7, "no two of the fleet's admissions saw the same count");
    // Every admitted call ends overloaded, at once: each backs off once.
    let ends: Vec<_> = admitted
        .iter()
        .map(|&id| step(id, ConcurrencyCommand::Complete(CallEnd::Overload)))
        .collect();
    for t in ends {
        assert!(t.await.unwrap().admitted, "each end found its lease");
    }
    let last = step(99, ConcurrencyCommand::Admit).await.unwrap();
    let mut expected = 7 * UNIT;
    for _ in 0..7 {
        expected = (expected * 900 / 1000).max(UNIT);
    }
    assert_eq!((last.in_flight, last.limit), (0, expected), "seven backoffs, none lost");
}
