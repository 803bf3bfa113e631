//! `TimeSource::Store`: workers with skewed clocks agree on the server's clock,
//! where caller-stamped time lets a skewed fleet over-admit.

use std::sync::Arc;
use std::time::Duration;

use redstring::cache::redis::RedisCache;
use redstring::cache::{LimiterStore, SlotRequest};
use redstring::decide::window::{SlotOutcome, skew_bound};
use redstring::{
    CircuitBreaker, Clock, Env, Event, ManualClock, NoopObserver, RateLimiter, RecordingObserver, SystemClock,
    TenantId, TimeSource,
};
use testkit::redis::RedisServer;

const HOUR: Duration = Duration::from_secs(3600);

fn cache(server: &RedisServer, time_source: TimeSource) -> Arc<RedisCache> {
    Arc::new(
        RedisCache::builder()
            .time_source(time_source)
            .build_from_url(&server.url())
            .unwrap(),
    )
}

/// Two workers, one an hour behind and one an hour ahead, share one tenant
/// with rpm = 3; each tries 5 calls. Returns the total admitted.
async fn skewed_fleet_admissions(server: &RedisServer, time_source: TimeSource) -> usize {
    server.flush();
    let real = SystemClock.now();
    let behind = Arc::new(ManualClock::new(real.saturating_sub(HOUR)));
    let ahead = Arc::new(ManualClock::new(real.saturating_add(HOUR)));
    let mut admitted = 0;
    for clock in [behind, ahead] {
        let limiter = RateLimiter::builder(3)
            .cache(cache(server, time_source))
            .env(Env::default().with_clock(clock).with_observer(Arc::new(NoopObserver)))
            .build()
            .unwrap();
        for _ in 0..5 {
            if limiter.acquire(TenantId::from_u128(1)).await.is_ok() {
                admitted += 1;
            }
        }
    }
    admitted
}

#[tokio::test]
async fn store_time_keeps_a_skewed_fleet_to_one_allowance() {
    let Some(server) = RedisServer::start() else { return };
    let caller = skewed_fleet_admissions(&server, TimeSource::Caller).await;
    assert_eq!(
        caller, 6,
        "caller-stamped: the worker behind is clamped one window back, out of the sight of the worker ahead"
    );
    assert!(
        caller as u64 <= skew_bound(3, Duration::from_secs(60), Duration::from_secs(1), 2 * HOUR),
        "and that stays within the documented bound"
    );
    assert_eq!(skewed_fleet_admissions(&server, TimeSource::Store).await, 3);
}

/// Issue: one acquire from a limiter an hour ahead used to prune every other
/// hit from the shared window (pruning ran from the newest stamp), so a
/// correct limiter at rpm 3 was then admitted 20 times out of 20.
#[tokio::test]
async fn one_fast_clock_cannot_lift_a_shared_limit() {
    let Some(server) = RedisServer::start() else { return };
    for time_source in [TimeSource::Caller, TimeSource::Store] {
        server.flush();
        let real = SystemClock.now();
        let events = Arc::new(RecordingObserver::default());
        let fast = RateLimiter::builder(3)
            .cache(cache(&server, time_source))
            .env(
                Env::default()
                    .with_clock(Arc::new(ManualClock::new(real.saturating_add(HOUR))))
                    .with_observer(events.clone()),
            )
            .build()
            .unwrap();
        fast.acquire(TenantId::from_u128(1)).await.unwrap();
        let clamped = events.events().iter().any(|e| matches!(e, Event::StampClamped { .. }));
        assert_eq!(clamped, time_source == TimeSource::Caller, "{time_source:?}");

        let sane = RateLimiter::builder(3)
            .cache(cache(&server, time_source))
            .env(
                Env::default()
                    .with_clock(Arc::new(SystemClock))
                    .with_observer(Arc::new(NoopObserver)),
            )
            .build()
            .unwrap();
        let mut admitted = 0;
        for _ in 0..20 {
            if sane.acquire(TenantId::from_u128(1)).await.is_ok() {
                admitted += 1;
            }
        }
        assert_eq!(
            admitted, 2,
            "{time_source:?}: the fast worker's hit counts, and nobody's is pruned"
        );
    }
}

#[tokio::test]
async fn store_time_stamps_with_the_servers_clock() {
    let Some(server) = RedisServer::start() else { return };
    let c = cache(&server, TimeSource::Store);
    let caller_now = SystemClock.now().saturating_sub(HOUR);
    let request = SlotRequest {
        now: caller_now,
        window: Duration::from_secs(60),
        limit: 5,
        ttl: Duration::from_secs(120),
        max_ahead: Duration::ZERO,
    };
    let SlotOutcome::Admitted { at, .. } = c.acquire_slot("k", request).await.unwrap() else {
        panic!("first acquire refused");
    };
    let reply = server.command(&["TIME"]).unwrap();
    let secs: u64 = reply.lines().nth(2).unwrap().parse().unwrap();
    assert!(
        at > caller_now.saturating_add(HOUR / 2),
        "stamped {at}, caller said {caller_now}"
    );
    assert!(at.as_micros() / 1_000_000 <= secs, "stamped {at}, server TIME {secs}");
}

#[tokio::test]
async fn store_time_keeps_a_fast_worker_from_probing_early() {
    let Some(server) = RedisServer::start() else { return };
    for (time_source, fast_worker_probes) in [(TimeSource::Caller, true), (TimeSource::Store, false)] {
        server.flush();
        let breaker = |clock: Arc<ManualClock>| {
            CircuitBreaker::builder()
                .failure_threshold(1)
                .recovery_timeout(Duration::from_secs(60))
                .cache(cache(&server, time_source))
                .env(Env::default().with_clock(clock).with_observer(Arc::new(NoopObserver)))
                .build()
                .unwrap()
        };
        let real = SystemClock.now();
        let on_time = breaker(Arc::new(ManualClock::new(real)));
        let fast = breaker(Arc::new(ManualClock::new(real.saturating_add(HOUR))));
        on_time.record_failure().await.unwrap();
        assert_eq!(fast.allow_request().await, fast_worker_probes, "{time_source:?}");
    }
}

/// A `RedisCache` built without a time source stamps with the server's
/// `TIME`: a caller an hour behind is neither believed nor clamped.
#[tokio::test]
async fn a_redis_cache_stamps_with_the_servers_clock_by_default() {
    let Some(server) = RedisServer::start() else { return };
    let c = RedisCache::builder().build_from_url(&server.url()).unwrap();
    assert_eq!(c.time_source(), TimeSource::Store);
    let before = SystemClock.now();
    let request = SlotRequest {
        now: before.saturating_sub(HOUR),
        window: Duration::from_secs(60),
        limit: 5,
        ttl: Duration::from_secs(120),
        max_ahead: Duration::ZERO,
    };
    let SlotOutcome::Admitted { at, clamped, .. } = c.acquire_slot("k", request).await.unwrap() else {
        panic!("first acquire refused");
    };
    assert!(!clamped);
    assert!(
        at >= before && at <= SystemClock.now(),
        "stamped {at}, not the caller's clock"
    );
}
